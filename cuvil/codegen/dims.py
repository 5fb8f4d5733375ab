"""Symbolic dims in generated code: a kernel of a function compiled for a whole shape class reads the
dims' values from an ``i64`` array (one entry per symbol, in :attr:`DimValues.order`) and computes
each extent, stride and index bound it needs from them, once per kernel call.

A dim is an ``int`` (emitted as a constant) or a :class:`cuvil.ir.symbolic.Sym` polynomial whose
factors are symbols or opaque atoms (``a // c``, ``a % c``, ``max``, ``min``): the emitted arithmetic
is numpy's (floored division and modulo), the semantics :func:`cuvil.ir.symbolic.evaluate_dim` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from cuvil.codegen.llvm_types import I64
from cuvil.codegen.scalar import Builder, Val
from cuvil.errors import CodegenError
from cuvil.ir.symbolic import Dim, Sym


class DimValues:
    """The dims of one kernel call: ``ptr`` to the ``i64`` values of ``order``'s symbols. Values are
    emitted where the builder stands when first asked for (a kernel asks at its entry) and reused."""

    def __init__(self, b: Builder, ptr: Val, order: Sequence[str]) -> None:
        self.b = b
        self.ptr = ptr
        self.order = tuple(order)
        self._memo: dict[object, Val] = {}

    def symbol(self, name: str) -> Val:
        found = self._memo.get(name)
        if found is None:
            if name not in self.order:
                raise CodegenError(f"dim {name} is not one of the function's symbols {list(self.order)}",
                                   hint="a bug in the code generator")
            slot = self.b.gep(self.ptr, [ir.Constant(I64, self.order.index(name))], inbounds=True, source_etype=I64)
            found = self._memo[name] = self.b.load(slot, typ=I64, name=f"dim.{name}")
        return found

    def value(self, d: Dim) -> Val:
        """``d`` as an ``i64`` value."""
        if isinstance(d, int):
            return ir.Constant(I64, d)
        found = self._memo.get(d)
        if found is None:
            found = self._memo[d] = self._poly(d)
        return found

    def _poly(self, d: Sym) -> Val:
        b = self.b
        total: Val | None = None
        for mono, coef in d.terms:
            term: Val = ir.Constant(I64, coef)
            for f in mono:
                fv = self.symbol(f) if isinstance(f, str) else self._atom(f)
                term = fv if isinstance(term, ir.Constant) and term.constant == 1 else b.mul(term, fv)
            total = term if total is None else b.add(total, term)
        return total if total is not None else ir.Constant(I64, 0)

    def _atom(self, atom: object) -> Val:
        kind, args = getattr(atom, "kind"), getattr(atom, "args")  # noqa: B009  (an opaque symbolic atom)
        b = self.b
        vals = [self.value(a) for a in args]
        if kind in ("max", "min"):
            out = vals[0]
            for v in vals[1:]:
                out = b.select(b.icmp_signed(">" if kind == "max" else "<", out, v), out, v)
            return out
        a, c = vals
        if not isinstance(c, ir.Constant):  # a dim divided by a dim: never trap on 0 (the checks refuse it)
            c = b.select(b.icmp_signed("==", c, ir.Constant(I64, 0)), ir.Constant(I64, 1), c)
        q, r = b.sdiv(a, c), b.srem(a, c)
        # floored, as numpy: a remainder of the other sign than the divisor moves the quotient down
        fix = b.and_(b.icmp_signed("!=", r, ir.Constant(I64, 0)),
                     b.xor(b.icmp_signed("<", r, ir.Constant(I64, 0)), b.icmp_signed("<", c, ir.Constant(I64, 0))))
        if kind == "floordiv":
            return b.select(fix, b.sub(q, ir.Constant(I64, 1)), q)
        return b.select(fix, b.add(r, c), r)
