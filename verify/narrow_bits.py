"""The narrow conversions of ``cuvil.ir.narrow`` as z3 bit-vector terms.

A conversion to a narrow float is the rule's step table over the source's bit pattern, built
here as the same binary search the LLVM lowering emits; widening is the rule's table of f32 (or
f64) bit patterns. A float to a narrow integer is written with z3's IEEE theory: truncate, and
0 for NaN, +-inf and values out of range (standard integers as ``numpy_prims.float_to_int``).
The cone encoders fold casts of known values with these terms, and the tests compare them with
the interpreter and the compiled code on every code point and edge value.
"""

from __future__ import annotations

import z3

from cuvil.ir.dtypes import DType
from cuvil.ir.narrow import FORMATS, INT_RANGES, steps, values, widen_table
from verify.z3_terms import bitvec, boolean, ite

_FP_SORTS = {16: (5, 11), 32: (8, 24), 64: (11, 53)}


def narrow_float_code(bits: z3.BitVecRef, dt: DType) -> z3.BitVecRef:
    """The stored byte (8 bits) a float with the IEEE bit pattern ``bits`` (32 or 64 wide)
    converts to: the last step whose start is <= ``bits``, found by binary search."""
    width = bits.size()
    starts, codes = steps(dt, width)
    ctx = bits.ctx

    def search(lo: int, hi: int) -> z3.BitVecRef:  # codes[lo] applies from starts[lo] up to starts[hi]
        if hi - lo == 1:
            return z3.BitVecVal(int(codes[lo]), 8, ctx)
        mid = (lo + hi) // 2
        below = z3.ULT(bits, z3.BitVecVal(int(starts[mid]), width, ctx))
        return ite(below, search(lo, mid), search(mid, hi))

    return search(0, len(starts))


def narrow_float_bits(code: z3.BitVecRef, dt: DType, width: int = 32) -> z3.BitVecRef:
    """The IEEE bit pattern (f32 or f64) of the value a stored byte of ``dt`` means."""
    ctx = code.ctx
    fmt = FORMATS[dt]
    table = widen_table(dt) if width == 32 else values(dt).view("u8")
    key = bitvec(z3.Extract(fmt.bits - 1, 0, code)) if fmt.bits < 8 else code
    out: z3.BitVecRef = z3.BitVecVal(int(table[(1 << fmt.bits) - 1]), width, ctx)
    for c in range((1 << fmt.bits) - 2, -1, -1):
        out = ite(boolean(key == z3.BitVecVal(c, fmt.bits, ctx)), z3.BitVecVal(int(table[c]), width, ctx), out)
    return out


def float_to_int(bits: z3.BitVecRef, dt: DType) -> z3.BitVecRef:
    """A float given by its IEEE bit pattern (16 bits: f16, 32 or 64) converted to the integer
    type ``dt`` as ``numpy_prims.float_to_int`` and ``cuvil.ir.narrow`` define it."""
    ebits, sbits = _FP_SORTS[bits.size()]
    ctx = bits.ctx
    sort = z3.FPSort(ebits, sbits, ctx)
    x = z3.fpBVToFP(bits, sort, ctx=ctx)
    t = z3.fpRoundToIntegral(z3.RTZ(ctx), x, ctx=ctx)
    t = ite(boolean(z3.Or(z3.fpIsNaN(t, ctx=ctx), z3.fpIsInf(t, ctx=ctx))), z3.FPVal(0.0, None, sort, ctx), t)

    def fp(v: float) -> z3.FPRef:
        return z3.FPVal(v, None, sort, ctx)

    def signed(v: z3.FPRef, n: int) -> z3.BitVecRef:  # out of range gives the minimum
        ok = boolean(z3.And(z3.fpGEQ(v, fp(-(2.0 ** (n - 1))), ctx=ctx), z3.fpLT(v, fp(2.0 ** (n - 1)), ctx=ctx)))
        return ite(ok, bitvec(z3.fpToSBV(z3.RTZ(ctx), v, z3.BitVecSort(n, ctx), ctx=ctx)),
                   z3.BitVecVal(1 << (n - 1), n, ctx))

    if dt.is_narrow:
        lo, hi = INT_RANGES[dt]
        ok = boolean(z3.And(z3.fpGEQ(t, fp(lo), ctx=ctx), z3.fpLEQ(t, fp(hi), ctx=ctx)))
        return ite(ok, bitvec(z3.Extract(dt.bits - 1, 0, signed(t, 32))), z3.BitVecVal(0, dt.bits, ctx))
    if dt in (DType.i32, DType.i64):
        return signed(t, dt.bits)
    if dt in (DType.u32, DType.u64):
        half = fp(2.0 ** (dt.bits - 1))
        high = z3.fpGEQ(t, half, ctx=ctx)
        r = signed(ite(high, z3.fpSub(z3.RNE(ctx), t, half, ctx=ctx), t), dt.bits)
        return ite(high, r ^ z3.BitVecVal(1 << (dt.bits - 1), dt.bits, ctx), r)
    return bitvec(z3.Extract(dt.bits - 1, 0, signed(t, 32)))  # i8/i16/u8/u16: the low bits of the i32 conversion


def widen_to_f32(bits: z3.BitVecRef, src: DType) -> z3.BitVecRef:
    """The f32 bit pattern of an f16 or bf16 value (exact; a NaN keeps its sign)."""
    ctx = bits.ctx
    if src is DType.bf16:
        return bitvec(z3.Concat(bits, z3.BitVecVal(0, 16, ctx)))
    x = z3.fpBVToFP(bits, z3.FPSort(5, 11, ctx), ctx=ctx)
    quiet = z3.Concat(z3.Extract(15, 15, bits), z3.BitVecVal(0x7FC00000, 31, ctx))
    wide = z3.fpToIEEEBV(z3.fpFPToFP(z3.RNE(ctx), x, z3.Float32(ctx), ctx=ctx), ctx=ctx)
    return ite(z3.fpIsNaN(x, ctx=ctx), bitvec(quiet), wide)


def int_to_f64(bits: z3.BitVecRef, signed: bool) -> z3.BitVecRef:
    """The f64 bit pattern of an integer (rounded to nearest-even), the first step of an integer's
    conversion to a narrow float."""
    ctx = bits.ctx
    convert = z3.fpSignedToFP if signed else z3.fpUnsignedToFP
    return z3.fpToIEEEBV(convert(z3.RNE(ctx), bits, z3.Float64(ctx), ctx=ctx), ctx=ctx)
