"""The inline float32 ``pow`` of the generated code (cuvil.codegen.vmath.pow_f32).

It is compared bit for bit with C's ``pow`` in double rounded to float32: over every pairing of special
values (where C99 fixes each result: zeros, infinities, NaNs, ±1, odd and even whole exponents), and to
within one unit in the last place, almost always exactly, over a few million pairs drawn over the range
where the function varies. The same operands must give the same bits however the exponent arrives: as a
constant (LLVM then folds away every path but the one it chooses), as a run-time tensor, in a vectorized
loop or its scalar remainder: the proofs read ``pow`` as one function of its operands.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cuvil.codegen.artifact import build_library
from cuvil.codegen.vmath import POW_BY_PRODUCTS
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

F32 = np.float32
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0, 5.0, -5.0, 2.5, -2.5, 0.75,
                     1.5, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38,
                     16777215.0, -16777215.0, 16777216.0, -16777216.0, 1.0000001, 0.99999994, 88.0, -104.0, 150.0,
                     -150.0], dtype=F32)
"""Operands where C99 fixes pow's result or where a path of the kernel changes: signed zeros, ±1, ±0.5, whole
exponents at and past :data:`POW_BY_PRODUCTS`, odd and even, the largest odd whole float32 and the first
float32 with no odd neighbours, infinities, NaN, subnormals, the extremes, values next to 1, exponents that
overflow and underflow."""


def _pairs() -> tuple[np.ndarray, np.ndarray]:
    x, y = (np.array(v, dtype=F32) for v in zip(*itertools.product(SPECIALS, SPECIALS), strict=True))
    return x, y


def _library(n: int, exponent: float | None = None, opt_level: int = 3):
    """pow over ``n`` elements: of two inputs, or of one input and a constant exponent broadcast to it."""
    b = Builder()
    x = b.param("x", DType.f32, [n])
    params = [x]
    if exponent is None:
        y = b.param("y", DType.f32, [n])
        params.append(y)
    else:
        y = b.const(np.full((1,), exponent, dtype=F32))
    return compile(b.module(b.function("main", params, [b.pow(x, y)])), cache=False, passes="O0",
                   opt_level=opt_level)


def _reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.power(x.astype(np.float64), y.astype(np.float64)).astype(F32)


def _ordered(v: np.ndarray) -> np.ndarray:
    i = v.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def _near_a_tie(x: np.ndarray, y: np.ndarray, within: float = 1e-13) -> np.ndarray:
    """Where C's double ``pow`` lies within ``within`` (relative) of the midpoint between two float32s: there
    an approximation in double may round either way (as :func:`cuvil.codegen.vmath.pow_f32` documents)."""
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), y.astype(np.float64))
        f = exact.astype(F32)
        other = np.where(exact > f, np.nextafter(f, F32(np.inf)), np.nextafter(f, F32(-np.inf)))
        mid = (f.astype(np.float64) + other.astype(np.float64)) / 2
        return np.isfinite(exact) & (np.abs(exact - mid) <= within * np.abs(exact))


def test_special_values_give_c99_results() -> None:
    x, y = _pairs()
    got = np.asarray(_library(x.size)(x, y))
    want = _reference(x, y)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), [(a, b) for a, b in zip(x[np.isnan(got) != nan], y[np.isnan(got) != nan],
                                                                       strict=True)]
    tie = _near_a_tie(x, y)
    assert np.count_nonzero(tie) <= 30  # 0.5 ** 150 (the midpoint of 0 and the least subnormal), (1 - 2^-24) ** 3...
    exact = ~nan & ~tie
    same = got[exact].view(np.uint32) == want[exact].view(np.uint32)
    bad = [(a, b, g, w) for a, b, g, w, s in zip(x[exact], y[exact], got[exact], want[exact], same, strict=True)
           if not s]
    assert not bad, bad[:10]
    assert np.abs(_ordered(got[tie]) - _ordered(want[tie])).max() <= 1


def _drawn() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    n = 1 << 17
    xs = [rng.uniform(0, 4, n), rng.uniform(0, 100, n), np.exp(rng.uniform(-100, 88, n)), -rng.uniform(0, 10, n),
          rng.uniform(-3, 3, n)]
    ys = [rng.uniform(-30, 30, n), rng.uniform(-3, 3, n), rng.uniform(-1.2, 1.2, n),
          rng.integers(-40, 40, n).astype(np.float64), rng.integers(-POW_BY_PRODUCTS - 1, POW_BY_PRODUCTS + 2, n)]
    bits = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32) for _ in range(2)]
    x = np.concatenate([np.concatenate(xs).astype(F32), bits[0]])
    y = np.concatenate([np.concatenate(ys).astype(F32), bits[1]])
    return x, y


def test_pow_is_correctly_rounded_but_within_a_hair_of_a_boundary() -> None:
    x, y = _drawn()
    got = np.asarray(_library(x.size)(x, y))
    want = _reference(x, y)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    off = np.abs(_ordered(got[~nan]) - _ordered(want[~nan]))
    assert off.max() <= 1
    assert np.count_nonzero(off) <= x.size // 100_000, np.count_nonzero(off)
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


EXPONENTS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0, 5.0, 0.5, -0.5, 1.5, -2.5, 0.75, 16777215.0,
             np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("exponent", EXPONENTS, ids=str)
def test_a_constant_exponent_gives_the_bits_of_a_run_time_one(exponent: float) -> None:
    x = np.concatenate([SPECIALS, _drawn()[0][::61]])
    folded = np.asarray(_library(x.size, exponent)(x))
    general = np.asarray(_library(x.size)(x, np.full(x.size, exponent, dtype=F32)))
    assert np.array_equal(folded.view(np.uint32), general.view(np.uint32))


def test_every_lane_and_remainder_computes_the_same_bits() -> None:
    """A vectorized loop body, its scalar remainder (1013 elements) and a one-element library built without
    optimization give identical bits for identical operands."""
    x, y = _pairs()
    pick = np.random.default_rng(2).choice(x.size, 40, replace=False)
    values = list(zip(x[pick], y[pick], strict=True))
    n = 1013
    xs = np.resize(np.array([v[0] for v in values], dtype=F32), n)
    ys = np.resize(np.array([v[1] for v in values], dtype=F32), n)
    got = np.asarray(_library(n)(xs, ys))
    single = _library(1, opt_level=0)
    for k, (a, b) in enumerate(values):
        alone = np.asarray(single(np.array([a], dtype=F32), np.array([b], dtype=F32))).view(np.uint32)[0]
        lanes = got[k::len(values)].view(np.uint32)
        assert np.all(lanes == alone), (a, b)


def _optimized_ir(tmp_path, exponent: float | None) -> str:
    b = Builder()
    x = b.param("x", DType.f32, [4096])
    params = [x]
    if exponent is None:
        y = b.param("y", DType.f32, [4096])
        params.append(y)
    else:
        y = b.const(np.full((1, ), exponent, dtype=F32))
    module = b.module(b.function("main", params, [b.pow(x, y)]))
    build_library(module.main, module.constants, tmp_path, name="pow", keep_ir=True, threads=1)
    return next(tmp_path.glob("*.ll")).read_text()


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0, 0.5])
def test_a_constant_whole_or_half_exponent_folds_to_its_own_path(exponent: float, tmp_path) -> None:
    """With the exponent an immediate, the logarithm and the exponential (the general path's rounding to a
    whole number, its division) are gone from the optimized code; with a run-time exponent they are there."""
    general = _optimized_ir(tmp_path / "general", None)
    folded = _optimized_ir(tmp_path / "folded", exponent)
    assert "llvm.rint" in general and "llvm.rint" not in folded
    assert "fdiv" in general and ("fdiv" in folded) == (exponent < 0)
