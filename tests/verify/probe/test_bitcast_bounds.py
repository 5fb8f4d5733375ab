"""The interval reading of bitcast: exact where an element is one known value whose bits the float64
bound holds, anywhere in the target type elsewhere; between integers it wraps as a cast does."""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import DType
from verify.probe import interval as I
from verify.probe.interval import Interval


def _contains(iv: Interval, exact: list[int]) -> bool:
    """Python compares floats with ints exactly, so a float64 bound is checked against the true integer."""
    return all(float(lo) <= v <= float(hi) for lo, hi, v in zip(iv.lo.reshape(-1), iv.hi.reshape(-1), exact,
                                                                strict=True))


def test_known_floats_give_their_exact_bits() -> None:
    x = np.array([1.0, -0.0, 3.5], dtype=np.float32)
    out = I.bitcast(Interval(x.astype(np.float64)), DType.i32, DType.f32)
    assert np.array_equal(out.lo, x.view(np.int32).astype(np.float64)) and np.array_equal(out.lo, out.hi)


def test_sixty_four_bit_words_beyond_two_to_the_53_keep_their_neighbours() -> None:
    x = np.array([1.0000000000000002, -2.5, 1e300], dtype=np.float64)
    words = [int(w) for w in x.view(np.int64)]
    out = I.apply("bitcast", [Interval(x)], DType.i64, {"to": DType.i64}, [DType.f64])
    assert _contains(out, words)


def test_a_sixty_four_bit_integer_point_beyond_two_to_the_53_is_not_trusted() -> None:
    word = 0x3FF0000000000001  # float64 rounds it to the bits of 1.0; the real bits read 1 + 2**-52
    out = I.bitcast(Interval(np.array([float(word)])), DType.f64, DType.i64)
    assert out.lo[0] == -np.inf and out.hi[0] == np.inf and bool(out.nan[0])


def test_words_that_read_as_nan_are_flagged() -> None:
    words = np.array([0x7FC00000, 0x3F800000], dtype=np.int32)
    out = I.bitcast(Interval(words.astype(np.float64)), DType.f32, DType.i32)
    assert bool(out.nan[0]) and not bool(out.nan[1]) and out.lo[1] == out.hi[1] == 1.0


def test_ranges_read_through_float_bits_are_the_whole_type() -> None:
    out = I.bitcast(Interval(np.array([0.0]), np.array([1.0])), DType.i32, DType.f32)
    assert (out.lo[0], out.hi[0]) == I.type_range(DType.i32)
    out = I.bitcast(Interval(np.array([0.0]), np.array([10.0])), DType.f32, DType.i32)
    assert out.lo[0] == -np.inf and out.hi[0] == np.inf and bool(out.nan[0])


def test_integers_of_the_other_signedness_wrap_as_a_cast() -> None:
    out = I.bitcast(Interval(np.array([-5.0]), np.array([3.0])), DType.u8, DType.i8)
    assert (out.lo[0], out.hi[0]) == (0.0, 255.0)
    out = I.bitcast(Interval(np.array([5.0]), np.array([7.0])), DType.u8, DType.i8)
    assert (out.lo[0], out.hi[0]) == (5.0, 7.0)
    out = I.bitcast(Interval(np.array([0.0]), np.array([1.0])), DType.u8, DType.bool)
    assert (out.lo[0], out.hi[0]) == (0.0, 1.0)


def test_the_torch_reader_reads_the_same_bits() -> None:
    """The gradient search's reader: the exact reinterpretation of the values it holds (no gradient)."""
    import torch

    from cuvil.ir import rules as R
    from cuvil.ir.rulewalk import RuleInfo
    from verify.probe.torch_eval import TorchWalker

    x = np.array([1.0, -0.0, 3.5, 65504.0], dtype=np.float16)
    rule = R.bitcast(R.Load(DType.f16, 0, (R.Ix.var("i0"),)), DType.i16)
    walker = TorchWalker(RuleInfo.build(rule, (4,)), [torch.from_numpy(x.astype(np.float64))])
    got = walker.expr(rule).numpy().reshape(-1)
    assert np.array_equal(got, x.view(np.int16).astype(np.float64))
