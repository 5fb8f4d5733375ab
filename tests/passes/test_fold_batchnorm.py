"""fold-batchnorm: BN after conv / matmul folds into the weights and a bias add, as constant
expressions; it must not fire where the product has other users, the weights are not
constants, or the BN channel axis is not the product's output-channel axis."""

import numpy as np
import pytest
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import walk
from cuvil.passes import run_pipeline
from cuvil.passes.fold_batchnorm import RULES, FoldBatchNorm

RNG = np.random.default_rng(7)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _bn_params(b: Builder, c: int) -> list:
    return [b.const(_f(c)), b.const(_f(c)), b.const(_f(c)), b.const(RNG.uniform(0.5, 2.0, c).astype(np.float32))]


def _conv_bn(groups: int = 1, bias: str = "", spatial: tuple[int, ...] = (6, 5), out: int = 6) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, *spatial])
    w = b.const(_f(out, 4 // groups, *([3] * len(spatial))))
    y = b.conv(x, w, pads=[1] * (2 * len(spatial)), groups=groups)
    if bias:
        c = b.const(_f(out, *([1] * len(spatial))))
        y = b.add(y, c) if bias == "rhs" else b.add(c, y)
    y = b.batch_norm(y, *_bn_params(b, out), epsilon=1e-3)
    return b.module(b.function("main", [x], [b.relu(y)]))


def _matmul_bn(transpose_b: bool = False, bias: str = "") -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    w = b.const(_f(7, 5) if transpose_b else _f(5, 7))
    y = b.matmul(x, w, transpose_b=transpose_b)
    if bias:
        c = b.const(_f(1, 7))
        y = b.add(y, c) if bias == "rhs" else b.add(c, y)
    return b.module(b.function("main", [x], [b.batch_norm(y, *_bn_params(b, 7))]))


POSITIVE = {
    "conv-batchnorm": (lambda: _conv_bn(), ["conv", "add", "relu"]),
    "conv-batchnorm grouped": (lambda: _conv_bn(groups=2), ["conv", "add", "relu"]),
    "conv-batchnorm depthwise 1-d": (lambda: _conv_bn(groups=4, spatial=(9,), out=8), ["conv", "add", "relu"]),
    "conv-bias-batchnorm": (lambda: _conv_bn(bias="rhs"), ["conv", "add", "relu"]),
    "conv-bias-batchnorm-rhs": (lambda: _conv_bn(bias="lhs"), ["conv", "add", "relu"]),
    "matmul-batchnorm": (lambda: _matmul_bn(), ["matmul", "add"]),
    "matmul-batchnorm transpose_b": (lambda: _matmul_bn(transpose_b=True), ["matmul", "add"]),
    "matmul-bias-batchnorm": (lambda: _matmul_bn(bias="rhs", transpose_b=True), ["matmul", "add"]),
    "matmul-bias-batchnorm-rhs": (lambda: _matmul_bn(bias="lhs"), ["matmul", "add"]),
}


@pytest.mark.parametrize("case", sorted(POSITIVE))
def test_folds(case):
    build, expected = POSITIVE[case]
    before = build()
    res = run_pipeline(before, "fold-batchnorm,fold-constants,dce")
    assert res.records[0].changed
    assert ops(res.module) == expected
    assert "batch_norm" not in ops(res.module)
    assert_same_results(before, res.module, exact=False, rtol=1e-5)


def test_every_rule_is_exercised():
    fired = set()
    for build, _ in POSITIVE.values():
        fired.update(n.split(":")[0] for n in FoldBatchNorm().run(build()).notes)
    assert fired == {r.name for r in RULES}


def test_new_weights_are_constant_expressions_over_the_old_constants():
    before = _conv_bn()
    after = FoldBatchNorm().run(before).module
    conv = next(v for v in after.main.ops() if v.op == "conv")
    w = conv.operand("w")
    assert w.op == "mul" and not w.is_const
    cone_ops = {v.op for v in walk([w]) if not v.is_const}
    assert {"mul", "rsqrt", "add", "reshape"} <= cone_ops
    assert all(v.is_const for v in walk([w]) if not v.operands)
    old_consts = {v.const_hash for v in walk(list(before.main.results)) if v.is_const}
    leaves = {v.const_hash for v in walk([w]) if v.is_const}
    eps = [h for h in leaves - old_consts]
    assert len(eps) == 1 and float(after.constants[eps[0]]) == pytest.approx(1e-3)


def test_input_module_is_not_mutated():
    before = _conv_bn()
    text = str(before)
    FoldBatchNorm().run(before)
    assert str(before) == text


def _negative_conv_other_user():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 6, 5])
    y = b.conv(x, b.const(_f(6, 4, 3, 3)))
    return b.module(b.function("main", [x], [b.batch_norm(y, *_bn_params(b, 6)), y]))


def _negative_param_weights():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 6, 5])
    w = b.param("w", DType.f32, [6, 4, 3, 3])
    return b.module(b.function("main", [x, w], [b.batch_norm(b.conv(x, w), *_bn_params(b, 6))]))


def _negative_param_bn_stats():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 6, 5])
    mean = b.param("mean", DType.f32, [6])
    y = b.conv(x, b.const(_f(6, 4, 3, 3)))
    p = _bn_params(b, 6)
    return b.module(b.function("main", [x, mean], [b.batch_norm(y, p[0], p[1], mean, b.relu(p[3]))]))


def _negative_channel_axis_mismatch():
    # rank-3 matmul output [B, T, F]: batch_norm normalizes T (axis 1), the weights scale F
    b = Builder()
    x = b.param("x", DType.f32, [2, 6, 5])
    y = b.matmul(x, b.const(_f(5, 6)))
    return b.module(b.function("main", [x], [b.batch_norm(y, *_bn_params(b, 6))]))


def _negative_bias_not_per_channel():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 6, 5])
    y = b.add(b.conv(x, b.const(_f(6, 4, 3, 3)), pads=[1, 1, 1, 1]), b.const(_f(6, 6, 1)))
    return b.module(b.function("main", [x], [b.batch_norm(y, *_bn_params(b, 6))]))


def _negative_lhs_constant_matmul():
    # the constant is the lhs: the BN channels are columns of the activation, not of a weight
    b = Builder()
    x = b.param("x", DType.f32, [5, 7])
    y = b.matmul(b.const(_f(3, 5)), x)
    return b.module(b.function("main", [x], [b.batch_norm(y, *_bn_params(b, 7))]))


NEGATIVE = {
    "conv output has another consumer": _negative_conv_other_user,
    "weights are a parameter": _negative_param_weights,
    "BN statistics are not constants": _negative_param_bn_stats,
    "BN channel axis is not the output-channel axis": _negative_channel_axis_mismatch,
    "bias varies along a spatial axis": _negative_bias_not_per_channel,
    "matmul weight is the activation": _negative_lhs_constant_matmul,
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_does_not_fire(case):
    after = assert_unchanged(FoldBatchNorm(), NEGATIVE[case]())
    assert "batch_norm" in ops(after)


def test_a_deep_chain_folds_completely():
    # every fold rebuilds the convs downstream of it; single-use facts must survive the rebuild
    b = Builder()
    x = b.param("x", DType.f32, [1, 4, 5, 5])
    h = x
    for _ in range(12):
        h = b.relu(b.batch_norm(b.conv(h, b.const(_f(4, 4, 3, 3) * 0.3), pads=[1, 1, 1, 1]), *_bn_params(b, 4)))
    before = b.module(b.function("main", [x], [h]))
    res = FoldBatchNorm().run(before)
    assert res.notes == ("conv-batchnorm: 12",)
    assert "batch_norm" not in ops(res.module)
    assert_same_results(before, res.module, exact=False, rtol=1e-5)
