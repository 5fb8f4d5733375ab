"""Symbolic dimensions: integer polynomials over named symbols.

A dim is an ``int`` or a :class:`Sym`. ``Sym`` keeps a canonical form (a sum of
integer-weighted monomials; ``//``, ``%``, ``max`` and ``min`` that do not
simplify become opaque atoms), so two dims are equal exactly when their
canonical forms are, and shape rules can be written with ordinary ``+ - * //``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Union

from cuvil.errors import UnsupportedOpError

Dim = Union[int, "Sym"]


class SymbolicDimError(UnsupportedOpError, TypeError):
    """A symbolic dim used where only a number will do (``int(N)``): still the TypeError Python
    code expects, and a coded error naming the node when a model's converter meets it."""

    code = "CUVIL-DYNAMIC-INPUT"
    default_hint = "the value depends on the run-time size of a symbolic dim; give the inputs concrete sizes"


class _Atom:
    """A non-polynomial sub-expression kept opaque: ``a // c``, ``a % c``, ``max(a, b)``."""

    __slots__ = ("_text", "args", "kind")

    def __init__(self, kind: str, args: tuple[Dim, ...]) -> None:
        self.kind = kind
        self.args = args
        if kind in ("max", "min"):
            self._text = f"{kind}({', '.join(str(a) for a in args)})"
        else:
            op = "//" if kind == "floordiv" else "%"
            self._text = f"({args[0]}){op}{_paren(args[1])}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Atom) and self._text == other._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __str__(self) -> str:
        return self._text

    def evaluate(self, env: Mapping[str, int]) -> int:
        vals = [evaluate_dim(a, env) for a in self.args]
        if self.kind == "floordiv":
            return vals[0] // vals[1]
        if self.kind == "mod":
            return vals[0] % vals[1]
        return max(vals) if self.kind == "max" else min(vals)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for a in self.args:
            out |= free_symbols(a)
        return out


def _paren(d: Dim) -> str:
    s = str(d)
    return s if isinstance(d, int) or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s) else f"({s})"


_Factor = str | _Atom
_Mono = tuple[_Factor, ...]


def _mono_key(m: _Mono) -> tuple[str, ...]:
    return tuple(str(f) for f in m)


class Sym:
    """An integer-valued symbolic expression in canonical polynomial form."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: Mapping[_Mono, int]) -> None:
        clean = {m: c for m, c in terms.items() if c != 0}
        self.terms: tuple[tuple[_Mono, int], ...] = tuple(
            sorted(clean.items(), key=lambda mc: (len(mc[0]), _mono_key(mc[0])))
        )
        self._hash = hash(tuple((_mono_key(m), c) for m, c in self.terms))

    # construction -----------------------------------------------------------
    @staticmethod
    def symbol(name: str) -> Sym:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"invalid symbol name {name!r}")
        return Sym({(name,): 1})

    @staticmethod
    def lift(d: Dim) -> Sym:
        if isinstance(d, Sym):
            return d
        return Sym({(): int(d)})

    def simplify(self) -> Dim:
        """Return an ``int`` when the expression is constant."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return self

    @property
    def constant(self) -> int:
        for m, c in self.terms:
            if m == ():
                return c
        return 0

    # arithmetic -------------------------------------------------------------
    def __add__(self, other: Dim) -> Dim:
        o = Sym.lift(other)
        acc = dict(self.terms)
        for m, c in o.terms:
            acc[m] = acc.get(m, 0) + c
        return Sym(acc).simplify()

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return Sym({m: -c for m, c in self.terms}).simplify()

    def __sub__(self, other: Dim) -> Dim:
        return self + (-Sym.lift(other))

    def __rsub__(self, other: Dim) -> Dim:
        return Sym.lift(other) + (-self)

    def __mul__(self, other: Dim) -> Dim:
        o = Sym.lift(other)
        acc: dict[_Mono, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.terms:
                m = tuple(sorted(m1 + m2, key=str))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Sym(acc).simplify()

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        if isinstance(other, int) or (isinstance(other, Sym) and isinstance(other.simplify(), int)):
            c = int(other.simplify()) if isinstance(other, Sym) else other
            if c == 1:
                return self
            if c != 0 and all(coef % c == 0 for _, coef in self.terms):
                return Sym({m: coef // c for m, coef in self.terms}).simplify()
        elif self == other:
            return 1
        else:
            exact = _divide_by_monomial(self, other)
            if exact is not None:
                return exact
        return Sym({(_Atom("floordiv", (self, other)),): 1})

    def __rfloordiv__(self, other: Dim) -> Dim:
        return Sym({(_Atom("floordiv", (other, self)),): 1})

    def __mod__(self, other: Dim) -> Dim:
        if isinstance(other, int) and other != 0:
            if all(coef % other == 0 for m, coef in self.terms if m != ()):
                return self.constant % other
        elif self == other:
            return 0
        return Sym({(_Atom("mod", (self, other)),): 1})

    def __rmod__(self, other: Dim) -> Dim:
        return Sym({(_Atom("mod", (other, self)),): 1})

    # comparison -------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return False  # a canonical Sym is never a plain constant
        return isinstance(other, Sym) and self._hash == other._hash and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        return True

    def __index__(self) -> int:
        raise SymbolicDimError(f"symbolic dim {self} has no concrete value here")

    # inspection -------------------------------------------------------------
    def symbols(self) -> set[str]:
        out: set[str] = set()
        for m, _ in self.terms:
            for f in m:
                out |= {f} if isinstance(f, str) else f.symbols()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            v = c
            for f in m:
                if isinstance(f, str):
                    if f not in env:
                        raise KeyError(f)
                    v *= int(env[f])
                else:
                    v *= f.evaluate(env)
            total += v
        return total

    def __str__(self) -> str:
        parts: list[str] = []
        for m, c in reversed(self.terms):  # highest degree first
            body = "*".join(str(f) for f in m)
            if not body:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            elif c == -1:
                parts.append("-" + body)
            else:
                parts.append(f"{c}*{body}")
        if not parts:  # the zero polynomial (a lifted 0)
            return "0"
        text = parts[0]
        for p in parts[1:]:
            text += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
        return text

    def __repr__(self) -> str:
        return f"Sym({self})"


def _divide_by_monomial(num: Sym, den: Sym) -> Dim | None:
    """``num // den`` when ``den`` is one monomial dividing every term of ``num`` exactly."""
    if len(den.terms) != 1:
        return None
    dmono, dcoef = den.terms[0]
    out: dict[_Mono, int] = {}
    for mono, coef in num.terms:
        rest = list(mono)
        for f in dmono:
            if f not in rest:
                return None
            rest.remove(f)
        if coef % dcoef:
            return None
        out[tuple(rest)] = out.get(tuple(rest), 0) + coef // dcoef
    return Sym(out).simplify()


def sym(name: str) -> Sym:
    return Sym.symbol(name)


def sym_max(a: Dim, b: Dim) -> Dim:
    return _extreme("max", max, a, b)


def sym_min(a: Dim, b: Dim) -> Dim:
    return _extreme("min", min, a, b)


def _extreme(kind: str, pick: Callable[[int, int], int], a: Dim, b: Dim) -> Dim:
    """max or min of two dims: computed when both are numbers, ``a`` when they are equal, else opaque."""
    if isinstance(a, int) and isinstance(b, int):
        return pick(a, b)
    if a == b:
        return a
    return Sym({(_Atom(kind, (a, b)),): 1})


# bounds and ratios -------------------------------------------------------------
Bound = tuple[int | None, int | None]
"""An interval ``(lo, hi)`` of integers; ``None`` is unbounded on that side."""


MAX_RESIDUE_CASES = 256


def dim_bounds(d: Dim, symbol_min: int = 1) -> Bound:
    """An interval holding every value ``d`` takes when each symbol is at least ``symbol_min``
    (a dim constraint's default lower bound is 1). It is what a shape computation on dims may
    decide at import time: ``N - 1 >= 0`` holds, ``N == 1`` is left open.

    Intervals forget that ``W // 2`` and ``W % 4`` move with ``W``; where the plain interval leaves
    a side open, each symbol under a ``//`` or ``%`` by constants is split by its residue modulo
    their lcm (``W = 4*q + r`` for r in 0..3), which turns those atoms into polynomials, so
    ``W - W % 4 >= 0`` and ``W // 2 <= W`` are decided too."""
    declared = _DECLARED.get()
    lo, hi = _interval(d, symbol_min if declared is None else lambda s: declared.get(s, (symbol_min, None)))
    if (lo is None or hi is None) and isinstance(d, Sym):
        return _residue_bounds(d, symbol_min, (lo, hi))
    return lo, hi


_DECLARED: contextvars.ContextVar[Mapping[str, tuple[int, int]] | None] = contextvars.ContextVar(
    "declared_dim_ranges", default=None)


@contextlib.contextmanager
def declared_ranges(ranges: Mapping[str, tuple[int, int]] | None) -> Iterator[None]:
    """Within the block, :func:`dim_bounds` takes each symbol in ``ranges`` to lie in its ``(lo, hi)``:
    what an import may decide for a shape class declared that way (the function it builds then
    carries those ranges as constraints, so no shape outside them reaches code that relied on it)."""
    token = _DECLARED.set(dict(ranges) if ranges else None)
    try:
        yield
    finally:
        _DECLARED.reset(token)


def dim_range(d: Dim, ranges: Mapping[str, tuple[int, int]]) -> Bound:
    """An interval holding every value ``d`` takes when each symbol ``s`` lies in ``ranges[s]`` (each
    at least 0): what a shape-class library sizes its buffers by (a symbol not in ``ranges`` is
    unbounded above)."""
    return _interval(d, lambda s: ranges.get(s, (0, None)))


SymbolRange = Callable[[str], Bound]


def _interval(d: Dim, symbol_min: int | SymbolRange) -> Bound:
    if isinstance(d, int):
        return d, d
    lo: int | None = 0
    hi: int | None = 0
    for mono, coef in d.terms:
        m_lo, m_hi = _product_bounds([_factor_bounds(f, symbol_min) for f in mono])
        t_lo, t_hi = (_scale(m_lo, coef), _scale(m_hi, coef)) if coef > 0 else (_scale(m_hi, coef),
                                                                                  _scale(m_lo, coef))
        lo = None if lo is None or t_lo is None else lo + t_lo
        hi = None if hi is None or t_hi is None else hi + t_hi
    return lo, hi


def _scale(v: int | None, coef: int) -> int | None:
    return None if v is None else v * coef


def _factor_bounds(f: _Factor, symbol_min: int | SymbolRange) -> Bound:
    if isinstance(f, str):
        return symbol_min(f) if callable(symbol_min) else (symbol_min, None)
    bounds = [_interval(a, symbol_min) for a in f.args]
    if f.kind in ("max", "min"):
        return _extreme_bounds(f.kind, bounds)
    divisor = f.args[1]
    if not isinstance(divisor, int):
        return _quotient_bounds(f.kind, bounds[0], bounds[1])
    if divisor <= 0:
        return None, None
    if f.kind == "mod":  # Python's % with a positive divisor lies in [0, divisor)
        return 0, divisor - 1
    lo, hi = bounds[0]
    return (None if lo is None else lo // divisor), (None if hi is None else hi // divisor)


def _quotient_bounds(kind: str, a: Bound, b: Bound) -> Bound:
    """``a // b`` or ``a % b`` over intervals, for a divisor known to be positive (else unbounded):
    floored division grows with ``a`` and, for a fixed sign of ``a``, moves monotonically with ``b``,
    so its extremes lie at the corners."""
    (a_lo, a_hi), (b_lo, b_hi) = a, b
    if b_lo is None or b_lo < 1:
        return None, None
    if kind == "mod":
        return 0, None if b_hi is None else b_hi - 1
    if a_lo is not None and a_hi is not None and b_hi is not None:
        corners = [x // y for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
        return min(corners), max(corners)
    if a_lo is not None and a_lo >= 0:
        return (0 if b_hi is None else a_lo // b_hi), (None if a_hi is None else a_hi // b_lo)
    return None, None


def _extreme_bounds(kind: str, bounds: list[Bound]) -> Bound:
    """max(a, b) is at least each known lower bound and at most the larger upper bound (min mirrors it)."""
    los, his = [b[0] for b in bounds], [b[1] for b in bounds]
    known_lo, known_hi = [v for v in los if v is not None], [v for v in his if v is not None]
    if kind == "max":
        return (max(known_lo) if known_lo else None), (max(known_hi) if len(known_hi) == len(his) else None)
    return (min(known_lo) if len(known_lo) == len(los) else None), (min(known_hi) if known_hi else None)


def _product_bounds(factors: list[Bound]) -> Bound:
    """Bounds of a product of factors: interval multiplication (a factor that may be negative and is
    unbounded on a side leaves the product unbounded; the monomials of shapes rarely are)."""
    lo: int | None = 1
    hi: int | None = 1
    for f_lo, f_hi in factors:
        if lo is not None and hi is not None and f_lo is not None and f_hi is not None:
            corners = (lo * f_lo, lo * f_hi, hi * f_lo, hi * f_hi)
            lo, hi = min(corners), max(corners)
        elif lo is not None and lo >= 0 and f_lo is not None and f_lo >= 0:  # both non-negative
            lo, hi = lo * f_lo, (None if hi is None or f_hi is None else hi * f_hi)
        else:
            return None, None
    return lo, hi


def _residue_bounds(d: Sym, symbol_min: int, plain: Bound) -> Bound:
    """The union over residue cases of the interval of ``d`` with ``S = L*(q - symbol_min) + r`` for
    each split symbol ``S`` (``q >= symbol_min`` then stands for exactly the values
    ``S >= symbol_min`` with that residue; the first multiple is skipped where it would fall
    below), met with the plain interval."""
    moduli = _split_moduli(d)
    cases = math.prod(moduli.values())
    if not moduli or cases > MAX_RESIDUE_CASES:
        return plain
    taken = d.symbols()
    fresh = {name: _unused(f"{name}_q", taken) for name in moduli}
    los: list[int | None] = []
    his: list[int | None] = []
    for case in range(cases):
        env: dict[str, Dim] = {}
        for name, modulus in moduli.items():
            case, r = divmod(case, modulus)
            skip = max(0, -((r - symbol_min) // modulus))  # the first multiple keeping S >= symbol_min
            env[name] = modulus * (Sym.symbol(fresh[name]) - symbol_min + skip) + r
        c_lo, c_hi = _interval(substitute(d, env), symbol_min)
        los.append(c_lo)
        his.append(c_hi)
    lo = None if None in los else min(v for v in los if v is not None)
    hi = None if None in his else max(v for v in his if v is not None)
    return (plain[0] if lo is None else lo if plain[0] is None else max(lo, plain[0]),
            plain[1] if hi is None else hi if plain[1] is None else min(hi, plain[1]))


def _unused(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _split_moduli(d: Dim) -> dict[str, int]:
    """Each symbol under a ``//`` or ``%`` by a positive constant, with the lcm of those constants."""
    out: dict[str, int] = {}
    for atom in _atoms(d):
        divisor = atom.args[1] if atom.kind in ("floordiv", "mod") else None
        if isinstance(divisor, int) and divisor > 0:
            for name in free_symbols(atom.args[0]):
                out[name] = math.lcm(out.get(name, 1), divisor)
    return out


def _atoms(d: Dim) -> list[_Atom]:
    """Every opaque sub-expression of ``d``, nested ones included."""
    if isinstance(d, int):
        return []
    found: list[_Atom] = []
    for mono, _ in d.terms:
        for f in mono:
            if isinstance(f, _Atom):
                found.append(f)
                for a in f.args:
                    found += _atoms(a)
    return found


def substitute(d: Dim, env: Mapping[str, Dim]) -> Dim:
    """``d`` with the symbols in ``env`` replaced by dims, re-simplified; a ``//`` by a constant
    that divides every non-constant coefficient splits exactly (``(4*q + 1) // 2`` is ``2*q``)."""
    if isinstance(d, int):
        return d
    total: Dim = 0
    for mono, coef in d.terms:
        term: Dim = coef
        for f in mono:
            term = term * (env.get(f, Sym.symbol(f)) if isinstance(f, str) else _substitute_atom(f, env))
        total = total + term
    return total


def _substitute_atom(atom: _Atom, env: Mapping[str, Dim]) -> Dim:
    a, b = (substitute(x, env) for x in atom.args)
    if atom.kind == "max":
        return sym_max(a, b)
    if atom.kind == "min":
        return sym_min(a, b)
    if atom.kind == "mod":
        return a % b if isinstance(a, int) and isinstance(b, int) else Sym.lift(a) % b
    if isinstance(b, int) and b > 0 and isinstance(a, Sym):
        rest = a - a.constant
        if isinstance(rest, Sym) and all(c % b == 0 for _, c in rest.terms):
            return rest // b + a.constant // b
    return a // b if isinstance(a, int) and isinstance(b, int) else Sym.lift(a) // b


def exact_ratio(a: Dim, b: Dim) -> Fraction | None:
    """The constant ``r`` with ``a == r * b`` for every value of the symbols, when there is one
    (``2*N`` to ``N`` is 2, ``N`` to ``4*N`` is 1/4; ``N`` to ``M`` has none)."""
    if isinstance(a, int) and isinstance(b, int):
        return Fraction(a, b) if b else None
    ta, tb = dict(Sym.lift(a).terms), dict(Sym.lift(b).terms)
    if not tb or ta.keys() != tb.keys():
        return None
    ratios = {Fraction(ta[m], tb[m]) for m in tb}
    return ratios.pop() if len(ratios) == 1 else None


def quotient(num: Dim, den: Dim) -> Dim:
    """``num // den`` with the symbols and the coefficient gcd common to ``den`` (one monomial) and
    every term of ``num`` cancelled first: floor(k*a / (k*b)) is floor(a / b) for k > 0, and
    symbols are positive, so ``(3*N*W) // (6*N)`` reads ``W // 2``."""
    if isinstance(num, int) and isinstance(den, int):
        return num // den
    d = Sym.lift(den)
    if len(d.terms) != 1 or d.terms[0][1] <= 0:
        return Sym.lift(num) // den
    for f in d.terms[0][0]:
        n = Sym.lift(num)
        if isinstance(f, str) and all(f in m for m, _ in n.terms):
            num, den = n // Sym.symbol(f), Sym.lift(den) // Sym.symbol(f)
    dcoef = Sym.lift(den).terms[0][1]
    g = math.gcd(dcoef, *(c for _, c in Sym.lift(num).terms))
    if g > 1:
        num, den = Sym.lift(num) // g, Sym.lift(den) // g
    return num // den


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def free_symbols(d: Dim) -> set[str]:
    return d.symbols() if isinstance(d, Sym) else set()


def evaluate_dim(d: Dim, env: Mapping[str, int]) -> int:
    return d.evaluate(env) if isinstance(d, Sym) else int(d)


def normalize_dim(d: object) -> Dim:
    """Accept ints (incl. numpy ints), Syms and symbol names."""
    if isinstance(d, Sym):
        return d.simplify()
    if isinstance(d, str):
        return parse_dim(d)
    return int(d)  # type: ignore[call-overload]


# parsing --------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),]))")


def parse_dim(text: str) -> Dim:
    """Parse the printed form of a dim (``N``, ``2*N + 1``, ``(H - 3)//2 + 1``)."""
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"bad dim expression {text!r} at {pos}")
        tokens.append(m.group(m.lastindex or 0))
        pos = m.end()
    p = _DimParser(tokens, text)
    val = p.expr()
    if p.i != len(tokens):
        raise ValueError(f"trailing tokens in dim expression {text!r}")
    return val


class _DimParser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.t = tokens
        self.i = 0
        self.text = text

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError(f"unexpected end of dim expression {self.text!r}")
        self.i += 1
        return tok

    def expr(self) -> Dim:
        v = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            r = self.term()
            v = v + r if op == "+" else v - r
        return v

    def term(self) -> Dim:
        v = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            r = self.unary()
            if op == "*":
                v = v * r
            elif op == "//":
                v = Sym.lift(v) // r if not isinstance(v, int) or not isinstance(r, int) else v // r
            else:
                v = Sym.lift(v) % r if not isinstance(v, int) or not isinstance(r, int) else v % r
            v = v.simplify() if isinstance(v, Sym) else v
        return v

    def unary(self) -> Dim:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.atom()

    def atom(self) -> Dim:
        tok = self.take()
        if tok == "(":
            v = self.expr()
            if self.take() != ")":
                raise ValueError(f"expected ')' in {self.text!r}")
            return v
        if tok.isdigit():
            return int(tok)
        if tok in ("max", "min") and self.peek() == "(":
            self.take()
            a = self.expr()
            if self.take() != ",":
                raise ValueError(f"expected ',' in {self.text!r}")
            b = self.expr()
            if self.take() != ")":
                raise ValueError(f"expected ')' in {self.text!r}")
            return sym_max(a, b) if tok == "max" else sym_min(a, b)
        return Sym.symbol(tok)
