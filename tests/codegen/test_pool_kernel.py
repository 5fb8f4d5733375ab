"""The max-pool kernel (cuvil.codegen.kernels.pool) against max_pool's rule, bit for bit: window
geometries (strides, pads past the kernel, dilations, ceil mode, rows and columns wholly in the padding)
and the values where the order of the fold shows (ties of +0 and -0, NaNs, infinities)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuvil.codegen.kernels import pool
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference

GEOMETRIES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((1, 64, 112, 112), {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),  # ResNet's stem
    ((2, 3, 9, 10), {"kernel": (2, 2), "strides": (2, 2)}),
    ((1, 2, 7, 7), {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}),
    ((1, 2, 8, 9), {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
    ((1, 2, 6, 11), {"kernel": (1, 5), "strides": (1, 3), "pads": (0, 2, 0, 2)}),
    ((1, 2, 9, 9), {"kernel": (3, 2), "strides": (2, 1), "dilations": (2, 3), "pads": (2, 1, 2, 3)}),
    ((1, 1, 3, 3), {"kernel": (2, 2), "strides": (1, 1), "pads": (2, 2, 2, 2)}),  # windows all padding: -inf
    ((1, 3, 40, 37), {"kernel": (3, 3), "strides": (3, 3), "pads": (0, 1, 2, 1)}),
    # stride 2 across with a dilated, wide kernel and pads on both sides: rows longer than two vectors
    ((1, 2, 10, 75), {"kernel": (2, 3), "strides": (1, 2), "dilations": (1, 2), "pads": (0, 2, 1, 3)}),
    # stride 2 across: edge blocks on both sides of plain ones, and more edge blocks than are unrolled
    ((1, 2, 5, 150), {"kernel": (2, 3), "strides": (2, 2), "pads": (0, 1, 1, 1)}),
    ((1, 1, 3, 400), {"kernel": (1, 3), "strides": (1, 2), "dilations": (1, 80), "pads": (0, 160, 0, 160)}),
]


def _module(shape: tuple[int, ...], attrs: dict[str, Any]):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [b.max_pool(x, **attrs)]))


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, any NaN equal to any NaN (the exactness the proofs use)."""
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(got.view(np.uint32)[~nan],
                                                                       want.view(np.uint32)[~nan]))


def _hostile(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Mostly signed zeros (ties whose order decides the sign), some NaNs and infinities, a few numbers."""
    x = rng.choice(np.array([0.0, -0.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -2.0], np.float32), size=shape)
    return x.astype(np.float32)


@pytest.mark.parametrize("by_rows", [True, False], ids=["rows-first", "windows"])
@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
def test_max_pool_kernel_is_the_rule_bit_for_bit(case: int, by_rows: bool, monkeypatch) -> None:
    """Both schedules of a stride of 2 across (each row's maxima first where they fit the stack, each
    output's whole window otherwise) and the windows of every other stride."""
    if not by_rows:
        monkeypatch.setattr(pool, "ROWS_MAX_BYTES", 0)
    shape, attrs = GEOMETRIES[case]
    module = _module(shape, attrs)
    model = compile(module, cache=False, threads=2)
    assert model.manifest["kernels"] == ["max_pool.rows"]
    rng = np.random.default_rng(case)
    for x in (rng.standard_normal(shape).astype(np.float32), _hostile(rng, shape),
              np.where(rng.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)):
        (want,) = rule_reference(module, [x])
        got = np.asarray(model(x))
        assert _same(got, want), (shape, attrs)


def test_row_pass_reads_plain_vectors_between_its_edge_blocks() -> None:
    """The blocks of a stride-2 row pass whose taps all lie inside the row, for the geometries above."""
    def blocks(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, int, int]:
        v = _module(shape, attrs).functions[0].results[0]
        kernel = pool.max_pool_kernel(v)
        assert kernel is not None
        return (*kernel._inside_blocks(16), kernel._row_floats // 16)

    assert blocks(*GEOMETRIES[0]) == (1, 3, 4)  # ResNet's stem: 56 outputs, the first and last blocks masked
    assert blocks(*GEOMETRIES[-2]) == (1, 4, 5)
    lo, hi, count = blocks(*GEOMETRIES[-1])
    assert lo == 5 and count - (hi - lo) > pool.EDGE_BLOCKS_MAX  # the masked loop instead of unrolled blocks


def test_max_pool_kernel_keeps_the_later_of_tied_zeros() -> None:
    """A fold from -inf where a tie gives the later tap: +0 then -0 in one window is -0, and -0 then +0
    is +0; a fold in another order, or a max that prefers the first, gives the other sign."""
    module = _module((1, 1, 1, 2), {"kernel": (1, 2)})
    model = compile(module, cache=False)
    for pair in ((0.0, -0.0), (-0.0, 0.0)):
        x = np.array(pair, np.float32).reshape(1, 1, 1, 2)
        got = np.asarray(model(x)).reshape(-1)[0]
        assert np.signbit(got) == np.signbit(np.float32(pair[1]))
        (want,) = rule_reference(module, [x])
        assert _same(np.asarray(model(x)), want)


def test_other_pools_keep_the_generic_lowering() -> None:
    b = Builder()
    x = b.param("x", DType.f16, [1, 2, 8, 8])
    assert pool.max_pool_kernel(b.max_pool(x, kernel=(2, 2))) is None  # float16: the rule lowering
    y = b.param("y", DType.f32, [1, 2, 8])
    assert pool.max_pool_kernel(b.max_pool(y, kernel=(2,))) is None  # 1-D
    z = b.param("z", DType.f32, [1, 2, 8, 8])
    indices = b.max_pool(z, kernel=(2, 2), output="indices")
    assert pool.max_pool_kernel(indices) is None
