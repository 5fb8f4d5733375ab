"""The row-blocked softmax / log_softmax / layer norm kernels are schedules of their rules: the same
bits (up to NaN payloads) as the generic lowering on every shape and axis (rows that do not fill a
block, one-element rows, the axis first, in the middle and last) and on rows holding NaN,
infinities, signed zeros and huge values."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen import kernels, vmath
from cuvil.codegen.artifact import build_library
from cuvil.codegen.kernels.rows import LANES, TILE_LIMIT, row_kernel
from cuvil.codegen.shape_class import ShapeClass
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.types import DimConstraint
from cuvil.runtime.loader import CompiledModel
from tests.oracles import float32_with_specials, same_float32_bits

SHAPES = [((37, 19), -1), ((5, 1), -1), ((1, 7), 0), ((3, 17, 4), 1), ((2, 3, 33), 0), ((16, 128), 1),
          ((2, 4, 9, 31), -1), ((40,), 0),
          ((300, 200), -1),  # enough work for the pool: blocks on both threads, each with its own tile
          ((3, 2100), -1)]  # a tile too large for a thread's stack: the scratch tile, on the calling thread


def _values(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return float32_with_specials(shape, rng, [0.1, 3.0, 40.0], 6)


def _build(op: str, shape: tuple[int, ...], axis: int):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [getattr(b, op)(x, axis=axis)]))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("shape", "axis"), SHAPES, ids=[f"{s}@{a}" for s, a in SHAPES])
def test_kernel_matches_the_rule_lowering_bit_for_bit(op: str, shape: tuple[int, ...], axis: int) -> None:
    module = _build(op, shape, axis)
    fast, generic = _both(module, "softmax rows")
    rng = np.random.default_rng(sum(shape) + axis)
    for _ in range(3):
        x = _values(shape, rng)
        got, want = np.asarray(fast(x)), np.asarray(generic(x))
        assert same_float32_bits(got, want), (op, shape, axis)
        clean = np.where(np.isfinite(x), x, 0).astype(np.float64)
        ref = np.exp(clean - clean.max(axis=axis, keepdims=True))
        ref = ref / ref.sum(axis=axis, keepdims=True)
        finite_rows = np.isfinite(x).all(axis=axis, keepdims=True) & np.ones_like(x, dtype=bool)
        if op == "softmax" and finite_rows.any():  # and it is a softmax
            assert np.allclose(got[finite_rows], ref[finite_rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_blocks_inside_exps_domain_take_the_short_exp_with_the_same_bits(op: str, monkeypatch) -> None:
    """A block of sixteen rows whose exp operands (x - max) all lie in exp's domain computes exp without its
    NaN test and clamp; one special value in one row sends its block to the full exp. Blocks: all ordinary,
    a row whose min - max is exactly the domain's end (-104) or just past it, and a row holding one NaN,
    infinity or huge value (-3e38 would give exp an operand far past the clamp). Every block gives the
    generic lowering's bits."""
    rng = np.random.default_rng(5)
    specials = [None, None, "edge", "past", np.nan, np.inf, -np.inf, -3e38, 3e38]
    x = (rng.standard_normal((16 * len(specials), 40)) * 3).astype(np.float32)
    for block, special in enumerate(specials):
        row = x[16 * block + int(rng.integers(16))]
        if special in ("edge", "past"):
            row[:] = np.clip(row, -40, 40)
            row[3], row[17] = 54.0, -50.0 if special == "edge" else np.nextafter(np.float32(-50.0), np.float32(-51))
        elif special is not None:
            row[int(rng.integers(40))] = special
    module = _build(op, x.shape, -1)
    forms: list[bool] = []
    exp = vmath.exp_f32
    monkeypatch.setattr(vmath, "exp_f32", lambda b, v, inside=False: forms.append(inside) or exp(b, v, inside))
    fast, generic = _both(module, "softmax rows")
    assert True in forms  # the kernel holds the short form beside the full one, chosen per block at run time
    got, want = np.asarray(fast(x)), np.asarray(generic(x))
    assert same_float32_bits(got, want), op
    assert np.float32(54.0) - np.float32(-50.0) == 104.0


def _both(module, kernel: str):
    fast = compile(module, cache=False, passes="O0")
    assert kernel in fast.manifest["kernels"]
    with kernels.generic_only():
        generic = compile(module, cache=False, passes="O0")
    assert kernel not in generic.manifest["kernels"]
    return fast, generic


NORM_SHAPES = [((37, 24), 1), ((3, 5, 8), 1), ((4, 1), 1), ((2, 3, 4, 5), 3), ((70, 256), -1), ((3, 9), 0),
               ((400, 160), -1)]


@pytest.mark.parametrize(("shape", "axis"), NORM_SHAPES, ids=[f"{s}@{a}" for s, a in NORM_SHAPES])
@pytest.mark.parametrize("epsilon", [1e-5, 1e-12, 0.1])
def test_layer_norm_kernel_matches_the_rule_lowering_bit_for_bit(shape, axis, epsilon) -> None:
    tail = list(shape[axis % len(shape):])
    b = Builder()
    x, g, beta = b.param("x", DType.f32, list(shape)), b.param("g", DType.f32, tail), b.param("b", DType.f32, tail)
    module = b.module(b.function("main", [x, g, beta], [b.layer_norm(x, g, beta, axis=axis, epsilon=epsilon)]))
    fast, generic = _both(module, "layer norm rows")
    rng = np.random.default_rng(len(shape) + axis)
    for _ in range(3):
        args = [_values(shape, rng), _values(tuple(tail), rng), _values(tuple(tail), rng)]
        got, want = np.asarray(fast(*args)), np.asarray(generic(*args))
        assert same_float32_bits(got, want), (shape, axis, epsilon)
    clean = [rng.standard_normal(shape).astype(np.float32) * 5, *(rng.standard_normal(tail).astype(np.float32)
                                                                    for _ in range(2))]
    axes = tuple(range(axis % len(shape), len(shape)))
    x64 = clean[0].astype(np.float64)
    ref = (x64 - x64.mean(axes, keepdims=True)) / np.sqrt(x64.var(axes, keepdims=True) + epsilon) * clean[1] + clean[2]
    assert np.allclose(np.asarray(fast(*clean)), ref, rtol=1e-4, atol=1e-4)  # and it is a layer norm


def test_large_work_runs_on_the_pool_and_long_rows_on_the_scratch_tile() -> None:
    big, long_row = row_kernel(_build("softmax", (300, 200), -1).main.results[0]), \
        row_kernel(_build("softmax", (3, 2100), -1).main.results[0])
    assert big is not None and big.on_stack and big.scratch_bytes == 0
    assert long_row is not None and not long_row.on_stack and long_row.scratch_bytes == 2100 * LANES * 4


def test_kernels_are_chosen_only_where_they_apply() -> None:
    b = Builder()
    x32, x16 = b.param("a", DType.f32, [4, 8]), b.param("b", DType.f16, [4, 8])
    long_row = b.param("c", DType.f32, [2, TILE_LIMIT // (4 * LANES) + 1])
    g8, g1 = b.param("g", DType.f32, [8]), b.param("g1", DType.f32, [1])
    assert row_kernel(b.softmax(x32, axis=-1)) is not None
    assert row_kernel(b.softmax(x16, axis=-1)) is None  # halves keep the rule's rounding path
    assert row_kernel(b.softmax(long_row, axis=-1)) is None  # the tile would be too large
    assert row_kernel(b.exp(x32)) is None
    assert row_kernel(b.layer_norm(x32, g8, g8, axis=-1)) is not None
    assert row_kernel(b.layer_norm(x32, g1, g8, axis=-1)) is None  # a broadcast scale stays generic


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm"])
def test_shape_class_library_reads_the_row_dims_at_run_time(op: str, tmp_path) -> None:
    """One library for x[B, H, T, T] (softmax over the last T) or x[B, T, 24] (layer norm over 24): the
    kernel reads B and T per call, its tile sized for T's largest value; the same bits as the generic
    lowering at every size, and as a library specialized to that size."""
    b = Builder()
    constraints = [DimConstraint("B", hi=3), DimConstraint("T", hi=40)]
    if op == "layer_norm":
        x = b.param("x", DType.f32, ["B", "T", 24])
        g, beta = b.param("g", DType.f32, [24]), b.param("b", DType.f32, [24])
        params, y = [x, g, beta], b.layer_norm(x, g, beta, axis=-1, epsilon=1e-5)
    else:
        x = b.param("x", DType.f32, ["B", 2, "T", "T"])
        params, y = [x], getattr(b, op)(x, axis=-1)
    module = b.module(b.function("main", params, [y], ["y"], constraints))
    fn = module.main
    art = build_library(fn, module.constants, tmp_path / "fast", name="rows", shape_class=ShapeClass.of(fn))
    fast = CompiledModel(art.library_path)
    assert {"softmax rows", "layer norm rows"} & set(fast.manifest["kernels"])
    with kernels.generic_only():
        art = build_library(fn, module.constants, tmp_path / "generic", name="rows", shape_class=ShapeClass.of(fn))
    generic = CompiledModel(art.library_path)
    rng = np.random.default_rng(5)
    for batch, t in [(1, 1), (3, 17), (2, 40), (1, 16)]:
        shape = (batch, t, 24) if op == "layer_norm" else (batch, 2, t, t)
        args = [_values(shape, rng)] + ([_values((24,), rng), _values((24,), rng)] if op == "layer_norm" else [])
        got, want = np.asarray(fast(*args)), np.asarray(generic(*args))
        assert got.shape == shape and same_float32_bits(got, want), (op, batch, t)


def _same_half_bits(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(want.astype(np.float32))
    return bool(np.array_equal(np.isnan(got.astype(np.float32)), nan)
                and np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16)))


@pytest.mark.parametrize("half", [DType.f16, DType.bf16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm"])
def test_half_rows_run_the_float32_kernel_widened(op: str, half: DType) -> None:
    """A float16 / bfloat16 softmax, log_softmax or layer norm is computed in float32 from its widened
    operands and rounded once (its rule): the float32 row kernel between a widening and a rounding gives
    the rule's bits, those of the generic lowering, on rows with infinities, NaN, huge and tiny halves
    (a layer norm's scale and bias halves too)."""
    rng = np.random.default_rng(41)
    shape, axis = (37, 200), -1
    b = Builder()
    x = b.param("x", half, list(shape))
    if op == "layer_norm":
        scale = b.const((rng.standard_normal(shape[-1]) * 2).astype(half.np))
        bias = b.const(rng.standard_normal(shape[-1]).astype(half.np))
        y = b.layer_norm(x, scale, bias, axis=axis, epsilon=1e-5)
        kernel = "layer norm rows, halves widened"
    else:
        y = getattr(b, op)(x, axis=axis)
        kernel = "softmax rows, halves widened"
    module = b.module(b.function("main", [x], [y]))
    fast, generic = _both(module, kernel)
    values = _values(shape, rng)
    values[0] = 3e4  # a row of halves at float16's top
    values[1, :5] = [6e-8, -6e-8, 1e-38, 60000.0, -60000.0]
    xs = values.astype(half.np)
    got, want = np.asarray(fast(xs)), np.asarray(generic(xs))
    assert got.dtype == half.np and _same_half_bits(got, want), (op, half)
