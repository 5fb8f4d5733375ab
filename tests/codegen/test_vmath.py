"""The inline float32 exp, tanh and erf of the generated code (cuvil.codegen.vmath).

Each is compared bit for bit with the float64 function rounded to float32 on every special value,
the thresholds where the result saturates, under- or overflows, and a few hundred thousand inputs
drawn over all bit patterns and over the range where the function varies. The same input must give
the same bits in a vectorized loop body, in its scalar remainder, in a one-element library and in
a tuned GEMM's epilogue: the proofs read a transcendental as one function of its operand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.codegen import vmath
from cuvil.codegen.lower_rule import ERF_BLOCK
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

_erf64 = np.vectorize(math.erf, otypes=[np.float64])

REFERENCE = {"exp": np.exp, "tanh": np.tanh, "erf": _erf64}
"""float64 references: rounded once to float32, each is the correctly rounded float32 result except where
the exact value lies within about 1e-16 of a rounding boundary."""

SPREAD = {"exp": 110.0, "tanh": 12.0, "erf": 5.0}
"""Where each function is neither constant nor saturated in float32."""


def _edges() -> np.ndarray:
    f32 = np.finfo(np.float32)
    points = [0.0, 1.0, 2.0, 2.25, 3.0, 4.0, 0.0625, 9.01, 10.0, 3.92, 88.72283, 88.7228394, -87.33654, -103.27893,
              -103.972084, -104.0, 89.0, 0.5 * math.log(2.0), math.log(2.0), 1e-30, 1e-40, float(f32.tiny),
              float(f32.smallest_subnormal), float(f32.max), float(f32.eps)]
    out = []
    with np.errstate(over="ignore"):  # the float after the largest is inf
        for p in points:
            v = np.float32(p)
            for q in (v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))):
                out += [q, -q]
    out += [np.float32(np.inf), np.float32(-np.inf), np.float32(-0.0)]
    return np.array(out, dtype=np.float32)


def _inputs(fn: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[~np.isnan(bits)]
    spread = rng.uniform(-SPREAD[fn], SPREAD[fn], 1 << 17).astype(np.float32)
    small = (rng.uniform(-1, 1, 1 << 14) * 2.0 ** rng.integers(-40, 0, 1 << 14)).astype(np.float32)
    return np.concatenate([_edges(), bits, spread, small])


def _library(fn: str, n: int, opt_level: int = 3):
    b = Builder()
    x = b.param("x", DType.f32, [n])
    return compile(b.module(b.function("main", [x], [getattr(b, fn)(x)])), cache=False, passes="O0",
                   opt_level=opt_level)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def ordered(v: np.ndarray) -> np.ndarray:
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_inline_transcendental_is_correctly_rounded(fn: str) -> None:
    x = _inputs(fn)
    got = np.asarray(_library(fn, x.size)(x))
    with np.errstate(over="ignore", invalid="ignore"):
        want = REFERENCE[fn](x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # odd functions keep the sign of zero
    off = _ulps(got, want)
    assert off.max() <= 1, (fn, x[off.argmax()], got[off.argmax()], want[off.argmax()])
    assert np.count_nonzero(off) <= x.size // 100_000, (fn, np.count_nonzero(off))


@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_inline_transcendental_propagates_nan(fn: str) -> None:
    x = np.array([np.nan, -np.nan, 1.0, np.nan], dtype=np.float32)
    x[3:] = np.array([0x7FA00000], dtype=np.uint32).view(np.float32)  # a signaling NaN comes out quiet
    got = np.asarray(_library(fn, x.size)(x))
    assert np.isnan(got[[0, 1, 3]]).all() and not np.isnan(got[2])
    assert got[3:].view(np.uint32)[0] & 0x00400000


@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_every_lane_and_remainder_computes_the_same_bits(fn: str) -> None:
    """A loop body that LLVM vectorizes, its scalar remainder (1013 elements) and a one-element library
    (no vector loop at all) give identical bits for identical inputs."""
    values = _inputs(fn)[::997][:7]
    n = 1013
    x = np.resize(values, n)
    got = np.asarray(_library(fn, n)(x))
    single = _library(fn, 1, opt_level=0)
    for k, v in enumerate(values):
        lanes = got[k::len(values)]
        alone = np.asarray(single(np.array([v], dtype=np.float32)))
        assert np.array_equal(lanes.view(np.uint32), np.full(lanes.size, alone.view(np.uint32)[0])), (fn, v)


@pytest.mark.parametrize("fn", ["exp", "tanh", "erf"])
def test_tuned_epilogue_computes_the_same_bits(fn: str) -> None:
    """A matmul whose epilogue is the function runs on the tuned GEMM with the function in its tile loop:
    its bits are the function's, applied by the rule lowering to the same GEMM's product."""
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((24, 40)).astype(np.float32) * 0.3, rng.standard_normal((40, 48)).astype(np.float32)]

    def product(epilogue: str | None):
        b = Builder()
        x, w = b.param("x", DType.f32, [24, 40]), b.param("w", DType.f32, [40, 48])
        y = b.matmul(x, w)
        compiled = compile(b.module(b.function("main", [x, w], [getattr(b, epilogue)(y) if epilogue else y])),
                           cache=False)
        assert set(compiled.manifest["kernels"]) - {"rule"}, "the product must run on the tuned GEMM"
        return np.asarray(compiled(*args))

    fused = product(fn)
    z = product(None)
    alone = np.asarray(_library(fn, z.size)(z.ravel())).reshape(z.shape)
    assert np.array_equal(fused.view(np.uint32), alone.view(np.uint32))


def _erf_block_inputs(scale: float) -> np.ndarray:
    """Blocks of :data:`ERF_BLOCK` erf operands (``x * scale``) laid out so that each kind of block occurs:
    all below the small bound (up to the float below it, zeros, tiny values, a NaN), below the split but for
    one element at or past the small bound, all near the origin (up to the float below the split), near but
    for one far element (exactly at the split, or past it, first or last), all far (up to inf), and a short
    last block whose only far element is its last."""
    rng = np.random.default_rng(11)
    split, small = np.float32(vmath.ERF_SPLIT), np.float32(vmath.ERF_SMALL)
    below, below_small = np.nextafter(split, np.float32(0)), np.nextafter(small, np.float32(0))

    def within(bound: np.float32) -> np.ndarray:
        return rng.uniform(-float(bound), float(bound), ERF_BLOCK).astype(np.float32)

    def near() -> np.ndarray:
        return within(below)

    blocks = [near() for _ in range(6)] + [within(below_small) for _ in range(3)]
    blocks[0][:2] = [below, -below]
    blocks[1][-1] = split
    blocks[2][0] = -split
    blocks[3][ERF_BLOCK // 2] = 3.0
    blocks[4] = rng.uniform(float(split), 6.0, ERF_BLOCK).astype(np.float32) * rng.choice([-1, 1], ERF_BLOCK)
    blocks[4][:2] = [np.inf, -np.inf]
    blocks[6][:6] = [below_small, -below_small, 0.0, -0.0, 1e-40, np.nan]
    blocks[7][-1] = -small
    blocks[8][3] = np.nextafter(small, np.float32(2))
    tail = near()[:37]
    tail[-1] = np.float32(-2.5)
    return np.concatenate([*blocks, tail]).astype(np.float32) / np.float32(scale)


@pytest.mark.parametrize("fn, scale", [("erf", 1.0), ("gelu", float(np.float32(1 / math.sqrt(2.0))))])
def test_erf_in_blocks_computes_the_same_bits_as_alone(fn: str, scale: float) -> None:
    """A loop long enough to run in blocks (erf's shorter form where every operand of the block is below the
    small bound, its near form where none reaches the far polynomial, both where one does) gives, element
    for element, the bits of a one-element library, which has no blocks. With GELU the erf operand
    (``x / sqrt 2``) is computed before the block is chosen and read back by the second pass."""
    x = _erf_block_inputs(scale)
    assert x.size % ERF_BLOCK and x.size > 5 * ERF_BLOCK
    got = np.asarray(_library(fn, x.size)(x))
    single = _library(fn, 1, opt_level=0)
    alone = np.concatenate([np.asarray(single(x[k:k + 1])) for k in range(x.size)])
    same = (got.view(np.uint32) == alone.view(np.uint32)) | (np.isnan(got) & np.isnan(alone))
    assert same.all(), (fn, x[~same][:4], got[~same][:4], alone[~same][:4])
    want = REFERENCE["erf"](x.astype(np.float64) * scale).astype(np.float32)
    if fn == "erf":  # and they are erf's bits: the near form is not also used where it is wrong
        assert _ulps(got[~np.isnan(x)], want[~np.isnan(x)]).max() <= 1


def test_a_long_erf_loop_has_both_forms() -> None:
    """The kernel of a long erf loop holds a small, a near and a full pass per block; a short one only the full
    loop (the test above then compares two different loops, not one with itself)."""
    from llvmlite import ir as llvm_ir

    from cuvil.codegen.lower_rule import RuleKernel
    from cuvil.ir.opdef import get_op
    from cuvil.ir.types import TensorType

    def blocks(n: int) -> set[str]:
        t = TensorType(DType.f32, (n,))
        module = llvm_ir.Module()
        fn = RuleKernel(module, "k", get_op("erf").make_rule([t], {}, t), [t], t, "erf").emit()
        return {part for blk in fn.blocks for part in blk.name.split(".")}

    assert {"small", "near", "full", "scan"} <= blocks(3 * ERF_BLOCK + 5)
    assert not {"small", "near", "scan"} & blocks(ERF_BLOCK)


def test_erf_in_a_gemm_epilogue_chooses_its_form_per_tile_row() -> None:
    """A matmul whose epilogue is erf computes each tile row in two passes (the shorter form where every
    operand of the row is below the small bound, the near form where none reaches the far polynomial): with
    an identity rhs the operands are the lhs itself, laid out so that rows are all small, small but for one
    element at the bound or past it (in an edge tile), all near, near but for one element at or past the
    split (first, last, in an edge tile), or all far; the bits are erf's on the same values, computed alone."""
    rng = np.random.default_rng(13)
    split = np.float32(vmath.ERF_SPLIT)
    below = np.nextafter(split, np.float32(0))
    m, n = 9, 150  # several column tiles, the last one partial
    x = rng.uniform(-float(below), float(below), (m, n)).astype(np.float32)
    x[0, :4] = [below, -below, 1e-40, 0.0]
    x[1, -1] = split
    x[2, 0] = -split
    x[3, 140] = 3.0  # in the edge tile
    x[4] = rng.uniform(float(split), 5.0, n).astype(np.float32)
    x[5, 70] = -2.5
    small = np.float32(vmath.ERF_SMALL)
    below_small = np.nextafter(small, np.float32(0))
    x[6:] = rng.uniform(-float(below_small), float(below_small), (m - 6, n)).astype(np.float32)
    x[6, :2] = [below_small, -below_small]
    x[7, 100] = small
    x[8, 145] = -below  # in the edge tile
    b = Builder()
    xp = b.param("x", DType.f32, [m, n])
    y = b.erf(b.matmul(xp, b.const(np.eye(n, dtype=np.float32))))
    fused = compile(b.module(b.function("main", [xp], [y])), cache=False)
    assert set(fused.manifest["kernels"]) - {"rule"}, "the product must run on the tuned GEMM"
    got = np.asarray(fused(x))
    single = _library("erf", 1, opt_level=0)  # no loop, so no blocks
    alone = np.concatenate([np.asarray(single(v.reshape(1))) for v in x.ravel()]).reshape(x.shape)
    assert np.array_equal(got.view(np.uint32), alone.view(np.uint32))


def test_erf_forms_give_the_full_forms_bits_on_every_float_below_their_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks whose operands all lie below ``vmath.ERF_SMALL`` take a shorter polynomial than the near form,
    and the near and short forms skip the NaN test and the clamp. That must not change the function: on every
    float32 from 0 to ``vmath.ERF_SPLIT`` (1,074,790,400 of them; a negative operand is evaluated as its
    magnitude, then signed), the library with the forms gives the bits of the library with the full form
    alone. A copy whose shorter polynomial is off in its last coefficient by one part in a billion differs, so
    the layout does run the short form."""
    rows = 1 << 12
    n = rows * 1024

    def erf_library():
        b = Builder()
        x = b.param("x", DType.f32, [rows, 1024])  # rows: the innermost loop runs in blocks
        return compile(b.module(b.function("main", [x], [b.erf(x)])), cache=False, passes="O0")

    with_forms = erf_library()
    last = vmath.ERF_SMALL_ODD
    monkeypatch.setattr(vmath, "ERF_SMALL_ODD", (*last[:-1], last[-1] * (1 + 1e-9)))
    perturbed = erf_library()
    monkeypatch.setattr(vmath, "ERF_SMALL_ODD", last)
    monkeypatch.setattr(vmath, "ERF_BOUNDS", ())
    full = erf_library()
    end = int(np.float32(vmath.ERF_SPLIT).view(np.uint32))
    for lo in range(0, end, n):
        bits = np.arange(lo, lo + n, dtype=np.uint32)
        x = np.where(bits < end, bits, 0).view(np.float32).reshape(rows, 1024)
        got, want = np.asarray(with_forms(x)), np.asarray(full(x))
        differ = got.view(np.uint32) != want.view(np.uint32)
        assert not differ.any(), (x[differ][:4], got[differ][:4], want[differ][:4])
        if lo == n:
            assert (np.asarray(perturbed(x)).view(np.uint32) != want.view(np.uint32)).any()
