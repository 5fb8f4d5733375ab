"""The max- and average-pool kernels (cuvil.codegen.kernels.pool) against their ops' rules, bit for bit:
window geometries (strides, pads past the kernel, dilations, ceil mode, rows and columns wholly in the
padding, padding counted or not) and the values where the order of the fold shows (ties of +0 and -0,
NaNs, infinities, sums whose rounding depends on the order of their terms)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.codegen.kernels import force_isa, pool
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference, same_float32_bits

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
    ((1, 3, 20, 20), {"kernel": (5, 5), "strides": (1, 1), "pads": (2, 2, 2, 2)}),  # YOLO's SPPF
    ((1, 2, 14, 40), {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),  # rows wider than a vector
]


def _module(shape: tuple[int, ...], attrs: dict[str, Any], op: str = "max_pool"):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [getattr(b, op)(x, **attrs)]))


def _hostile(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Mostly signed zeros (ties whose order decides the sign), some NaNs and infinities, a few numbers."""
    x = rng.choice(np.array([0.0, -0.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -2.0], np.float32), size=shape)
    return x.astype(np.float32)


SCHEDULES = ["rows-first", "padded", "edges"]
"""At a stride of 2 across, each row's maxima first where they fit the stack; else each output's whole
window, over a padded copy of the plane where that fits, else loading a row's ends under a branch."""


def _schedule(monkeypatch, schedule: str) -> None:
    if schedule != "rows-first":
        monkeypatch.setattr(pool, "ROWS_MAX_BYTES", 0)
    if schedule == "edges":
        monkeypatch.setattr(pool, "PADDED_MAX_BYTES", 0)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
def test_max_pool_kernel_is_the_rule_bit_for_bit(case: int, schedule: str, monkeypatch) -> None:
    """Every schedule (:data:`SCHEDULES`) of every geometry."""
    _schedule(monkeypatch, schedule)
    shape, attrs = GEOMETRIES[case]
    module = _module(shape, attrs)
    model = compile(module, cache=False, threads=2)
    assert model.manifest["kernels"] == ["max_pool.rows"]
    rng = np.random.default_rng(case)
    for x in (rng.standard_normal(shape).astype(np.float32), _hostile(rng, shape),
              np.where(rng.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)):
        (want,) = rule_reference(module, [x])
        got = np.asarray(model(x))
        assert same_float32_bits(got, want), (shape, attrs)


def _cancelling(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Large terms of both signs beside small ones: a window's float32 sum rounds differently in
    another order of its terms."""
    big = rng.choice(np.array([3e7, -3e7, 1.0, -1.0, 0.25], np.float32), size=shape)
    return (big * rng.uniform(0.5, 1.5, shape)).astype(np.float32)


@pytest.mark.parametrize("schedule", SCHEDULES[1:])
@pytest.mark.parametrize("count_include_pad", [False, True], ids=["inside", "with-pads"])
@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
def test_avg_pool_kernel_is_the_rule_bit_for_bit(case: int, count_include_pad: bool, schedule: str,
                                                 monkeypatch) -> None:
    """Every window summed in the rule's order and divided by its count (the padding counted or not; a
    window wholly in the padding, which counts nothing, gives the rule's 0 / 0), over a padded copy of
    the plane or not."""
    _schedule(monkeypatch, schedule)
    shape, attrs = GEOMETRIES[case]
    module = _module(shape, {**attrs, "count_include_pad": count_include_pad}, "avg_pool")
    model = compile(module, cache=False, threads=2)
    assert model.manifest["kernels"] == ["avg_pool.rows"]
    rng = np.random.default_rng(case)
    for x in (rng.standard_normal(shape).astype(np.float32), _hostile(rng, shape), _cancelling(rng, shape),
              np.full(shape, -0.0, np.float32)):
        (want,) = rule_reference(module, [x])
        got = np.asarray(model(x))
        assert same_float32_bits(got, want), (shape, attrs)


def test_avg_pool_sum_shows_its_order() -> None:
    """A window whose float32 sum depends on the order of its terms: 3e7 + 1 + 1 (each 1 lost to rounding)
    is not 1 + 1 + 3e7; and -0.0 alone inside the input stays -0.0 where a padded tap would give +0.0."""
    module = _module((1, 1, 1, 3), {"kernel": (1, 3)}, "avg_pool")
    model = compile(module, cache=False)
    for row in ((3e7, 1.0, 1.0), (1.0, 1.0, 3e7), (-0.0, -0.0, -0.0)):
        x = np.array(row, np.float32).reshape(1, 1, 1, 3)
        got = np.asarray(model(x)).reshape(-1)[0]
        total = np.float32(0.0) * -1
        for t in x.reshape(-1):
            total = np.float32(total + t)
        assert got.view(np.uint32) == np.float32(total / np.float32(3)).view(np.uint32), row


def test_row_pass_reads_plain_vectors_between_its_edge_blocks() -> None:
    """The blocks of a stride-2 row pass whose taps all lie inside the row, for the geometries above."""
    def blocks(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, int, int]:
        v = _module(shape, attrs).functions[0].results[0]
        kernel = pool.max_pool_kernel(v)
        assert kernel is not None
        force_isa("avx512")  # rows in vectors of 16, whatever the host (nothing is compiled here)
        try:
            return (*kernel._inside_blocks(16), kernel._row_floats // 16)
        finally:
            force_isa(None)

    assert blocks(*GEOMETRIES[0]) == (1, 3, 4)  # ResNet's stem: 56 outputs, the first and last blocks masked
    assert blocks(*GEOMETRIES[9]) == (1, 4, 5)
    assert blocks(*GEOMETRIES[12]) == (1, 2, 3)  # stride 1: 40 outputs in three blocks, the middle one plain
    lo, hi, count = blocks(*GEOMETRIES[10])
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
        assert same_float32_bits(np.asarray(model(x)), want)


@pytest.mark.parametrize("half", [DType.f16, DType.bf16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", [0, 2, 6, 9, 11])
def test_half_max_pool_runs_widened_and_is_the_rule_bit_for_bit(case: int, half: DType) -> None:
    """A float16 or bfloat16 max pool runs on the float32 kernel between a widening and a rounding: the same
    bits as the rule (the interpreter) and the generic lowering, on numbers, ties of signed zeros, NaNs and
    infinities, and halves' extremes (the largest and smallest float16 values, float16 subnormals)."""
    shape, attrs = GEOMETRIES[case]
    b = Builder()
    x = b.param("x", half, list(shape))
    module = b.module(b.function("main", [x], [b.max_pool(x, **attrs)]))
    model = compile(module, cache=False)
    assert model.manifest["kernels"] == ["max_pool.rows, halves widened"]
    with kernels.generic_only():
        generic = compile(module, cache=False)
    rng = np.random.default_rng(case)
    extremes = np.array([65504.0, -65504.0, 6.0e-8, -6.0e-8, 6.1e-5, 0.0, -0.0], np.float32)
    for values in (rng.standard_normal(shape).astype(np.float32), _hostile(rng, shape),
                   rng.choice(extremes, size=shape).astype(np.float32)):
        xh = values.astype(half.np)
        (want,) = rule_reference(module, [xh])
        got, slow = np.asarray(model(xh)), np.asarray(generic(xh))
        assert got.dtype == half.np and got.shape == want.shape
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (shape, attrs)
        assert np.array_equal(got.view(np.uint16), slow.view(np.uint16)), (shape, attrs)


def test_other_pools_keep_the_generic_lowering() -> None:
    b = Builder()
    x = b.param("x", DType.f16, [1, 2, 8, 8])
    assert pool.avg_pool_kernel(b.avg_pool(x, kernel=(2, 2))) is None  # float16 sums round at every step
    assert pool.max_pool_kernel(b.max_pool(b.param("i", DType.i32, [1, 2, 8, 8]), kernel=(2, 2))) is None
    y = b.param("y", DType.f32, [1, 2, 8])
    assert pool.max_pool_kernel(b.max_pool(y, kernel=(2,))) is None  # 1-D
    assert pool.avg_pool_kernel(b.avg_pool(y, kernel=(2,))) is None
    assert pool.avg_pool_kernel(b.max_pool(x, kernel=(2, 2))) is None
    z = b.param("z", DType.f32, [1, 2, 8, 8])
    indices = b.max_pool(z, kernel=(2, 2), output="indices")
    assert pool.max_pool_kernel(indices) is None
