"""aten linear algebra and nn ops (mm, convolution, pooling, norms, softmax, ...) -> CIR."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.aten_node import AtenCtx, aten_op
from cuvil.frontend.torch_ops.helpers import as_vector, axis_of, like_input, reshape_to, slice_axis
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value


@aten_op("mm.default", "bmm.default", emits=("matmul",))
def _mm(ctx: AtenCtx) -> Value:
    return ctx.b.matmul(ctx.tensor("self"), ctx.tensor("mat2"))


def _scaled(ctx: AtenCtx, v: Value, factor: Any) -> Value:
    if factor is None or factor == 1:
        return v
    return ctx.b.mul(v, ctx.b.scalar(factor, v.dtype))


@aten_op("addmm.default", "baddbmm.default", emits=("matmul", "add", "mul"))
def _addmm(ctx: AtenCtx) -> Value:
    lhs, rhs = ("mat1", "mat2") if "mat1" in ctx.args else ("batch1", "batch2")
    prod = _scaled(ctx, ctx.b.matmul(ctx.tensor(lhs), ctx.tensor(rhs)), ctx.get("alpha", 1))
    beta = ctx.get("beta", 1)
    if beta == 0:
        return prod
    return ctx.b.add(prod, _scaled(ctx, ctx.tensor("self"), beta))


@aten_op("addmv.default", emits=("matmul", "add", "mul", "reshape"))
def _addmv(ctx: AtenCtx) -> Value:
    """``beta * self + alpha * (mat @ vec)``: the vector a one-column matrix."""
    vec = ctx.tensor("vec")
    column = ctx.b.matmul(ctx.tensor("mat"), reshape_to(ctx, vec, (vec.shape[0], 1)))
    prod = _scaled(ctx, reshape_to(ctx, column, (column.shape[0],)), ctx.get("alpha", 1))
    beta = ctx.get("beta", 1)
    if beta == 0:
        return prod
    return ctx.b.add(prod, _scaled(ctx, ctx.tensor("self"), beta))


@aten_op("linear.default", emits=("matmul", "add"))
def _linear(ctx: AtenCtx) -> Value:
    y = ctx.b.matmul(ctx.tensor("input"), ctx.tensor("weight"), transpose_b=True)
    bias = ctx.args.get("bias")
    return y if bias is None else ctx.b.add(y, ctx.tensor("bias"))


def _channel_bias(ctx: AtenCtx, y: Value, bias: Value) -> Value:
    return ctx.b.add(y, reshape_to(ctx, bias, (bias.shape[0],) + (1,) * (y.type.rank - 2)))


def _spatial(values: Sequence[int], n: int) -> tuple[int, ...]:
    vals = [int(v) for v in values]
    return tuple(vals * n) if len(vals) == 1 else tuple(vals)


@aten_op("convolution.default", emits=("conv", "conv_transpose", "add", "reshape"))
def _convolution(ctx: AtenCtx) -> Value:
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    n = x.type.rank - 2
    strides = _spatial(ctx["stride"], n)
    padding = _spatial(ctx["padding"], n)
    dilations = _spatial(ctx["dilation"], n)
    groups = int(ctx["groups"])
    if ctx["transposed"]:
        y = ctx.b.conv_transpose(x, w, strides=strides, pads=padding + padding, dilations=dilations, groups=groups,
                                 output_padding=_spatial(ctx["output_padding"], n))
    else:
        y = ctx.b.conv(x, w, strides=strides, pads=padding + padding, dilations=dilations, groups=groups)
    bias = ctx.args.get("bias")
    return y if bias is None else _channel_bias(ctx, y, ctx.tensor("bias"))


def _ones_or(ctx: AtenCtx, name: str, n: Dim, fill: float, dtype: DType) -> Value:
    v = ctx.args.get(name)
    if v is not None:
        return ctx.tensor(name)
    if not isinstance(n, int):
        raise ctx.unsupported(f"missing {name} over a symbolic dim")
    return ctx.b.const(np.full((n,), fill, dtype=dtype.np))


def _batch_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    x = ctx.tensor("input")
    c = x.shape[1]
    if ctx.args.get("running_mean") is None and ctx.args.get("running_var") is None and ctx.args.get("training"):
        return _batch_statistics_norm(ctx), None, None
    if ctx.args.get("running_mean") is None or ctx.args.get("running_var") is None:
        raise ctx.unsupported("batch norm without running statistics (training mode)")
    if ctx.args.get("training"):
        raise UnsupportedOpError("batch norm in training mode is not supported", location=ctx.location,
                                 hint="export the model in eval mode (model.eval())")
    scale = _ones_or(ctx, "weight", c, 1.0, x.dtype)
    bias = _ones_or(ctx, "bias", c, 0.0, x.dtype)
    y = ctx.b.batch_norm(x, scale, bias, ctx.tensor("running_mean"), ctx.tensor("running_var"),
                         epsilon=float(ctx["eps"]))
    return y, None, None


aten_op("_native_batch_norm_legit_no_training.default", "native_batch_norm.default",
        emits=("batch_norm", "const", "transpose", "reshape", "layer_norm", "mul", "add"))(_batch_norm)


@aten_op("_native_batch_norm_legit.no_stats", emits=("transpose", "reshape", "layer_norm", "mul", "add"))
def _batch_norm_no_stats(ctx: AtenCtx) -> tuple[Value, None, None]:
    return _batch_statistics_norm(ctx), None, None


def _batch_statistics_norm(ctx: AtenCtx) -> Value:
    """A batch norm over the input's own statistics, with no running ones to update: what ``instance_norm``
    exports as (its images as the channels of a batch of one) and what weight standardization writes. Per
    channel, a layer norm over the batch and every spatial axis (the biased variance, ``eps`` inside the
    root), then the per-channel affine map."""
    x = ctx.tensor("input")
    b = ctx.b
    rank = x.type.rank
    if rank < 2:
        raise ctx.unsupported(f"batch norm of a rank-{rank} input (needs N, C, ...)")
    one, zero = b.scalar(1, x.dtype), b.scalar(0, x.dtype)
    eps = float(ctx["eps"])
    if x.shape[0] == 1 and rank > 2:  # one sample: each channel's own elements, in place
        y = b.layer_norm(x, one, zero, axis=2, epsilon=eps)
    else:  # channels first, then each channel's batch and positions as one axis
        perm = (1, 0, *range(2, rank))  # its own inverse
        front = b.transpose(x, perm=perm)
        rest: Dim = 1
        for d in front.shape[1:]:
            rest = rest * d
        flat = b.layer_norm(b.reshape(front, shape=(front.shape[0], rest)), one, zero, axis=1, epsilon=eps)
        y = b.transpose(b.reshape(flat, shape=tuple(front.shape)), perm=perm)
    return _channel_affine(ctx, y)


@aten_op("native_layer_norm.default", emits=("layer_norm", "const"))
def _layer_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    x = ctx.tensor("input")
    k = len(ctx["normalized_shape"])
    norm_shape = tuple(x.shape[-k:])
    scale = ctx.tensor("weight") if ctx.args.get("weight") is not None else None
    bias = ctx.tensor("bias") if ctx.args.get("bias") is not None else None
    if scale is None or bias is None:
        if not all(isinstance(d, int) for d in norm_shape):
            raise ctx.unsupported("layer norm without affine parameters over symbolic dims")
        if scale is None:
            scale = ctx.b.const(np.ones(norm_shape, dtype=x.dtype.np))
        if bias is None:
            bias = ctx.b.const(np.zeros(norm_shape, dtype=x.dtype.np))
    y = ctx.b.layer_norm(x, scale, bias, axis=-k, epsilon=float(ctx["eps"]))
    return y, None, None


@aten_op("native_group_norm.default", emits=("reshape", "layer_norm", "mul", "add", "const"))
def _group_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    """Group norm as a layer norm over each group's elements, then the per-channel affine map."""
    x = ctx.tensor("input")
    b = ctx.b
    groups = int(ctx["group"])
    n, c = x.shape[0], x.shape[1]
    if not isinstance(c, int):
        raise ctx.unsupported("group norm over a symbolic channel count")
    rest: Dim = 1
    for d in x.shape[2:]:
        rest = rest * d
    grouped = b.reshape(x, shape=(n, groups, (c // groups) * rest))
    one, zero = b.scalar(1, x.dtype), b.scalar(0, x.dtype)
    y = b.reshape(b.layer_norm(grouped, one, zero, axis=-1, epsilon=float(ctx["eps"])), shape=tuple(x.shape))
    return _channel_affine(ctx, y), None, None


def _channel_affine(ctx: AtenCtx, y: Value) -> Value:
    """``y * weight + bias`` with one weight and bias per channel (axis 1), each where the node gives it."""
    per_channel = (y.shape[1],) + (1,) * (y.type.rank - 2)
    if ctx.args.get("weight") is not None:
        y = ctx.b.mul(y, reshape_to(ctx, ctx.tensor("weight"), per_channel))
    if ctx.args.get("bias") is not None:
        y = ctx.b.add(y, reshape_to(ctx, ctx.tensor("bias"), per_channel))
    return y


@aten_op("_softmax.default", "softmax.int", emits=("softmax", "cast", "reshape"))
def _softmax(ctx: AtenCtx) -> Value:
    given = ctx.tensor("self", ctx.out_dtype())
    x = as_vector(ctx, given)
    return like_input(ctx, ctx.b.softmax(x, axis=axis_of(ctx, ctx["dim"], x.type.rank)), given)


@aten_op("_log_softmax.default", "log_softmax.int", emits=("log_softmax", "cast", "reshape"))
def _log_softmax(ctx: AtenCtx) -> Value:
    given = ctx.tensor("self", ctx.out_dtype())
    x = as_vector(ctx, given)
    return like_input(ctx, ctx.b.log_softmax(x, axis=axis_of(ctx, ctx["dim"], x.type.rank)), given)


def _batched(ctx: AtenCtx) -> tuple[Value, int, bool]:
    """A pool's input with a batch axis, its spatial rank (from the op's name) and whether torch's input was
    unbatched ((C, H, W) for a 2-d pool: given a batch of one here, taken off the result)."""
    x = ctx.tensor("self")
    n = next(k for k in (1, 2, 3) if f"pool{k}d" in ctx.op_name)
    unbatched = x.type.rank == n + 1
    return (reshape_to(ctx, x, (1, *x.shape)) if unbatched else x), n, unbatched


def _max_pool(ctx: AtenCtx) -> Value | tuple[Value, None]:
    x, n, unbatched = _batched(ctx)
    kernel = _spatial(ctx["kernel_size"], n)
    strides = _spatial(ctx.get("stride") or kernel, n)
    padding = _spatial(ctx.get("padding", [0]), n)
    dilations = _spatial(ctx.get("dilation", [1]), n)
    y = ctx.b.max_pool(x, kernel=kernel, strides=strides, pads=padding + padding, dilations=dilations,
                       ceil_mode=bool(ctx.get("ceil_mode", False)))
    y = reshape_to(ctx, y, y.shape[1:]) if unbatched else y
    return (y, None) if "with_indices" in ctx.op_name else y


aten_op("max_pool2d_with_indices.default", "max_pool3d_with_indices.default", "max_pool2d.default",
        emits=("max_pool", "reshape"))(_max_pool)


@aten_op("avg_pool2d.default", "avg_pool3d.default", "avg_pool1d.default", emits=("avg_pool", "reshape"))
def _avg_pool(ctx: AtenCtx) -> Value:
    x, n, unbatched = _batched(ctx)
    if ctx.args.get("divisor_override") is not None:
        raise ctx.unsupported("divisor_override")
    kernel = _spatial(ctx["kernel_size"], n)
    strides = _spatial(ctx.get("stride") or kernel, n)
    padding = _spatial(ctx.get("padding", [0]), n)
    y = ctx.b.avg_pool(x, kernel=kernel, strides=strides, pads=padding + padding,
                       ceil_mode=bool(ctx.get("ceil_mode", False)),
                       count_include_pad=bool(ctx.get("count_include_pad", True)))
    return reshape_to(ctx, y, y.shape[1:]) if unbatched else y


def _adaptive_pool(ctx: AtenCtx, reduce: str) -> Value:
    """torch's adaptive pooling (``reduce_mean`` or ``reduce_max`` over each cell): one reduction for a single
    cell, a pool where the output size divides the input's, else :func:`_adaptive_cells`."""
    x, n, unbatched = _batched(ctx)
    out = _spatial(ctx["output_size"], n)
    spatial = tuple(x.shape[2:])
    b = ctx.b
    if all(o == 1 for o in out):
        y = b.op(reduce, x, axes=tuple(range(2, 2 + n)), keepdims=True)
    elif not all(isinstance(s, int) for s in spatial):
        raise ctx.unsupported(f"output size {list(out)} of a symbolic input size {list(spatial)}")
    elif all(int(s) % o == 0 for s, o in zip(spatial, out, strict=True)):
        kernel = tuple(int(s) // o for s, o in zip(spatial, out, strict=True))
        y = b.avg_pool(x, kernel=kernel, strides=kernel, pads=(0,) * (2 * n), ceil_mode=False,
                       count_include_pad=True) if reduce == "reduce_mean" else \
            b.max_pool(x, kernel=kernel, strides=kernel, pads=(0,) * (2 * n), dilations=(1,) * n, ceil_mode=False)
    else:
        y = _adaptive_cells(b, x, [int(s) for s in spatial], out, reduce)
    return reshape_to(ctx, y, y.shape[1:]) if unbatched else y


@aten_op("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default",
         "adaptive_avg_pool1d.default", emits=("reduce_mean", "avg_pool", "slice", "concat", "reshape"))
def _adaptive_avg_pool(ctx: AtenCtx) -> Value:
    return _adaptive_pool(ctx, "reduce_mean")


@aten_op("adaptive_max_pool2d.default", "adaptive_max_pool3d.default", "adaptive_max_pool1d.default",
         emits=("reduce_max", "max_pool", "slice", "concat", "reshape"))
def _adaptive_max_pool(ctx: AtenCtx) -> tuple[Value, None]:
    """The max of each adaptive cell; the indices are not computed (refused by name where a result uses them)."""
    return _adaptive_pool(ctx, "reduce_max"), None


def _adaptive_cells(b: Builder, x: Value, spatial: list[int], out: tuple[int, ...], reduce: str) -> Value:
    """Adaptive pooling where the output size does not divide the input's, as torch defines it: output
    cell ``i`` of an axis of ``s`` inputs and ``o`` outputs reduces inputs ``floor(i s / o) <= r < ceil((i + 1)
    s / o)`` (windows of unequal sizes, overlapping where ``o`` does not divide ``s``). Each cell is the mean (the
    max) of its window's slice; the cells are concatenated axis by axis, the last axis innermost."""
    windows = [[(i * s // o, -(-(i + 1) * s // o)) for i in range(o)] for s, o in zip(spatial, out, strict=True)]
    rank = x.type.rank

    def cells(axis: int, part: Value) -> Value:
        if axis == rank:
            return b.op(reduce, part, axes=tuple(range(2, rank)), keepdims=True)
        return b.concat(*(cells(axis + 1, slice_axis(b, part, axis, lo, hi)) for lo, hi in windows[axis - 2]),
                        axis=axis)

    return cells(2, x)


@aten_op("scaled_dot_product_attention.default", "_scaled_dot_product_flash_attention_for_cpu.default",
         emits=("matmul", "mul", "softmax", "add", "where", "trilu", "fill", "cast"))
def _sdpa(ctx: AtenCtx) -> Value | tuple[Value, None]:
    """Attention as its definition: softmax(q k^T * scale + mask) v."""
    b = ctx.b
    q, k, v = ctx.tensor("query"), ctx.tensor("key"), ctx.tensor("value")
    if ctx.get("dropout_p", 0.0):
        raise ctx.unsupported("dropout in attention")
    if ctx.get("enable_gqa", False):
        raise ctx.unsupported("grouped-query attention")
    scale = ctx.get("scale")
    d = q.shape[-1]
    if scale is None:
        if not isinstance(d, int):
            raise ctx.unsupported("default scale over a symbolic head size")
        scale = 1.0 / math.sqrt(d)
    scores = b.mul(b.matmul(q, k, transpose_b=True), b.scalar(float(scale), q.dtype))
    mask = ctx.args.get("attn_mask")
    if mask is not None:
        m = ctx.tensor("attn_mask")
        if m.dtype is DType.bool:
            scores = b.where(m, scores, b.scalar(-math.inf, q.dtype))
        else:
            scores = b.add(scores, ctx.cast(m, q.dtype))
    if ctx.get("is_causal", False):
        lq, lk = q.shape[-2], k.shape[-2]
        ones = b.fill(shape=(lq, lk), value=1, dtype=DType.bool)
        causal = b.trilu(ones, upper=False, k=0)
        scores = b.where(causal, scores, b.scalar(-math.inf, q.dtype))
    out = b.matmul(b.softmax(scores, axis=-1), v)
    return (out, None) if "flash" in ctx.op_name else out
