"""Reductions over a set of axes, with or without keeping them."""

from __future__ import annotations

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.opdef import define, norm_axis
from cuvil.ir.types import TensorType


def _axes(axes: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return tuple(sorted({norm_axis(a, rank) for a in axes})) if axes else tuple(range(rank))


def _reduce_type(types: list[TensorType], axes: tuple[int, ...], keepdims: bool) -> TensorType:
    x = types[0]
    red = _axes(axes, x.rank)
    shape = [1 if k in red else d for k, d in enumerate(x.shape)] if keepdims else \
        [d for k, d in enumerate(x.shape) if k not in red]
    return x.with_shape(shape)


def reduction_rule(kind: str):
    """out[i] = kind over the reduced axes of x[i with reduced positions as fresh variables]."""

    def rule(c: R.RuleCtx) -> R.Expr:
        (x,) = c.inputs
        red = _axes(c.attrs["axes"], x.rank)
        keep = c.attrs["keepdims"]

        def body(*ks: R.Ix) -> R.Expr:
            idx: list[R.Ix] = []
            it = iter(ks)
            o = 0
            for k in range(x.rank):
                if k in red:
                    idx.append(next(it))
                    o += 1 if keep else 0
                else:
                    idx.append(c.out[o])
                    o += 1
            return x.at(*idx)

        return R.reduce(kind, [x.shape[k] for k in red], body)

    return rule


define("reduce_sum", ("x",), attrs={"axes": ("ints", ()), "keepdims": ("bool", False)},
       shape=_reduce_type, rule=reduction_rule("sum"),
       numpy=lambda xs, out, axes, keepdims: np.sum(xs[0], axis=_axes(axes, xs[0].ndim), keepdims=keepdims,
                                                     dtype=xs[0].dtype),
       family="reduce", doc="sum over `axes` (all axes when empty)",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"axes": (0, 2)}),
                             ([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"axes": (-1,), "keepdims": True})])
