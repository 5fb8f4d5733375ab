"""How far the merged model's outputs may be from the unmerged model's, end to end, for model inputs in a
declared box, float rounding of both programs included.

The merged program ``P`` and the unmerged program ``P'`` differ only at the adapted ops: where ``P`` reads
``x·fl(W')ᵀ``, ``P'`` computes ``x·Wᵀ + s·(x·Aᵀ)·Bᵀ``, within the per-op bound of :mod:`lora.merge_bound` of
it for the same ``x`` (``per_unit_j · max|x|`` over the row of ``x``). Taking each adapted op of ``P`` as
a source whose value ``P'`` may move by that much (``x`` ranging over the interval that holds both
programs' ``x``), :func:`verify.probe.difference.difference_bounds` carries the differences through the
rest of the network. The bound is sound and can be loose: a normalization after an adapted op (LayerNorm,
RMSNorm) whose variance intervals do not bound away from zero passes on the width of its interval."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.values import Value
from lora.merge_bound import SiteBound
from verify.probe.difference import difference_bounds
from verify.probe.interval import Interval


@dataclass(frozen=True)
class ModelBound:
    """Per model output, an elementwise bound on ``|merged - unmerged|`` for inputs in ``box``."""

    box: dict[str, tuple[float, float]]
    outputs: list[np.ndarray]
    sources: int

    @property
    def max_abs(self) -> float:
        return max((float(np.max(o, initial=0.0)) for o in self.outputs), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"meaning": "per model output, |merged output - unmerged output| for the same model input in "
                           "input_box, float rounding of both programs included; valid where both stay finite",
                "max_abs": self.max_abs, "per_output_max_abs": [float(np.max(o, initial=0.0)) for o in self.outputs],
                "adapted_ops": self.sources}


def model_bound(merged_fn: Any, constants: Mapping[str, np.ndarray], box: Mapping[str, tuple[float, float]],
                readers: Mapping[Value, SiteBound]) -> ModelBound:
    """The end-to-end bound, ``readers`` mapping each op of the merged function that reads a merged weight
    to the per-op bound of its site."""
    sources = {v: _source(v, bound) for v, bound in readers.items()}
    res = difference_bounds(merged_fn, constants, box, sources)
    return ModelBound(dict(box), [np.array(res.output(k)) for k in range(len(merged_fn.results))], len(sources))


def _source(v: Value, bound: SiteBound) -> Callable[..., np.ndarray]:
    if bound.kind == "embedding":  # no input enters the bound: a constant per feature
        return lambda *hulls: bound.per_unit

    shape = tuple(int(d) for d in v.operands[0].shape)
    if bound.kind == "conv":  # per output channel, times the input's largest element (any window)
        channels = bound.per_unit.reshape((1, -1) + (1,) * (len(v.shape) - 2))
        return lambda x, *rest: channels * float(np.max(np.broadcast_to(x.magnitude(), shape), initial=0.0))

    def per_row(x: Interval, *rest: Interval) -> np.ndarray:
        """``per_unit_j · max_k |x_k|`` over each row of the op's input."""
        return bound.per_unit * np.max(np.broadcast_to(x.magnitude(), shape), axis=-1, keepdims=True)

    return per_row
