"""The interval domain: every scalar primitive of the rule language over ``[lo, hi]`` arrays.

Bounds are float64 arrays (one interval per element) plus a may-be-NaN mask. Each primitive
is sound over the reals; :func:`round_to` then widens by the rounding error of the result
type (relative ``k * u`` plus the smallest subnormal) and sends magnitudes that round to
infinity to infinity, so a bound holds for the value the float program really computes.
Integer results that leave their type's range may wrap to anything in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES
from cuvil.ir.numpy_prims import bitcast as _bitcast
from cuvil.ir.numpy_prims import cast as _cast

# --------------------------------------------------------------------------------------
# per-type constants


def unit_roundoff(dtype: DType) -> float:
    if not dtype.is_float:
        return 0.0
    return float(2.0 ** -(ml_dtypes.finfo(dtype.np).nmant + 1))


def gamma(k: int, u: float) -> float:
    """Higham's ``k u / (1 - k u)``: the relative error of ``k`` roundings in a row (infinite past ``k u = 1``)."""
    return k * u / (1.0 - k * u) if k * u < 1.0 else math.inf


def smallest_subnormal(dtype: DType) -> float:
    return float(ml_dtypes.finfo(dtype.np).smallest_subnormal) if dtype.is_float else 0.0


def overflow_at(dtype: DType) -> float:
    """The smallest magnitude that rounds to infinity in ``dtype``."""
    info = ml_dtypes.finfo(dtype.np)
    return float(info.max) + float(2.0 ** (int(info.maxexp) - 2 - int(info.nmant)))


def type_range(dtype: DType) -> tuple[float, float]:
    """The finite range of a type (bool is [0, 1])."""
    if dtype is DType.bool:
        return 0.0, 1.0
    if dtype.is_float:
        m = float(ml_dtypes.finfo(dtype.np).max)
        return -m, m
    info = np.iinfo(dtype.np)
    return float(info.min), float(info.max)



# --------------------------------------------------------------------------------------
# the interval value


class Interval:
    """``lo <= v <= hi`` per element (float64 arrays, broadcastable), ``nan``: v may be NaN.
    ``point`` marks an exactly known value (``lo is hi``)."""

    __slots__ = ("hi", "lo", "nan")

    def __init__(self, lo: Any, hi: Any = None, nan: Any = False) -> None:
        self.lo = np.asarray(lo, dtype=np.float64)
        self.hi = self.lo if hi is None else np.asarray(hi, dtype=np.float64)
        self.nan = np.asarray(nan, dtype=bool)

    @property
    def point(self) -> bool:
        return self.lo is self.hi and not self.nan.any()

    @staticmethod
    def of(value: Any) -> Interval:
        return Interval(np.asarray(value, dtype=np.float64))

    def reshape(self, shape: tuple[int, ...]) -> Interval:
        lo = self.lo.reshape(shape)
        hi = lo if self.lo is self.hi else self.hi.reshape(shape)
        nan = self.nan.reshape(shape) if self.nan.ndim else self.nan
        return Interval(lo, hi, nan)

    @property
    def ndim(self) -> int:
        return max(self.lo.ndim, self.hi.ndim, self.nan.ndim)

    def lift(self, depth: int) -> Interval:
        def up(a: np.ndarray) -> np.ndarray:
            return a if a.ndim in (0, depth) else a.reshape(a.shape + (1,) * (depth - a.ndim))

        if self.ndim == depth or self.ndim == 0:
            return self
        lo = up(self.lo)
        return Interval(lo, lo if self.lo is self.hi else up(self.hi), up(self.nan) if self.nan.ndim else self.nan)

    def magnitude(self) -> np.ndarray:
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    def intersect(self, lo: Any, hi: Any) -> Interval:
        """Tighten with another sound bound (keeping the NaN mask)."""
        new_lo = np.maximum(self.lo, lo)
        new_hi = np.minimum(self.hi, hi)
        bad = new_lo > new_hi  # only by rounding slack: keep the original bound there
        if np.any(bad):
            new_lo = np.where(bad, self.lo, new_lo)
            new_hi = np.where(bad, self.hi, new_hi)
        return Interval(new_lo, new_hi, self.nan)

    def clamp_finite(self, dtype: DType) -> Interval:
        """The bound a consumer sees: finite values of ``dtype`` only (each site is checked on its own)."""
        lo, hi = type_range(dtype)
        return Interval(np.clip(self.lo, lo, hi), np.clip(self.hi, lo, hi))

    def __repr__(self) -> str:
        return f"Interval(lo={self.lo!r}, hi={self.hi!r}, nan={bool(np.any(self.nan))})"


def _fix(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NaN endpoints (from inf - inf in a bound formula) mean "unbounded" on that side."""
    return np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)


def _mul_ep(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Endpoint products with 0 * inf = 0 (the limit of the real bound)."""
    with np.errstate(invalid="ignore"):
        p = np.multiply(a, b)
    bad = np.isnan(p)
    if bad.any():
        p = np.where(bad, 0.0, p)
    return p


def contains_zero(a: Interval) -> np.ndarray:
    return (a.lo <= 0) & (a.hi >= 0)


def infinite(a: Interval) -> np.ndarray:
    return np.isinf(a.lo) | np.isinf(a.hi)


# --------------------------------------------------------------------------------------
# rounding and wrap-around


def round_to(x: Interval, dtype: DType, k: float = 2.0, extra: Any = 0.0) -> Interval:
    """Widen by ``k`` units of rounding in ``dtype`` (plus an absolute ``extra``) and send values that
    round to infinity there; integer results outside the type's range may wrap to any value of it."""
    if dtype is DType.bool:
        return Interval(np.clip(x.lo, 0, 1), np.clip(x.hi, 0, 1), x.nan)
    if not dtype.is_float:
        return wrap(x, dtype)
    u = unit_roundoff(dtype) * k
    t = smallest_subnormal(dtype) + extra
    # lo - |lo| u written as lo (1 -+ u): infinite ends stay infinite
    lo = x.lo * (1.0 + u * -np.sign(x.lo))
    lo -= t
    hi = x.hi * (1.0 + u * np.sign(x.hi))
    hi += t
    # rounding keeps the sign: a nonnegative value never rounds below zero
    lo = np.where(x.lo >= 0, np.maximum(lo, 0.0), lo)
    hi = np.where(x.hi <= 0, np.minimum(hi, 0.0), hi)
    ovf = overflow_at(dtype)
    if lo.size and float(np.min(lo)) <= -ovf:
        lo = np.where(lo <= -ovf, -np.inf, lo)
    if hi.size and float(np.max(hi)) >= ovf:
        hi = np.where(hi >= ovf, np.inf, hi)
    return Interval(lo, hi, x.nan)


def wrap(x: Interval, dtype: DType) -> Interval:
    lo, hi = type_range(dtype)
    out = (x.lo < lo) | (x.hi > hi) | x.nan
    return Interval(np.where(out, lo, np.floor(x.lo)), np.where(out, hi, np.ceil(x.hi)))


# --------------------------------------------------------------------------------------
# arithmetic


def add(a: Interval, b: Interval) -> Interval:
    with np.errstate(invalid="ignore"):
        lo, hi = _fix(a.lo + b.lo, a.hi + b.hi)
    nan = a.nan | b.nan | ((a.hi == np.inf) & (b.lo == -np.inf)) | ((a.lo == -np.inf) & (b.hi == np.inf))
    return Interval(lo, hi, nan)


def neg(a: Interval) -> Interval:
    return Interval(-a.hi, -a.lo, a.nan)


def sub(a: Interval, b: Interval) -> Interval:
    return add(a, neg(b))


def mul(a: Interval, b: Interval) -> Interval:
    if b.lo is b.hi and a.lo is not a.hi:
        a, b = b, a
    if a.lo is a.hi:  # a known factor scales the other interval
        p, q = _mul_ep(a.lo, b.lo), _mul_ep(a.lo, b.hi)
        lo, hi = np.minimum(p, q), np.maximum(p, q)
    else:
        p1, p2, p3, p4 = (_mul_ep(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi))
        lo = np.minimum(np.minimum(p1, p2), np.minimum(p3, p4))
        hi = np.maximum(np.maximum(p1, p2), np.maximum(p3, p4))
    nan = a.nan | b.nan
    if not (np.isfinite(a.lo).all() and np.isfinite(a.hi).all() and np.isfinite(b.lo).all()
            and np.isfinite(b.hi).all()):
        nan = nan | (contains_zero(a) & infinite(b)) | (contains_zero(b) & infinite(a))
    return Interval(lo, hi, nan)


def square(a: Interval) -> Interval:
    """x * x of one value: never negative."""
    m = a.magnitude()
    low = np.where(contains_zero(a), 0.0, np.minimum(np.abs(a.lo), np.abs(a.hi)))
    with np.errstate(over="ignore"):
        return Interval(low * low, m * m, a.nan)


def div(a: Interval, b: Interval, dtype: DType) -> Interval:
    if not dtype.is_float:
        return _int_div(a, b)
    z = contains_zero(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        rec = Interval(np.where(z, -np.inf, 1.0 / b.hi), np.where(z, np.inf, 1.0 / b.lo))
    q = mul(a, rec)
    lo = np.where(z, -np.inf, q.lo)
    hi = np.where(z, np.inf, q.hi)
    nan = a.nan | b.nan | (z & contains_zero(a)) | (infinite(a) & infinite(b))
    return Interval(lo, hi, nan)


def _int_div(a: Interval, b: Interval) -> Interval:
    """Truncating division; a zero divisor gives 0 (CIR's definition)."""
    z = contains_zero(b)
    big = a.magnitude()
    with np.errstate(divide="ignore", invalid="ignore"):
        c = [p / q for p in (a.lo, a.hi) for q in (b.lo, b.hi)]
    lo = np.trunc(np.minimum.reduce(c))
    hi = np.trunc(np.maximum.reduce(c))
    lo = np.where(z, np.minimum(-big, 0), lo)
    hi = np.where(z, np.maximum(big, 0), hi)
    return Interval(*_fix(lo, hi))


def smin(a: Interval, b: Interval) -> Interval:
    return Interval(np.minimum(a.lo, b.lo), np.minimum(a.hi, b.hi), a.nan | b.nan)


def smax(a: Interval, b: Interval) -> Interval:
    return Interval(np.maximum(a.lo, b.lo), np.maximum(a.hi, b.hi), a.nan | b.nan)


def iabs(a: Interval) -> Interval:
    m = a.magnitude()
    low = np.where(contains_zero(a), 0.0, np.minimum(np.abs(a.lo), np.abs(a.hi)))
    return Interval(low, m, a.nan)


def _monotone(f: Callable[[np.ndarray], np.ndarray], a: Interval, increasing: bool = True) -> Interval:
    with np.errstate(all="ignore"):
        lo, hi = (f(a.lo), f(a.hi)) if increasing else (f(a.hi), f(a.lo))
    return Interval(*_fix(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)), a.nan)


def exp(a: Interval) -> Interval:
    return _monotone(np.exp, a)


def log(a: Interval) -> Interval:
    clipped = Interval(np.maximum(a.lo, 0.0), np.maximum(a.hi, 0.0))
    out = _monotone(np.log, clipped)
    return Interval(out.lo, out.hi, a.nan | (a.lo < 0))


def sqrt(a: Interval) -> Interval:
    clipped = Interval(np.maximum(a.lo, 0.0), np.maximum(a.hi, 0.0))
    out = _monotone(np.sqrt, clipped)
    return Interval(out.lo, out.hi, a.nan | (a.lo < 0))


_erf_obj = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf_obj(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def _domain(a: Interval, lo: float, hi: float, f: Callable[[np.ndarray], np.ndarray], increasing: bool = True,
            open_ends: bool = False) -> Interval:
    """A monotone function defined on [lo, hi]: NaN outside it."""
    clipped = Interval(np.clip(a.lo, lo, hi), np.clip(a.hi, lo, hi))
    out = _monotone(f, clipped, increasing)
    outside = (a.lo < lo) | (a.hi > hi)
    return Interval(out.lo, out.hi, a.nan | outside)


def _even_convex(f: Callable[[np.ndarray], np.ndarray], a: Interval) -> Interval:
    """cosh: even and increasing in |x|."""
    m = iabs(a)
    with np.errstate(all="ignore"):
        return Interval(f(m.lo), f(m.hi), a.nan)


def _periodic(f: Callable[[np.ndarray], np.ndarray], a: Interval) -> Interval:
    """sin/cos: within [-1, 1]; exact for point intervals."""
    with np.errstate(all="ignore"):
        exact = f(a.lo)
    pt = a.lo == a.hi
    return Interval(np.where(pt, exact, -1.0), np.where(pt, exact, 1.0), a.nan | infinite(a))


def _tan(a: Interval) -> Interval:
    k_lo = np.floor((a.lo + np.pi / 2) / np.pi)
    k_hi = np.floor((a.hi + np.pi / 2) / np.pi)
    same = (k_lo == k_hi) & np.isfinite(a.lo) & np.isfinite(a.hi)
    with np.errstate(all="ignore"):
        lo, hi = np.tan(a.lo), np.tan(a.hi)
    return Interval(np.where(same, lo, -np.inf), np.where(same, hi, np.inf), a.nan | infinite(a))


def ipow(a: Interval, b: Interval) -> Interval:
    """a ** b: exact case analysis for a constant exponent, exp(b log a) for a positive base."""
    p = b.lo
    point_b = np.all(b.lo == b.hi)
    if point_b and np.ndim(p) == 0:
        return _pow_const(a, float(p))
    pos = a.lo > 0
    general = exp(mul(b, log(Interval(np.maximum(a.lo, np.finfo(np.float64).tiny), np.maximum(a.hi, 1e-300)))))
    lo = np.where(pos, general.lo, -np.inf)
    hi = np.where(pos, general.hi, np.inf)
    nan = a.nan | b.nan | ~pos
    return Interval(lo, hi, nan)


def _pow_const(a: Interval, p: float) -> Interval:
    if p == 0:
        return Interval(np.ones_like(a.lo))
    with np.errstate(all="ignore"):
        if p == int(p):
            n = int(p)
            if n > 0 and n % 2 == 0:
                m = iabs(a)
                return Interval(m.lo ** n, m.hi ** n, a.nan)
            if n > 0:
                return Interval(a.lo ** n, a.hi ** n, a.nan)
            z = contains_zero(a)
            if n % 2 == 0:
                m = iabs(a)
                lo, hi = m.hi ** n, np.where(m.lo == 0, np.inf, m.lo ** n)
                return Interval(lo, hi, a.nan | (z & infinite(a)))
            lo = np.where(z, -np.inf, a.hi ** n)
            hi = np.where(z, np.inf, a.lo ** n)
            return Interval(lo, hi, a.nan)
        neg_base = a.lo < 0
        c = Interval(np.maximum(a.lo, 0.0), np.maximum(a.hi, 0.0))
        if p > 0:
            return Interval(c.lo ** p, c.hi ** p, a.nan | neg_base)
        return Interval(c.hi ** p, np.where(c.lo == 0, np.inf, c.lo ** p), a.nan | neg_base)


def fmod(a: Interval, b: Interval) -> Interval:
    """C fmod: the sign of a, magnitude below |b| and at most |a|."""
    m = b.magnitude()
    lo = np.where(a.lo >= 0, 0.0, np.maximum(a.lo, -m))
    hi = np.where(a.hi <= 0, 0.0, np.minimum(a.hi, m))
    nan = a.nan | b.nan | contains_zero(b) | infinite(a)
    return Interval(lo, hi, nan)


def fmod_int(a: Interval, b: Interval) -> Interval:
    m = np.maximum(b.magnitude() - 1, 0)
    lo = np.where(a.lo >= 0, 0.0, np.maximum(a.lo, -m))
    hi = np.where(a.hi <= 0, 0.0, np.minimum(a.hi, m))
    return Interval(lo, hi)


def floored_mod(a: Interval, b: Interval, dtype: DType) -> Interval:
    """Floored modulo: the sign of b, magnitude below |b|."""
    m = b.magnitude()
    if not dtype.is_float:
        m = np.maximum(m - 1, 0)
    lo = np.where(b.lo > 0, 0.0, -m)
    hi = np.where(b.hi < 0, 0.0, m)
    if not dtype.is_float:
        return Interval(lo, hi)
    nan = a.nan | b.nan | contains_zero(b) | infinite(a)
    return Interval(lo, hi, nan)


# --------------------------------------------------------------------------------------
# comparisons, logic, bits


def _compare(fn: str, a: Interval, b: Interval) -> Interval:
    if fn == "lt":
        yes, no = a.hi < b.lo, a.lo >= b.hi
    elif fn == "le":
        yes, no = a.hi <= b.lo, a.lo > b.hi
    elif fn == "gt":
        yes, no = a.lo > b.hi, a.hi <= b.lo
    elif fn == "ge":
        yes, no = a.lo >= b.hi, a.hi < b.lo
    elif fn == "eq":
        yes = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
        no = (a.hi < b.lo) | (a.lo > b.hi)
    else:  # ne
        yes = (a.hi < b.lo) | (a.lo > b.hi)
        no = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
    nan = a.nan | b.nan
    if fn == "ne":
        no = no & ~nan
    else:
        yes = yes & ~nan
    return Interval(np.where(yes, 1.0, 0.0), np.where(no, 0.0, 1.0))


def _logic(fn: str, a: Interval, b: Interval | None) -> Interval:
    if fn == "not":
        return Interval(1.0 - a.hi, 1.0 - a.lo)
    assert b is not None
    if fn == "and":
        return Interval(np.minimum(a.lo, b.lo), np.minimum(a.hi, b.hi))
    if fn == "or":
        return Interval(np.maximum(a.lo, b.lo), np.maximum(a.hi, b.hi))
    known = (a.lo == a.hi) & (b.lo == b.hi)
    v = np.abs(a.lo - b.lo)
    return Interval(np.where(known, v, 0.0), np.where(known, v, 1.0))


def _bits(fn: str, args: list[Interval], dtype: DType) -> Interval:
    lo_t, hi_t = type_range(dtype)
    full = Interval(np.full(np.broadcast(*(x.lo for x in args)).shape, lo_t),
                    np.full(np.broadcast(*(x.lo for x in args)).shape, hi_t))
    a = args[0]
    if fn == "bit_not":
        if dtype.is_signed:
            return Interval(-a.hi - 1, -a.lo - 1)
        return Interval(hi_t - a.hi, hi_t - a.lo)
    b = args[1]
    nonneg = (a.lo >= 0) & (b.lo >= 0)
    if fn == "bit_and":
        return Interval(np.where(nonneg, 0.0, full.lo), np.where(nonneg, np.minimum(a.hi, b.hi), full.hi))
    if fn in ("bit_or", "bit_xor"):
        top = np.maximum(a.hi, b.hi)
        cap = np.where(top > 0, 2.0 ** np.ceil(np.log2(np.maximum(top, 1) + 1)) - 1, 0.0)
        return Interval(np.where(nonneg, 0.0, full.lo), np.where(nonneg, np.minimum(cap, hi_t), full.hi))
    if fn == "shr":
        ok = nonneg & (b.hi < dtype.bits)
        with np.errstate(all="ignore"):
            lo = np.floor(a.lo / 2.0 ** b.hi)
            hi = np.floor(a.hi / 2.0 ** b.lo)
        return Interval(np.where(ok, lo, full.lo), np.where(ok, hi, full.hi))
    return full  # shl


# --------------------------------------------------------------------------------------
# casts and select


def cast(a: Interval, to: DType, src: DType) -> Interval:
    if to is DType.bool:
        nonzero = (a.lo > 0) | (a.hi < 0)
        zero = (a.lo == 0) & (a.hi == 0)
        return Interval(np.where(nonzero | a.nan, 1.0, 0.0), np.where(zero & ~a.nan, 0.0, 1.0))
    if to.is_float:
        exact = _exact_float_cast(src, to) or (
            src.is_int and float(np.max(np.abs(a.lo), initial=0.0)) < 2.0 ** (ml_dtypes.finfo(to.np).nmant + 1)
            and float(np.max(np.abs(a.hi), initial=0.0)) < 2.0 ** (ml_dtypes.finfo(to.np).nmant + 1))
        out = a if exact else round_to(a, to, 1.0)
        return Interval(out.lo, out.hi, a.nan)
    lo_t, hi_t = type_range(to)
    if src.is_float:
        lo, hi = np.trunc(a.lo), np.trunc(a.hi)
        nonfinite = infinite(a) | a.nan
        lo = np.where(nonfinite, np.minimum(lo, 0.0), lo)
        hi = np.where(nonfinite, np.maximum(hi, 0.0), hi)
        x = Interval(*_fix(lo, hi))
        out = (x.lo < lo_t) | (x.hi > hi_t)
        return Interval(np.where(out, lo_t, x.lo), np.where(out, hi_t, x.hi))
    return wrap(a, to)


def _exact_float_cast(src: DType, to: DType) -> bool:
    wider = {DType.f16: (DType.f32, DType.f64), DType.bf16: (DType.f32, DType.f64), DType.f32: (DType.f64,)}
    return src is to or to in wider.get(src, ()) or src is DType.bool or (
        src.is_int and src.bits <= 16 and to is not DType.bf16 and to.bits >= 32)


_EXACT_INT = 2.0 ** 53
"""Integers below this magnitude are exact in the float64 bounds; a point beyond may have lost bits."""


def bitcast(a: Interval, to: DType, src: DType) -> Interval:
    """Bits read as another type of the same width. Between integers (a bool's byte is 0 or 1) it
    wraps as a cast does. Through a float's bits: exact at elements known to one value whose bits the
    float64 bound holds (every float, integers below 2**53 in magnitude), anywhere in ``to`` elsewhere
    (for a float target: any value, NaN and infinities included); a 64-bit integer result beyond
    2**53 keeps the float64 neighbours around it."""
    if src is to:
        return a
    if not (src.is_float or to.is_float):
        return cast(a, to, src)
    lo, hi, nan = np.broadcast_arrays(a.lo, a.hi, a.nan)
    known = (lo == hi) & ~nan & (True if src.is_float else np.abs(lo) < _EXACT_INT)
    with np.errstate(all="ignore"):
        value = _bitcast(np.where(known, lo, 0.0).astype(src.np), to).astype(np.float64)
    if to.is_float:
        nan_out = ~known | np.isnan(value)
        out_lo = np.where(known & ~nan_out, value, -np.inf)
        out_hi = np.where(known & ~nan_out, value, np.inf)
        return Interval(out_lo, out_hi, nan_out)
    t_lo, t_hi = type_range(to)
    inexact = np.abs(value) >= _EXACT_INT
    out_lo = np.where(inexact, np.nextafter(value, -np.inf), value)
    out_hi = np.where(inexact, np.nextafter(value, np.inf), value)
    return Interval(np.where(known, out_lo, t_lo), np.where(known, out_hi, t_hi))


def select(c: Interval, a: Interval, b: Interval) -> Interval:
    yes = c.lo >= 1
    no = c.hi <= 0
    lo = np.where(yes, a.lo, np.where(no, b.lo, np.minimum(a.lo, b.lo)))
    hi = np.where(yes, a.hi, np.where(no, b.hi, np.maximum(a.hi, b.hi)))
    nan = np.where(yes, a.nan, np.where(no, b.nan, a.nan | b.nan))
    return Interval(lo, hi, nan)


# --------------------------------------------------------------------------------------
# dispatch

ROUNDING = frozenset({"add", "sub", "mul", "div", "pow", "mod", "exp", "log", "sqrt", "tanh", "erf", "sin", "cos",
                      "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"})
"""Primitives whose float result is rounded (the others return one of their operands' values,
an integer-valued result, or a bool)."""

TRANSCENDENTAL = frozenset({"pow", "exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                            "cosh", "asinh", "acosh", "atanh"})

_UNARY: dict[str, Callable[[Interval], Interval]] = {
    "exp": exp, "log": log, "sqrt": sqrt, "neg": neg, "abs": iabs,
    "tanh": lambda a: _monotone(np.tanh, a), "erf": lambda a: _monotone(_erf, a),
    "atan": lambda a: _monotone(np.arctan, a), "sinh": lambda a: _monotone(np.sinh, a),
    "asinh": lambda a: _monotone(np.arcsinh, a), "cosh": lambda a: _even_convex(np.cosh, a),
    "sin": lambda a: _periodic(np.sin, a), "cos": lambda a: _periodic(np.cos, a), "tan": _tan,
    "asin": lambda a: _domain(a, -1.0, 1.0, np.arcsin), "acos": lambda a: _domain(a, -1.0, 1.0, np.arccos, False),
    "acosh": lambda a: _domain(a, 1.0, np.inf, np.arccosh), "atanh": lambda a: _domain(a, -1.0, 1.0, np.arctanh),
    "floor": lambda a: _monotone(np.floor, a), "ceil": lambda a: _monotone(np.ceil, a),
    "round_even": lambda a: _monotone(np.round, a),
}

_BINARY: dict[str, Callable[[Interval, Interval], Interval]] = {
    "add": add, "sub": sub, "mul": mul, "min": smin, "max": smax, "pow": ipow,
}

_BINARY_IN_DTYPE: dict[str, Callable[[Interval, Interval, DType], Interval]] = {"div": div, "mod": floored_mod}


def apply(fn: str, args: list[Interval], dtype: DType, attrs: dict[str, Any], arg_dtypes: list[DType]) -> Interval:
    """The interval of ``fn(args)`` in ``dtype`` (before rounding to ``dtype``)."""
    if fn in _UNARY:
        return _UNARY[fn](args[0])
    if fn in _BINARY:
        return _BINARY[fn](*args)
    if fn in _BINARY_IN_DTYPE:
        return _BINARY_IN_DTYPE[fn](args[0], args[1], dtype)
    if fn == "fmod":
        return fmod(*args) if dtype.is_float else fmod_int(*args)
    if fn in ("eq", "ne", "lt", "le", "gt", "ge"):
        return _compare(fn, *args)
    if fn in ("and", "or", "xor", "not"):
        return _logic(fn, args[0], args[1] if len(args) > 1 else None)
    if fn == "isnan":
        a = args[0]
        return Interval(np.zeros_like(a.lo), np.where(a.nan, 1.0, 0.0))
    if fn == "isinf":
        a = args[0]
        sure = (a.lo == a.hi) & np.isinf(a.lo) & ~a.nan
        return Interval(np.where(sure, 1.0, 0.0), np.where(infinite(a), 1.0, 0.0))
    if fn in ("bit_and", "bit_or", "bit_xor", "bit_not", "shl", "shr"):
        return _bits(fn, args, dtype)
    if fn == "select":
        return select(*args)
    if fn == "cast":
        return cast(args[0], attrs["to"], arg_dtypes[0])
    if fn == "bitcast":
        return bitcast(args[0], attrs["to"], arg_dtypes[0])
    raise NotImplementedError(f"no interval rule for primitive {fn!r}")


def concrete(fn: str, args: list[np.ndarray], dtype: DType, attrs: dict[str, Any],
             arg_dtypes: list[DType]) -> np.ndarray:
    """``fn`` on exact values, in the rule's own types (as the interpreter computes it)."""
    typed = [np.asarray(a).astype(d.np) for a, d in zip(args, arg_dtypes, strict=True)]
    with np.errstate(all="ignore"):
        if fn == "cast":
            out = _cast(typed[0], attrs["to"])
        elif fn == "bitcast":
            out = _bitcast(typed[0], attrs["to"])
        else:
            out = np.asarray(NUMPY_PRIMITIVES[fn](*typed)).astype(dtype.np, copy=False)
    return np.asarray(out).astype(np.float64)
