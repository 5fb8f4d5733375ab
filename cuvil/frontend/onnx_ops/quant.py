"""ONNX quantization ops -> CIR.

QuantizeLinear/DequantizeLinear map to the quant ops. The integer ops (MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv) are exact integer arithmetic: operands cast to
i32 minus their zero points, an i32 matmul/conv, then (QLinear*) a requantization: the
i32 accumulator times (scale_a * scale_b / scale_y) in f64, rounded half to even, plus
the output zero point, saturated to the output type.
"""

from __future__ import annotations

import numpy as np

from cuvil.frontend.onnx_node import NodeCtx, onnx_dtype, onnx_op
from cuvil.frontend.onnx_ops.nn import conv_kernel, window_attrs
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

# --------------------------------------------------------------------------------------
# helpers


def per_tensor(ctx: NodeCtx, v: Value) -> Value:
    """One-element parameters ([1], [1, 1]) are per-tensor: make them rank 0."""
    if v.type.rank and all(d == 1 for d in v.shape):
        return ctx.b.reshape(v, shape=[])
    return v


def _zero(ctx: NodeCtx, like: Value, dtype: DType) -> Value:
    return ctx.b.const(np.zeros([int(d) for d in like.shape], dtype=dtype.np))


def i32(b: Builder, v: Value) -> Value:
    return v if v.dtype is DType.i32 else b.cast(v, to=DType.i32)


def centered(b: Builder, x: Value, zp: Value | None) -> Value:
    """x - zero_point in i32 (a zero point broadcasts against x: per tensor, or per last-axis position)."""
    xi = i32(b, x)
    return xi if zp is None else b.sub(xi, i32(b, zp))


def _optional(ctx: NodeCtx, i: int) -> Value | None:
    return ctx.input(i) if ctx.has_input(i) else None


def _row_param(ctx: NodeCtx, v: Value | None, a: Value) -> Value | None:
    """A per-row parameter [M] of the left matmul operand as [M, 1]."""
    if v is None:
        return None
    v = per_tensor(ctx, v)
    if v.type.rank == 1 and a.type.rank >= 2:
        return ctx.b.reshape(v, shape=[v.shape[0], 1])
    return v


def _channel_param(ctx: NodeCtx, v: Value | None, rank: int) -> Value | None:
    """A per-output-channel parameter [C] as [C, 1, ...] (weights) or [1, C, 1, ...] (outputs)."""
    if v is None:
        return None
    v = per_tensor(ctx, v)
    if v.type.rank == 1:
        return ctx.b.reshape(v, shape=[v.shape[0]] + [1] * (rank - 1))
    return v


def requantize(ctx: NodeCtx, acc: Value, multiplier: Value, y_zp: Value | None, fallback: DType) -> Value:
    """round_half_even(acc * multiplier) + y_zp, saturated; the product is taken in f64."""
    wide = ctx.b.mul(ctx.b.cast(acc, to=DType.f64), ctx.b.cast(multiplier, to=DType.f64))
    zp = per_tensor(ctx, y_zp) if y_zp is not None else ctx.b.const(np.zeros((), fallback.np))
    if zp.type.rank:
        raise ctx.unsupported("a per-channel output zero point")
    return ctx.b.quantize_linear(wide, ctx.b.const(np.array(1.0)), zp)


def _matmul(ctx: NodeCtx, a: Value, b: Value) -> Value:
    if a.type.rank < 2 or b.type.rank < 2:
        raise ctx.unsupported("integer matmul of vectors")
    return ctx.b.matmul(a, b)


# --------------------------------------------------------------------------------------
# QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear


@onnx_op("QuantizeLinear", emits=("quantize_linear", "reshape", "cast"))
def quantize_linear(ctx: NodeCtx) -> Value:
    x, scale = ctx.input(0), per_tensor(ctx, ctx.input(1))
    if ctx.has_input(2):
        zp = per_tensor(ctx, ctx.input(2))
    else:
        dtype = onnx_dtype(ctx.attr_int("output_dtype"), ctx.location) if ctx.has_attr("output_dtype") \
            else DType.u8
        zp = _zero(ctx, scale, dtype)
    if ctx.has_attr("precision") and ctx.attr_int("precision"):
        p = onnx_dtype(ctx.attr_int("precision"), ctx.location)
        x = x if x.dtype is p else ctx.b.cast(x, to=p)
        scale = scale if scale.dtype is p else ctx.b.cast(scale, to=p)
    return ctx.b.quantize_linear(x, scale, zp, axis=ctx.attr_int("axis", 1), block_size=ctx.attr_int("block_size", 0))


@onnx_op("DequantizeLinear", emits=("dequantize_linear", "reshape", "cast"))
def dequantize_linear(ctx: NodeCtx) -> Value:
    x, scale = ctx.input(0), per_tensor(ctx, ctx.input(1))
    zp = per_tensor(ctx, ctx.input(2)) if ctx.has_input(2) else _zero(ctx, scale, x.dtype)
    y = ctx.b.dequantize_linear(x, scale, zp, axis=ctx.attr_int("axis", 1), block_size=ctx.attr_int("block_size", 0))
    if ctx.has_attr("output_dtype") and ctx.attr_int("output_dtype"):
        out = onnx_dtype(ctx.attr_int("output_dtype"), ctx.location)
        y = y if y.dtype is out else ctx.b.cast(y, to=out)
    return y


@onnx_op("DynamicQuantizeLinear", emits=("reduce_max", "reduce_min", "max", "min", "sub", "div", "equal",
                                          "where", "clip", "round", "cast", "quantize_linear"))
def dynamic_quantize_linear(ctx: NodeCtx) -> list[Value]:
    return list(dynamic_quantize(ctx.b, ctx.input(0)))


def dynamic_quantize(b: Builder, x: Value) -> tuple[Value, Value, Value]:
    """u8 quantization of all of x with scale and zero point from its range (widened to include 0):
    (quantized x, scale, zero point)."""
    f = x.dtype

    def scalar(v: float) -> Value:
        return b.const(np.array(v, dtype=f.np))

    hi = b.max(b.reduce_max(x, axes=[], keepdims=False), scalar(0.0))
    lo = b.min(b.reduce_min(x, axes=[], keepdims=False), scalar(0.0))
    span = b.where(b.equal(hi, lo), scalar(1.0), b.sub(hi, lo))
    scale = b.div(span, scalar(255.0))
    zp_f = b.clip(b.sub(scalar(0.0), b.div(lo, scale)), min=0.0, max=255.0)
    zp = b.cast(b.round(zp_f), to=DType.u8)
    return b.quantize_linear(x, scale, zp), scale, zp


DYNAMIC_PRODUCT_EMITS = ("reduce_max", "reduce_min", "max", "min", "sub", "div", "equal", "where", "clip", "round",
                         "cast", "quantize_linear", "matmul", "mul")


def dynamic_quantized_product(b: Builder, x: Value, w: Value, w_scale: Value, w_zp: Value | None) -> Value:
    """x [..., K] (float) times the quantized w [K, N]: x quantized to u8 as one tensor
    (:func:`dynamic_quantize`), the exact i32 product of the zero-point-centred operands, then
    float(product) * (x_scale * w_scale). The weight's scale and zero point are one per tensor
    (rank 0) or one per column ([N]). This is ONNX Runtime's quantized GEMM for dynamically
    quantized weights (DynamicQuantizeMatMul, DynamicQuantizeLSTM)."""
    xq, x_scale, x_zp = dynamic_quantize(b, x)
    acc = b.matmul(centered(b, xq, x_zp), centered(b, w, w_zp))
    multiplier = b.mul(x_scale, w_scale if w_scale.dtype is x.dtype else b.cast(w_scale, to=x.dtype))
    return b.mul(b.cast(acc, to=x.dtype), multiplier)


# --------------------------------------------------------------------------------------
# integer matmul / conv


@onnx_op("MatMulInteger", emits=("cast", "sub", "reshape", "matmul"))
def matmul_integer(ctx: NodeCtx) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    a_zp = _row_param(ctx, _optional(ctx, 2), a)
    b_zp = per_tensor(ctx, ctx.input(3)) if ctx.has_input(3) else None
    return _matmul(ctx, centered(ctx.b, a, a_zp), centered(ctx.b, b, b_zp))


@onnx_op("QLinearMatMul", emits=("cast", "sub", "reshape", "matmul", "mul", "div", "quantize_linear"))
def qlinear_matmul(ctx: NodeCtx) -> Value:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (ctx.input(i) if ctx.has_input(i) else None
                                                          for i in range(8))
    assert a is not None and b is not None and a_scale is not None and b_scale is not None and y_scale is not None
    acc = _matmul(ctx, centered(ctx.b, a, _row_param(ctx, a_zp, a)),
                  centered(ctx.b, b, per_tensor(ctx, b_zp) if b_zp is not None else None))
    a_s = _row_param(ctx, a_scale, a)
    assert a_s is not None
    multiplier = ctx.b.div(ctx.b.mul(a_s, per_tensor(ctx, b_scale)), per_tensor(ctx, y_scale))
    return requantize(ctx, acc, multiplier, y_zp, a.dtype)


def _conv_i32(ctx: NodeCtx, x: Value, x_zp: Value | None, w: Value, w_zp: Value | None) -> Value:
    nsp, kernel = conv_kernel(ctx, x, w)
    strides, dilations, pads = window_attrs(ctx, nsp, kernel)
    xc = centered(ctx.b, x, per_tensor(ctx, x_zp) if x_zp is not None else None)
    wc = centered(ctx.b, w, _channel_param(ctx, w_zp, w.type.rank))
    return ctx.b.conv(xc, wc, strides=strides, pads=pads, dilations=dilations, groups=ctx.attr_int("group", 1))


@onnx_op("ConvInteger", emits=("cast", "sub", "reshape", "conv"))
def conv_integer(ctx: NodeCtx) -> Value:
    return _conv_i32(ctx, ctx.input(0), _optional(ctx, 2), ctx.input(1), _optional(ctx, 3))


@onnx_op("QLinearConv", emits=("cast", "sub", "reshape", "conv", "add", "mul", "div", "quantize_linear"))
def qlinear_conv(ctx: NodeCtx) -> Value:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias = (ctx.input(i) if ctx.has_input(i) else None
                                                               for i in range(9))
    assert x is not None and w is not None and x_scale is not None and w_scale is not None and y_scale is not None
    acc = _conv_i32(ctx, x, x_zp, w, w_zp)
    rank = acc.type.rank
    if bias is not None:
        acc = ctx.b.add(acc, ctx.b.reshape(i32(ctx.b, bias), shape=[1, bias.shape[0]] + [1] * (rank - 2)))
    ws = per_tensor(ctx, w_scale)
    if ws.type.rank == 1:
        ws = ctx.b.reshape(ws, shape=[1, ws.shape[0]] + [1] * (rank - 2))
    multiplier = ctx.b.div(ctx.b.mul(per_tensor(ctx, x_scale), ws), per_tensor(ctx, y_scale))
    return requantize(ctx, acc, multiplier, y_zp, x.dtype)
