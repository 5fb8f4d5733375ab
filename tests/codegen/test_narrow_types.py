"""Narrow storage types (float8, float4, int4, int2) in compiled code: one byte per element, widened
on load and narrowed on store, bit for bit as ml_dtypes' ``astype`` (the interpreter's meaning)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuvil.codegen import abi
from cuvil.codegen.narrow import narrow_steps
from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

NARROW_FLOATS = [DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz, DType.f8e8m0, DType.f4e2m1]
NARROW_INTS = [DType.i4, DType.u4, DType.i2, DType.u2]


def _compile_cast(src: DType, dst: DType, n: int, tmp_path):
    b = Builder()
    x = b.param("x", src, [n])
    m = b.module(b.function("main", [x], [b.cast(x, to=dst)]))
    return m, compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.flatnonzero(_bits(got) != _bits(want))
    assert bad.size == 0, (f"{bad.size} of {want.size} differ; first inputs {x[bad[:5]]!r} "
                           f"(bits {_bits(x)[bad[:5]]}): got {_bits(got)[bad[:5]]}, want {_bits(want)[bad[:5]]}")


def _all_codes(dt: DType) -> np.ndarray:
    """Every stored byte of ``dt`` (the low nibble or two bits for the 4- and 2-bit types)."""
    return np.arange(1 << min(dt.bits, 8), dtype=np.uint8).view(dt.np)


def _f32_probe_values(dt: DType) -> np.ndarray:
    """A spread over all f32 bit patterns, every rounding boundary of ``dt`` and its neighbours
    (ties, subnormals, overflow), the narrow values themselves, NaNs with several payloads, +-inf, +-0."""
    spread = np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32)
    values = _all_codes(dt).astype(np.float32)
    finite = np.sort(np.unique(np.abs(values[np.isfinite(values)])))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact: one more bit
    with np.errstate(over="ignore"):
        edges = np.concatenate([finite, mids, finite * 2, finite / 2, [float(ml_dtypes.finfo(dt.np).max) * 1.5]])
        edges = np.concatenate([edges, -edges]).astype(np.float32)
    eb = _bits(edges)
    near = np.concatenate([eb, eb + np.uint32(1), eb - np.uint32(1)])
    special = np.array([0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
                        0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FE00000, 0x7FA00000, 0x00000001, 0x807FFFFF,
                        0x00400000, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32)
    steps, _ = narrow_steps(dt, 32)  # the generated tables' own breakpoints, checked from both sides
    step_bits = steps.astype(np.uint32)
    return np.concatenate([spread, near, special, step_bits, step_bits - np.uint32(1)]).view(np.float32)


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_narrow_float_widens_exactly(dt: DType, tmp_path) -> None:
    x = _all_codes(dt)
    m, model = _compile_cast(dt, DType.f32, x.size, tmp_path)
    got = model(x)
    _assert_bits_equal(got, x.astype(np.float32), x)
    _assert_bits_equal(got, run_reference(m, [x])[0], x)


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_f32_narrows_bit_exactly(dt: DType, tmp_path) -> None:
    x = _f32_probe_values(dt)
    _, model = _compile_cast(DType.f32, dt, x.size, tmp_path)
    with np.errstate(all="ignore"):
        want = x.astype(dt.np)
    _assert_bits_equal(model(x), want, x)


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_f64_and_f16_narrow_bit_exactly(dt: DType, tmp_path) -> None:
    """Wider and narrower sources round once, from their own value (no detour through f32 for f64)."""
    rng = np.random.default_rng(3)
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet in f64
        f32 = _f32_probe_values(dt)[::7].astype(np.float64)
        jitter = f32 * (1 + rng.choice([-1, 1], f32.size) * 2.0 ** -40)  # just off the f32 ties
    x64 = np.concatenate([f32, jitter, rng.standard_normal(5000) * 100])
    _, model = _compile_cast(DType.f64, dt, x64.size, tmp_path / "f64")
    with np.errstate(all="ignore"):
        _assert_bits_equal(model(x64), x64.astype(dt.np), x64)
        x16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
        _, model = _compile_cast(DType.f16, dt, x16.size, tmp_path / "f16")
        _assert_bits_equal(model(x16), x16.astype(dt.np), x16)


def _convertible_narrow_floats(dt: DType) -> list[DType]:
    """The other narrow floats ml_dtypes converts ``dt`` to directly (none to or from f8e8m0)."""
    if dt is DType.f8e8m0:
        return []
    return [o for o in NARROW_FLOATS if o is not dt and o is not DType.f8e8m0]


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_narrow_float_to_and_from_integers_and_other_narrow_floats(dt: DType, tmp_path) -> None:
    codes = _all_codes(dt)
    ints = np.concatenate([np.arange(-600, 600), [3 * 2 ** 24 + 1, -(2 ** 30), 2 ** 31 - 1]]).astype(np.int32)
    b = Builder()
    xf = b.param("codes", dt, [codes.size])
    xi = b.param("ints", DType.i32, [ints.size])
    outs = [b.cast(xf, to=DType.i32), b.cast(xf, to=DType.i8), b.cast(xf, to=DType.u8), b.cast(xf, to=DType.bool),
            b.cast(xf, to=DType.f16), b.cast(xi, to=dt)]
    others = _convertible_narrow_floats(dt)
    outs += [b.cast(xf, to=other) for other in others]
    m = b.module(b.function("main", [xf, xi], outs))
    model = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)
    got = model(codes, ints)
    want = run_reference(m, [codes, ints])
    for g, w in zip(got, want, strict=True):
        _assert_bits_equal(g, w, codes)
    with np.errstate(all="ignore"):
        _assert_bits_equal(got[5], ints.astype(dt.np), ints)  # ml_dtypes as the oracle
        for g, other in zip(got[6:], others, strict=True):
            _assert_bits_equal(g, codes.astype(other.np), codes)


@pytest.mark.parametrize("dt", NARROW_INTS, ids=str)
def test_narrow_ints_convert_like_the_interpreter(dt: DType, tmp_path) -> None:
    codes = _all_codes(dt)
    f = np.concatenate([np.arange(-40, 40, 0.25), [np.nan, np.inf, -np.inf, 1e10, -3e9, 2.0 ** 31]]).astype(np.float32)
    i = np.arange(-300, 300, dtype=np.int32)
    b = Builder()
    xc, xf = b.param("codes", dt, [codes.size]), b.param("f", DType.f32, [f.size])
    xi = b.param("i", DType.i32, [i.size])
    outs = [b.cast(xc, to=DType.f32), b.cast(xc, to=DType.i32), b.cast(xc, to=DType.u8), b.cast(xc, to=DType.bool),
            b.cast(xf, to=dt), b.cast(xi, to=dt), b.add(xc, xc), b.mul(xc, xc), b.cast(xc, to=DType.f8e4m3fn)]
    m = b.module(b.function("main", [xc, xf, xi], outs))
    model = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)
    got = model(codes, f, i)
    want = run_reference(m, [codes, f, i])
    for g, w in zip(got, want, strict=True):
        _assert_bits_equal(g, w, codes)
    # ml_dtypes as the oracle: widening is exact, int -> narrow int keeps the low bits
    np.testing.assert_array_equal(got[0], codes.astype(np.float32))
    np.testing.assert_array_equal(_bits(got[5]), _bits(i.astype(dt.np)))
    np.testing.assert_array_equal(_bits(got[6]), _bits(codes + codes))


def test_narrow_float_arithmetic_rounds_each_result(tmp_path) -> None:
    """A primitive on float8 is computed in f32 and rounded back, as ml_dtypes' ufuncs do."""
    rng = np.random.default_rng(0)
    dt = DType.f8e4m3fn
    a = rng.integers(0, 256, 512, dtype=np.uint8).view(dt.np)
    c = rng.integers(0, 256, 512, dtype=np.uint8).view(dt.np)
    b = Builder()
    x, y = b.param("x", dt, [a.size]), b.param("y", dt, [c.size])
    m = b.module(b.function("main", [x, y], [b.add(x, y), b.mul(x, y)]))
    model = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)
    got = model(a, c)
    with np.errstate(all="ignore"):
        _assert_bits_equal(got[0], a + c, a)
        _assert_bits_equal(got[1], a * c, a)


def test_narrow_types_have_distinct_abi_codes_and_pass_through_the_checked_abi(tmp_path) -> None:
    codes = [abi.DTYPE_CODES[d] for d in DType]
    assert len(set(codes)) == len(codes)
    x = _all_codes(DType.f8e5m2)
    b = Builder()
    p = b.param("x", DType.f8e5m2, [x.size])
    m = b.module(b.function("main", [p], [b.cast(p, to=DType.f8e4m3fn)]))
    model = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)
    with np.errstate(all="ignore"):
        _assert_bits_equal(model(x), x.astype(ml_dtypes.float8_e4m3fn), x)
    header = next(tmp_path.glob("*.h")).read_text()
    assert f"#define CUVIL_DTYPE_F8E5M2 {abi.DTYPE_CODES[DType.f8e5m2]}" in header
