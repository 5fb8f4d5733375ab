"""Seeded miscompilations that random and edge-value testing miss: each one is only wrong at
sizes the float search never tries (integer wrap on long sequences, one position far down an
axis, an empty extent). They test the prover: its z3 models name the sizes, and the refuter
replays the difference there.

Each pass folds a select whose condition it believes constant, the way real compilers have
folded ``position * stride < 0`` to false and forgotten that 32-bit index arithmetic wraps on
long sequences, or folded a reduction of a constant over an axis to the constant and forgotten
that the axis can be empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.region import Region
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value
from cuvil.passes import Pass, ValueRewrite


@dataclass(frozen=True)
class FoldCondition(ValueRewrite):
    """``where(cond, a, b)`` whose condition is built by ``marker`` -> the branch the pass believes
    is always taken."""

    name = "fold-believed-constant-condition"
    take_true: bool = False

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "where" or operands[0].op not in ("less", "greater_equal", "equal", "greater", "not_equal"):
            return None
        return operands[1] if self.take_true else operands[2]


def _guarded(cond: Callable[[Builder, Value], Value], *, n_lo: int = 1) -> Module:
    """``where(cond(iota), -x, x)`` over x: f32[N]."""
    b = Builder()
    x = b.param("x", DType.f32, ["N"])
    c = cond(b, x)
    return b.module(b.function("main", [x], [b.where(c, b.neg(x), x)],
                               constraints=[DimConstraint("N", lo=n_lo)]))


def _iota(b: Builder, dtype: DType) -> Value:
    return b.iota(shape=["N"], dtype=dtype)


def _k(b: Builder, v: float | int, dtype: DType) -> Value:
    return b.scalar(v, dtype)


def _wrap_i32_scaled(b: Builder, x: Value) -> Value:
    return b.less(b.mul(_iota(b, DType.i32), _k(b, 65536, DType.i32)), _k(b, 0, DType.i32))


def _wrap_i8_offset(b: Builder, x: Value) -> Value:
    return b.less(b.add(_iota(b, DType.i8), _k(b, 100, DType.i8)), _k(b, 0, DType.i8))


def _wrap_i64_scaled(b: Builder, x: Value) -> Value:
    return b.less(b.mul(_iota(b, DType.i64), _k(b, 1 << 48, DType.i64)), _k(b, 0, DType.i64))


def _wrap_u8_cast(b: Builder, x: Value) -> Value:
    return b.equal(b.cast(b.add(_iota(b, DType.i64), _k(b, 1, DType.i64)), to=DType.u8), _k(b, 0, DType.u8))


def _wrap_u16_cast(b: Builder, x: Value) -> Value:
    return b.less(b.cast(_iota(b, DType.i64), to=DType.u16), _k(b, 60000, DType.u16))


def _wrap_i16_cast(b: Builder, x: Value) -> Value:
    return b.greater_equal(b.cast(_iota(b, DType.i64), to=DType.i16), _k(b, 0, DType.i16))


def _wrap_i32_squared(b: Builder, x: Value) -> Value:
    i = _iota(b, DType.i32)
    return b.less(b.mul(i, i), _k(b, 0, DType.i32))


def _wrap_i16_doubled(b: Builder, x: Value) -> Value:
    return b.greater_equal(b.mul(_iota(b, DType.i16), _k(b, 2, DType.i16)), _k(b, 0, DType.i16))


def _far_threshold(b: Builder, x: Value) -> Value:
    return b.less(_iota(b, DType.i64), _k(b, 1000, DType.i64))


def _one_far_position(b: Builder, x: Value) -> Value:
    return b.equal(_iota(b, DType.i64), _k(b, 4000, DType.i64))


def _modulo_position(b: Builder, x: Value) -> Value:
    i = _iota(b, DType.i64)
    return b.equal(b.mod(i, _k(b, 256, DType.i64)), i)


def _block_position(b: Builder, x: Value) -> Value:
    return b.equal(b.div(_iota(b, DType.i64), _k(b, 1024, DType.i64)), _k(b, 0, DType.i64))


@dataclass(frozen=True)
class FoldFusedCondition(Pass):
    """The same fold, inside the body of a fused elementwise op (where only a pass that looks into
    regions sees it)."""

    name = "fold-condition-in-fused-body"

    def run(self, module: Module) -> object:
        from cuvil.ir.module import Function
        from cuvil.passes import PassResult

        fn = module.main
        fused = fn.results[0]
        body: Region = fused.attr("body")
        b = Builder(module.constants)
        new_body = Region(body.params, body.params[0])  # the select over the index condition, folded to x
        out = b.fused(*fused.operands, body=new_body, kind=fused.attr("kind"))
        return PassResult(module.replace(functions=[Function(fn.name, fn.params, (out,), fn.result_names,
                                                             fn.constraints)]), True)


def fused_guard_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, ["N"])
    i = _iota(b, DType.i32)
    tx, ti, tk = TensorType(DType.f32, ("N",)), TensorType(DType.i32, ("N",)), TensorType(DType.i32, ())
    ax, ai, ak, az = Region.arg(0, tx), Region.arg(1, ti), Region.arg(2, tk), Region.arg(3, tk)
    wrapped = b.less(b.mul(ai, ak), az)
    body = Region((ax, ai, ak, az), b.where(wrapped, b.neg(ax), ax))
    stride, zero = _k(b, 65536, DType.i32), _k(b, 0, DType.i32)
    return b.module(b.function("main", [x], [b.fused(x, i, stride, zero, body=body)]))


def fused_index_math_model() -> Module:
    """The position, its scaling and the test all inside one fused rule (the old bug's shape)."""
    b = Builder()
    x = b.param("x", DType.f32, ["N"])
    ax = Region.arg(0, TensorType(DType.f32, ("N",)))
    scaled = b.iota(shape=["N"], step=65536, dtype=DType.i32)
    zero = b.iota(shape=["N"], step=0, dtype=DType.i32)
    body = Region((ax,), b.where(b.less(scaled, zero), b.neg(ax), ax))
    return b.module(b.function("main", [x], [b.fused(x, body=body)]))


@dataclass(frozen=True)
class FoldReductionOfConstant(ValueRewrite):
    """``reduce_max/min/mean`` over an axis of a broadcast constant -> the constant, forgetting that
    the axis may be empty (then max is -inf, min +inf, mean NaN)."""

    name = "fold-reduction-of-broadcast-constant"

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op not in ("reduce_max", "reduce_min", "reduce_mean") or operands[0].op != "expand":
            return None
        src = operands[0].operands[0]
        if not src.is_const:
            return None
        return b.expand(src, shape=list(v.type.shape))


def _empty_axis_model(kind: str) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder()
        x = b.param("x", DType.f32, ["M", "N"])
        filled = b.expand(b.const(np.ones((1,), np.float32)), shape=["M", "N"])
        red = b.op(kind, filled, axes=[1], keepdims=False)
        out = b.add(red, b.reduce_sum(x, axes=[1], keepdims=False))
        return b.module(b.function("main", [x], [out], constraints=[DimConstraint("N", lo=0)]))

    make.__name__ = f"empty_axis_{kind}_model"
    return make


PROVER_ONLY: dict[str, tuple[Pass, Callable[[], Module]]] = {
    "i32-position-times-stride-wraps": (FoldCondition(), lambda: _guarded(_wrap_i32_scaled)),
    "i8-position-plus-offset-wraps": (FoldCondition(), lambda: _guarded(_wrap_i8_offset)),
    "i64-position-times-stride-wraps": (FoldCondition(), lambda: _guarded(_wrap_i64_scaled)),
    "u8-position-cast-wraps-to-zero": (FoldCondition(), lambda: _guarded(_wrap_u8_cast)),
    "u16-position-cast-wraps-below-limit": (FoldCondition(take_true=True), lambda: _guarded(_wrap_u16_cast)),
    "i16-position-cast-turns-negative": (FoldCondition(take_true=True), lambda: _guarded(_wrap_i16_cast)),
    "i32-position-squared-wraps": (FoldCondition(), lambda: _guarded(_wrap_i32_squared)),
    "i16-position-doubled-wraps": (FoldCondition(take_true=True), lambda: _guarded(_wrap_i16_doubled)),
    "position-threshold-assumed-never-reached": (FoldCondition(take_true=True), lambda: _guarded(_far_threshold)),
    "one-far-position-assumed-absent": (FoldCondition(), lambda: _guarded(_one_far_position)),
    "position-modulo-assumed-identity": (FoldCondition(take_true=True), lambda: _guarded(_modulo_position)),
    "position-block-assumed-first": (FoldCondition(take_true=True), lambda: _guarded(_block_position)),
    "wrapping-condition-inside-fused-body": (FoldFusedCondition(), fused_guard_model),
    "wrapping-index-math-inside-one-fused-rule": (FoldFusedCondition(), fused_index_math_model),
    "max-over-empty-axis-folded": (FoldReductionOfConstant(), _empty_axis_model("reduce_max")),
    "min-over-empty-axis-folded": (FoldReductionOfConstant(), _empty_axis_model("reduce_min")),
    "mean-over-empty-axis-folded": (FoldReductionOfConstant(), _empty_axis_model("reduce_mean")),
}
