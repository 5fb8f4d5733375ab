"""ONNX Attention, RotaryEmbedding, KV-cache updates and linear attention, spelled out in
matmul/softmax/where."""

from __future__ import annotations

import math

import numpy as np

from cuvil.frontend.onnx_node import NodeCtx, onnx_dtype, onnx_op
from cuvil.frontend.onnx_ops.blocks import (
    cast_to,
    concat,
    fill,
    positions,
    reshape_to,
    scalar,
    slice_along,
    split_equal,
    take,
    unsqueeze,
)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value


def heads_first(b: Builder, x: Value, heads: int) -> Value:
    """[B, S, heads*D] -> [B, heads, S, D]."""
    bsz, seq, hidden = x.shape
    return b.transpose(b.reshape(x, shape=[bsz, seq, heads, hidden // heads]), perm=[0, 2, 1, 3])


def _repeat_heads(b: Builder, t: Value, reps: int) -> Value:
    """[B, H, S, D] -> [B, H*reps, S, D], each head repeated ``reps`` times in a row (h0, h0, h1, h1, ...)."""
    bb, h, s, d = t.shape
    t5 = b.expand(b.reshape(t, shape=[bb, h, 1, s, d]), shape=[bb, h, reps, s, d])
    return b.reshape(t5, shape=[bb, h * reps, s, d])


def _neg_inf_bias(b: Builder, allowed: Value, dtype: DType) -> Value:
    """0 where attending is allowed, -inf where it is not (select, never multiply: 0 * -inf is NaN)."""
    return b.where(allowed, scalar(b, 0.0, dtype), scalar(b, -np.inf, dtype))


def _mask_bias(b: Builder, mask: Value, dtype: DType, kv_len: Dim) -> Value:
    """The attention mask as an additive bias of ``dtype``; keys it does not cover (a mask shorter
    than past plus new keys) are masked out."""
    bias = _neg_inf_bias(b, mask, dtype) if mask.dtype is DType.bool else mask
    if bias.dtype is not dtype:
        bias = b.cast(bias, to=dtype)
    short = kv_len - bias.shape[-1]
    if isinstance(short, int) and short > 0:
        pads = [0] * (2 * bias.type.rank)
        pads[2 * bias.type.rank - 1] = short
        bias = b.pad(bias, pads=pads, mode="constant", value=-np.inf)
    return bias


@onnx_op("Attention", emits=("matmul", "softmax", "where", "add", "sub", "mul", "div", "neg", "reshape", "transpose",
                             "concat", "expand", "iota", "fill", "less", "less_equal", "logical_and", "tanh",
                             "reduce_max", "equal", "cast", "pad"))
def attention(ctx: NodeCtx) -> list[Value | None]:
    """softmax(Q K^T * scale (+ softcap) + mask) V with GQA, past KV, causal and window masks."""
    b = ctx.b
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    dt = q.dtype
    three_d = q.type.rank == 3
    if three_d:
        qh, kvh = ctx.attr_int("q_num_heads"), ctx.attr_int("kv_num_heads")
        q, k, v = heads_first(b, q, qh), heads_first(b, k, kvh), heads_first(b, v, kvh)
    if q.type.rank != 4 or k.type.rank != 4 or v.type.rank != 4:
        raise ctx.unsupported("Q, K and V must all be 3-D or all 4-D")
    _, q_heads, q_len, head = q.shape
    past_len: Dim = 0
    if ctx.has_input(4):
        past_len = ctx.input(4).shape[2]
        k = b.concat(ctx.input(4), k, axis=2)
    if ctx.has_input(5):
        v = b.concat(ctx.input(5), v, axis=2)
    present_k, present_v = k, v
    kv_heads, kv_len = k.shape[1], k.shape[2]

    # scale: applied as sqrt(scale) to both Q and K, as the ONNX function body does
    scale = ctx.attr_float("scale", None)
    if scale is None:
        if not isinstance(head, int):
            raise ctx.unsupported("a symbolic head size needs an explicit scale")
        scale = 1.0 / math.sqrt(head)
    root = scalar(b, math.sqrt(scale), dt)

    # additive bias [.., q_len, kv_len]
    bias = _mask_bias(b, ctx.input(3), dt, kv_len) if ctx.has_input(3) else None
    nonpad = ctx.input(6) if ctx.has_input(6) else None
    if nonpad is not None and ctx.has_input(4):
        raise ctx.unsupported("nonpad_kv_seqlen cannot be combined with past_key")
    left, right = ctx.attr_int("left_window_size", -1), ctx.attr_int("right_window_size", -1)
    is_causal = bool(ctx.attr_int("is_causal", 0))
    if is_causal or left >= 0 or right >= 0:
        # query i (shifted by the number of keys before this block) against key j
        i = positions(b, [q_len, 1])
        j = positions(b, [1, kv_len])
        if nonpad is not None:
            if not isinstance(q_len, int):
                raise ctx.unsupported("nonpad_kv_seqlen with a symbolic query length")
            off = b.sub(reshape_to(b, b.cast(nonpad, to=DType.i64), [nonpad.shape[0], 1, 1, 1]),
                        scalar(b, q_len, DType.i64))
            pos = b.add(i, off)
        else:
            pos = b.add(i, scalar(b, int(past_len), DType.i64)) if past_len else i
        zero = fill(b, [q_len, kv_len], 0.0, dt)
        if is_causal:
            causal = _neg_inf_bias(b, b.less_equal(j, pos), dt)
            bias = b.add(bias if bias is not None else zero, causal)
        if left >= 0 or right >= 0:
            diff = b.sub(pos, j)
            allowed: Value | None = None
            if left >= 0:
                allowed = b.less_equal(diff, scalar(b, left, DType.i64))
            if right >= 0:
                r = b.less_equal(b.neg(diff), scalar(b, right, DType.i64))
                allowed = r if allowed is None else b.logical_and(allowed, r)
            assert allowed is not None
            bias = b.add(bias if bias is not None else zero, _neg_inf_bias(b, allowed, dt))
    if nonpad is not None:
        j = positions(b, [1, 1, 1, kv_len])
        valid = b.less(j, reshape_to(b, b.cast(nonpad, to=DType.i64), [nonpad.shape[0], 1, 1, 1]))
        pad_bias = _neg_inf_bias(b, valid, dt)
        bias = pad_bias if bias is None else b.add(bias, pad_bias)

    # grouped-query attention: each KV head serves q_heads / kv_heads consecutive query heads
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and q_heads != kv_heads:
        if q_heads % kv_heads:
            raise ctx.unsupported(f"{q_heads} query heads cannot share {kv_heads} KV heads")
        reps = q_heads // kv_heads
        k, v = _repeat_heads(b, k, reps), _repeat_heads(b, v, reps)

    qk = b.matmul(b.mul(q, root), b.mul(k, root), transpose_b=True)
    softcap = ctx.attr_float("softcap", 0.0)
    if softcap > 0.0:
        cap = scalar(b, softcap, dt)
        qk = b.mul(b.tanh(b.div(qk, cap)), cap)
    scores = b.add(qk, bias) if bias is not None else qk
    # the optional qk output, as ONNX's reference defines the modes (its test data follow it): 0 and 1
    # give the (soft-capped) product, 2 adds the mask, 3 gives the probabilities
    mode = ctx.attr_int("qk_matmul_output_mode", 0)
    qk_out = scores if mode == 2 else qk

    precision = ctx.attr_int("softmax_precision", 0)
    sm_dt = onnx_dtype(precision, ctx.location) if precision else dt
    probs = b.softmax(scores if sm_dt is dt else b.cast(scores, to=sm_dt), axis=-1)
    if bias is not None:
        # a row with no attendable key gives zeros (softmax alone would give NaN)
        dead = b.equal(b.reduce_max(bias, axes=[-1], keepdims=True), scalar(b, -np.inf, dt))
        probs = b.where(dead, scalar(b, 0.0, sm_dt), probs)
    if sm_dt is not dt:
        probs = b.cast(probs, to=dt)
    if mode == 3:
        qk_out = probs
    y = b.matmul(probs, v)
    if three_d:
        bb, h, s, d = y.shape
        y = b.reshape(b.transpose(y, perm=[0, 2, 1, 3]), shape=[bb, s, h * d])
    return [y, present_k, present_v, qk_out][:max(1, ctx.num_outputs)]


@onnx_op("FlexAttention", domain="ai.onnx.preview", emits=("matmul", "mul", "softmax", "cast", "expand",
                                                           "reshape"))
def flex_attention(ctx: NodeCtx) -> Value:
    """softmax(score_mod(Q K^T * scale)), then prob_mod, times V; the modifiers are inlined subgraphs."""
    b = ctx.b
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if q.type.rank != 4 or k.type.rank != 4 or v.type.rank != 4:
        raise ctx.unsupported("Q, K and V must be 4-D")
    dt = q.dtype
    q_heads, head = q.shape[1], q.shape[3]
    kv_heads = k.shape[1]
    if not (isinstance(q_heads, int) and isinstance(head, int) and isinstance(kv_heads, int)):
        raise ctx.unsupported("needs static head counts and head size")
    if q_heads != kv_heads:
        if q_heads % kv_heads:
            raise ctx.unsupported(f"{q_heads} query heads cannot share {kv_heads} KV heads")
        k, v = _repeat_heads(b, k, q_heads // kv_heads), _repeat_heads(b, v, q_heads // kv_heads)
    scale = ctx.attr_float("scale", None)
    if scale is None:
        scale = 1.0 / math.sqrt(head)
    root = b.const(np.sqrt(np.float32(scale)).astype(dt.np))  # rounded through f32, as the op specifies
    scores = b.matmul(b.mul(q, root), b.mul(k, root), transpose_b=True)
    precision = ctx.attr_int("softmax_precision", 0)
    if precision:
        sm_dt = onnx_dtype(precision, ctx.location)
    else:
        sm_dt = DType.f64 if dt is DType.f64 else DType.f32
    scores = cast_to(b, scores, sm_dt)

    def modified(name: str, x: Value) -> Value:
        if not ctx.has_attr(name):
            return x
        (out,) = ctx.imp.import_subgraph(ctx.attr(name), [x])
        return cast_to(b, out, sm_dt)

    probs = modified("prob_mod", b.softmax(modified("score_mod", scores), axis=-1))
    return cast_to(b, b.matmul(probs, cast_to(b, v, sm_dt)), v.dtype)


@onnx_op("RotaryEmbedding", emits=("gather", "mul", "sub", "add", "slice", "split", "concat", "reshape",
                                   "transpose"))
def rotary_embedding(ctx: NodeCtx) -> Value:
    """Rotate (pairs of) the first rotary_embedding_dim features by position-dependent angles."""
    return rotated(ctx, ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3) if ctx.has_input(3) else None)


def rotated(ctx: NodeCtx, x: Value, cos: Value, sin: Value, pos: Value | None) -> Value:
    """``x`` [B, H, S, D] or [B, S, H*D] (``num_heads``) with its first ``rotary_embedding_dim`` features (all by
    default) rotated by the cached angles, taken at ``pos`` [B, S] where given (else the caches are already
    [B, S, rot/2]), as halves or interleaved pairs (``interleaved``)."""
    b = ctx.b
    rank = x.type.rank
    if rank == 4:  # [B, H, S, D] -> [B, S, H, D]
        xs = b.transpose(x, perm=[0, 2, 1, 3])
    elif rank == 3:
        heads = ctx.attr_int("num_heads", 0)
        if not heads:
            raise ctx.unsupported("3-D input needs num_heads")
        bsz, seq, hidden = x.shape
        xs = b.reshape(x, shape=[bsz, seq, heads, hidden // heads])
    else:
        raise ctx.unsupported(f"input must be 3-D or 4-D, got {x.type}")
    head = xs.shape[3]
    if not isinstance(head, int):
        raise ctx.unsupported("a symbolic head size is not supported")
    rot = ctx.attr_int("rotary_embedding_dim", 0) or head
    if pos is not None:
        cos, sin = b.gather(cos, pos, axis=0), b.gather(sin, pos, axis=0)
    cos, sin = unsqueeze(b, cos, -2), unsqueeze(b, sin, -2)  # [B, S, 1, rot/2]
    x_rot = slice_along(b, xs, 3, 0, rot) if rot < head else xs
    if ctx.attr_int("interleaved", 0):
        x1, x2 = slice_along(b, x_rot, 3, 0, rot, 2), slice_along(b, x_rot, 3, 1, rot, 2)
    else:
        x1, x2 = split_equal(b, x_rot, 3, 2)
    real = b.sub(b.mul(cos, x1), b.mul(sin, x2))
    imag = b.add(b.mul(sin, x1), b.mul(cos, x2))
    if ctx.attr_int("interleaved", 0):
        rotated = b.reshape(b.concat(unsqueeze(b, real, -1), unsqueeze(b, imag, -1), axis=-1),
                            shape=list(x_rot.shape))
    else:
        rotated = b.concat(real, imag, axis=-1)
    out = b.concat(rotated, slice_along(b, xs, 3, rot, head), axis=-1) if rot < head else rotated
    return b.transpose(out, perm=[0, 2, 1, 3]) if rank == 4 else b.reshape(out, shape=list(x.shape))


@onnx_op("TensorScatter", emits=("iota", "add", "mod", "cast", "shape", "gather", "reshape", "expand",
                                 "scatter_elements"))
def tensor_scatter(ctx: NodeCtx) -> Value:
    """Write ``update`` into the cache along ``axis`` from each batch entry's write index."""
    b = ctx.b
    past, update = ctx.input(0), ctx.input(1)
    rank = past.type.rank
    axis = norm_axis(ctx.attr_int("axis", -2), rank)
    if axis == 0:
        raise ctx.unsupported("axis 0 is the batch axis")
    mode = ctx.attr_str("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode {mode!r}")
    seq = update.shape[axis]
    pos_shape: list[Dim] = [1] * rank
    pos_shape[axis] = seq
    pos = positions(b, pos_shape)
    if ctx.has_input(2):
        start = b.cast(ctx.input(2), to=DType.i64) if ctx.input(2).dtype is not DType.i64 else ctx.input(2)
        pos = b.add(pos, reshape_to(b, start, [past.shape[0]] + [1] * (rank - 1)))
    if mode == "circular":
        size = past.shape[axis]
        pos = b.mod(pos, scalar(b, size, DType.i64)) if isinstance(size, int) else \
            b.mod(pos, b.cast(take(b, b.shape(past), 0, axis), to=DType.i64))
    idx = b.expand(pos, shape=list(update.shape))
    return b.scatter_elements(past, idx, update, axis=axis, reduction="none")


@onnx_op("CausalConvWithState", emits=("concat", "fill", "conv", "add", "reshape", "silu", "slice"))
def causal_conv_with_state(ctx: NodeCtx) -> list[Value]:
    """Depthwise causal conv over [past_state, input]; the last k-1 positions become the new state."""
    b = ctx.b
    x, w = ctx.input(0), ctx.input(1)
    bsz, channels, _ = x.shape
    k = w.shape[2]
    if not isinstance(k, int) or not isinstance(channels, int):
        raise ctx.unsupported("needs a static kernel size and channel count")
    act = ctx.attr_str("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation {act!r}")
    past = ctx.input(3) if ctx.has_input(3) else fill(b, [bsz, channels, k - 1], 0.0, x.dtype)
    padded = b.concat(past, x, axis=2) if k > 1 else x
    y = b.conv(padded, w, strides=[1], pads=[0, 0], dilations=[1], groups=channels)
    if ctx.has_input(2):
        y = b.add(y, b.reshape(ctx.input(2), shape=[channels, 1]))
    if act != "none":
        y = b.silu(y)
    total = padded.shape[2]
    state = slice_along(b, padded, 2, total - (k - 1), total) if isinstance(total, int) else None
    if state is None:
        raise ctx.unsupported("a symbolic sequence length")
    return [y, state][:max(1, ctx.num_outputs)]


@onnx_op("LinearAttention", emits=("reshape", "transpose", "cast", "gather", "mul", "add", "sub", "exp",
                                   "matmul", "expand", "concat", "fill"))
def linear_attention(ctx: NodeCtx) -> list[Value]:
    """The recurrence S_t = decay * S_{t-1} + k_t (x) v_t (optionally delta-corrected), unrolled over T."""
    b = ctx.b
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    out_dt = q.dtype
    f32 = DType.f32
    qh, kvh = ctx.attr_int("q_num_heads"), ctx.attr_int("kv_num_heads")
    rule = ctx.attr_str("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.unsupported(f"update_rule {rule!r}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != ctx.has_input(4) or delta != ctx.has_input(5):
        raise ctx.unsupported(f"update_rule {rule!r} with decay={ctx.has_input(4)}, beta={ctx.has_input(5)}")
    bsz, steps, _ = q.shape
    if not isinstance(steps, int):
        raise ctx.unsupported("a symbolic sequence length cannot be unrolled")
    if qh % kvh:
        raise ctx.unsupported(f"{qh} query heads cannot share {kvh} KV heads")

    def heads(x: Value, n: int) -> Value:
        return b.cast(heads_first(b, x, n), to=f32) if x.dtype is not f32 else heads_first(b, x, n)

    q4, k4, v4 = heads(q, qh), heads(k, kvh), heads(v, kvh)
    dk, dv = q4.shape[3], v4.shape[3]
    decay4 = beta4 = None
    if gating:
        dec = ctx.input(4)
        if dec.shape[-1] == kvh:
            dec = b.transpose(b.reshape(dec, shape=[bsz, steps, kvh, 1]), perm=[0, 2, 1, 3])
        else:
            dec = heads_first(b, dec, kvh)
        decay4 = b.cast(dec, to=f32) if dec.dtype is not f32 else dec
    if delta:
        beta = ctx.input(5)
        nb = beta.shape[-1]
        beta = b.transpose(b.reshape(beta, shape=[bsz, steps, nb, 1]), perm=[0, 2, 1, 3])
        beta4 = b.cast(beta, to=f32) if beta.dtype is not f32 else beta
    if ctx.has_input(3):
        past = ctx.input(3)
        state_dt = past.dtype
        state = b.cast(past, to=f32) if past.dtype is not f32 else past
    else:
        state_dt = out_dt
        state = fill(b, [bsz, kvh, dk, dv], 0.0, f32)
    scale = ctx.attr_float("scale", 0.0)
    if not scale:
        if not isinstance(dk, int):
            raise ctx.unsupported("a symbolic head size needs an explicit scale")
        scale = 1.0 / math.sqrt(dk)
    group = qh // kvh
    outs = []
    for t in range(steps):
        q_t, k_t, v_t = take(b, q4, 2, t), take(b, k4, 2, t), take(b, v4, 2, t)
        if decay4 is not None:
            state = b.mul(state, unsqueeze(b, b.exp(take(b, decay4, 2, t)), -1))
        if beta4 is not None:
            retrieved = b.reshape(b.matmul(unsqueeze(b, k_t, -2), state), shape=[bsz, kvh, dv])
            v_t = b.mul(take(b, beta4, 2, t), b.sub(v_t, retrieved))
        state = b.add(state, b.mul(unsqueeze(b, k_t, -1), unsqueeze(b, v_t, -2)))
        read = state
        if group > 1:
            read = b.reshape(b.expand(b.reshape(state, shape=[bsz, kvh, 1, dk, dv]), shape=[bsz, kvh, group, dk, dv]),
                             shape=[bsz, qh, dk, dv])
        outs.append(b.mul(b.matmul(unsqueeze(b, q_t, -2), read), scalar(b, scale, f32)))
    y = concat(b, outs, 2)  # [B, Hq, T, dv]
    y = b.reshape(b.transpose(y, perm=[0, 2, 1, 3]), shape=[bsz, steps, qh * dv])
    if out_dt is not f32:
        y = b.cast(y, to=out_dt)
    if state_dt is not f32:
        state = b.cast(state, to=state_dt)
    return [y, state][:max(1, ctx.num_outputs)]
