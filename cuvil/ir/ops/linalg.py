"""Contractions: matmul (batched, optional transposes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.opdef import broadcast_shapes, define
from cuvil.ir.types import TensorType


def _matmul_type(types: list[TensorType], transpose_a: bool, transpose_b: bool) -> TensorType:
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise ValueError("matmul operands need rank >= 2 (the frontends lift vectors)")
    if a.dtype is not b.dtype:
        raise TypeError(f"operand dtypes differ: {a.dtype} vs {b.dtype}")
    m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    k2, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if k != k2 and isinstance(k, int) and isinstance(k2, int):
        raise ValueError(f"contraction dims differ: {k} vs {k2}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(a.dtype, (*batch, m, n))


def _matmul_rule(c: R.RuleCtx) -> R.Expr:
    a, b = c.inputs
    ta, tb = c.attrs["transpose_a"], c.attrs["transpose_b"]
    *batch, i, j = c.out
    out_batch = c.out_type.shape[:-2]
    k_ext = a.shape[-2] if ta else a.shape[-1]
    ab = R.broadcast_index(batch, a.shape[:-2], out_batch)
    bb = R.broadcast_index(batch, b.shape[:-2], out_batch)

    def body(k: R.Ix) -> R.Expr:
        x = a.at(*ab, k, i) if ta else a.at(*ab, i, k)
        y = b.at(*bb, j, k) if tb else b.at(*bb, k, j)
        return x * y

    return R.reduce("sum", [k_ext], body)


def _matmul_numpy(xs: list[np.ndarray], out: TensorType, transpose_a: bool, transpose_b: bool) -> np.ndarray:
    a, b = xs
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


define("matmul", ("lhs", "rhs"), attrs={"transpose_a": ("bool", False), "transpose_b": ("bool", False)},
       shape=_matmul_type, rule=_matmul_rule, numpy=_matmul_numpy, family="linalg",
       examples=lambda rng: [
           ([rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)], {}),
           ([rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((2, 5, 4)).astype(np.float32)],
            {"transpose_a": True, "transpose_b": True})],
       doc="batched matrix product sum_k lhs[..., i, k] * rhs[..., k, j]; batch dims broadcast")
