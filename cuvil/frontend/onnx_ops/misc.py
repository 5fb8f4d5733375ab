"""ONNX composites and control flow -> CIR catalogue ops.

Nothing here adds a catalogue op: attention, rotary embeddings, recurrent cells,
losses, optimizer steps, DFTs and small linear algebra are spelled out in
matmul/softmax/where/reshape/..., so the verifier and the code generator see only
ops they already understand. Control flow is resolved at import time: an If with a
compile-time condition is inlined, Loop/Scan bodies are unrolled over a compile-time
trip count, and recurrent layers are unrolled over their (static) sequence length.
Tables that depend only on static sizes (DFT twiddle factors, mel filters, affine
grid coordinates) become constants.

Not supported: Bernoulli, Multinomial and Random* (their results are random), and
sequence/optional values (CIR values are tensors).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from cuvil.frontend.onnx_import import ONNX_DTYPES, NodeCtx, onnx_dtype, onnx_op
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value

# the most iterations an unrolled Loop/Scan/recurrence may have before import refuses it
MAX_UNROLL = 4096

# --------------------------------------------------------------------------------------
# small building blocks over catalogue ops


def _scalar(b: Builder, value: float | int | bool, dtype: DType) -> Value:
    return b.const(np.array(value, dtype=dtype.np))


def _index(b: Builder, i: int) -> Value:
    return b.const(np.array(i, dtype=np.int64))


def _reshape(b: Builder, x: Value, shape: Sequence[Dim]) -> Value:
    return x if tuple(shape) == tuple(x.shape) else b.reshape(x, shape=list(shape))


def _unsqueeze(b: Builder, x: Value, axis: int) -> Value:
    shape = list(x.shape)
    shape.insert(axis % (len(shape) + 1), 1)
    return b.reshape(x, shape=shape)


def _take(b: Builder, x: Value, axis: int, i: int) -> Value:
    """x[..., i, ...] along ``axis`` (the axis is dropped)."""
    return b.gather(x, _index(b, i), axis=axis)


def _stack(b: Builder, xs: Sequence[Value], axis: int) -> Value:
    parts = [_unsqueeze(b, x, axis) for x in xs]
    return parts[0] if len(parts) == 1 else b.concat(*parts, axis=axis)


def _concat(b: Builder, xs: Sequence[Value], axis: int) -> Value:
    return xs[0] if len(xs) == 1 else b.concat(*xs, axis=axis)


def _slice(b: Builder, x: Value, axis: int, start: int, end: int, step: int = 1) -> Value:
    """x[start:end:step] along one (static) axis; bounds already within the dim."""
    rank = x.type.rank
    axis = norm_axis(axis, rank)
    starts = [0] * rank
    ends = [d for d in x.shape]
    steps = [1] * rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    return b.slice(x, starts=starts, ends=ends, steps=steps)


def _split(b: Builder, x: Value, axis: int, parts: int) -> list[Value]:
    """Equal pieces along a static axis."""
    n = x.shape[axis]
    if not isinstance(n, int) or n % parts:
        raise ValueError(f"cannot split dim {n} into {parts} equal parts")
    sizes = [n // parts] * parts
    return [b.split(x, axis=axis, sizes=sizes, index=k) for k in range(parts)]


def _fill(b: Builder, shape: Sequence[Dim], value: float | int | bool, dtype: DType) -> Value:
    return b.fill(shape=list(shape), value=value, dtype=dtype)


def _positions(b: Builder, shape: Sequence[Dim], dtype: DType = DType.i64) -> Value:
    """0, 1, ..., n-1 along the one axis of ``shape`` that is not 1 (a broadcastable index ramp)."""
    return b.iota(shape=list(shape), start=0, step=1, dtype=dtype)


def _dims_int(x: Value, ctx: NodeCtx, what: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in x.shape):
        raise ctx.unsupported(f"{what} needs static dims, got {x.type}")
    return tuple(int(d) for d in x.shape)


def _static_scalar(ctx: NodeCtx, i: int) -> float | int | bool:
    v = np.asarray(ctx.static(i))
    if v.size != 1:
        raise ctx.unsupported(f"input {i} must be a scalar, got shape {v.shape}")
    return v.reshape(()).item()


# --------------------------------------------------------------------------------------
# Dropout (inference), If, Loop, Scan


@onnx_op("Dropout", emits=("fill",))
def dropout(ctx: NodeCtx) -> list[Value | None]:
    """Identity at inference; training mode is only deterministic with ratio 0."""
    x = ctx.input(0)
    training = ctx.opset >= 12 and ctx.has_input(2) and bool(_static_scalar(ctx, 2))
    if training:
        ratio = float(_static_scalar(ctx, 1)) if ctx.has_input(1) else 0.5
        if ratio != 0.0:
            raise ctx.unsupported("training mode with a non-zero ratio draws random masks")
    outs: list[Value | None] = [x]
    if ctx.num_outputs > 1 and ctx.node.output[1]:
        mask_dtype = DType.bool if ctx.opset >= 10 else x.dtype
        outs.append(_fill(ctx.b, x.shape, True if mask_dtype is DType.bool else 1, mask_dtype))
    return outs


@onnx_op("If", emits=())
def if_(ctx: NodeCtx) -> list[Value]:
    """Inline the branch a compile-time condition selects."""
    cond = np.asarray(ctx.static(0))
    if cond.size != 1:
        raise ctx.unsupported(f"the condition must have one element, got shape {cond.shape}")
    branch = ctx.attr("then_branch") if bool(cond.reshape(())) else ctx.attr("else_branch")
    return ctx.imp.import_subgraph(branch)


@onnx_op("Loop", emits=("concat", "reshape"))
def loop(ctx: NodeCtx) -> list[Value]:
    """Unroll a loop whose trip count and continuation condition are known at compile time."""
    body = ctx.attr("body")
    trip = int(_static_scalar(ctx, 0)) if ctx.has_input(0) else None
    cond = bool(_static_scalar(ctx, 1)) if ctx.has_input(1) else True
    carried = [ctx.input(i) for i in range(2, len(ctx.inputs))]
    n_scan = len(body.output) - 1 - len(carried)
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    i = 0
    while cond and (trip is None or i < trip):
        if i >= MAX_UNROLL:
            raise ctx.unsupported(f"more than {MAX_UNROLL} iterations cannot be unrolled")
        outs = ctx.imp.import_subgraph(body, [_index(ctx.b, i), _scalar(ctx.b, True, DType.bool), *carried])
        cond = bool(np.asarray(ctx.imp.static_value(outs[0], ctx.location)).reshape(()))
        carried = outs[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(v)
        i += 1
    if n_scan and i == 0:
        raise ctx.unsupported("a loop that runs zero times has scan outputs of unknown shape")
    return [*carried, *(_stack(ctx.b, s, 0) for s in scans)]


@onnx_op("Scan", emits=("gather", "concat", "reshape"))
def scan(ctx: NodeCtx) -> list[Value]:
    """Unroll over the (static) scan axis; opset 8's batched form runs once per batch entry."""
    body = ctx.attr("body")
    n_scan = ctx.attr_int("num_scan_inputs")
    if ctx.opset < 9:
        if ctx.has_input(0):
            raise ctx.unsupported("sequence_lens is not supported")
        ins = [ctx.input(i) for i in range(1, len(ctx.inputs))]
        n_state = len(ins) - n_scan
        batch = ins[0].shape[0] if ins else 0
        if not isinstance(batch, int):
            raise ctx.unsupported("a symbolic batch size cannot be unrolled")
        dirs = ctx.attr_ints("directions", [0] * n_scan)
        per_batch = [_scan_once(ctx, body, [_take(ctx.b, x, 0, bi) for x in ins[:n_state]],
                                [_take(ctx.b, x, 0, bi) for x in ins[n_state:]], [0] * n_scan, dirs,
                                [0] * (len(body.output) - n_state), [0] * (len(body.output) - n_state))
                     for bi in range(batch)]
        return [_stack(ctx.b, list(outs), 0) for outs in zip(*per_batch, strict=True)]
    ins = list(ctx.inputs)
    n_state = len(ins) - n_scan
    n_out = len(body.output) - n_state
    return _scan_once(ctx, body, [ctx.input(i) for i in range(n_state)],
                      [ctx.input(i) for i in range(n_state, len(ins))],
                      ctx.attr_ints("scan_input_axes", [0] * n_scan),
                      ctx.attr_ints("scan_input_directions", [0] * n_scan),
                      ctx.attr_ints("scan_output_axes", [0] * n_out),
                      ctx.attr_ints("scan_output_directions", [0] * n_out))


def _scan_once(ctx: NodeCtx, body: object, states: list[Value], xs: list[Value], in_axes: Sequence[int],
               in_dirs: Sequence[int], out_axes: Sequence[int], out_dirs: Sequence[int]) -> list[Value]:
    b = ctx.b
    axes = [norm_axis(a, x.type.rank) for a, x in zip(in_axes, xs, strict=True)]
    lengths = {x.shape[a] for a, x in zip(axes, xs, strict=True)}
    if len(lengths) != 1:
        raise ctx.unsupported(f"scan inputs have different lengths {sorted(map(str, lengths))}")
    (steps,) = lengths
    if not isinstance(steps, int):
        raise ctx.unsupported("a symbolic scan length cannot be unrolled")
    if steps > MAX_UNROLL:
        raise ctx.unsupported(f"more than {MAX_UNROLL} scan steps cannot be unrolled")
    n_state = len(states)
    outs_per_step: list[list[Value]] = []
    for t in range(steps):
        elems = [_take(b, x, a, steps - 1 - t if d else t) for x, a, d in zip(xs, axes, in_dirs, strict=True)]
        outs = ctx.imp.import_subgraph(body, [*states, *elems])  # type: ignore[arg-type]
        states = outs[:n_state]
        outs_per_step.append(outs[n_state:])
    results = list(states)
    for k, (a, d) in enumerate(zip(out_axes, out_dirs, strict=True)):
        seq = [o[k] for o in outs_per_step]
        if d:
            seq.reverse()
        if not seq:
            raise ctx.unsupported("a scan of length 0 has scan outputs of unknown shape")
        results.append(_stack(b, seq, norm_axis(a, seq[0].type.rank + 1)))
    return results


# --------------------------------------------------------------------------------------
# Attention (opset 23+) and RotaryEmbedding


def _heads_first(b: Builder, x: Value, heads: int) -> Value:
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
    return b.where(allowed, _scalar(b, 0.0, dtype), _scalar(b, -np.inf, dtype))


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
        q, k, v = _heads_first(b, q, qh), _heads_first(b, k, kvh), _heads_first(b, v, kvh)
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
    root = _scalar(b, math.sqrt(scale), dt)

    # additive bias [.., q_len, kv_len]
    bias: Value | None = None
    if ctx.has_input(3):
        mask = ctx.input(3)
        bias = _neg_inf_bias(b, mask, dt) if mask.dtype is DType.bool else mask
        if bias.dtype is not dt:
            bias = b.cast(bias, to=dt)
        short = kv_len - bias.shape[-1]
        if isinstance(short, int) and short > 0:
            pads = [0] * (2 * bias.type.rank)
            pads[2 * bias.type.rank - 1] = short
            bias = b.pad(bias, pads=pads, mode="constant", value=-np.inf)
    nonpad = ctx.input(6) if ctx.has_input(6) else None
    if nonpad is not None and ctx.has_input(4):
        raise ctx.unsupported("nonpad_kv_seqlen cannot be combined with past_key")
    left, right = ctx.attr_int("left_window_size", -1), ctx.attr_int("right_window_size", -1)
    is_causal = bool(ctx.attr_int("is_causal", 0))
    if is_causal or left >= 0 or right >= 0:
        # query i (shifted by the number of keys before this block) against key j
        i = _positions(b, [q_len, 1])
        j = _positions(b, [1, kv_len])
        if nonpad is not None:
            if not isinstance(q_len, int):
                raise ctx.unsupported("nonpad_kv_seqlen with a symbolic query length")
            off = b.sub(_reshape(b, b.cast(nonpad, to=DType.i64), [nonpad.shape[0], 1, 1, 1]),
                        _scalar(b, q_len, DType.i64))
            pos = b.add(i, off)
        else:
            pos = b.add(i, _scalar(b, int(past_len), DType.i64)) if past_len else i
        zero = _fill(b, [q_len, kv_len], 0.0, dt)
        if is_causal:
            causal = _neg_inf_bias(b, b.less_equal(j, pos), dt)
            bias = b.add(bias if bias is not None else zero, causal)
        if left >= 0 or right >= 0:
            diff = b.sub(pos, j)
            allowed: Value | None = None
            if left >= 0:
                allowed = b.less_equal(diff, _scalar(b, left, DType.i64))
            if right >= 0:
                r = b.less_equal(b.neg(diff), _scalar(b, right, DType.i64))
                allowed = r if allowed is None else b.logical_and(allowed, r)
            assert allowed is not None
            bias = b.add(bias if bias is not None else zero, _neg_inf_bias(b, allowed, dt))
    if nonpad is not None:
        j = _positions(b, [1, 1, 1, kv_len])
        valid = b.less(j, _reshape(b, b.cast(nonpad, to=DType.i64), [nonpad.shape[0], 1, 1, 1]))
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
        cap = _scalar(b, softcap, dt)
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
        dead = b.equal(b.reduce_max(bias, axes=[-1], keepdims=True), _scalar(b, -np.inf, dt))
        probs = b.where(dead, _scalar(b, 0.0, sm_dt), probs)
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
    if not all(isinstance(d, int) for d in (q_heads, head, kv_heads)):
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
    scores = _as(b, scores, sm_dt)

    def modified(name: str, x: Value) -> Value:
        if not ctx.has_attr(name):
            return x
        (out,) = ctx.imp.import_subgraph(ctx.attr(name), [x])
        return _as(b, out, sm_dt)

    probs = modified("prob_mod", b.softmax(modified("score_mod", scores), axis=-1))
    return _as(b, b.matmul(probs, _as(b, v, sm_dt)), v.dtype)


@onnx_op("RotaryEmbedding", emits=("gather", "mul", "sub", "add", "slice", "split", "concat", "reshape",
                                   "transpose"))
def rotary_embedding(ctx: NodeCtx) -> Value:
    """Rotate (pairs of) the first rotary_embedding_dim features by position-dependent angles."""
    b = ctx.b
    x = ctx.input(0)
    cos, sin = ctx.input(1), ctx.input(2)
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
    if ctx.has_input(3):
        pos = ctx.input(3)
        cos, sin = b.gather(cos, pos, axis=0), b.gather(sin, pos, axis=0)
    cos, sin = _unsqueeze(b, cos, -2), _unsqueeze(b, sin, -2)  # [B, S, 1, rot/2]
    x_rot = _slice(b, xs, 3, 0, rot) if rot < head else xs
    if ctx.attr_int("interleaved", 0):
        x1, x2 = _slice(b, x_rot, 3, 0, rot, 2), _slice(b, x_rot, 3, 1, rot, 2)
    else:
        x1, x2 = _split(b, x_rot, 3, 2)
    real = b.sub(b.mul(cos, x1), b.mul(sin, x2))
    imag = b.add(b.mul(sin, x1), b.mul(cos, x2))
    if ctx.attr_int("interleaved", 0):
        rotated = b.reshape(b.concat(_unsqueeze(b, real, -1), _unsqueeze(b, imag, -1), axis=-1),
                            shape=list(x_rot.shape))
    else:
        rotated = b.concat(real, imag, axis=-1)
    out = b.concat(rotated, _slice(b, xs, 3, rot, head), axis=-1) if rot < head else rotated
    return b.transpose(out, perm=[0, 2, 1, 3]) if rank == 4 else b.reshape(out, shape=list(x.shape))


# --------------------------------------------------------------------------------------
# RNN, GRU, LSTM (unrolled over the sequence)

_ALPHA_DEFAULT = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "ScaledTanh": 1.0, "HardSigmoid": 0.2,
                  "Elu": 1.0, "Affine": 1.0}
_BETA_DEFAULT = {"ScaledTanh": 1.0, "HardSigmoid": 0.5, "Affine": 0.0}

Activation = Callable[[Value], Value]
_RECURRENT_EMITS = ("matmul", "add", "mul", "sub", "gather", "split", "where", "less", "concat", "reshape", "fill",
                    "relu", "sigmoid", "tanh", "leaky_relu", "thresholded_relu", "elu", "softsign", "softplus",
                    "hardsigmoid", "clip")


def _activation(ctx: NodeCtx, name: str, alpha: float | None, beta: float | None) -> Activation:
    b = ctx.b
    key = {n.lower(): n for n in ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu",
                                  "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus")}.get(name.lower())
    if key is None:
        raise ctx.unsupported(f"activation {name!r}")
    a = alpha if alpha is not None else _ALPHA_DEFAULT.get(key, 0.0)
    be = beta if beta is not None else _BETA_DEFAULT.get(key, 0.0)
    simple = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softsign": "softsign", "Softplus": "softplus"}
    if key in simple:
        return lambda x: b.op(simple[key], x)
    if key == "LeakyRelu":
        return lambda x: b.leaky_relu(x, alpha=a)
    if key == "ThresholdedRelu":
        return lambda x: b.thresholded_relu(x, alpha=a)
    if key == "Elu":
        return lambda x: b.elu(x, alpha=a)
    if key == "HardSigmoid":
        return lambda x: b.hardsigmoid(x, alpha=a, beta=be)
    if key == "Affine":
        return lambda x: b.add(b.mul(x, _scalar(b, a, x.dtype)), _scalar(b, be, x.dtype))
    return lambda x: b.mul(b.tanh(b.mul(x, _scalar(b, be, x.dtype))), _scalar(b, a, x.dtype))  # ScaledTanh


class _Recurrence:
    """What RNN, GRU and LSTM share: layout, directions, weights per direction, masks, outputs."""

    def __init__(self, ctx: NodeCtx, default_acts: Sequence[str]) -> None:
        b = self.b = ctx.b
        self.ctx = ctx
        x = ctx.input(0)
        self.layout = ctx.attr_int("layout", 0)
        if self.layout:
            x = b.transpose(x, perm=[1, 0, 2])
        self.x = x
        self.w, self.r = ctx.input(1), ctx.input(2)
        self.dirs = self.w.shape[0]
        direction = ctx.attr_str("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.unsupported(f"direction {direction!r}")
        if (self.dirs == 2) != (direction == "bidirectional"):
            raise ctx.unsupported(f"direction {direction!r} with {self.dirs} weight sets")
        self.reverse = [False, True] if self.dirs == 2 else [direction == "reverse"]
        self.hidden = ctx.attr_int("hidden_size", None) or self.r.shape[-1]
        seq = x.shape[0]
        if not isinstance(seq, int):
            raise ctx.unsupported("a symbolic sequence length cannot be unrolled")
        if seq > MAX_UNROLL:
            raise ctx.unsupported(f"more than {MAX_UNROLL} time steps cannot be unrolled")
        self.seq = seq
        self.batch = x.shape[1]
        self.dt = x.dtype
        clip = ctx.attr_float("clip", None)
        self.clip = clip
        names = ctx.attr("activations", None)
        per_dir = len(default_acts)
        if names is None:
            names = list(default_acts) * self.dirs
        if len(names) != per_dir * self.dirs:
            raise ctx.unsupported(f"expected {per_dir * self.dirs} activations, got {len(names)}")
        alphas = list(ctx.attr_floats("activation_alpha", []))
        betas = list(ctx.attr_floats("activation_beta", []))
        acts = [_activation(ctx, n, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
                for k, n in enumerate(names)]
        self.acts = [acts[d * per_dir:(d + 1) * per_dir] for d in range(self.dirs)]
        self.lens = ctx.input(4) if ctx.has_input(4) else None

    def initial(self, index: int, d: int) -> Value:
        if self.ctx.has_input(index):
            h0 = self.ctx.input(index)
            if self.layout:
                h0 = self.b.transpose(h0, perm=[1, 0, 2])
            return _take(self.b, h0, 0, d)
        return _fill(self.b, [self.batch, self.hidden], 0.0, self.dt)

    def weights(self, d: int) -> tuple[Value, Value, Value | None, Value | None]:
        """W_d [G*H, in], R_d [G*H, H], and the input/recurrent biases [G*H] (None when absent)."""
        b = self.b
        w, r = _take(b, self.w, 0, d), _take(b, self.r, 0, d)
        if not self.ctx.has_input(3):
            return w, r, None, None
        wb, rb = _split(b, _take(b, self.ctx.input(3), 0, d), 0, 2)
        return w, r, wb, rb

    def projected_inputs(self, w: Value, wb: Value | None) -> Value:
        """X W^T (+ Wb) for every step at once: [seq, batch, G*H]."""
        xw = self.b.matmul(self.x, w, transpose_b=True)
        return self.b.add(xw, wb) if wb is not None else xw

    def clipped(self, x: Value) -> Value:
        return self.b.clip(x, min=-self.clip, max=self.clip) if self.clip is not None else x

    def steps(self, d: int) -> list[int]:
        return list(reversed(range(self.seq))) if self.reverse[d] else list(range(self.seq))

    def mask(self, t: int) -> Value | None:
        """[batch, 1]: whether step t is inside each sequence (None when all are full length)."""
        if self.lens is None:
            return None
        b = self.b
        inside = b.less(_scalar(b, t, self.lens.dtype), self.lens)
        return _reshape(b, inside, [self.batch, 1])

    def keep(self, mask: Value | None, new: Value, old: Value) -> Value:
        return new if mask is None else self.b.where(mask, new, old)

    def outputs(self, ys: list[list[Value]], finals: list[list[Value]]) -> list[Value | None]:
        """Y [seq, dirs, batch, H] plus one [dirs, batch, H] per final state (layout 1 swaps batch first)."""
        b = self.b
        y = _stack(b, [_stack(b, per_t, 0) for per_t in ys], 1)
        states = [_stack(b, list(f), 0) for f in zip(*finals, strict=True)]
        if self.layout:
            y = b.transpose(y, perm=[2, 0, 1, 3])
            states = [b.transpose(s, perm=[1, 0, 2]) for s in states]
        outs: list[Value | None] = [y, *states]
        return outs[:max(1, self.ctx.num_outputs)]

    def zero_out(self, mask: Value | None, h: Value) -> Value:
        if mask is None:
            return h
        return self.b.where(mask, h, _scalar(self.b, 0.0, self.dt))


@onnx_op("RNN", emits=_RECURRENT_EMITS)
def rnn(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Tanh"])
    b = ctx.b
    ys, finals = [], []
    for d in range(rec.dirs):
        w, r, wb, rb = rec.weights(d)
        xw = rec.projected_inputs(w, wb)
        (f,) = rec.acts[d]
        h = rec.initial(5, d)
        per_t: list[Value | None] = [None] * rec.seq
        for t in rec.steps(d):
            pre = b.add(_take(b, xw, 0, t), b.matmul(h, r, transpose_b=True))
            if rb is not None:
                pre = b.add(pre, rb)
            h_new = f(rec.clipped(pre))
            m = rec.mask(t)
            per_t[t] = rec.zero_out(m, h_new)
            h = rec.keep(m, h_new, h)
        ys.append(per_t)
        finals.append([h])
    return rec.outputs(ys, finals)  # type: ignore[arg-type]


@onnx_op("GRU", emits=_RECURRENT_EMITS)
def gru(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Sigmoid", "Tanh"])
    b = ctx.b
    linear_before_reset = bool(ctx.attr_int("linear_before_reset", 0))
    ys, finals = [], []
    for d in range(rec.dirs):
        w, r, wb, rb = rec.weights(d)
        xw = rec.projected_inputs(w, wb)
        rz, rr, rh = _split(b, r, 0, 3)
        rbz, rbr, rbh = _split(b, rb, 0, 3) if rb is not None else (None, None, None)
        f, g = rec.acts[d]
        h = rec.initial(5, d)
        one = _scalar(b, 1.0, rec.dt)
        per_t: list[Value | None] = [None] * rec.seq
        for t in rec.steps(d):
            xz, xr, xh = _split(b, _take(b, xw, 0, t), 1, 3)

            def gate(xg: Value, rg: Value, bg: Value | None, state: Value) -> Value:
                pre = b.add(xg, b.matmul(state, rg, transpose_b=True))
                return b.add(pre, bg) if bg is not None else pre

            z = f(rec.clipped(gate(xz, rz, rbz, h)))
            rt = f(rec.clipped(gate(xr, rr, rbr, h)))
            if linear_before_reset:
                hr = b.matmul(h, rh, transpose_b=True)
                if rbh is not None:
                    hr = b.add(hr, rbh)
                pre_h = b.add(xh, b.mul(rt, hr))
            else:
                pre_h = gate(xh, rh, rbh, b.mul(rt, h))
            cand = g(rec.clipped(pre_h))
            h_new = b.add(b.mul(b.sub(one, z), cand), b.mul(z, h))
            m = rec.mask(t)
            per_t[t] = rec.zero_out(m, h_new)
            h = rec.keep(m, h_new, h)
        ys.append(per_t)
        finals.append([h])
    return rec.outputs(ys, finals)  # type: ignore[arg-type]


@onnx_op("LSTM", emits=_RECURRENT_EMITS)
def lstm(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Sigmoid", "Tanh", "Tanh"])
    b = ctx.b
    input_forget = bool(ctx.attr_int("input_forget", 0))
    ys, finals = [], []
    for d in range(rec.dirs):
        w, r, wb, rb = rec.weights(d)
        xw = rec.projected_inputs(w, wb)
        if rb is not None:
            xw = b.add(xw, rb)
        peep = _split(b, _take(b, ctx.input(7), 0, d), 0, 3) if ctx.has_input(7) else None
        f, g, hact = rec.acts[d]
        h, c = rec.initial(5, d), rec.initial(6, d)
        one = _scalar(b, 1.0, rec.dt)
        per_t: list[Value | None] = [None] * rec.seq
        for t in rec.steps(d):
            pre = b.add(_take(b, xw, 0, t), b.matmul(h, r, transpose_b=True))
            pi, po, pf, pc = _split(b, pre, 1, 4)
            if peep is not None:
                pi, pf = b.add(pi, b.mul(peep[0], c)), b.add(pf, b.mul(peep[2], c))
            it = f(rec.clipped(pi))
            ft = b.sub(one, it) if input_forget else f(rec.clipped(pf))
            ct = g(rec.clipped(pc))
            c_new = b.add(b.mul(ft, c), b.mul(it, ct))
            if peep is not None:
                po = b.add(po, b.mul(peep[1], c_new))
            ot = f(rec.clipped(po))
            h_new = b.mul(ot, hact(c_new))
            m = rec.mask(t)
            per_t[t] = rec.zero_out(m, h_new)
            h, c = rec.keep(m, h_new, h), rec.keep(m, c_new, c)
        ys.append(per_t)
        finals.append([h, c])
    return rec.outputs(ys, finals)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# losses


def _nll(ctx: NodeCtx, logp: Value, target: Value, weight: Value | None) -> Value:
    """-logp[n, target[n, ...], ...] weighted, with ignore_index and the reduction applied."""
    b = ctx.b
    dt = logp.dtype
    reduction = ctx.attr_str("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction {reduction!r}")
    ignore = ctx.attr_int("ignore_index", None)
    tgt = target
    valid: Value | None = None
    if ignore is not None:
        ign = _scalar(b, ignore, target.dtype)
        valid = b.not_equal(target, ign)
        tgt = b.where(valid, target, _scalar(b, 0, target.dtype))  # any in-range class; its loss is zeroed
    picked = _reshape(b, b.gather_elements(logp, _unsqueeze(b, tgt, 1), axis=1), list(target.shape))
    w: Value | None = b.gather(weight, tgt, axis=0) if weight is not None else None
    if valid is not None:
        w = b.where(valid, w if w is not None else _scalar(b, 1.0, dt), _scalar(b, 0.0, dt))
    loss = b.neg(picked)
    if w is not None:
        loss = b.mul(loss, w)
    if reduction == "none":
        return loss
    total = b.reduce_sum(loss, axes=[], keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return b.reduce_mean(loss, axes=[], keepdims=False)
    denom = b.reduce_sum(b.expand(w, shape=list(loss.shape)) if w.shape != loss.shape else w, axes=[],
                         keepdims=False)
    return b.div(total, denom)


@onnx_op("NegativeLogLikelihoodLoss", emits=("gather_elements", "gather", "where", "not_equal", "neg", "mul",
                                             "reduce_sum", "reduce_mean", "div", "reshape"))
def nll_loss(ctx: NodeCtx) -> Value:
    return _nll(ctx, ctx.input(0), ctx.input(1), ctx.input(2) if ctx.has_input(2) else None)


@onnx_op("SoftmaxCrossEntropyLoss", emits=("log_softmax", "gather_elements", "gather", "where", "not_equal",
                                           "neg", "mul", "reduce_sum", "reduce_mean", "div", "reshape"))
def softmax_cross_entropy_loss(ctx: NodeCtx) -> list[Value]:
    logp = ctx.b.log_softmax(ctx.input(0), axis=1)
    loss = _nll(ctx, logp, ctx.input(1), ctx.input(2) if ctx.has_input(2) else None)
    return [loss, logp][:max(1, ctx.num_outputs)]


# --------------------------------------------------------------------------------------
# small linear algebra and scatter-like composites


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
    rows = [_take(b, x, rank - 2, i) for i in range(n)]
    elem = [[_take(b, row, row.type.rank - 1, j) for j in range(n)] for row in rows]
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
    xs = _dims_int(x, ctx, "MaxUnpool")
    kernel = ctx.attr_ints("kernel_shape")
    nsp = len(kernel)
    strides = ctx.attr_ints("strides", [1] * nsp)
    pads = ctx.attr_ints("pads", [0] * (2 * nsp))
    inferred = list(xs[:2]) + [(xs[2 + k] - 1) * strides[k] + kernel[k] - pads[k] - pads[k + nsp]
                               for k in range(nsp)]
    flat = _fill(b, [int(np.prod(inferred))], 0.0, x.dtype)
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


# --------------------------------------------------------------------------------------
# spectral windows (opset 17)


def _window(ctx: NodeCtx, coeffs: Sequence[float]) -> Value:
    """sum_k (-1)^k c_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
    b = ctx.b
    size = int(_static_scalar(ctx, 0))
    dtype = ONNX_DTYPES.get(ctx.attr_int("output_datatype", 1))
    if dtype is None or (not dtype.is_float and not dtype.is_int):
        raise ctx.unsupported(f"output_datatype {ctx.attr_int('output_datatype', 1)}")
    periodic = bool(ctx.attr_int("periodic", 1))
    denom = size if periodic else size - 1
    n = _positions(b, [size], DType.f64)
    out = _fill(b, [size], coeffs[0], DType.f64)
    for k, c in enumerate(coeffs[1:], start=1):
        if denom <= 0:
            break
        angle = b.mul(n, _scalar(b, 2.0 * math.pi * k / denom, DType.f64))
        term = b.mul(b.cos(angle), _scalar(b, c, DType.f64))
        out = b.sub(out, term) if k % 2 else b.add(out, term)
    return b.cast(out, to=dtype)


@onnx_op("HannWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def hann_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [0.5, 0.5])


@onnx_op("HammingWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def hamming_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [25.0 / 46.0, 21.0 / 46.0])


@onnx_op("BlackmanWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def blackman_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [0.42, 0.5, 0.08])


# --------------------------------------------------------------------------------------
# KV-cache updates, stateful convolution, linear attention


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
    pos_shape = [1] * rank
    pos_shape[axis] = seq
    pos = _positions(b, pos_shape)
    if ctx.has_input(2):
        start = b.cast(ctx.input(2), to=DType.i64) if ctx.input(2).dtype is not DType.i64 else ctx.input(2)
        pos = b.add(pos, _reshape(b, start, [past.shape[0]] + [1] * (rank - 1)))
    if mode == "circular":
        pos = b.mod(pos, _scalar(b, past.shape[axis], DType.i64)) if isinstance(past.shape[axis], int) else \
            b.mod(pos, b.cast(_take(b, b.shape(past), 0, axis), to=DType.i64))
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
    past = ctx.input(3) if ctx.has_input(3) else _fill(b, [bsz, channels, k - 1], 0.0, x.dtype)
    padded = b.concat(past, x, axis=2) if k > 1 else x
    y = b.conv(padded, w, strides=[1], pads=[0, 0], dilations=[1], groups=channels)
    if ctx.has_input(2):
        y = b.add(y, b.reshape(ctx.input(2), shape=[channels, 1]))
    if act != "none":
        y = b.silu(y)
    total = padded.shape[2]
    state = _slice(b, padded, 2, total - (k - 1), total) if isinstance(total, int) else None
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
        return b.cast(_heads_first(b, x, n), to=f32) if x.dtype is not f32 else _heads_first(b, x, n)

    q4, k4, v4 = heads(q, qh), heads(k, kvh), heads(v, kvh)
    dk, dv = q4.shape[3], v4.shape[3]
    decay4 = beta4 = None
    if gating:
        dec = ctx.input(4)
        if dec.shape[-1] == kvh:
            dec = b.transpose(b.reshape(dec, shape=[bsz, steps, kvh, 1]), perm=[0, 2, 1, 3])
        else:
            dec = _heads_first(b, dec, kvh)
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
        state = _fill(b, [bsz, kvh, dk, dv], 0.0, f32)
    scale = ctx.attr_float("scale", 0.0)
    if not scale:
        if not isinstance(dk, int):
            raise ctx.unsupported("a symbolic head size needs an explicit scale")
        scale = 1.0 / math.sqrt(dk)
    group = qh // kvh
    outs = []
    for t in range(steps):
        q_t, k_t, v_t = _take(b, q4, 2, t), _take(b, k4, 2, t), _take(b, v4, 2, t)
        if decay4 is not None:
            state = b.mul(state, _unsqueeze(b, b.exp(_take(b, decay4, 2, t)), -1))
        if beta4 is not None:
            retrieved = b.reshape(b.matmul(_unsqueeze(b, k_t, -2), state), shape=[bsz, kvh, dv])
            v_t = b.mul(_take(b, beta4, 2, t), b.sub(v_t, retrieved))
        state = b.add(state, b.mul(_unsqueeze(b, k_t, -1), _unsqueeze(b, v_t, -2)))
        read = state
        if group > 1:
            read = b.reshape(b.expand(b.reshape(state, shape=[bsz, kvh, 1, dk, dv]), shape=[bsz, kvh, group, dk, dv]),
                             shape=[bsz, qh, dk, dv])
        outs.append(b.mul(b.matmul(_unsqueeze(b, q_t, -2), read), _scalar(b, scale, f32)))
    y = _concat(b, outs, 2)  # [B, Hq, T, dv]
    y = b.reshape(b.transpose(y, perm=[0, 2, 1, 3]), shape=[bsz, steps, qh * dv])
    if out_dt is not f32:
        y = b.cast(y, to=out_dt)
    if state_dt is not f32:
        state = b.cast(state, to=state_dt)
    return [y, state][:max(1, ctx.num_outputs)]


# --------------------------------------------------------------------------------------
# optimizer steps (ai.onnx.preview.training): plain arithmetic on the current tensors

_TRAINING = "ai.onnx.preview.training"


def _optimizer_groups(ctx: NodeCtx, per_tensor: int) -> tuple[Value, Value, list[list[Value]]]:
    """R, T and, for each optimized tensor, its ``per_tensor`` inputs (X, G, then the states)."""
    n_rest = len(ctx.inputs) - 2
    if n_rest <= 0 or n_rest % per_tensor:
        raise ctx.unsupported(f"expected 2 + {per_tensor}*n inputs, got {len(ctx.inputs)}")
    n = n_rest // per_tensor
    groups = [[ctx.input(2 + j * n + i) for j in range(per_tensor)] for i in range(n)]
    return ctx.input(0), ctx.input(1), groups


def _regularized(b: Builder, x: Value, g: Value, coefficient: float) -> Value:
    return g if coefficient == 0.0 else b.add(b.mul(_scalar(b, coefficient, x.dtype), x), g)


def _as(b: Builder, v: Value, dtype: DType) -> Value:
    return v if v.dtype is dtype else b.cast(v, to=dtype)


@onnx_op("Adagrad", domain=_TRAINING, emits=("mul", "add", "sub", "div", "sqrt", "cast"))
def adagrad(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 3)
    decay, eps = ctx.attr_float("decay_factor", 0.0), ctx.attr_float("epsilon", 0.0)
    norm = ctx.attr_float("norm_coefficient", 0.0)
    xs, hs = [], []
    for x, g, h in groups:
        dt = x.dtype
        rate = b.div(_as(b, r, dt), b.add(_scalar(b, 1.0, dt), b.mul(_as(b, t, dt), _scalar(b, decay, dt))))
        gr = _regularized(b, x, g, norm)
        h_new = b.add(h, b.mul(gr, gr))
        xs.append(b.sub(x, b.div(b.mul(rate, gr), b.add(b.sqrt(h_new), _scalar(b, eps, dt)))))
        hs.append(h_new)
    return xs + hs


@onnx_op("Momentum", domain=_TRAINING, emits=("mul", "add", "sub", "greater", "where", "cast"))
def momentum(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 3)
    alpha, beta = ctx.attr_float("alpha"), ctx.attr_float("beta")
    norm = ctx.attr_float("norm_coefficient", 0.0)
    mode = ctx.attr_str("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise ctx.unsupported(f"mode {mode!r}")
    xs, vs = [], []
    for x, g, v in groups:
        dt = x.dtype
        gr = _regularized(b, x, g, norm)
        # the first step (T == 0) takes the whole gradient
        beta_t = b.where(b.greater(t, _scalar(b, 0, t.dtype)), _scalar(b, beta, dt), _scalar(b, 1.0, dt))
        v_new = b.add(b.mul(_scalar(b, alpha, dt), v), b.mul(beta_t, gr))
        step = v_new if mode == "standard" else b.add(gr, b.mul(_scalar(b, alpha, dt), v_new))
        xs.append(b.sub(x, b.mul(_as(b, r, dt), step)))
        vs.append(v_new)
    return xs + vs


@onnx_op("Adam", domain=_TRAINING, emits=("mul", "add", "sub", "div", "sqrt", "pow", "greater", "where", "cast"))
def adam(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 4)
    alpha, beta = ctx.attr_float("alpha", 0.9), ctx.attr_float("beta", 0.999)
    eps = ctx.attr_float("epsilon", 0.0)
    norm, post = ctx.attr_float("norm_coefficient", 0.0), ctx.attr_float("norm_coefficient_post", 0.0)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        dt = x.dtype

        def c(value: float, dt: DType = dt) -> Value:
            return _scalar(b, value, dt)

        gr = _regularized(b, x, g, norm)
        v_new = b.add(b.mul(c(alpha), v), b.mul(c(1.0 - alpha), gr))
        h_new = b.add(b.mul(c(beta), h), b.mul(c(1.0 - beta), b.mul(gr, gr)))
        tf = _as(b, t, dt)
        # bias correction from the second step on: R * sqrt(1 - beta^T) / (1 - alpha^T)
        corrected = b.div(b.mul(_as(b, r, dt), b.sqrt(b.sub(c(1.0), b.pow(c(beta), tf)))),
                          b.sub(c(1.0), b.pow(c(alpha), tf)))
        rate = b.where(b.greater(t, _scalar(b, 0, t.dtype)), corrected, _as(b, r, dt))
        x_new = b.sub(x, b.mul(rate, b.div(v_new, b.add(b.sqrt(h_new), c(eps)))))
        xs.append(b.mul(c(1.0 - post), x_new) if post else x_new)
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


# --------------------------------------------------------------------------------------
# DFT and STFT: a matrix product with a constant table of twiddle factors


def _dft(b: Builder, x: Value, axis: int, length: int, inverse: bool, onesided: bool) -> Value:
    """The DFT of ``x`` (trailing dim 1: real, 2: complex) along ``axis``, computed in f64.

    Forward: out_j = sum_i x_i e^{-2 pi i ij/L}, the first L//2+1 bins when one-sided.
    Inverse: out_j = (1/L) sum_i x_i e^{+2 pi i ij/L}; one-sided input is the half spectrum of a
    real signal (each bin but the first and the Nyquist one stands for its mirror too) and gives
    a real output."""
    rank = x.type.rank
    perm = [k for k in range(rank - 1) if k != axis] + [axis, rank - 1]
    xt = b.transpose(x, perm=perm) if perm != list(range(rank)) else x
    parts = xt.shape[-1]
    n_in = xt.shape[-2]
    real_out = inverse and onesided
    rows = min(n_in, length // 2 + 1 if real_out else length)
    cols = length // 2 + 1 if onesided and not inverse else length
    i = np.arange(rows, dtype=np.int64)[:, None]
    j = np.arange(cols, dtype=np.int64)[None, :]
    angle = (2.0 * np.pi / length) * ((i * j) % length)
    sign = 1.0 if inverse else -1.0
    weight = np.ones((rows, 1))
    if real_out:
        weight[1:] = 2.0
        if length % 2 == 0 and rows > length // 2:
            weight[length // 2] = 1.0
    scale = weight / length if inverse else weight
    cos_t = b.const(np.cos(angle) * scale)
    sin_t = b.const(sign * np.sin(angle) * scale)

    def component(k: int) -> Value:
        v = _as(b, _take(b, xt, rank - 1, k), DType.f64)
        return _slice(b, v, -1, 0, rows) if n_in != rows else v

    re = component(0)
    out_re = b.matmul(re, cos_t)
    out_im = b.matmul(re, sin_t)
    if parts == 2:
        im = component(1)
        out_re = b.sub(out_re, b.matmul(im, sin_t))
        out_im = b.add(out_im, b.matmul(im, cos_t))
    out = _unsqueeze(b, out_re, -1) if real_out else _stack(b, [out_re, out_im], -1)
    out = _as(b, out, x.dtype)
    inv = [perm.index(k) for k in range(rank)]
    return b.transpose(out, perm=inv) if inv != list(range(rank)) else out


@onnx_op("DFT", emits=("transpose", "gather", "cast", "slice", "matmul", "add", "sub", "concat", "reshape"))
def dft(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    rank = x.type.rank
    if ctx.opset >= 20:
        axis = int(_static_scalar(ctx, 2)) if ctx.has_input(2) else -2
    else:
        axis = ctx.attr_int("axis", 1)
    axis = norm_axis(axis, rank)
    if axis == rank - 1:
        raise ctx.unsupported("the axis cannot be the trailing real/imaginary axis")
    if x.shape[-1] not in (1, 2) or not isinstance(x.shape[axis], int):
        raise ctx.unsupported(f"needs a static signal axis and a trailing dim of 1 or 2, got {x.type}")
    inverse, onesided = bool(ctx.attr_int("inverse", 0)), bool(ctx.attr_int("onesided", 0))
    n = int(x.shape[axis])
    if ctx.has_input(1):
        length = int(_static_scalar(ctx, 1))
    else:
        length = 2 * (n - 1) if inverse and onesided else n
    if length <= 0:
        raise ctx.unsupported(f"dft_length {length}")
    return _dft(ctx.b, x, axis, length, inverse, onesided)


@onnx_op("STFT", emits=("gather", "mul", "reshape", "transpose", "cast", "matmul", "add", "sub", "concat"))
def stft(ctx: NodeCtx) -> Value:
    """Frames of the signal (gathered by a constant index table), windowed, then one DFT per frame."""
    b = ctx.b
    x = ctx.input(0)
    if x.type.rank != 3 or not isinstance(x.shape[1], int):
        raise ctx.unsupported(f"the signal must be [batch, length, 1 or 2] with a static length, got {x.type}")
    step = int(_static_scalar(ctx, 1))
    window = ctx.input(2) if ctx.has_input(2) else None
    if ctx.has_input(3):
        frame = int(_static_scalar(ctx, 3))
    elif window is not None and isinstance(window.shape[0], int):
        frame = int(window.shape[0])
    else:
        raise ctx.unsupported("needs a frame_length or a window of static size")
    frames = 1 + (int(x.shape[1]) - frame) // step
    if step <= 0 or frame <= 0 or frames <= 0:
        raise ctx.unsupported(f"frame_step {step} and frame_length {frame} on a signal of {x.shape[1]}")
    idx = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(frame, dtype=np.int64)[None, :]
    framed = b.gather(x, b.const(idx), axis=1)  # [B, frames, frame, c]
    if window is not None:
        framed = b.mul(framed, _reshape(b, _as(b, window, x.dtype), [1, 1, frame, 1]))
    return _dft(b, framed, 2, frame, False, bool(ctx.attr_int("onesided", 1)))


# --------------------------------------------------------------------------------------
# AffineGrid: a constant grid of normalized coordinates times theta


@onnx_op("AffineGrid", emits=("cast", "matmul", "reshape"))
def affine_grid(ctx: NodeCtx) -> Value:
    """grid[n, *p] = theta[n] @ (x, y[, z], 1) over the normalized output coordinates p (in f64)."""
    b = ctx.b
    theta = ctx.input(0)
    size = [int(d) for d in np.asarray(ctx.static(1)).tolist()]
    spatial = size[2:]
    if len(spatial) not in (2, 3) or any(d <= 0 for d in spatial):
        raise ctx.unsupported(f"size {size} (2-D or 3-D, positive)")
    align = bool(ctx.attr_int("align_corners", 0))

    def coords(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.array([-1.0])
        return (2.0 * np.arange(n) + 1.0) / n - 1.0

    mesh = np.meshgrid(*(coords(n) for n in spatial), indexing="ij")  # one per axis, outermost first
    points = np.stack([*reversed(mesh), np.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    grid = b.matmul(b.const(points), _as(b, theta, DType.f64), transpose_b=True)  # [N, P, k]
    out = b.reshape(grid, shape=[theta.shape[0], *spatial, len(spatial)])
    return _as(b, out, theta.dtype)


@onnx_op("MelWeightMatrix", emits=("const",))
def mel_weight_matrix(ctx: NodeCtx) -> Value:
    """Triangular mel filters over the DFT bins: every operand is a compile-time scalar, so the
    matrix is a constant (the ONNX spec's construction, bin edges truncated to integers)."""
    mels, length = int(_static_scalar(ctx, 0)), int(_static_scalar(ctx, 1))
    rate = int(_static_scalar(ctx, 2))
    low, high = float(_static_scalar(ctx, 3)), float(_static_scalar(ctx, 4))
    dtype = ONNX_DTYPES.get(ctx.attr_int("output_datatype", 1))
    if dtype is None or mels <= 0 or length <= 0 or rate <= 0:
        raise ctx.unsupported(f"num_mel_bins {mels}, dft_length {length}, sample_rate {rate}")

    def to_mel(hz: float) -> float:
        return 2595.0 * np.log1p(hz / 700.0) / np.log(10.0)

    lo_mel, hi_mel = to_mel(low), to_mel(high)
    points = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    hz = 700.0 * np.expm1(points / 2595.0 * np.log(10.0))
    edges = (((length + 1) * hz) // rate).astype(np.int64)
    table = np.zeros((length // 2 + 1, mels))
    for m in range(mels):
        left, center, right = (int(e) for e in edges[m:m + 3])
        if center == left:
            table[center, m] = 1.0
        else:
            table[left:center + 1, m] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            table[center:right, m] = (right - np.arange(center, right)) / (right - center)
    return ctx.b.const(table.astype(dtype.np))


@onnx_op("ArrayFeatureExtractor", domain="ai.onnx.ml", emits=("gather", "reshape"))
def array_feature_extractor(ctx: NodeCtx) -> Value:
    """x[..., indices] along the last axis, indices flattened; a vector input gives one row."""
    b = ctx.b
    x, idx = ctx.input(0), ctx.input(1)
    count = 1
    for d in idx.shape:
        count = count * d
    flat = _reshape(b, idx, [count])
    out = b.gather(x, flat, axis=x.type.rank - 1)
    return _reshape(b, out, [1, count]) if x.type.rank == 1 else out


# --------------------------------------------------------------------------------------
# GridSample: per-axis taps and weights, one gather per combination of taps

_CUBIC_A = -0.75


class _Arith:
    """Scalar-constant arithmetic on tensors of one dtype (keeps the sampling formulas readable)."""

    def __init__(self, b: Builder, dtype: DType) -> None:
        self.b, self.dt = b, dtype

    def c(self, v: float) -> Value:
        return _scalar(self.b, v, self.dt)

    def add(self, x: Value, y: Value | float) -> Value:
        return self.b.add(x, y if isinstance(y, Value) else self.c(y))

    def sub(self, x: Value | float, y: Value | float) -> Value:
        return self.b.sub(x if isinstance(x, Value) else self.c(x), y if isinstance(y, Value) else self.c(y))

    def mul(self, x: Value, y: Value | float) -> Value:
        return self.b.mul(x, y if isinstance(y, Value) else self.c(y))

    def reflect(self, x: Value, lo: float, hi: float) -> Value:
        """Fold x back into [lo, hi] by mirroring at the bounds (values inside stay)."""
        b = self.b
        span = hi - lo
        if span <= 0:
            return self.add(self.mul(x, 0.0), lo)
        below, above = b.less(x, self.c(lo)), b.greater(x, self.c(hi))
        dist = b.where(below, self.sub(lo, x), self.sub(x, hi))
        folds = b.floor(b.div(dist, self.c(span)))
        rest = self.sub(dist, self.mul(folds, span))
        even = b.equal(b.mod(folds, self.c(2.0)), self.c(0.0))
        from_lo = b.where(even, self.add(rest, lo), self.sub(hi, rest))
        from_hi = b.where(even, self.sub(hi, rest), self.add(rest, lo))
        return b.where(below, from_lo, b.where(above, from_hi, x))


def _cubic_weights(ar: _Arith, t: Value) -> list[Value]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = _CUBIC_A
    t1, u, u1 = ar.add(t, 1.0), ar.sub(1.0, t), ar.sub(2.0, t)

    def far(s: Value) -> Value:  # |s| in [1, 2)
        return ar.sub(ar.mul(ar.add(ar.mul(ar.sub(ar.mul(s, a), 5 * a), s), 8 * a), s), 4 * a)

    def near(s: Value) -> Value:  # |s| in [0, 1)
        return ar.add(ar.mul(ar.mul(ar.sub(ar.mul(s, a + 2), a + 3), s), s), 1.0)

    return [far(t1), near(t), near(u), far(u1)]


@onnx_op("GridSample", emits=("gather", "gather_elements", "mul", "add", "sub", "div", "floor", "round", "clip",
                              "less", "greater", "greater_equal", "where", "mod", "equal", "cast", "reshape",
                              "expand", "logical_and", "logical_or"))
def grid_sample(ctx: NodeCtx) -> Value:
    """Sample x at the grid's normalized coordinates (nearest, linear or cubic; zeros, border or
    reflection padding). Nearest rounds half to even; a reflected coordinate is folded at the
    bounds as many times as it takes."""
    b = ctx.b
    x, grid = ctx.input(0), ctx.input(1)
    mode = ctx.attr_str("mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = ctx.attr_str("padding_mode", "zeros")
    align = bool(ctx.attr_int("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"mode {mode!r} with padding_mode {padding!r}")
    sizes = _dims_int(x, ctx, "GridSample")[2:]
    rank = len(sizes)
    if rank < 1 or grid.shape[-1] != rank:
        raise ctx.unsupported(f"grid {grid.type} does not match the {rank} spatial dims of {x.type}")
    n, ch = x.shape[0], x.shape[1]
    out_sp = list(grid.shape[1:-1])
    ar = _Arith(b, grid.dtype)

    # per spatial axis: the taps as (index i64, weight or None, in-bounds mask or None)
    per_axis: list[list[tuple[Value, Value | None, Value | None]]] = []
    for a, size in enumerate(sizes):
        g = _take(b, grid, grid.type.rank - 1, rank - 1 - a)  # the grid lists x (innermost axis) first
        pos = ar.mul(ar.add(g, 1.0), (size - 1) / 2.0) if align else ar.mul(ar.sub(ar.mul(ar.add(g, 1.0), size),
                                                                                     1.0), 0.5)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            pos = b.round(pos)
        # cubic pads only its taps (as ONNX Runtime and PyTorch do); the others pad the coordinate first
        if padding == "border" and mode != "cubic":
            outside = b.logical_or(b.less(pos, ar.c(lo)), b.greater(pos, ar.c(hi)))
            pos = b.where(outside, b.clip(pos, min=0.0, max=size - 1.0), pos)
        elif padding == "reflection" and mode != "cubic":
            pos = ar.reflect(pos, lo, hi)
        if mode == "nearest":
            starts, weights = [pos], [None]
        else:
            base = b.floor(pos)
            frac = ar.sub(pos, base)
            if mode == "linear":
                starts, weights = [base, ar.add(base, 1.0)], [ar.sub(1.0, frac), frac]
            else:
                starts = [ar.add(base, float(k)) for k in (-1, 0, 1, 2)]
                weights = _cubic_weights(ar, frac)
        taps = []
        for tap, w in zip(starts, weights, strict=True):
            valid = None
            if padding == "zeros":
                valid = b.logical_and(b.greater_equal(tap, ar.c(0.0)), b.less(tap, ar.c(size - 0.5)))
            elif padding == "reflection":
                tap = ar.reflect(tap, lo, hi)
            idx = b.cast(b.clip(tap, min=0.0, max=size - 1.0), to=DType.i64)
            taps.append((idx, w, valid))
        per_axis.append(taps)

    strides = [int(np.prod(sizes[a + 1:])) for a in range(rank)]
    flat_x = b.reshape(x, shape=[n, ch, int(np.prod(sizes))])
    q = 1
    for d in out_sp:
        q = q * d
    total: Value | None = None
    for combo in itertools.product(*per_axis):
        flat: Value | None = None
        weight: Value | None = None
        valid: Value | None = None
        for (idx, w, ok), stride in zip(combo, strides, strict=True):
            term = b.mul(idx, _scalar(b, stride, DType.i64)) if stride != 1 else idx
            flat = term if flat is None else b.add(flat, term)
            if w is not None:
                weight = w if weight is None else b.mul(weight, w)
            if ok is not None:
                valid = ok if valid is None else b.logical_and(valid, ok)
        assert flat is not None
        gathered = b.gather_elements(flat_x, b.expand(b.reshape(flat, shape=[n, 1, q]), shape=[n, ch, q]), axis=2)
        vals = b.reshape(gathered, shape=[n, ch, *out_sp])
        if valid is not None:
            vals = b.where(b.reshape(valid, shape=[n, 1, *out_sp]), vals, _scalar(b, 0.0, x.dtype))
        if weight is not None:
            vals = b.mul(vals, b.reshape(_as(b, weight, x.dtype), shape=[n, 1, *out_sp]))
        total = vals if total is None else b.add(total, vals)
    assert total is not None
    return total


@onnx_op("Col2Im", emits=("reshape", "fill", "expand", "scatter_elements", "slice"))
def col2im(ctx: NodeCtx) -> Value:
    """Sum each column entry into the image position its block offset and location give (a
    scatter-add through a constant index table), then crop the padding."""
    b = ctx.b
    x = ctx.input(0)
    image = [int(d) for d in np.asarray(ctx.static(1)).tolist()]
    block = [int(d) for d in np.asarray(ctx.static(2)).tolist()]
    r = len(image)
    strides = ctx.attr_ints("strides", [1] * r)
    dilations = ctx.attr_ints("dilations", [1] * r)
    pads = ctx.attr_ints("pads", [0] * (2 * r))
    n, cb, length = x.shape
    if len(block) != r or any(v <= 0 for v in [*image, *block, *strides, *dilations]) or not isinstance(cb, int):
        raise ctx.unsupported(f"image_shape {image}, block_shape {block}, strides {strides}, dilations {dilations}")
    padded = [image[a] + pads[a] + pads[a + r] for a in range(r)]
    counts = [(padded[a] - dilations[a] * (block[a] - 1) - 1) // strides[a] + 1 for a in range(r)]
    blocks, locations = int(np.prod(block)), int(np.prod(counts))
    if cb % blocks or length != locations:
        raise ctx.unsupported(f"input {x.type} does not hold {blocks} offsets x {locations} locations")
    channels = cb // blocks
    offs = np.stack(np.unravel_index(np.arange(blocks), block), axis=-1)  # [B, r]
    locs = np.stack(np.unravel_index(np.arange(locations), counts), axis=-1)  # [L, r]
    pos = offs[:, None, :] * np.array(dilations) + locs[None, :, :] * np.array(strides)  # [B, L, r]
    flat = np.ravel_multi_index(tuple(pos.reshape(-1, r).T), padded).astype(np.int64)  # [B*L]
    total = int(np.prod(padded))
    updates = b.reshape(x, shape=[n, channels, blocks * locations])
    idx = b.expand(b.const(flat.reshape(1, 1, -1)), shape=[n, channels, blocks * locations])
    out = b.scatter_elements(_fill(b, [n, channels, total], 0.0, x.dtype), idx, updates, axis=2, reduction="add")
    out = b.reshape(out, shape=[n, channels, *padded])
    if any(pads):
        rank = 2 + r
        out = b.slice(out, starts=[0, 0, *pads[:r]], ends=[n, channels, *(pads[a] + image[a] for a in range(r))],
                      steps=[1] * rank)
    return out
