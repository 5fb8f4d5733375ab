"""``transpose`` that moves the input's last axis, as a schedule of its rule (``out[i] = in[perm(i)]``):
sixteen-by-sixteen blocks turned in registers.

The rule lowering walks the output in order, so where the input's contiguous axis becomes a strided one
every element is a scalar load a row apart (BERT's keys turned for ``Q @ K^T``, 128x4x64 -> 4x64x128:
0.035 ms on one Zen 4 core, about a nanosecond an element). Here, for each block of sixteen output rows
(along the axis that reads the input's rows) by sixteen output columns, sixteen vectors are read along the
input's rows, transposed by shuffles and stored as sixteen vectors along the output's rows. It moves
values and computes none: the output is the rule's bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.kernels.base import ReadsEveryOperand
from cuvil.codegen.kernels.chunked import STEP_FLOPS
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, fgep, transpose, vec_type
from cuvil.codegen.loops import NO_UNROLL, const, for_range, row_major_strides, unravel
from cuvil.codegen.scalar import Val
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

BLOCK = 16
"""Rows and columns of a block (one AVX-512 vector of float32 each way)."""


@dataclass(frozen=True)
class TransposeKernel(ReadsEveryOperand):
    """A static float32 ``transpose`` whose permutation moves the last axis, the two axes it exchanges
    (the output's last, and the output axis that reads the input's last) whole blocks long."""

    in_shape: tuple[int, ...]
    perm: tuple[int, ...]

    name = "transpose.blocks"
    constant_bytes = 0

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        rank = len(self.perm)
        out_shape = [self.in_shape[p] for p in self.perm]
        in_strides, out_strides = row_major_strides(list(self.in_shape)), row_major_strides(out_shape)
        across = self.perm.index(rank - 1)  # the output axis that reads the input's rows
        down = in_strides[self.perm[-1]]  # the input's step between two output columns
        outer = [a for a in range(rank) if a not in (across, rank - 1)]
        kf = KernelFunction(mod, name, 1)
        vt = vec_type(BLOCK)

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            src, dst = const(0), const(0)
            for a, i in zip(outer, unravel(b, c, [out_shape[a] for a in outer]) if outer else [], strict=True):
                src = b.add(src, b.mul(i, const(in_strides[self.perm[a]])))
                dst = b.add(dst, b.mul(i, const(out_strides[a])))

            def block(rows0: Val, cols0: Val) -> None:
                at = b.add(src, b.add(rows0, b.mul(cols0, const(down))))
                lines = [b.load(fgep(b, ctx.ins[0], b.add(at, const(t * down))), typ=vt, align=4)
                         for t in range(BLOCK)]
                base = b.add(dst, b.add(b.mul(rows0, const(out_strides[across])), cols0))
                for u, column in enumerate(transpose(b, lines, BLOCK)):
                    b.store(column, fgep(b, ctx.out, b.add(base, const(u * out_strides[across]))), align=4)

            for_range(b, 0, out_shape[across], "tr", lambda r0: for_range(
                b, 0, out_shape[-1], "tc", lambda c0: block(r0, c0), step=BLOCK, hints=NO_UNROLL),
                step=BLOCK, hints=NO_UNROLL)

        count = math.prod(out_shape[a] for a in outer)
        kf.phase(count, STEP_FLOPS * math.prod(out_shape), chunk)
        return kf.finish()


def transpose_kernel(v: Value) -> TransposeKernel | None:
    """The block schedule of a static float32 ``transpose`` that moves the last axis and whose two exchanged
    axes are whole blocks long, else None (the rule lowering: a transpose keeping the last axis copies
    contiguous runs already)."""
    if v.op != "transpose" or v.dtype is not DType.f32 or not v.type.is_static or v.operands[0].type.rank < 2:
        return None
    perm = tuple(int(p) for p in v.attr("perm"))
    rank = len(perm)
    shape = tuple(int(d) for d in v.operands[0].type.shape)
    if perm[-1] == rank - 1 or shape[-1] % BLOCK or shape[perm[-1]] % BLOCK:
        return None
    return TransposeKernel(shape, perm)


__all__ = ["BLOCK", "TransposeKernel", "transpose_kernel"]
