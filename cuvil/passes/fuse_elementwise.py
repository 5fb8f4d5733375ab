"""Elementwise fusion: chains of elementwise ops become one ``fused`` op, and elementwise
epilogues (bias add, residual add, activation) join the matmul / conv they follow.

A fused op's meaning is the composition of its body's rules, so fusion performs the very
same scalar operations on the very same elements: it is exact. A value is only pulled into
a fused body when every user it has is in that body too (a GELU or SiLU written out, where
the activation's operand is read twice, fuses whole); a value with a user elsewhere (or that
is a function result) stays materialized, so nothing is computed twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import contraction_ops, epilogue_fusible_ops, get_op
from cuvil.ir.region import Region
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass, PassResult, register
from cuvil.passes.rewrite import rebuild

EPILOGUE_ANCHORS = tuple(sorted(contraction_ops()))
"""Ops an epilogue follows: the contractions (:attr:`cuvil.ir.opdef.OpDef.contraction`)."""
EPILOGUE_OPS = tuple(sorted(epilogue_fusible_ops()))
"""Elementwise ops an epilogue may hold (:attr:`cuvil.ir.opdef.OpDef.epilogue_fusible`): bias and
residual adds, scales, activations, and the cast / round / clip of an integer product's requantization."""


QUANT_ELEMENTWISE = ("quantize_linear", "dequantize_linear")
"""Quantization ops that are elementwise in ``x`` when their scale and zero point are per tensor or per axis
(no blocks): a QDQ model's residual path (dequantize, add, quantize) fuses into one pass."""


INLINED_PATHS_MAX = 8
"""How many times a value may be read inside one fused body (counting the paths to the body's result): a
kernel lowers the body as one expression tree, in which a value read along several paths appears once per
path (the lowering computes it once, but builds and keys every copy), so a stack of diamonds would double
the tree at each level."""

EPILOGUE_NODES_MAX = 256
"""The largest expression tree an epilogue's body may inline into its matmul / conv kernel."""


def is_elementwise(v: Value) -> bool:
    if v.is_param or v.is_const:
        return False
    if v.op in QUANT_ELEMENTWISE:
        return not v.attr("block_size")
    return get_op(v.op).family == "elementwise"


def _freshest(anchor: Value, position: dict[Value, int]) -> int:
    """The program position of the last computed of ``anchor``'s non-constant operands (-1: none).

    Anchors claim epilogues in decreasing order of it: an epilogue op reading two anchors' results (a
    residual block's add of its last convolution and its downsampling one) joins the anchor whose input was
    computed last, so the other runs first, while the input it shares with the block's first convolution is
    still in cache, rather than last, after the block's other convolutions have evicted it."""
    return max((position[o] for o in anchor.operands if not o.is_const), default=-1)


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
        users = fn.users()
        results = set(fn.results)
        claimed: set[Value] = set()
        groups: list[_Group] = []

        if self.epilogues:
            position = {v: k for k, v in enumerate(values)}
            for v in sorted((v for v in values if v.op in self.anchors), key=lambda v: -_freshest(v, position)):
                if v in claimed:
                    continue
                chain = self._epilogue(v, users, results, claimed, position)
                if len(chain) < 2:
                    continue
                group = _Group("epilogue", chain)
                if all(e.is_const for e in group.externals()):
                    continue
                claimed.update(chain)
                groups.append(group)

        if self.chains:
            root_of = self._chain_roots(values, users, results, claimed)
            members: dict[Value, list[Value]] = defaultdict(list)
            for v in values:
                if v in root_of:
                    members[root_of[v]].append(v)
            for chain in members.values():
                group = _Group("elementwise", chain)
                if len(chain) < 2 or all(e.is_const for e in group.externals()):
                    continue
                groups.append(group)
        return groups

    def _epilogue(self, anchor: Value, users: dict[Value, list[Value]], results: set[Value],
                  claimed: set[Value], position: dict[Value, int]) -> list[Value]:
        """The longest epilogue of ``anchor``: members added in program order, each the first value that reads
        one of them, while that is an epilogue op of the anchor's shape; kept up to the last member such that
        every member before it has no reader outside (an empty list: none). Taking the first reader each time
        keeps the body acyclic: a value outside that depended on a member would read one, earlier still."""
        chain, inside = [anchor], {anchor}
        nodes = {anchor: 1}
        best: list[Value] = []
        while True:
            outside = {u for m in chain for u in users.get(m, ()) if u not in inside}
            if all(m is chain[-1] or not any(u not in inside for u in users.get(m, ())) for m in chain):
                best = list(chain)
            if chain[-1] in results or not outside:
                return best
            nxt = min(outside, key=position.__getitem__)
            if nxt.op not in self.epilogue_ops or nxt.type.shape != anchor.type.shape or nxt in claimed:
                return best  # (no member is a result: the chain stops at the first one)
            nodes[nxt] = 1 + sum(nodes.get(o, 1) for o in nxt.operands)
            if nodes[nxt] > EPILOGUE_NODES_MAX:
                return best
            chain.append(nxt)
            inside.add(nxt)

    @staticmethod
    def _chain_roots(values: Sequence[Value], users: dict[Value, list[Value]], results: set[Value],
                     claimed: set[Value]) -> dict[Value, Value]:
        """Each unclaimed elementwise value's group, named by its root: a value joins the group of its readers
        when they are all elementwise, unclaimed and in one group, and it is read there at most
        :data:`INLINED_PATHS_MAX` times; otherwise (or as a function result) it is a root. In reverse program
        order, so a value's readers are placed before it is."""
        root_of: dict[Value, Value] = {}
        paths: dict[Value, int] = {}
        for v in reversed(values):
            if not is_elementwise(v) or v in claimed:
                continue
            root_of[v], paths[v] = v, 1
            readers = users.get(v, [])
            if v in results or not readers or any(u not in root_of for u in readers):
                continue
            roots = {root_of[u] for u in readers}
            count = sum(paths[u] for u in readers)
            if len(roots) == 1 and count <= INLINED_PATHS_MAX:
                root_of[v], paths[v] = roots.pop(), count
        return root_of

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
