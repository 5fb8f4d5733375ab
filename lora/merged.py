"""The merged weight ``W + s·B·A`` of one module (DoRA: each output row rescaled to its
magnitude), computed in float64 by blocks of rows so that a 7B model's largest projection costs a
few megabytes at a time, with the sound elementwise bound ``|W| + |s|·|B|·|A|`` beside it.

Blocks are in a canonical layout, ``[rows, columns]``: rows are output features (linear, conv) or
vocabulary entries (embedding), columns the rest; :meth:`MergedWeight.stored_index` maps an
element back to the base weight's own layout (``fan_in_fan_out`` weights are ``[in, out]``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from lora.base import BaseModule

BLOCK_ELEMENTS = 1 << 20


def _factor(magnitude: np.ndarray, norms: np.ndarray) -> np.ndarray:
    return np.divide(magnitude, norms, out=np.full_like(norms, np.inf), where=norms > 0)


def to_float64(a: np.ndarray) -> np.ndarray:
    """``a`` as float64 (bfloat16 by its bits: exact, and far faster than a generic cast)."""
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return (np.asarray(a).view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


@dataclass
class Block:
    rows: slice
    weight: np.ndarray
    delta: np.ndarray  # s·B·A
    merged: np.ndarray
    bound: np.ndarray  # >= |merged| elementwise, in exact arithmetic (before the float64 rounding margin)


class MergedWeight:
    """The merge of one module, read block by block."""

    def __init__(self, module: BaseModule, a: np.ndarray, b: np.ndarray, scale: float,
                 magnitude: np.ndarray | None = None) -> None:
        self.module = module
        self.weight = module.weight  # as stored; read block by block
        self.a, self.b = to_float64(a), to_float64(b)
        self.scale = scale
        self.magnitude = None if magnitude is None else to_float64(magnitude).reshape(-1)
        shape = self.weight.shape
        if module.kind == "conv":
            self.a = self.a.reshape(self.a.shape[0], -1)
            self.b = self.b.reshape(self.b.shape[0], -1)
            self.rows, self.cols = shape[0], int(np.prod(shape[1:]))
        elif module.fan_in_fan_out:
            self.rows, self.cols = shape[1], shape[0]
        else:
            self.rows, self.cols = shape[0], shape[1]

    def stored_rows(self, rows: slice) -> np.ndarray:
        """Rows of the canonical layout, as stored (a view: no conversion, nothing read yet)."""
        w = self.weight
        if self.module.kind == "conv":
            return w[rows].reshape(rows.stop - rows.start, -1)
        return w[:, rows].T if self.module.fan_in_fan_out else w[rows]

    def _weight_rows(self, rows: slice) -> np.ndarray:
        return to_float64(self.stored_rows(rows))

    def _update(self, a: np.ndarray, b: np.ndarray, scale: float, rows: slice) -> np.ndarray:
        if self.module.kind == "embedding":  # W[v, :] += s·(B·A)[:, v]
            return scale * (a[:, rows].T @ b.T)
        return scale * (b[rows] @ a)

    def _unscaled(self) -> Iterator[Block]:
        step = max(1, BLOCK_ELEMENTS // max(self.cols, 1))
        abs_a, abs_b = np.abs(self.a), np.abs(self.b)
        for start in range(0, self.rows, step):
            rows = slice(start, min(start + step, self.rows))
            w = self._weight_rows(rows)
            delta = self._update(self.a, self.b, self.scale, rows)
            yield Block(rows, w, delta, w + delta, np.abs(w) + self._update(abs_a, abs_b, abs(self.scale), rows))

    def blocks(self) -> Iterator[Block]:
        if self.magnitude is None:
            yield from self._unscaled()
            return
        if self.module.kind == "embedding":  # DoRA scales each embedding dimension (a column) to its magnitude
            sq = np.zeros(self.cols)
            for blk in self._unscaled():
                sq += np.sum(blk.merged * blk.merged, axis=0)
            factor = _factor(self.magnitude, np.sqrt(sq))
            for blk in self._unscaled():
                yield Block(blk.rows, blk.weight, blk.delta, blk.merged * factor, blk.bound * np.abs(factor))
            return
        for blk in self._unscaled():  # each output row scaled to its magnitude
            factor = _factor(self.magnitude[blk.rows], np.linalg.norm(blk.merged, axis=1))[:, None]
            yield Block(blk.rows, blk.weight, blk.delta, blk.merged * factor, blk.bound * np.abs(factor))

    def stored_index(self, row: int, col: int) -> tuple[int, ...]:
        if self.module.kind == "conv":
            return (row, *(int(i) for i in np.unravel_index(col, self.weight.shape[1:])))
        if self.module.fan_in_fan_out:
            return (col, row)
        return (row, col)

    def full(self) -> np.ndarray:
        """The whole merged weight in the base weight's layout."""
        out = np.empty((self.rows, self.cols))
        for blk in self.blocks():
            out[blk.rows] = blk.merged
        if self.module.kind == "conv":
            return out.reshape(self.weight.shape)
        return out.T if self.module.fan_in_fan_out else out


def to_float32(a: np.ndarray) -> np.ndarray | None:
    """``a`` as float32 when that is exact (bfloat16, float16, float32), else None."""
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return (np.asarray(a).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if a.dtype in (np.dtype(np.float16), np.dtype(np.float32)):
        return np.asarray(a, dtype=np.float32)
    return None


@dataclass
class Screen:
    """What one float32 pass over a merge establishes, soundly: every float32 merged element is within
    ``error`` of the exact one, so only the listed rows can hold an element at or above the high
    threshold and only the listed elements can be nonzero below the low one (their exact values are
    computed in float64 by the caller)."""

    merged_max: float  # max |merged| in float32 (within ``error`` of the exact maximum)
    bound: float  # >= every |merged| element, exact or float32
    error: float
    weight_sq: float
    update_sq: float  # ||s·B·A||_F^2, from the rank-sized Gram matrices
    big_rows: list[int]
    small_rows: list[np.ndarray]
    small_cols: list[np.ndarray]
    top: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per block: rows, cols, float32 |merged| near its maximum


class FastScreen:
    """The float32 screen of a merge without DoRA: one fused pass per block instead of float64 arithmetic
    over every element (float32 products of ``r`` terms are within ``gamma_{r+3}`` of the exact value,
    relative to ``|W| + |s|·|B|·|A|``, which is bounded per block from row sums of the factors)."""

    def __init__(self, merge: MergedWeight) -> None:
        self.merge = merge

    def run(self, high: float, low: float) -> Screen | None:
        m = self.merge
        if m.magnitude is not None:
            return None
        rank = m.a.shape[0]
        unit = 2.0 ** -24
        gamma = (rank + 3) * unit / (1 - (rank + 3) * unit) * (1 + 2.0 ** -40)
        a32, bs32 = m.a.astype(np.float32), (m.scale * m.b).astype(np.float32)
        if not (np.array_equal(a32, m.a) and np.isfinite(bs32).all()):
            return None  # factors not exact in float32: the float64 path decides
        abs_s = abs(m.scale)
        if m.module.kind == "embedding":  # delta[v, :] = s·A[:, v]ᵀ·Bᵀ: rows are vocabulary entries
            row_sums = np.abs(m.a).sum(axis=0)
            other_max = float(np.max(np.abs(m.b), initial=0.0))
        else:
            row_sums = np.abs(m.b).sum(axis=1)
            other_max = float(np.max(np.abs(m.a), initial=0.0))
        gram = (m.b.T @ m.b) * (m.a @ m.a.T)
        out = Screen(0.0, 0.0, 0.0, 0.0, float(m.scale ** 2 * gram.sum()), [], [], [], [])
        step = max(1, BLOCK_ELEMENTS // max(m.cols, 1))
        for start in range(0, m.rows, step):
            rows = slice(start, min(start + step, m.rows))
            w = self._weight_rows(rows)
            if w is None:
                return None
            flat = w.ravel()
            with np.errstate(over="ignore", invalid="ignore"):
                w_sq = float(np.dot(flat, flat))
            if not np.isfinite(w_sq):  # squares past float32's range, or a non-finite weight
                wide = flat.astype(np.float64)
                w_sq = float(np.dot(wide, wide))
            if not np.isfinite(w_sq):
                return None  # a non-finite base weight: the float64 path lists it
            out.weight_sq += w_sq
            w_max = max(float(w.max(initial=0.0)), -float(w.min(initial=0.0)))
            bound = (w_max + abs_s * float(np.max(row_sums[rows], initial=0.0)) * other_max) * (1 + 2.0 ** -40)
            err = gamma * bound + (rank + 2) * 2.0 ** -126  # relative error, plus float32 underflow
            merged = (a32[:, rows].T @ bs32.T) if m.module.kind == "embedding" else bs32[rows] @ a32
            merged += w
            np.abs(merged, out=merged)
            top = float(merged.max(initial=0.0))
            out.merged_max = max(out.merged_max, top)
            r, c = np.nonzero(merged >= top - 2 * err)  # the block's exact maximum is among these
            out.top.append((r + start, c, merged[r, c]))
            out.bound = max(out.bound, bound * (1 + gamma))
            out.error = max(out.error, err)
            if top >= high - err:
                out.big_rows += [start + int(k) for k in np.flatnonzero(merged.max(axis=1) >= high - err)]
            if float(merged.min(initial=np.inf)) < low + err:
                r, c = np.nonzero(merged < low + err)
                out.small_rows.append(r + start)
                out.small_cols.append(c)
        return out

    def _weight_rows(self, rows: slice) -> np.ndarray | None:
        return to_float32(self.merge.stored_rows(rows))

    def exact_max(self, screen: Screen) -> float:
        """The exact largest |merged| element: only elements within twice the error of the float32
        maximum can be it."""
        rows = np.concatenate([r for r, _, _ in screen.top])
        cols = np.concatenate([c for _, c, _ in screen.top])
        near = np.concatenate([v for _, _, v in screen.top]) >= screen.merged_max - 2 * screen.error
        return float(np.max(np.abs(self.exact(rows[near], cols[near])), initial=0.0))

    def exact(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The exact merged values (float64) of the elements ``(rows[k], cols[k])`` in canonical layout."""
        m = self.merge
        if m.module.kind == "conv":
            w = to_float64(m.weight.reshape(m.rows, -1)[rows, cols])
        elif m.module.fan_in_fan_out:
            w = to_float64(m.weight[cols, rows])
        else:
            w = to_float64(m.weight[rows, cols])
        if m.module.kind == "embedding":
            update = np.einsum("kr,rk->k", m.b[cols], m.a[:, rows])
        else:
            update = np.einsum("kr,rk->k", m.b[rows], m.a[:, cols])
        return w + m.scale * update
