"""The shape class of a library compiled once for every size its symbolic dims may take.

A function with symbolic dims is compiled either per specialization (the dims substituted, static
code) or for its *shape class*: every kernel reads the dims' values at run time (:mod:`.dims`) and
the arena is planned for the largest size each dim may take (its *maximum*: the constraint's upper
bound, or one the user gives). At run time the checked entry point solves each symbol from the
input dim that is exactly that symbol (its *source*), checks it against the constraint and the
maximum, checks every other dim against the value its formula gives, and only then runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuvil.errors import CodegenError
from cuvil.ir.module import Function
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.types import DimConstraint


def plain_symbol(d: Dim) -> str | None:
    """The symbol's name when ``d`` is one symbol alone (``N``, not ``2*N`` or ``N+1``)."""
    if isinstance(d, Sym) and len(d.terms) == 1:
        mono, coef = d.terms[0]
        if coef == 1 and len(mono) == 1 and isinstance(mono[0], str):
            return mono[0]
    return None


@dataclass(frozen=True)
class ShapeClass:
    """What a shape-class library takes at run time: ``symbols`` (the order of the ``dims`` array),
    each symbol's constraint and maximum, and its source ``(input index, axis)``."""

    symbols: tuple[str, ...]
    constraints: tuple[DimConstraint, ...]
    maxima: dict[str, int]
    sources: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, fn: Function, given: Mapping[str, int] | None = None) -> ShapeClass:
        """The shape class of ``fn``: maxima from ``given``, else from the constraints. A symbol without
        a maximum, or that no input dim gives alone, is refused (the arena is sized for the maxima; the
        checked entry point reads each symbol from its source)."""
        given = dict(given or {})
        symbols = tuple(fn.symbols())
        inner = sorted({s for v in fn.values() for s in v.type.symbols()} - set(symbols))
        if inner:
            raise CodegenError(f"dims {inner} are decided inside the function (by data, not by an input shape)",
                               location=fn.name, hint="compile at concrete shapes (--specialize NAME=2x3x...)")
        unknown = sorted(set(given) - set(symbols))
        if unknown:
            raise CodegenError(f"--dim-max names {unknown}, which are not symbolic dims of @{fn.name}",
                               location=fn.name, hint="its symbolic dims: " + (", ".join(symbols) or "none"))
        by_symbol = {c.symbol: c for c in fn.constraints}
        constraints, maxima, sources = [], {}, []
        for s in symbols:
            c = by_symbol.get(s, DimConstraint(s))
            hi = given.get(s, c.hi)
            if hi is None:
                raise CodegenError(f"symbolic dim {s} has no largest size", location=fn.name,
                                   hint=f"give it (--dim-max {s}=512, or dim_max={{'{s}': 512}}): the library's "
                                        "working memory is sized for the largest size of every dim; or compile "
                                        "for concrete shapes (--specialize INPUT=2x3x...)")
            if isinstance(hi, bool) or not isinstance(hi, int) or hi < max(c.lo, 0):
                raise CodegenError(f"the largest size of {s} must be an integer >= {max(c.lo, 0)}, got {hi!r}",
                                   location=fn.name)
            if c.hi is not None and hi > c.hi:
                raise CodegenError(f"the largest size {hi} of {s} exceeds its constraint {c}", location=fn.name)
            constraints.append(c)
            maxima[s] = int(hi)
            sources.append(_source(fn, s))
        return cls(symbols, tuple(constraints), maxima, tuple(sources))

    def bound(self, symbol: str) -> tuple[int, int, int]:
        """``(lo, hi, multiple_of)`` a value of ``symbol`` must satisfy at run time."""
        c = self.constraints[self.symbols.index(symbol)]
        return max(c.lo, 0), self.maxima[symbol], c.multiple_of

    def admits(self, env: Mapping[str, int]) -> str | None:
        """Why ``env`` is outside the class (None when it is inside)."""
        for s in self.symbols:
            lo, hi, mult = self.bound(s)
            v = env[s]
            if not lo <= v <= hi or v % mult:
                rule = f"{lo} <= {s} <= {hi}" + (f", {s} % {mult} == 0" if mult != 1 else "")
                return f"dim {s}={v} is outside the library's shape class ({rule})"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"symbols": list(self.symbols),
                "constraints": [{"symbol": c.symbol, "lo": c.lo, "hi": c.hi, "multiple_of": c.multiple_of}
                                for c in self.constraints],
                "maxima": dict(self.maxima), "sources": [list(s) for s in self.sources]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapeClass:
        return cls(tuple(str(s) for s in data["symbols"]),
                   tuple(DimConstraint(str(c["symbol"]), int(c["lo"]), None if c["hi"] is None else int(c["hi"]),
                                       int(c["multiple_of"])) for c in data["constraints"]),
                   {str(k): int(v) for k, v in data["maxima"].items()},
                   tuple((int(i), int(a)) for i, a in data["sources"]))


def _source(fn: Function, symbol: str) -> tuple[int, int]:
    for i, p in enumerate(fn.params):
        for axis, d in enumerate(p.type.shape):
            if plain_symbol(d) == symbol:
                return i, axis
    raise CodegenError(f"no input dim is {symbol} alone, so a run cannot read its value from the input shapes",
                       location=fn.name, hint="compile at concrete shapes (--specialize NAME=2x3x...)")


def check_shape_class_json(data: Any, inputs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a manifest's ``shape_class`` entry is not one this version writes (None when it is)."""
    try:
        sc = ShapeClass.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return "is not {symbols, constraints, maxima, sources}"
    if len(set(sc.symbols)) != len(sc.symbols) or set(sc.maxima) != set(sc.symbols) \
            or len(sc.constraints) != len(sc.symbols) or len(sc.sources) != len(sc.symbols):
        return "lists its symbols inconsistently"
    for s, c, (i, axis) in zip(sc.symbols, sc.constraints, sc.sources, strict=True):
        if c.symbol != s or c.multiple_of < 1 or sc.maxima[s] < 0 or (c.hi is not None and sc.maxima[s] > c.hi):
            return f"gives symbol {s} an inconsistent constraint or maximum"
        shape = inputs[i]["shape"] if 0 <= i < len(inputs) else None
        if not isinstance(shape, list) or not 0 <= axis < len(shape) or shape[axis] != s:
            return f"names a source of {s} that is not an input dim"
    return None
