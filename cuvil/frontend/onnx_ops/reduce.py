"""ONNX reductions, arg-reductions, CumSum/CumProd and TopK -> CIR reduce ops.

The Reduce* family takes ``axes`` as an attribute up to opset 12 (ReduceSum) or 17 (the
others) and as an optional input after; ``noop_with_empty_axes`` then turns "no axes"
into the identity instead of a reduction over all axes.
"""

from __future__ import annotations

from cuvil.frontend.onnx_node import NodeCtx, in_f32, onnx_op
from cuvil.ir.values import Value

_SIMPLE = {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod"}


def _axes(ctx: NodeCtx) -> tuple[list[int] | None, bool]:
    """The reduced axes (None: the node is the identity) and keepdims."""
    keepdims = bool(ctx.attr_int("keepdims", 1))
    input_from = 13 if ctx.node.op_type == "ReduceSum" else 18
    if ctx.opset >= input_from:
        axes = [int(a) for a in ctx.static(1).reshape(-1).tolist()] if ctx.has_input(1) else []
        if not axes and ctx.attr_int("noop_with_empty_axes", 0):
            return None, keepdims
    else:
        axes = ctx.attr_ints("axes", [])
    rank = ctx.input(0).type.rank
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ctx.unsupported(f"axis {a} for rank {rank}")
    return axes, keepdims


@onnx_op(*_SIMPLE, emits=_SIMPLE)
def reduce_simple(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    axes, keepdims = _axes(ctx)
    if axes is None:
        return x
    return ctx.b.op(_SIMPLE[ctx.node.op_type], x, axes=axes, keepdims=keepdims)



@onnx_op("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
         emits=("reduce_sum", "reduce_max", "abs", "mul", "sqrt", "log", "exp", "sub", "add", "cast", "isinf", "where",
                "const"))
def reduce_composite(ctx: NodeCtx) -> Value:
    """Half-precision inputs are reduced in f32 and the result rounded once, as ONNX Runtime does (a
    sum of squares in f16 would overflow long before its square root does)."""
    return in_f32(ctx.b, ctx.input(0), lambda x: _composite(ctx, x))


def _composite(ctx: NodeCtx, x: Value) -> Value:
    axes, keepdims = _axes(ctx)
    b = ctx.b
    kind = ctx.node.op_type
    if axes is None:
        # the identity on the reduction: only the elementwise part remains
        return {"ReduceL1": lambda: b.abs(x), "ReduceL2": lambda: b.sqrt(b.mul(x, x)),
                "ReduceSumSquare": lambda: b.mul(x, x), "ReduceLogSum": lambda: b.log(x),
                "ReduceLogSumExp": lambda: x}[kind]()
    total = lambda v: b.reduce_sum(v, axes=axes, keepdims=keepdims)
    if kind == "ReduceL1":
        return total(b.abs(x))
    if kind == "ReduceL2":
        return b.sqrt(total(b.mul(x, x)))
    if kind == "ReduceSumSquare":
        return total(b.mul(x, x))
    if kind == "ReduceLogSum":
        return b.log(total(x))
    # log(sum(exp(x - m))) + m, m the max where it is finite (it keeps exp from overflowing) and else 0:
    # a slice of -infs then gives log(0) = -inf and one holding +inf gives +inf, not inf - inf = NaN
    def shift(keep: bool) -> Value:
        top = b.reduce_max(x, axes=axes, keepdims=keep)
        return b.where(b.isinf(top), b.scalar(0, top.dtype), top) if top.dtype.is_float else top

    lse = b.log(total(b.exp(b.sub(x, shift(True)))))
    return b.add(lse, shift(keepdims))


@onnx_op("ArgMax", "ArgMin", emits=("argmax", "argmin"))
def arg_reduce(ctx: NodeCtx) -> Value:
    op = "argmax" if ctx.node.op_type == "ArgMax" else "argmin"
    return ctx.b.op(op, ctx.input(0), axis=ctx.attr_int("axis", 0), keepdims=bool(ctx.attr_int("keepdims", 1)),
                    select_last_index=bool(ctx.attr_int("select_last_index", 0)))


@onnx_op("CumSum", "CumProd", emits=("cumsum", "cumprod"))
def running(ctx: NodeCtx) -> Value:
    axis = ctx.static(1).reshape(-1)
    if axis.size != 1:
        raise ctx.unsupported(f"axis must be a scalar, got {axis.size} values")
    op = "cumsum" if ctx.node.op_type == "CumSum" else "cumprod"
    return ctx.b.op(op, ctx.input(0), axis=int(axis[0]), exclusive=bool(ctx.attr_int("exclusive", 0)),
                    reverse=bool(ctx.attr_int("reverse", 0)))


@onnx_op("TopK", emits=("topk",))
def topk(ctx: NodeCtx) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset >= 10:
        kv = ctx.static(1).reshape(-1)
        if kv.size != 1:
            raise ctx.unsupported(f"K must hold one value, got {kv.size}")
        k = int(kv[0])
    else:
        k = ctx.attr_int("k")
    attrs = {"k": k, "axis": ctx.attr_int("axis", -1), "largest": bool(ctx.attr_int("largest", 1)),
             "sorted": bool(ctx.attr_int("sorted", 1))}
    return [ctx.b.topk(x, output="values", **attrs), ctx.b.topk(x, output="indices", **attrs)]
