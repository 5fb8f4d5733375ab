"""A corpus of deliberately wrong passes, each modelled on a real miscompilation, written only
against the public pass API (``cuvil.passes.Pass``) and the Builder, with the small model each
one is applied to. Every entry must be refuted with a counterexample that replays."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from cuvil.passes import Contract, Pass, PassResult

RNG = np.random.default_rng(11)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@dataclass(frozen=True)
class ValueRewrite(Pass):
    """Rebuilds every function bottom-up; ``rewrite`` may replace a value (None keeps it)."""

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        raise NotImplementedError

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        fns = []
        for fn in module.functions:
            new: dict[Value, Value] = {}
            for v in fn.values():
                if v.is_param or v.is_const:
                    new[v] = v
                    continue
                operands = [new[o] for o in v.operands]
                out = self.rewrite(v, operands, b)
                new[v] = out if out is not None else b.op(v.op, *operands, **v.attr_dict)
            fns.append(Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names,
                                fn.constraints))
        if tuple(fns) == module.functions:
            return PassResult(module, False)
        return PassResult(module.replace(functions=fns, constants=b.constants), True)


# --------------------------------------------------------------------------------------
# batch-norm folding


def _bn_scale(b: Builder, bn: Value, eps: bool = True) -> Value:
    _, scale, _, _, var = bn.operands
    denom = b.add(var, b.scalar(float(bn.attr("epsilon")), DType.f32)) if eps else var
    return b.mul(scale, b.rsqrt(denom))


@dataclass(frozen=True)
class BatchNormFoldWithoutEps(ValueRewrite):
    """Folds conv + batch_norm but forgets epsilon in the variance (a classic exporter bug)."""

    name = "wrong-bn-fold-no-eps"
    contract = Contract.REAL

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "batch_norm" or operands[0].op != "conv":
            return None
        conv = operands[0]
        x, w = conv.operands
        s = _bn_scale(b, v, eps=False)
        out_ch = int(w.type.shape[0])
        w2 = b.mul(w, b.reshape(s, shape=(out_ch, 1, 1, 1)))
        shape = (out_ch, 1, 1)
        _, _, bias, mean, _ = operands
        shift = b.sub(b.reshape(bias, shape=shape), b.mul(b.reshape(mean, shape=shape), b.reshape(s, shape=shape)))
        return b.add(b.conv(x, w2, **conv.attr_dict), shift)


@dataclass(frozen=True)
class BatchNormFoldWrongAxis(ValueRewrite):
    """Folds matmul + batch_norm scaling the weight's rows (input features) instead of its columns."""

    name = "wrong-bn-fold-axis"
    contract = Contract.REAL

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "batch_norm" or operands[0].op != "matmul":
            return None
        mm = operands[0]
        x, w = mm.operands
        s = _bn_scale(b, v)
        rows = int(w.type.shape[0])
        w2 = b.mul(w, b.reshape(s, shape=(rows, 1)))  # should scale columns: shape (1, cols)
        _, _, bias, mean, _ = operands
        return b.add(b.matmul(x, w2), b.sub(bias, b.mul(mean, s)))


def conv_bn_model(cin: int = 3, cout: int = 5, hw: tuple[int, int] = (6, 4)) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, cin, *hw])
    w = b.const(_f(cout, cin, 3, 3))
    y = b.conv(x, w, pads=[1, 1, 1, 1])
    params = [b.const(RNG.uniform(0.5, 2.0, cout).astype(np.float32)), b.const(_f(cout)), b.const(_f(cout)),
              b.const(RNG.uniform(0.5, 2.0, cout).astype(np.float32))]
    return b.module(b.function("main", [x], [b.relu(b.batch_norm(y, *params, epsilon=1e-3))]))


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
class DoubleTransposeDropsInner(ValueRewrite):
    """Folds transpose(transpose(x, p), q) to transpose(x, q): the inner permutation is lost
    (the shapes still agree when the dims it swaps have equal sizes)."""

    name = "wrong-transpose-fold"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "transpose" or operands[0].op != "transpose":
            return None
        out = b.transpose(operands[0].operands[0], perm=v.attr("perm"))
        return out if out.type == v.type else None


def double_transpose_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [4, 4, 3])
    y = b.transpose(b.transpose(x, perm=[1, 0, 2]), perm=[0, 2, 1])
    return b.module(b.function("main", [x], [b.exp(y)]))


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


def reshape_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [4, 6])
    return b.module(b.function("main", [x], [b.reshape(x, shape=[3, 8])]))


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


def bias_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [4, 4])
    return b.module(b.function("main", [x], [b.add(x, b.const(_f(4)))]))


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


def conv_model(cin: int = 3, cout: int = 5) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, cin, 5, 4])
    y = b.conv(x, b.const(_f(cout, cin, 3, 3)), pads=[1, 1, 1, 1])
    return b.module(b.function("main", [x], [y]))


# --------------------------------------------------------------------------------------
# fusion and activations


@dataclass(frozen=True)
class ActivationBeforeBias(ValueRewrite):
    """Moves the activation of relu(matmul + bias) before the bias add (a broken epilogue order)."""

    name = "wrong-epilogue-order"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "relu" or operands[0].op != "add" or operands[0].operands[0].op != "matmul":
            return None
        mm, bias = operands[0].operands
        return b.add(b.relu(mm), bias)


def linear_relu_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.add(b.matmul(x, b.const(_f(5, 4))), b.const(_f(4)))
    return b.module(b.function("main", [x], [b.relu(y)]))


@dataclass(frozen=True)
class Relu6AsRelu(ValueRewrite):
    """Fuses clip(x, 0, 6) as a plain relu, losing the upper bound."""

    name = "wrong-relu6"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "clip" and v.attr("min") == 0.0 and v.attr("max") == 6.0:
            return b.relu(operands[0])
        return None


def relu6_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    return b.module(b.function("main", [x], [b.clip(b.mul(x, b.scalar(4.0, DType.f32)), min=0.0, max=6.0)]))


@dataclass(frozen=True)
class DroppedClamp(ValueRewrite):
    """Drops a clip whose bounds it wrongly believes the input already satisfies."""

    name = "wrong-dropped-clamp"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        return operands[0] if v.op == "clip" else None


def clamp_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    return b.module(b.function("main", [x], [b.exp(b.clip(x, min=-1.0, max=1.0))]))


@dataclass(frozen=True)
class AttributeBlindCSE(Pass):
    """Merges ops with the same name and operands, ignoring attributes."""

    name = "wrong-cse-attributes"
    contract = Contract.EXACT

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        fns = []
        for fn in module.functions:
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
            fns.append(Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names,
                                fn.constraints))
        if tuple(fns) == module.functions:
            return PassResult(module, False)
        return PassResult(module.replace(functions=fns, constants=b.constants), True)


def leaky_pair_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    return b.module(b.function("main", [x], [b.add(b.leaky_relu(x, alpha=0.1), b.leaky_relu(x, alpha=0.3))]))


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


def add_zero_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    return b.module(b.function("main", [x], [b.add(b.neg(x), b.scalar(0.0, DType.f32))]))


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


def softmax_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 5])
    return b.module(b.function("main", [x], [b.softmax(x, axis=1)]))


@dataclass(frozen=True)
class MeanAsSum(ValueRewrite):
    """Lowers reduce_mean as a sum without the division by the element count."""

    name = "wrong-mean-as-sum"
    contract = Contract.REAL

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "reduce_mean":
            return None
        return b.reduce_sum(operands[0], **v.attr_dict)


def pooled_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 4, 5])
    return b.module(b.function("main", [x], [b.reduce_mean(x, axes=[2, 3], keepdims=True)]))


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
}
