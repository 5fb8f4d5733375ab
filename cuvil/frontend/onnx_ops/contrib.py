"""ONNX Runtime's contrib ops: the ``com.microsoft`` fusions its graph optimizer (``onnxruntime.transformers``, or a
session's saved optimized model) writes into the files it saves, and ``SimplifiedLayerNormalization``, which it
registers in the ONNX domain. Each is spelled out in Cuvil's own ops, to the meaning ONNX Runtime's CPU kernels
give it (masked attention scores are offset by ``mask_filter_value``, not removed; a causal mask removes them).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_node import HALF, NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.attention import heads_first, rotated
from cuvil.frontend.onnx_ops.blocks import cast_to, positions, reshape_to, scalar
from cuvil.frontend.onnx_ops.elementwise import swish_of
from cuvil.frontend.onnx_ops.linalg import gemm
from cuvil.frontend.onnx_ops.nn import conv, mean_square, moments, wants_output
from cuvil.frontend.onnx_ops.quant import centered, i32, per_tensor
from cuvil.frontend.onnx_ops.recurrent import activation_fn
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value

MS = "com.microsoft"
"""ONNX Runtime's contrib domain."""

NORM_EPSILON = 1e-12
"""The epsilon of the contrib layer normalizations when the node gives none (their schemas' default; the ONNX
domain's normalizations default to 1e-5)."""

MASK_FILTER_VALUE = -10000.0
"""What ``Attention`` adds to a score its mask hides, unless the node says otherwise."""


def _wide(b: Builder, v: Value) -> Value:
    """A half-precision operand widened to f32: the contrib normalizations sum and normalize in f32."""
    return b.cast(v, to=DType.f32) if v.dtype in HALF else v


# --------------------------------------------------------------------------------------
# GELU family


def _biased(ctx: NodeCtx) -> Value:
    """Input 0, plus input 1 (a bias, broadcast) where the node has one."""
    x = ctx.input(0)
    return ctx.b.add(x, ctx.input(1)) if ctx.has_input(1) else x


@onnx_op("Gelu", "BiasGelu", domain=MS, emits=("gelu", "add"))
def ms_gelu(ctx: NodeCtx) -> Value:
    """``gelu(x (+ bias))`` with erf: ONNX Runtime's fusion of the erf form (BiasGelu: with its bias)."""
    return ctx.b.gelu(_biased(ctx), approximate="none")


@onnx_op("FastGelu", domain=MS, emits=("gelu", "add"))
def ms_fast_gelu(ctx: NodeCtx) -> Value:
    """``gelu(x (+ bias))`` in its tanh form, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: what
    ONNX Runtime fuses the tanh approximation into."""
    return ctx.b.gelu(_biased(ctx), approximate="tanh")


@onnx_op("QuickGelu", domain=MS, emits=("silu", "sigmoid", "mul"))
def ms_quick_gelu(ctx: NodeCtx) -> Value:
    """``x sigmoid(alpha x)``, alpha 1.702 unless given (CLIP's activation)."""
    return swish_of(ctx, ctx.input(0), ctx.attr_float("alpha", 1.702))


# --------------------------------------------------------------------------------------
# sums and products


@onnx_op("BiasAdd", domain=MS, emits=("add",))
def bias_add(ctx: NodeCtx) -> Value:
    """``(X + bias) + skip``."""
    return ctx.b.add(ctx.b.add(ctx.input(0), ctx.input(1)), ctx.input(2))


@onnx_op("FusedMatMul", domain=MS, emits=("matmul", "transpose", "mul"))
def fused_matmul(ctx: NodeCtx) -> Value:
    """``alpha * (A' @ B')``, a prime transposing the last two axes where ``transA`` / ``transB`` say so."""
    if ctx.attr_int("transBatchA", 0) or ctx.attr_int("transBatchB", 0):
        raise ctx.unsupported("transBatchA / transBatchB (a batch axis moved into the product)")
    b = ctx.b
    a, w = ctx.input(0), ctx.input(1)
    if ctx.attr_int("transA", 0):
        a = _swap_last(ctx, a, "A")
    transpose_b = bool(ctx.attr_int("transB", 0))
    if transpose_b and w.type.rank < 2:
        raise ctx.unsupported("transB of a 1-D operand")
    y = b.matmul(a, w, transpose_b=transpose_b)
    alpha = ctx.attr_float("alpha", 1.0)
    return y if alpha == 1.0 else b.mul(y, scalar(b, alpha, y.dtype))


def _swap_last(ctx: NodeCtx, x: Value, name: str) -> Value:
    rank = x.type.rank
    if rank < 2:
        raise ctx.unsupported(f"trans{name} of a 1-D operand")
    return ctx.b.transpose(x, perm=[*range(rank - 2), rank - 1, rank - 2])


ACTIVATION_OPS = ("relu", "tanh", "sigmoid", "leaky_relu", "hardsigmoid", "clip", "elu", "selu",
                  "thresholded_relu", "softsign", "softplus", "mul", "add")
"""The CIR ops of the activations ONNX Runtime fuses into a convolution or a Gemm."""


@onnx_op("FusedConv", domain=MS, emits=("conv", "reshape", "add", *ACTIVATION_OPS))
def fused_conv(ctx: NodeCtx) -> Value:
    """``activation(Conv(X, W, B) (+ Z))``: ONNX Runtime's fusion of a convolution, a sum and an activation
    (``activation_params``: Clip's min and max, LeakyRelu's alpha, HardSigmoid's alpha and beta)."""
    y = conv(ctx)
    assert isinstance(y, Value)
    if ctx.has_input(3):
        y = ctx.b.add(y, ctx.input(3))
    params = ctx.attr_floats("activation_params", [])
    return _activation(ctx, y, ctx.attr_str("activation", "Identity"), *params)


@onnx_op("FusedGemm", domain=MS, emits=("matmul", "mul", "add", *ACTIVATION_OPS))
def fused_gemm(ctx: NodeCtx) -> Value:
    """``activation(Gemm(A, B, C))``, the activation's parameters in ``activation_alpha``, ``_beta``, ``_gamma``."""
    params = [ctx.attr_float(f"activation_{p}", None) for p in ("alpha", "beta", "gamma")]
    while params and params[-1] is None:
        params.pop()
    if None in params:
        raise ctx.unsupported("an activation parameter given after one left out")
    y = gemm(ctx)
    assert isinstance(y, Value)
    return _activation(ctx, y, ctx.attr_str("activation", "Identity"), *cast(list[float], params))


def _activation(ctx: NodeCtx, y: Value, name: str, *params: float) -> Value:
    """``y`` through the named activation, its parameters in its ONNX attributes' order (defaults after): the
    recurrences' activations, and Identity, Clip and Selu."""
    b = ctx.b
    if name == "Identity":
        return y
    if name == "Clip":
        return b.clip(y, min=params[0] if params else None, max=params[1] if len(params) > 1 else None)
    if name == "Selu":
        defaults = (1.67326319217681884765625, 1.05070102214813232421875)
        alpha, gamma = (*params, *defaults[len(params):])[:2]
        return b.selu(y, alpha=alpha, gamma=gamma)
    alpha_beta: list[float | None] = [*params[:2], None, None]
    return activation_fn(ctx, name, alpha_beta[0], alpha_beta[1])(y)


# --------------------------------------------------------------------------------------
# normalizations


def _skip_sum(ctx: NodeCtx, bias_input: int) -> Value:
    """``(input + skip) + bias`` in f32 for half inputs; ``skip`` may lack the batch axis."""
    b = ctx.b
    total = b.add(_wide(b, ctx.input(0)), _wide(b, ctx.input(1)))
    return b.add(total, _wide(b, ctx.input(bias_input))) if ctx.has_input(bias_input) else total


@onnx_op("SkipLayerNormalization", domain=MS, emits=("add", "layer_norm", "cast", "reduce_mean", "sub", "mul",
                                                     "rsqrt"))
def skip_layer_norm(ctx: NodeCtx) -> list[Value | None]:
    """LayerNorm over the last axis of ``input + skip (+ bias)``, times gamma (plus beta); also the mean, the
    inverse deviation and the sum where the node names them."""
    b = ctx.b
    x = ctx.input(0)
    total = _skip_sum(ctx, 4)
    eps = ctx.attr_float("epsilon", NORM_EPSILON)
    axis = total.type.rank - 1
    gamma = _wide(b, ctx.input(2))
    beta = _wide(b, ctx.input(3)) if ctx.has_input(3) else b.const(np.zeros((1,), dtype=total.dtype.np))
    outs: list[Value | None] = [cast_to(b, b.layer_norm(total, gamma, beta, axis=axis, epsilon=eps), x.dtype),
                                None, None, cast_to(b, total, x.dtype)]
    if any(wants_output(ctx, k) for k in (1, 2)):
        outs[1:3] = moments(b, total, axis, eps)
    return outs[:max(1, ctx.num_outputs)]


def _rms_outputs(ctx: NodeCtx, total: Value, axis: int, eps: float, scale: Value, dtype: DType) -> list[Value]:
    """``total / sqrt(mean(total^2) + eps) * scale`` and the inverse root mean square."""
    b = ctx.b
    ms = mean_square(b, total, axis, eps)
    y = b.mul(cast_to(b, b.div(total, b.sqrt(ms)), dtype), cast_to(b, scale, dtype))
    return [y, b.rsqrt(ms)]


@onnx_op("SkipSimplifiedLayerNormalization", domain=MS, emits=("add", "cast", "mul", "reduce_mean", "sqrt", "div",
                                                               "rsqrt"))
def skip_simplified_layer_norm(ctx: NodeCtx) -> list[Value | None]:
    """RMSNorm over the last axis of ``input + skip (+ bias)``, times gamma; the node's optional outputs are the
    inverse root mean square (slot 2) and the sum (slot 3)."""
    if wants_output(ctx, 1):
        raise ctx.unsupported("the mean output (an RMS normalization computes none)")
    b = ctx.b
    x = ctx.input(0)
    total = _skip_sum(ctx, 3)
    y, inv_rms = _rms_outputs(ctx, total, total.type.rank - 1, ctx.attr_float("epsilon", NORM_EPSILON),
                              ctx.input(2), x.dtype)
    return [y, None, inv_rms, cast_to(b, total, x.dtype)][:max(1, ctx.num_outputs)]


@onnx_op("SimplifiedLayerNormalization", emits=("cast", "mul", "reduce_mean", "add", "sqrt", "div", "rsqrt"))
def simplified_layer_norm(ctx: NodeCtx) -> list[Value]:
    """RMSNorm over axes [axis, rank), times scale (ONNX Runtime's name for it, in the ONNX domain), and the
    inverse root mean square where the node names it."""
    b = ctx.b
    x = ctx.input(0)
    rank = x.type.rank
    axis = ctx.attr_int("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} for rank {rank}")
    xs = _wide(b, x) if ctx.attr_int("stash_type", 1) == 1 else x
    outs = _rms_outputs(ctx, xs, axis % rank, ctx.attr_float("epsilon", 1e-5), ctx.input(1), x.dtype)
    return outs[:max(1, ctx.num_outputs)]


@onnx_op("EmbedLayerNormalization", domain=MS, emits=("gather", "iota", "add", "layer_norm", "equal", "cast",
                                                      "reduce_sum", "fill"))
def embed_layer_norm(ctx: NodeCtx) -> list[Value]:
    """BERT's embeddings: LayerNorm(word[ids] + position[pos] (+ segment[seg])) times gamma plus beta, with
    positions 0..S-1 unless ``position_ids`` is given; ``mask_index`` counts each row's mask entries equal to 1
    (zeros without a mask), and ``embedding_sum`` is the sum before the normalization."""
    def table(i: int) -> Value | None:
        return ctx.input(i) if ctx.has_input(i) else None

    word, pos_table, gamma, beta = (ctx.input(i) for i in (2, 3, 5, 6))
    return _embedded(ctx, word, pos_table, table(4), gamma, beta, table(8))


@onnx_op("QEmbedLayerNormalization", domain=MS, emits=("gather", "iota", "add", "layer_norm", "equal", "cast",
                                                       "reduce_sum", "fill", "dequantize_linear", "reshape"))
def q_embed_layer_norm(ctx: NodeCtx) -> list[Value]:
    """EmbedLayerNormalization of quantized tables (word, position, segment, gamma, beta), each dequantized by
    its per-tensor scale and zero point (inputs 8-12 and 13-17)."""
    def table(i: int) -> Value | None:  # table i's scale is input i + 6, its zero point input i + 11
        if not ctx.has_input(i):
            return None
        return ctx.b.dequantize_linear(ctx.input(i), per_tensor(ctx, ctx.input(i + 6)),
                                       per_tensor(ctx, ctx.input(i + 11)))

    word, pos_table, seg_table = table(2), table(3), table(4)
    gamma, beta = table(5), table(6)
    assert word is not None and pos_table is not None and gamma is not None and beta is not None
    return _embedded(ctx, word, pos_table, seg_table, gamma, beta, None)[:2]


def _embedded(ctx: NodeCtx, word: Value, pos_table: Value, seg_table: Value | None, gamma: Value, beta: Value,
              pos_ids: Value | None) -> list[Value]:
    """The embeddings' normalized sum, mask index and sum (ids, segment ids and mask at inputs 0, 1 and 7)."""
    b = ctx.b
    ids = ctx.input(0)
    if ids.type.rank != 2:
        raise ShapeError(f"input_ids must be [batch, sequence], got {ids.type}", location=ctx.location,
                         hint="EmbedLayerNormalization reads 2-D token ids")
    batch, seq = ids.shape
    total = b.add(b.gather(word, ids, axis=0), b.gather(pos_table, pos_ids if pos_ids is not None
                                                         else positions(b, [seq]), axis=0))
    if ctx.has_input(1) and seg_table is not None:
        total = b.add(total, b.gather(seg_table, ctx.input(1), axis=0))
    elif ctx.has_input(1) != (seg_table is not None):
        raise ShapeError("segment_ids and segment_embedding come together", location=ctx.location,
                         hint="give both inputs, or neither")
    eps = ctx.attr_float("epsilon", NORM_EPSILON)
    y = b.layer_norm(total, gamma, beta, axis=2, epsilon=eps)
    if ctx.has_input(7):
        mask = ctx.input(7)
        ones = b.cast(b.equal(mask, scalar(b, 1, mask.dtype)), to=DType.i32)
        mask_index = b.reduce_sum(ones, axes=[1], keepdims=False)
    else:
        mask_index = b.fill(shape=[batch], value=0, dtype=DType.i32)
    return [y, mask_index, total][:max(1, ctx.num_outputs)]


# --------------------------------------------------------------------------------------
# attention


@onnx_op("Attention", domain=MS, emits=("matmul", "add", "split", "reshape", "transpose", "mul", "softmax", "where",
                                        "greater", "less", "less_equal", "greater_equal", "logical_and", "iota",
                                        "cast"))
def ms_attention(ctx: NodeCtx) -> Value:
    """BERT-style self-attention from one packed projection: Q, K, V = input @ weights + bias (split by
    ``qkv_hidden_sizes``), ``softmax(Q K^T * scale + mask + attention_bias) V`` per head. A key the mask hides
    has ``mask_filter_value`` added to its score; a causal (``unidirectional``) mask removes later keys."""
    for i, what in ((4, "past"), (6, "past_sequence_length")):
        if ctx.has_input(i):
            raise ctx.unsupported(f"the {what} input (a key/value cache)")
    if ctx.attr_int("do_rotary", 0):
        raise ctx.unsupported("do_rotary")
    b = ctx.b
    x, weights, heads = _packed_operands(ctx)
    width = weights.shape[1]
    sizes = ctx.attr_ints("qkv_hidden_sizes", [])
    if not sizes:
        if not isinstance(width, int) or width % 3:
            raise ShapeError(f"weights width {width} does not split into Q, K and V", location=ctx.location,
                             hint="give qkv_hidden_sizes")
        sizes = [width // 3] * 3
    if len(sizes) != 3 or sum(sizes) != width or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        raise ShapeError(f"qkv_hidden_sizes {sizes} for weights width {width} and {heads} heads",
                         location=ctx.location, hint="Q and K share one size; every size splits into the heads")
    proj = b.matmul(x, weights)
    if ctx.has_input(2):
        proj = b.add(proj, ctx.input(2))
    return _attend_packed(ctx, proj, sizes, heads, ctx.input(3) if ctx.has_input(3) else None,
                          ctx.input(5) if ctx.has_input(5) else None)


def _packed_operands(ctx: NodeCtx) -> tuple[Value, Value, int]:
    """A packed-projection attention's input [B, S, hidden], weights [hidden, width] and head count, checked."""
    x, weights = ctx.input(0), ctx.input(1)
    if x.type.rank != 3 or weights.type.rank != 2:
        raise ShapeError(f"{ctx.op_name} takes input [batch, sequence, hidden] and weights [hidden, width], got "
                         f"{x.type} and {weights.type}", location=ctx.location, hint="check the node's inputs")
    heads = ctx.attr_int("num_heads")
    if heads < 1:
        raise ShapeError(f"num_heads {heads}", location=ctx.location, hint="an attention has one head or more")
    return x, weights, heads


def _attend_packed(ctx: NodeCtx, proj: Value, sizes: list[int], heads: int, mask: Value | None,
                   bias: Value | None) -> Value:
    """Attention of the projection [B, S, width] split into Q, K and V of ``sizes``."""
    b = ctx.b
    q, k, v = (heads_first(b, b.split(proj, axis=2, sizes=sizes, index=i), heads) for i in range(3))
    return _attend(ctx, q, k, v, mask, bias)


@onnx_op("QAttention", domain=MS, emits=("cast", "sub", "reshape", "matmul", "mul", "add", "split", "transpose",
                                         "softmax", "where", "greater", "less", "less_equal", "greater_equal",
                                         "logical_and", "iota"))
def q_attention(ctx: NodeCtx) -> Value:
    """Attention whose projection is an integer product: ``float((input - input_zero_point) @ (weight -
    weight_zero_point)) * (input_scale * weight_scale) + bias`` (the weight's scale and zero point may be per
    column), split into Q, K and V in equal thirds, then as Attention."""
    if ctx.has_input(8):
        raise ctx.unsupported("the past input (a key/value cache)")
    b = ctx.b
    x, w, heads = _packed_operands(ctx)
    width = w.shape[1]
    if not isinstance(width, int) or width % 3 or (width // 3) % heads:
        raise ShapeError(f"weights width {width} for {heads} heads", location=ctx.location,
                         hint="the width is three equal parts, each splitting into the heads")
    x_zp = per_tensor(ctx, ctx.input(6)) if ctx.has_input(6) else None
    w_zp = per_tensor(ctx, ctx.input(7)) if ctx.has_input(7) else None
    acc = b.matmul(centered(b, x, x_zp), centered(b, w, w_zp))
    scale = b.mul(per_tensor(ctx, ctx.input(3)), per_tensor(ctx, ctx.input(4)))
    proj = b.add(b.mul(b.cast(acc, to=scale.dtype), scale), ctx.input(2))
    return _attend_packed(ctx, proj, [width // 3] * 3, heads, ctx.input(5) if ctx.has_input(5) else None, None)


def _attend(ctx: NodeCtx, q: Value, k: Value, v: Value, mask: Value | None, bias: Value | None) -> Value:
    """``softmax(Q K^T * scale + mask + bias) V`` of heads-first Q [B, N, S, H], K [B, N, L, H], V [B, N, L, Hv]
    (``scale`` 1/sqrt(H) unless the node gives one; a causal mask removes the keys after each query), with
    the heads joined again: [B, S, N * Hv]."""
    b = ctx.b
    batch, heads, queries, head = q.shape
    if not isinstance(head, int):
        raise ctx.unsupported("a symbolic head size")
    scale = ctx.attr_float("scale", 0.0) or 1.0 / math.sqrt(head)
    scores = b.mul(b.matmul(q, k, transpose_b=True), scalar(b, scale, q.dtype))  # [B, N, S, L]
    if mask is not None:
        scores = b.add(scores, _attention_mask(ctx, mask, batch, queries, k.shape[2], q.dtype))
    if bias is not None:
        scores = b.add(scores, bias)
    if ctx.attr_int("unidirectional", 0):
        keys = k.shape[2]
        later = b.less_equal(positions(b, [1, keys]), positions(b, [queries, 1]))
        scores = b.where(later, scores, scalar(b, -np.inf, q.dtype))
    y = b.matmul(b.softmax(scores, axis=-1), v)
    return b.reshape(b.transpose(y, perm=[0, 2, 1, 3]), shape=[batch, queries, heads * y.shape[3]])


@onnx_op("MultiHeadAttention", domain=MS, emits=("matmul", "add", "split", "reshape", "transpose", "mul", "softmax",
                                                 "where", "greater", "less", "less_equal", "greater_equal",
                                                 "logical_and", "iota", "cast"))
def multi_head_attention(ctx: NodeCtx) -> Value:
    """Attention of projected Q, K, V: query [B, S, D] with key and value [B, L, D] / [B, L, Dv] (plus the packed
    ``bias`` [D + D + Dv]), or key and value already heads-first [B, N, L, H] (cross attention), or query
    packing Q, K and V as [B, S, N, 3, H]; ``key_padding_mask`` in Attention's mask forms, ``attention_bias``,
    ``unidirectional`` as Attention reads them."""
    for i, what in ((6, "past_key"), (7, "past_value"), (8, "past_sequence_length"), (9, "cache_indirection")):
        if ctx.has_input(i):
            raise ctx.unsupported(f"the {what} input (a key/value cache)")
    if ctx.num_outputs > 1 and any(ctx.node.output[1:]):
        raise ctx.unsupported("the present and qk outputs")
    b = ctx.b
    heads = ctx.attr_int("num_heads")
    if heads < 1:
        raise ShapeError(f"num_heads {heads}", location=ctx.location, hint="an attention has one head or more")
    query = ctx.input(0)
    key = ctx.input(1) if ctx.has_input(1) else None
    value = ctx.input(2) if ctx.has_input(2) else None
    if query.type.rank == 5:
        if key is not None or value is not None or ctx.has_input(3):
            raise ShapeError("a packed [B, S, N, 3, H] query comes without key, value and bias",
                             location=ctx.location, hint="give the packed query alone")
        q, k, v = (b.transpose(b.reshape(b.split(query, axis=3, sizes=[1, 1, 1], index=i),
                                         shape=[*query.shape[:3], query.shape[4]]), perm=[0, 2, 1, 3])
                   for i in range(3))
    else:
        if query.type.rank != 3 or key is None or value is None:
            raise ShapeError(f"MultiHeadAttention takes query [B, S, D] with key and value, got {query.type}",
                             location=ctx.location, hint="give key and value, or a packed [B, S, N, 3, H] query")
        if ctx.has_input(3):
            if key.type.rank != 3:
                raise ctx.unsupported("a bias with heads-first key and value")
            width = query.shape[2]
            sizes = [width, width, value.shape[2]]
            bias = ctx.input(3)
            query, key, value = (b.add(t, b.split(bias, axis=0, sizes=sizes, index=i))
                                 for i, t in enumerate((query, key, value)))
        q = heads_first(b, query, heads)
        k = heads_first(b, key, heads) if key.type.rank == 3 else key
        v = heads_first(b, value, heads) if value.type.rank == 3 else value
    mask = ctx.input(4) if ctx.has_input(4) else None
    return _attend(ctx, q, k, v, mask, ctx.input(5) if ctx.has_input(5) else None)


def _attention_mask(ctx: NodeCtx, mask: Value, batch: Dim, queries: Dim, keys: Dim, dtype: DType) -> Value:
    """The mask as the scores' addend: 0 for a key attended, ``mask_filter_value`` for one hidden. Its forms:
    [batch] (keys from each row's end position on hidden), [2 * batch] (and keys before its start position),
    [batch, keys] and [batch, queries, keys] (entries of 0 or less hidden)."""
    b = ctx.b
    hidden = scalar(b, ctx.attr_float("mask_filter_value", MASK_FILTER_VALUE), dtype)
    zero = scalar(b, 0.0, dtype)
    rank = mask.type.rank
    if rank == 1:
        key = positions(b, [1, keys], DType.i32)
        if mask.shape[0] == batch:
            keep = b.less(key, reshape_to(b, i32(b, mask), [batch, 1]))
        elif isinstance(batch, int) and mask.shape[0] == 2 * batch:
            bounds = i32(b, mask)
            end = reshape_to(b, b.split(bounds, axis=0, sizes=[batch, batch], index=0), [batch, 1])
            start = reshape_to(b, b.split(bounds, axis=0, sizes=[batch, batch], index=1), [batch, 1])
            keep = b.logical_and(b.less(key, end), b.greater_equal(key, start))
        else:
            raise ShapeError(f"a 1-D mask_index of {mask.shape[0]} entries for batch {batch}", location=ctx.location,
                             hint="a 1-D mask_index holds batch end positions, or 2 * batch end and start ones")
        return reshape_to(b, b.where(keep, zero, hidden), [batch, 1, 1, keys])
    if rank in (2, 3):
        keep = b.greater(mask, scalar(b, 0, mask.dtype))
        shape = [batch, 1, 1, keys] if rank == 2 else [batch, 1, queries, keys]
        return reshape_to(b, b.where(keep, zero, hidden), shape)
    raise ctx.unsupported(f"a mask_index of rank {rank} (the CPU kernel's forms are 1-D, 2-D and 3-D)")


@onnx_op("RotaryEmbedding", domain=MS, emits=("gather", "mul", "sub", "add", "slice", "split", "concat", "reshape",
                                              "transpose", "iota", "expand"))
def ms_rotary_embedding(ctx: NodeCtx) -> Value:
    """ONNX Runtime's rotary embedding: the ONNX op's rotation with its inputs in another order (input,
    position_ids, cos_cache, sin_cache); a one-element ``position_ids`` is the first position of every row
    (positions ``p, p + 1, ...``). Packed batching is refused."""
    if ctx.attr_int("is_packed_batching", 0):
        raise ctx.unsupported("is_packed_batching")
    b = ctx.b
    x, pos = ctx.input(0), ctx.input(1)
    if pos.type.rank <= 1 and all(d == 1 for d in pos.shape):
        batch, seq = x.shape[0], x.shape[2] if x.type.rank == 4 else x.shape[1]
        start = b.reshape(cast_to(b, pos, DType.i64), shape=[1, 1])
        pos = b.expand(b.add(positions(b, [1, seq]), start), shape=[batch, seq])
    elif pos.type.rank != 2:
        raise ShapeError(f"position_ids must be [batch, sequence] or one start position, got {pos.type}",
                         location=ctx.location, hint="give [batch, sequence] positions")
    return rotated(ctx, x, ctx.input(2), ctx.input(3), pos)
