"""A ``cond`` lowered to a real branch: one function that runs the kernels of the region its
condition chooses, and nothing of the other.

The function is ``i32 name(ptr out_0, ..., ptr out_{R-1}, ptr in_0, ..., ptr work, ptr scratch)``
(``in_0`` the condition; a null ``out`` is a result nothing reads; a trailing ``ptr dims`` in a library
for a shape class). Both regions plan their values
from the start of ``work``: only one runs, so the work area is the larger of the two. This is the
reading of :func:`cuvil.ir.ops.control.branch`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from llvmlite import ir

from cuvil.codegen.abi import OK
from cuvil.codegen.llvm_types import I8, I32
from cuvil.codegen.region_steps import (
    RegionSteps,
    StructuredFunction,
    StructuredGroup,
    copier,
    pointer,
    work_pointer,
)
from cuvil.codegen.sizing import STATIC, Sizing
from cuvil.ir.ops.control import open_regions
from cuvil.ir.values import Value


class CondKernel:
    """The lowered cond of one group."""

    name = "cond"

    def __init__(self, group: StructuredGroup, constants: Mapping[str, np.ndarray], sizing: Sizing = STATIC) -> None:
        self.group = group
        self.sizing = sizing
        # the regions with their constant operands in place (weights packed once, at compile time)
        regions, operands = open_regions(group.first)
        self.operands = tuple(operands)
        self.params = [args for args, _ in regions]
        self.branches = [RegionSteps(results, constants, 0, sizing) for _, results in regions]
        self.results = self.branches[0].results
        self.work_bytes = max(br.end for br in self.branches)
        self.scratch_bytes = max(br.scratch_bytes for br in self.branches)
        self.constant_bytes = sum(br.constant_bytes for br in self.branches)

    @property
    def constants_read(self) -> list[Value]:
        return [c for br in self.branches for c in br.constants_read]

    def emit(self, mod: ir.Module, name: str, constant: Callable[[Value], ir.Value]) -> ir.Function:
        """The cond's function; ``constant`` gives the global holding a constant's data."""
        n_out = len(self.results)
        sf = StructuredFunction.create(mod, name, n_out, len(self.operands), self.sizing)
        fn, outs, ins, work, scratch, b = sf.fn, sf.outs, sf.ins, sf.work, sf.scratch, sf.b
        sizes = [sf.size(self.sizing, r.type) for r in self.results]  # at the entry: they dominate both branches
        blocks = [fn.append_basic_block("then"), fn.append_basic_block("else")]
        pred = b.load(ins[0], typ=I8)
        b.cbranch(b.icmp_unsigned("!=", pred, ir.Constant(I8, 0)), blocks[0], blocks[1])
        for k, (block, branch, params) in enumerate(zip(blocks, self.branches, self.params, strict=True)):
            fns = branch.emit_functions(mod, f"{name}.{'te'[k]}", constant)
            b.position_at_end(block)
            copy = copier(b)
            where: dict[Value, ir.Value] = dict(zip(params, ins[1:], strict=True))
            branch.emit_run(b, fns, where, lambda off: work_pointer(b, work, off), constant, scratch, sf.dims_ptr)
            for j, r in enumerate(branch.results):
                if j in self.group.members:
                    copy(outs[j], pointer(r, where, constant), sizes[j])
            b.ret(ir.Constant(I32, OK))
        return fn
