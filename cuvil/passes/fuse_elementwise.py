"""Elementwise fusion: chains of elementwise ops become one ``fused`` op, and elementwise
epilogues (bias add, residual add, activation) join the matmul / conv they follow.

A fused op's meaning is the composition of its body's rules, so fusion performs the very
same scalar operations on the very same elements: it is exact. A value is only pulled into
a fused body when its single user is in that body too; a value with other users (or that
is a function result) stays materialized, so nothing is computed twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import contraction_ops, epilogue_fusible_ops, get_op
from cuvil.ir.region import Region
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass, PassResult, register
from cuvil.passes.rewrite import rebuild, use_counts

EPILOGUE_ANCHORS = tuple(sorted(contraction_ops()))
"""Ops an epilogue follows: the contractions (:attr:`cuvil.ir.opdef.OpDef.contraction`)."""
EPILOGUE_OPS = tuple(sorted(epilogue_fusible_ops()))
"""Elementwise ops an epilogue may hold (:attr:`cuvil.ir.opdef.OpDef.epilogue_fusible`): bias and
residual adds, scales, activations, and the cast / round / clip of an integer product's requantization."""


QUANT_ELEMENTWISE = ("quantize_linear", "dequantize_linear")
"""Quantization ops that are elementwise in ``x`` when their scale and zero point are per tensor or per axis
(no blocks): a QDQ model's residual path (dequantize, add, quantize) fuses into one pass."""


def is_elementwise(v: Value) -> bool:
    if v.is_param or v.is_const:
        return False
    if v.op in QUANT_ELEMENTWISE:
        return not v.attr("block_size")
    return get_op(v.op).family == "elementwise"


@dataclass
class _Group:
    """Values computed inside one fused op: ``members`` in topological order, ``root`` last."""

    kind: str
    members: list[Value] = field(default_factory=list)

    @property
    def root(self) -> Value:
        return self.members[-1]

    def externals(self) -> list[Value]:
        inside = set(self.members)
        seen: dict[Value, None] = {}
        for v in self.members:
            for o in v.operands:
                if o not in inside:
                    seen.setdefault(o, None)
        return list(seen)

    def label(self) -> str:
        return "+".join(v.op for v in self.members)


@register
@dataclass(frozen=True)
class FuseElementwise(Pass):
    name = "fuse-elementwise"
    contract = Contract.EXACT
    description = "fuse elementwise chains, and elementwise epilogues into the preceding matmul / conv"

    epilogues: bool = True
    chains: bool = True
    anchors: tuple[str, ...] = EPILOGUE_ANCHORS
    epilogue_ops: tuple[str, ...] = EPILOGUE_OPS

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        notes: list[str] = []
        fns = tuple(self._fuse(fn, b, notes) for fn in module.functions)
        if not notes:
            return PassResult(module, False)
        return PassResult(module.replace(functions=fns, constants=b.constants), True, tuple(notes))

    # -- partition ----------------------------------------------------------------
    def _groups(self, fn: Function) -> list[_Group]:
        values = fn.values()
        uses = use_counts(fn)
        users = fn.users()
        results = set(fn.results)
        claimed: set[Value] = set()
        groups: list[_Group] = []

        def sole_user(v: Value) -> Value | None:
            if uses[v] != 1 or v in results:
                return None
            return users[v][0]

        if self.epilogues:
            for v in values:
                if v.op not in self.anchors or v in claimed:
                    continue
                chain = [v]
                nxt = sole_user(v)
                while nxt is not None and nxt.op in self.epilogue_ops and nxt.type.shape == v.type.shape \
                        and nxt not in claimed:
                    chain.append(nxt)
                    nxt = sole_user(nxt)
                if len(chain) < 2:
                    continue
                group = _Group("epilogue", chain)
                if all(e.is_const for e in group.externals()):
                    continue
                claimed.update(chain)
                groups.append(group)

        if self.chains:
            parent: dict[Value, Value] = {}
            for v in values:
                if not is_elementwise(v) or v in claimed:
                    continue
                user = sole_user(v)
                if user is not None and is_elementwise(user) and user not in claimed:
                    parent[v] = user
            members: dict[Value, list[Value]] = defaultdict(list)
            for v in values:
                if not is_elementwise(v) or v in claimed:
                    continue
                root = v
                while root in parent:
                    root = parent[root]
                members[root].append(v)
            for chain in members.values():
                group = _Group("elementwise", chain)
                if len(chain) < 2 or all(e.is_const for e in group.externals()):
                    continue
                groups.append(group)
        return groups

    # -- rebuild ------------------------------------------------------------------
    def _fuse(self, fn: Function, b: Builder, notes: list[str]) -> Function:
        groups = self._groups(fn)
        if not groups:
            return fn
        by_root = {g.root: g for g in groups}
        inner = {v for g in groups for v in g.members[:-1]}
        mapping: dict[Value, Value] = {}
        for v in fn.values():
            if v in inner:
                continue
            if v.is_param or v.is_const:
                mapping[v] = v
            elif v in by_root:
                mapping[v] = self._fused(by_root[v], mapping, b)
                notes.append(f"{by_root[v].kind}: {by_root[v].label()}")
            else:
                mapping[v] = rebuild(v, tuple(mapping[o] for o in v.operands), b)
        return Function(fn.name, fn.params, tuple(mapping[r] for r in fn.results), fn.result_names, fn.constraints)

    @staticmethod
    def _fused(group: _Group, mapping: dict[Value, Value], b: Builder) -> Value:
        externals = group.externals()
        args = [Region.arg(k, e.type) for k, e in enumerate(externals)]
        local: dict[Value, Value] = dict(zip(externals, args, strict=True))
        for v in group.members:
            local[v] = b.op(v.op, *(local[o] for o in v.operands), **v.attr_dict)
        body = Region(tuple(args), local[group.root])
        return b.op("fused", *(mapping[e] for e in externals), body=body, kind=group.kind)
