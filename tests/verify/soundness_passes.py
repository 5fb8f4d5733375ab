"""Wrong passes for each way a certificate used to lie (a change inside a fused body, weights swapped
under an existing key, a summation order changed, a fast path that differed from its rule, parts
nobody compared, a pass that says it changed nothing, NaN and infinities under ``real``), written
against the public Pass API: the historical example of each and new instances of the class."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from wrong_passes import ValueRewrite

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.region import Region
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value
from cuvil.passes import Contract, Pass, PassResult

Rewrite = Callable[[Value, list[Value], Builder], "Value | None"]


def rewrite_pass(name: str, fn: Rewrite, contract: Contract = Contract.EXACT) -> Pass:
    """A ValueRewrite named ``name`` whose ``rewrite`` is ``fn``."""
    cls = type(name.title().replace("-", ""), (ValueRewrite,),
               {"name": name, "contract": contract, "rewrite": lambda self, v, ops, b: fn(v, ops, b),
                "__doc__": f"seeded bug: {name}"})
    return dataclasses.dataclass(frozen=True)(cls)()


@dataclass(frozen=True)
class SaysUnchanged(Pass):
    """Runs ``inner`` and reports ``changed=False`` whatever it did."""

    inner: Pass = None  # type: ignore[assignment]
    name = "says-unchanged"

    def run(self, module: Module) -> PassResult:
        return PassResult(self.inner.run(module).module, False)


def _f(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _module(build: Callable[[Builder, Value], Value], shape: tuple = (3, 4), seed: int = 0) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder()
        x = b.param("x", DType.f32, list(shape))
        return b.module(b.function("main", [x], [build(b, x)]))

    return make


# --------------------------------------------------------------------------------------
# changes inside a fused body


def _fused_model(body: Callable[[Builder, Value, Value], Value]) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder()
        x = b.param("x", DType.f32, [3, 4])
        t, tb = TensorType(DType.f32, (3, 4)), TensorType(DType.f32, (4,))
        a, c = Region.arg(0, t), Region.arg(1, tb)
        return b.module(b.function("main", [x], [b.fused(x, b.const(_f(1, 4)), body=Region((a, c), body(b, a, c)))]))

    return make


def _rebody(new: Callable[[Builder, Value, Value], Value]) -> Rewrite:
    def fn(v: Value, ops: list[Value], b: Builder) -> Value | None:
        if v.op != "fused":
            return None
        a, c = v.attr("body").params
        return b.fused(*ops, body=Region((a, c), new(b, a, c)), kind=v.attr("kind"))

    return fn


# --------------------------------------------------------------------------------------
# summation order


def _sum_split(v: Value, ops: list[Value], b: Builder) -> Value | None:
    """reduce_sum over the last axis -> the sum of the sums of its two halves (another order)."""
    if v.op != "reduce_sum" or v.attr("axes") != (1,):
        return None
    x = ops[0]
    n = int(x.type.shape[1])
    lo = b.reduce_sum(b.slice(x, starts=[0, 0], ends=[3, n // 2], steps=[1, 1]), axes=[1], keepdims=False)
    hi = b.reduce_sum(b.slice(x, starts=[0, n // 2], ends=[3, n], steps=[1, 1]), axes=[1], keepdims=False)
    return b.add(lo, hi)


def _matmul_reversed_k(v: Value, ops: list[Value], b: Builder) -> Value | None:
    """matmul -> the same products summed from the last k to the first."""
    if v.op != "matmul" or v.attr("transpose_a") or v.attr("transpose_b"):
        return None
    x, w = ops
    k = int(x.type.shape[-1])
    first = -1  # a normalized reversed slice ends before element 0
    xr = b.slice(x, starts=[0, k - 1], ends=[3, first], steps=[1, -1])
    wr = b.slice(w, starts=[k - 1, 0], ends=[first, int(w.type.shape[1])], steps=[-1, 1])
    return b.matmul(xr, wr)


# --------------------------------------------------------------------------------------
# reference semantics the old fast paths did not follow


def _sign_as_selects(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op != "sign":
        return None
    y = ops[0]
    one, zero = b.scalar(1.0, DType.f32), b.scalar(0.0, DType.f32)
    return b.where(b.greater(y, zero), one, b.where(b.less(y, zero), b.neg(one), zero))


def _elu_as_exp_minus_one(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op != "elu":
        return None
    x = ops[0]
    zero, one = b.scalar(0.0, DType.f32), b.scalar(1.0, DType.f32)
    return b.where(b.less(x, zero), b.sub(b.exp(x), one), x)


def _softplus_as_log_one_plus_exp(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op != "softplus":
        return None
    return b.log(b.add(b.scalar(1.0, DType.f32), b.exp(ops[0])))


# --------------------------------------------------------------------------------------
# NaN and infinities under a real contract


def _relu_as_select(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op != "relu":
        return None
    zero = b.scalar(0.0, DType.f32)
    return b.where(b.greater(ops[0], zero), ops[0], zero)


def _drop_isnan_guard(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op == "where" and ops[0].op == "isnan":
        return ops[2]
    return None


def _log_exp(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op == "log" and ops[0].op == "exp":
        return ops[0].operands[0]
    return None


def _max_as_select(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op != "max":
        return None
    return b.where(b.greater(ops[0], ops[1]), ops[0], ops[1])


def _two_inputs(build: Callable[[Builder, Value, Value], Value]) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder()
        x, y = b.param("x", DType.f32, [3, 4]), b.param("y", DType.f32, [3, 4])
        return b.module(b.function("main", [x, y], [build(b, x, y)]))

    return make


def _drop(op: str) -> Rewrite:
    return lambda v, ops, b: ops[0] if v.op == op else None


def _add_as_sub(v: Value, ops: list[Value], b: Builder) -> Value | None:
    return b.sub(*ops) if v.op == "add" else None


def _zero_scale(v: Value, ops: list[Value], b: Builder) -> Value | None:
    if v.op == "mul" and ops[1].is_const:
        return b.mul(ops[0], b.const(np.zeros(tuple(int(d) for d in ops[1].type.shape), np.float32)))
    return None


SEEDED: dict[str, tuple[Pass, Callable[[], Module]]] = {
    # a change inside a fused body (the first is the historical example)
    "fused-body-add-becomes-sub": (
        rewrite_pass("fused-add-to-sub", _rebody(lambda b, a, c: b.relu(b.sub(a, c)))),
        _fused_model(lambda b, a, c: b.relu(b.add(a, c)))),
    "fused-body-tanh-becomes-sigmoid": (
        rewrite_pass("fused-tanh-to-sigmoid", _rebody(lambda b, a, c: b.sigmoid(b.mul(a, c)))),
        _fused_model(lambda b, a, c: b.tanh(b.mul(a, c)))),
    "fused-body-attribute-changed": (
        rewrite_pass("fused-leaky-slope", _rebody(lambda b, a, c: b.leaky_relu(b.add(a, c), alpha=0.2))),
        _fused_model(lambda b, a, c: b.leaky_relu(b.add(a, c), alpha=0.1))),
    # a summation order changed
    "sum-split-into-halves": (rewrite_pass("sum-halves", _sum_split), _module(
        lambda b, x: b.reduce_sum(x, axes=[1], keepdims=False), (3, 40))),
    "matmul-k-reversed": (rewrite_pass("matmul-reverse-k", _matmul_reversed_k), _module(
        lambda b, x: b.matmul(x, b.const(_f(2, 24, 5))), (3, 24))),
    # what the old fast paths computed instead of the rule
    "elu-as-exp-minus-one": (rewrite_pass("elu-exp-minus-one", _elu_as_exp_minus_one),
                             _module(lambda b, x: b.elu(x))),
    "softplus-as-log-one-plus-exp": (rewrite_pass("softplus-naive", _softplus_as_log_one_plus_exp),
                                     _module(lambda b, x: b.softplus(x))),
    # a pass that says it changed nothing
    "says-unchanged-drops-relu": (SaysUnchanged(rewrite_pass("drop-relu", _drop("relu"))),
                                  _module(lambda b, x: b.relu(x))),
    "says-unchanged-add-becomes-sub": (SaysUnchanged(rewrite_pass("add-to-sub", _add_as_sub)),
                                       _two_inputs(lambda b, x, y: b.add(x, y))),
    "says-unchanged-zeroes-a-scale": (SaysUnchanged(rewrite_pass("zero-scale", _zero_scale)),
                                      _module(lambda b, x: b.mul(x, b.const(_f(3, 3, 4))))),
    # NaN: relu propagates it, a select on x > 0 does not
    "relu-as-select": (rewrite_pass("relu-select-exact", _relu_as_select), _module(lambda b, x: b.relu(x))),
    # NaN and infinities under a real contract
    "real-relu-as-select": (rewrite_pass("relu-select", _relu_as_select, Contract.REAL),
                            _module(lambda b, x: b.relu(x))),
    "real-isnan-guard-dropped": (rewrite_pass("drop-isnan-guard", _drop_isnan_guard, Contract.REAL),
                                 _module(lambda b, x: b.where(b.isnan(x), b.scalar(0.0, DType.f32), x))),
    "real-log-of-exp": (rewrite_pass("log-exp", _log_exp, Contract.REAL), _module(lambda b, x: b.log(b.exp(x)))),
    "real-max-as-select": (rewrite_pass("max-select", _max_as_select, Contract.REAL),
                           _two_inputs(lambda b, x, y: b.max(x, y))),
}
"""Seeded bugs the verifier must refute with a counterexample that replays."""


# --------------------------------------------------------------------------------------
# refuted structurally or left unknown: never proved


@dataclass(frozen=True)
class StoreOtherBytes(Pass):
    """Stores other data under constant keys the module already has (``how``: swap, zero, scale)."""

    how: str = "scale"
    name = "store-other-bytes"

    def run(self, module: Module) -> PassResult:
        consts = dict(module.constants)
        keys = sorted(consts)
        if self.how == "swap" and len(keys) >= 2:
            consts[keys[0]], consts[keys[1]] = consts[keys[1]], consts[keys[0]]
        elif self.how == "zero":
            consts[keys[0]] = np.zeros_like(consts[keys[0]])
        else:
            consts[keys[0]] = consts[keys[0]] * 2
        return PassResult(Module(module.functions, consts, module.metadata), True)


def _two_weights() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    y = b.matmul(x, b.const(_f(4, 3, 3)))
    return b.module(b.function("main", [x], [b.add(y, b.const(_f(5, 2, 3)))]))


@dataclass(frozen=True)
class EditFunction(Pass):
    """Changes one part of the function nobody used to compare."""

    what: str = "constraint"
    name = "edit-function"

    def run(self, module: Module) -> PassResult:
        fn = module.main
        if self.what == "constraint":
            fn = dataclasses.replace(fn, constraints=(DimConstraint("N", lo=1, hi=8),))
        elif self.what == "names":
            fn = dataclasses.replace(fn, result_names=fn.result_names[::-1])
        else:
            return PassResult(Module(module.functions, module.constants, {**module.metadata, "plan": "{}"}), True)
        return PassResult(module.replace(functions=[fn]), True)


def _two_outputs() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, ["N", 3])
    return b.module(b.function("main", [x], [b.exp(x), b.relu(x)], result_names=["e", "r"],
                               constraints=[DimConstraint("N", lo=1, hi=64)]))


NEVER_PROVED: dict[str, tuple[Pass, Callable[[], Module]]] = {
    "weights-scaled-under-their-key": (StoreOtherBytes("scale"), _two_weights),
    "weights-swapped-between-keys": (StoreOtherBytes("swap"), _two_weights),
    "bias-zeroed-under-its-key": (StoreOtherBytes("zero"), _two_weights),
    "dim-constraint-narrowed": (EditFunction("constraint"), _two_outputs),
    "output-names-swapped": (EditFunction("names"), _two_outputs),
    "metadata-only": (EditFunction("metadata"), _two_outputs),
    "sign-of-ceil-as-selects": (rewrite_pass("sign-selects", _sign_as_selects),
                                _module(lambda b, x: b.sign(b.ceil(b.sub(x, b.scalar(10.0, DType.f32)))))),
}
"""Bugs refuted structurally (no inputs to replay), applications with no obligation, and rewrites
whose difference only a specific input shows (unknown is allowed there, proved never)."""
