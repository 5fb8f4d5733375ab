"""Layout-op elimination: transposes and reshapes that only move data are folded into the
ops that read them, or cancelled against each other.

Every rule here reads the same elements in the same order as before, so it is exact:
a transpose of the last two axes becomes matmul's ``transpose_a``/``transpose_b``; a
transpose that only moves unit dims is a reshape; reshape and transpose pairs cancel; a
squeeze/unsqueeze-style reshape around an elementwise op moves outward so the pair meets
and cancels. Transposes of constants are left alone: ``fold-constants`` materializes them
in the layout their reader wants, for free at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.builder import Builder
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value, walk
from cuvil.passes import canonicalize
from cuvil.passes.base import Contract, register
from cuvil.passes.rewrite import Match, RewritePass, Rule, RuleSet, any_, op


def _is_constant_expr(v: Value) -> bool:
    return not any(u.is_param for u in walk([v]))


def _swaps_last_two(perm: tuple[int, ...]) -> bool:
    n = len(perm)
    return n >= 2 and tuple(perm[:-2]) == tuple(range(n - 2)) and tuple(perm[-2:]) == (n - 1, n - 2)


def _transpose_into_matmul(side: str):
    def replace(m: Match, b: Builder) -> Value | None:
        mm, t = m.root, m["t"]
        if not _swaps_last_two(tuple(t.attr("perm"))) or _is_constant_expr(t):
            return None
        lhs, rhs = mm.operand("lhs"), mm.operand("rhs")
        attrs = mm.attr_dict
        if side == "lhs":
            lhs, attrs["transpose_a"] = t.operand("x"), not attrs["transpose_a"]
        else:
            rhs, attrs["transpose_b"] = t.operand("x"), not attrs["transpose_b"]
        return b.matmul(lhs, rhs, **attrs)

    return replace


def _non_unit(shape: tuple[Dim, ...]) -> list[int]:
    return [k for k, d in enumerate(shape) if d != 1]


def _transpose_as_reshape(m: Match, b: Builder) -> Value | None:
    """A permutation that keeps the non-unit dims in order moves no element: it is a reshape."""
    perm = tuple(m.root.attr("perm"))
    x = m["x"]
    moved = [p for p in perm if x.type.shape[p] != 1]
    if moved != _non_unit(x.type.shape) or perm == tuple(range(len(perm))):
        return None
    return b.reshape(x, shape=m.root.type.shape)


def _unit_related(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> bool:
    """``a`` and ``b`` differ only by unit dims (a squeeze / unsqueeze)."""
    return [a[k] for k in _non_unit(a)] == [b[k] for k in _non_unit(b)]


def _operand_over(v: Value, inner: tuple[Dim, ...], outer: tuple[Dim, ...], b: Builder) -> Value | None:
    """Re-express an operand broadcast onto ``inner`` as one broadcast onto ``outer`` (unit-related shapes)."""
    if v.op == "reshape" and tuple(v.operand("x").type.shape) == outer and tuple(v.type.shape) == inner:
        return v.operand("x")
    if v.type.rank > len(inner):
        return None
    padded = (1,) * (len(inner) - v.type.rank) + tuple(v.type.shape)
    inner_nu, outer_nu = _non_unit(inner), _non_unit(outer)
    if any(padded[k] != 1 for k in range(len(inner)) if k not in inner_nu):
        return None
    shape: list[Dim] = [1] * len(outer)
    for ki, ko in zip(inner_nu, outer_nu, strict=True):
        shape[ko] = padded[ki]
    if tuple(v.type.shape) == tuple(shape):
        return v
    return b.reshape(v, shape=shape)


def _reshape_around_elementwise(m: Match, b: Builder) -> Value | None:
    """reshape(f(reshape(x), c), shape(x)) -> f(x, c') for squeeze/unsqueeze reshapes and elementwise f."""
    root, e = m.root, m["e"]
    if e.is_param or e.is_const or get_op(e.op).family != "elementwise" or m.ctx.uses(e) != 1:
        return None
    inner, outer = tuple(e.type.shape), tuple(root.type.shape)
    if not _unit_related(inner, outer):
        return None
    undone = [o for o in e.operands
              if o.op == "reshape" and tuple(o.operand("x").type.shape) == outer and tuple(o.type.shape) == inner]
    if not undone:
        return None
    operands: list[Value] = []
    for o in e.operands:
        new = _operand_over(o, inner, outer, b)
        # only cancel: a new reshape is fine on constants (folded), elsewhere it would undo sink-unsqueeze
        if new is None or (new.op == "reshape" and new.operand("x") is o and not _is_constant_expr(o)):
            return None
        operands.append(new)
    out = b.op(e.op, *operands, **e.attr_dict)
    return out if out.type == root.type else None


def _sink_unsqueeze(m: Match, b: Builder) -> Value | None:
    """f(reshape(a), c) -> reshape(f(a, c')) when the reshape only adds unit dims: the elementwise op
    runs at a's shape, and the reshape moves toward the op that needs the extra dims (or cancels)."""
    e = m.root
    if get_op(e.op).family != "elementwise" or _is_constant_expr(e):  # constants fold in any layout
        return None
    outer = tuple(e.type.shape)
    for r in e.operands:
        if r.op != "reshape" or tuple(r.type.shape) != outer:
            continue
        a = r.operand("x")
        inner = tuple(a.type.shape)
        if a.type.rank >= r.type.rank or not _unit_related(inner, outer):
            continue
        operands: list[Value] = []
        for o in e.operands:
            new = a if o is r else _operand_over(o, outer, inner, b)
            if new is None:
                break
            operands.append(new)
        else:
            core = b.op(e.op, *operands, **e.attr_dict)
            if tuple(core.type.shape) == inner and core.dtype is e.dtype:
                return b.reshape(core, shape=outer)
    return None


def _transpose_through_unary(m: Match, b: Builder) -> Value | None:
    """transpose(f(transpose(x, p)), q) -> f(x) when q undoes p and f is a one-operand elementwise op."""
    root, e = m.root, m["e"]
    if e.is_param or e.is_const or get_op(e.op).family != "elementwise" or len(e.operands) != 1 \
            or e.operands[0].op != "transpose" or m.ctx.uses(e) != 1:
        return None
    t = e.operands[0]
    p, q = tuple(t.attr("perm")), tuple(root.attr("perm"))
    if tuple(p[k] for k in q) != tuple(range(len(p))):
        return None
    out = b.op(e.op, t.operand("x"), **e.attr_dict)
    return out if out.type == root.type else None


_CANCELLING = ("double-transpose", "identity-transpose", "reshape-chain", "identity-reshape")

RULES = RuleSet((
    Rule("transpose-into-matmul-lhs", op("matmul", op("transpose", any_(), capture="t"), any_()),
         _transpose_into_matmul("lhs"), "matmul(transpose(a, ..., -1, -2), b) -> matmul(a, b, transpose_a=!ta)"),
    Rule("transpose-into-matmul-rhs", op("matmul", any_(), op("transpose", any_(), capture="t")),
         _transpose_into_matmul("rhs"), "matmul(a, transpose(b, ..., -1, -2)) -> matmul(a, b, transpose_b=!tb)"),
    Rule("transpose-as-reshape", op("transpose", any_("x")), _transpose_as_reshape,
         "a transpose that only moves unit dims -> reshape"),
    Rule("reshape-around-elementwise", op("reshape", any_("e")), _reshape_around_elementwise,
         "reshape(f(reshape(x)), shape(x)) -> f(x) for squeeze/unsqueeze reshapes"),
    Rule("sink-unsqueeze", any_(), _sink_unsqueeze,
         "f(reshape(a) adding unit dims, c) -> reshape(f(a, c')) for elementwise f"),
    Rule("transpose-through-unary", op("transpose", any_("e")), _transpose_through_unary,
         "transpose(f(transpose(x, p)), inverse(p)) -> f(x)"),
)) + RuleSet(tuple(r for r in canonicalize.RULES if r.name in _CANCELLING))


@register
@dataclass(frozen=True)
class EliminateLayoutOps(RewritePass):
    name = "eliminate-layout-ops"
    contract = Contract.EXACT
    description = "fold transposes into matmul flags, cancel reshape/transpose pairs, drop unit-dim reshapes"

    def rules(self) -> RuleSet:
        return RULES
