"""Elementwise ops: numpy broadcasting over operands, one scalar function per element."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import REQUIRED, broadcast_shapes, define
from cuvil.ir.types import TensorType


def _broadcast_type(types: list[TensorType], **_: Any) -> TensorType:
    dt = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dt:
            raise TypeError(f"operand dtypes differ: {dt} vs {t.dtype}")
    return TensorType(dt, broadcast_shapes(*(t.shape for t in types)))


def _bool_type(types: list[TensorType], **attrs: Any) -> TensorType:
    return _broadcast_type(types).with_dtype(DType.bool)


define("add", ("lhs", "rhs"), shape=_broadcast_type, rule=R.elementwise(lambda a, b: a + b),
       numpy=lambda xs, out: np.add(xs[0], xs[1]), family="elementwise", commutative=True,
       examples=lambda rng: [([rng.standard_normal((2, 3)).astype(np.float32),
                               rng.standard_normal((3,)).astype(np.float32)], {})],
       doc="lhs + rhs with numpy broadcasting")

define("relu", ("x",), shape=_broadcast_type, rule=R.elementwise(R.relu),
       numpy=lambda xs, out: np.maximum(xs[0], np.zeros((), xs[0].dtype)), family="elementwise",
       examples=lambda rng: [([rng.standard_normal((2, 3)).astype(np.float32)], {})],
       doc="max(x, 0); NaN propagates")


def _cast_type(types: list[TensorType], to: DType) -> TensorType:
    return types[0].with_dtype(to)


define("cast", ("x",), attrs={"to": ("dtype", REQUIRED)},
       shape=_cast_type, rule=R.elementwise(lambda x, to: R.cast(x, to)), family="elementwise",
       examples=lambda rng: [([rng.standard_normal((2, 3)).astype(np.float32) * 10], {"to": DType.i32})],
       doc="convert element type; float->int truncates toward zero, ->bool is x != 0")


def _where_type(types: list[TensorType], **_: Any) -> TensorType:
    c, a, b = types
    if c.dtype is not DType.bool:
        raise TypeError(f"condition must be bool, got {c.dtype}")
    return _broadcast_type([a, b]).with_shape(broadcast_shapes(c.shape, a.shape, b.shape))


define("where", ("cond", "lhs", "rhs"), shape=_where_type, rule=R.elementwise(R.select),
       numpy=lambda xs, out: np.where(xs[0], xs[1], xs[2]), family="elementwise",
       examples=lambda rng: [([rng.standard_normal((2, 3)) > 0, rng.standard_normal((2, 3)).astype(np.float32),
                               rng.standard_normal((3,)).astype(np.float32)], {})],
       doc="cond ? lhs : rhs with broadcasting")
