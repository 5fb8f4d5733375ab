"""unroll-loops: loops with a concrete trip count replaced by their iterations, while the unrolled ops
stay within a budget (longer loops and symbolic counts stay loops). Not in the O-levels: a real loop
compiles in time independent of its length; unrolling trades that for straight-line code."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.module import Module
from cuvil.ir.unroll import unroll_module
from cuvil.passes.base import Contract, Pass, PassResult, register

DEFAULT_MAX_OPS = 4096


@register
@dataclass(frozen=True)
class UnrollLoops(Pass):
    name = "unroll-loops"
    contract = Contract.EXACT
    description = "replace loops with a concrete trip count by their iterations, up to a budget of ops"
    enters_loops = False  # the unrolling reaches nested loops through the bodies it copies

    max_ops: int = DEFAULT_MAX_OPS

    def run(self, module: Module) -> PassResult:
        out = unroll_module(module, self.max_ops, partial=True)
        return PassResult(out, out != module)
