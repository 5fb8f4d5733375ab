"""ONNX RNN, GRU and LSTM (and ONNX Runtime's DynamicQuantizeLSTM): unrolled over a static sequence
length, a ``loop`` over a symbolic one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import (
    MAX_UNROLL,
    block_args,
    cast_to,
    fill,
    positions,
    reshape_to,
    scalar,
    split_equal,
    stack,
    take,
)
from cuvil.frontend.onnx_ops.quant import DYNAMIC_PRODUCT_EMITS, dynamic_quantized_product
from cuvil.ir.dtypes import DType
from cuvil.ir.region import close_body
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

_ALPHA_DEFAULT = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "ScaledTanh": 1.0, "HardSigmoid": 0.2,
                  "Elu": 1.0, "Affine": 1.0}
_BETA_DEFAULT = {"ScaledTanh": 1.0, "HardSigmoid": 0.5, "Affine": 0.0}

Activation = Callable[[Value], Value]
Step = Callable[[int | Value, Value, list[Value]], list[Value]]
"""One time step: (its index, the step's projected input, states) -> new states, the hidden state first."""
Product = Callable[[Value], Value]
"""Rows [..., K] times one direction's weights: [..., G*H]."""
_RECURRENT_EMITS = ("matmul", "add", "mul", "sub", "gather", "split", "where", "less", "concat", "reshape", "fill",
                    "relu", "sigmoid", "tanh", "leaky_relu", "thresholded_relu", "elu", "softsign", "softplus",
                    "hardsigmoid", "clip", "loop", "cast")


def activation_fn(ctx: NodeCtx, name: str, alpha: float | None, beta: float | None) -> Activation:
    """The named ONNX activation (case-insensitive) as a function, ``alpha`` / ``beta`` None for its defaults."""
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
        return lambda x: b.add(b.mul(x, scalar(b, a, x.dtype)), scalar(b, be, x.dtype))
    return lambda x: b.mul(b.tanh(b.mul(x, scalar(b, be, x.dtype))), scalar(b, a, x.dtype))  # ScaledTanh


class _Recurrence:
    """What RNN, GRU and LSTM share: layout, directions, weights per direction, masks, outputs."""

    def __init__(self, ctx: NodeCtx, default_acts: Sequence[str], hidden_axis: int = -1) -> None:
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
        self.hidden = ctx.attr_int("hidden_size", None) or self.r.shape[hidden_axis]
        seq: Dim = x.shape[0]
        if isinstance(seq, int):  # a static length is unrolled; a symbolic one becomes a loop
            if seq > MAX_UNROLL:
                raise ctx.unsupported(f"more than {MAX_UNROLL} time steps cannot be unrolled")
            ctx.imp.charge_unroll(seq, ctx.location)
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
        acts = [activation_fn(ctx, n, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
                for k, n in enumerate(names)]
        self.acts = [acts[d * per_dir:(d + 1) * per_dir] for d in range(self.dirs)]
        self.lens = ctx.input(4) if ctx.has_input(4) else None

    def initial(self, index: int, d: int) -> Value:
        if self.ctx.has_input(index):
            h0 = self.ctx.input(index)
            if self.layout:
                h0 = self.b.transpose(h0, perm=[1, 0, 2])
            return take(self.b, h0, 0, d)
        return fill(self.b, [self.batch, self.hidden], 0.0, self.dt)

    def weights(self, d: int) -> tuple[Value, Value, Value | None, Value | None]:
        """W_d [G*H, in], R_d [G*H, H], and the input/recurrent biases [G*H] (None when absent)."""
        return take(self.b, self.w, 0, d), take(self.b, self.r, 0, d), *self.biases(d)

    def biases(self, d: int) -> tuple[Value | None, Value | None]:
        """Wb_d and Rb_d [G*H] (None when absent)."""
        if not self.ctx.has_input(3):
            return None, None
        wb, rb = split_equal(self.b, take(self.b, self.ctx.input(3), 0, d), 0, 2)
        return wb, rb

    def fused_bias(self, d: int) -> Value | None:
        """Wb + Rb [G*H] of direction d (None when there is no bias)."""
        wb, rb = self.biases(d)
        return self.b.add(wb, rb) if wb is not None and rb is not None else None

    def projected_inputs(self, w: Value, wb: Value | None) -> Value:
        """X W^T (+ Wb) for every step at once: [seq, batch, G*H]."""
        xw = self.b.matmul(self.x, w, transpose_b=True)
        return self.b.add(xw, wb) if wb is not None else xw

    def clipped(self, x: Value) -> Value:
        return self.b.clip(x, min=-self.clip, max=self.clip) if self.clip is not None else x

    def mask(self, t: int | Value) -> Value | None:
        """[batch, 1]: whether step t is inside each sequence (None when all are full length)."""
        if self.lens is None:
            return None
        b = self.b
        step = scalar(b, t, self.lens.dtype) if isinstance(t, int) else cast_to(b, t, self.lens.dtype)
        inside = b.less(step, self.lens)
        return reshape_to(b, inside, [self.batch, 1])

    def keep(self, mask: Value | None, new: Value, old: Value) -> Value:
        return new if mask is None else self.b.where(mask, new, old)

    def outputs(self, ys: list[Value], finals: list[list[Value]]) -> list[Value | None]:
        """Y [seq, dirs, batch, H] from each direction's [seq, batch, H], plus one [dirs, batch, H] per
        final state (layout 1 swaps batch first)."""
        b = self.b
        y = stack(b, ys, 1)
        states = [stack(b, list(f), 0) for f in zip(*finals, strict=True)]
        if self.layout:
            y = b.transpose(y, perm=[2, 0, 1, 3])
            states = [b.transpose(s, perm=[1, 0, 2]) for s in states]
        outs: list[Value | None] = [y, *states]
        return outs[:max(1, self.ctx.num_outputs)]

    def within_longest(self) -> Value:
        """X with the steps past the longest sequence zeroed (they are no step of any sequence)."""
        if self.lens is None:
            return self.x
        b = self.b
        longest = b.reduce_max(self.lens, axes=[], keepdims=False)
        inside = b.less(positions(b, [self.seq, 1, 1], self.lens.dtype), longest)
        return b.where(inside, self.x, scalar(b, 0.0, self.dt))

    def previous_output(self, t: int | Value, h: Value) -> Value:
        """h as step t-1 output it: zero in the sequences that ended before that step."""
        if self.lens is None:
            return h
        b = self.b
        step = scalar(b, t, self.lens.dtype) if isinstance(t, int) else cast_to(b, t, self.lens.dtype)
        return self.zero_out(reshape_to(b, b.less_equal(step, self.lens), [self.batch, 1]), h)

    def realigned(self, v: Value) -> Value:
        """v [seq, batch, F] with each sequence reversed within its own length (steps past it stay):
        a reverse direction run forward, each sequence starting at its own last step. An involution."""
        assert self.lens is not None
        b = self.b
        dt = self.lens.dtype
        t = positions(b, [self.seq, 1], dt)
        lens = reshape_to(b, self.lens, [1, self.batch])
        idx = b.where(b.less(t, lens), b.sub(b.sub(lens, scalar(b, 1, dt)), t), t)
        idx = b.expand(reshape_to(b, cast_to(b, idx, DType.i64), [self.seq, self.batch, 1]), shape=list(v.shape))
        return b.gather_elements(v, idx, axis=0)

    def zero_out(self, mask: Value | None, h: Value) -> Value:
        if mask is None:
            return h
        return self.b.where(mask, h, scalar(self.b, 0.0, self.dt))

    def advance(self, t: int | Value, xt: Value, state: list[Value], step: Step) -> tuple[Value, list[Value]]:
        """One step, each state kept as it was past a sequence's end: the step's output (the hidden
        state, zero past the end) and the states after it. The first state is H."""
        new = step(t, xt, state)
        m = self.mask(t)
        return self.zero_out(m, new[0]), [self.keep(m, n, old) for n, old in zip(new, state, strict=True)]

    def unroll(self, reverse: bool, state: list[Value], xw: Value, step: Step) -> tuple[Value, list[Value]]:
        """``step`` over the static time steps: the outputs [seq, batch, H] and final states."""
        assert isinstance(self.seq, int)
        per_t: dict[int, Value] = {}
        for t in (reversed(range(self.seq)) if reverse else range(self.seq)):
            per_t[t], state = self.advance(t, take(self.b, xw, 0, t), state, step)
        return stack(self.b, [per_t[t] for t in range(self.seq)], 0), state

    def loop(self, reverse: bool, state: list[Value], xw: Value, step: Step) -> tuple[Value, list[Value]]:
        """``step`` as the body of a ``loop`` over a symbolic number of steps, scanning ``xw``;
        everything the step reads from outside (weights, biases) is captured as a loop invariant."""
        b = self.b
        t, args = block_args([*(s.type for s in state), TensorType(xw.dtype, xw.shape[1:])])
        hs, xt = args[:-1], args[-1]
        y, kept = self.advance(t, xt, hs, step)
        body, captured = close_body([t, *hs, xt], [*kept, y])
        operands = [*state, xw, *captured]
        attrs = {"body": body, "carried": len(state), "scanned": 1, "trips": (self.seq,),
                 "reverse": reverse}
        finals = [b.loop(*operands, **attrs, output=k) for k in range(len(state))]
        return b.loop(*operands, **attrs, output=len(state)), finals

    def run(self, direction: Callable[[int], tuple[list[Value], Value, Step]],
            ends_aligned: bool = False) -> list[Value | None]:
        """Every direction (``direction(d)``: its initial states, projected inputs [seq, batch, G*H] and
        step) unrolled or looped into the op's outputs. ``ends_aligned``: a reverse direction over
        sequences of given lengths steps every sequence from its own end at once (see :meth:`realigned`),
        as ONNX Runtime does; only a step that mixes the batch's rows can tell."""
        ys, finals = [], []
        over = self.unroll if isinstance(self.seq, int) else self.loop
        for d in range(self.dirs):
            state, xw, step = direction(d)
            realign = ends_aligned and self.reverse[d] and self.lens is not None
            if realign:
                y, final = over(False, state, self.realigned(xw), step)
                y = self.realigned(y)
            else:
                y, final = over(self.reverse[d], state, xw, step)
            ys.append(y)
            finals.append(final)
        return self.outputs(ys, finals)


@onnx_op("RNN", emits=_RECURRENT_EMITS)
def rnn(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Tanh"])
    b = ctx.b

    def direction(d: int) -> tuple[list[Value], Value, Step]:
        w, r, wb, rb = rec.weights(d)
        xw = rec.projected_inputs(w, wb)
        (f,) = rec.acts[d]

        def step(_t: int | Value, xt: Value, state: list[Value]) -> list[Value]:
            (h,) = state
            pre = b.add(xt, b.matmul(h, r, transpose_b=True))
            if rb is not None:
                pre = b.add(pre, rb)
            return [f(rec.clipped(pre))]

        return [rec.initial(5, d)], xw, step

    return rec.run(direction)


@onnx_op("GRU", emits=_RECURRENT_EMITS)
def gru(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Sigmoid", "Tanh"])
    b = ctx.b
    linear_before_reset = bool(ctx.attr_int("linear_before_reset", 0))

    def direction(d: int) -> tuple[list[Value], Value, Step]:
        w, r, wb, rb = rec.weights(d)
        xw = rec.projected_inputs(w, wb)
        rz, rr, rh = split_equal(b, r, 0, 3)
        rbz, rbr, rbh = split_equal(b, rb, 0, 3) if rb is not None else (None, None, None)
        f, g = rec.acts[d]
        h0 = rec.initial(5, d)
        one = scalar(b, 1.0, rec.dt)

        def gate(xg: Value, rg: Value, bg: Value | None, state: Value) -> Value:
            pre = b.add(xg, b.matmul(state, rg, transpose_b=True))
            return b.add(pre, bg) if bg is not None else pre

        def step(_t: int | Value, xt: Value, state: list[Value]) -> list[Value]:
            (h,) = state
            xz, xr, xh = split_equal(b, xt, 1, 3)
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
            return [b.add(b.mul(b.sub(one, z), cand), b.mul(z, h))]

        return [h0], xw, step

    return rec.run(direction)


def _lstm(ctx: NodeCtx, rec: _Recurrence, products: Callable[[int], tuple[Product, Product]],
          quantized: bool = False) -> list[Value | None]:
    """LSTM over every direction, ``products(d)`` giving direction d's input and recurrent products
    (X -> X W^T, H -> H R^T). Each gate's pre-activation is (X W^T + H R^T) + its peephole term + (Wb + Rb),
    in ONNX Runtime's order. ``quantized``: the recurrent product quantizes the batch's H together, so
    what the ended sequences' rows hold counts: ONNX Runtime's kernel reads the previous step's output
    there, zero in the sequences already ended, where the op outputs Y (else the last H)."""
    b = ctx.b
    input_forget = bool(ctx.attr_int("input_forget", 0))
    fed_output = quantized and ctx.num_outputs > 0 and bool(ctx.node.output[0])
    one = scalar(b, 1.0, rec.dt)

    def direction(d: int) -> tuple[list[Value], Value, Step]:
        x_product, h_product = products(d)
        xw = x_product(rec.x)
        bias = rec.fused_bias(d)
        biases: list[Value | None] = list(split_equal(b, bias, 0, 4)) if bias is not None else [None] * 4
        peep = split_equal(b, take(b, ctx.input(7), 0, d), 0, 3) if ctx.has_input(7) else None
        f, g, hact = rec.acts[d]

        def gate(pre: Value, k: int, act: Activation, peephole: Value | None = None,
                 cell: Value | None = None) -> Value:
            if peephole is not None and cell is not None:
                pre = b.add(pre, b.mul(peephole, cell))
            bk = biases[k]
            return act(rec.clipped(b.add(pre, bk) if bk is not None else pre))

        def step(t: int | Value, xt: Value, state: list[Value]) -> list[Value]:
            h, c = state
            pre = b.add(xt, h_product(rec.previous_output(t, h) if fed_output else h))
            pi, po, pf, pc = split_equal(b, pre, 1, 4)
            p_i, p_o, p_f = peep if peep is not None else (None, None, None)
            it = gate(pi, 0, f, p_i, c)
            ft = b.sub(one, it) if input_forget else gate(pf, 2, f, p_f, c)
            c_new = b.add(b.mul(ft, c), b.mul(it, gate(pc, 3, g)))
            ot = gate(po, 1, f, p_o, c_new)
            return [b.mul(ot, hact(c_new)), c_new]

        return [rec.initial(5, d), rec.initial(6, d)], xw, step

    return rec.run(direction, ends_aligned=quantized)


@onnx_op("LSTM", emits=_RECURRENT_EMITS)
def lstm(ctx: NodeCtx) -> list[Value | None]:
    rec = _Recurrence(ctx, ["Sigmoid", "Tanh", "Tanh"])
    b = ctx.b

    def products(d: int) -> tuple[Product, Product]:
        w, r, _, _ = rec.weights(d)
        return (lambda x: b.matmul(x, w, transpose_b=True)), (lambda h: b.matmul(h, r, transpose_b=True))

    return _lstm(ctx, rec, products)


@onnx_op("DynamicQuantizeLSTM", domain="com.microsoft",
         emits=(*_RECURRENT_EMITS, *DYNAMIC_PRODUCT_EMITS, "iota", "less_equal", "expand", "gather_elements"))
def dynamic_quantize_lstm(ctx: NodeCtx) -> list[Value | None]:
    """ONNX Runtime's contrib LSTM with int8/uint8 weights W [dirs, input, 4H] and R [dirs, H, 4H]
    (transposed from LSTM's), their scales and zero points per direction ([dirs]) or per column
    ([dirs, 4H]). Both products quantize their float operand to u8 on the fly: X once for all the steps
    (up to the longest sequence), H at every step over the whole batch (ONNX Runtime run on one thread;
    with more it may quantize parts of a larger batch apart)."""
    rec = _Recurrence(ctx, ["Sigmoid", "Tanh", "Tanh"], hidden_axis=1)
    b = ctx.b
    for name, v in (("W", rec.w), ("R", rec.r)):
        if v.type.rank != 3 or v.shape[2] != 4 * rec.hidden:
            raise ctx.unsupported(f"{name} of shape {v.type} (expected [dirs, K, 4*{rec.hidden}])")
    rec.x = rec.within_longest()  # the quantization range covers the steps the kernel runs

    def products(d: int) -> tuple[Product, Product]:
        w, r = take(b, rec.w, 0, d), take(b, rec.r, 0, d)
        ws, wz, rs, rz = (take(b, ctx.input(i), 0, d) for i in (8, 9, 10, 11))
        return (lambda x: dynamic_quantized_product(b, x, w, ws, wz)), \
            (lambda h: dynamic_quantized_product(b, h, r, rs, rz))

    return _lstm(ctx, rec, products, quantized=True)
