"""ONNX indexing ops -> CIR: gathers, scatters, one-hot, ranges, constant fills, triangles."""

from __future__ import annotations

import numpy as np

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_node import NodeCtx, SymbolicValueRequired, onnx_dtype, onnx_op
from cuvil.frontend.onnx_ops.blocks import static_scalar
from cuvil.frontend.onnx_ops.fold import Scalar, ceil_of, divided, is_symbolic, minus, number
from cuvil.frontend.onnx_ops.shape import norm_axes, static_dims
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, dim_bounds
from cuvil.ir.values import Value

# --------------------------------------------------------------------------------------
# gathers


@onnx_op("Gather", emits=("gather",))
def gather(ctx: NodeCtx) -> Value:
    return ctx.b.gather(ctx.input(0), ctx.input(1), axis=ctx.attr_int("axis", 0))


@onnx_op("GatherElements", emits=("gather_elements",))
def gather_elements(ctx: NodeCtx) -> Value:
    return ctx.b.gather_elements(ctx.input(0), ctx.input(1), axis=ctx.attr_int("axis", 0))


@onnx_op("GatherND", emits=("gather_nd",))
def gather_nd(ctx: NodeCtx) -> Value:
    return ctx.b.gather_nd(ctx.input(0), ctx.input(1), batch_dims=ctx.attr_int("batch_dims", 0))


@onnx_op("Compress", emits=("gather", "reshape"))
def compress(ctx: NodeCtx) -> Value:
    """The condition must be known at compile time: it decides the output's shape."""
    x = ctx.input(0)
    cond = np.asarray(ctx.static(1)).reshape(-1).astype(bool)
    keep = np.flatnonzero(cond).astype(np.int64)
    if ctx.has_attr("axis"):
        axis = norm_axes(ctx, [ctx.attr_int("axis")], x.type.rank)[0]
    else:
        n: Dim = 1
        for d in x.shape:
            n = n * d
        x = ctx.b.reshape(x, shape=[n])
        axis = 0
    d = x.shape[axis]
    if isinstance(d, int) and len(cond) > d:
        raise ShapeError(f"condition has {len(cond)} entries for an axis of {d}", location=ctx.location)
    return ctx.b.gather(x, ctx.b.const(keep), axis=axis)


@onnx_op("ReverseSequence", emits=("gather_elements", "reshape", "expand"))
def reverse_sequence(ctx: NodeCtx) -> Value:
    """Static sequence lengths become a constant index map read by gather_elements."""
    x = ctx.input(0)
    lens = np.asarray(ctx.static(1)).reshape(-1).astype(np.int64)
    t_ax = norm_axes(ctx, [ctx.attr_int("time_axis", 0)], x.type.rank)[0]
    b_ax = norm_axes(ctx, [ctx.attr_int("batch_axis", 1)], x.type.rank)[0]
    steps = x.shape[t_ax]
    if not isinstance(steps, int):
        raise ctx.unsupported(f"a symbolic time axis ({steps})")
    t = np.arange(steps)[:, None]
    idx = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # [time, batch]
    if t_ax > b_ax:
        idx = idx.T
    view = [1] * x.type.rank
    view[t_ax], view[b_ax] = steps, len(lens)
    full = ctx.b.expand(ctx.b.const(idx.reshape(view)), shape=list(x.shape))
    return ctx.b.gather_elements(x, full, axis=t_ax)


# --------------------------------------------------------------------------------------
# scatters


def _reduction(ctx: NodeCtx) -> str:
    r = ctx.attr_str("reduction", "none")
    if r not in ("none", "add", "mul", "max", "min"):
        raise ctx.unsupported(f"reduction {r!r}")
    return r


@onnx_op("Scatter", "ScatterElements", emits=("scatter_elements",))
def scatter_elements(ctx: NodeCtx) -> Value:
    return ctx.b.scatter_elements(ctx.input(0), ctx.input(1), ctx.input(2), axis=ctx.attr_int("axis", 0),
                                  reduction=_reduction(ctx))


@onnx_op("ScatterND", emits=("scatter_nd",))
def scatter_nd(ctx: NodeCtx) -> Value:
    return ctx.b.scatter_nd(ctx.input(0), ctx.input(1), ctx.input(2), reduction=_reduction(ctx))


# --------------------------------------------------------------------------------------
# OneHot, EyeLike, Trilu


@onnx_op("OneHot", emits=("one_hot", "cast", "reshape"))
def one_hot(ctx: NodeCtx) -> Value:
    ind, values = ctx.input(0), ctx.input(2)
    depth = static_scalar(ctx, 1)
    if not ind.dtype.is_int:
        ind = ctx.b.cast(ind, to=DType.i64)
    if values.type.rank != 1:
        values = ctx.b.reshape(values, shape=[2])
    return ctx.b.one_hot(ind, values, depth=int(depth), axis=ctx.attr_int("axis", -1))


@onnx_op("EyeLike", emits=("fill", "trilu"))
def eye_like(ctx: NodeCtx) -> Value:
    """Ones on diagonal k: a band of width one cut from a filled tensor by two triangles."""
    x = ctx.input(0)
    if x.type.rank != 2:
        raise ctx.unsupported(f"input of rank {x.type.rank} (expected 2)")
    dtype = onnx_dtype(ctx.attr_int("dtype"), ctx.location) if ctx.has_attr("dtype") else x.dtype
    k = ctx.attr_int("k", 0)
    ones = ctx.b.fill(shape=list(x.shape), value=True if dtype is DType.bool else 1, dtype=dtype)
    return ctx.b.trilu(ctx.b.trilu(ones, upper=True, k=k), upper=False, k=k)


@onnx_op("Trilu", emits=("trilu",))
def trilu(ctx: NodeCtx) -> Value:
    k = int(static_scalar(ctx, 1)) if ctx.has_input(1) else 0
    return ctx.b.trilu(ctx.input(0), upper=bool(ctx.attr_int("upper", 1)), k=k)


# --------------------------------------------------------------------------------------
# Range, ConstantOfShape


def _count(ctx: NodeCtx, start: Scalar, limit: Scalar, delta: Scalar) -> Dim:
    """max(ceil((limit - start) / delta), 0), exactly; symbolic when a bound comes from a symbolic
    shape (then taken as non-negative unless the dims' bounds show it is not, as the lengths of
    the slices beside it are)."""
    if not (is_symbolic(start) or is_symbolic(limit)):
        return max(int(np.ceil((number(limit) - number(start)) / number(delta))), 0)
    n = ceil_of(divided(minus(limit, start, ctx.location), delta, ctx.location), ctx.location)
    _, hi = dim_bounds(n)
    return 0 if hi is not None and hi <= 0 else n


@onnx_op("Range", emits=("iota", "add", "reshape"))
def range_(ctx: NodeCtx) -> Value:
    """A start read from a symbolic shape is added at run time to a range that starts at 0."""
    dtype = ctx.input(0).dtype
    start, limit, delta = (static_scalar(ctx, i, symbolic=True) for i in range(3))
    if is_symbolic(delta):
        raise SymbolicValueRequired(f"the Range step {delta}", ctx.location)
    if delta == 0:
        raise ShapeError("Range with delta 0", location=ctx.location)
    if dtype.is_int:
        start, limit, delta = (v if is_symbolic(v) else int(number(v)) for v in (start, limit, delta))
    n = _count(ctx, start, limit, delta)
    if not is_symbolic(start):
        return ctx.b.iota(shape=[n], start=start, step=delta, dtype=dtype)
    offset = ctx.b.reshape(ctx.input(0), shape=[])
    return ctx.b.add(ctx.b.iota(shape=[n], start=0, step=delta, dtype=dtype), offset)


@onnx_op("ConstantOfShape", emits=("fill",))
def constant_of_shape(ctx: NodeCtx) -> Value:
    shape = static_dims(ctx, 0)
    value = np.asarray(ctx.attr("value")) if ctx.has_attr("value") else np.zeros(1, np.float32)
    if value.size != 1:
        raise ctx.unsupported(f"a value with {value.size} elements")
    dtype = DType.from_numpy(value.dtype)
    return ctx.b.fill(shape=shape, value=value.reshape(()).item(), dtype=dtype)
