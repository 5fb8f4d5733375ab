"""Common-subexpression elimination. Hash-consing already shares structurally equal values;
this pass adds the one fact IEEE arithmetic allows beyond that: commutative ops are
reordered by structural hash, so ``a + b`` and ``b + a`` become one value. Not a float ``min`` or
``max``: their ties keep an operand's sign of zero (:meth:`cuvil.ir.opdef.OpDef.commutes`)."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.builder import Builder
from cuvil.ir.hashing import structural_hash
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, FunctionPass, register
from cuvil.passes.rewrite import rebuild


@register
@dataclass(frozen=True)
class CommonSubexpressionElimination(FunctionPass):
    name = "cse"
    contract = Contract.EXACT
    description = "merge equal computations, including commutative ops with swapped operands"

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        mapping: dict[Value, Value] = {}
        for v in fn.values():
            if v.is_param or v.is_const:
                mapping[v] = v
                continue
            ops = tuple(mapping[o] for o in v.operands)
            if len(ops) == 2 and ops[0].type == ops[1].type and get_op(v.op).commutes(ops[0].dtype):
                ops = tuple(sorted(ops, key=structural_hash))
            mapping[v] = rebuild(v, ops, b)
        return Function(fn.name, fn.params, tuple(mapping[r] for r in fn.results), fn.result_names,
                        fn.constraints)
