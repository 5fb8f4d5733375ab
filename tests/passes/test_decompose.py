"""decompose: composites into primitives (bit-identical: the primitives compute the composite's
own rule), and reverse=True recognizing primitive patterns (as exporters write them) back;
look-alike patterns that are not the composite are left alone."""

import numpy as np
import pytest
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.passes.base import Contract
from cuvil.passes.decompose import FORWARD, REVERSE, RULE_CONTRACTS, Decompose

RNG = np.random.default_rng(11)


def _f(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _module(build, shape=(3, 4, 6), dtype=DType.f32):
    b = Builder()
    x = b.param("x", dtype, list(shape))
    return b.module(b.function("main", [x], [build(b, x)]))


COMPOSITES = {
    "layer_norm": lambda b, x: b.layer_norm(x, b.const(_f(6)), b.const(_f(6))),
    "layer_norm over two axes": lambda b, x: b.layer_norm(x, b.const(_f(4, 6)), b.const(_f(6)), axis=1,
                                                          epsilon=1e-3),
    "softmax": lambda b, x: b.softmax(x, axis=1),
    "log_softmax": lambda b, x: b.log_softmax(x, axis=-1),
    "gelu": lambda b, x: b.gelu(x),
    "gelu tanh": lambda b, x: b.gelu(x, approximate="tanh"),
    "silu": lambda b, x: b.silu(x),
}


@pytest.mark.parametrize("case", sorted(COMPOSITES))
def test_decompose_is_bit_identical_and_reverse_restores_the_composite(case):
    before = _module(COMPOSITES[case])
    composite = ops(before)
    down = Decompose().run(before)
    assert down.changed
    assert not set(composite) & set(ops(down.module))
    assert_same_results(before, down.module)  # exact: the primitives compute the composite's rule
    up = Decompose(reverse=True).run(down.module)
    assert ops(up.module) == composite
    assert_same_results(before, up.module, exact=False, rtol=1e-6)


@pytest.mark.parametrize("case", ["gelu", "gelu tanh", "silu", "softmax"])
def test_narrow_types_round_trip_exactly(case):
    before = _module(COMPOSITES[case], dtype=DType.f16)
    down = Decompose().run(before).module
    assert_same_results(before, down)
    up = Decompose(reverse=True).run(down).module
    assert ops(up) == ops(before)
    assert_same_results(before, up)


def test_primitives_used():
    down = Decompose().run(_module(COMPOSITES["layer_norm"])).module
    assert ops(down) == ["reduce_mean", "sub", "mul", "reduce_mean", "add", "sqrt", "div", "mul", "add"]
    down = Decompose().run(_module(COMPOSITES["softmax"])).module
    assert ops(down) == ["reduce_max", "sub", "exp", "reduce_sum", "div"]


def test_ops_option_limits_forward_rules():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    before = b.module(b.function("main", [x], [b.softmax(b.gelu(x))]))
    after = Decompose(ops=("gelu",)).run(before).module
    assert "softmax" in ops(after) and "gelu" not in ops(after)


def _exported_layer_norm(b, x):
    """The way torch's ONNX exporter (opset < 17) spells LayerNorm: Pow and Div."""
    mean = b.reduce_mean(x, axes=[-1], keepdims=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.pow(d, b.scalar(2.0, DType.f32)), axes=[-1], keepdims=True)
    n = b.div(d, b.sqrt(b.add(var, b.scalar(1e-12, DType.f32))))
    return b.add(b.mul(n, b.const(_f(6))), b.const(_f(6)))


def _rsqrt_layer_norm(b, x):
    mean = b.reduce_mean(x, axes=[2], keepdims=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.mul(d, d), axes=[2], keepdims=True)
    return b.mul(d, b.rsqrt(b.add(b.scalar(1e-5, DType.f32), var)))


def _exported_gelu(b, x):
    """torch's GELU export: Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5."""
    e = b.erf(b.div(x, b.scalar(1.4142135381698608, DType.f32)))
    return b.mul(b.mul(x, b.add(e, b.scalar(1.0, DType.f32))), b.scalar(0.5, DType.f32))


RECOGNIZED = {
    "exported layer norm": (_exported_layer_norm, ["layer_norm"]),
    "layer norm with rsqrt, no affine": (_rsqrt_layer_norm, ["layer_norm"]),
    "exported gelu": (_exported_gelu, ["gelu"]),
    "silu either order": (lambda b, x: b.mul(b.sigmoid(x), x), ["silu"]),
}


@pytest.mark.parametrize("case", sorted(RECOGNIZED))
def test_reverse_recognizes_exporter_patterns(case):
    build, expected = RECOGNIZED[case]
    before = _module(build)
    res = Decompose(reverse=True).run(before)
    assert ops(res.module) == expected
    assert_same_results(before, res.module, exact=False, rtol=1e-5)


def _softmax_without_max(b, x):
    e = b.exp(x)
    return b.div(e, b.reduce_sum(e, axes=[1], keepdims=True))


def _softmax_mismatched_axes(b, x):
    s = b.sub(x, b.reduce_max(x, axes=[1], keepdims=True))
    e = b.exp(s)
    return b.div(e, b.reduce_sum(e, axes=[2], keepdims=True))


def _layer_norm_leading_axes(b, x):
    mean = b.reduce_mean(x, axes=[0], keepdims=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.mul(d, d), axes=[0], keepdims=True)
    return b.div(d, b.sqrt(b.add(var, b.scalar(1e-5, DType.f32))))


def _layer_norm_other_mean(b, x):
    mean = b.reduce_mean(b.relu(x), axes=[-1], keepdims=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.mul(d, d), axes=[-1], keepdims=True)
    return b.div(d, b.sqrt(b.add(var, b.scalar(1e-5, DType.f32))))


def _gelu_wrong_constant(b, x):
    e = b.erf(b.mul(x, b.scalar(0.6, DType.f32)))
    return b.mul(b.mul(x, b.scalar(0.5, DType.f32)), b.add(e, b.scalar(1.0, DType.f32)))


def _silu_of_another_value(b, x):
    return b.mul(x, b.sigmoid(b.neg(x)))


NOT_RECOGNIZED = {
    "softmax without max subtraction (overflows where softmax does not)": _softmax_without_max,
    "softmax whose max and sum run along different axes": _softmax_mismatched_axes,
    "normalization over leading axes is not a layer norm": _layer_norm_leading_axes,
    "mean of a different value": _layer_norm_other_mean,
    "gelu with a wrong constant": _gelu_wrong_constant,
    "x * sigmoid(-x)": _silu_of_another_value,
}


@pytest.mark.parametrize("case", sorted(NOT_RECOGNIZED))
def test_reverse_does_not_fire(case):
    before = _module(NOT_RECOGNIZED[case])
    assert_unchanged(Decompose(reverse=True), before)


def test_narrow_silu_product_is_not_silu():
    # on f16, silu is computed in f32 and rounded once; an f16 product is a different function
    before = _module(lambda b, x: b.mul(x, b.sigmoid(x)), dtype=DType.f16)
    assert Decompose(reverse=True).run(before).changed is False


def test_every_rule_declares_its_contract():
    assert set(RULE_CONTRACTS) == {r.name for r in FORWARD} | {r.name for r in REVERSE}
    assert Decompose.contract is Contract.REAL
    assert all(RULE_CONTRACTS[r.name] is Contract.EXACT for r in FORWARD)


def test_decomposed_softmax_keeps_max_subtraction_on_large_inputs():
    before = _module(COMPOSITES["softmax"])
    down = Decompose().run(before).module
    x = (_f(3, 4, 6) * 30 + 500).astype(np.float32)
    assert_same_results(before, down, [x])
    assert np.all(np.isfinite(run_reference(down, [x])[0]))
