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
TILE_ELEMENTS = 1 << 17
"""The float32 screen forms a merge a tile of rows at a time, 512 KiB of float32, so that its product, sum,
absolute value and row reductions stay in a core's L2 cache."""
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


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

    def stored_rows(self, rows: slice | np.ndarray) -> np.ndarray:
        """Rows of the canonical layout, as stored: for a slice a view (no conversion, nothing read yet),
        for an index array a copy of those rows."""
        w = self.weight
        if self.module.kind == "conv":
            part = w[rows]
            return part.reshape(part.shape[0], -1)
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


def to_float32(a: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    """``a`` as float32 in the first ``len(a)`` rows of ``out`` when that is exact (bfloat16 by its bits:
    one pass, no temporary; float16, float32), else None."""
    dst = out[:a.shape[0]]
    if a.dtype == _BFLOAT16:
        np.left_shift(a.view(np.uint16), 16, out=dst.view(np.uint32), dtype=np.uint32)
    elif a.dtype in (np.dtype(np.float16), np.dtype(np.float32)):
        np.copyto(dst, a)
    else:
        return None
    return dst


def _float32_above(x: float) -> np.float32:
    """The least float32 >= ``x``: for a float32 ``v``, ``v < it`` exactly when ``v < x`` and ``v >= it``
    exactly when ``v >= x`` (numpy compares a float32 array with a float after rounding the float to
    float32, which can lose an element on the wrong side)."""
    with np.errstate(over="ignore"):  # past float32's range: inf
        f = np.float32(x)
    return f if float(f) >= x else np.nextafter(f, np.float32(np.inf))


def _nonzero(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero`` of a C-contiguous 2-D mask, in the same order, through the 1-D path (several times
    faster on a few rows of thousands of columns)."""
    return np.divmod(np.flatnonzero(mask), max(mask.shape[1], 1))


def _weight_stats(w: np.ndarray) -> tuple[float, float] | None:
    """``(sum of squares, max |w|)`` of a block of float32 weights; None when a weight is not finite."""
    flat = w.ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        w_sq = float(np.dot(flat, flat))
    if not np.isfinite(w_sq):  # squares past float32's range, or a non-finite weight
        wide = flat.astype(np.float64)
        w_sq = float(np.dot(wide, wide))
    if not np.isfinite(w_sq):
        return None
    return w_sq, max(float(w.max(initial=0.0)), -float(w.min(initial=0.0)))


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
    top: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # rows, cols, float32 |merged| near its maximum


class _Tiles:
    """The float32 merge ``|fl(W + fl(s·B)·A)|`` of a module by tiles of rows, each formed in one reused
    buffer (the product written into it, the base weight added and the absolute value taken in place),
    the base weight converted a block at a time into another. ``left @ right`` is the update in canonical
    layout (an embedding's rows are vocabulary entries)."""

    def __init__(self, merge: MergedWeight, a32: np.ndarray, bs32: np.ndarray) -> None:
        embedding = merge.module.kind == "embedding"
        self.left = np.ascontiguousarray(a32.T) if embedding else bs32
        self.right = np.ascontiguousarray(bs32.T) if embedding else a32
        cols = max(merge.cols, 1)
        self.block = max(1, BLOCK_ELEMENTS // cols)
        self.rows = min(self.block, max(8, TILE_ELEMENTS // cols // 8 * 8))  # BLAS's kernels take rows by 8s
        self.weights = np.empty((min(self.block, merge.rows), merge.cols), np.float32)
        self.buffer = np.empty((self.rows, merge.cols), np.float32)

    def magnitudes(self, rows: slice | np.ndarray, weight: np.ndarray) -> np.ndarray:
        """|merged| of ``rows`` (``weight``: their float32 base weights), valid until the next call."""
        out = self.buffer[:weight.shape[0]]
        np.matmul(self.left[rows], self.right, out=out)
        np.add(out, weight, out=out)
        return np.abs(out, out=out)


class FastScreen:
    """The float32 screen of a merge without DoRA: one fused pass per tile of rows instead of float64
    arithmetic over every element (float32 products of ``r`` terms are within ``gamma_{r+3}`` of the exact
    value, relative to ``|W| + |s|·|B|·|A|``, which is bounded per block from row sums of the factors)."""

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
        tiles = _Tiles(m, a32, bs32)
        row_max = np.zeros(m.rows, np.float32)  # float32 max |merged| of each row
        row_err = np.zeros(m.rows)  # the error bound of each row's block
        with np.errstate(over="ignore", invalid="ignore"):  # a float32 overflow shows as a non-finite row maximum
            for start in range(0, m.rows, tiles.block):
                rows = slice(start, min(start + tiles.block, m.rows))
                w = to_float32(m.stored_rows(rows), tiles.weights)
                stats = None if w is None else _weight_stats(w)
                if w is None or stats is None:
                    return None  # a base dtype float32 does not hold, or a non-finite base weight: the float64 path
                out.weight_sq += stats[0]
                bound = (stats[1] + abs_s * float(np.max(row_sums[rows], initial=0.0)) * other_max) * (1 + 2.0 ** -40)
                err = gamma * bound + (rank + 2) * 2.0 ** -126  # relative error, plus float32 underflow
                out.bound = max(out.bound, bound * (1 + gamma))
                out.error = max(out.error, err)
                row_err[rows] = err
                self._block(out, tiles, rows, w, row_max, _float32_above(low + err))
            return self._finish(out, tiles, row_max, row_err, high)

    @staticmethod
    def _block(out: Screen, tiles: _Tiles, rows: slice, w: np.ndarray, row_max: np.ndarray,
               small: np.float32) -> None:
        """One block's tiles: each row's float32 maximum, and the elements below ``small`` (sought only in
        the rows whose minimum is)."""
        for first in range(rows.start, rows.stop, tiles.rows):
            part = slice(first, min(first + tiles.rows, rows.stop))
            mag = tiles.magnitudes(part, w[first - rows.start:part.stop - rows.start])
            mag.max(axis=1, out=row_max[part], initial=0.0)
            below = np.flatnonzero(mag.min(axis=1, initial=np.inf) < small)
            if below.size:
                r, c = _nonzero(mag[below] < small)
                out.small_rows.append(below[r] + first)
                out.small_cols.append(c)

    def _finish(self, out: Screen, tiles: _Tiles, row_max: np.ndarray, row_err: np.ndarray,
                high: float) -> Screen | None:
        """The rows that may overflow, and the candidates for the largest element (their rows formed again)."""
        out.merged_max = float(row_max.max(initial=0.0))
        if not np.isfinite(out.merged_max):
            return None  # a float32 sum overflowed: the error bound no longer holds, the float64 path decides
        out.big_rows = np.flatnonzero(row_max >= high - row_err).tolist()
        near = _float32_above(out.merged_max - 2 * out.error)  # the exact maximum is among these
        rows = np.flatnonzero(row_max >= near)
        for k in range(0, rows.size, tiles.rows):
            part = rows[k:k + tiles.rows]
            w = to_float32(self.merge.stored_rows(part), tiles.weights)
            assert w is not None  # the blocks' pass converted the same rows
            mag = tiles.magnitudes(part, w)
            r, c = _nonzero(mag >= near)
            out.top.append((part[r], c, mag[r, c]))
        return out

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
