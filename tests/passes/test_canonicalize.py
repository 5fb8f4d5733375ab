"""IR-in/IR-out tests for canonicalization rules: each rule fires where it should and not
where it must not, and the rewritten function computes the same values."""

import numpy as np
import pytest

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.passes import run_pipeline
from cuvil.passes.canonicalize import RULES, Canonicalize


def _module(build):
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 4])
    out = build(b, x)
    return b.module(b.function("main", [x], [out]))


def _ops(m):
    return [v.op for v in m.main.ops()]


def _same_results(before, after):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, 0] = -0.0
    for a, b in zip(run_reference(before, [x]), run_reference(after, [x]), strict=True):
        np.testing.assert_array_equal(a, b)
        assert np.array_equal(np.signbit(a), np.signbit(b))


CASES = {
    "mul-by-one": (lambda b, x: b.mul(x, b.const(np.ones((4,), np.float32))), []),
    "mul-by-one-lhs": (lambda b, x: b.mul(b.scalar(1.0, DType.f32), x), []),
    "div-by-one": (lambda b, x: b.div(x, b.scalar(1.0, DType.f32)), []),
    "sub-zero": (lambda b, x: b.sub(x, b.scalar(0.0, DType.f32)), []),
    "add-negative-zero": (lambda b, x: b.add(x, b.scalar(-0.0, DType.f32)), []),
    "double-transpose": (lambda b, x: b.transpose(b.transpose(x, perm=[2, 0, 1]), perm=[1, 2, 0]), []),
    "identity-transpose": (lambda b, x: b.transpose(x, perm=[0, 1, 2]), []),
    "reshape-chain": (lambda b, x: b.reshape(b.reshape(x, shape=[6, 4]), shape=[24]), ["reshape"]),
    "identity-reshape": (lambda b, x: b.reshape(x, shape=[2, 3, 4]), []),
    "identity-cast": (lambda b, x: b.cast(x, to=DType.f32), []),
    "widening-cast-round-trip": (lambda b, x: b.cast(b.cast(x, to=DType.f64), to=DType.f32), []),
    "double-negation": (lambda b, x: b.neg(b.neg(x)), []),
    "relu-idempotent": (lambda b, x: b.relu(b.relu(x)), ["relu"]),
    "pad-into-conv": (lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 2)), _weights(b, 5, 3, 3), pads=(2, 1),
                                          strides=(2,)), ["conv"]),
}


def _weights(b, o: int, c: int, *k: int):
    return b.const(np.random.default_rng(1).standard_normal((o, c, *k)).astype(np.float32))


def test_every_rule_has_a_positive_case():
    assert {r.name for r in RULES} == set(CASES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires(rule):
    build, expected_ops = CASES[rule]
    before = _module(build)
    after = Canonicalize().run(before)
    assert after.changed
    assert _ops(after.module) == expected_ops
    _same_results(before, after.module)


NEGATIVE = {
    "x + 0.0 is not exact (-0.0 + 0.0 = +0.0)": lambda b, x: b.add(x, b.scalar(0.0, DType.f32)),
    "x * 2 is not an identity": lambda b, x: b.mul(x, b.scalar(2.0, DType.f32)),
    "x * 1 that broadcasts x to a bigger shape": lambda b, x: b.mul(x, b.const(np.ones((5, 1, 1, 1), np.float32))),
    "transposes that do not cancel": lambda b, x: b.transpose(b.transpose(x, perm=[1, 0, 2]), perm=[0, 2, 1]),
    "narrowing cast round trip loses bits": lambda b, x: b.cast(b.cast(x, to=DType.f16), to=DType.f32),
    "a mixed-sign splat": lambda b, x: b.mul(x, b.const(np.array([1, 1, 1, -1], np.float32))),
    "a pad of 1.0 before a conv":
        lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 1), value=1.0), _weights(b, 2, 3, 3)),
    "a pad of -0.0 before a conv (its products' signs differ)":
        lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 1), value=-0.0), _weights(b, 2, 3, 3)),
    "a reflecting pad before a conv": lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 1), mode="reflect"),
                                                          _weights(b, 2, 3, 3)),
    "a pad of the channels before a conv": lambda b, x: b.conv(b.pad(x, pads=(0, 1, 0, 0, 0, 0)), _weights(b, 2, 4, 3)),
    "a crop before a conv": lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, -1)), _weights(b, 2, 3, 3)),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_rule_does_not_fire(case):
    before = _module(NEGATIVE[case])
    after = Canonicalize().run(before)
    if case == "transposes that do not cancel":  # composes, but must not vanish
        assert _ops(after.module) == ["transpose"]
        _same_results(before, after.module)
        return
    assert not after.changed
    assert after.module is before


def test_a_zero_pad_folds_into_a_strided_dilated_grouped_2d_conv():
    """Asymmetric pads on both axes into a convolution with pads of its own: its pads grow by the pad's,
    and the interpreter's values are the same bit for bit, signed zeros and a NaN included."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 7, 9])
    padded = b.pad(x, pads=(0, 0, 2, 0, 0, 0, 1, 3))
    before = b.module(b.function("main", [x], [b.conv(padded, _weights(b, 6, 2, 3, 2), pads=(1, 0, 0, 2),
                                                         strides=(2, 1), dilations=(1, 2), groups=2)]))
    after = Canonicalize().run(before)
    assert after.changed and _ops(after.module) == ["conv"]
    assert tuple(after.module.main.results[0].attr("pads")) == (3, 0, 1, 5)
    xs = np.random.default_rng(2).standard_normal((2, 4, 7, 9)).astype(np.float32)
    xs[0, 0, :2] = -0.0
    xs[1, 3, 4, 4] = np.nan
    for a, c in zip(run_reference(before, [xs]), run_reference(after.module, [xs]), strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(c))
        assert np.array_equal(a[~np.isnan(a)].view(np.uint32), c[~np.isnan(c)].view(np.uint32))


def test_pass_does_not_mutate_input():
    before = _module(CASES["double-transpose"][0])
    text = str(before.main.results)
    Canonicalize().run(before)
    assert str(before.main.results) == text
    assert _ops(before) == ["transpose", "transpose"]


def test_pipeline_records_snapshots_and_op_counts():
    before = _module(lambda b, x: b.relu(b.transpose(b.transpose(x, perm=[1, 0, 2]), perm=[1, 0, 2])))
    res = run_pipeline(before, "canonicalize,dce")
    assert [r.name for r in res.records] == ["canonicalize", "dce"]
    assert res.records[0].changed and res.records[0].ops_before == 3 and res.records[0].ops_after == 1
    assert res.records[0].before is before
    assert _ops(res.module) == ["relu"]
