"""ONNX convolution, pooling, normalization and softmax ops -> CIR nn ops.

Biases and per-channel affine parts become broadcast adds and muls, so the CIR ops stay
the pure index-level meanings (conv without bias, layer_norm over trailing axes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from cuvil.frontend.onnx_node import HALF, NodeCtx, in_f32, onnx_op
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value

# --------------------------------------------------------------------------------------
# window attributes


def window_attrs(ctx: NodeCtx, nsp: int, kernel: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations and explicit-or-automatic pads (begins then ends) of a windowed node."""
    strides = ctx.attr_ints("strides", None) or [1] * nsp
    dilations = ctx.attr_ints("dilations", None) or [1] * nsp
    if len(strides) != nsp or len(dilations) != nsp or len(kernel) != nsp:
        raise ctx.unsupported(f"strides {strides}, dilations {dilations} and kernel {list(kernel)} "
                              f"must have {nsp} entries")
    auto_pad = ctx.attr_str("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = ctx.attr_ints("pads", None) or [0] * (2 * nsp)
        if len(pads) != 2 * nsp:
            raise ctx.unsupported(f"pads {pads} must have {2 * nsp} entries")
        return strides, dilations, pads
    if auto_pad == "VALID":
        return strides, dilations, [0] * (2 * nsp)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad {auto_pad!r}")
    x = ctx.input(0)
    totals: list[int] = []
    for j in range(nsp):
        size = x.shape[2 + j]
        if not isinstance(size, int):
            raise ctx.unsupported(f"auto_pad {auto_pad} on the symbolic spatial dim {size}")
        out = -(-size // strides[j])
        totals.append(max((out - 1) * strides[j] + (kernel[j] - 1) * dilations[j] + 1 - size, 0))
    return strides, dilations, _split_pads(totals, auto_pad)


def _split_pads(totals: Sequence[int], auto_pad: str) -> list[int]:
    """Begin then end pads sharing each axis' total padding; SAME_UPPER puts the odd one at the end."""
    begins: list[int] = []
    ends: list[int] = []
    for total in totals:
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _spatial_rank(ctx: NodeCtx, x: Value) -> int:
    """How many spatial axes an NC* input has (at least one)."""
    nsp = x.type.rank - 2
    if nsp < 1:
        raise ctx.unsupported(f"input of rank {x.type.rank} (needs N, C and spatial dims)")
    return nsp


def conv_kernel(ctx: NodeCtx, x: Value, w: Value) -> tuple[int, list[int]]:
    """The number of spatial axes of a convolution and its kernel shape (the attribute, or the weight's)."""
    nsp = _spatial_rank(ctx, x)
    kernel = ctx.attr_ints("kernel_shape", None) or list(w.shape[2:])
    # a symbolic weight extent is not checked here: the conv ops refuse it (they need a static kernel)
    return nsp, cast(list[int], kernel)


def _channel_view(ctx: NodeCtx, v: Value, rank: int) -> Value:
    """A per-channel vector [C] reshaped to [C, 1, ...] so it broadcasts over N, C, spatial..."""
    return ctx.b.reshape(v, shape=[v.shape[0]] + [1] * (rank - 2))


def _with_bias(ctx: NodeCtx, y: Value) -> Value:
    """``y`` plus the optional per-channel bias (input 2) of a convolution."""
    if not ctx.has_input(2):
        return y
    return ctx.b.add(y, _channel_view(ctx, ctx.input(2), y.type.rank))


# --------------------------------------------------------------------------------------
# convolution


@onnx_op("Conv", emits=("conv", "reshape", "add"))
def conv(ctx: NodeCtx) -> Value:
    x, w = ctx.input(0), ctx.input(1)
    nsp, kernel = conv_kernel(ctx, x, w)
    if list(kernel) != list(w.shape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the weight's {list(w.shape[2:])}")
    strides, dilations, pads = window_attrs(ctx, nsp, kernel)
    y = ctx.b.conv(x, w, strides=strides, pads=pads, dilations=dilations, groups=ctx.attr_int("group", 1))
    return _with_bias(ctx, y)


@onnx_op("ConvTranspose", emits=("conv_transpose", "reshape", "add"))
def conv_transpose(ctx: NodeCtx) -> Value:
    x, w = ctx.input(0), ctx.input(1)
    nsp, kernel = conv_kernel(ctx, x, w)
    strides = ctx.attr_ints("strides", None) or [1] * nsp
    dilations = ctx.attr_ints("dilations", None) or [1] * nsp
    out_pad = ctx.attr_ints("output_padding", None) or [0] * nsp
    groups = ctx.attr_int("group", 1)
    auto_pad = ctx.attr_str("auto_pad", "NOTSET")
    out_shape = ctx.attr_ints("output_shape", None)
    pads = ctx.attr_ints("pads", None)
    if auto_pad == "VALID":
        pads = [0] * (2 * nsp)
    # an explicit output_shape (or SAME padding) determines the pads, as the ONNX spec says
    if out_shape is not None or (pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER")):
        in_sp = x.shape[2:]
        if not all(isinstance(d, int) for d in in_sp):
            raise ctx.unsupported("output_shape/auto_pad with symbolic spatial dims")
        if out_shape is None:
            out_shape = [int(d) * s for d, s in zip(in_sp, strides, strict=True)]
        out_shape = list(out_shape)[-nsp:]
        pads = _split_pads([strides[j] * (int(in_sp[j]) - 1) + out_pad[j] + (kernel[j] - 1) * dilations[j] + 1
                            - out_shape[j] for j in range(nsp)], auto_pad)
    pads = pads or [0] * (2 * nsp)
    y = ctx.b.conv_transpose(x, w, strides=strides, pads=pads, dilations=dilations, groups=groups,
                             output_padding=out_pad)
    return _with_bias(ctx, y)


# --------------------------------------------------------------------------------------
# pooling


def _pool_common(ctx: NodeCtx) -> tuple[Value, dict]:
    x = ctx.input(0)
    return x, pool_window(ctx, x)


def pool_window(ctx: NodeCtx, x: Value) -> dict:
    """A pool's window attributes over the spatial axes of ``x`` (channels first), as the CIR pools take them."""
    nsp = _spatial_rank(ctx, x)
    kernel = ctx.attr_ints("kernel_shape")
    strides, dilations, pads = window_attrs(ctx, nsp, kernel)
    return {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
            "ceil_mode": bool(ctx.attr_int("ceil_mode", 0))}


@onnx_op("MaxPool", emits=("max_pool",))
def max_pool(ctx: NodeCtx) -> list[Value]:
    x, attrs = _pool_common(ctx)
    outs = [ctx.b.max_pool(x, **attrs)]
    if ctx.num_outputs > 1 and ctx.node.output[1]:
        outs.append(ctx.b.max_pool(x, output="indices", storage_order=ctx.attr_int("storage_order", 0), **attrs))
    return outs


@onnx_op("AveragePool", emits=("avg_pool",))
def average_pool(ctx: NodeCtx) -> Value:
    x, attrs = _pool_common(ctx)
    return ctx.b.avg_pool(x, count_include_pad=bool(ctx.attr_int("count_include_pad", 0)), **attrs)


@onnx_op("LpPool", emits=("lp_pool",))
def lp_pool(ctx: NodeCtx) -> Value:
    x, attrs = _pool_common(ctx)
    return ctx.b.lp_pool(x, p=float(ctx.attr_int("p", 2)), **attrs)


def _spatial_axes(ctx: NodeCtx, x: Value) -> list[int]:
    return list(range(2, 2 + _spatial_rank(ctx, x)))


@onnx_op("GlobalAveragePool", emits=("reduce_mean",))
def global_average_pool(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    return ctx.b.reduce_mean(x, axes=_spatial_axes(ctx, x), keepdims=True)


@onnx_op("GlobalMaxPool", emits=("reduce_max",))
def global_max_pool(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    return ctx.b.reduce_max(x, axes=_spatial_axes(ctx, x), keepdims=True)


@onnx_op("GlobalLpPool", emits=("lp_pool",))
def global_lp_pool(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    spatial = [x.shape[a] for a in _spatial_axes(ctx, x)]
    if not all(isinstance(d, int) for d in spatial):
        raise ctx.unsupported("symbolic spatial dims")
    return ctx.b.lp_pool(x, kernel=spatial, p=float(ctx.attr_int("p", 2)))


# --------------------------------------------------------------------------------------
# normalization


@onnx_op("BatchNormalization", emits=("batch_norm", "reduce_mean", "sub", "mul", "add", "cast", "rsqrt"))
def batch_norm(ctx: NodeCtx) -> list[Value]:
    if not ctx.attr_int("spatial", 1):
        raise ctx.unsupported("spatial=0 (per-activation statistics)")
    x = ctx.input(0)
    rest = [_as_dtype(ctx, ctx.input(i), x.dtype) for i in range(1, 5)]
    eps = ctx.attr_float("epsilon", 1e-5)
    if ctx.opset >= 14 and ctx.attr_int("training_mode", 0):
        return _batch_norm_training(ctx, x, *rest, epsilon=eps)
    if ctx.num_outputs > 1 and any(ctx.node.output[1:]):
        if ctx.opset < 14 and ctx.num_outputs == 5:
            # before opset 14 the five outputs are what selects training mode (a batch norm over the batch's own
            # statistics: the TorchScript exporter writes weight standardization so)
            return _batch_norm_training(ctx, x, *rest, epsilon=eps, saved=True)
        raise ctx.unsupported("running statistics outputs of an inference batch normalization (training mode is "
                              "training_mode=1 from opset 14, before it all five outputs)")
    return [ctx.b.batch_norm(x, *rest, epsilon=eps)]


def _batch_norm_training(ctx: NodeCtx, x: Value, scale: Value, bias: Value, mean: Value, var: Value,
                         epsilon: float, saved: bool = False) -> list[Value]:
    """Training mode normalizes by the batch's own statistics (mean and population variance over
    every axis but the channels, computed in float32 for half types) and also returns the running
    statistics blended with them by ``momentum``; before opset 14 (``saved``) also the batch's mean and,
    as ONNX Runtime computes it (the operator's text says "saved variance"), its inverse standard deviation
    ``1 / sqrt(var + epsilon)``."""
    b = ctx.b
    wide = b.cast(x, to=DType.f32) if x.dtype in HALF else x
    axes = [a for a in range(x.type.rank) if a != 1]
    batch_mean = b.reduce_mean(wide, axes=axes, keepdims=False)
    centred = b.sub(wide, b.reshape(batch_mean, shape=[1, x.shape[1]] + [1] * (x.type.rank - 2)))
    batch_var = b.reduce_mean(b.mul(centred, centred), axes=axes, keepdims=False)
    stats = [_as_dtype(ctx, batch_mean, x.dtype), _as_dtype(ctx, batch_var, x.dtype)]
    y = b.batch_norm(x, scale, bias, *stats, epsilon=epsilon)
    momentum = ctx.attr_float("momentum", 0.9)
    keep = b.const(np.array(momentum, dtype=x.dtype.np))
    blend = b.const(np.array(1.0 - momentum, dtype=x.dtype.np))
    running = [b.add(b.mul(old, keep), b.mul(new, blend)) for old, new in zip((mean, var), stats, strict=True)]
    outs = [y, *running]
    if saved:
        inv_std = b.rsqrt(b.add(batch_var, b.const(np.array(epsilon, dtype=batch_var.dtype.np))))
        outs += [stats[0], _as_dtype(ctx, inv_std, x.dtype)]
    return outs[:max(ctx.num_outputs, 1)]


def _as_dtype(ctx: NodeCtx, v: Value, dtype: DType) -> Value:
    return v if v.dtype is dtype else ctx.b.cast(v, to=dtype)


def _stash(ctx: NodeCtx, x: Value) -> Value:
    """Half-precision inputs are normalized in f32 (ONNX's stash_type=1 default)."""
    if x.dtype in HALF and ctx.attr_int("stash_type", 1) == 1:
        return ctx.b.cast(x, to=DType.f32)
    return x


def _unit_layer_norm(ctx: NodeCtx, x: Value, axis: int, epsilon: float) -> Value:
    """(x - mean) / sqrt(var + eps) over axes [axis, rank), without affine part."""
    ones = ctx.b.const(np.ones((1,), dtype=x.dtype.np))
    zeros = ctx.b.const(np.zeros((1,), dtype=x.dtype.np))
    return ctx.b.layer_norm(x, ones, zeros, axis=axis, epsilon=epsilon)


def _first_normalized_axis(ctx: NodeCtx, rank: int) -> int:
    """The ``axis`` attribute (default -1) made non-negative: the node normalizes over axes [axis, rank)."""
    axis = ctx.attr_int("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} for rank {rank}")
    return axis % rank


@onnx_op("LayerNormalization", emits=("layer_norm", "cast", "reduce_mean", "sub", "mul", "add", "rsqrt"))
def layer_norm(ctx: NodeCtx) -> list[Value]:
    x = ctx.input(0)
    rank = x.type.rank
    axis = _first_normalized_axis(ctx, rank)
    eps = ctx.attr_float("epsilon", 1e-5)
    xs = _stash(ctx, x)
    scale = _as_dtype(ctx, ctx.input(1), xs.dtype)
    bias = _as_dtype(ctx, ctx.input(2), xs.dtype) if ctx.has_input(2) else \
        ctx.b.const(np.zeros((1,), dtype=xs.dtype.np))
    y = _as_dtype(ctx, ctx.b.layer_norm(xs, scale, bias, axis=axis, epsilon=eps), x.dtype)
    outs: list[Value] = [y]
    if any(wants_output(ctx, k) for k in (1, 2)):
        outs += moments(ctx.b, xs, axis, eps)
    return outs[:max(1, ctx.num_outputs)]


def wants_output(ctx: NodeCtx, k: int) -> bool:
    """Whether the node names its optional output ``k``."""
    return k < ctx.num_outputs and bool(ctx.node.output[k])


def moments(b: Builder, xs: Value, axis: int, eps: float) -> list[Value]:
    """The mean of ``xs`` over axes [axis, rank) and ``1 / sqrt(variance + eps)``, the axes kept: a layer
    normalization's optional outputs."""
    axes = list(range(axis, xs.type.rank))
    mean = b.reduce_mean(xs, axes=axes, keepdims=True)
    dev = b.sub(xs, mean)
    var = b.reduce_mean(b.mul(dev, dev), axes=axes, keepdims=True)
    return [mean, b.rsqrt(b.add(var, b.scalar(eps, xs.dtype)))]


def mean_square(b: Builder, xs: Value, axis: int, eps: float) -> Value:
    """``mean(xs^2) + eps`` over axes [axis, rank), the axes kept: an RMS normalization's divisor, squared."""
    return b.add(b.reduce_mean(b.mul(xs, xs), axes=list(range(axis, xs.type.rank)), keepdims=True),
                 b.scalar(eps, xs.dtype))


@onnx_op("InstanceNormalization", emits=("layer_norm", "reshape", "mul", "add"))
def instance_norm(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    if x.type.rank < 3:
        raise ctx.unsupported(f"input of rank {x.type.rank} (needs N, C and spatial dims)")
    y = _unit_layer_norm(ctx, x, 2, ctx.attr_float("epsilon", 1e-5))
    rank = x.type.rank
    y = ctx.b.mul(y, _channel_view(ctx, ctx.input(1), rank))
    return ctx.b.add(y, _channel_view(ctx, ctx.input(2), rank))


@onnx_op("GroupNormalization", emits=("layer_norm", "reshape", "cast", "mul", "add"))
def group_norm(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    rank = x.type.rank
    if rank < 2:
        raise ctx.unsupported(f"input of rank {rank} (needs N, C, ...)")
    groups = ctx.attr_int("num_groups")
    n, ch, *spatial = x.shape
    if isinstance(ch, int) and ch % groups:
        raise ctx.unsupported(f"{ch} channels do not split into {groups} groups")
    per_group: Dim = ch // groups
    for d in spatial:
        per_group = per_group * d
    xs = _stash(ctx, x)
    grouped = ctx.b.reshape(xs, shape=[n, groups, per_group])
    y = _unit_layer_norm(ctx, grouped, 2, ctx.attr_float("epsilon", 1e-5))
    y = _as_dtype(ctx, y, x.dtype)
    scale, bias = ctx.input(1), ctx.input(2)
    if scale.shape[0] == groups and groups != ch:  # opset 18: one scale and bias per group
        y = ctx.b.add(ctx.b.mul(y, ctx.b.reshape(scale, shape=[groups, 1])), ctx.b.reshape(bias, shape=[groups, 1]))
        return ctx.b.reshape(y, shape=list(x.shape))
    y = ctx.b.reshape(y, shape=list(x.shape))
    return ctx.b.add(ctx.b.mul(y, _channel_view(ctx, scale, rank)), _channel_view(ctx, bias, rank))


@onnx_op("LRN", emits=("lrn",))
def lrn(ctx: NodeCtx) -> Value:
    return ctx.b.lrn(ctx.input(0), size=ctx.attr_int("size"), alpha=ctx.attr_float("alpha", 1e-4),
                     beta=ctx.attr_float("beta", 0.75), bias=ctx.attr_float("bias", 1.0))


@onnx_op("MeanVarianceNormalization", emits=("reduce_mean", "mul", "sub", "sqrt", "add", "div", "cast"))
def mean_variance_norm(ctx: NodeCtx) -> Value:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), as the ONNX function body defines it; half inputs in f32
    (:func:`in_f32`: E[x^2] - E[x]^2 of halves cancels to nothing)."""
    return in_f32(ctx.b, ctx.input(0), lambda x: _mean_variance_normalized(ctx, x))


def _mean_variance_normalized(ctx: NodeCtx, x: Value) -> Value:
    axes = ctx.attr_ints("axes", [0, 2, 3])
    b = ctx.b
    mean = b.reduce_mean(x, axes=axes, keepdims=True)
    mean_sq = b.reduce_mean(b.mul(x, x), axes=axes, keepdims=True)
    std = b.sqrt(b.sub(mean_sq, b.mul(mean, mean)))
    return b.div(b.sub(x, mean), b.add(std, b.scalar(1e-9, x.dtype)))


@onnx_op("LpNormalization", emits=("reduce_sum", "abs", "mul", "sqrt", "div", "equal", "where", "cast"))
def lp_normalization(ctx: NodeCtx) -> Value:
    """Half inputs in f32 (:func:`in_f32`): a half row's sum of squares overflows long before its norm
    does, and x / inf would be 0."""
    return in_f32(ctx.b, ctx.input(0), lambda x: _lp_normalized(ctx, x))


def _lp_normalized(ctx: NodeCtx, x: Value) -> Value:
    axis = ctx.attr_int("axis", -1)
    p = ctx.attr_int("p", 2)
    b = ctx.b
    if p == 1:
        norm = b.reduce_sum(b.abs(x), axes=[axis], keepdims=True)
    elif p == 2:
        norm = b.sqrt(b.reduce_sum(b.mul(x, x), axes=[axis], keepdims=True))
    else:
        raise ctx.unsupported(f"p={p} (only 1 and 2 are defined)")
    # an all-zero slice normalizes to zeros, not 0/0
    zero = b.scalar(0, x.dtype)
    return b.where(b.equal(norm, zero), zero, b.div(x, norm))


@onnx_op("RMSNormalization", emits=("cast", "mul", "reduce_mean", "add", "sqrt", "div"))
def rms_normalization(ctx: NodeCtx) -> Value:
    """x / sqrt(mean(x^2 over axes [axis, rank)) + eps) * scale."""
    x = ctx.input(0)
    rank = x.type.rank
    axis = _first_normalized_axis(ctx, rank)
    b = ctx.b
    xs = _stash(ctx, x)
    y = _as_dtype(ctx, b.div(xs, b.sqrt(mean_square(b, xs, axis, ctx.attr_float("epsilon", 1e-5)))), x.dtype)
    return b.mul(y, _as_dtype(ctx, ctx.input(1), x.dtype))


# --------------------------------------------------------------------------------------
# softmax family


def _flat_2d(ctx: NodeCtx, x: Value, axis: int) -> tuple[Value, int]:
    """Before opset 13 softmax-like ops act on x flattened to 2-D at ``axis``; from 13 on one axis."""
    rank = x.type.rank
    if not -rank <= axis < max(rank, 1):
        raise ctx.unsupported(f"axis {axis} for rank {rank}")
    axis = axis % rank if rank else 0
    if ctx.opset >= 13 or rank <= 1:
        return x, axis
    if axis == rank - 1:
        return x, axis
    return ctx.b.reshape(x, shape=[dims_product(x.shape[:axis]), dims_product(x.shape[axis:])]), 1


def dims_product(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def _softmax_like(ctx: NodeCtx, op: str) -> Value:
    x = ctx.input(0)
    flat, axis = _flat_2d(ctx, x, ctx.attr_int("axis", -1 if ctx.opset >= 13 else 1))
    y = ctx.b.op(op, flat, axis=axis)
    return y if flat is x else ctx.b.reshape(y, shape=list(x.shape))


@onnx_op("Softmax", emits=("softmax", "reshape"))
def softmax(ctx: NodeCtx) -> Value:
    return _softmax_like(ctx, "softmax")


@onnx_op("LogSoftmax", emits=("log_softmax", "reshape"))
def log_softmax(ctx: NodeCtx) -> Value:
    return _softmax_like(ctx, "log_softmax")


@onnx_op("Hardmax", emits=("argmax", "one_hot", "reshape", "const"))
def hardmax(ctx: NodeCtx) -> Value:
    """1 at the first maximum along the axis, 0 elsewhere."""
    x = ctx.input(0)
    if 0 in x.shape:  # no element, so no maximum to mark: the empty result
        return ctx.b.const(np.zeros(x.shape, dtype=x.dtype.np))
    flat, axis = _flat_2d(ctx, x, ctx.attr_int("axis", -1 if ctx.opset >= 13 else 1))
    depth = flat.shape[axis]
    if not isinstance(depth, int):
        raise ctx.unsupported(f"a symbolic axis length {depth}")
    top = ctx.b.argmax(flat, axis=axis, keepdims=False)
    values = ctx.b.const(np.array([0, 1], dtype=x.dtype.np))
    y = ctx.b.one_hot(top, values, depth=depth, axis=axis)
    return y if flat is x else ctx.b.reshape(y, shape=list(x.shape))

