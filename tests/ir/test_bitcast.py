"""The bitcast op and primitive: every same-width pair of CIR types reads the bits exactly as numpy's
``view`` does (NaN payloads, signaling NaNs, -0.0, subnormals), through the rule and the fast path;
pairs of other widths, reads as bool and narrow types are refused with the reason."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuvil.interp import evaluate_op, evaluate_rule
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import get_op
from cuvil.ir.ops.elementwise import _float_bits
from cuvil.ir.rule_text import rule_text
from cuvil.ir.types import TensorType

WIDTHS = {16: (DType.f16, DType.bf16, DType.i16, DType.u16), 32: (DType.f32, DType.i32, DType.u32),
          64: (DType.f64, DType.i64, DType.u64), 8: (DType.i8, DType.u8)}
PAIRS = [(a, b) for group in WIDTHS.values() for a in group for b in group if a is not b]
PAIRS += [(DType.bool, DType.u8), (DType.bool, DType.i8)]


def _words(bits: int, rng: np.random.Generator) -> np.ndarray:
    """Bit patterns of one width: every float class of each float type of that width, plus random words."""
    ints = np.dtype(f"u{bits // 8}")
    floats = [d for d in WIDTHS[bits] if d.is_float]
    special = [_float_bits(d).view(ints).reshape(-1) for d in floats]
    rand = rng.integers(0, np.iinfo(ints).max, 24, dtype=np.uint64, endpoint=True).astype(ints)
    return np.concatenate([*special, rand, np.array([0, np.iinfo(ints).max], dtype=ints)])


def _source(src: DType, rng: np.random.Generator) -> np.ndarray:
    if src is DType.bool:
        return rng.random((3, 4)) < 0.5
    words = _words(src.bits, rng)
    return words[: words.size - words.size % 4].reshape(-1, 4).view(src.np)


def _run(x: np.ndarray, to: DType, *, fast: bool) -> np.ndarray:
    op = get_op("bitcast")
    attrs = op.check_attrs({"to": to})
    out_type = op.infer([TensorType(DType.from_numpy(x.dtype), x.shape)], attrs)
    return evaluate_op(op, [x], attrs, out_type) if fast else evaluate_rule(op, [x], attrs, out_type)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("src", "to"), PAIRS, ids=lambda d: str(d))
@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "rule"])
def test_bitcast_is_numpy_view_bit_for_bit(src: DType, to: DType, fast: bool) -> None:
    x = _source(src, np.random.default_rng(src.bits))
    got = _run(x, to, fast=fast)
    assert _same_bits(got, x.view(to.np))


@pytest.mark.parametrize(("src", "to"), [(DType.f32, DType.i32), (DType.i64, DType.f64), (DType.bf16, DType.f16)])
def test_bitcast_of_a_scalar(src: DType, to: DType) -> None:
    x = np.array(-0.0 if src.is_float else -1, dtype=src.np)
    for fast in (True, False):
        got = _run(x, to, fast=fast)
        assert got.shape == () and _same_bits(got, x.view(to.np))


def test_signaling_nan_payloads_survive_a_round_trip() -> None:
    """A signaling NaN read as an integer and back is the same word: nothing quiets it."""
    for dt in (DType.f16, DType.bf16, DType.f32, DType.f64):
        words = _float_bits(dt).view(np.dtype(f"i{dt.bits // 8}"))
        back = _run(_run(words, dt, fast=False), DType.from_numpy(words.dtype), fast=False)
        assert _same_bits(back, words)


@pytest.mark.parametrize(("src", "to", "reason"), [
    (DType.f32, DType.i64, "32 bits cannot be read as 64"),
    (DType.f16, DType.f32, "16 bits cannot be read as 32"),
    (DType.u8, DType.bool, "a byte other than 0 or 1 is no bool"),
    (DType.bool, DType.i16, "read only as i8 or u8"),
    (DType.f8e4m3fn, DType.u8, "narrow storage types"),
    (DType.u8, DType.i4, "narrow storage types"),
])
def test_other_pairs_are_refused_with_the_reason(src: DType, to: DType, reason: str) -> None:
    assert reason in (R.bitcast_refusal(src, to) or "")
    with pytest.raises(TypeError, match=reason):
        R.bitcast(R.Load(src, 0, ()), to)
    with pytest.raises(Exception, match=reason):
        get_op("bitcast").infer([TensorType(src, (2,))], {"to": to})


def test_every_pair_of_one_width_is_allowed() -> None:
    assert all(R.bitcast_refusal(a, b) is None for a, b in PAIRS)
    assert R.bitcast(R.Load(DType.f32, 0, ()), DType.f32).dtype is DType.f32  # reading as its own type: itself


def test_bitcast_prints_with_its_target_type() -> None:
    x = R.Load(DType.f32, 0, (R.Ix.var("i0"),))
    assert rule_text(R.bitcast(x, DType.i32), ["x"], 1) == "out[i0] = bitcast<i32>(x[i0])"


def test_bf16_patterns_are_ml_dtypes_views() -> None:
    words = np.arange(1 << 16, dtype=np.uint16)
    got = _run(words.reshape(256, 256), DType.bf16, fast=False)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16) and _same_bits(got.reshape(-1).view(np.uint16), words)
