"""The narrow conversion rule (cuvil.ir.narrow) against an independent oracle written from the
format definitions, against the ONNX specification's special cases, and against ml_dtypes, which
must agree with the rule everywhere except where a version is known to differ."""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from cuvil.ir import narrow
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import cast

NARROW_FLOATS = list(narrow.FORMATS)
NARROW_INTS = list(narrow.INT_RANGES)

# (exp bits, mantissa bits, bias, signed) per type, as the OCP/ONNX format tables give them
SPEC = {
    DType.f8e4m3fn: (4, 3, 7, True), DType.f8e4m3fnuz: (4, 3, 8, True), DType.f8e5m2: (5, 2, 15, True),
    DType.f8e5m2fnuz: (5, 2, 16, True), DType.f8e8m0: (8, 0, 127, False), DType.f4e2m1: (2, 1, 1, True),
}
MAX_FINITE = {DType.f8e4m3fn: 448.0, DType.f8e4m3fnuz: 240.0, DType.f8e5m2: 57344.0, DType.f8e5m2fnuz: 57344.0,
              DType.f8e8m0: 2.0 ** 127, DType.f4e2m1: 6.0}


@functools.cache
def _oracle_values(dt: DType) -> dict[int, Fraction]:
    """Every finite non-negative code and its value, straight from the format table."""
    e_bits, m_bits, bias, _ = SPEC[dt]
    top = 1 << (e_bits + m_bits)
    out: dict[int, Fraction] = {}
    for code in range(top):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        if m_bits == 0:
            v = Fraction(2) ** (e - bias)
        elif e == 0:
            v = Fraction(m, 1 << m_bits) * Fraction(2) ** (1 - bias)
        else:
            v = (1 + Fraction(m, 1 << m_bits)) * Fraction(2) ** (e - bias)
        if v <= Fraction(MAX_FINITE[dt]):
            out[code] = v
    return out


def _oracle(dt: DType, x: float) -> int | str:
    """The code of ``x`` by brute force (nearest value, ties to the even code; f8e8m0: ties up),
    or 'nan' / 'inf' / 'overflow' for the special results."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    vals = _oracle_values(dt)
    signed = SPEC[dt][3]
    if not signed and (x <= 0 or math.copysign(1, x) < 0):
        return "nan"
    a = Fraction(abs(x))
    codes = sorted(vals, key=vals.get)
    top = codes[-1]
    ulp = vals[top] - vals[codes[-2]] if SPEC[dt][1] else vals[top]
    beyond = vals[top] + ulp  # the next value an unbounded exponent would give
    ladder = [vals[c] for c in codes] + [beyond]
    names: list[int | str] = [*codes, "overflow"]
    i = bisect.bisect_left(ladder, a)  # the nearest value is one of the two around a
    cands = [(abs(a - ladder[j]), names[j]) for j in (i - 1, i) if 0 <= j < len(ladder)]
    best = min(d for d, _ in cands)
    tied = [c for d, c in cands if d == best]
    if len(tied) == 2:  # a tie: the even code (or the overflow, which would be top + 1), f8e8m0 up
        lo, hi = sorted(tied, key=lambda c: vals.get(c, beyond) if c != "overflow" else beyond)
        hi_code = top + 1 if hi == "overflow" else hi
        pick = hi if dt is DType.f8e8m0 or hi_code % 2 == 0 else lo
    else:
        pick = tied[0]
    if pick == "overflow":
        return "overflow"
    assert isinstance(pick, int)
    if x < 0 or math.copysign(1, x) < 0:
        sign = 1 << (narrow.FORMATS[dt].bits - 1)
        return 0 if pick == 0 and dt in (DType.f8e4m3fnuz, DType.f8e5m2fnuz) else sign | pick
    return pick


# special results, as the ONNX Cast specification (saturate=0) and the format tables define them
NAN = {DType.f8e4m3fn: (0x7F, 0xFF), DType.f8e4m3fnuz: (0x80, 0x80), DType.f8e5m2: (0x7E, 0xFE),
       DType.f8e5m2fnuz: (0x80, 0x80), DType.f8e8m0: (0xFF, 0xFF), DType.f4e2m1: (0x8, 0x0)}
INF = {DType.f8e4m3fn: (0x7F, 0xFF), DType.f8e4m3fnuz: (0x80, 0x80), DType.f8e5m2: (0x7C, 0xFC),
       DType.f8e5m2fnuz: (0x80, 0x80), DType.f8e8m0: (0xFF, 0xFF), DType.f4e2m1: (0x7, 0xF)}


def _expected(dt: DType, x: float) -> int:
    r = _oracle(dt, x)
    negative = math.copysign(1, x) < 0
    if r == "nan":
        return NAN[dt][negative]
    if r in ("inf", "overflow"):
        return INF[dt][negative]
    assert isinstance(r, int)
    return r


def _edge_values(dt: DType) -> np.ndarray:
    """Every value, every midpoint (tie), one f32 ulp either side of both, twice the largest value,
    the smallest subnormals, +-0, +-inf and NaNs of both signs."""
    vals = np.array([float(v) for v in _oracle_values(dt).values()], dtype=np.float64)
    vals.sort()
    mids = (vals[:-1] + vals[1:]) / 2
    top = vals[-1] + (vals[-1] - vals[-2] if SPEC[dt][1] else vals[-1]) / 2
    with np.errstate(over="ignore"):  # twice f8e8m0's largest value is beyond f32: +inf
        core = np.concatenate([vals, mids, [top, vals[-1] * 2, vals[0] / 2, vals[0] / 4]]).astype(np.float32)
    bits = core.view(np.uint32)
    near = np.concatenate([bits, bits + np.uint32(1), bits - np.uint32(1)]).view(np.float32)
    special = np.array([0.0, np.inf, np.nan, 1e-45, 3e38, 1e-40], dtype=np.float32)
    both = np.concatenate([near, special])
    return np.concatenate([both, -both])


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_rule_matches_the_format_definition_at_every_edge(dt: DType) -> None:
    x = _edge_values(dt)
    got = narrow.encode(dt, x)
    want = np.array([_expected(dt, float(v)) for v in x], dtype=np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. {x[bad[:5]]}: rule {got[bad[:5]]}, definition {want[bad[:5]]}"


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_rule_matches_the_format_definition_on_random_floats(dt: DType) -> None:
    rng = np.random.default_rng(7)
    hi = math.log2(MAX_FINITE[dt]) + 2
    mag = 2.0 ** rng.uniform(-hi - 4 if dt is not DType.f8e8m0 else -130, hi, 3000)
    with np.errstate(over="ignore"):
        x = (mag * rng.choice([-1, 1], mag.size)).astype(np.float32)
    got = narrow.encode(dt, x)
    want = np.array([_expected(dt, float(v)) for v in x], dtype=np.uint8)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_every_code_decodes_to_its_defined_value(dt: DType) -> None:
    vals = _oracle_values(dt)
    fmt = narrow.FORMATS[dt]
    for code in range(1 << fmt.bits):
        got = narrow.values(dt)[code]
        mag = code & ((1 << (fmt.bits - 1)) - 1) if fmt.signed else code
        negative = fmt.signed and code >> (fmt.bits - 1) == 1
        if code in NAN[dt] and dt is not DType.f4e2m1:
            assert math.isnan(got) and (math.copysign(1, got) < 0) == negative, hex(code)
        elif mag in vals and not (fmt.inf and code in INF[dt]):
            want = float(vals[mag])
            assert got == (-want if negative else want), hex(code)
            if want == 0 and negative:
                assert math.copysign(1, got) < 0, "negative zero keeps its sign"
        elif fmt.inf and code in INF[dt]:
            assert got == (-math.inf if negative else math.inf)


def test_onnx_spec_examples() -> None:
    """Cases the ONNX Cast specification (saturate=0) and its test data spell out."""
    f = np.array
    e4 = narrow.encode(DType.f8e4m3fn, f([464.0, 464.0001, 480.0, 1e6, -1e6, np.inf, 1e-7, -1e-7], np.float32))
    assert list(e4) == [0x7E, 0x7F, 0x7F, 0x7F, 0xFF, 0x7F, 0x00, 0x80]
    e5 = narrow.encode(DType.f8e5m2, f([57344.0, 61440.0, 61439.0, -1e6, np.inf, -np.inf], np.float32))
    assert list(e5) == [0x7B, 0x7C, 0x7B, 0xFC, 0x7C, 0xFC]
    uz = narrow.encode(DType.f8e4m3fnuz, f([-0.0, -1e-9, 240.0, 248.0, np.nan], np.float32))
    assert list(uz) == [0x00, 0x00, 0x7F, 0x80, 0x80]
    f4 = narrow.encode(DType.f4e2m1, f([0.25, 0.75, 2.5, 5.0, 7.0, -100.0, np.inf, np.nan, -0.0], np.float32))
    assert list(f4) == [0x0, 0x2, 0x4, 0x6, 0x7, 0xF, 0x7, 0x8, 0x8]
    e8 = narrow.encode(DType.f8e8m0, f([1.5, 0.75, 3.0, 0.0, -2.0, 1e-45, 2.0 ** 127 * 1.5], np.float32))
    assert list(e8) == [128, 127, 129, 0xFF, 0xFF, 0, 0xFF]


@pytest.mark.parametrize("dt", NARROW_INTS, ids=str)
def test_narrow_int_rule(dt: DType) -> None:
    lo, hi = narrow.INT_RANGES[dt]
    f = np.array([lo - 1, lo - 0.5, lo, lo + 0.5, -0.0, 0.9, hi - 0.25, hi, hi + 0.999, hi + 1, np.nan, np.inf,
                  -np.inf, 1e10], dtype=np.float32)
    got = narrow.int_values(dt, narrow.encode(dt, f))
    t = np.trunc(f.astype(np.float64))
    want = np.where(np.isfinite(t) & (t >= lo) & (t <= hi), t, 0)
    assert np.array_equal(got, want.astype(np.int8))
    ints = np.arange(-40, 40, dtype=np.int32)
    got = narrow.int_values(dt, narrow.encode(dt, ints)).astype(np.int64)
    span = hi - lo + 1
    assert np.array_equal(got, (ints - lo) % span + lo)  # integers keep their low bits


def _all_codes(dt: DType) -> np.ndarray:
    return np.arange(1 << min(dt.bits, 8), dtype=np.uint8).view(dt.np)


def _library_deviation(dt: DType, x: np.ndarray, version: tuple[int, ...]) -> np.ndarray:
    """Inputs where a known ml_dtypes version converts otherwise than the rule (see the module doc
    of cuvil.ir.narrow): before 0.7, floats out of a narrow integer's range wrap instead of giving 0,
    and f8e8m0 rounds values just above 2^-127 up to 2^-126."""
    none = np.zeros(x.shape, dtype=bool)
    if version >= (0, 7):
        return none
    if dt in narrow.INT_RANGES and x.dtype.kind == "f":
        lo, hi = narrow.INT_RANGES[dt]
        with np.errstate(invalid="ignore"):
            t = np.trunc(x.astype(np.float64))
        return ~((t >= lo) & (t <= hi))
    if dt is DType.f8e8m0 and x.dtype.kind == "f":
        a = x.astype(np.float64)
        return (a > 2.0 ** -127) & (a < 1.5 * 2.0 ** -127)
    return none


def _library_version() -> tuple[int, ...]:
    return tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])


@pytest.mark.parametrize("dt", NARROW_FLOATS + NARROW_INTS, ids=str)
def test_ml_dtypes_agrees_with_the_rule_except_known_deviations(dt: DType) -> None:
    """Where the installed ml_dtypes is used as an oracle, this is where it is allowed to be one."""
    spread = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet in f64
        wide = spread.astype(np.float64)
    sources = [spread, wide, np.arange(1 << 16, dtype=np.uint16).view(np.float16),
               np.arange(-70000, 70000, 7, dtype=np.int32)]
    if dt in narrow.FORMATS:
        sources.append(_edge_values(dt))
    version = _library_version()
    for x in sources:
        with np.errstate(all="ignore"):
            lib = x.astype(dt.np).view(np.uint8)
        if dt in narrow.INT_RANGES:  # the library's stored byte may carry the sign in the high bits
            lib = lib & np.uint8((1 << dt.bits) - 1)
        ours = narrow.encode(dt, x)
        differ = ours != lib
        allowed = _library_deviation(dt, x, version)
        assert not (differ & ~allowed).any(), (f"ml_dtypes {ml_dtypes.__version__} {x.dtype}->{dt}: "
                                               f"{x[differ & ~allowed][:5]} give {ours[differ & ~allowed][:5]}, "
                                               f"library {lib[differ & ~allowed][:5]}")
    codes = _all_codes(dt)
    with np.errstate(all="ignore"):
        lib32 = codes.astype(np.float32)
    ours32 = narrow.decode(codes).astype(np.float32)
    assert np.array_equal(ours32.view(np.uint32), lib32.view(np.uint32)), "widening is exact and keeps NaN signs"


def test_interpreter_cast_reads_the_rule_for_every_pair() -> None:
    """numpy_prims.cast between narrow types and f32/f16/bf16/i32 is the rule composed with exact
    widening, never the library's conversion."""
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal(500).astype(np.float32) * 300
    for dt in NARROW_FLOATS + NARROW_INTS:
        for src in (np.float32, np.float16, ml_dtypes.bfloat16, np.int32):
            x = f32.astype(src)
            wide = x if np.dtype(src).kind == "i" else x.astype(np.float64)
            assert np.array_equal(cast(x, dt).view(np.uint8), narrow.encode(dt, wide))
        codes = _all_codes(dt)
        widened = narrow.decode(codes)
        assert np.array_equal(cast(codes, DType.f32).view(np.uint32), widened.astype(np.float32).view(np.uint32))
