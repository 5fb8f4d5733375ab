"""Constant folding: every op whose operands are all constants is evaluated by the reference
interpreter and replaced by its value. Passes that derive constants (BN folding,
requantization) emit them as constant expressions; this pass materializes them and records,
per new constant, the expression it came from (``Module.metadata['folded:<hash>']``)."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.interp import evaluate_op
from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import get_op
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass, PassResult, register
from cuvil.passes.rewrite import rebuild


def describe(v: Value, depth: int = 3) -> str:
    """A short printed form of a constant expression, for provenance records."""
    if v.is_const:
        return f"@{v.const_hash}"
    if depth == 0:
        return f"{v.op}(...)"
    attrs = "".join(f" {k}={a}" for k, a in v.attrs)
    return f"{v.op}({', '.join(describe(o, depth - 1) for o in v.operands)}{attrs})"


@register
@dataclass(frozen=True)
class FoldConstants(Pass):
    name = "fold-constants"
    contract = Contract.EXACT
    description = "evaluate ops on constants with the reference interpreter"
    max_elements: int = 1 << 26

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        provenance: dict[str, str] = {}
        fns = tuple(self._fold(fn, b, provenance) for fn in module.functions)
        if not provenance:
            return PassResult(module, False)
        meta = dict(module.metadata)
        meta.update({f"folded:{k}": e for k, e in provenance.items()})
        out = Module(fns, {**module.constants, **b.constants}, meta)
        return PassResult(out, True, tuple(f"@{k} = {e}" for k, e in provenance.items()))

    def _fold(self, fn: Function, b: Builder, provenance: dict[str, str]) -> Function:
        mapping: dict[Value, Value] = {}
        for v in fn.values():
            if v.is_param or v.is_const:
                mapping[v] = v
                continue
            nv = rebuild(v, tuple(mapping[o] for o in v.operands), b)
            if all(o.is_const for o in nv.operands) and nv.type.is_static \
                    and _numel(nv) <= self.max_elements:
                data = evaluate_op(get_op(nv.op), [b.data(o) for o in nv.operands], nv.attr_dict, nv.type)
                folded = b.const(data)
                provenance.setdefault(folded.const_hash, describe(nv))
                nv = folded
            mapping[v] = nv
        return Function(fn.name, fn.params, tuple(mapping[r] for r in fn.results), fn.result_names,
                        fn.constraints)


def _numel(v: Value) -> int:
    n = 1
    for d in v.type.shape:
        n *= int(d)
    return n
