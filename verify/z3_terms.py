"""Typed views of z3 terms and model values.

z3's Python API is untyped: ``If``, ``simplify``, ``substitute``, ``Extract`` and model lookups
come back as the union of every kind of term, and a numeral's value needs the method of its
own class. The encoders know the sort of each term from how they built it; these functions
state it, so each call site reads as what it means and the checker follows the rest.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TypeVar, cast

import z3

T = TypeVar("T", bound=z3.ExprRef)


def boolean(t: object) -> z3.BoolRef:
    """``t``, built as a formula (a comparison, a connective, an ``If`` of formulas)."""
    return cast(z3.BoolRef, t)


def bitvec(t: object) -> z3.BitVecRef:
    """``t``, built as a bit-vector term."""
    return cast(z3.BitVecRef, t)


def arith(t: object) -> z3.ArithRef:
    """``t``, built as an integer or real term."""
    return cast(z3.ArithRef, t)


def ite(c: z3.BoolRef, a: T, b: T) -> T:
    """``z3.If(c, a, b)``, of the sort of its branches."""
    return cast(T, z3.If(c, a, b))


def int_value(t: z3.ExprRef) -> int:
    """The value of an integer numeral (the caller has checked ``z3.is_int_value``)."""
    return cast(z3.IntNumRef, t).as_long()


def bv_value(t: z3.ExprRef, signed: bool = False) -> int:
    """The value of a bit-vector numeral (the caller has checked ``z3.is_bv_value``)."""
    num = cast(z3.BitVecNumRef, t)
    return num.as_signed_long() if signed else num.as_long()


def fraction(t: z3.ExprRef) -> Fraction:
    """The value of a rational numeral (the caller has checked ``z3.is_rational_value``)."""
    num = cast(z3.RatNumRef, t)
    return Fraction(num.numerator_as_long(), num.denominator_as_long())


def real_value(t: z3.ExprRef) -> float | None:
    """A real numeral of a model (rational, or algebraic approximated to 20 digits) as a float;
    None for any other term."""
    if z3.is_rational_value(t):
        return float(fraction(t))
    if z3.is_algebraic_value(t):
        return float(cast(z3.AlgebraicNumRef, t).approx(20).as_fraction())
    return None


def constant_value(model: z3.ModelRef, decl: z3.FuncDeclRef) -> z3.ExprRef:
    """The model's value of a constant (a declaration without arguments)."""
    return cast(z3.ExprRef, model[decl])
