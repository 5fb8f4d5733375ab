"""ONNX Runtime's quantized contrib ops (``com.microsoft``): the operator format (QOperator) that
``onnxruntime.quantization`` writes, the dynamic-quantization products its optimizer saves, and the
block-quantized weights (MatMulNBits) of its weight-only quantizers.

An op on quantized tensors means its float op between a dequantization of each input and a quantization of
the result (the QDQ reading of the same model); a product means the exact i32 product of zero-point-centred
operands, requantized as :mod:`cuvil.frontend.onnx_ops.quant` does for QLinearMatMul and QLinearConv.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import cast_to
from cuvil.frontend.onnx_ops.contrib import MS
from cuvil.frontend.onnx_ops.nn import dims_product, pool_window
from cuvil.frontend.onnx_ops.quant import (
    DYNAMIC_PRODUCT_EMITS,
    centered,
    dynamic_quantized_product,
    i32,
    per_tensor,
    requantize,
)
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

_DQ_EMITS = ("dequantize_linear", "quantize_linear", "reshape")


def _zero_point(ctx: NodeCtx, i: int, dtype: DType) -> Value:
    """The per-tensor zero point at input ``i``; one left out is 0 of ``dtype``."""
    return per_tensor(ctx, ctx.input(i)) if ctx.has_input(i) else ctx.b.const(np.zeros((), dtype=dtype.np))


def _dequantized(ctx: NodeCtx, x: int, scale: int, zero_point: int) -> Value:
    """Input ``x`` dequantized by the per-tensor scale and zero point at inputs ``scale`` and ``zero_point``."""
    q = ctx.input(x)
    return ctx.b.dequantize_linear(q, _scalar_param(ctx, scale), _zero_point(ctx, zero_point, q.dtype))


def _quantized(ctx: NodeCtx, y: Value, scale: int, zero_point: int, dtype: DType) -> Value:
    """``y`` quantized by the per-tensor scale and zero point at inputs ``scale`` and ``zero_point`` (a zero
    point left out is 0 of ``dtype``, the input's type)."""
    return ctx.b.quantize_linear(y, _scalar_param(ctx, scale), _zero_point(ctx, zero_point, dtype))


def _scalar_param(ctx: NodeCtx, i: int) -> Value:
    v = per_tensor(ctx, ctx.input(i))
    if v.type.rank:
        raise ctx.unsupported(f"a per-axis scale of {v.type} (this op's scales are per tensor)")
    return v


def _through_float(ctx: NodeCtx, op: Callable[[Value], Value]) -> Value:
    """``Q(op(DQ(X)))`` for the common operand order (X, X_scale, X_zero_point, Y_scale, Y_zero_point)."""
    return _quantized(ctx, op(_dequantized(ctx, 0, 1, 2)), 3, 4, ctx.input(0).dtype)


@onnx_op("QLinearAdd", "QLinearMul", domain=MS, emits={"QLinearAdd": (*_DQ_EMITS, "add"),
                                                        "QLinearMul": (*_DQ_EMITS, "mul")})
def qlinear_binary(ctx: NodeCtx) -> Value:
    """``Q(DQ(A) + DQ(B))`` (or times), broadcast: a quantized residual add or scale."""
    op = "add" if ctx.op_name == "QLinearAdd" else "mul"
    y = ctx.b.op(op, _dequantized(ctx, 0, 1, 2), _dequantized(ctx, 3, 4, 5))
    return _quantized(ctx, y, 6, 7, ctx.input(0).dtype)


@onnx_op("QLinearLeakyRelu", domain=MS, emits=(*_DQ_EMITS, "leaky_relu"))
def qlinear_leaky_relu(ctx: NodeCtx) -> Value:
    alpha = ctx.attr_float("alpha", 0.01)
    return _through_float(ctx, lambda x: ctx.b.leaky_relu(x, alpha=alpha))


@onnx_op("QLinearSigmoid", domain=MS, emits=(*_DQ_EMITS, "sigmoid"))
def qlinear_sigmoid(ctx: NodeCtx) -> Value:
    return _through_float(ctx, ctx.b.sigmoid)


@onnx_op("QLinearSoftmax", domain=MS, emits=(*_DQ_EMITS, "softmax"))
def qlinear_softmax(ctx: NodeCtx) -> Value:
    """Softmax along ``axis``; with ``opset`` below 13, over the input flattened to 2-D there, as Softmax was."""
    x = ctx.input(0)
    rank = x.type.rank
    axis = ctx.attr_int("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} for rank {rank}")
    axis %= rank
    b = ctx.b

    def softmax(v: Value) -> Value:
        if ctx.attr_int("opset") >= 13 or axis == rank - 1:
            return b.softmax(v, axis=axis)
        flat = b.reshape(v, shape=[dims_product(v.shape[:axis]), dims_product(v.shape[axis:])])
        return b.reshape(b.softmax(flat, axis=1), shape=list(v.shape))

    return _through_float(ctx, softmax)


def _channels_first(ctx: NodeCtx, x: Value, pool: Callable[[Value], Value]) -> Value:
    """``pool`` on channels-first data; ``channels_last`` inputs are moved there and back."""
    if not ctx.attr_int("channels_last", 0):
        return pool(x)
    rank = x.type.rank
    to_first = [0, rank - 1, *range(1, rank - 1)]
    back = [0, *range(2, rank), 1]
    return ctx.b.transpose(pool(ctx.b.transpose(x, perm=to_first)), perm=back)


@onnx_op("QLinearGlobalAveragePool", domain=MS, emits=(*_DQ_EMITS, "reduce_mean", "transpose"))
def qlinear_global_average_pool(ctx: NodeCtx) -> Value:
    def pool(x: Value) -> Value:
        return ctx.b.reduce_mean(x, axes=list(range(2, x.type.rank)), keepdims=True)

    return _through_float(ctx, lambda x: _channels_first(ctx, x, pool))


@onnx_op("QLinearAveragePool", domain=MS, emits=(*_DQ_EMITS, "avg_pool", "transpose"))
def qlinear_average_pool(ctx: NodeCtx) -> Value:
    include_pad = bool(ctx.attr_int("count_include_pad", 0))

    def pool(x: Value) -> Value:
        return ctx.b.avg_pool(x, count_include_pad=include_pad, **pool_window(ctx, x))

    return _through_float(ctx, lambda x: _channels_first(ctx, x, pool))


@onnx_op("QLinearReduceMean", domain=MS, emits=(*_DQ_EMITS, "reduce_mean"))
def qlinear_reduce_mean(ctx: NodeCtx) -> Value:
    axes, keep = ctx.attr_ints("axes"), bool(ctx.attr_int("keepdims"))
    return _through_float(ctx, lambda x: ctx.b.reduce_mean(x, axes=axes, keepdims=keep))


@onnx_op("QLinearConcat", domain=MS, emits=(*_DQ_EMITS, "concat"))
def qlinear_concat(ctx: NodeCtx) -> Value:
    """Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per operand."""
    count = len(ctx.node.input) - 2
    if count < 3 or count % 3:
        raise ShapeError(f"QLinearConcat takes its operands as (tensor, scale, zero point) triples; it has "
                         f"{count} inputs after the output's scale and zero point", location=ctx.location,
                         hint="check the node's inputs")
    parts = [_dequantized(ctx, i, i + 1, i + 2) for i in range(2, 2 + count, 3)]
    y = parts[0] if len(parts) == 1 else ctx.b.concat(*parts, axis=ctx.attr_int("axis"))
    return _quantized(ctx, y, 0, 1, ctx.input(2).dtype)


@onnx_op("QLinearWhere", domain=MS, emits=(*_DQ_EMITS, "where"))
def qlinear_where(ctx: NodeCtx) -> Value:
    y = ctx.b.where(ctx.input(0), _dequantized(ctx, 1, 2, 3), _dequantized(ctx, 4, 5, 6))
    return _quantized(ctx, y, 7, 8, ctx.input(1).dtype)


# --------------------------------------------------------------------------------------
# products


@onnx_op("QGemm", domain=MS, emits=("cast", "sub", "reshape", "transpose", "matmul", "add", "mul", "div",
                                    "quantize_linear"))
def qgemm(ctx: NodeCtx) -> Value:
    """``alpha (A - a_zp)(B - b_zp) + C`` in i32 (A and B transposed where ``transA`` / ``transB`` say; C the bias
    at scale ``a_scale * b_scale``), times ``alpha * a_scale * b_scale``: requantized by ``y_scale`` and
    ``y_zero_point``, or float where the node gives no ``y_scale``. B's scale and zero point may be per column."""
    b = ctx.b
    a, w = ctx.input(0), ctx.input(3)
    if a.type.rank != 2 or w.type.rank != 2:
        raise ShapeError(f"QGemm takes 2-D operands, got {a.type} and {w.type}", location=ctx.location,
                         hint="QGemm is a 2-D product")
    trans_b = bool(ctx.attr_int("transB", 0))
    acc_a = centered(b, a, per_tensor(ctx, ctx.input(2)))
    if ctx.attr_int("transA", 0):
        acc_a = b.transpose(acc_a, perm=[1, 0])
    w_zp = per_tensor(ctx, ctx.input(5))
    if w_zp.type.rank == 1 and trans_b:  # per output column: a column of B^T is a row of B
        w_zp = b.reshape(w_zp, shape=[w_zp.shape[0], 1])
    acc_w = centered(b, w, w_zp)
    if trans_b:
        acc_w = b.transpose(acc_w, perm=[1, 0])
    acc = b.matmul(acc_a, acc_w)
    if ctx.has_input(6):
        acc = b.add(acc, i32(b, ctx.input(6)))
    scale = b.mul(_scalar_param(ctx, 1), per_tensor(ctx, ctx.input(4)))
    alpha = ctx.attr_float("alpha", 1.0)
    if alpha != 1.0:
        scale = b.mul(scale, b.const(np.array(alpha, dtype=scale.dtype.np)))
    if not ctx.has_input(7):
        return b.mul(b.cast(acc, to=scale.dtype), scale)
    y_zp = ctx.input(8) if ctx.has_input(8) else None
    return requantize(ctx, acc, b.div(scale, _scalar_param(ctx, 7)), y_zp, a.dtype)


@onnx_op("DynamicQuantizeMatMul", domain=MS, emits=(*DYNAMIC_PRODUCT_EMITS, "add"))
def dynamic_quantize_matmul(ctx: NodeCtx) -> Value:
    """Float A times the quantized B: A quantized to u8 as one tensor, the exact i32 product, scaled back;
    plus the float bias."""
    w_zp = per_tensor(ctx, ctx.input(3)) if ctx.has_input(3) else None
    y = dynamic_quantized_product(ctx.b, ctx.input(0), ctx.input(1), per_tensor(ctx, ctx.input(2)), w_zp)
    return ctx.b.add(y, ctx.input(4)) if ctx.has_input(4) else y


@onnx_op("MatMulIntegerToFloat", domain=MS, emits=("cast", "sub", "reshape", "matmul", "mul", "add"))
def matmul_integer_to_float(ctx: NodeCtx) -> Value:
    """``float((A - a_zp) @ (B - b_zp)) * (a_scale * b_scale)`` plus the bias; B's scale and zero point may be
    per column."""
    b = ctx.b
    a, w = ctx.input(0), ctx.input(1)
    if a.type.rank < 2 or w.type.rank < 2:
        raise ctx.unsupported("an integer product of vectors")
    a_zp = per_tensor(ctx, ctx.input(4)) if ctx.has_input(4) else None
    w_zp = per_tensor(ctx, ctx.input(5)) if ctx.has_input(5) else None
    acc = b.matmul(centered(b, a, a_zp), centered(b, w, w_zp))
    scale = b.mul(per_tensor(ctx, ctx.input(2)), per_tensor(ctx, ctx.input(3)))
    y = b.mul(b.cast(acc, to=scale.dtype), scale)
    return b.add(y, ctx.input(6)) if ctx.has_input(6) else y


def _unpacked(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` unsigned ``bits``-wide values from each row of bytes, the lowest bits first."""
    rows = packed.reshape(packed.shape[0], -1).astype(np.uint16)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint16) * bits)
    values = (rows[:, :, None] >> shifts) & ((1 << bits) - 1)  # [rows, bytes, per_byte]
    return values.reshape(rows.shape[0], -1)[:, :count].astype(np.int32)


def nbits_weights(ctx: NodeCtx, dtype: DType) -> Value:
    """MatMulNBits' logical weights [K, N]: the packed integers unpacked here (an encoding), each block of
    ``block_size`` along K then dequantized by CIR ops, ``(q - zero_point) * scale`` in float32 (zero point
    ``2^(bits-1)`` where none is given), which constant folding evaluates once."""
    k, n = ctx.attr_int("K"), ctx.attr_int("N")
    bits, block = ctx.attr_int("bits", 4), ctx.attr_int("block_size")
    if bits not in (2, 4, 8) or block < 16 or block & (block - 1):
        raise ctx.unsupported(f"bits={bits}, block_size={block} (bits 2, 4 or 8; a power-of-2 block of 16 or more)")
    if k < 1 or n < 1:
        raise ShapeError(f"K={k}, N={n}", location=ctx.location, hint="MatMulNBits' K and N are positive")
    blocks = -(-k // block)
    packed = np.asarray(ctx.static(1))
    if packed.size != n * blocks * block * bits // 8:
        raise ShapeError(f"B holds {packed.size} bytes; N={n}, K={k} in blocks of {block} at {bits} bits take "
                         f"{n * blocks * block * bits // 8}", location=ctx.location,
                         hint="B is [N, blocks, block_size * bits / 8] bytes (an empty B is not supported)")
    q = _unpacked(packed.reshape(n, -1), bits, blocks * block)  # [N, blocks * block]
    scales = np.asarray(ctx.static(2), dtype=np.float32).reshape(-1)
    if scales.size != n * blocks:
        raise ShapeError(f"{scales.size} scales for N={n} rows of {blocks} blocks", location=ctx.location,
                         hint="give one scale per row and block")
    scales = scales.reshape(n, blocks)
    if ctx.has_input(3):
        zp_raw = np.asarray(ctx.static(3))
        if zp_raw.dtype == np.uint8:
            zero = _unpacked(zp_raw.reshape(n, -1), bits, blocks).astype(np.float32)
        else:
            zero = zp_raw.astype(np.float32).reshape(n, blocks)
    else:
        zero = np.full((n, blocks), float(1 << (bits - 1)), dtype=np.float32)
    b = ctx.b
    w = b.mul(b.sub(b.const(q.astype(np.float32).reshape(n, blocks, block)), b.const(zero.reshape(n, blocks, 1))),
              b.const(scales.reshape(n, blocks, 1)))
    w = b.reshape(w, shape=[n, blocks * block])
    if blocks * block != k:
        w = b.slice(w, starts=[0, 0], ends=[n, k], steps=[1, 1])
    return cast_to(b, b.transpose(w, perm=[1, 0]), dtype)


@onnx_op("MatMulNBits", domain=MS, emits=("sub", "mul", "reshape", "slice", "transpose", "cast", "matmul", "add"))
def matmul_nbits(ctx: NodeCtx) -> Value:
    """``A @ W (+ bias)``, W the block-quantized weights dequantized when the model is read (the op's
    definition; ONNX Runtime's ``accuracy_level`` 4 would quantize A as well, which is not this meaning).
    The weights, scales and zero points must be constants."""
    if ctx.attr_int("weight_prepacked", 0):
        raise ctx.unsupported("weight_prepacked=1 (weights in an execution provider's own layout)")
    if ctx.has_input(4):
        raise ctx.unsupported("g_idx (weights quantized in activation order)")
    b = ctx.b
    a = ctx.input(0)
    y = b.matmul(a, nbits_weights(ctx, a.dtype))
    return b.add(y, ctx.input(5)) if ctx.has_input(5) else y
