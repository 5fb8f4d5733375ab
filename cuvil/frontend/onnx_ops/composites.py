"""Small ONNX linear algebra and scatter-like ops spelled out in catalogue ops."""

from __future__ import annotations

import itertools

import numpy as np

from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import fill, static_dims, take
from cuvil.ir.values import Value


@onnx_op("Det", emits=("gather", "mul", "add", "sub", "neg"))
def det(ctx: NodeCtx) -> Value:
    """Leibniz expansion over the permutations of a small static matrix."""
    b = ctx.b
    x = ctx.input(0)
    n = x.shape[-1]
    if not isinstance(n, int) or n != x.shape[-2]:
        raise ctx.unsupported(f"needs square static matrices, got {x.type}")
    if n > 4:
        raise ctx.unsupported(f"determinants of {n}x{n} matrices (at most 4x4)")
    rank = x.type.rank
    rows = [take(b, x, rank - 2, i) for i in range(n)]
    elem = [[take(b, row, row.type.rank - 1, j) for j in range(n)] for row in rows]
    total: Value | None = None
    for perm in itertools.permutations(range(n)):
        term = elem[0][perm[0]]
        for i in range(1, n):
            term = b.mul(term, elem[i][perm[i]])
        inversions = sum(1 for i in range(n) for j in range(i + 1, n) if perm[i] > perm[j])
        if total is None:
            total = term if inversions % 2 == 0 else b.neg(term)
        else:
            total = b.sub(total, term) if inversions % 2 else b.add(total, term)
    assert total is not None
    return total


@onnx_op("MaxUnpool", emits=("fill", "scatter_elements", "reshape", "pad"))
def max_unpool(ctx: NodeCtx) -> Value:
    """Scatter each value to the flat position MaxPool recorded for it in the inferred output;
    a larger ``output_shape`` pads that with zeros at the end of each spatial axis."""
    b = ctx.b
    x, idx = ctx.input(0), ctx.input(1)
    xs = static_dims(x, ctx, "MaxUnpool")
    kernel = ctx.attr_ints("kernel_shape")
    nsp = len(kernel)
    strides = ctx.attr_ints("strides", [1] * nsp)
    pads = ctx.attr_ints("pads", [0] * (2 * nsp))
    inferred = list(xs[:2]) + [(xs[2 + k] - 1) * strides[k] + kernel[k] - pads[k] - pads[k + nsp]
                               for k in range(nsp)]
    flat = fill(b, [int(np.prod(inferred))], 0.0, x.dtype)
    n = int(np.prod(xs))
    out = b.scatter_elements(flat, b.reshape(idx, shape=[n]), b.reshape(x, shape=[n]), axis=0, reduction="none")
    out = b.reshape(out, shape=inferred)
    if not ctx.has_input(2):
        return out
    target = [int(d) for d in np.asarray(ctx.static(2)).tolist()]
    if len(target) != len(inferred) or any(t < i for t, i in zip(target, inferred, strict=True)):
        raise ctx.unsupported(f"output_shape {target} is smaller than the pooled extent {inferred}")
    if target == inferred:
        return out
    rank = len(target)
    return b.pad(out, pads=[0] * rank + [t - i for t, i in zip(target, inferred, strict=True)], mode="constant",
                 value=0.0)
