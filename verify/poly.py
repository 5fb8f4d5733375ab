"""Polynomials over opaque real atoms: the normal form of the ``real`` encoder.

Real-valued terms are kept as sums of monomials with rational coefficients over atoms
(loads, transcendental applications, inverses, selects, reduction terms). Two terms equal
as polynomials get one representation, so a rewrite that only reassociates, distributes
or folds scales (batch-norm folding, decompositions) yields the very same z3 term on both
sides, and a reduction can split its body into monomials and pull out the factors that do
not depend on its index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import z3

from verify.z3_terms import arith, fraction

Monomial = tuple[tuple[int, int], ...]  # (atom id, power), sorted by atom id

MAX_TERMS = 256
"""A product whose expansion would exceed this many monomials is kept as one atom."""


class Poly:
    """An immutable polynomial: ``terms`` maps monomials to non-zero rational coefficients."""

    __slots__ = ("_key", "terms")

    def __init__(self, terms: dict[Monomial, Fraction]) -> None:
        self.terms = {m: c for m, c in terms.items() if c != 0}
        self._key: tuple | None = None

    @staticmethod
    def const(c: Fraction | int) -> Poly:
        return Poly({(): Fraction(c)})

    @property
    def key(self) -> tuple:
        if self._key is None:
            self._key = tuple(sorted(self.terms.items()))
        return self._key

    @property
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    @property
    def constant(self) -> Fraction:
        return self.terms.get((), Fraction(0))

    def __add__(self, other: Poly) -> Poly:
        acc = dict(self.terms)
        for m, c in other.terms.items():
            acc[m] = acc.get(m, Fraction(0)) + c
        return Poly(acc)

    def __neg__(self) -> Poly:
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Poly) -> Poly:
        return self + (-other)

    def scale(self, c: Fraction) -> Poly:
        return Poly({m: c * k for m, k in self.terms.items()})

    def __mul__(self, other: Poly) -> Poly:
        acc: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = _mono_mul(m1, m2)
                acc[m] = acc.get(m, Fraction(0)) + c1 * c2
        return Poly(acc)

    def expansion_size(self, other: Poly) -> int:
        return len(self.terms) * len(other.terms)


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    if not a:
        return b
    if not b:
        return a
    acc = dict(a)
    for atom, p in b:
        acc[atom] = acc.get(atom, 0) + p
    return tuple(sorted(acc.items()))


class AtomTable:
    """The atoms polynomials refer to, by z3 AST id (stable within one context). ``order`` gives
    the key monomials and factors are written in (a structural one keeps terms built with
    different variable names in the same order)."""

    def __init__(self, ctx: z3.Context, order: Callable[[z3.ExprRef], Any] | None = None) -> None:
        self.ctx = ctx
        self.order = order or (lambda t: t.get_id())
        self.atoms: dict[int, z3.ArithRef] = {}
        self._terms: dict[tuple, z3.ArithRef] = {}

    def atom(self, t: z3.ArithRef) -> Poly:
        """``t`` as a polynomial: numerals become constants, everything else one atom."""
        if z3.is_rational_value(t):
            return Poly.const(fraction(t))
        self.atoms.setdefault(t.get_id(), t)
        return Poly({((t.get_id(), 1),): Fraction(1)})

    def value(self, c: Fraction) -> z3.ArithRef:
        return z3.RealVal(f"{c.numerator}/{c.denominator}", self.ctx)

    def _mono_key(self, m: Monomial) -> tuple:
        return tuple(sorted((self.order(self.atoms[a]), p) for a, p in m))

    def mono_term(self, m: Monomial) -> z3.ArithRef | None:
        factors: list[z3.ArithRef] = []
        for atom, p in sorted(m, key=lambda ap: self.order(self.atoms[ap[0]])):
            factors.extend([self.atoms[atom]] * p)
        if not factors:
            return None
        out = factors[0]
        for f in factors[1:]:
            out = arith(out * f)
        return out

    def term(self, p: Poly) -> z3.ArithRef:
        """The z3 term of ``p`` in canonical monomial order (equal polynomials, equal terms)."""
        key = p.key
        found = self._terms.get(key)
        if found is not None:
            return found
        parts: list[z3.ArithRef] = []
        for m, c in sorted(key, key=lambda mc: (self._mono_key(mc[0]), mc[1])):
            body = self.mono_term(m)
            if body is None:
                parts.append(self.value(c))
            elif c == 1:
                parts.append(body)
            else:
                parts.append(arith(self.value(c) * body))
        if not parts:
            out = self.value(Fraction(0))
        else:
            out = parts[0]
            for x in parts[1:]:
                out = arith(out + x)
        self._terms[key] = out
        return out

    def product(self, factors: Iterable[Poly]) -> Poly:
        out = Poly.const(1)
        for f in factors:
            if out.expansion_size(f) > MAX_TERMS:
                out = self.atom(self.term(out)) * self.atom(self.term(f))
            else:
                out = out * f
        return out
