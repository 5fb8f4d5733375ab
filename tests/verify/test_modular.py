"""The Z_p reader of the compute rules: an exact homomorphic image of float arithmetic on
dyadic values, consistent oracles for everything else, and a test that tells apart
polynomials that differ."""

from fractions import Fraction

import numpy as np
import pytest

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from verify.modular import ModularEvaluator, P, random_residues, to_residues, work


def _residue(x: float) -> int:
    f = Fraction(x)
    return f.numerator % P * pow(f.denominator, P - 2, P) % P


@pytest.mark.parametrize("x", [0.0, 1.0, -1.0, 0.5, -0.375, 3.0e-7, 1.5e20, -2.0 ** -60, 7.0 / 3.0])
def test_floats_map_exactly_to_their_rational_value(x):
    assert int(to_residues(np.array([x]))[0]) == _residue(x)


def _poly_model(shape_x, shape_w):
    b = Builder()
    x = b.param("x", DType.f64, shape_x)
    w = b.const(np.arange(np.prod(shape_w), dtype=np.float64).reshape(shape_w) - 3.0)
    y = b.matmul(x, w)
    z = b.sub(b.mul(y, y), b.add(y, b.scalar(0.5, DType.f64)))
    return b.module(b.function("main", [x], [b.reduce_sum(z, axes=[1])]))


@pytest.mark.parametrize(("shape_x", "shape_w"), [((3, 5), (5, 2)), ((2, 4), (4, 3))])
def test_field_arithmetic_is_a_homomorphic_image_of_exact_float_results(shape_x, shape_w):
    """Small integers and halves: float arithmetic is exact, so its residues equal the Z_p result."""
    m = _poly_model(shape_x, shape_w)
    x = np.random.default_rng(0).integers(-4, 5, shape_x).astype(np.float64)
    expected = to_residues(run_reference(m, [x])[0])
    ev = ModularEvaluator()
    got = ev.run(m.main, m.constants, [to_residues(x)], {})[m.main.results[0]]
    np.testing.assert_array_equal(got, expected)
    assert ev.trace.homomorphic


def test_oracles_are_consistent_functions():
    b = Builder()
    x = b.param("x", DType.f32, (4, 3))
    m = b.module(b.function("main", [x], [b.exp(x), b.exp(b.reshape(b.reshape(x, shape=(12,)), shape=(4, 3))),
                                          b.tanh(x)]))
    ev = ModularEvaluator(seed=3)
    r = random_residues((4, 3), np.random.default_rng(1))
    memo = ev.run(m.main, m.constants, [r], {})
    e1, e2, t = (memo[v] for v in m.main.results)
    np.testing.assert_array_equal(e1, e2)
    assert not np.array_equal(e1, t)
    assert "exp" in ev.trace.oracles and not ev.trace.homomorphic


def _identity_differs(lhs, rhs) -> bool:
    b = Builder()
    x, y = b.param("x", DType.f32, (5,)), b.param("y", DType.f32, (5,))
    m = b.module(b.function("main", [x, y], [lhs(b, x, y), rhs(b, x, y)]))
    rng = np.random.default_rng(7)
    memo = ModularEvaluator().run(m.main, m.constants, [random_residues((5,), rng), random_residues((5,), rng)], {})
    a, c = (memo[v] for v in m.main.results)
    return not np.array_equal(a, c)


def test_randomized_identity_testing_separates_different_polynomials():
    square = lambda b, x, y: b.mul(b.add(x, y), b.add(x, y))
    expanded = lambda b, x, y: b.add(b.add(b.mul(x, x), b.mul(b.mul(x, y), b.scalar(2.0, DType.f32))),
                                     b.mul(y, y))
    wrong = lambda b, x, y: b.add(b.mul(x, x), b.mul(y, y))
    assert not _identity_differs(square, expanded)
    assert _identity_differs(square, wrong)


def test_order_operations_use_centered_representatives():
    """relu(relu(x)) = relu(x) holds in the Z_p reading too (max compares representatives)."""
    b = Builder()
    x = b.param("x", DType.f32, (64,))
    m = b.module(b.function("main", [x], [b.relu(b.relu(x)), b.relu(x)]))
    ev = ModularEvaluator()
    memo = ev.run(m.main, m.constants, [random_residues((64,), np.random.default_rng(2))], {})
    a, c = (memo[v] for v in m.main.results)
    np.testing.assert_array_equal(a, c)
    assert ev.trace.order


def _conv_oracle(x, w, stride, pad, groups):
    """Direct 2-d grouped convolution over Python integers, reduced mod p (the oracle)."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=object)
    for b, oc, i, j in np.ndindex(n, o, oh, ow):
        base = (oc // (o // groups)) * cg
        acc = 0
        for ci, a, e in np.ndindex(cg, kh, kw):
            y, z = i * stride + a - pad, j * stride + e - pad
            if 0 <= y < h and 0 <= z < wd:
                acc += int(x[b, base + ci, y, z]) * int(w[oc, ci, a, e])
        out[b, oc, i, j] = acc % P
    return out.astype(np.int64)


@pytest.mark.parametrize(("stride", "pad", "groups"), [(1, 1, 1), (2, 0, 1), (1, 1, 3)])
def test_limb_products_of_conv_are_exact_over_z_p(stride, pad, groups):
    """conv over Z_p runs as float64 products of 16-bit limbs: residues near p must not round."""
    b = Builder()
    x = b.param("x", DType.f32, (2, 3, 5, 4))
    w = b.param("w", DType.f32, (6, 3 // groups, 3, 2))
    y = b.conv(x, w, strides=(stride, stride), pads=(pad, pad, pad, pad), groups=groups)
    m = b.module(b.function("main", [x, w], [y]))
    rng = np.random.default_rng(1)
    xs = [P - 1 - random_residues((2, 3, 5, 4), rng) % 1000, random_residues((6, 3 // groups, 3, 2), rng)]
    got = ModularEvaluator().run(m.main, m.constants, xs, {})[m.main.results[0]]
    np.testing.assert_array_equal(got, _conv_oracle(xs[0], xs[1], stride, pad, groups))


def test_limb_products_of_batched_matmul_are_exact_over_z_p():
    b = Builder()
    x = b.param("x", DType.f32, (2, 3, 7))
    w = b.param("w", DType.f32, (7, 4))
    m = b.module(b.function("main", [x, w], [b.matmul(x, w)]))
    rng = np.random.default_rng(2)
    xs = [random_residues((2, 3, 7), rng), P - 1 - random_residues((7, 4), rng) % 7]
    got = ModularEvaluator().run(m.main, m.constants, xs, {})[m.main.results[0]]
    exact = np.matmul(xs[0].astype(object), xs[1].astype(object)) % P
    np.testing.assert_array_equal(got, exact.astype(np.int64))


def test_work_counts_a_mean_inside_a_variance_once_per_element():
    """layer_norm reads its mean inside the variance's sum; the mean is not recomputed per term of
    that sum, so the work is (output points) x (axis length): 4x for a doubled axis, not 8x."""
    def norm_work(n):
        b = Builder()
        x = b.param("x", DType.f32, (4, n))
        s = b.const(np.ones(n, dtype=np.float32))
        m = b.module(b.function("main", [x], [b.layer_norm(x, s, s)]))
        return work(m.main, {})
    assert norm_work(512) <= 4 * norm_work(256)
