"""ONNX elementwise ops -> CIR elementwise ops."""

from __future__ import annotations

from cuvil.frontend.onnx_import import NodeCtx, onnx_op
from cuvil.ir.values import Value

_BINARY = {"Add": "add"}
_UNARY = {"Relu": "relu"}


@onnx_op(*_BINARY, emits=tuple(_BINARY.values()))
def binary(ctx: NodeCtx) -> Value:
    return ctx.b.op(_BINARY[ctx.node.op_type], ctx.input(0), ctx.input(1))


@onnx_op(*_UNARY, emits=tuple(_UNARY.values()))
def unary(ctx: NodeCtx) -> Value:
    return ctx.b.op(_UNARY[ctx.node.op_type], ctx.input(0))
