"""The generic rule lowering of an op, run in chunks of its outermost loop on the thread pool.

An op without a tuned kernel (a max pool, a transpose, an element-wise join) is lowered from its rule
by :class:`cuvil.codegen.lower_rule.RuleKernel`, one loop per output axis. With two or more threads that
nest ran on one of them while the others waited: ResNet-18's stem max pool took as long on two threads
as on one. Here the same nest is emitted with its outermost loop of more than one step over a range
(``lo``, ``hi``), and the chunks of that loop go to the pool (:meth:`KernelFunction.phase`). Every
output element is still computed by the same code, from the same rule, in the same order of its own
reductions: only which thread writes it changes, so the results are the serial kernel's bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.coalesce import coalesce
from cuvil.codegen.kernels.base import ReadsEveryOperand
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction
from cuvil.codegen.llvm_types import I1, I32, I64
from cuvil.codegen.loops import if_then
from cuvil.codegen.lower_rule import RuleKernel, op_rule, scalar_operands
from cuvil.codegen.scalar import Val
from cuvil.ir import rules as R
from cuvil.ir.rulewalk import walk_exprs
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

MIN_STEPS = 1 << 18
"""Element steps (output elements times the points of their largest reduction) below which the op runs
on the calling thread: under about 40 µs of work, waking the pool costs more than it saves."""

STEP_FLOPS = 8
"""What one element step of a rule nest weighs against a GEMM's flop in the pool's threshold."""

MAX_CHUNKS = 256
"""Chunks per call at most (a larger outer loop is cut into this many ranges)."""


def _steps(rule: R.Expr, out: TensorType) -> int:
    points = [math.prod(int(n) for _, n in e.axes) for e in walk_exprs(rule) if isinstance(e, R.Reduce)]
    return math.prod(int(d) for d in out.shape) * max([1, *points])


@dataclass(frozen=True)
class ChunkedRuleKernel(ReadsEveryOperand):
    """``v``'s rule nest with its outermost loop cut into chunks for the pool (see the module doc)."""

    op: str
    rule: R.Expr
    in_types: tuple[TensorType, ...]
    out_type: TensorType
    steps: int
    scalars: tuple[tuple[int, float | int | bool], ...] = ()

    @property
    def name(self) -> str:
        return "rule"  # the generic lowering, only run in chunks

    @property
    def constant_bytes(self) -> int:
        return 0

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        rule, in_types, out_type = coalesce(self.rule, self.in_types, self.out_type) or \
            (self.rule, self.in_types, self.out_type)
        nest = RuleKernel(mod, f"{name}.range", rule, in_types, out_type, self.op, chunked=True,
                          scalars=dict(self.scalars))
        ranged = nest.emit()
        extent = nest.chunk_extent
        chunks = min(extent, MAX_CHUNKS)
        kf = KernelFunction(mod, name, len(self.in_types))

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            lo = b.sdiv(b.mul(c, ir.Constant(I64, extent)), ir.Constant(I64, chunks))
            hi = b.sdiv(b.mul(b.add(c, ir.Constant(I64, 1)), ir.Constant(I64, extent)), ir.Constant(I64, chunks))
            rc = b.call(ranged, [ctx.out, *ctx.ins, lo, hi])
            if_then(b, b.icmp_signed("!=", rc, ir.Constant(I32, abi.OK)), "fail",
                    lambda: b.store(ir.Constant(I1, 1), ctx.err))

        kf.phase(chunks, STEP_FLOPS * self.steps, chunk)
        return kf.finish()


def chunked_rule_kernel(v: Value, constants: Mapping[str, np.ndarray]) -> ChunkedRuleKernel | None:
    """The chunked rule nest of ``v`` when its shapes are static and it has work enough for the pool."""
    if v.is_param or v.is_const or not v.type.is_static or any(not o.type.is_static for o in v.operands):
        return None
    rule = op_rule(v)
    steps = _steps(rule, v.type)
    if steps < MIN_STEPS:
        return None
    return ChunkedRuleKernel(v.op, rule, tuple(o.type for o in v.operands), v.type, steps,
                             tuple(scalar_operands(v, constants).items()))
