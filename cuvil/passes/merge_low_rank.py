"""Low-rank merging: ``x·Wᵀ + s·(x·Aᵀ)·Bᵀ`` becomes ``x·(W + s·B·A)ᵀ`` when ``W``, ``A``, ``B`` and
``s`` are constants (a LoRA adapter applied beside its base weight), and a per-output scale after a
constant-weight matmul (DoRA's magnitude over the weight's row norms) moves into the weight.

The merged weights are constant expressions over the old constants, so the verifier proves the
rewrite over the reals (matrix products reassociate, hence ``real``) and ``fold-constants``
materializes them afterwards. Embedding lookups (``embedding``, ``gather`` on axis 0) merge the
same way: ``T[ids] + s·(Aᵀ[ids])·Bᵀ`` becomes ``(T + s·Aᵀ·Bᵀ)[ids]``, and convolutions too:
``conv(x, W) + s·conv(conv(x, A), B)`` with ``A`` on the base's strides and padding and a 1x1 ``B``
becomes ``conv(x, W + s·B·A)`` (``B·A`` contracting the rank, undilated and ungrouped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuvil.ir.builder import Builder
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, register
from cuvil.passes.fold_batchnorm import is_constant_expr
from cuvil.passes.rewrite import Match, Pat, Replacement, RewritePass, Rule, RuleSet, any_, match, op


def _matrix(v: Value) -> bool:
    return v.type.rank == 2 and v.dtype.is_float and is_constant_expr(v)


def _scalar(v: Value) -> bool:
    return all(d == 1 for d in v.type.shape) and v.dtype.is_float and is_constant_expr(v)


def _as_scalar(b: Builder, s: Value) -> Value:
    return s if s.type.rank == 0 else b.reshape(s, shape=())


_LINEAR_UPDATE = op("matmul", op("matmul", any_("x"), any_("a", _matrix), transpose_a=False, transpose_b=True),
                    any_("b", _matrix), transpose_a=False, transpose_b=True)


_CONV_UPDATE = op("conv", op("conv", any_("x"), any_("a"), capture="inner"), any_("b"), capture="outer")


def _lookup_update(lookup: str) -> Pat:
    attrs: dict[str, Any] = {"axis": 0} if lookup == "gather" else {}
    return op("matmul", op(lookup, any_("a", _matrix), any_("ids"), **attrs), any_("b", _matrix),
              transpose_a=False, transpose_b=True)


def _scaled_update(low: Value, update: Pat, caps: dict[str, Value]) -> Value | None:
    """The scalar ``s`` when ``low`` is ``update * s`` or ``s * update`` (``caps`` pre-binds the
    operand the update must share with the base op, and receives ``a`` and ``b``)."""
    for k in range(2):
        trial = dict(caps)
        if _scalar(low.operands[1 - k]) and match(update, low.operands[k], trial):
            caps.update(trial)
            return low.operands[1 - k]
    return None


def _merge_linear(m: Match, b: Builder) -> Value | None:
    base = m["base"]
    w = base.operands[1]
    caps = {"x": base.operands[0]}
    s = _scaled_update(m["low"], _LINEAR_UPDATE, caps)
    if s is None or base.attr("transpose_a") or not _matrix(w):
        return None
    if base.attr("transpose_b"):  # W is [out, in]: W + s·B·A
        update = b.matmul(caps["b"], caps["a"])
    else:  # W is stored [in, out] (fan_in_fan_out): W + s·Aᵀ·Bᵀ
        update = b.matmul(caps["a"], caps["b"], transpose_a=True, transpose_b=True)
    if update.type.shape != w.type.shape:
        return None
    merged = b.add(w, b.mul(update, _as_scalar(b, s)))
    return b.matmul(base.operands[0], merged, transpose_b=bool(base.attr("transpose_b")))


def _plain(v: Value) -> bool:
    return v.attr("groups") == 1 and all(d == 1 for d in v.attr("dilations"))


def _merge_conv(m: Match, b: Builder) -> Value | None:
    base = m["base"]
    x, w = base.operands
    caps = {"x": x}
    s = _scaled_update(m["low"], _CONV_UPDATE, caps)
    if s is None or not is_constant_expr(w) or not _plain(base):
        return None
    inner, outer = caps["inner"], caps["outer"]
    a, lb = caps["a"], caps["b"]
    k = w.type.rank - 2
    if (not (_plain(inner) and _plain(outer)) or inner.attr("strides") != base.attr("strides")
            or inner.attr("pads") != base.attr("pads") or tuple(outer.attr("strides")) != (1,) * k
            or any(outer.attr("pads")) or tuple(lb.type.shape[2:]) != (1,) * k or a.type.rank != w.type.rank
            or not (is_constant_expr(a) and is_constant_expr(lb))):
        return None
    o, r = (int(d) for d in lb.type.shape[:2])
    shape = tuple(int(d) for d in w.type.shape)
    flat_a = b.reshape(a, shape=(r, math.prod(shape[1:])))
    update = b.reshape(b.matmul(b.reshape(lb, shape=(o, r)), flat_a), shape=shape)
    merged = b.add(w, b.mul(update, _as_scalar(b, s)))
    return b.conv(x, merged, **base.attr_dict)


def _merge_lookup(lookup: str) -> Replacement:
    update_pat = _lookup_update(lookup)

    def replace(m: Match, b: Builder) -> Value | None:
        base = m["base"]
        table = base.operands[0]
        caps = {"ids": base.operands[1]}
        s = _scaled_update(m["low"], update_pat, caps)
        if s is None or not _matrix(table):
            return None
        update = b.matmul(caps["a"], caps["b"], transpose_b=True)  # Aᵀ [vocab, r] · Bᵀ [r, dim]
        if update.type.shape != table.type.shape:
            return None
        return b.op(lookup, b.add(table, b.mul(update, _as_scalar(b, s))), base.operands[1], **base.attr_dict)

    return replace


def _column_scale(m: Match, b: Builder) -> Value | None:
    """``matmul(x, W) * c`` with ``c`` one factor per output column, ``W`` constant: ``matmul(x, W·c)``."""
    mm, c = m["mm"], m["c"]
    w = mm.operands[1]
    out = mm.type.shape[-1]
    if (mm.attr("transpose_a") or not _matrix(w) or m.ctx.uses(mm) != 1 or not is_constant_expr(c)
            or c.type.rank != 1 or c.type.shape[0] != out or c.dtype is not mm.dtype):
        return None
    factor = b.reshape(c, shape=(int(out), 1)) if mm.attr("transpose_b") else c
    return b.matmul(mm.operands[0], b.mul(w, factor), transpose_b=bool(mm.attr("transpose_b")))


def _both_orders(name: str, kind: str, left: Pat, right: Pat, replace: Replacement, doc: str) -> list[Rule]:
    return [Rule(name, op(kind, left, right), replace, doc), Rule(f"{name}-rhs", op(kind, right, left), replace, doc)]


_LOW = Pat("mul", capture="low")
RULES = RuleSet(tuple(
    _both_orders("merge-low-rank-linear", "add", op("matmul", any_(), any_(), capture="base"), _LOW, _merge_linear,
                 "x·Wᵀ + s·(x·Aᵀ)·Bᵀ -> x·(W + s·B·A)ᵀ")
    + _both_orders("merge-low-rank-conv", "add", op("conv", any_(), any_(), capture="base"), _LOW, _merge_conv,
                   "conv(x, W) + s·conv(conv(x, A), B) -> conv(x, W + s·B·A)")
    + [r for lookup in ("embedding", "gather")
       for r in _both_orders(f"merge-low-rank-{lookup}", "add", op(lookup, any_(), any_(), capture="base"), _LOW,
                             _merge_lookup(lookup), "T[ids] + s·Aᵀ[ids]·Bᵀ -> (T + s·Aᵀ·Bᵀ)[ids]")]
    + _both_orders("fold-column-scale", "mul", op("matmul", any_(), any_(), capture="mm"), any_("c"),
                   _column_scale, "matmul(x, W) * c -> matmul(x, W * c), c one factor per output column")))


@register
@dataclass(frozen=True)
class MergeLowRank(RewritePass):
    name = "merge-low-rank"
    contract = Contract.REAL
    description = "merge constant low-rank updates (LoRA, DoRA) into the weight they add to"

    def rules(self) -> RuleSet:
        return RULES
