"""The row-blocked softmax / log_softmax kernel is a schedule of the rule: the same bits as the generic
lowering on every shape and axis (rows that do not fill a block, one-element rows, the axis first,
in the middle and last) and on rows holding NaN, infinities, signed zeros and huge values."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.codegen.kernels.softmax import LANES, TILE_LIMIT, softmax_kernel
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

SHAPES = [((37, 19), -1), ((5, 1), -1), ((1, 7), 0), ((3, 17, 4), 1), ((2, 3, 33), 0), ((16, 128), 1),
          ((2, 4, 9, 31), -1), ((40,), 0)]


def _values(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal(shape) * rng.choice([0.1, 3.0, 40.0], shape)).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-45], dtype=np.float32)
    pick = rng.choice(flat.size, size=max(1, flat.size // 6), replace=False)
    flat[pick] = rng.choice(specials, pick.size)
    return x


def _build(op: str, shape: tuple[int, ...], axis: int):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [getattr(b, op)(x, axis=axis)]))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("shape", "axis"), SHAPES, ids=[f"{s}@{a}" for s, a in SHAPES])
def test_kernel_matches_the_rule_lowering_bit_for_bit(op: str, shape: tuple[int, ...], axis: int) -> None:
    module = _build(op, shape, axis)
    fast = compile(module, cache=False, passes="O0")
    assert "softmax rows" in fast.manifest["kernels"]
    with kernels.generic_only():
        generic = compile(module, cache=False, passes="O0")
    assert "softmax rows" not in generic.manifest["kernels"]
    rng = np.random.default_rng(sum(shape) + axis)
    for _ in range(3):
        x = _values(shape, rng)
        got, want = np.asarray(fast(x)), np.asarray(generic(x))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (op, shape, axis)
        clean = np.where(np.isfinite(x), x, 0).astype(np.float64)
        ref = np.exp(clean - clean.max(axis=axis, keepdims=True))
        ref = ref / ref.sum(axis=axis, keepdims=True)
        finite_rows = np.isfinite(x).all(axis=axis, keepdims=True) & np.ones_like(x, dtype=bool)
        if op == "softmax" and finite_rows.any():  # and it is a softmax
            assert np.allclose(got[finite_rows], ref[finite_rows], rtol=1e-5, atol=1e-6)


def test_kernel_is_chosen_only_where_it_applies() -> None:
    b = Builder()
    x32, x16 = b.param("a", DType.f32, [4, 8]), b.param("b", DType.f16, [4, 8])
    long_row = b.param("c", DType.f32, [2, TILE_LIMIT // (4 * LANES) + 1])
    assert softmax_kernel(b.softmax(x32, axis=-1)) is not None
    assert softmax_kernel(b.softmax(x16, axis=-1)) is None  # halves keep the rule's rounding path
    assert softmax_kernel(b.softmax(long_row, axis=-1)) is None  # the tile would be too large
    assert softmax_kernel(b.exp(x32)) is None
