"""The reference interpreter and a compiled library give the same bits for every transcendental op.

A transcendental primitive means the real function rounded to its type. The library evaluates float32 ``exp``,
``tanh``, ``erf`` and ``pow`` inline in double precision and the others as the C library's double function,
each rounded once; the interpreter must compute the same values, not numpy's float32 loops (which are not
correctly rounded: they differed from the library by an ulp on 10-45 % of random inputs, and by 34,000 ulps in a
tanh-form GELU where ``1 + tanh`` cancels). float64 ops call the C library on both sides; float16 ones go
through float32, as their registers do. (float32 results may still differ where the exact value lies within
about 1e-15 of a rounding boundary, where the two double-precision evaluations can round apart: none among 4
million random inputs to each of exp, tanh and erf.) Each op is checked on a few thousand inputs spread over its
range, its domain's edges and the special values, with and without the O3 pipeline's fusions.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

UNARY = ("exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
         "acosh", "atanh", "sigmoid", "silu", "softplus", "mish", "elu", "selu", "celu", "gelu")
"""Transcendental primitives, and the activations written with them."""


def _inputs(dt: DType, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [rng.normal(0.0, 3.0, n), rng.uniform(-1.0, 1.0, n // 4), rng.uniform(-30.0, 30.0, n // 4),
             np.exp(rng.uniform(-20.0, 6.0, n // 4)) * rng.choice([-1.0, 1.0], n // 4),
             np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, -1e-30, 88.7, -103.9, 710.0, 1e300, np.inf, -np.inf,
                       np.nan])]
    with np.errstate(over="ignore"):
        return np.concatenate(parts).astype(dt.np)


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise: the same bits, any NaN matching any NaN."""
    return (got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}")) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("passes", ["O0", "O3"])
@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_interpreter_and_library_agree_on_every_transcendental(dt: DType, passes: str) -> None:
    x_np = _inputs(dt, 2048, seed=dt.bits)
    b = Builder()
    x = b.param("x", dt, [x_np.size])
    outs = [getattr(b, op)(x) for op in UNARY] + [b.gelu(x, approximate="tanh")]
    module = b.module(b.function("main", [x], outs))
    library = compile(module, cache=False, passes=passes).run([x_np])
    for name, got, want in zip([*UNARY, "gelu_tanh"], library, run_reference(module, [x_np]), strict=True):
        same = _same(got, want)
        assert same.all(), f"{name} {dt}: {int((~same).sum())} of {same.size} differ, first at x={x_np[~same][:3]}"


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_interpreter_and_library_agree_on_pow(dt: DType) -> None:
    """Run-time exponents (whole, halves, negative, fractional, huge) and C99's special cases."""
    rng = np.random.default_rng(7)
    base = np.concatenate([rng.uniform(0.0, 4.0, 600), rng.normal(0.0, 3.0, 600),
                           [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 0.5]])
    exponent = np.concatenate([rng.choice([-4.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0, 4.0], 400),
                               rng.uniform(-8.0, 8.0, 400), rng.uniform(-150.0, 150.0, 400),
                               [0.0, np.nan, np.inf, -np.inf, 3.0, 0.5, -0.5, -1.0, 1e10, -3.0]])
    with np.errstate(over="ignore"):  # 1e10 is inf in float16
        xs = [base.astype(dt.np), exponent.astype(dt.np)]
    b = Builder()
    x, y = b.param("x", dt, [base.size]), b.param("y", dt, [base.size])
    module = b.module(b.function("main", [x, y], [b.pow(x, y)]))
    (got,), (want,) = compile(module, cache=False, passes="O0").run(xs), run_reference(module, xs)
    same = _same(got, want)
    assert same.all(), f"{int((~same).sum())} differ, first at {xs[0][~same][:3]} ** {xs[1][~same][:3]}"
