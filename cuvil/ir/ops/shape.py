"""Layout ops: index remaps that move elements without computing on them."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.opdef import REQUIRED, define
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType


def _reshape_type(types: list[TensorType], shape: tuple[Dim, ...]) -> TensorType:
    x = types[0]
    out = x.with_shape(shape)
    if out.numel() != x.numel() and x.is_static and out.is_static:
        raise ValueError(f"cannot reshape {x} to {list(shape)}: element counts differ")
    return out


def _reshape_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    flat: R.Ix = R.Ix.lit(0)
    for i, d in zip(c.out, c.out_type.shape, strict=True):
        flat = flat * d + i
    idx: list[R.Ix] = []
    for d in reversed(x.shape):
        idx.append(flat % d)
        flat = flat // d
    return x.at(*reversed(idx))


define("reshape", ("x",), attrs={"shape": ("dims", REQUIRED)}, shape=_reshape_type, rule=_reshape_rule,
       numpy=lambda xs, out, shape: xs[0].reshape(out.shape), family="layout",
       doc="row-major reshape; `shape` is the result shape (symbolic dims allowed)",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"shape": (4, 6)})])


def _transpose_type(types: list[TensorType], perm: tuple[int, ...]) -> TensorType:
    x = types[0]
    if sorted(perm) != list(range(x.rank)):
        raise ValueError(f"perm {list(perm)} is not a permutation of rank {x.rank}")
    return x.with_shape([x.shape[p] for p in perm])


def _transpose_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    perm = c.attrs["perm"]
    idx: list[Any] = [None] * x.rank
    for o, p in enumerate(perm):
        idx[p] = c.out[o]
    return x.at(*idx)


define("transpose", ("x",), attrs={"perm": ("ints", REQUIRED)}, shape=_transpose_type, rule=_transpose_rule,
       numpy=lambda xs, out, perm: np.transpose(xs[0], perm), family="layout",
       doc="out dim k is x dim perm[k]",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"perm": (2, 0, 1)})])
