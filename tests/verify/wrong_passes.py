"""A corpus of deliberately wrong passes, each modelled on a real miscompilation, written only
against the public pass API (``cuvil.passes.Pass``, ``cuvil.passes.ValueRewrite``) and the Builder,
with the small model each one is applied to. Every entry must be refuted with a counterexample
that replays."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from cuvil.passes import Contract, FunctionPass, Pass, ValueRewrite

RNG = np.random.default_rng(11)

_ModelBuilder = Callable[..., Module]


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _seeded(make: _ModelBuilder) -> _ModelBuilder:
    """The model's constants depend only on its builder, not on which models were built before."""

    @functools.wraps(make)
    def build(*args: object, **kwargs: object) -> Module:
        RNG.bit_generator.state = np.random.default_rng(zlib.crc32(make.__name__.encode())).bit_generator.state
        return make(*args, **kwargs)

    return build


def _one_input(shape: list[int], body: Callable[[Builder, Value], Value]) -> Module:
    """The model most entries need: one f32 input ``x`` and the single result ``body(b, x)``."""
    b = Builder()
    x = b.param("x", DType.f32, shape)
    return b.module(b.function("main", [x], [body(b, x)]))


@dataclass(frozen=True)
class _Fold(ValueRewrite):
    """Rewrites an ``outer`` op whose first operand is an ``inner`` op, the shape most of these
    folds share; ``fold`` gets that inner value and may still decline."""

    outer: ClassVar[str] = ""
    inner: ClassVar[str] = ""

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != self.outer or operands[0].op != self.inner:
            return None
        return self.fold(v, operands[0], operands, b)

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------
# batch-norm folding


def _bn_scale(b: Builder, bn: Value, eps: bool = True) -> Value:
    _, scale, _, _, var = bn.operands
    denom = b.add(var, b.scalar(float(bn.attr("epsilon")), DType.f32)) if eps else var
    return b.mul(scale, b.rsqrt(denom))


@dataclass(frozen=True)
class BatchNormFoldWithoutEps(_Fold):
    """Folds conv + batch_norm but forgets epsilon in the variance (a classic exporter bug)."""

    name = "wrong-bn-fold-no-eps"
    contract = Contract.REAL
    outer, inner = "batch_norm", "conv"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        x, w = inner.operands
        s = _bn_scale(b, v, eps=False)
        out_ch = int(w.type.shape[0])
        w2 = b.mul(w, b.reshape(s, shape=(out_ch, 1, 1, 1)))
        shape = (out_ch, 1, 1)
        _, _, bias, mean, _ = operands
        shift = b.sub(b.reshape(bias, shape=shape), b.mul(b.reshape(mean, shape=shape), b.reshape(s, shape=shape)))
        return b.add(b.conv(x, w2, **inner.attr_dict), shift)


@dataclass(frozen=True)
class BatchNormFoldWrongAxis(_Fold):
    """Folds matmul + batch_norm scaling the weight's rows (input features) instead of its columns."""

    name = "wrong-bn-fold-axis"
    contract = Contract.REAL
    outer, inner = "batch_norm", "matmul"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        x, w = inner.operands
        s = _bn_scale(b, v)
        rows = int(w.type.shape[0])
        w2 = b.mul(w, b.reshape(s, shape=(rows, 1)))  # should scale columns: shape (1, cols)
        _, _, bias, mean, _ = operands
        return b.add(b.matmul(x, w2), b.sub(bias, b.mul(mean, s)))


@_seeded
def conv_bn_model(cin: int = 3, cout: int = 5, hw: tuple[int, int] = (6, 4)) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, cin, *hw])
    w = b.const(_f(cout, cin, 3, 3))
    y = b.conv(x, w, pads=[1, 1, 1, 1])
    params = [b.const(RNG.uniform(0.5, 2.0, cout).astype(np.float32)), b.const(_f(cout)), b.const(_f(cout)),
              b.const(RNG.uniform(0.5, 2.0, cout).astype(np.float32))]
    return b.module(b.function("main", [x], [b.relu(b.batch_norm(y, *params, epsilon=1e-3))]))


@_seeded
def matmul_bn_model(n: int = 4) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, n])
    y = b.matmul(x, b.const(_f(n, n)))
    params = [b.const(RNG.uniform(0.5, 2.0, n).astype(np.float32)), b.const(_f(n)), b.const(_f(n)),
              b.const(RNG.uniform(0.5, 2.0, n).astype(np.float32))]
    return b.module(b.function("main", [x], [b.batch_norm(y, *params, epsilon=1e-5)]))


# --------------------------------------------------------------------------------------
# layout


@dataclass(frozen=True)
class DoubleTransposeDropsInner(_Fold):
    """Folds transpose(transpose(x, p), q) to transpose(x, q): the inner permutation is lost
    (the shapes still agree when the dims it swaps have equal sizes)."""

    name = "wrong-transpose-fold"
    contract = Contract.EXACT
    outer, inner = "transpose", "transpose"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        out = b.transpose(inner.operands[0], perm=v.attr("perm"))
        return out if out.type == v.type else None


@_seeded
def double_transpose_model() -> Module:
    return _one_input([4, 4, 3], lambda b, x: b.exp(b.transpose(b.transpose(x, perm=[1, 0, 2]), perm=[0, 2, 1])))


@dataclass(frozen=True)
class ReshapeColumnMajor(ValueRewrite):
    """Lowers reshape as if tensors were column-major (transpose, reshape, transpose back)."""

    name = "wrong-reshape-order"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "reshape" or operands[0].type.rank != 2 or v.type.rank != 2:
            return None
        x = operands[0]
        rows, cols = v.type.shape
        xt = b.transpose(x, perm=[1, 0])
        return b.transpose(b.reshape(xt, shape=(cols, rows)), perm=[1, 0])


@_seeded
def reshape_model() -> Module:
    return _one_input([4, 6], lambda b, x: b.reshape(x, shape=[3, 8]))


@dataclass(frozen=True)
class BroadcastAxisConfused(ValueRewrite):
    """Rewrites a row-bias add into a column-bias add (the axis the bias broadcasts along)."""

    name = "wrong-broadcast-axis"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "add" or operands[1].type.rank != 1 or operands[0].type.rank != 2:
            return None
        n = int(operands[1].type.shape[0])
        out = b.add(operands[0], b.reshape(operands[1], shape=(n, 1)))
        return out if out.type == v.type else None


@_seeded
def bias_model() -> Module:
    return _one_input([4, 4], lambda b, x: b.add(x, b.const(_f(4))))


@dataclass(frozen=True)
class ConcatOffsetWrong(ValueRewrite):
    """Lowers a two-way concat into padded copies, placing the second operand one column early."""

    name = "wrong-concat-offset"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "concat" or len(operands) != 2 or v.attr("axis") != 1:
            return None
        a, c = operands
        wa, wc = int(a.type.shape[1]), int(c.type.shape[1])
        left = b.pad(a, pads=[0, 0, 0, wc])
        right = b.pad(c, pads=[0, wa - 1, 0, 1])  # should be [0, wa, 0, 0]
        return b.add(left, right)


@_seeded
def concat_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    y = b.param("y", DType.f32, [2, 5])
    return b.module(b.function("main", [x, y], [b.concat(x, y, axis=1)]))


# --------------------------------------------------------------------------------------
# convolution


@dataclass(frozen=True)
class ConvPaddingOffByOne(ValueRewrite):
    """Makes a conv's padding explicit but pads two on the leading side and none on the trailing one."""

    name = "wrong-conv-padding"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "conv" or not any(v.attr("pads")):
            return None
        x, w = operands
        attrs = v.attr_dict
        attrs["pads"] = (0, 0, 0, 0)
        padded = b.pad(x, pads=[0, 0, 2, 2, 0, 0, 0, 0])  # should be [0, 0, 1, 1, 0, 0, 1, 1]
        return b.conv(padded, w, **attrs)


@_seeded
def conv_model(cin: int = 3, cout: int = 5) -> Module:
    return _one_input([2, cin, 5, 4], lambda b, x: b.conv(x, b.const(_f(cout, cin, 3, 3)), pads=[1, 1, 1, 1]))


# --------------------------------------------------------------------------------------
# fusion and activations


@dataclass(frozen=True)
class ActivationBeforeBias(_Fold):
    """Moves the activation of relu(matmul + bias) before the bias add (a broken epilogue order)."""

    name = "wrong-epilogue-order"
    contract = Contract.EXACT
    outer, inner = "relu", "add"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        if inner.operands[0].op != "matmul":
            return None
        mm, bias = inner.operands
        return b.add(b.relu(mm), bias)


@_seeded
def linear_relu_model() -> Module:
    return _one_input([3, 5], lambda b, x: b.relu(b.add(b.matmul(x, b.const(_f(5, 4))), b.const(_f(4)))))


@dataclass(frozen=True)
class Relu6AsRelu(ValueRewrite):
    """Fuses clip(x, 0, 6) as a plain relu, losing the upper bound."""

    name = "wrong-relu6"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "clip" and v.attr("min") == 0.0 and v.attr("max") == 6.0:
            return b.relu(operands[0])
        return None


@_seeded
def relu6_model() -> Module:
    return _one_input([3, 4], lambda b, x: b.clip(b.mul(x, b.scalar(4.0, DType.f32)), min=0.0, max=6.0))


@dataclass(frozen=True)
class DroppedClamp(ValueRewrite):
    """Drops a clip whose bounds it wrongly believes the input already satisfies."""

    name = "wrong-dropped-clamp"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        return operands[0] if v.op == "clip" else None


@_seeded
def clamp_model() -> Module:
    return _one_input([3, 5], lambda b, x: b.exp(b.clip(x, min=-1.0, max=1.0)))


@dataclass(frozen=True)
class AttributeBlindCSE(FunctionPass):
    """Merges ops with the same name and operands, ignoring attributes."""

    name = "wrong-cse-attributes"
    contract = Contract.EXACT

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        new: dict[Value, Value] = {}
        seen: dict[tuple, Value] = {}
        for v in fn.values():
            if v.is_param or v.is_const:
                new[v] = v
                continue
            operands = tuple(new[o] for o in v.operands)
            key = (v.op, tuple(id(o) for o in operands))
            if key in seen and seen[key].type == v.type:
                new[v] = seen[key]
                continue
            new[v] = seen[key] = b.op(v.op, *operands, **v.attr_dict)
        return Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names, fn.constraints)


@_seeded
def leaky_pair_model() -> Module:
    return _one_input([3, 4], lambda b, x: b.add(b.leaky_relu(x, alpha=0.1), b.leaky_relu(x, alpha=0.3)))


@dataclass(frozen=True)
class AddZeroRemoved(ValueRewrite):
    """Drops ``x + 0.0``: equal over the reals, but -0.0 + 0.0 is +0.0."""

    name = "wrong-add-zero"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "add" and operands[1].is_const and operands[0].type == v.type \
                and bool(np.all(np.asarray(b.data(operands[1])) == 0)):
            return operands[0]
        return None


@_seeded
def add_zero_model() -> Module:
    return _one_input([2, 3], lambda b, x: b.add(b.neg(x), b.scalar(0.0, DType.f32)))


@dataclass(frozen=True)
class SoftmaxWithoutMaxShift(ValueRewrite):
    """Decomposes softmax as exp(x) / sum(exp(x)): equal over the reals, overflows for large x."""

    name = "wrong-softmax-no-shift"
    contract = Contract.REAL

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "softmax":
            return None
        e = b.exp(operands[0])
        return b.div(e, b.reduce_sum(e, axes=[v.attr("axis")], keepdims=True))


@_seeded
def softmax_model() -> Module:
    return _one_input([2, 5], lambda b, x: b.softmax(x, axis=1))


@dataclass(frozen=True)
class MeanAsSum(ValueRewrite):
    """Lowers reduce_mean as a sum without the division by the element count."""

    name = "wrong-mean-as-sum"
    contract = Contract.REAL

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "reduce_mean":
            return None
        return b.reduce_sum(operands[0], **v.attr_dict)


@_seeded
def pooled_model() -> Module:
    return _one_input([2, 3, 4, 5], lambda b, x: b.reduce_mean(x, axes=[2, 3], keepdims=True))


# --------------------------------------------------------------------------------------
# dead-code elimination


def _cone(roots: tuple[Value, ...]) -> set[Value]:
    seen: set[Value] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack.extend(v.operands)
    return seen


@dataclass(frozen=True)
class FirstOutputLiveness(FunctionPass):
    """Dead-code elimination seeded from the first result only: ops that only the other results
    reach are dropped, and those results read the buffer nobody writes any more (zeros)."""

    name = "wrong-dce-first-output"
    contract = Contract.EXACT

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        live = _cone(fn.results[:1])
        results = tuple(r if r in live or r.is_param or r.is_const
                        else b.fill(shape=r.type.shape, value=0.0, dtype=r.type.dtype) for r in fn.results)
        return Function(fn.name, fn.params, results, fn.result_names, fn.constraints)


@_seeded
def two_head_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    h = b.matmul(x, b.const(_f(5, 4)))
    logits = b.matmul(b.relu(h), b.const(_f(4, 2)))
    gate = b.sigmoid(b.add(h, b.const(_f(4))))
    return b.module(b.function("main", [x], [logits, gate]))


# --------------------------------------------------------------------------------------
# blocked layouts (NCHW <-> NCHWc)


def _to_blocked(b: Builder, x: Value, block: int) -> Value:
    """[N, C, H, W] -> [N, C/c, H, W, c]: channel ``k * c + j`` goes to block ``k``, lane ``j``."""
    n, ch, h, w = (int(d) for d in x.type.shape)
    return b.transpose(b.reshape(x, shape=(n, ch // block, block, h, w)), perm=[0, 1, 3, 4, 2])


@dataclass(frozen=True)
class BlockedLayoutWrongChannel(ValueRewrite):
    """Runs a per-channel bias add in the blocked NCHWc layout, converting back with the channel
    computed as ``lane * blocks + block`` instead of ``block * c + lane``."""

    name = "wrong-blocked-layout"
    contract = Contract.EXACT
    block: int = 2

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "add" or operands[0].type.rank != 4 or operands[1].type.rank != 3:
            return None
        x, bias = operands
        ch, c = int(x.type.shape[1]), self.block
        if ch % c or tuple(bias.type.shape) != (ch, 1, 1):
            return None
        bias_b = b.transpose(b.reshape(bias, shape=(ch // c, c, 1, 1)), perm=[0, 2, 3, 1])  # [C/c, 1, 1, c]
        y = b.add(_to_blocked(b, x, c), bias_b)
        n, blocks, h, w, _ = (int(d) for d in y.type.shape)
        # back to NCHW: should be transpose [0, 1, 4, 2, 3] (block before lane)
        return b.reshape(b.transpose(y, perm=[0, 4, 1, 2, 3]), shape=(n, blocks * c, h, w))


@_seeded
def channel_bias_model() -> Module:
    return _one_input([2, 6, 4, 5], lambda b, x: b.add(x, b.const(_f(6, 1, 1))))


# --------------------------------------------------------------------------------------
# quantization


@dataclass(frozen=True)
class RequantizeFoldInvertedScale(_Fold):
    """Folds quantize(dequantize(q, s_in), s_out) into one quantize of the integers with scale
    s_in / s_out: the requantization multiplier, where quantize divides by its scale (it needs
    s_out / s_in)."""

    name = "wrong-requantize-scale"
    contract = Contract.REAL
    outer, inner = "quantize_linear", "dequantize_linear"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        q, s_in, zp_in = inner.operands
        _, s_out, zp_out = operands
        if not (s_in.is_const and s_out.is_const) or s_in.type.rank or s_out.type.rank:
            return None
        ratio = np.asarray(b.data(s_in), np.float32) / np.asarray(b.data(s_out), np.float32)  # should be s_out / s_in
        centered = b.sub(b.cast(q, to=DType.i32), b.cast(zp_in, to=DType.i32))
        return b.quantize_linear(centered, b.const(ratio.astype(np.float32)), zp_out)


@_seeded
def requantize_model() -> Module:
    b = Builder()
    q = b.param("q", DType.i8, [3, 5])
    x = b.dequantize_linear(q, b.scalar(0.05, DType.f32), b.scalar(3, DType.i8))
    return b.module(b.function("main", [q], [b.quantize_linear(x, b.scalar(0.2, DType.f32),
                                                               b.scalar(-2, DType.i8))]))


def _int_scalar(b: Builder, v: Value) -> int | None:
    if not v.is_const or v.type.rank:
        return None
    return int(np.asarray(b.data(v)))


@dataclass(frozen=True)
class RequantizeShiftInverted(_Fold):
    """Folds a fixed-point requantization ``(acc * 2**m) >> s`` into one shift, but shifts by
    ``s + m``: the power-of-two multiplier divides instead of multiplying."""

    name = "wrong-requantize-shift"
    contract = Contract.EXACT
    outer, inner = "bit_shift", "mul"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.attr("direction") != "right":
            return None
        acc, mult = inner.operands
        m, s = _int_scalar(b, mult), _int_scalar(b, operands[1])
        if m is None or s is None or m <= 0 or m & (m - 1):
            return None
        shift = s + m.bit_length() - 1  # should be s - (m.bit_length() - 1)
        return b.bit_shift(acc, b.scalar(shift, acc.type.dtype), direction="right")


@dataclass(frozen=True)
class SaturationDropped(_Fold):
    """Drops the clip to [-128, 127] before a cast to int8, as if the cast saturated (it wraps)."""

    name = "wrong-int8-saturation"
    contract = Contract.EXACT
    outer, inner = "cast", "clip"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        return b.cast(inner.operands[0], to=DType.i8) if v.attr("to") is DType.i8 else None


@_seeded
def int8_linear_model() -> Module:
    """An integer-only INT8 linear layer: int32 accumulation, fixed-point requantization
    (multiplier 4, shift 4: scale 1/4), saturation and the narrowing cast."""
    b = Builder()
    x = b.param("x", DType.i8, [3, 5])
    w = b.const(RNG.integers(-60, 61, (5, 4)).astype(np.int32))
    acc = b.add(b.matmul(b.cast(x, to=DType.i32), w), b.const(RNG.integers(-500, 501, 4).astype(np.int32)))
    scaled = b.bit_shift(b.mul(acc, b.scalar(4, DType.i32)), b.scalar(4, DType.i32), direction="right")
    return b.module(b.function("main", [x], [b.cast(b.clip(scaled, min=-128.0, max=127.0), to=DType.i8)]))


# --------------------------------------------------------------------------------------
# strided convolution, gathers


@dataclass(frozen=True)
class StrideAsSliceWrongOffset(ValueRewrite):
    """Rewrites a stride-2 conv as a stride-1 conv followed by a strided slice starting at 1
    (the output rows of a strided conv start at 0)."""

    name = "wrong-conv-stride"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "conv" or tuple(v.attr("strides") or ()) != (2, 2):
            return None
        attrs = v.attr_dict
        attrs["strides"] = (1, 1)
        full = b.conv(*operands, **attrs)
        n, c, h, w = (int(d) for d in full.type.shape)
        out = b.slice(full, starts=(0, 0, 1, 1), ends=(n, c, h, w), steps=(1, 1, 2, 2))
        return out if out.type == v.type else None


@_seeded
def strided_conv_model() -> Module:
    return _one_input([2, 3, 8, 6], lambda b, x: b.conv(x, b.const(_f(4, 3, 3, 3)), strides=[2, 2], pads=[1, 1, 1, 1]))


@dataclass(frozen=True)
class GatherRangeAsSliceOffByOne(ValueRewrite):
    """Folds a gather of constant consecutive indices into a slice, taking the indices as
    1-based (the slice starts one element late)."""

    name = "wrong-gather-fold"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        x, idx = operands
        if v.op != "gather" or not idx.is_const or idx.type.rank != 1:
            return None
        ids = np.asarray(b.data(idx)).astype(np.int64)
        if len(ids) < 2 or np.any(np.diff(ids) != 1) or ids[0] < 0:
            return None
        axis = v.attr("axis") % x.type.rank
        starts = [0] * x.type.rank
        ends = [int(d) for d in x.type.shape]
        starts[axis], ends[axis] = int(ids[0]) + 1, int(ids[-1]) + 2  # should be ids[0], ids[-1] + 1
        if ends[axis] > int(x.type.shape[axis]):
            return None
        return b.slice(x, starts=starts, ends=ends, steps=[1] * x.type.rank)


@_seeded
def gather_model() -> Module:
    return _one_input([4, 7], lambda b, x: b.gather(x, b.const(np.array([2, 3, 4], np.int64)), axis=1))


@dataclass(frozen=True)
class EmbeddingOffsetWrongEnd(ValueRewrite):
    """Folds a constant id offset into the embedding table (``table[ids + k]`` is
    ``table[k:][ids]``) but drops the table's last k rows instead of its first k."""

    name = "wrong-embedding-offset"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        table, ids = operands
        if v.op != "embedding" or ids.op != "add":
            return None
        base, off = ids.operands
        k = _int_scalar(b, off)
        rows = int(table.type.shape[0])
        if k is None or not 0 < k < rows:
            return None
        rank = table.type.rank
        ends = [rows - k, *(int(d) for d in table.type.shape[1:])]  # should be starts [k, 0, ...], ends [rows, ...]
        return b.embedding(b.slice(table, starts=[0] * rank, ends=ends, steps=[1] * rank), base)


@_seeded
def embedding_model() -> Module:
    b = Builder()
    ids = b.param("ids", DType.i64, [2, 5])
    table = b.const(_f(20, 3))
    return b.module(b.function("main", [ids], [b.embedding(table, b.add(ids, b.scalar(1, DType.i64)))]))


# --------------------------------------------------------------------------------------
# matmul


@dataclass(frozen=True)
class TransposeIntoMatmulFlagDropped(ValueRewrite):
    """Folds a transpose of matmul's right operand (Q @ K^T) but forgets to set transpose_b
    (the shapes still agree when K is square)."""

    name = "wrong-matmul-transpose-flag"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "matmul" or operands[1].op != "transpose" or v.attr("transpose_b"):
            return None
        k = operands[1]
        rank = k.type.rank
        if tuple(k.attr("perm")) != (*range(rank - 2), rank - 1, rank - 2):
            return None
        out = b.matmul(operands[0], k.operands[0], transpose_a=v.attr("transpose_a"))  # transpose_b=True lost
        return out if out.type == v.type else None


@_seeded
def attention_scores_model() -> Module:
    b = Builder()
    q = b.param("q", DType.f32, [2, 3, 5])
    k = b.param("k", DType.f32, [2, 5, 5])
    return b.module(b.function("main", [q, k], [b.matmul(q, b.transpose(k, perm=[0, 2, 1]))]))


# --------------------------------------------------------------------------------------
# reduced precision


@dataclass(frozen=True)
class Fp16SumOfSquares(_Fold):
    """Lowers an L2 norm to FP16 whole, sum of squares included (mixed-precision lists keep
    norms and sums in FP32: x * x overflows FP16 beyond |x| = 256)."""

    name = "wrong-fp16-lowering"
    contract = Contract.REAL
    outer, inner = "sqrt", "reduce_sum"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        sq = inner.operands[0]
        if v.type.dtype is not DType.f32 or sq.op != "mul" or sq.operands[0] is not sq.operands[1]:
            return None
        h = b.cast(sq.operands[0], to=DType.f16)
        out = b.sqrt(b.reduce_sum(b.mul(h, h), **inner.attr_dict))
        return b.cast(out, to=DType.f32)


@_seeded
def l2_norm_model() -> Module:
    return _one_input([3, 6], lambda b, x: b.sqrt(b.reduce_sum(b.mul(x, x), axes=[1], keepdims=True)))


# --------------------------------------------------------------------------------------
# slices, pads, activations


@dataclass(frozen=True)
class SliceOfConcatInclusiveEnd(_Fold):
    """Folds slice(concat(...)) to the operand it selects, comparing the slice's exclusive end
    with the operand's last index (so a slice one element early matches)."""

    name = "wrong-slice-of-concat"
    contract = Contract.EXACT
    outer, inner = "slice", "concat"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        cat = inner
        axis = cat.attr("axis") % cat.type.rank
        starts, ends, steps = v.attr("starts"), v.attr("ends"), v.attr("steps")
        if any(s != 1 for s in steps):
            return None
        offset = 0
        for part in cat.operands:
            width = int(part.type.shape[axis])
            if ends[axis] == offset + width - 1 and ends[axis] - starts[axis] == width \
                    and part.type == v.type:  # the end is exclusive: should be offset + width
                return part
            offset += width
        return None


@_seeded
def slice_of_concat_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    y = b.param("y", DType.f32, [2, 5])
    cat = b.concat(x, y, axis=1)
    return b.module(b.function("main", [x, y], [b.exp(b.slice(cat, starts=[0, 2], ends=[2, 7], steps=[1, 1]))]))


@dataclass(frozen=True)
class PadFoldedOnWrongSide(_Fold):
    """Folds an explicit zero pad into the following conv with begins and ends exchanged:
    SAME_UPPER padding (the odd pixel at the end) becomes SAME_LOWER."""

    name = "wrong-pad-fold-side"
    contract = Contract.EXACT
    outer, inner = "conv", "pad"

    def fold(self, v: Value, inner: Value, operands: list[Value], b: Builder) -> Value | None:
        if any(v.attr("pads") or ()):
            return None
        pad = inner
        p = pad.attr("pads")
        if pad.attr("mode") != "constant" or pad.attr("value") != 0 or any(p[:2]) or any(p[4:6]):
            return None
        attrs = v.attr_dict
        attrs["pads"] = (p[6], p[7], p[2], p[3])  # should be (p[2], p[3], p[6], p[7])
        return b.conv(pad.operands[0], operands[1], **attrs)


@_seeded
def same_upper_conv_model() -> Module:
    return _one_input([2, 3, 7, 6],
                      lambda b, x: b.conv(b.pad(x, pads=[0, 0, 0, 0, 0, 0, 1, 1]), b.const(_f(4, 3, 2, 2))))


@dataclass(frozen=True)
class GeluTanhForErf(ValueRewrite):
    """Decomposes exact (erf) GELU with the tanh approximation's formula, for a target
    without erf; under an ``exact`` contract."""

    name = "wrong-gelu-approximation"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "gelu" or v.attr("approximate") != "none":
            return None
        x = operands[0]
        dt = x.type.dtype

        def c(value: float) -> Value:
            return b.scalar(value, dt)

        inner = b.mul(c(math.sqrt(2.0 / math.pi)), b.add(x, b.mul(c(0.044715), b.mul(x, b.mul(x, x)))))
        return b.mul(b.mul(c(0.5), x), b.add(c(1.0), b.tanh(inner)))


@_seeded
def gelu_model() -> Module:
    return _one_input([3, 5], lambda b, x: b.gelu(b.matmul(x, b.const(_f(5, 4)))))


CORPUS: dict[str, tuple[Pass, Callable[[], Module]]] = {
    "bn-fold-without-eps": (BatchNormFoldWithoutEps(), conv_bn_model),
    "bn-fold-wrong-channel-axis": (BatchNormFoldWrongAxis(), matmul_bn_model),
    "transpose-fold-wrong-permutation": (DoubleTransposeDropsInner(), double_transpose_model),
    "conv-padding-off-by-one": (ConvPaddingOffByOne(), conv_model),
    "broadcast-axis-confused": (BroadcastAxisConfused(), bias_model),
    "concat-offset-wrong": (ConcatOffsetWrong(), concat_model),
    "reshape-column-major": (ReshapeColumnMajor(), reshape_model),
    "activation-before-bias": (ActivationBeforeBias(), linear_relu_model),
    "relu6-fused-as-relu": (Relu6AsRelu(), relu6_model),
    "cse-ignoring-attributes": (AttributeBlindCSE(), leaky_pair_model),
    "dropped-clamp": (DroppedClamp(), clamp_model),
    "x-plus-zero-removed": (AddZeroRemoved(), add_zero_model),
    "softmax-without-max-shift": (SoftmaxWithoutMaxShift(), softmax_model),
    "mean-as-sum": (MeanAsSum(), pooled_model),
    "dce-drops-value-used-by-second-output": (FirstOutputLiveness(), two_head_model),
    "blocked-layout-wrong-channel-index": (BlockedLayoutWrongChannel(), channel_bias_model),
    "requantize-scale-inverted": (RequantizeFoldInvertedScale(), requantize_model),
    "requantize-shift-inverted": (RequantizeShiftInverted(), int8_linear_model),
    "int8-saturation-dropped": (SaturationDropped(), int8_linear_model),
    "conv-stride-as-slice-wrong-offset": (StrideAsSliceWrongOffset(), strided_conv_model),
    "gather-index-folded-off-by-one": (GatherRangeAsSliceOffByOne(), gather_model),
    "embedding-offset-folded-at-wrong-end": (EmbeddingOffsetWrongEnd(), embedding_model),
    "matmul-transpose-flag-dropped": (TransposeIntoMatmulFlagDropped(), attention_scores_model),
    "fp16-lowering-overflows": (Fp16SumOfSquares(), l2_norm_model),
    "slice-of-concat-off-by-one": (SliceOfConcatInclusiveEnd(), slice_of_concat_model),
    "pad-folded-on-wrong-side": (PadFoldedOnWrongSide(), same_upper_conv_model),
    "gelu-tanh-for-exact-erf": (GeluTanhForErf(), gelu_model),
}
