"""Compute rules as readable text, for ``cuvil ops NAME`` and error messages.

A rule prints as ``out[i0, i1] = <expr>`` in infix notation with the usual precedence:
operands by name (``x[i0, (i1 - 1)]``), ``a ?? v`` for a load that reads ``v`` out of bounds,
``c ? a : b`` for select, ``f16(x)`` for a cast, ``bitcast<i32>(x)`` for a bit reinterpretation,
``sum[r0 < 3, r1 < 4](body)`` for a reduction, ``index(e)`` for an index used as a value and
``dyn(e)`` for a value used as an index.
Subexpressions the rule shares are printed once, as ``t0 = ...`` lines before the result
(unless they depend on a reduction's variable), so a rule that reuses a value (expm1, softmax's
max) stays as short as its definition; reduction variables are numbered from ``r0`` in the order
they appear.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cuvil.ir.rules import Call, Expr, IndexValue, Ix, Lit, Load, Reduce

_INFIX = {"add": ("+", 9), "sub": ("-", 9), "mul": ("*", 10), "div": ("/", 10),
          "eq": ("==", 4), "ne": ("!=", 4), "lt": ("<", 4), "le": ("<=", 4), "gt": (">", 4), "ge": (">=", 4),
          "or": ("or", 1), "xor": ("xor", 2), "and": ("and", 3),
          "bit_or": ("|", 5), "bit_xor": ("^", 6), "bit_and": ("&", 7), "shl": ("<<", 8), "shr": (">>", 8)}
_PREFIX = {"neg": "-", "not": "not ", "bit_not": "~"}
_IX_INFIX = {"add": ("+", 9), "sub": ("-", 9), "mul": ("*", 10), "floordiv": ("//", 10), "mod": ("%", 10)}
_SELECT, _UNARY, _ATOM = 0, 11, 12


def children(e: Expr | Ix) -> Iterator[Expr | Ix]:
    """The direct subexpressions of a rule node (index expressions included)."""
    if isinstance(e, Call):
        yield from e.args
    elif isinstance(e, Load):
        yield from e.index
    elif isinstance(e, IndexValue):
        yield e.ix
    elif isinstance(e, Reduce):
        yield e.body
    elif isinstance(e, Ix) and e.kind not in ("var", "lit"):
        yield from (a for a in e.args if isinstance(a, (Expr, Ix)))


def nodes(e: Expr) -> Iterator[Expr | Ix]:
    """Every node of a rule once (rules are DAGs: a shared node is not repeated)."""
    seen: set[int] = set()
    stack: list[Expr | Ix] = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        stack.extend(children(x))


class _Printer:
    def __init__(self, root: Expr, operands: Sequence[str]) -> None:
        self.operands = operands
        self.names: dict[int, str] = {}
        self.rvars: dict[str, str] = {}
        self.lets: list[str] = []
        counts: dict[int, int] = {}
        for x in nodes(root):
            for c in children(x):
                counts[id(c)] = counts.get(id(c), 0) + 1
        self.shared = {k for k, n in counts.items() if n > 1}
        self._free: dict[int, frozenset[str]] = {}
        self.bound = frozenset(n for x in nodes(root) if isinstance(x, Reduce) for n, _ in x.axes)

    def free(self, e: Expr | Ix) -> frozenset[str]:
        """The index variables ``e`` reads that no reduction inside it binds."""
        found = self._free.get(id(e))
        if found is None:
            if isinstance(e, Ix) and e.kind == "var":
                found = frozenset({e.args[0]})
            else:
                found = frozenset().union(*(self.free(c) for c in children(e)))
                if isinstance(e, Reduce):
                    found -= {n for n, _ in e.axes}
            self._free[id(e)] = found
        return found

    def expr(self, e: Expr) -> tuple[str, int]:
        """The text of ``e`` and its precedence (higher binds tighter)."""
        if id(e) in self.names:
            return self.names[id(e)], _ATOM
        text, prec = self._expr(e)
        if id(e) in self.shared and isinstance(e, (Call, Reduce)) and not self.free(e) & self.bound:
            name = f"t{len(self.lets)}"
            self.lets.append(f"{name} = {text}")
            self.names[id(e)] = name
            return name, _ATOM
        return text, prec

    def wrap(self, e: Expr, above: int, right: bool = False) -> str:
        text, prec = self.expr(e)
        return f"({text})" if prec < above or (right and prec == above) else text

    def _expr(self, e: Expr) -> tuple[str, int]:
        if isinstance(e, Lit):
            v = e.value
            return (str(v).lower() if isinstance(v, bool) else repr(v)), _ATOM
        if isinstance(e, Load):
            name = self.operands[e.operand] if e.operand < len(self.operands) else f"in{e.operand}"
            text = f"{name}[{', '.join(self.ix(i) for i in e.index)}]"
            return (f"{text} ?? {e.oob!r}", _SELECT) if e.oob is not None else (text, _ATOM)
        if isinstance(e, IndexValue):
            return (self.ix(e.ix) if e.ix.is_lit else f"index({self.ix(e.ix)})"), _ATOM
        if isinstance(e, Reduce):
            for n, _ in e.axes:
                self.rvars.setdefault(n, f"r{len(self.rvars)}")
            axes = ", ".join(f"{self.rvars[n]} < {d}" for n, d in e.axes)
            return f"{e.kind}[{axes}]({self.expr(e.body)[0]})", _ATOM
        assert isinstance(e, Call)
        if e.fn in _INFIX:
            sym, prec = _INFIX[e.fn]
            return f"{self.wrap(e.args[0], prec)} {sym} {self.wrap(e.args[1], prec, right=True)}", prec
        if e.fn in _PREFIX:
            return f"{_PREFIX[e.fn]}{self.wrap(e.args[0], _UNARY)}", _UNARY
        if e.fn == "select":
            c, a, b = e.args
            return f"{self.wrap(c, _SELECT + 1)} ? {self.wrap(a, _SELECT + 1)} : {self.wrap(b, _SELECT)}", _SELECT
        if e.fn == "cast":
            return f"{e.dtype}({self.expr(e.args[0])[0]})", _ATOM
        if e.fn == "bitcast":
            return f"bitcast<{e.dtype}>({self.expr(e.args[0])[0]})", _ATOM
        args = ", ".join(self.expr(a)[0] for a in e.args)
        return f"{e.fn}({args})", _ATOM

    def ix(self, ix: Ix) -> str:
        return self._ix(ix)[0]

    def _ix(self, ix: Ix) -> tuple[str, int]:
        if ix.kind == "var":
            return self.rvars.get(ix.args[0], str(ix.args[0])), _ATOM
        if ix.kind == "lit":
            return str(ix.args[0]), _ATOM
        if ix.kind == "dyn":
            return f"dyn({self.expr(ix.args[0])[0]})", _ATOM
        if ix.kind in _IX_INFIX:
            sym, prec = _IX_INFIX[ix.kind]
            (lt, lp), (rt, rp) = self._ix(ix.args[0]), self._ix(ix.args[1])
            left = f"({lt})" if lp < prec else lt
            right = f"({rt})" if rp <= prec else rt
            return f"{left} {sym} {right}", prec
        return f"{ix.kind}({self.ix(ix.args[0])}, {self.ix(ix.args[1])})", _ATOM


def rule_text(rule: Expr, operands: Sequence[str] = (), rank: int = 0) -> str:
    """``rule`` as ``out[i0, ...] = expr`` (after its shared subexpressions, one ``tN = ...`` line
    each); ``operands`` names the loads (default ``in0``, ``in1``, ...), ``rank`` is the output's."""
    p = _Printer(rule, operands)
    body = p.expr(rule)[0]
    out = f"out[{', '.join(f'i{k}' for k in range(rank))}]" if rank else "out"
    return "\n".join([*p.lets, f"{out} = {body}"])
