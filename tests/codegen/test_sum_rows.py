"""Float32 ``reduce_sum`` / ``reduce_mean`` over consecutive axes in lane blocks (cuvil.codegen.kernels.rows
SumRowsKernel) are schedules of their rules: each row summed from -0.0 in order, so the generic lowering's
bits (up to NaN payloads) on every layout (the axes first, in the middle, last; rows and lengths that do not
fill sixteen; strided rows) and on rows of NaN, infinities, signed zeros and huge values, on one thread and
on the pool."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.codegen.kernels.rows import sum_rows_kernel
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import float32_with_specials, same_float32_bits

CASES = [((1, 384, 28, 28), (2, 3)), ((1, 40, 7, 7), (2, 3)), ((37, 19), (1,)), ((3, 17, 5), (1,)),
         ((2, 3, 33, 4), (1, 2)), ((5, 40), (0,)), ((2, 33), (-1,)), ((17, 16), (1,)), ((4, 5, 6), (0, 1)),
         ((1, 256, 64, 64), (2, 3))]  # enough work for the pool


def _values(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return float32_with_specials(shape, rng, [0.01, 3.0, 1e4], 50)


def _module(op: str, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool = True):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    y = getattr(b, op)(x, axes=axes, keepdims=keepdims)
    return b.module(b.function("main", [x], [y])), y


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
@pytest.mark.parametrize(("shape", "axes"), CASES, ids=[f"{s}@{a}" for s, a in CASES])
def test_rows_give_the_rule_lowerings_bits(shape, axes, op: str, threads: int) -> None:
    module, _ = _module(op, shape, axes, keepdims=len(shape) % 2 == 0)
    fast = compile(module, cache=False, passes="O0", threads=threads)
    assert fast.manifest["kernels"] == ["mean rows" if op == "reduce_mean" else "sum rows"]
    with kernels.generic_only():
        generic = compile(module, cache=False, passes="O0", threads=threads)
    rng = np.random.default_rng(len(shape) * 7 + sum(shape))
    for clean in (True, False):
        x = rng.standard_normal(shape).astype(np.float32) if clean else _values(shape, rng)
        got, want = np.asarray(fast(x)), np.asarray(generic(x))
        assert same_float32_bits(got, want), (shape, axes, op)
        if clean:
            ref = getattr(x.astype(np.float64), "mean" if op == "reduce_mean" else "sum")(
                axis=tuple(a % len(shape) for a in axes))
            np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_a_row_of_negative_zeros_sums_to_negative_zero() -> None:
    """The fold starts from -0.0 (the rule folds from its first term): +0.0 would turn such rows positive."""
    module, _ = _module("reduce_sum", (20, 37), (1,))
    x = np.full((20, 37), -0.0, np.float32)
    x[3, 5] = 0.0
    got = np.asarray(compile(module, cache=False, passes="O0")(x)).reshape(-1)
    assert np.signbit(got).tolist() == [k != 3 for k in range(20)]


@pytest.mark.parametrize(("dtype", "shape", "axes"), [
    (DType.f32, (4, 5, 6), (0, 2)),  # axes that are not consecutive
    (DType.f32, (1, 300), (1,)),  # one row: a single chain of adds
    (DType.f32, (7, 8), ()),  # every axis: one row
    (DType.f16, (8, 40), (1,)),  # halves sum in float32 and round once: another rule
    (DType.f64, (8, 40), (1,)),
    (DType.f32, (8, 0), (0,)),  # empty
])
def test_what_stays_on_the_generic_lowering(dtype: DType, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    b = Builder()
    x = b.param("x", dtype, list(shape))
    assert sum_rows_kernel(b.reduce_mean(x, axes=axes, keepdims=True)) is None
    assert sum_rows_kernel(b.reduce_max(x, axes=axes, keepdims=True)) is None
