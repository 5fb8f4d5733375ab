"""The recognisers a pass offers for the patterns it writes (the overflow prober reads a pass's output
through them): each recognises what its pass builds and rejects the look-alikes next to it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from cuvil.passes.decompose import Decompose, normalized_ratio
from cuvil.passes.fp16 import is_boundary_cast, narrow_function
from cuvil.passes.quantize_int8 import (
    QuantizeInt8,
    has_qdq,
    quantize_zero_point,
    requantization_target,
    requantization_zero_point,
)

RNG = np.random.default_rng(23)


def _module(build: Callable[[Builder, Value], Value], dtype: DType = DType.f32, shape: tuple[int, ...] = (3, 4)
            ) -> Module:
    b = Builder()
    x = b.param("x", dtype, list(shape))
    return b.module(b.function("main", [x], [build(b, x)]))


def _uses(fn: Function) -> dict[Value, list[Value]]:
    """The users of each value (what the requantization recogniser is given to look ahead)."""
    return {v: [u for u in fn.values() if v in u.operands] for v in fn.values()}


def _only(fn: Function, op: str) -> Value:
    (v,) = [v for v in fn.ops() if v.op == op]
    return v


# --------------------------------------------------------------------------------------
# quantize-int8


def _qdq_matmul(zero_dtype: type[np.integer], zero: int) -> Module:
    b = Builder()
    x = b.param("x", DType.i8, [3, 6])
    w = RNG.integers(-128, 128, (6, 5)).astype(np.int8)
    dx = b.dequantize_linear(x, b.const(np.array(0.05, np.float32)), b.const(np.array(3, np.int8)))
    dw = b.dequantize_linear(b.const(w), b.const(np.array(0.02, np.float32)), b.const(np.array(0, np.int8)))
    y = b.quantize_linear(b.matmul(dx, dw), b.const(np.array(0.2, np.float32)), b.const(np.array(zero, zero_dtype)))
    return b.module(b.function("main", [x], [y]))


@pytest.mark.parametrize(("zero_dtype", "zero", "target"), [(np.int8, -5, DType.i8), (np.uint8, 0, DType.u8)])
def test_requantization_is_recognised_in_what_the_lowering_writes(zero_dtype, zero, target):
    before = _qdq_matmul(zero_dtype, zero)
    assert has_qdq(before.main)
    after = QuantizeInt8().run(before).module
    assert not has_qdq(after.main)
    uses = _uses(after.main)
    clip = _only(after.main, "clip")
    assert requantization_target(clip, uses) is target
    assert [v for v in after.main.ops() if requantization_target(v, uses) is not None] == [clip]
    got = requantization_zero_point(clip, after.constants)
    assert got is not None and got.dtype == zero_dtype and int(got) == zero


def test_quantize_zero_point_is_the_constant_operand_of_quantize_linear():
    m = _qdq_matmul(np.int8, -5)
    q = _only(m.main, "quantize_linear")
    got = quantize_zero_point(q, m.constants)
    assert got is not None and int(got) == -5
    assert quantize_zero_point(_only(m.main, "matmul"), m.constants) is None


def test_quantize_zero_point_computed_at_run_time_is_not_known():
    b = Builder()
    x, z = b.param("x", DType.f32, [4]), b.param("z", DType.i8, [])
    m = b.module(b.function("main", [x, z], [b.quantize_linear(x, b.const(np.array(0.1, np.float32)), z)]))
    assert quantize_zero_point(_only(m.main, "quantize_linear"), m.constants) is None


def test_a_model_without_quantize_or_dequantize_has_no_qdq():
    assert not has_qdq(_module(lambda b, x: b.relu(x)).main)


CLAMPS: dict[str, Callable[[Builder, Value], Value]] = {
    "bounds of another type": lambda b, x: b.cast(b.clip(x, min=-127.0, max=127.0), to=DType.i8),
    "bounds of i8, cast to i16": lambda b, x: b.cast(b.clip(x, min=-128.0, max=127.0), to=DType.i16),
    "bounds of i8, cast to f16": lambda b, x: b.cast(b.clip(x, min=-128.0, max=127.0), to=DType.f16),
    "bounds of i8, used by an add": lambda b, x: b.add(b.clip(x, min=-128.0, max=127.0), x),
    "bounds of bool, cast to bool": lambda b, x: b.cast(b.clip(x, min=0.0, max=1.0), to=DType.bool),
    "one bound": lambda b, x: b.cast(b.clip(x, min=-128.0), to=DType.i8),
}


@pytest.mark.parametrize("case", sorted(CLAMPS))
def test_clamps_that_are_not_a_requantization_are_rejected(case):
    m = _module(CLAMPS[case])
    uses = _uses(m.main)
    assert all(requantization_target(v, uses) is None for v in m.main.ops())


def test_a_clamp_with_one_saturating_cast_among_its_users_is_a_requantization():
    def build(b: Builder, x: Value) -> Value:
        c = b.clip(x, min=0.0, max=255.0)
        return b.add(b.cast(b.cast(c, to=DType.u8), to=DType.f32), c)

    m = _module(build)
    assert requantization_target(_only(m.main, "clip"), _uses(m.main)) is DType.u8


def test_a_clamp_of_a_non_constant_shift_has_no_zero_point():
    b = Builder()
    x, z = b.param("x", DType.f32, [4]), b.param("z", DType.i8, [4])
    clip = b.clip(b.add(b.round(x), b.cast(z, to=DType.f32)), min=-128.0, max=127.0)
    m = b.module(b.function("main", [x, z], [b.cast(clip, to=DType.i8)]))
    assert requantization_target(clip, _uses(m.main)) is DType.i8
    assert requantization_zero_point(clip, m.constants) is None
    plain = _module(lambda b, x: b.cast(b.clip(x, min=-128.0, max=127.0), to=DType.i8))
    assert requantization_zero_point(_only(plain.main, "clip"), plain.constants) is None


# --------------------------------------------------------------------------------------
# fp16


def test_boundary_casts_are_the_ones_the_conversion_inserted():
    def build(b: Builder, x: Value) -> Value:
        return b.add(b.cast(b.mul(x, x), to=DType.f16), b.scalar(1.0, DType.f16))

    m = _module(build)
    b = Builder(m.constants)
    narrowed = narrow_function(m.main, b)
    model_cast = _only(m.main, "cast")
    casts = [v for v in narrowed.function.ops() if v.op == "cast"]
    inserted = [v for v in casts if is_boundary_cast(v, narrowed.origin)]
    carried = [v for v in casts if not is_boundary_cast(v, narrowed.origin)]
    assert [narrowed.origin[v] for v in carried] == [model_cast]
    assert {narrowed.origin[v].op for v in inserted} == {"param", "mul"}
    assert not any(is_boundary_cast(v, narrowed.origin) for v in narrowed.function.ops() if v.op != "cast")


# --------------------------------------------------------------------------------------
# decompose


def test_the_softmax_decomposition_is_a_normalized_ratio():
    m = Decompose().run(_module(lambda b, x: b.softmax(x, axis=1))).module
    div = _only(m.main, "div")
    assert normalized_ratio(div) is _only(m.main, "exp")
    assert [v for v in m.main.ops() if normalized_ratio(v) is not None] == [div]


def test_a_sum_over_other_axes_kept_as_dims_still_contains_each_element():
    m = _module(lambda b, x: b.div(x, b.reduce_sum(x, axes=(0,), keepdims=True)))
    assert normalized_ratio(_only(m.main, "div")) is m.main.params[0]


RATIOS: dict[str, tuple[Callable[[Builder, Value], Value], DType]] = {
    "sum without keepdims": (lambda b, x: b.div(x, b.reduce_sum(x, axes=(0,))), DType.f32),
    "sum of another value": (lambda b, x: b.div(x, b.reduce_sum(b.exp(x), axes=(1,), keepdims=True)), DType.f32),
    "max instead of sum": (lambda b, x: b.div(x, b.reduce_max(x, axes=(1,), keepdims=True)), DType.f32),
    "product instead of ratio": (lambda b, x: b.mul(x, b.reduce_sum(x, axes=(1,), keepdims=True)), DType.f32),
    "sum over the numerator": (lambda b, x: b.div(b.reduce_sum(x, axes=(1,), keepdims=True), x), DType.f32),
    "integer division": (lambda b, x: b.div(x, b.reduce_sum(x, axes=(1,), keepdims=True)), DType.i32),
}


@pytest.mark.parametrize("case", sorted(RATIOS))
def test_look_alike_ratios_are_rejected(case):
    build, dtype = RATIOS[case]
    m = _module(build, dtype, (4, 4))
    assert all(normalized_ratio(v) is None for v in m.main.ops())
