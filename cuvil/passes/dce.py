"""Dead-code elimination. CIR functions are rooted at their results, so unreachable values
are already gone; what remains is dropping constants no function refers to any more."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.module import Module
from cuvil.passes.base import Contract, Pass, PassResult, register


@register
@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    name = "dce"
    contract = Contract.EXACT
    description = "drop values and constants that no result depends on"

    def run(self, module: Module) -> PassResult:
        used = module.used_constants()
        if used == set(module.constants):
            return PassResult(module, False)
        dropped = len(module.constants) - len(used)
        return PassResult(module.replace(functions=module.functions), True, (f"dropped {dropped} constants",))
