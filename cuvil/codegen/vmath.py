"""Float32 ``exp``, ``tanh``, ``erf`` and ``pow`` as straight-line LLVM IR: computed in double precision and
rounded to float32 once, so they are correctly rounded except where the exact value lies within about
1e-15 of a rounding boundary (``pow``'s ``exp(y ln x)``: 3e-14).

A libm call in a loop keeps the loop scalar (glibc's ``tanhf`` and double ``erf`` cost 13-14 ns an
element, ``powf`` 4.2 ns, ``expf`` 1.7 ns); these contain no call and no branch, so LLVM vectorizes the loops
and kernel epilogues that use them (0.7, 1.2, 1.6 and 4.1 ns; ``pow`` by a constant whole exponent, 0.26),
and every lane, every scalar remainder and every kernel computes the same bits for the same input: the
proofs treat a transcendental as one function of its operand, so it must be one everywhere in a library.
(A scalar ``exp`` is slower than ``expf``: the reductions that sum exponentials, softmax's, run on a kernel
that advances rows in vector lanes, :mod:`cuvil.codegen.kernels.rows`.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

from cuvil.codegen.llvm_types import F32, F64, I32, I64, declare

if TYPE_CHECKING:
    from cuvil.codegen.scalar import Builder, Val

LN2_HI = math.log(2.0)
LN2_LO = float.fromhex("0x1.abc9e3b39803fp-56")
"""ln 2 - LN2_HI: the two together give ``x - k ln 2`` to about 1e-32 for the ``k`` float32 needs."""

EXP_TAYLOR = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))
"""exp(r) for |r| <= ln(2)/2 by its Taylor polynomial of degree 13 (truncation below 5e-18, about 2e-16
evaluated in double). Degree 11 left 6e-15: a float32 exp then rounded the wrong way where the exact value lay
that close to a rounding boundary (exp(65.51379), 3.5e-15 above one, a sigmoid's in a random campaign)."""

LOG_ATANH = tuple(1.0 / (2 * k + 1) for k in range(10, -1, -1))
"""ln(m) = 2 s (1 + s^2/3 + s^4/5 + ...) with s = (m - 1) / (m + 1): for m in [sqrt(1/2), sqrt(2)), s^2 < 0.0295
and eleven terms leave a relative error below 1e-18."""

SQRT2_FRACTION = 0x6A09E667F3BCD
"""The 52 fraction bits of sqrt(2) as a double: a mantissa in [1, 2) at or above it is halved."""

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
ERF_SPLIT = 2.25
"""erf(x) is ``x`` times a polynomial in ``x^2`` below it, a polynomial in ``x`` from it to 4."""

ERF_ODD_CENTER = ERF_SPLIT * ERF_SPLIT / 2
ERF_ODD = _doubles(
    "0x1.13c24e7611a07p-61", "-0x1.4cfcb2dc04dc7p-57", "0x1.5d0661fe43f4fp-53", "-0x1.7707ded5008efp-49",
    "0x1.7d734793e4e7bp-45", "-0x1.6b3388956f5f0p-41", "0x1.4384ba67ddc21p-37", "-0x1.0c6f0257aa131p-33",
    "0x1.9cccabbc0e561p-30", "-0x1.246f7022aa9f7p-26", "0x1.7b3b1ee309d08p-23", "-0x1.bec0612059eccp-20",
    "0x1.da0df1ba9fff2p-17", "-0x1.c0e26ee7450dap-14", "0x1.77b6c994c3145p-11", "-0x1.13f0fffce2788p-8",
    "0x1.64a0a83d7b08ep-6", "-0x1.a7799829144f2p-4", "0x1.39f1b61df289dp-1")
"""erf(x) / x as a polynomial in ``x^2 - ERF_ODD_CENTER`` for |x| < ERF_SPLIT (19 coefficients, error below
5e-18; 2e-16 evaluated in double)."""

ERF_TAIL_CENTER = (ERF_SPLIT + 4.0) / 2
ERF_TAIL = _doubles(
    "0x1.f9a647f5bf722p-29", "-0x1.ac3709438035dp-28", "-0x1.d601ac5f34a54p-26", "0x1.132bf7006563dp-23",
    "-0x1.79141f93b8a91p-23", "-0x1.bfff6e322de25p-22", "0x1.6e411b9bd8f66p-19", "-0x1.ab14b74b55778p-18",
    "0x1.03f13a013424ep-18", "0x1.aafbcdcfd3a4cp-16", "-0x1.d2ac67a36c28fp-14", "0x1.176cfbca97d1ep-12",
    "-0x1.da496e71999d0p-12", "0x1.2e7e75fb995f6p-11", "-0x1.24544f022980dp-11", "0x1.a3737e2fdd140p-12",
    "-0x1.a8670aa9a3015p-13", "0x1.0f9e1b4d895f6p-14", "0x1.fffeb3ebb267bp-1")
"""erf(x) as a polynomial in ``x - ERF_TAIL_CENTER`` for ERF_SPLIT <= x <= 4 (19 coefficients, error below
3e-16 evaluated in double)."""

ERF_SMALL = 1.5
"""Below it erf(x) is also ``x`` times a shorter polynomial in ``x^2``: a block of operands all below it (a
GELU's, mostly) evaluates 14 fused steps instead of 19, with the same bits."""

ERF_SMALL_CENTER = ERF_SMALL * ERF_SMALL / 2
ERF_SMALL_ODD = _doubles(
    "-0x1.526381f4424a9p-39", "0x1.2b86fe20ea640p-35", "-0x1.e1b0ac9bbceccp-32", "0x1.6dc06bd091b84p-28",
    "-0x1.fe8e2582bdd4ep-25", "0x1.44f07fb203ba7p-21", "-0x1.75ed45b0ffaf1p-18", "0x1.80f0eec6ee9e9p-15",
    "-0x1.5e0ed92b61d7ap-12", "0x1.14fddf5ecb325p-9", "-0x1.76d74fee296e2p-7", "0x1.aa9b76b754436p-5",
    "-0x1.9a0f4ba28a7a7p-3", "0x1.a23859e1c5fa1p-1")
"""erf(x) / x as a polynomial in ``x^2 - ERF_SMALL_CENTER`` for |x| < ERF_SMALL (14 coefficients, error below
1.1e-16). Its float32 results are those of :data:`ERF_ODD` on every float32 below the bound (an exhaustive
check, ``tests/codegen/test_vmath.py``); 13 coefficients differ on 7 of them."""

ERF_BOUNDS = (ERF_SMALL, ERF_SPLIT)
"""The forms of erf a caller may choose for operands it knows to lie below the bound, cheapest first:
:func:`erf_f32`'s ``below``."""

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


def exp_f32(b: Builder, x: Val, inside: bool = False) -> Val:
    """float32 exp(x): NaN stays NaN (quieted), -inf gives 0, +inf and overflow give +inf.

    ``inside``: for a caller that knows x lies in :data:`EXP_DOMAIN` (so is not NaN; softmax's rows,
    :class:`cuvil.codegen.kernels.rows.SoftmaxKernel`): the same bits without the NaN test and the clamp."""
    if inside:
        return b.fptrunc(exp_f64_core(b, b.fpext(x, F64)), F32)
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


def erf_f32(b: Builder, x: Val, below: float | None = None) -> Val:
    """float32 erf(x): odd, NaN stays NaN (quieted), ±inf gives ±1. Below :data:`ERF_SPLIT`, ``x`` times a
    polynomial in ``x^2`` (relative accuracy down to the subnormals); from there to 4, a polynomial in ``x``.
    Both are evaluated and one chosen per element (a select, so lanes stay independent): two chains of 19
    fused multiply-adds and no per-coefficient selects.

    ``below`` (one of :data:`ERF_BOUNDS`): the form for a caller that knows |x| < ``below`` (so x is not NaN;
    :class:`cuvil.codegen.lower_rule.ErfBlocks`): below :data:`ERF_SPLIT` the first polynomial alone, below
    :data:`ERF_SMALL` the shorter one, neither with the NaN test nor the clamp, which cannot apply there;
    each is the same bits at less cost."""
    wide = b.fpext(x, F64)

    def odd(a: Val, small: bool) -> Val:  # a times the polynomial in a^2
        center, coefficients = (ERF_SMALL_CENTER, ERF_SMALL_ODD) if small else (ERF_ODD_CENTER, ERF_ODD)
        return b.fmul(a, _horner(b, _call(b, "fma", [a, a, _f64(-center)]), coefficients))

    if below is not None:
        return b.fptrunc(_call(b, "copysign", [odd(_call(b, "fabs", [wide]), below == ERF_SMALL), wide]), F32)
    nan, a = _nan_guarded(b, x, _call(b, "fabs", [wide]))
    a = b.select(b.fcmp_ordered(">", a, _f64(ERF_SATURATES)), _f64(ERF_SATURATES), a)
    far = _horner(b, b.fsub(a, _f64(ERF_TAIL_CENTER)), ERF_TAIL)
    y = b.fptrunc(_call(b, "copysign", [b.select(b.fcmp_ordered("<", a, _f64(ERF_SPLIT)), odd(a, False), far),
                                        wide]), F32)
    return b.select(nan, b.fadd(x, x), y)


def log_f64_core(b: Builder, a: Val) -> Val:
    """ln(a) in double for a positive, finite, normal double ``a`` (every float32 but 0 widens to one):
    ``a = 2^e m`` with m in [sqrt(1/2), sqrt(2)) taken from the bits, ``e ln 2 + ln m`` with ln m by
    :data:`LOG_ATANH` (relative error about 3e-16)."""
    bits = b.bitcast(a, I64)
    fraction = b.and_(bits, ir.Constant(I64, (1 << 52) - 1))
    halve = b.zext(b.icmp_unsigned(">=", fraction, ir.Constant(I64, SQRT2_FRACTION)), I64)
    e = b.add(b.sub(b.lshr(bits, ir.Constant(I64, 52)), ir.Constant(I64, 1023)), halve)
    m = b.bitcast(b.or_(fraction, b.shl(b.sub(ir.Constant(I64, 1023), halve), ir.Constant(I64, 52))), F64)
    s = b.fdiv(b.fsub(m, _f64(1.0)), b.fadd(m, _f64(1.0)))
    ln_m = b.fmul(b.fmul(s, _f64(2.0)), _horner(b, b.fmul(s, s), LOG_ATANH))
    k = b.sitofp(e, F64)
    return _call(b, "fma", [k, _f64(LN2_HI), _call(b, "fma", [k, _f64(LN2_LO), ln_m])])


POW_BY_PRODUCTS = 4
"""Whole exponents up to this magnitude are products of x in double (x^2 exact; one rounding for x^3 and x^4,
one more for the reciprocal of a negative exponent); ±0.5 a square root. Both are closer than ``exp(y ln x)``,
and a constant exponent then folds to the product alone: ``x ** 2`` and a GELU's ``x ** 3`` cost a few
multiplies, not a logarithm and an exponential."""


def pow_f32(b: Builder, x: Val, y: Val) -> Val:
    """float32 pow(x, y) as C's ``powf`` defines it, computed in double and rounded once: for whole
    |y| <= :data:`POW_BY_PRODUCTS` by products, for |y| = 0.5 by a square root, else ``exp(y ln|x|)``
    negated for a negative x and an odd whole y; NaN for a finite negative x and a y that is not whole; 1
    for y = ±0 or x = 1 (even with a NaN operand); else a NaN operand gives itself quieted (x's if both are). Zeros and
    infinities of x, and infinite y, follow from ln|x| = ±inf and the product's limits (x = -1 with
    y = ±inf gives 1). Every path is chosen per element by a select, so lanes stay independent and the
    function is the same wherever it is emitted."""
    xw, yw = b.fpext(x, F64), b.fpext(y, F64)
    a, ay = _call(b, "fabs", [xw]), _call(b, "fabs", [yw])
    ln_a = log_f64_core(b, b.select(b.fcmp_ordered(">", a, _f64(0.0)), a, _f64(1.0)))
    ln_a = b.select(b.fcmp_ordered("==", a, _f64(0.0)), _f64(-math.inf), ln_a)
    ln_a = b.select(b.fcmp_ordered("==", a, _f64(math.inf)), _f64(math.inf), ln_a)
    t = b.fmul(yw, ln_a)  # NaN only for 0 * inf (y = 0, or |x| = 1 and y infinite): 1 either way
    t = b.select(b.fcmp_unordered("uno", t, t), _f64(0.0), t)
    e = exp_f64_core(b, _clamp(b, t, *EXP_DOMAIN))
    whole = b.fcmp_ordered("==", _call(b, "rint", [yw]), yw)  # infinities too
    half = b.fmul(yw, _f64(0.5))
    odd = b.and_(whole, b.fcmp_ordered("!=", _call(b, "rint", [half]), half))
    negative = b.icmp_signed("<", b.bitcast(x, I32), ir.Constant(I32, 0))
    general = b.select(b.and_(negative, odd), b.fneg(e), e)

    reciprocal = b.fcmp_ordered("<", yw, _f64(0.0))
    square = b.fmul(xw, xw)
    powers = [xw, square, b.fmul(square, xw), b.fmul(square, square)]
    product = powers[-1]
    for k in range(POW_BY_PRODUCTS - 1, 0, -1):
        product = b.select(b.fcmp_ordered("==", ay, _f64(float(k))), powers[k - 1], product)
    product = b.select(reciprocal, b.fdiv(_f64(1.0), product), product)
    root = _call(b, "sqrt", [a])
    root = b.select(reciprocal, b.fdiv(_f64(1.0), root), root)
    by_products = b.and_(whole, b.fcmp_ordered("<=", ay, _f64(float(POW_BY_PRODUCTS))))
    wide = b.select(by_products, product, b.select(b.fcmp_ordered("==", ay, _f64(0.5)), root, general))

    r = b.fptrunc(wide, F32)
    finite_negative = b.and_(b.fcmp_ordered("<", xw, _f64(0.0)), b.fcmp_ordered(">", xw, _f64(-math.inf)))
    r = b.select(b.and_(finite_negative, b.not_(whole)), ir.Constant(F32, math.nan), r)
    quiet = b.select(b.fcmp_unordered("uno", x, x), b.fadd(x, x), b.fadd(y, y))  # x's NaN, else y's
    r = b.select(b.fcmp_unordered("uno", x, y), quiet, r)
    one = b.or_(b.fcmp_ordered("==", yw, _f64(0.0)), b.fcmp_ordered("==", xw, _f64(1.0)))
    return b.select(one, ir.Constant(F32, 1.0), r)


FLOAT32_INLINE = {"exp": exp_f32, "tanh": tanh_f32, "erf": erf_f32}
"""The float32 primitives lowered here instead of by a libm call."""
