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

    def _weight_rows(self, rows: slice) -> np.ndarray:
        w = self.weight
        if self.module.kind == "conv":
            return to_float64(w[rows]).reshape(rows.stop - rows.start, -1)
        if self.module.fan_in_fan_out:
            return to_float64(w[:, rows]).T
        return to_float64(w[rows])

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
