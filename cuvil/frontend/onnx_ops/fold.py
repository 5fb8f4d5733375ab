"""Shape arithmetic at import time: CIR ops evaluated on values that hold symbolic dims.

Exporters compute Reshape targets, Range limits, Pad amounts and Resize sizes from ``Shape``
with integer and float ops (``Div``, ``Mod``, ``Cast``, ``Floor``, ``Max``, ``Equal``/``Where``).
When a dim is symbolic those values are object arrays of numbers and
:class:`~cuvil.ir.symbolic.Sym`; this module evaluates the ops on them exactly, keeping the
results symbolic, and refuses (:class:`SymbolicValueRequired`) only what depends on the dims'
run-time values, such as ``N == 1``. A float-typed value holds an exact rational: a number, a
dim, or a :class:`SymFrac` (``Cast(W) / 2`` before a ``Floor`` brings it back to a dim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_node import SymbolicValueRequired
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.opdef import OpDef, get_op
from cuvil.ir.symbolic import Dim, Sym, dim_bounds, exact_ratio, quotient, sym_max, sym_min
from cuvil.ir.types import TensorType

MAX_DENOMINATOR = 1 << 10
"""Float constants meeting symbolic dims must be fractions with at most this denominator (0.5,
0.25, 1.5): float32 then computes them exactly for any realistic dim, as the fold does."""

MAX_FOLD_ELEMENTS = 1 << 16  # shape values are short vectors; a larger symbolic array is not one


class SymFrac:
    """``num / den`` for a symbolic ``num`` and an integer ``den >= 2`` in lowest terms."""

    __slots__ = ("den", "num")

    def __init__(self, num: Sym, den: int) -> None:
        self.num = num
        self.den = den

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymFrac) and self.num == other.num and self.den == other.den

    def __hash__(self) -> int:
        return hash((self.num, self.den))

    def __str__(self) -> str:
        return f"({self.num})/{self.den}"

    def __repr__(self) -> str:
        return f"SymFrac({self})"


Scalar = int | float | Sym | SymFrac
T = TypeVar("T")


def is_symbolic(v: object) -> bool:
    return isinstance(v, (Sym, SymFrac))


def number(v: Scalar | bool) -> int | float:
    """``v`` where the caller has ruled out a symbolic value."""
    assert not isinstance(v, (Sym, SymFrac))
    return v


def ratio(num: Dim, den: int) -> Scalar:
    """``num / den`` in lowest terms: a dim when it divides, a float when it is constant."""
    if den < 0:
        num, den = -num, -den
    if isinstance(num, int):
        return num // den if num % den == 0 else num / den
    g = math.gcd(den, *(c for _, c in num.terms))
    reduced = num // g
    if isinstance(reduced, int):  # a Sym keeps a symbol through an exact division
        return ratio(reduced, den // g)
    return reduced if den == g else SymFrac(reduced, den // g)


def parts(v: Scalar, where: str) -> tuple[Dim, int]:
    """``v`` as an exact ``(numerator, denominator > 0)``."""
    if isinstance(v, SymFrac):
        return v.num, v.den
    if isinstance(v, (Sym, int)):
        return (v if isinstance(v, Sym) else int(v)), 1
    if not math.isfinite(v):
        raise UnsupportedOpError(f"the value {v} meets a symbolic dim", location=where)
    f = Fraction(v)
    if f.denominator > MAX_DENOMINATOR:
        raise UnsupportedOpError(f"the float {v} meets a symbolic dim and is not a small exact fraction",
                                 location=where, hint="shape arithmetic on symbolic dims folds exact values "
                                                      "only (halves, quarters, integers)")
    return f.numerator, f.denominator


def bounds_of(v: Scalar, where: str) -> tuple[int | None, int | None]:
    """Bounds of the numerator of ``v``: its sign is the sign of ``v``."""
    return dim_bounds(parts(v, where)[0])


def _difference(a: Scalar, b: Scalar, where: str) -> tuple[int | None, int | None]:
    """Bounds of a number with the sign of ``a - b``."""
    (n1, d1), (n2, d2) = parts(a, where), parts(b, where)
    return dim_bounds(n1 * d2 - n2 * d1)


def require(answer: T | None, what: str, where: str) -> T:
    """``answer`` unless it is None (undecided at import time)."""
    if answer is None:
        raise SymbolicValueRequired(what, where)
    return answer


# --------------------------------------------------------------------------------------
# the ops


@dataclass(frozen=True)
class _Site:
    """What a rule knows besides its operands: their types, the result's, the op's attributes."""

    op: str
    in_dtypes: tuple[DType, ...]
    out_dtype: DType
    attrs: Mapping[str, Any]
    where: str


def plus(a: Scalar, b: Scalar, where: str) -> Scalar:
    (n1, d1), (n2, d2) = parts(a, where), parts(b, where)
    return ratio(n1 * d2 + n2 * d1, d1 * d2)


def minus(a: Scalar, b: Scalar, where: str) -> Scalar:
    n, d = parts(b, where)
    return plus(a, ratio(-n, d), where)


def times(a: Scalar, b: Scalar, where: str) -> Scalar:
    (n1, d1), (n2, d2) = parts(a, where), parts(b, where)
    return ratio(n1 * n2, d1 * d2)


def divided(a: Scalar, b: Scalar, where: str) -> Scalar:
    """True division: by a number, or by a dim ``a`` is a constant multiple of."""
    (n1, d1), (n2, d2) = parts(a, where), parts(b, where)
    if isinstance(n2, int):
        if n2 == 0:
            raise UnsupportedOpError(f"a symbolic value {a} is divided by zero", location=where)
        return ratio(n1 * d2 * (1 if n2 > 0 else -1), d1 * abs(n2))
    r = require(exact_ratio(n1, n2), f"{a} / {b}", where) * Fraction(d2, d1)
    return r.numerator if r.denominator == 1 else float(r)


def _binary(fn: Callable[[Scalar, Scalar, str], Scalar]) -> Callable[[list[Scalar], _Site], Scalar]:
    return lambda vals, site: fn(vals[0], vals[1], site.where)


def _div(vals: list[Scalar], site: _Site) -> Scalar:
    if site.out_dtype.is_int:
        return _trunc_div(vals[0], vals[1], site.where)
    return divided(vals[0], vals[1], site.where)


def _trunc_div(a: Scalar, b: Scalar, where: str) -> Dim:
    """Integer division truncating toward zero (ONNX Div on integers): floor division once the
    signs are known."""
    if b == 0:
        return 0  # CIR's integer division by zero
    num, den = parts(a, where)[0], parts(b, where)[0]
    (a_lo, a_hi), (b_lo, b_hi) = dim_bounds(num), dim_bounds(den)
    if b_hi is not None and b_hi < 0:
        return -_trunc_div(num, -den, where)
    if b_lo is not None and b_lo > 0:
        if a_lo is not None and a_lo >= 0:
            return quotient(num, den)
        if a_hi is not None and a_hi <= 0:
            return -quotient(-num, den)
    raise SymbolicValueRequired(f"the sign of {a} / {b}", where)


def _mod(vals: list[Scalar], site: _Site) -> Scalar:
    a, b = (parts(v, site.where) for v in vals)
    if a[1] != 1 or b[1] != 1:
        raise UnsupportedOpError(f"the remainder {vals[0]} % {vals[1]} of fractions of symbolic dims",
                                 location=site.where)
    num, den = a[0], b[0]
    if den == 0:
        return 0  # CIR's integer remainder by zero
    (a_lo, a_hi), (b_lo, _) = dim_bounds(num), dim_bounds(den)
    if site.attrs.get("fmod") and not (a_lo is not None and a_lo >= 0 and b_lo is not None and b_lo > 0):
        raise SymbolicValueRequired(f"the sign of fmod({num}, {den})", site.where)
    if isinstance(den, int) and den > 0 and a_lo is not None and a_lo >= 0 and a_hi is not None and a_hi < den:
        return num
    return num % den


def larger(a: Scalar, b: Scalar, where: str) -> Scalar:
    """max(a, b): whichever is provably not smaller, else an opaque dim."""
    return _extreme(a, b, True, where)


def smaller(a: Scalar, b: Scalar, where: str) -> Scalar:
    """min(a, b): whichever is provably not larger, else an opaque dim."""
    return _extreme(a, b, False, where)


def _extreme(a: Scalar, b: Scalar, is_max: bool, where: str) -> Scalar:
    lo, hi = _difference(a, b, where)
    if lo is not None and lo >= 0:
        return a if is_max else b
    if hi is not None and hi <= 0:
        return b if is_max else a
    if isinstance(a, (SymFrac, float)) or isinstance(b, (SymFrac, float)):
        raise SymbolicValueRequired(f"{'max' if is_max else 'min'}({a}, {b})", where)
    return sym_max(a, b) if is_max else sym_min(a, b)


def _neg(vals: list[Scalar], site: _Site) -> Scalar:
    return minus(0, vals[0], site.where)


def _abs(vals: list[Scalar], site: _Site) -> Scalar:
    lo, hi = bounds_of(vals[0], site.where)
    if lo is not None and lo >= 0:
        return vals[0]
    if hi is not None and hi <= 0:
        return _neg(vals, site)
    raise SymbolicValueRequired(f"the sign of {vals[0]}", site.where)


def floor_of(v: Scalar, where: str) -> Dim:
    n, d = parts(v, where)
    return n if d == 1 else n // d


def ceil_of(v: Scalar, where: str) -> Dim:
    n, d = parts(v, where)
    return n if d == 1 else (n + (d - 1)) // d


def trunc_of(v: Scalar, where: str) -> Dim:
    """To an integer (ONNX Cast): a dim stays; a fraction rounds toward zero, which is its floor
    when it is known non-negative."""
    if parts(v, where)[1] == 1:
        return floor_of(v, where)
    lo, hi = bounds_of(v, where)
    if lo is not None and lo >= 0:
        return floor_of(v, where)
    if hi is not None and hi <= 0:
        return ceil_of(v, where)
    raise SymbolicValueRequired(f"the sign of {v}", where)


def _round(vals: list[Scalar], site: _Site) -> Scalar:
    """Round half to even: exact halves exist only for even denominators, whose parity is unknown."""
    n, d = parts(vals[0], site.where)
    if d == 1:
        return n
    if d % 2 == 0:
        raise SymbolicValueRequired(f"rounding {vals[0]} (a tie is possible)", site.where)
    return (2 * n + d) // (2 * d)


def _cast(vals: list[Scalar], site: _Site) -> Scalar:
    v, to = vals[0], site.attrs["to"]
    if to is DType.bool:
        lo, hi = bounds_of(v, site.where)
        return require(True if (lo is not None and lo > 0) or (hi is not None and hi < 0) else None,
                       f"whether {v} is zero", site.where)
    if to.is_int:
        return trunc_of(v, site.where)
    return v


def _comparison(answers: tuple[bool, bool, bool]) -> Callable[[list[Scalar], _Site], Scalar]:
    """A comparison of ``a`` with ``b``: ``answers`` for ``a - b`` below, at and above zero; decided
    when every sign the bounds of ``a - b`` leave possible gives the same answer."""

    def rule(vals: list[Scalar], site: _Site) -> Scalar:
        lo, hi = _difference(vals[0], vals[1], site.where)
        possible = {answers[k] for k, ok in enumerate((lo is None or lo < 0,
                                                       (lo is None or lo <= 0) and (hi is None or hi >= 0),
                                                       hi is None or hi > 0)) if ok}
        return require(possible.pop() if len(possible) == 1 else None, f"{site.op}({vals[0]}, {vals[1]})",
                       site.where)

    return rule


_COMPARISONS = {"equal": (False, True, False), "not_equal": (True, False, True), "less": (True, False, False),
                "less_equal": (True, True, False), "greater": (False, False, True),
                "greater_equal": (False, True, True)}


def _clip(vals: list[Scalar], site: _Site) -> Scalar:
    v = vals[0]
    lo, hi = site.attrs.get("min"), site.attrs.get("max")
    if lo is not None and math.isfinite(lo):
        v = larger(v, lo, site.where)
    if hi is not None and math.isfinite(hi):
        v = smaller(v, hi, site.where)
    return v


def _floor(vals: list[Scalar], site: _Site) -> Scalar:
    return floor_of(vals[0], site.where)


def _ceil(vals: list[Scalar], site: _Site) -> Scalar:
    return ceil_of(vals[0], site.where)


_RULES: dict[str, Callable[[list[Scalar], _Site], Scalar]] = {
    "add": _binary(plus), "sub": _binary(minus), "mul": _binary(times),
    "div": _div, "mod": _mod, "max": _binary(larger), "min": _binary(smaller), "neg": _neg, "abs": _abs, "clip": _clip,
    "floor": _floor, "ceil": _ceil, "round": _round, "cast": _cast,
    **{op: _comparison(answers) for op, answers in _COMPARISONS.items()},
}


# --------------------------------------------------------------------------------------
# evaluation


def fold_symbolic(op: str, ins: Sequence[np.ndarray], in_dtypes: Sequence[DType], out: TensorType,
                  attrs: Mapping[str, Any], where: str) -> np.ndarray:
    """``op`` on operands of which some hold symbolic dims (object arrays). Ops that compute go
    element by element through the rules above (numbers alone through the op itself); ops that
    only move elements (gather, concat, reshape, slice, where) run their numpy form on the objects."""
    opdef = get_op(op)
    rule = _RULES.get(op)
    if rule is None:
        return _moved(opdef, ins, out, attrs, where)
    shape = np.broadcast_shapes(*(np.shape(a) for a in ins))
    if math.prod(shape) > MAX_FOLD_ELEMENTS:
        raise UnsupportedOpError(f"{op} on {math.prod(shape)} symbolic values is too large to evaluate at import",
                                 location=where)
    columns = [np.broadcast_to(np.asarray(a).astype(object), shape).reshape(-1).tolist() for a in ins]
    site = _Site(op, tuple(in_dtypes), out.dtype, attrs, where)
    result: list[Scalar] = []
    for vals in zip(*columns, strict=True):
        if any(is_symbolic(v) for v in vals):
            result.append(rule(list(vals), site))
        else:
            numbers = [np.asarray(v, dtype=dt.np) for v, dt in zip(vals, in_dtypes, strict=True)]
            result.append(evaluate_op(opdef, numbers, attrs, TensorType(out.dtype, ())).item())
    values = np.empty(len(result), dtype=object)
    values[:] = result
    return settle(values.reshape(shape), out.dtype)


def settle(values: np.ndarray, dtype: DType) -> np.ndarray:
    """An object array back in ``dtype`` once no element is symbolic."""
    if any(is_symbolic(v) for v in values.reshape(-1)):
        return values
    return values.astype(dtype.np)


def _moved(opdef: OpDef, ins: Sequence[np.ndarray], out: TensorType, attrs: Mapping[str, Any],
           where: str) -> np.ndarray:
    op = opdef.name
    if opdef.numpy is None:
        raise UnsupportedOpError(f"cannot evaluate {op} on symbolic shape values", location=where)
    try:
        return settle(np.asarray(opdef.numpy(list(ins), out, **attrs)), out.dtype)
    except (TypeError, ValueError, AttributeError, ArithmeticError) as e:
        raise UnsupportedOpError(f"cannot evaluate {op} on symbolic shape values ({type(e).__name__}: {e})",
                                 location=where, hint="the value depends on symbolic dims in a way Cuvil "
                                                      "does not fold; give the inputs static shapes") from None
