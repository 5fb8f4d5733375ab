"""ONNX layout ops (Reshape, Transpose, Shape, Constant, Identity) -> CIR."""

from __future__ import annotations

import numpy as np

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_import import NodeCtx, onnx_op
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value


@onnx_op("Constant", emits=("const",))
def constant(ctx: NodeCtx) -> Value:
    for name, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                        ("value_int", np.int64), ("value_ints", np.int64)):
        if ctx.has_attr(name):
            return ctx.b.const(np.asarray(ctx.attr(name), dtype=dtype))
    raise ctx.unsupported("only tensor/float/int values are supported")


@onnx_op("Identity", emits=())
def identity(ctx: NodeCtx) -> Value:
    return ctx.input(0)


def reshape_target(x_shape: tuple[Dim, ...], target: list, allowzero: bool, where: str) -> list[Dim]:
    """ONNX Reshape semantics: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out: list[Dim] = []
    infer = None
    for k, d in enumerate(target):
        if isinstance(d, (int, np.integer)) and int(d) == 0 and not allowzero:
            out.append(x_shape[k])
        elif isinstance(d, (int, np.integer)) and int(d) == -1:
            infer = k
            out.append(1)
        else:
            out.append(d if not isinstance(d, np.integer) else int(d))
    if infer is not None:
        total: Dim = 1
        for d in x_shape:
            total = total * d
        known: Dim = 1
        for d in out:
            known = known * d
        if isinstance(total, int) and isinstance(known, int) and (known == 0 or total % known):
            raise ShapeError(f"cannot infer -1 in reshape of {list(x_shape)} to {list(target)}", location=where)
        out[infer] = total // known
    return out


@onnx_op("Reshape", emits=("reshape",))
def reshape(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    target = list(ctx.static(1).tolist() if ctx.static(1).dtype != object else ctx.static(1))
    shape = reshape_target(x.shape, target, bool(ctx.attr_int("allowzero", 0)), ctx.location)
    return ctx.b.reshape(x, shape=shape)


@onnx_op("Transpose", emits=("transpose",))
def transpose(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    perm = ctx.attr_ints("perm", list(reversed(range(x.type.rank))))
    return ctx.b.transpose(x, perm=perm)
