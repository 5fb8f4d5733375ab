"""aten reductions -> CIR."""

from __future__ import annotations

import math
from typing import Any

from cuvil.frontend.aten_node import AtenConverter, AtenCtx, aten_op
from cuvil.frontend.torch_ops.helpers import as_vector, axis_of, like_input, reshape_to
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, sym_max
from cuvil.ir.values import Value


def _reduce_axes(ctx: AtenCtx, x: Value, dims: Any) -> tuple[int, ...]:
    if dims is None:
        return ()
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({axis_of(ctx, d, x.type.rank) for d in dims}))


def _reduce(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self", ctx.out_dtype())
        axes = _reduce_axes(ctx, x, ctx.get("dim"))
        if x.type.rank == 0:
            return x
        return ctx.b.op(cir, x, axes=axes, keepdims=bool(ctx.get("keepdim", False)))

    return conv


aten_op("mean.dim", "mean.default", emits=("reduce_mean", "cast"))(_reduce("reduce_mean"))
aten_op("sum.dim_IntList", "sum.default", emits=("reduce_sum", "cast"))(_reduce("reduce_sum"))
aten_op("amax.default", "max.default", emits=("reduce_max",))(_reduce("reduce_max"))
aten_op("amin.default", "min.default", emits=("reduce_min",))(_reduce("reduce_min"))
aten_op("prod.dim_int", "prod.default", emits=("reduce_prod", "cast"))(_reduce("reduce_prod"))


@aten_op("linalg_vector_norm.default", "norm.ScalarOpt_dim", "norm.Scalar",
         emits=("reduce_sum", "reduce_max", "reduce_min", "abs", "mul", "sqrt", "pow", "not_equal", "cast"))
def _vector_norm(ctx: AtenCtx) -> Value:
    """``torch.linalg.vector_norm`` (and ``torch.norm`` of a vector): ord 2 as the square root of the sum of
    squares, 1 the sum of magnitudes, +-inf their largest / smallest, 0 the count of nonzeros, any other
    p ``(sum |x|^p)^(1/p)``; half-precision inputs summed in float32 and rounded once, as torch does."""
    out = ctx.out_dtype()
    x = ctx.tensor("self")
    if not x.dtype.is_float:
        x = ctx.cast(x, out)
    order = float(ctx.get("ord", ctx.get("p", 2)))
    axes = _reduce_axes(ctx, x, ctx.get("dim"))
    keep = bool(ctx.get("keepdim", False))
    b = ctx.b
    work = DType.f32 if x.dtype in (DType.f16, DType.bf16) else x.dtype
    x = ctx.cast(x, work)

    def reduce(kind: str, v: Value) -> Value:
        return b.op(kind, v, axes=axes, keepdims=keep) if v.type.rank else v

    if order == 0.0:
        nonzero = ctx.cast(b.not_equal(x, b.const(0.0, work)), work)
        r = reduce("reduce_sum", nonzero)
    elif order == 2.0:
        r = b.sqrt(reduce("reduce_sum", b.mul(x, x)))
    elif order == 1.0:
        r = reduce("reduce_sum", b.abs(x))
    elif math.isinf(order):
        r = reduce("reduce_max" if order > 0 else "reduce_min", b.abs(x))
    else:
        total = reduce("reduce_sum", b.pow(b.abs(x), b.const(order, work)))
        r = b.pow(total, b.const(1.0 / order, work))
    return ctx.cast(r, out)


def _bool_reduce(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.cast(ctx.tensor("self", DType.bool), DType.u8)
        axes = _reduce_axes(ctx, x, ctx.get("dim"))
        r = ctx.b.op(kind, x, axes=axes, keepdims=bool(ctx.get("keepdim", False))) if x.type.rank else x
        return ctx.cast(ctx.cast(r, DType.bool), ctx.out_dtype())  # a uint8 input's result is uint8 0 or 1

    return conv


aten_op("any.default", "any.dim", "any.dims", emits=("reduce_max", "cast"))(_bool_reduce("reduce_max"))
aten_op("all.default", "all.dim", "all.dims", emits=("reduce_min", "cast"))(_bool_reduce("reduce_min"))


def _minmax_dim(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> tuple[Value, Value]:
        given = ctx.tensor("self")
        x = as_vector(ctx, given)
        axis = axis_of(ctx, ctx["dim"], x.type.rank)
        keep = bool(ctx.get("keepdim", False))
        values = ctx.b.op(f"reduce_{kind}", x, axes=(axis,), keepdims=keep)
        indices = ctx.b.op(f"arg{kind}", x, axis=axis, keepdims=keep, select_last_index=False)
        return like_input(ctx, values, given), like_input(ctx, indices, given)

    return conv


aten_op("max.dim", emits=("reduce_max", "argmax", "reshape"))(_minmax_dim("max"))
aten_op("min.dim", emits=("reduce_min", "argmin", "reshape"))(_minmax_dim("min"))


def _arg(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self")
        dim = ctx.get("dim")
        keep = bool(ctx.get("keepdim", False))
        if dim is None:
            flat = ctx.b.reshape(x, shape=(x.type.numel(),))
            out = ctx.b.op(kind, flat, axis=0, keepdims=False, select_last_index=False)
            return reshape_to(ctx, out, ctx.out_shape())
        v = as_vector(ctx, x)
        out = ctx.b.op(kind, v, axis=axis_of(ctx, dim, v.type.rank), keepdims=keep, select_last_index=False)
        return like_input(ctx, out, x)

    return conv


aten_op("argmax.default", emits=("argmax", "reshape"))(_arg("argmax"))
aten_op("argmin.default", emits=("argmin", "reshape"))(_arg("argmin"))


def _variance(ctx: AtenCtx) -> tuple[Value, Value]:
    """The variance (the standard deviation for ``std``) and the mean over the reduced dims, each kept or
    dropped as ``keepdim`` says. The divisor is ``max(0, N - correction)``, as torch's: a correction past N
    gives inf (or NaN for an all-equal slice), not a negative variance."""
    x = ctx.tensor("self", ctx.out_dtype(0 if "_mean." in ctx.op_name else None))
    b = ctx.b
    axes = _reduce_axes(ctx, x, ctx.get("dim"))
    keep = bool(ctx.get("keepdim", False))
    if ctx.op_name.endswith(".dim"):
        correction = 1 if ctx.get("unbiased", True) else 0
    else:
        c = ctx.args.get("correction")
        correction = 1 if c is None else c
    mean = b.reduce_mean(x, axes=axes, keepdims=True)
    d = b.sub(x, mean)
    ss = b.reduce_sum(b.mul(d, d), axes=axes, keepdims=keep)
    n: Dim = 1
    for a in (axes or tuple(range(x.type.rank))):
        n = n * x.shape[a]
    divisor = n - correction
    divisor = max(divisor, 0) if isinstance(divisor, (int, float)) else sym_max(divisor, 0)
    var = b.div(ss, ctx.imp.as_value(divisor, x.dtype, ctx.location))
    spread = b.sqrt(var) if ctx.op_name.startswith("aten.std") else var
    return spread, mean if keep else b.reduce_mean(x, axes=axes, keepdims=False)


@aten_op("var.correction", "var.dim", "std.correction", "std.dim",
         emits=("reduce_mean", "reduce_sum", "sub", "mul", "div", "sqrt"))
def _var(ctx: AtenCtx) -> Value:
    return _variance(ctx)[0]


@aten_op("var_mean.correction", "var_mean.dim", "std_mean.correction", "std_mean.dim",
         emits=("reduce_mean", "reduce_sum", "sub", "mul", "div", "sqrt"))
def _var_mean(ctx: AtenCtx) -> tuple[Value, Value]:
    return _variance(ctx)
