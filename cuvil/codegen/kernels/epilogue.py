"""What a tuned kernel computes, read from the op's own rules: the contraction (matmul / conv)
and the elementwise epilogue applied to each of its results.

The epilogue is the fused body's rule with the contraction left un-inlined: its loads of the
contraction become loads of a marker operand (index ``len(operands)``), which the kernel
binds to the accumulator. That expression is then emitted by the generic rule lowering
(:class:`cuvil.codegen.lower_rule.RuleKernel`), so an activation's meaning is never written a
second time here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from cuvil.codegen.dims import DimValues
from cuvil.codegen.lower_rule import Buffer, RuleKernel, _Keys
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.inline import value_rule
from cuvil.ir.opdef import contraction_ops
from cuvil.ir.rulewalk import walk_exprs
from cuvil.ir.values import Value


@dataclass(frozen=True)
class Contraction:
    """The matmul / conv inside an op (the op itself, or the anchor of a fused epilogue)."""

    op: str
    attrs: dict[str, Any]
    lhs: int  # operand positions in the kernel op
    rhs: int
    lhs_type: Any
    rhs_type: Any
    out_type: Any  # the contraction's own result type
    epilogue: R.Expr  # over the op's output index; the marker operand is the accumulator
    marker: int


def accumulator_dtype(dt: DType) -> DType:
    """What a kernel hands the epilogue: float sums as float32 (halves are widened), integer sums in their type."""
    return DType.f32 if dt.is_float else dt


class _NotElementwise(Exception):
    pass


def is_identity_index(index: Sequence[R.Ix]) -> bool:
    """Whether a load's index is the output's own ``(i0, i1, ...)`` (an element of the same place)."""
    return all(ix.kind == "var" and ix.args[0] == f"i{k}" for k, ix in enumerate(index))


def at_own_place(e: R.Load, operand_shape: Sequence[object], out_shape: Sequence[object]) -> bool:
    """Whether load ``e`` reads an operand of the output's shape at the output element's own place (the identity
    index): its element's flat index is then the output element's, in whatever layout the two share."""
    return e.oob is None and tuple(operand_shape) == tuple(out_shape) and len(e.index) == len(out_shape) \
        and is_identity_index(e.index)


def reads_operand(e: R.Expr, operand: int) -> bool:
    """Whether the expression loads operand ``operand`` (then a kernel must keep its raw data)."""
    return any(isinstance(x, R.Load) and x.operand == operand for x in walk_exprs(e))


def packed_rhs_unused(c: Contraction) -> frozenset[int]:
    """The operands a kernel that packed the rhs at compile time never reads: the raw rhs, unless the
    epilogue reads it too (or it is also the lhs)."""
    if reads_operand(c.epilogue, c.rhs) or c.rhs == c.lhs:
        return frozenset()
    return frozenset([c.rhs])


def contraction_of(v: Value) -> Contraction | None:
    """The contraction ``v`` computes and its epilogue, or None when ``v`` is not of that form."""
    n = len(v.operands)
    marker = n
    out_ix = tuple(R.Ix.var(f"i{k}") for k in range(v.type.rank))
    anchors = contraction_ops()
    if v.op in anchors:
        acc = R.Load(accumulator_dtype(v.dtype), marker, out_ix, None)
        return Contraction(v.op, dict(v.attr_dict), 0, 1, v.operands[0].type, v.operands[1].type, v.type, acc,
                           marker)
    if v.op != "fused" or v.attr("kind") != "epilogue":
        return None
    body = v.attr("body")
    found = [u for u in body.ops() if u.op in anchors]
    if len(found) != 1:
        return None
    anchor = found[0]
    if anchor.type.shape != v.type.shape or anchor is body.result:
        return None
    position = {p: k for k, p in enumerate(body.params)}
    if not all(o in position for o in anchor.operands):
        return None
    if any(u.op in anchors for u in body.ops() if u is not anchor):
        return None

    def leaf(u: Value, index: tuple[R.Ix, ...], ld: R.Load) -> R.Expr:
        if u is anchor:
            if not is_identity_index(index) or ld.oob is not None:
                raise _NotElementwise
            return R.Load(accumulator_dtype(anchor.dtype), marker, index, None)
        return R.Load(ld.dtype, position[u], index, ld.oob)

    try:
        expr = value_rule(body.result, out_ix, leaf, inline=lambda u: not u.is_param and u is not anchor)
    except _NotElementwise:
        return None
    if any(isinstance(x, R.Reduce) for x in walk_exprs(expr)):
        return None
    return Contraction(anchor.op, dict(anchor.attr_dict), position[anchor.operands[0]],
                       position[anchor.operands[1]], anchor.operands[0].type, anchor.operands[1].type,
                       anchor.type, expr, marker)


class EpilogueEmitter(RuleKernel):
    """The generic rule lowering, emitting one output element at a time inside a kernel.

    It shares the kernel's builder; loads of the marker operand yield the accumulator value
    given to :meth:`element`. (It does not create a function of its own, so the base
    constructor is not called; the attributes it sets are set here.) With ``dims`` (a kernel
    compiled for a shape class) the buffers' shapes may hold symbolic dims, read from them.
    """

    def __init__(self, fn: ir.Function, alloca_builder: Builder, builder: Builder, rule: R.Expr,
                 inputs: Sequence[Buffer], out: Buffer, op: str, marker: int, err: Val,
                 dims: DimValues | None = None) -> None:
        self.op = op
        self.rule = rule
        self.out_type = None
        self.out_shape = out.shape
        self.fn = fn
        self.inputs = list(inputs)
        self.out = out
        self.alloca_builder = alloca_builder
        self.b = builder
        self.s = ScalarEmitter(builder)
        self.err = err
        self.symbolic = dims is not None
        self.dims = dims
        self.keys = _Keys()
        self.extents = {f"i{k}": n for k, n in enumerate(out.shape)}
        self._collect_extents(rule)
        self.bound = {}
        self.layers = [{}]
        self.marker = marker
        self.scalars = {}  # the kernel's operands are read from their buffers
        self.acc: Val | None = None
        self.env = {f"i{k}": ("o", k) for k in range(len(out.shape))}
        self.flat: Val | None = None  # the output element's flat index, where the kernel gave it

    def in_place(self, e: R.Load) -> bool:
        """Whether ``e`` reads its operand at the output element's own place: the identity index into an
        operand of the output's shape, whose flat index is then the output element's."""
        return e.operand != self.marker and at_own_place(e, self.inputs[e.operand].shape, self.out.shape)

    def _load(self, e: R.Load, env: dict, depth: int) -> Val:
        if e.operand == self.marker:
            assert self.acc is not None
            return self.acc
        if self.flat is not None and self.in_place(e) and all(
                env.get(f"i{k}") == ("o", k) for k in range(len(e.index))):
            # the same element as the rule lowering's, addressed as the store addresses the output: a loop
            # along contiguous outputs then reads the operand contiguously too
            return self._load_at(self.inputs[e.operand], self.flat)
        return super()._load(e, env, depth)

    def element(self, index: Sequence[Val], acc: Val, known: Sequence[tuple[R.Expr, Val]] = (),
                flat: Val | None = None) -> Val:
        """The epilogue's value at output ``index`` (i64 values) when the contraction gave ``acc``; ``known``:
        subexpressions computed already (:meth:`values`), read instead of lowered again; ``flat``: the output
        element's flat index (operands read :meth:`in_place` are then read at it)."""
        return self.values(index, acc, [self.rule], known, flat)[0]

    def values(self, index: Sequence[Val], acc: Val, exprs: Sequence[R.Expr],
               known: Sequence[tuple[R.Expr, Val]] = (), flat: Val | None = None) -> list[Val]:
        """Subexpressions of the epilogue at output ``index`` when the contraction gave ``acc``."""
        with self._layer():
            for k, iv in enumerate(index):
                self.bound[("o", k)] = iv
            self.acc = acc
            self.flat = flat
            self._known([self.keys.key(e, self.env, 0)[0] for e, _ in known], [v for _, v in known])
            out = [self.lower(e, self.env, 0) for e in exprs]
            self.flat = None
            for k in range(len(index)):
                del self.bound[("o", k)]
        return out

    def store(self, flat: Val, value: Val) -> None:
        self._store(self.out, flat, value)
