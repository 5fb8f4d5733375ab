"""Narrow storage types (float8, float4, int4, int2) in compiled code: one byte per element, widened
on load and narrowed on store. Every conversion into and out of them (from and to f32, f64, f16,
bf16, i32 and the other narrow types) is read from one rule (cuvil.ir.narrow) by three readers: the
interpreter, the LLVM lowering and the z3 encoding. They must agree bit for bit over every code
point and the edge values (NaN of both signs, +-inf, +-0, out of range, ties, every step of the
conversion table and its neighbours)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import z3

from cuvil.codegen import abi
from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir import narrow
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from verify.narrow_bits import float_to_int, int_to_f64, narrow_float_bits, narrow_float_code, widen_to_f32
from verify.scalar_semantics import AbstractFPSemantics

NARROW_FLOATS = list(narrow.FORMATS)
NARROW_INTS = list(narrow.INT_RANGES)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str = "") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    bad = np.flatnonzero(_bits(got) != _bits(want))
    assert bad.size == 0, (f"{what}: {bad.size} of {want.size} differ; first inputs {x[bad[:5]]!r} "
                           f"(bits {_bits(x)[bad[:5]]}): got {_bits(got)[bad[:5]]}, want {_bits(want)[bad[:5]]}")


def _all_codes(dt: DType) -> np.ndarray:
    """Every stored byte of ``dt`` (the low nibble or two bits for the 4- and 2-bit types)."""
    return np.arange(1 << min(dt.bits, 8), dtype=np.uint8).view(dt.np)


_SPECIAL_F32 = np.array([0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
                         0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FE00000, 0x00000001, 0x807FFFFF, 0x00400000,
                         0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32)


def _f32_edges(dt: DType) -> np.ndarray:
    """Every step of ``dt``'s conversion table and its neighbours, every narrow value, midpoint
    (tie) and their neighbours, NaNs with several payloads and signs, +-inf, +-0, subnormals."""
    if dt in narrow.FORMATS:
        starts, _ = narrow.steps(dt, 32)
        vals = narrow.values(dt)
        finite = np.unique(np.abs(vals[np.isfinite(vals)]))
        mids = (finite[:-1] + finite[1:]) / 2
        with np.errstate(over="ignore"):
            pts = np.concatenate([finite, mids, finite * 2]).astype(np.float32)
        pts = np.concatenate([pts, -pts])
        core = np.concatenate([starts.astype(np.uint32), _bits(pts)])
    else:
        lo, hi = narrow.INT_RANGES[dt]
        pts = np.arange(lo - 3, hi + 3, 0.25, dtype=np.float32)
        core = np.concatenate([_bits(pts), _bits(np.array([1e10, -3e9, 2.0 ** 31, 0.5, -0.5], np.float32))])
    near = np.concatenate([core, core + np.uint32(1), core - np.uint32(1)])
    return np.unique(np.concatenate([near, _SPECIAL_F32])).view(np.float32)


def _f32_spread() -> np.ndarray:
    return np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _ints() -> np.ndarray:
    extremes = [3 * 2 ** 24 + 1, -(2 ** 30), 2 ** 31 - 1, -(2 ** 31)]
    return np.concatenate([np.arange(-600, 600), extremes]).astype(np.int32)


# ---------------------------------------------------------------------------------------
# the z3 reading, evaluated on concrete bit patterns


def _z3_eval(make, width: int, out_bits: int, xs: np.ndarray) -> np.ndarray:
    """Evaluate the term ``make(var)`` at each bit pattern in ``xs`` (by substitution)."""
    ctx = z3.Context()
    var = z3.BitVec("x", width, ctx)
    term = make(var)
    out = [z3.simplify(z3.substitute(term, (var, z3.BitVecVal(int(v), width, ctx)))).as_long() for v in xs]
    return np.array(out, dtype=np.dtype(f"u{max(out_bits, 8) // 8}"))


def _z3_narrow_float(dt: DType, x: np.ndarray) -> np.ndarray:
    """Stored bytes of ``dt`` from f32/f64/f16/bf16/i32 arrays, through verify.narrow_bits."""
    if x.dtype == np.float64:
        return _z3_eval(lambda v: narrow_float_code(v, dt), 64, 8, _bits(x))
    if x.dtype == np.float32:
        return _z3_eval(lambda v: narrow_float_code(v, dt), 32, 8, _bits(x))
    if x.dtype == np.int32:
        return _z3_eval(lambda v: narrow_float_code(int_to_f64(v, True), dt), 32, 8, x.view(np.uint32))
    src = DType.f16 if x.dtype == np.float16 else DType.bf16
    return _z3_eval(lambda v: narrow_float_code(widen_to_f32(v, src), dt), 16, 8, _bits(x))


def _z3_to_int(dt: DType, x: np.ndarray) -> np.ndarray:
    """``x`` (f32/f16 array) converted to the integer type ``dt``, through verify.narrow_bits."""
    width = x.dtype.itemsize * 8
    out = _z3_eval(lambda v: float_to_int(v, dt), width, dt.bits, _bits(x))
    return out.astype(np.uint8) if dt.is_narrow else out.view(dt.np)


def _z3_widen(dt: DType, codes: np.ndarray, to: DType) -> np.ndarray:
    """Stored bytes of a narrow float widened to f32 bits, or converted on to the int ``to``."""
    if to is DType.f32:
        return _z3_eval(lambda v: narrow_float_bits(v, dt), 8, 32, codes.view(np.uint8)).view(np.float32)
    out = _z3_eval(lambda v: float_to_int(narrow_float_bits(v, dt), to), 8, to.bits, codes.view(np.uint8))
    return out.astype(np.uint8) if to.is_narrow else out.view(to.np)


def _stored(dt: DType, a: np.ndarray) -> np.ndarray:
    """The rule's view of a narrow array: the meaningful low bits of each byte."""
    return a.view(np.uint8) & np.uint8((1 << min(dt.bits, 8)) - 1)


# ---------------------------------------------------------------------------------------
# narrow floats


def _narrow_float_module(dt: DType, sizes: dict[str, int]):
    b = Builder()
    p = {name: b.param(name, src, [sizes[name]]) for name, src in
         (("codes", dt), ("f32", DType.f32), ("f64", DType.f64), ("f16", DType.f16), ("bf16", DType.bf16),
          ("i32", DType.i32))}
    outs: dict[str, object] = {}
    for to in (DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32, DType.i8, DType.u8, DType.u32, DType.bool,
               *NARROW_INTS, *(o for o in NARROW_FLOATS if o is not dt)):
        outs[f"codes->{to}"] = b.cast(p["codes"], to=to)
    for src in ("f32", "f64", "f16", "bf16", "i32"):
        outs[f"{src}->{dt}"] = b.cast(p[src], to=dt)
    return b.module(b.function("main", list(p.values()), list(outs.values()))), list(outs)


@pytest.mark.parametrize("dt", NARROW_FLOATS, ids=str)
def test_narrow_float_conversions_agree_in_interpreter_compiled_code_and_z3(dt: DType, tmp_path) -> None:
    codes = _all_codes(dt)
    edges = _f32_edges(dt)
    with np.errstate(all="ignore"):
        f32 = np.concatenate([edges, _f32_spread()])
        f64 = np.concatenate([edges.astype(np.float64), np.random.default_rng(3).standard_normal(3000) * 100,
                              edges.astype(np.float64) * (1 + 2.0 ** -40)])  # just off the f32 ties
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    bf16 = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    ints = _ints()
    inputs = {"codes": codes, "f32": f32, "f64": f64, "f16": f16, "bf16": bf16, "i32": ints}
    m, names = _narrow_float_module(dt, {k: v.size for k, v in inputs.items()})
    got = dict(zip(names, compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)(*inputs.values()),
                   strict=True))
    want = dict(zip(names, run_reference(m, list(inputs.values())), strict=True))
    for name in names:  # compiled == interpreter, bit for bit, every output
        src = inputs[name.split("->")[0]]
        _assert_bits_equal(got[name], want[name], src, f"{name} compiled vs interpreter")

    # the z3 reading on the edge values (and every f16/bf16 pattern near them) and every code point
    def z3_check(name: str, x: np.ndarray, sel: np.ndarray, z: np.ndarray) -> None:
        _assert_bits_equal(z, _stored(dt, want[name][sel]), x[sel], f"{name} z3 vs interpreter")

    sel32 = np.arange(edges.size)
    z3_check(f"f32->{dt}", f32, sel32, _z3_narrow_float(dt, f32[sel32]))
    z3_check(f"f64->{dt}", f64, sel32, _z3_narrow_float(dt, f64[sel32]))
    with np.errstate(over="ignore"):
        e16 = _bits(edges.astype(np.float16))
    near16 = np.unique(np.concatenate([e16, e16 + 1]))
    z3_check(f"f16->{dt}", f16, near16, _z3_narrow_float(dt, f16[near16]))
    near_bf = np.unique(np.concatenate([(_bits(edges) >> 16), (_bits(edges) >> 16) + 1])).astype(np.uint16)
    z3_check(f"bf16->{dt}", bf16, near_bf, _z3_narrow_float(dt, bf16[near_bf]))
    z3_check(f"i32->{dt}", ints, np.arange(ints.size), _z3_narrow_float(dt, ints))
    _assert_bits_equal(_z3_widen(dt, codes, DType.f32), want[f"codes->{DType.f32}"], codes, "widen z3")
    for to in (DType.i32, DType.u32, DType.i8, *NARROW_INTS):
        z = _z3_widen(dt, codes, to)
        w = want[f"codes->{to}"]
        _assert_bits_equal(z, _stored(to, w) if to.is_narrow else w, codes, f"codes->{to} z3")


# ---------------------------------------------------------------------------------------
# narrow integers


@pytest.mark.parametrize("dt", NARROW_INTS, ids=str)
def test_narrow_int_conversions_agree_in_interpreter_compiled_code_and_z3(dt: DType, tmp_path) -> None:
    codes = _all_codes(dt)
    f32 = _f32_edges(dt)
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    bf16 = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    ints = _ints()
    inputs = {"codes": codes, "f32": f32, "f16": f16, "bf16": bf16, "i32": ints}
    b = Builder()
    p = {name: b.param(name, DType.parse(name) if name != "codes" else dt, [x.size]) for name, x in inputs.items()}
    outs = {f"codes->{to}": b.cast(p["codes"], to=to)
            for to in (DType.f32, DType.i32, DType.u8, DType.bool, DType.f16, DType.f8e4m3fn)}
    outs.update({f"{src}->{dt}": b.cast(p[src], to=dt) for src in ("f32", "f16", "bf16", "i32")})
    outs.update({"codes+codes": b.add(p["codes"], p["codes"]), "codes*codes": b.mul(p["codes"], p["codes"])})
    m = b.module(b.function("main", list(p.values()), list(outs.values())))
    got = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)(*inputs.values())
    want = dict(zip(outs, run_reference(m, list(inputs.values())), strict=True))
    for (name, w), g in zip(want.items(), got, strict=True):
        src = inputs[name.split("->")[0]] if "->" in name else codes
        _assert_bits_equal(_stored(dt, g) if g.dtype == dt.np else g, _stored(dt, w) if w.dtype == dt.np else w,
                           src, f"{name} compiled vs interpreter")
    _assert_bits_equal(_z3_to_int(dt, f32), _stored(dt, want[f"f32->{dt}"]), f32, "f32 z3")
    sel = np.flatnonzero(np.isfinite(f16) & (np.abs(f16.astype(np.float32)) < 40) | ~np.isfinite(f16))
    _assert_bits_equal(_z3_to_int(dt, f16[sel]), _stored(dt, want[f"f16->{dt}"][sel]), f16[sel], "f16 z3")
    # integers keep their low bits, and narrow integers widen exactly (the encoder's own cast)
    sem = AbstractFPSemantics(z3.Context())
    low = np.array([z3.simplify(sem.cast(z3.BitVecVal(int(v) % (1 << 32), 32, sem.ctx), DType.i32, dt)).as_long()
                    for v in ints], dtype=np.uint8)
    _assert_bits_equal(low, _stored(dt, want[f"i32->{dt}"]), ints, "i32 -> narrow int in the encoder")
    signed = narrow.int_values(dt, codes.view(np.uint8)).astype(np.int64)
    widened = [sem.literal_value(sem.cast(z3.BitVecVal(int(v) % (1 << dt.bits), dt.bits, sem.ctx), dt, DType.f32),
                                 DType.f32) for v in signed]
    assert np.array_equal(np.array(widened, dtype=np.float32), want[f"codes->{DType.f32}"])


# ---------------------------------------------------------------------------------------
# the verifier folds casts of known values with the same rule


@pytest.mark.parametrize("dt", NARROW_FLOATS + NARROW_INTS, ids=str)
def test_encoder_folds_casts_of_literals_like_the_interpreter(dt: DType) -> None:
    sem = AbstractFPSemantics(z3.Context())
    xs = _f32_edges(dt)[::3]
    b = Builder()
    p = b.param("x", DType.f32, [xs.size])
    m = b.module(b.function("main", [p], [b.cast(p, to=dt)]))
    want = _stored(dt, run_reference(m, [xs])[0])
    for x, w in zip(xs, want, strict=True):
        out = sem.cast(sem.lit(float(x), DType.f32), DType.f32, dt)
        if dt.is_float:
            v = sem.literal_value(out, dt)
            ref = float(narrow.values(dt)[w])
            assert v is not None and (v == ref or (np.isnan(v) and np.isnan(ref))), (x, v, ref)
        else:
            assert z3.is_bv_value(out) and out.as_long() == int(w) & ((1 << dt.bits) - 1), (x, out, w)


def test_narrow_float_arithmetic_rounds_each_result(tmp_path) -> None:
    """A primitive on float8 is computed in f32 and rounded back to float8 by the rule."""
    rng = np.random.default_rng(0)
    dt = DType.f8e4m3fn
    a = rng.integers(0, 256, 512, dtype=np.uint8).view(dt.np)
    c = rng.integers(0, 256, 512, dtype=np.uint8).view(dt.np)
    b = Builder()
    x, y = b.param("x", dt, [a.size]), b.param("y", dt, [c.size])
    m = b.module(b.function("main", [x, y], [b.add(x, y), b.mul(x, y)]))
    got = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)(a, c)
    want = run_reference(m, [a, c])
    wa, wc = narrow.decode(a), narrow.decode(c)
    with np.errstate(all="ignore"):
        by_rule = [narrow.encode(dt, wa + wc), narrow.encode(dt, wa * wc)]
    for g, w, r in zip(got, want, by_rule, strict=True):
        _assert_bits_equal(g, w, a)
        _assert_bits_equal(g.view(np.uint8), r, a)


def test_narrow_types_have_distinct_abi_codes_and_pass_through_the_checked_abi(tmp_path) -> None:
    codes = [abi.DTYPE_CODES[d] for d in DType]
    assert len(set(codes)) == len(codes)
    x = _all_codes(DType.f8e5m2)
    b = Builder()
    p = b.param("x", DType.f8e5m2, [x.size])
    m = b.module(b.function("main", [p], [b.cast(p, to=DType.f8e4m3fn)]))
    model = compile(m, output_dir=tmp_path, opt_level=1, passes="O0", cache=False)
    _assert_bits_equal(model(x), run_reference(m, [x])[0], x)
    header = next(tmp_path.glob("*.h")).read_text()
    assert f"#define CUVIL_DTYPE_F8E5M2 {abi.DTYPE_CODES[DType.f8e5m2]}" in header
