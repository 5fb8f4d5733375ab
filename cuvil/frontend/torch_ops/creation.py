"""aten casts, copies and tensor creation (full, zeros, arange, ...) -> CIR."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.frontend.aten_node import AtenCtx, Unavailable, aten_op
from cuvil.frontend.torch_ops.helpers import python_scalar
from cuvil.ir.symbolic import Sym
from cuvil.ir.values import Value


@aten_op("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default",
         "dropout.default", emits=())
def _identity(ctx: AtenCtx) -> Value:
    names = ctx.arg_names()
    return ctx.tensor(names[0])


@aten_op("_to_copy.default", "to.dtype", "_to_dim_order_copy.default", emits=("cast",))
def _to_copy(ctx: AtenCtx) -> Value:
    return ctx.tensor("self", ctx.out_dtype())


@aten_op("copy.default", emits=("expand", "cast"))
def _copy(ctx: AtenCtx) -> Value:
    src = ctx.tensor("src", ctx.out_dtype())
    shape = ctx.out_shape()
    return src if tuple(src.shape) == shape else ctx.b.expand(src, shape=shape)


def _fill(ctx: AtenCtx, value: Any) -> Value:
    dtype = ctx.out_dtype()
    shape = ctx.out_shape()
    if isinstance(value, (Value, Sym)):
        v = ctx.imp.as_value(value, dtype, ctx.location)
        return v if tuple(v.shape) == shape else ctx.b.expand(v, shape=shape)
    if not shape:
        return ctx.b.scalar(value, dtype)
    return ctx.b.fill(shape=shape, value=python_scalar(value, dtype), dtype=dtype)


@aten_op("full.default", emits=("fill", "const", "expand"))
def _full(ctx: AtenCtx) -> Value:
    return _fill(ctx, ctx["fill_value"])


@aten_op("full_like.default", emits=("fill", "const", "expand"))
def _full_like(ctx: AtenCtx) -> Value:
    return _fill(ctx, ctx["fill_value"])


@aten_op("zeros.default", "zeros_like.default", "empty.memory_format", "empty_like.default",
         "new_zeros.default", "new_empty.default", emits=("fill", "const"))
def _zeros(ctx: AtenCtx) -> Value:
    return _fill(ctx, 0)


@aten_op("ones.default", "ones_like.default", "new_ones.default", emits=("fill", "const"))
def _ones(ctx: AtenCtx) -> Value:
    return _fill(ctx, 1)


@aten_op("scalar_tensor.default", emits=("const", "cast", "shape", "slice", "reshape", "mul", "add"))
def _scalar_tensor(ctx: AtenCtx) -> Value:
    return ctx.tensor("s", ctx.out_dtype())


@aten_op("arange.default", "arange.start", "arange.start_step", emits=("const", "iota"))
def _arange(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    start = ctx.get("start", 0)
    step = ctx.get("step", 1)
    end = ctx["end"]
    if any(isinstance(v, (Value, Unavailable)) for v in (start, step, end)):
        raise ctx.unsupported("tensor bounds")
    (n,) = ctx.out_shape()
    if isinstance(start, Sym) or isinstance(step, Sym):
        raise ctx.unsupported("symbolic start or step")
    if isinstance(n, int):
        data = start + step * np.arange(n, dtype=np.float64 if dtype.is_float else np.int64)
        return ctx.b.const(np.asarray(data, dtype=dtype.np))
    return ctx.b.iota(shape=(n,), start=python_scalar(start, dtype), step=python_scalar(step, dtype), dtype=dtype)
