"""Integer matrix products on AVX-512 VNNI (``vpdpbusd``): the int32 ``matmul`` that
``quantize-int8`` writes, ``(x - zx) @ (w - zw)``, over weights whose values fit in int8.

The rule sums int32 products in int32 (wrapping). The kernel computes the same sums: weights are
packed at compile time as int8, four consecutive ``k`` per 32-bit lane; each row of the run-time
operand is shifted by its own minimum ``lo`` so that it fits in uint8 (``u = a - lo``) and
``vpdpbusd`` accumulates ``u * w`` four products at a time. Then

    sum_k a[k] * w[k] = sum_k u[k] * w[k] + lo * sum_k w[k]        (mod 2^32)

with the column sums of ``w`` computed at compile time. Integer addition is associative modulo
2^32, so any order gives the rule's bits. A row whose values span more than 255 (never one that
``quantize-int8`` centered, which spans at most 255) takes a scalar loop with the rule's own
int32 arithmetic. The fused epilogue (requantization) is emitted from its rule per element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.kernels.epilogue import Contraction, reads_operand
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, epilogue_emitter
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.llvm_types import I1, I8, I32, I64, declare
from cuvil.codegen.loops import const, counted_loop, for_range, if_then, imin
from cuvil.codegen.scalar import Builder, Val
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType

LANES = 16
"""int32 accumulators per vector (one output column each)."""

GROUP = 4
"""Vectors of columns per chunk (64 columns): one row of the run-time operand feeds four ``vpdpbusd``."""

MR = 4
"""Rows per register tile."""

V16 = ir.VectorType(I32, LANES)
V64 = ir.VectorType(I8, 4 * LANES)

INT8_MIN, INT8_MAX = -128, 127


def host_has_vnni() -> bool:
    from cuvil.codegen.link import host_target

    feats = set(host_target().features.split(","))
    return {"+avx512f", "+avx512bw", "+avx512vnni"} <= feats


def fits_int8(w: np.ndarray) -> bool:
    return w.size > 0 and bool(w.min() >= INT8_MIN and w.max() <= INT8_MAX)


def pack_vnni(w_nk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w[N, K]`` (int8 values) -> the ``[blocks, ceil(K/4), 16, 4]`` int8 panels ``vpdpbusd``
    reads (lane ``l`` of block ``b`` holds column ``16 b + l``, four ``k`` per lane; zero padded to
    whole groups of blocks) and the int32 column sums (zero for padding)."""
    n, k = w_nk.shape
    kq = -(-k // 4)
    vectors = -(-n // LANES)
    blocks = -(-vectors // GROUP) * GROUP
    padded = np.zeros((blocks * LANES, kq * 4), dtype=np.int8)
    padded[:n, :k] = w_nk
    packed = np.ascontiguousarray(padded.reshape(blocks, LANES, kq, 4).transpose(0, 2, 1, 3))
    colsum = padded.astype(np.int64).sum(axis=1).astype(np.int32)
    return packed, colsum


def _aligned(n: int) -> int:
    return -(-n // abi.ARENA_ALIGN) * abi.ARENA_ALIGN


@dataclass(frozen=True)
class VnniMatmulKernel:
    """``i32 name(ptr out, ptr in0, ..., ptr scratch)`` for a 2-D int32 ``matmul`` (``[M, K]`` at run
    time, a constant ``[N, K]`` or ``[K, N]`` of int8 values) and its fused epilogue."""

    op: str
    c: Contraction
    in_types: tuple[TensorType, ...]
    out_type: TensorType
    m: int
    n: int
    k: int
    packed: np.ndarray = field(repr=False)
    colsum: np.ndarray = field(repr=False)

    @property
    def name(self) -> str:
        return f"int8.vnni.{MR}x{GROUP * LANES}"

    @property
    def kq(self) -> int:
        return int(self.packed.shape[1])

    @property
    def unused_operands(self) -> frozenset[int]:
        if reads_operand(self.c.epilogue, self.c.rhs) or self.c.rhs == self.c.lhs:
            return frozenset()
        return frozenset([self.c.rhs])

    def _layout(self) -> tuple[int, int, int]:
        """Scratch offsets of the shifted uint8 rows, the per-row shifts, the per-row 'fits' flags."""
        shifts = _aligned(self.m * self.kq * 4)
        flags = shifts + _aligned(4 * self.m)
        return 0, shifts, flags

    @property
    def scratch_bytes(self) -> int:
        return self._layout()[2] + _aligned(4 * self.m)

    @property
    def constant_bytes(self) -> int:
        return int(self.packed.nbytes + self.colsum.nbytes)

    # ----------------------------------------------------------------------------------

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, len(self.in_types))
        packed = embed_array(mod, f"{name}.packed_b", self.packed)
        colsum = embed_array(mod, f"{name}.colsum", self.colsum)
        groups = self.packed.shape[0] // GROUP
        kf.phase(self.m, 0.0, self._shift_row)  # cheap: on the calling thread

        def chunk(ctx: Ctx, c: Val) -> None:
            self._chunk(ctx, c, groups, packed, colsum)

        kf.phase(-(-self.m // MR) * groups, 2.0 * self.m * self.n * self.k, chunk)
        return kf.finish()

    def _shift_row(self, ctx: Ctx, r: Val) -> None:
        """Row ``r``: its minimum (the shift), whether it spans at most 255, and if so its uint8 copy."""
        b = ctx.b
        u_at, shift_at, flag_at = self._layout()
        kp = 4 * self.kq
        row = b.gep(ctx.ins[self.c.lhs], [b.mul(r, const(self.k))], inbounds=True, source_etype=I32)
        smin = declare(mod := b.module, "llvm.smin.i32", I32, [I32, I32])
        smax = declare(mod, "llvm.smax.i32", I32, [I32, I32])
        first = b.load(row, typ=I32, align=4)

        def extremes(k: Val, carried: list[Val]) -> list[Val]:
            x = b.load(b.gep(row, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
            return [b.call(smin, [carried[0], x]), b.call(smax, [carried[1], x])]

        _, (lo, hi) = counted_loop(b, "minmax", const(1), lambda k: b.icmp_signed("<", k, const(self.k)), 1,
                                   extremes, [first, first])
        fits = b.icmp_unsigned("<=", b.sub(b.sext(hi, I64), b.sext(lo, I64)), const(255))
        b.store(lo, b.gep(ctx.scratch, [b.add(const(shift_at), b.mul(r, const(4)))], inbounds=True, source_etype=I8),
                align=4)
        b.store(b.zext(fits, I32),
                b.gep(ctx.scratch, [b.add(const(flag_at), b.mul(r, const(4)))], inbounds=True, source_etype=I8),
                align=4)
        u_row = b.gep(ctx.scratch, [b.add(const(u_at), b.mul(r, const(kp)))], inbounds=True, source_etype=I8)

        def copy() -> None:
            def one(k: Val) -> None:
                x = b.load(b.gep(row, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
                b.store(b.trunc(b.sub(x, lo), I8), b.gep(u_row, [k], inbounds=True, source_etype=I8), align=1)

            for_range(b, 0, self.k, "u", one)
            for_range(b, self.k, kp, "upad", lambda k: b.store(ir.Constant(I8, 0), b.gep(
                u_row, [k], inbounds=True, source_etype=I8), align=1))

        if_then(b, fits, "fits", copy)

    def _chunk(self, ctx: Ctx, c: Val, groups: int, packed: Val, colsum: Val) -> None:
        """Rows ``MR * (c / groups)...`` by columns ``64 * (c % groups)...``: accumulate, then the epilogue."""
        b = ctx.b
        flag_at = self._layout()[2]
        width = GROUP * LANES
        tile = ctx.entry_alloca(ir.ArrayType(I32, MR * width), "tile")
        r0 = b.mul(b.udiv(c, const(groups)), const(MR))
        g = b.urem(c, const(groups))
        rows = imin(b, const(MR), b.sub(const(self.m), r0))
        n0 = b.mul(g, const(width))
        cols = imin(b, const(width), b.sub(const(self.n), n0))

        def scratch_i32(at: int, r: Val) -> Val:
            return b.load(b.gep(ctx.scratch, [b.add(const(at), b.mul(r, const(4)))], inbounds=True,
                                source_etype=I8), typ=I32, align=4)

        fits: Val = ir.Constant(I1, 1)
        for i in range(MR):
            r = imin(b, b.add(r0, const(i)), const(self.m - 1))
            fits = b.and_(fits, b.icmp_signed("!=", scratch_i32(flag_at, r), ir.Constant(I32, 0)))
        full = b.icmp_signed("==", rows, const(MR))
        vector, scalar, done = (ctx.fn.append_basic_block(f"int8.{x}") for x in ("vector", "scalar", "stored"))
        b.cbranch(fits, vector, scalar)

        b.position_at_end(vector)
        tiled, by_row = ctx.fn.append_basic_block("int8.tiled"), ctx.fn.append_basic_block("int8.rows")
        b.cbranch(full, tiled, by_row)
        b.position_at_end(tiled)
        self._micro(ctx, [b.add(r0, const(i)) for i in range(MR)], g, packed, colsum, tile, 0)
        b.branch(done)
        b.position_at_end(by_row)
        for_range(b, 0, rows, "row", lambda i: self._micro(ctx, [b.add(r0, i)], g, packed, colsum, tile, i))
        b.branch(done)

        b.position_at_end(scalar)
        self._scalar(ctx, r0, rows, n0, cols, packed, tile)
        b.branch(done)

        b.position_at_end(done)
        epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)

        def row(i: Val) -> None:
            def col(j: Val) -> None:
                acc = b.load(b.gep(tile, [b.add(b.mul(i, const(width)), j)], inbounds=True, source_etype=I32),
                             typ=I32, align=4)
                r, n = b.add(r0, i), b.add(n0, j)
                epi.store(b.add(b.mul(r, const(self.n)), n), epi.element([r, n], acc))

            for_range(b, 0, cols, "col", col)

        for_range(b, 0, rows, "erow", row)

    def _micro(self, ctx: Ctx, rows: Sequence[Val], g: Val, packed: Val, colsum: Val, tile: Val,
               first: Val | int) -> None:
        """``tile[first + i][...] = sum_k u[row_i, k] * w[k, column] + shift[row_i] * colsum[column]``."""
        b = ctx.b
        u_at, shift_at, _ = self._layout()
        kp, kq = 4 * self.kq, self.kq
        dot = declare(b.module, "llvm.x86.avx512.vpdpbusd.512", V16, [V16, V64, V64])
        block0 = b.mul(g, const(GROUP))
        u_rows = [b.gep(ctx.scratch, [b.add(const(u_at), b.mul(r, const(kp)))], inbounds=True, source_etype=I8)
                  for r in rows]
        panels = [b.gep(packed, [b.mul(b.add(block0, const(j)), const(kq * 64))], inbounds=True, source_etype=I8)
                  for j in range(GROUP)]
        zero = ir.Constant(V16, None)

        def step(q: Val, acc: list[Val]) -> list[Val]:
            out = list(acc)
            bv = [b.load(b.gep(p, [b.mul(q, const(64))], inbounds=True, source_etype=I8), typ=V64, align=64)
                  for p in panels]
            for i, u in enumerate(u_rows):
                quad = b.load(b.gep(u, [b.mul(q, const(4))], inbounds=True, source_etype=I8), typ=I32, align=4)
                av = b.bitcast(_splat(b, quad), V64)
                for j in range(GROUP):
                    out[i * GROUP + j] = b.call(dot, [out[i * GROUP + j], av, bv[j]])
            return out

        _, acc = counted_loop(b, "kq", const(0), lambda q: b.icmp_signed("<", q, const(kq)), 1, step,
                              [zero] * (len(rows) * GROUP))
        base = const(first) if isinstance(first, int) else first
        for i, r in enumerate(rows):
            shift = _splat(b, b.load(b.gep(ctx.scratch, [b.add(const(shift_at), b.mul(r, const(4)))],
                                           inbounds=True, source_etype=I8), typ=I32, align=4))
            for j in range(GROUP):
                col = b.add(b.mul(block0, const(LANES)), const(j * LANES))
                sums = b.load(b.gep(colsum, [col], inbounds=True, source_etype=I32), typ=V16, align=64)
                value = b.add(acc[i * GROUP + j], b.mul(shift, sums))
                at = b.add(b.mul(b.add(base, const(i)), const(GROUP * LANES)), const(j * LANES))
                b.store(value, b.gep(tile, [at], inbounds=True, source_etype=I32), align=64)

    def _scalar(self, ctx: Ctx, r0: Val, rows: Val, n0: Val, cols: Val, packed: Val, tile: Val) -> None:
        """The rule's own int32 sums, for rows that do not fit uint8 after their shift."""
        b = ctx.b
        kq = self.kq

        def row(i: Val) -> None:
            a_row = b.gep(ctx.ins[self.c.lhs], [b.mul(b.add(r0, i), const(self.k))], inbounds=True,
                          source_etype=I32)

            def col(j: Val) -> None:
                n = b.add(n0, j)
                panel = b.gep(packed, [b.add(b.mul(b.udiv(n, const(LANES)), const(kq * 64)),
                                             b.mul(b.urem(n, const(LANES)), const(4)))],
                              inbounds=True, source_etype=I8)

                def term(k: Val, acc: list[Val]) -> list[Val]:
                    a = b.load(b.gep(a_row, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
                    at = b.add(b.mul(b.udiv(k, const(4)), const(64)), b.urem(k, const(4)))
                    w = b.sext(b.load(b.gep(panel, [at], inbounds=True, source_etype=I8), typ=I8, align=1), I32)
                    return [b.add(acc[0], b.mul(a, w))]

                _, (s,) = counted_loop(b, "sk", const(0), lambda k: b.icmp_signed("<", k, const(self.k)), 1, term,
                                       [ir.Constant(I32, 0)])
                b.store(s, b.gep(tile, [b.add(b.mul(i, const(GROUP * LANES)), j)], inbounds=True,
                                 source_etype=I32), align=4)

            for_range(b, 0, cols, "scol", col)

        for_range(b, 0, rows, "srow", row)


def _splat(b: Builder, x: Val) -> Val:
    one = b.insert_element(ir.Constant(V16, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(V16, ir.Undefined), ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))


def vnni_matmul(op: str, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                rhs: np.ndarray | None) -> VnniMatmulKernel | None:
    """The VNNI kernel for an int32 2-D ``matmul`` whose constant rhs holds int8 values, or None."""
    if c.op != "matmul" or rhs is None or c.attrs.get("transpose_a"):
        return None
    if c.lhs_type.rank != 2 or c.rhs_type.rank != 2 or c.rhs == c.lhs:
        return None
    if any(t.dtype is not DType.i32 for t in (c.lhs_type, c.rhs_type, c.out_type)):
        return None
    w = np.asarray(rhs)
    if not np.issubdtype(w.dtype, np.integer) or not fits_int8(w) or not host_has_vnni():
        return None
    w_nk = w if c.attrs.get("transpose_b") else w.T
    m, k = (int(d) for d in c.lhs_type.shape)
    n = int(w_nk.shape[0])
    if math.prod((m, n, k)) == 0:
        return None
    packed, colsum = pack_vnni(w_nk)
    return VnniMatmulKernel(op, c, tuple(in_types), out_type, m, n, k, packed, colsum)
