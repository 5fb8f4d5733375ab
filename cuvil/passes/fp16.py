"""FP16 conversion: float32 compute runs in float16, with casts where values cross between
the two; ops whose results are sensitive to range or accumulated rounding stay float32.

The function signature stays float32 (inputs are cast down where first used in fp16,
results are cast back up). Constants used by fp16 ops are cast as constant expressions
(``cast(W, f16)``) for ``fold-constants`` to materialize; an op whose constant operand does
not fit float16's range stays float32. The contract is ``bounded``: the verifier proves
overflow freedom over the declared input domain, and :attr:`Fp16.tolerance` is the error
budget the differential tests hold it to.

This pass decides by op kind alone. ``cuvil.compile(..., fp16=True, ranges=...)`` decides per op
instead: it builds the same program with exactly the ops the overflow prober cannot prove safe for
the declared ranges kept float32 (``verify.probe.fp16_policy``), before the pipeline runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.values import Value, walk
from cuvil.passes.base import Contract, FunctionPass, register

KEEP_FP32 = ("softmax", "log_softmax", "exp", "log", "pow", "layer_norm", "batch_norm", "reduce_sum",
             "reduce_mean", "reduce_prod", "erf", "cumsum", "lrn", "lp_pool", "softplus", "mish", "sinh", "cosh",
             "cast")
"""Ops kept in float32 by default: exponentials and powers overflow float16 early, reductions
and normalizations accumulate rounding; ``cast`` keeps its declared target type."""

F16_MAX = float(np.finfo(np.float16).max)


def _fits_f16(b: Builder, v: Value) -> bool:
    """False for a constant expression over constants whose data exceeds float16's finite range."""
    cone = list(walk([v]))
    if any(u.is_param for u in cone):
        return True
    for c in (u for u in cone if u.is_const):
        data = np.asarray(b.data(c))
        if data.dtype.kind == "f" and data.size and float(np.nanmax(np.abs(data.astype(np.float64)))) > F16_MAX:
            return False
    return True


@register
@dataclass(frozen=True)
class Fp16(FunctionPass):
    name = "fp16"
    contract = Contract.BOUNDED
    description = "run float32 compute in float16 (casts at the boundaries; sensitive ops stay float32)"
    tolerance: ClassVar[tuple[float, float]] = (1e-2, 1e-2)
    """(rtol, atol) against the float32 module, for activations of order 1."""

    keep_fp32: tuple[str, ...] = KEEP_FP32

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        low: dict[Value, Value] = {}  # value -> its float16 version, where it is float16 now
        full: dict[Value, Value] = {}  # value -> its version in the original dtype

        def as_f32(v: Value) -> Value:
            if v not in full:
                full[v] = b.cast(low[v], to=DType.f32)
            return full[v]

        def as_f16(v: Value) -> Value:
            if v not in low:
                low[v] = b.cast(full[v], to=DType.f16)
            return low[v]

        for v in fn.values():
            if v.is_param or v.is_const:
                full[v] = v
                continue
            converted = self._convert(v, b, as_f16) if self._convertible(v, b) else None
            if converted is not None:
                low[v] = converted
            else:
                full[v] = b.op(v.op, *(as_f32(o) for o in v.operands), **v.attr_dict)
        results = tuple(full[r] if r in full else as_f32(r) for r in fn.results)
        return Function(fn.name, fn.params, results, fn.result_names, fn.constraints)

    def _convertible(self, v: Value, b: Builder) -> bool:
        if v.op in self.keep_fp32 or v.dtype is not DType.f32:
            return False
        floats = [o for o in v.operands if o.dtype.is_float]
        if not floats or any(o.dtype is not DType.f32 for o in floats):
            return False
        return all(_fits_f16(b, o) for o in floats)

    @staticmethod
    def _convert(v: Value, b: Builder, as_f16: Callable[[Value], Value]) -> Value | None:
        operands = tuple(as_f16(o) if o.dtype is DType.f32 else o for o in v.operands)
        try:
            out = b.op(v.op, *operands, **v.attr_dict)
        except CuvilError:
            return None
        return out if out.dtype is DType.f16 and out.type.shape == v.type.shape else None
