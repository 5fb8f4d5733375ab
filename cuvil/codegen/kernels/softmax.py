"""``softmax`` and ``log_softmax`` as a schedule of their rule that vectorizes.

The rule reduces each row in order (the max, then the sum of ``exp(x - max)`` from the first element
to the last); the generic lowering walks one row at a time, so each step waits for the previous one
and nothing vectorizes. Here sixteen rows advance together: a block of rows is copied into a
column-major tile, and each reduction step is one operation across the sixteen rows' accumulators,
which LLVM vectorizes while every row still sums its own terms in the rule's order. Every scalar
operation is the one the generic lowering emits (:class:`cuvil.codegen.scalar.ScalarEmitter`), so the
result is the same bit for bit (``tests/codegen/test_softmax_kernel.py``). The exponentials the sum
computed are kept in the tile and reused for the output, which the rule computes again: the same
values, computed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.llvm_types import F32, I1, I32, I64, PTR
from cuvil.codegen.loops import for_range, opaque_alloca
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val, identity
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

LANES = 16
"""Rows that advance together (one AVX-512 vector of float32)."""

TILE_LIMIT = 1 << 22
"""Largest tile (bytes): longer rows stay on the generic lowering."""


@dataclass(frozen=True)
class SoftmaxKernel:
    """``i32 name(ptr out, ptr in, ptr scratch)`` for a static float32 (log-)softmax: ``rows`` rows of
    ``length`` elements, element ``k`` of row ``r`` at ``(r // inner) * length * inner + r % inner +
    k * inner``."""

    op: str  # "softmax" or "log_softmax"
    rows: int
    length: int
    inner: int

    name = "softmax rows"
    unused_operands: frozenset[int] = frozenset()
    constant_bytes = 0

    @property
    def scratch_bytes(self) -> int:
        return self.length * LANES * 4

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * 3), name=name)
        fn.linkage = "hidden"
        out, src, tile = fn.args
        out.name, src.name, tile.name = "out", "in0", "scratch"
        b = Builder(fn.append_basic_block("entry"))
        s = ScalarEmitter(b)
        vec = ir.ArrayType(F32, LANES)
        top, total = opaque_alloca(b, vec, "top"), opaque_alloca(b, vec, "total")
        base = opaque_alloca(b, ir.ArrayType(I64, LANES), "base")
        valid = opaque_alloca(b, ir.ArrayType(I1, LANES), "valid")

        def lane(array: Val, j: Val, ty: ir.Type = F32) -> Val:
            return b.gep(array, [j], source_etype=ty, inbounds=True)

        def cell(k: Val, j: Val) -> Val:
            return b.gep(tile, [b.add(b.mul(k, ir.Constant(I64, LANES)), j)], source_etype=F32, inbounds=True)

        def element(ptr: Val, j: Val, k: Val) -> Val:
            offset = b.add(b.load(lane(base, j, I64), typ=I64), b.mul(k, ir.Constant(I64, self.inner)))
            return b.gep(ptr, [offset], source_etype=F32, inbounds=True)

        def block(r0: Val) -> None:
            def locate(j: Val) -> None:
                r = b.add(r0, j)
                ok = b.icmp_signed("<", r, ir.Constant(I64, self.rows))
                r = b.select(ok, r, ir.Constant(I64, 0))
                outer = b.sdiv(r, ir.Constant(I64, self.inner))
                offset = b.add(b.mul(outer, ir.Constant(I64, self.length * self.inner)),
                               b.srem(r, ir.Constant(I64, self.inner)))
                b.store(offset, lane(base, j, I64))
                b.store(ok, lane(valid, j, I1))
                b.store(identity("max", DType.f32), lane(top, j))
                b.store(ir.Constant(F32, -0.0), lane(total, j))

            for_range(b, 0, LANES, "lane", locate)

            def gather(k: Val) -> None:  # padding lanes read row 0: computed, never stored
                for_range(b, 0, LANES, "g", lambda j: b.store(b.load(element(src, j, k), typ=F32), cell(k, j)))

            for_range(b, 0, self.length, "k", gather)

            def maximum(k: Val) -> None:
                def step(j: Val) -> None:
                    acc = b.load(lane(top, j), typ=F32)
                    b.store(s.call("max", [acc, b.load(cell(k, j), typ=F32)], [DType.f32] * 2, DType.f32, {}),
                            lane(top, j))
                for_range(b, 0, LANES, "m", step)

            for_range(b, 0, self.length, "k", maximum)

            def accumulate(k: Val) -> None:
                def step(j: Val) -> None:
                    shifted = b.fsub(b.load(cell(k, j), typ=F32), b.load(lane(top, j), typ=F32))
                    e = s.call("exp", [shifted], [DType.f32], DType.f32, {})
                    b.store(b.fadd(b.load(lane(total, j), typ=F32), e), lane(total, j))
                    if self.op == "softmax":
                        b.store(e, cell(k, j))
                for_range(b, 0, LANES, "s", step)

            for_range(b, 0, self.length, "k", accumulate)
            self._store(b, s, out, block_lane=lambda j: (lane(valid, j, I1), lane(top, j), lane(total, j)),
                        cell=cell, element=element)

        for_range(b, 0, self.rows, "rows", block, step=LANES)
        b.ret(ir.Constant(I32, abi.OK))
        return fn

    def _store(self, b: Builder, s: ScalarEmitter, out: Val, block_lane, cell, element) -> None:
        def row(j: Val) -> None:
            ok_ptr, top_ptr, total_ptr = block_lane(j)
            with b.if_then(b.load(ok_ptr, typ=I1)):
                total = b.load(total_ptr, typ=F32)
                if self.op == "log_softmax":
                    top = b.load(top_ptr, typ=F32)
                    log_total = s.call("log", [total], [DType.f32], DType.f32, {})

                    def put(k: Val) -> None:
                        b.store(b.fsub(b.fsub(b.load(cell(k, j), typ=F32), top), log_total), element(out, j, k))
                else:
                    def put(k: Val) -> None:
                        b.store(b.fdiv(b.load(cell(k, j), typ=F32), total), element(out, j, k))
                for_range(b, 0, self.length, "k", put)

        for_range(b, 0, LANES, "row", row)


def softmax_kernel(v: Value) -> SoftmaxKernel | None:
    """The row-blocked schedule of ``v`` when it is a float32 softmax or log_softmax at static shapes."""
    if v.op not in ("softmax", "log_softmax") or len(v.operands) != 1 or v.is_param or v.is_const:
        return None
    t: TensorType = v.operands[0].type
    if t.dtype is not DType.f32 or v.dtype is not DType.f32 or not t.is_static or not v.type.is_static:
        return None
    shape = [int(d) for d in t.shape]
    axis = int(cast(int, v.attr("axis", -1))) % len(shape) if shape else 0
    if not shape or any(d == 0 for d in shape):
        return None
    length = shape[axis]
    inner = 1
    for d in shape[axis + 1:]:
        inner *= d
    rows = 1
    for d in shape:
        rows *= d
    rows //= length
    if length * LANES * 4 > TILE_LIMIT:
        return None
    return SoftmaxKernel(v.op, rows, length, inner)
