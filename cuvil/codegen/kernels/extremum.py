"""The float32 ``reduce_min`` / ``reduce_max`` of a whole tensor (what ``DynamicQuantizeLinear`` computes for
every activation it quantizes) as a schedule of the rule: a left fold in row-major order of numpy's
``minimum`` / ``maximum``, where a NaN propagates and a tie gives the later operand.

The fold's value does not depend on the order: it is NaN if any element is (any NaN), else the least (the
greatest) element. Only a tie between zeros of both signs leaves bits to the order, and there the later
operand wins at every step: the result is the last zero of the tensor. So the elements are folded sixteen at a
time in ``VECTORS`` independent vectors, the lanes combined, and where that gives a zero, the tensor is read
backwards to its last zero. The generic lowering folded one element at a time, each step waiting on the
last (a recognizer quantized with dynamic ranges: 44 such reductions, 1.8 ms of its 10 on one thread).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.kernels.base import ReadsEveryOperand
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, fgep, splat
from cuvil.codegen.llvm_types import F32, I32
from cuvil.codegen.loops import const, counted_loop, if_then
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

LANES = 16
VECTORS = 4
"""Independent vectors folded at once: the compare and select of one wait on the one before."""

_FOLD = {"reduce_min": "min", "reduce_max": "max"}
VECTOR = ir.VectorType(F32, LANES)
ZERO = ir.Constant(F32, 0.0)


@dataclass(frozen=True)
class ExtremumKernel(ReadsEveryOperand):
    """``reduce_min`` or ``reduce_max`` over every axis of a static float32 tensor; see the module's docstring."""

    op: str
    size: int

    @property
    def name(self) -> str:
        return "extremum.vectors"

    @property
    def constant_bytes(self) -> int:
        return 0

    def _pick(self, b: Builder, acc: Val, x: Val) -> Val:
        """One step of the rule's fold, ``acc`` combined with ``x`` by the reduction's own primitive (numpy's
        ``minimum`` / ``maximum``: NaN propagates, a tie gives ``x``), as every lowering emits it."""
        combine = R.REDUCTIONS[_FOLD[self.op]].combine
        return ScalarEmitter(b).call(combine, [acc, x], [DType.f32, DType.f32], DType.f32, {})

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, 1)
        n = self.size
        step = LANES * VECTORS
        whole = n // step * step

        def chunk(ctx: Ctx, _c: Val) -> None:
            b = ctx.b
            src = ctx.ins[0]
            first = splat(b, b.load(src, typ=F32, align=4), LANES)  # folding an element into itself gives it

            def block(i: Val, acc: list[Val]) -> list[Val]:
                return [self._pick(b, a, b.load(fgep(b, src, b.add(i, const(v * LANES))), typ=VECTOR, align=4))
                        for v, a in enumerate(acc)]

            _, acc = counted_loop(b, "xb", const(0), lambda i: b.icmp_signed("<", i, const(whole)), step, block,
                                  [first] * VECTORS)
            total = acc[0]
            for a in acc[1:]:
                total = self._pick(b, total, a)
            value = b.extract_element(total, ir.Constant(I32, 0))
            for lane in range(1, LANES):
                value = self._pick(b, value, b.extract_element(total, ir.Constant(I32, lane)))

            def tail(i: Val, carried: list[Val]) -> list[Val]:
                return [self._pick(b, carried[0], b.load(fgep(b, src, i), typ=F32, align=4))]

            _, (value,) = counted_loop(b, "xt", const(whole), lambda i: b.icmp_signed("<", i, const(n)), 1, tail,
                                       [value])
            b.store(value, ctx.out, align=4)

            def last_zero() -> None:  # each tie gave the later operand: the result is the tensor's last zero
                at, _ = counted_loop(b, "xz", const(n - 1), lambda j: b.fcmp_unordered(
                    "une", b.load(fgep(b, src, j), typ=F32, align=4), ZERO), -1, lambda j, carried: carried,
                    flags=())
                b.store(b.load(fgep(b, src, at), typ=F32, align=4), ctx.out, align=4)

            if_then(b, b.fcmp_ordered("==", value, ZERO), "xzero", last_zero)

        kf.phase(1, 2.0 * n, chunk)
        return kf.finish()


def extremum_kernel(v: Value) -> ExtremumKernel | None:
    """The kernel of a float32 ``reduce_min`` / ``reduce_max`` over every axis of a static, non-empty tensor."""
    if v.op not in _FOLD or v.dtype is not DType.f32:
        return None
    (x,) = v.operands
    if x.dtype is not DType.f32 or not x.type.is_static or not v.type.is_static:
        return None
    size = math.prod(int(d) for d in x.type.shape)
    if size == 0 or math.prod(int(d) for d in v.type.shape) != 1:
        return None
    return ExtremumKernel(v.op, size)


__all__ = ["ExtremumKernel", "extremum_kernel"]
