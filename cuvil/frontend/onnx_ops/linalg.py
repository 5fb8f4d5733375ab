"""ONNX MatMul/Gemm/Einsum -> CIR matmul and einsum."""

from __future__ import annotations

from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.ir.values import Value


@onnx_op("MatMul", emits=("matmul", "reshape"))
def matmul(ctx: NodeCtx) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    b_ = ctx.b
    # numpy semantics for vectors: lift to matrices, then drop the lifted dim
    a2 = b_.reshape(a, shape=[1, a.shape[0]]) if a.type.rank == 1 else a
    bb = b_.reshape(b, shape=[b.shape[0], 1]) if b.type.rank == 1 else b
    out = b_.matmul(a2, bb)
    if a.type.rank == 1 or b.type.rank == 1:
        shape = list(out.shape)
        if b.type.rank == 1:
            shape.pop(-1)
        if a.type.rank == 1:
            shape.pop(-2 if b.type.rank != 1 else -1)
        out = b_.reshape(out, shape=shape)
    return out


@onnx_op("Gemm", emits=("matmul", "mul", "add"))
def gemm(ctx: NodeCtx) -> Value:
    """alpha * op(A) @ op(B) + beta * C, C broadcast to the result."""
    a, b = ctx.input(0), ctx.input(1)
    if a.type.rank != 2 or b.type.rank != 2:
        raise ctx.unsupported(f"operands of rank {a.type.rank} and {b.type.rank} (Gemm is 2-D)")
    alpha = ctx.attr_float("alpha", 1.0)
    beta = ctx.attr_float("beta", 1.0)
    y = ctx.b.matmul(a, b, transpose_a=bool(ctx.attr_int("transA", 0)), transpose_b=bool(ctx.attr_int("transB", 0)))
    if alpha != 1.0:
        y = ctx.b.mul(y, ctx.b.scalar(alpha, y.dtype))
    if ctx.has_input(2) and beta != 0.0:
        c = ctx.input(2)
        if beta != 1.0:
            c = ctx.b.mul(c, ctx.b.scalar(beta, c.dtype))
        y = ctx.b.add(y, c)
    return y


@onnx_op("Einsum", emits=("einsum",))
def einsum(ctx: NodeCtx) -> Value:
    xs = [ctx.input(i) for i in range(len(ctx.inputs))]
    return ctx.b.einsum(*xs, equation=ctx.attr_str("equation"))
