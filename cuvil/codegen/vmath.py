"""Float32 ``exp``, ``tanh`` and ``erf`` as straight-line LLVM IR: computed in double precision and
rounded to float32 once, so they are correctly rounded except where the exact value lies within about
1e-14 of a rounding boundary.

A libm call in a loop keeps the loop scalar (glibc's ``tanhf`` and double ``erf`` cost 13-14 ns an
element, ``expf`` 1.7 ns); these contain no call and no branch, so LLVM vectorizes the loops and kernel
epilogues that use them (0.7, 1.2 and 1.6 ns), and every lane, every scalar remainder and every kernel
computes the same bits for the same input: the proofs treat a transcendental as one function of its
operand, so it must be one everywhere in a library. (A scalar ``exp`` is slower than ``expf``: the
reductions that sum exponentials, softmax's, run on a kernel that advances rows in vector lanes,
:mod:`cuvil.codegen.kernels.rows`.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

from cuvil.codegen.llvm_types import F32, F64, I64, declare

if TYPE_CHECKING:
    from cuvil.codegen.scalar import Builder, Val

LN2_HI = math.log(2.0)
LN2_LO = float.fromhex("0x1.abc9e3b39803fp-56")
"""ln 2 - LN2_HI: the two together give ``x - k ln 2`` to about 1e-32 for the ``k`` float32 needs."""

EXP_TAYLOR = tuple(1.0 / math.factorial(n) for n in range(11, -1, -1))
"""exp(r) for |r| <= ln(2)/2 by its Taylor polynomial of degree 11 (relative error below 1e-14)."""

TANH_ODD = (-1382.0 / 155925.0, 62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0)
"""tanh(x) / x in powers of x^2 through x^10, for |x| < 1/16 (relative error below 1e-16)."""

TANH_SERIES_BELOW = 0.0625
"""Below it tanh is its series; above, ``1 - 2 / (exp(2|x|) + 1)`` loses at most 4 bits of a double."""

EXP_DOMAIN = (-104.0, 89.0)
"""Outside it float32 exp is 0 (below half the smallest subnormal) or +inf: the input is clamped to it."""

TANH_SATURATES = 10.0
"""|tanh(x)| rounds to 1 in float32 from |x| of about 9.01 on: larger inputs are clamped to it."""


def _doubles(*hex_literals: str) -> tuple[float, ...]:
    return tuple(float.fromhex(h) for h in hex_literals)


# Coefficients of Chebyshev-economized polynomials (mpmath's chebyfit at 200 bits), highest degree first.
ERF_ODD = _doubles(
    "-0x1.ac9585a44fe29p-31", "0x1.d76af6ca49787p-27", "-0x1.5c131500d3f88p-23", "0x1.b981d78881a5dp-20",
    "-0x1.f4ca838adb73bp-17", "0x1.f9a2be4f731a1p-14", "-0x1.c02db0665e53dp-11", "0x1.565bccfa44156p-8",
    "-0x1.b82ce31203772p-6", "0x1.ce2f21a040f66p-4", "-0x1.812746b0379c1p-2", "0x1.20dd750429b6dp+0")
"""erf(x) / x as a polynomial in x^2 for |x| <= 1 (12 coefficients, error below 1e-17)."""

ERF_PIECES = (
    _doubles(
        "0x1.34de7be035905p-22", "-0x1.a77e9dd106903p-17", "0x1.2f4688f19689ep-16", "0x1.4361f20695e8ep-14",
        "-0x1.0ad5c2d0064cfp-12", "-0x1.8530ed07e4b3ep-14", "0x1.c0383ebad4c2fp-10",
        "-0x1.35aeca7825affp-9", "-0x1.36d73b2e83ef0p-8", "0x1.3ca3d828b5753p-6", "-0x1.e72372685221dp-7",
        "-0x1.6d5a95d4920b8p-5", "0x1.1c2a02beb6104p-3", "-0x1.6d5a95d09eb83p-3", "0x1.e723726b824b3p-4",
        "0x1.eea5557137adap-1"),
    _doubles(
        "-0x1.4d44bab47a9d1p-21", "0x1.74635ffe39654p-22", "0x1.3a395e6a0ac6dp-18",
        "-0x1.daa425e761644p-17", "0x1.58dd0075dcd00p-18", "0x1.4a92f027d6bfep-14",
        "-0x1.067187e5144a7p-12", "0x1.1154b0e0462adp-12", "0x1.1c610c476cacfp-11", "-0x1.6ecdbe8ab46a0p-9",
        "0x1.90e812837e74bp-8", "-0x1.1a89b97ea3b53p-7", "0x1.119da0c46d88bp-7", "-0x1.64e3dcd3a4cffp-8",
        "0x1.1d83170fbf6e4p-9", "0x1.ffcaa8f4c9beap-1"),
    _doubles(
        "-0x1.eb4266f96455dp-30", "0x1.67572b0a47f38p-24", "-0x1.459f5261ef7a8p-22",
        "0x1.e0532ff397fe4p-22", "0x1.dddb4d7805a03p-22", "-0x1.37811cd545801p-18", "0x1.0134fae85086ap-16",
        "-0x1.1f62d3ce576c5p-15", "0x1.e827fc58e8002p-15", "-0x1.4615414a08ecfp-14",
        "0x1.586bafc441994p-14", "-0x1.1c07720e3fe19p-14", "0x1.62ccea63ec5dap-15",
        "-0x1.3d0e43d70cf42p-16", "0x1.6a597219a8b85p-18", "0x1.ffffe710d565ep-1"),
)
"""erf(c + t) for |t| <= 1/2 around c = 1.5, 2.5 and 3.5 (16 coefficients each, error below 1e-15)."""

ERF_SATURATES = 4.0
"""|erf(x)| rounds to 1 in float32 from |x| of about 3.92 on: larger inputs are clamped to it."""


def _f64(v: float) -> ir.Constant:
    return ir.Constant(F64, v)


def _call(b: Builder, intrinsic: str, args: Sequence[Val]) -> Val:
    fn = declare(b.module, f"llvm.{intrinsic}.f64", F64, [F64] * len(args))
    return b.call(fn, list(args))


def _horner(b: Builder, x: Val, coefficients: Sequence[float]) -> Val:
    """The polynomial with ``coefficients`` (highest degree first) at ``x``, one fused multiply-add a term."""
    acc: Val = _f64(coefficients[0])
    for c in coefficients[1:]:
        acc = _call(b, "fma", [acc, x, _f64(c)])
    return acc


def _clamp(b: Builder, x: Val, lo: float, hi: float) -> Val:
    x = b.select(b.fcmp_ordered(">", x, _f64(hi)), _f64(hi), x)
    return b.select(b.fcmp_ordered("<", x, _f64(lo)), _f64(lo), x)


def exp_f64_core(b: Builder, x: Val) -> Val:
    """exp(x) in double for a finite ``x`` in [-1000, 700]: ``2^k exp(r)`` with ``k`` the nearest integer
    to ``x / ln 2`` and ``r = x - k ln 2`` (two fused steps), ``exp(r)`` by :data:`EXP_TAYLOR`."""
    k = _call(b, "rint", [b.fmul(x, _f64(1.0 / LN2_HI))])
    r = _call(b, "fma", [k, _f64(-LN2_HI), x])
    r = _call(b, "fma", [k, _f64(-LN2_LO), r])
    p = _horner(b, r, EXP_TAYLOR)
    biased = b.add(b.fptosi(k, I64), ir.Constant(I64, 1023))
    return b.fmul(p, b.bitcast(b.shl(biased, ir.Constant(I64, 52)), F64))


def _nan_guarded(b: Builder, x: Val, wide: Val) -> tuple[Val, Val]:
    """Whether float32 ``x`` is NaN, and ``wide`` with a NaN replaced by 0 (a NaN must not reach the
    integer conversion, where it would be poison; the result is chosen by the NaN test instead)."""
    nan = b.fcmp_unordered("uno", x, x)
    return nan, b.select(nan, _f64(0.0), wide)


def exp_f32(b: Builder, x: Val) -> Val:
    """float32 exp(x): NaN stays NaN (quieted), -inf gives 0, +inf and overflow give +inf."""
    nan, wide = _nan_guarded(b, x, b.fpext(x, F64))
    y = b.fptrunc(exp_f64_core(b, _clamp(b, wide, *EXP_DOMAIN)), F32)
    return b.select(nan, b.fadd(x, x), y)


def tanh_f32(b: Builder, x: Val) -> Val:
    """float32 tanh(x): odd (tanh(-0) is -0), NaN stays NaN (quieted), ±inf gives ±1."""
    wide = b.fpext(x, F64)
    nan, a = _nan_guarded(b, x, _call(b, "fabs", [wide]))
    a = b.select(b.fcmp_ordered(">", a, _f64(TANH_SATURATES)), _f64(TANH_SATURATES), a)
    series = b.fmul(a, _horner(b, b.fmul(a, a), TANH_ODD))
    e = exp_f64_core(b, b.fmul(a, _f64(2.0)))
    closed = b.fsub(_f64(1.0), b.fdiv(_f64(2.0), b.fadd(e, _f64(1.0))))
    t = b.select(b.fcmp_ordered("<", a, _f64(TANH_SERIES_BELOW)), series, closed)
    y = b.fptrunc(_call(b, "copysign", [t, wide]), F32)
    return b.select(nan, b.fadd(x, x), y)


def erf_f32(b: Builder, x: Val) -> Val:
    """float32 erf(x): odd, NaN stays NaN (quieted), ±inf gives ±1. Below 1, ``x`` times a polynomial in
    ``x^2`` (relative accuracy down to the subnormals); from 1 to 4, the polynomial of the unit piece
    ``|x|`` falls in, its coefficients chosen per element (selects, so lanes stay independent)."""
    wide = b.fpext(x, F64)
    nan, a = _nan_guarded(b, x, _call(b, "fabs", [wide]))
    a = b.select(b.fcmp_ordered(">", a, _f64(ERF_SATURATES)), _f64(ERF_SATURATES), a)
    odd = b.fmul(a, _horner(b, b.fmul(a, a), ERF_ODD))
    below2, below3 = b.fcmp_ordered("<", a, _f64(2.0)), b.fcmp_ordered("<", a, _f64(3.0))

    def pick(first: float, second: float, third: float) -> Val:
        return b.select(below2, _f64(first), b.select(below3, _f64(second), _f64(third)))

    t = b.fsub(a, pick(1.5, 2.5, 3.5))
    acc = pick(*(piece[0] for piece in ERF_PIECES))
    for j in range(1, len(ERF_PIECES[0])):
        acc = _call(b, "fma", [acc, t, pick(*(piece[j] for piece in ERF_PIECES))])
    r = b.select(b.fcmp_ordered("<", a, _f64(1.0)), odd, acc)
    y = b.fptrunc(_call(b, "copysign", [r, wide]), F32)
    return b.select(nan, b.fadd(x, x), y)


FLOAT32_INLINE = {"exp": exp_f32, "tanh": tanh_f32, "erf": erf_f32}
"""The float32 primitives lowered here instead of by a libm call."""
