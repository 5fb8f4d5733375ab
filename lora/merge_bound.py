"""How far a merged module's output may be from the unmerged one's, in floating point, for the same
input: ``|x·fl(W')ᵀ - (x·Wᵀ + s·(x·Aᵀ)·Bᵀ)|`` per output feature, rounding of the merged weight, of
both matrix products and of the scaling included (any summation order, FMA or not).

With ``T_j = |c_j|·(Σ_k X_k·|W_jk| + |s|·Σ_r |B_jr|·Σ_k X_k·|A_rk|)`` (``c`` DoRA's per-row factor,
else 1; ``X_k`` a bound on ``|x_k|``) the difference is at most
``(γ_{r+4} + γ_n·(1 + γ_{r+4}) + γ_{n+r+3})·T_j``, ``γ_k = k·u / (1 - k·u)`` (Higham, ch. 3). ``X``
comes from the overflow prober's interval bounds for a declared input box; the bound per unit of
``max |x|`` (``X_k = 1``) holds for every input. Embeddings have no sum over the input: ``2·γ_{r+3}`` of the
largest ``|T_vj| + |s|·Σ_r |A_rv|·|B_jr|``. A convolution is a linear over its receptive field
(``n = C·k``; zero padding only drops terms), with ``X`` the input's largest element. The bound is for one
module given the same input; it assumes the unmerged values are finite (the prober says where they may
not be)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.module import Module
from lora.attach import Attachment, WeightedAdapter, used_layout
from lora.base import BaseModel
from lora.merged import to_float64
from verify.probe.bounds import BoundsEngine
from verify.probe.interval import unit_roundoff

MARGIN = 1.0 + 2.0 ** -40  # the float64 rounding of the bound's own sums and products


@dataclass(frozen=True)
class SiteBound:
    """The bound at one op that reads an adapted weight, per output feature: ``per_unit`` holds for
    every input (multiply by that input's ``max |x|``), ``absolute`` for inputs in the declared box.
    An embedding's bound depends on no input: both are the same."""

    module: str
    site: int
    kind: str
    per_unit: np.ndarray
    absolute: np.ndarray | None

    @property
    def max_per_unit(self) -> float:
        return float(self.per_unit.max())

    @property
    def max_absolute(self) -> float | None:
        return None if self.absolute is None else float(self.absolute.max())

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "site": self.site, "kind": self.kind, "per_unit_max_abs_x": self.max_per_unit,
                "absolute_in_box": self.max_absolute}


def gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


def site_bounds(unmerged: Module, attachments: list[Attachment], base: BaseModel,
                adapters: list[WeightedAdapter], ranges: Mapping[str, tuple[float, float]] | None) -> list[SiteBound]:
    """The bound of every site of every attachment (``ranges``: an input box per model input)."""
    values = BoundsEngine(unmerged.main, unmerged.constants).run(dict(ranges)).values if ranges else None
    by_dir = {str(w.adapter.directory): w.adapter for w in adapters}
    out = []
    for att in attachments:
        adapter = by_dir[att.adapter]
        entry = adapter.modules[att.module]
        assert entry.a is not None and entry.b is not None
        a, b = to_float64(adapter.array(entry.a)), to_float64(adapter.array(entry.b))
        w_used = to_float64(used_layout(base.modules[att.module]))
        if att.kind == "conv":  # as a linear over the receptive field: W [O, C, *k] -> [C·k, O], A [r, C·k], B [O, r]
            w_used, a, b = w_used.reshape(w_used.shape[0], -1).T, a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        factor = None
        if att.dora and entry.magnitude is not None:
            factor = _dora_magnitude(adapter.array(entry.magnitude), w_used, a, b, att.scale, unit_roundoff(
                att.attached[0].dtype))
        for k, site in enumerate(att.attached):
            u = unit_roundoff(site.dtype)
            if att.kind == "embedding":  # T [vocab, dim], A [r, vocab], B [dim, r]
                cols = np.max(np.abs(w_used) + abs(att.scale) * (np.abs(a).T @ np.abs(b).T), axis=0)
                bound = 2 * gamma(att.rank + 3, u) * cols * MARGIN
                out.append(SiteBound(att.module, k, att.kind, bound, bound))
                continue
            n, r = w_used.shape[0], att.rank
            g = MARGIN * (gamma(r + 4, u) + gamma(n, u) * (1 + gamma(r + 4, u)) + gamma(n + r + 3, u))
            terms = (np.abs(w_used), np.abs(a), np.abs(b), abs(att.scale), factor)
            absolute = None
            if values is not None:
                x = site.operands[0]
                mags = np.broadcast_to(values[x].magnitude(), tuple(int(d) for d in x.shape))
                xk = np.full(n, float(np.max(mags, initial=0.0))) if att.kind == "conv" else np.max(
                    mags.reshape(-1, n), axis=0)  # a convolution's window moves: its largest input element
                absolute = g * _size(xk, *terms)
            out.append(SiteBound(att.module, k, att.kind, g * _size(np.ones(n), *terms), absolute))
    return out


def _size(xk: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float,
          factor: np.ndarray | None) -> np.ndarray:
    """``T_j``: ``|c_j|·(Σ_k X_k·|W_jk| + |s|·Σ_r |B_jr|·Σ_k X_k·|A_rk|)`` from absolute values."""
    t = xk @ w + scale * ((a @ xk) @ b.T)
    return t if factor is None else t * factor


def _dora_magnitude(magnitude: np.ndarray, w_used: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float,
                    u: float) -> np.ndarray:
    """A bound on ``|m / ‖W + s·B·A‖|`` per output row as the program computes it in its own precision:
    each merged element is off by at most ``γ_{r+2}·(|W| + |s|·|B|·|A|)``, the sum of ``n`` squares, the
    square root and the division round on top (a row that nearly cancels gets a wide bound)."""
    merged = w_used.T + scale * (b @ a)
    norms = np.sqrt(np.sum(merged * merged, axis=1))
    size = np.abs(w_used.T) + abs(scale) * (np.abs(b) @ np.abs(a))
    n, r = w_used.shape[0], a.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = gamma(r + 2, u) * np.sqrt(np.sum(size * size, axis=1)) / norms + gamma(n + 3, u)
        exact = np.abs(to_float64(magnitude).reshape(-1)) / norms
        out = exact * (1 + u) / (1 - rel)
    return np.where((rel < 1) & np.isfinite(out), out, np.inf)
