"""ONNX MatMul/Gemm -> CIR matmul."""

from __future__ import annotations

from cuvil.frontend.onnx_import import NodeCtx, onnx_op
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
