"""Integer matrix products and convolutions on AVX-512 VNNI (``vpdpbusd``): the int32 ``matmul`` and
``conv`` that ``quantize-int8`` writes, ``(x - zx) @ (w - zw)``, over weights whose values fit in int8. On
a CPU with AVX2 and no VNNI each four-product step is two ``vpmaddwd`` (:func:`dot_quads`), the same sums (or,
where the weights' pairs cannot saturate it, one ``vpmaddubsw`` and one ``vpmaddwd``).

The rule sums int32 products in int32 (wrapping). The kernel computes the same sums: weights are
packed at compile time as int8, four consecutive ``k`` per 32-bit lane; each row of the run-time
operand is shifted by its own minimum ``lo`` so that it fits in uint8 (``u = a - lo``) and
``vpdpbusd`` accumulates ``u * w`` four products at a time. Then

    sum_k a[k] * w[k] = sum_k u[k] * w[k] + lo * sum_k w[k]        (mod 2^32)

with the column sums of ``w`` computed at compile time. Integer addition is associative modulo
2^32, so any order gives the rule's bits. Weights that do not fit int8 (uint8 weights less their zero
point, as ``MatMulInteger`` and ``ConvInteger`` carry them): a matmul whose every column spans at most 256
values packs each column less an offset that moves it into int8, and adds ``offset * sum_k u[k]`` per
output (:class:`VnniMatmulKernel`); other weights in [-256, 254], and a convolution's, are packed as two int8
halves, ``w = clip(w, -128, 127) + rest``, each against the same run-time values: twice the products, the
same sums. A row whose values span more than 255 (never one that
``quantize-int8`` centered, which spans at most 255) takes a scalar loop with the rule's own
int32 arithmetic. The fused epilogue (requantization) is emitted from its rule per element.
A convolution shifts its whole input (zero, the padding, included) and reads it from stride-phase
planes (:class:`ConvShape`) with output pixels in the lanes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.kernels.epilogue import Contraction, packed_rhs_unused
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, epilogue_emitter, splat
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.llvm_types import I1, I8, I16, I32, I64, declare
from cuvil.codegen.loops import const, counted_loop, for_range, if_else, if_then, imin, unravel
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
    """Whether the target being compiled for (the host outside a build) has 512-bit ``vpdpbusd``."""
    from cuvil.codegen.target import codegen_target

    return codegen_target().has("avx512f", "avx512bw", "avx512vnni")


def host_int8_dot() -> str | None:
    """How the kernels' four-product steps run on the target being compiled for: ``"vnni"`` (``vpdpbusd``),
    ``"avx2"`` (two ``vpmaddwd`` on the bytes widened to 16 bits, :func:`dot_quads`), or None (no kernel)."""
    from cuvil.codegen.target import codegen_target

    if host_has_vnni():
        return "vnni"
    return "avx2" if codegen_target().has("avx2") else None


V32_I16 = ir.VectorType(I16, 2 * LANES)
V32_I8 = ir.VectorType(I8, 2 * LANES)
V8 = ir.VectorType(I32, LANES // 2)
V16_I16 = ir.VectorType(I16, LANES)


def dot_quads(b: Builder, how: str) -> Callable[[Val, Val, Val], Val]:
    """``acc + sum_j u[4i + j] * s[4i + j]`` per int32 lane ``i`` (``u`` uint8, ``s`` int8, 64 of each): what
    ``vpdpbusd`` computes, wrapping. Without VNNI (``"avx2"``) the even and the odd bytes are widened to 16 bits
    and multiplied in pairs by ``vpmaddwd``: each product of a uint8 and an int8 and each sum of two is exact in
    16 and 32 bits, so the two sums add to the same int32 as the four-product step. Where every pair of weights
    keeps its products' sum within int16 whatever the uint8 values (:func:`pairs_fit`, ``"pairs"``),
    ``vpmaddubsw`` adds each pair in 16 bits without saturating and ``vpmaddwd`` by ones adds the two pairs of a
    lane: half the instructions, the same sums."""
    if how == "vnni":
        dot = declare(b.module, "llvm.x86.avx512.vpdpbusd.512", V16, [V16, V64, V64])
        return lambda acc, u, s: b.call(dot, [acc, u, s])
    madd = declare(b.module, "llvm.x86.avx2.pmadd.wd", V8, [V16_I16, V16_I16])

    def half(v: Val, h: int, n: int = LANES) -> Val:
        """Half ``h`` of a vector of ``2 n`` elements (a 256-bit register of the 512-bit value)."""
        return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(h * n, (h + 1) * n))))

    def joined(parts: Sequence[Val]) -> Val:
        return b.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(I32, LANES), list(range(LANES))))

    if how == "pairs":
        madd_bytes = declare(b.module, "llvm.x86.avx2.pmadd.ub.sw", V16_I16, [V32_I8, V32_I8])
        ones = ir.Constant(V16_I16, [1] * LANES)

        def pairs(acc: Val, u: Val, s: Val) -> Val:
            sums = [b.call(madd_bytes, [half(u, h, 2 * LANES), half(s, h, 2 * LANES)]) for h in (0, 1)]
            return b.add(acc, joined([b.call(madd, [p, ones]) for p in sums]))

        return pairs
    eight = ir.Constant(V32_I16, [8] * (2 * LANES))
    low = ir.Constant(V32_I16, [0xFF] * (2 * LANES))

    def step(acc: Val, u: Val, s: Val) -> Val:
        u16, s16 = b.bitcast(u, V32_I16), b.bitcast(s, V32_I16)
        u_even, u_odd = b.and_(u16, low), b.lshr(u16, eight)
        s_even, s_odd = b.ashr(b.shl(s16, eight), eight), b.ashr(s16, eight)
        parts = []
        for h in (0, 1):
            even = b.call(madd, [half(u_even, h), half(s_even, h)])
            odd = b.call(madd, [half(u_odd, h), half(s_odd, h)])
            parts.append(b.add(even, odd))
        return b.add(acc, joined(parts))

    return step


def pairs_fit(packed: np.ndarray) -> bool:
    """Whether ``vpmaddubsw`` adds every pair of adjacent packed weights (the pairs it multiplies) to any two
    uint8 values exactly: ``u0 w0 + u1 w1`` over ``u`` in [0, 255] reaches ``255 (w0+ + w1+)`` and
    ``255 (w0- + w1-)`` (the positive and the negative parts), which must lie in int16, where the instruction
    would saturate. Weights in [-64, 63] (quantized with a reduced range, as for AVX2 hosts) always fit."""
    p = packed.reshape(-1, 2).astype(np.int64)
    if not p.size:
        return False
    high, low = np.maximum(p, 0).sum(axis=1).max(), np.minimum(p, 0).sum(axis=1).min()
    return bool(255 * high <= np.iinfo(np.int16).max and 255 * low >= np.iinfo(np.int16).min)


def fits_int8(w: np.ndarray) -> bool:
    return w.size > 0 and bool(w.min() >= INT8_MIN and w.max() <= INT8_MAX)


def int8_halves(w: np.ndarray) -> int:
    """How many int8 weights stand for each of ``w``'s: one where its values fit int8, two (:func:`split_int8`)
    where they fit twice the range, else 0 (no kernel)."""
    if fits_int8(w):
        return 1
    return 2 if w.size > 0 and bool(w.min() >= 2 * INT8_MIN and w.max() <= 2 * INT8_MAX) else 0


def column_offsets(w_nk: np.ndarray) -> np.ndarray | None:
    """Per row of ``w[N, K]`` (a column of the product), the offset that moves its values into int8 where they
    span at most 256 values (0 where they fit already), zero padded to whole groups of blocks; None where a
    column spans more."""
    lo, hi = w_nk.min(axis=1).astype(np.int64), w_nk.max(axis=1).astype(np.int64)
    if w_nk.size == 0 or bool((hi - lo > INT8_MAX - INT8_MIN).any()):
        return None
    inside = (lo >= INT8_MIN) & (hi <= INT8_MAX)
    n = w_nk.shape[0]
    vectors = -(-n // LANES)
    blocks = -(-vectors // GROUP) * GROUP
    out = np.zeros(blocks * LANES, dtype=np.int32)
    out[:n] = np.where(inside, 0, lo - INT8_MIN)
    return out


def split_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` (values in [-256, 254]) as two int8-valued arrays that sum to it."""
    first = np.clip(w, INT8_MIN, INT8_MAX)
    return first, w - first


def pack_vnni(w_nk: np.ndarray, halves: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``w[N, K]`` (int8 values, or split in ``halves`` of them) -> the ``[blocks, halves * ceil(K/4), 16, 4]``
    int8 panels ``vpdpbusd`` reads (lane ``l`` of block ``b`` holds column ``16 b + l``, four ``k`` per lane;
    each half's quads after the one before; zero padded to whole groups of blocks) and the int32 column sums
    (of ``w``; zero for padding)."""
    n, k = w_nk.shape
    kq = -(-k // 4)
    vectors = -(-n // LANES)
    blocks = -(-vectors // GROUP) * GROUP
    padded = np.zeros((blocks * LANES, halves * kq * 4), dtype=np.int8)
    for half, part in enumerate((w_nk,) if halves == 1 else split_int8(w_nk)):
        padded[:n, half * kq * 4:half * kq * 4 + k] = part
    packed = np.ascontiguousarray(padded.reshape(blocks, LANES, halves * kq, 4).transpose(0, 2, 1, 3))
    colsum = padded.astype(np.int64).sum(axis=1).astype(np.int32)
    return packed, colsum


def _aligned(n: int) -> int:
    return -(-n // abi.ARENA_ALIGN) * abi.ARENA_ALIGN


@dataclass(frozen=True)
class _IntegerProduct:
    """What both kernels share: the op, its contraction and types, the packed weights and their sums."""

    op: str
    c: Contraction
    in_types: tuple[TensorType, ...]
    out_type: TensorType
    packed: np.ndarray = field(repr=False)
    colsum: np.ndarray = field(repr=False)
    halves: int
    """Int8 weights per weight (:func:`int8_halves`): the packed reduction holds ``halves`` copies of it, each
    against the same run-time values."""

    @property
    def unused_operands(self) -> frozenset[int]:
        return packed_rhs_unused(self.c)

    @property
    def how(self) -> str:
        """:func:`host_int8_dot`'s (the kernels are only chosen where it has one), ``"pairs"`` instead of
        ``"avx2"`` where the packed weights allow (:func:`pairs_fit`)."""
        how = host_int8_dot()
        assert how is not None, "an int8 kernel was chosen for a target without an int8 dot product"
        return "pairs" if how == "avx2" and self._pairs_fit else how

    @functools.cached_property
    def _pairs_fit(self) -> bool:
        return pairs_fit(self.packed)

    @property
    def constant_bytes(self) -> int:
        return int(self.packed.nbytes + self.colsum.nbytes)


@dataclass(frozen=True)
class VnniMatmulKernel(_IntegerProduct):
    """``i32 name(ptr out, ptr in0, ..., ptr scratch)`` for an int32 ``matmul`` (``[..., M, K]`` at run
    time, ``m`` rows in all; a constant ``[N, K]`` or ``[K, N]`` of int8 values, of values less a column's
    offset, or of values split in two) and its fused epilogue.

    With ``offsets`` (one per column, :func:`column_offsets`) the packed weights are ``w - offset``, and each
    output adds ``offset * sum(u)`` over its row's shifted values (counted when the row is shifted):
    ``sum a w = sum u (w - c) + c sum u + lo sum w``, modulo 2^32."""

    m: int
    n: int
    k: int
    offsets: np.ndarray | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        how = ".offset" if self.offsets is not None else ".halves" if self.halves == 2 else ""
        return f"int8.{self.how}.{MR}x{GROUP * LANES}{how}"

    @property
    def kq(self) -> int:
        """Quads of ``k`` in a row of the run-time operand (and in each half of the packed weights)."""
        return int(self.packed.shape[1]) // self.halves

    def _layout(self) -> tuple[int, int, int, int]:
        """Scratch offsets of the shifted uint8 rows, the per-row shifts, the per-row 'fits' flags, the per-row
        sums of the shifted values."""
        shifts = _aligned(self.m * self.kq * 4)
        flags = shifts + _aligned(4 * self.m)
        sums = flags + _aligned(4 * self.m)
        return 0, shifts, flags, sums

    @property
    def scratch_bytes(self) -> int:
        return self._layout()[3] + _aligned(4 * self.m)

    @property
    def constant_bytes(self) -> int:
        return super().constant_bytes + (0 if self.offsets is None else int(self.offsets.nbytes))

    # ----------------------------------------------------------------------------------

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, len(self.in_types))
        packed = embed_array(mod, f"{name}.packed_b", self.packed)
        colsum = embed_array(mod, f"{name}.colsum", self.colsum)
        offsets = None if self.offsets is None else embed_array(mod, f"{name}.offsets", self.offsets)
        groups = self.packed.shape[0] // GROUP
        kf.phase(self.m, 0.0, self._shift_row)  # cheap: on the calling thread

        def chunk(ctx: Ctx, c: Val) -> None:
            self._chunk(ctx, c, groups, packed, colsum, offsets)

        kf.phase(-(-self.m // MR) * groups, 2.0 * self.m * self.n * self.k, chunk)
        return kf.finish()

    def _shift_row(self, ctx: Ctx, r: Val) -> None:
        """Row ``r``: its minimum (the shift), whether it spans at most 255, and if so its uint8 copy."""
        b = ctx.b
        u_at, shift_at, flag_at, sum_at = self._layout()
        kp = 4 * self.kq
        row = b.gep(ctx.ins[self.c.lhs], [b.mul(r, const(self.k))], inbounds=True, source_etype=I32)
        lo, hi = min_max(b, row, self.k, b.load(row, typ=I32, align=4))
        fits = _spans_uint8(b, lo, hi)
        b.store(lo, _word(b, ctx.scratch, shift_at, r), align=4)
        b.store(b.zext(fits, I32), _word(b, ctx.scratch, flag_at, r), align=4)
        u_row = b.gep(ctx.scratch, [b.add(const(u_at), b.mul(r, const(kp)))], inbounds=True, source_etype=I8)

        def copy() -> None:
            def one(k: Val, total: list[Val]) -> list[Val]:
                x = b.load(b.gep(row, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
                u = b.sub(x, lo)
                b.store(b.trunc(u, I8), b.gep(u_row, [k], inbounds=True, source_etype=I8), align=1)
                return [b.add(total[0], u)]

            _, (total,) = counted_loop(b, "u", const(0), lambda k: b.icmp_signed("<", k, const(self.k)), 1, one,
                                       [ir.Constant(I32, 0)])
            b.store(total, _word(b, ctx.scratch, sum_at, r), align=4)
            for_range(b, self.k, kp, "upad", lambda k: b.store(ir.Constant(I8, 0), b.gep(
                u_row, [k], inbounds=True, source_etype=I8), align=1))

        if_then(b, fits, "fits", copy)

    def _chunk(self, ctx: Ctx, c: Val, groups: int, packed: Val, colsum: Val, offsets: Val | None) -> None:
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

        fits: Val = ir.Constant(I1, 1)
        for i in range(MR):
            r = imin(b, b.add(r0, const(i)), const(self.m - 1))
            flag = b.load(_word(b, ctx.scratch, flag_at, r), typ=I32, align=4)
            fits = b.and_(fits, b.icmp_signed("!=", flag, ir.Constant(I32, 0)))
        full = b.icmp_signed("==", rows, const(MR))
        vector, scalar, done = (ctx.fn.append_basic_block(f"int8.{x}") for x in ("vector", "scalar", "stored"))
        b.cbranch(fits, vector, scalar)

        b.position_at_end(vector)
        tiled, by_row = ctx.fn.append_basic_block("int8.tiled"), ctx.fn.append_basic_block("int8.rows")
        b.cbranch(full, tiled, by_row)
        b.position_at_end(tiled)
        self._micro(ctx, [b.add(r0, const(i)) for i in range(MR)], g, packed, colsum, offsets, tile, 0)
        b.branch(done)
        b.position_at_end(by_row)
        for_range(b, 0, rows, "row", lambda i: self._micro(ctx, [b.add(r0, i)], g, packed, colsum, offsets, tile, i))
        b.branch(done)

        b.position_at_end(scalar)
        self._scalar(ctx, r0, rows, n0, cols, packed, offsets, tile)
        b.branch(done)

        b.position_at_end(done)
        epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)

        def row(i: Val) -> None:
            def col(j: Val) -> None:
                acc = b.load(b.gep(tile, [b.add(b.mul(i, const(width)), j)], inbounds=True, source_etype=I32),
                             typ=I32, align=4)
                r, n = b.add(r0, i), b.add(n0, j)
                lead = [int(d) for d in self.out_type.shape[:-1]]  # the rows: the output's leading dims
                index = [r, n] if len(lead) == 1 else [*unravel(b, r, lead), n]
                epi.store(b.add(b.mul(r, const(self.n)), n), epi.element(index, acc))

            for_range(b, 0, cols, "col", col)

        for_range(b, 0, rows, "erow", row)

    def _micro(self, ctx: Ctx, rows: Sequence[Val], g: Val, packed: Val, colsum: Val, offsets: Val | None,
               tile: Val, first: Val | int) -> None:
        """``tile[first + i][...] = sum_k u[row_i, k] * w[k, column] + shift[row_i] * colsum[column]`` (and
        ``+ offset[column] * sum_k u[row_i, k]`` where the packed weights are offset)."""
        b = ctx.b
        u_at, shift_at, _, sum_at = self._layout()
        kp, kq = 4 * self.kq, self.kq
        dot = dot_quads(b, self.how)
        block0 = b.mul(g, const(GROUP))
        u_rows = [b.gep(ctx.scratch, [b.add(const(u_at), b.mul(r, const(kp)))], inbounds=True, source_etype=I8)
                  for r in rows]
        acc = [ir.Constant(V16, None)] * (len(rows) * GROUP)
        for half in range(self.halves):  # each half of the weights against the same row
            panels = [b.gep(packed, [b.add(b.mul(b.add(block0, const(j)), const(self.halves * kq * 64)),
                                           const(half * kq * 64))], inbounds=True, source_etype=I8)
                      for j in range(GROUP)]

            def step(q: Val, acc: list[Val], panels: Sequence[Val] = panels) -> list[Val]:
                out = list(acc)
                bv = [b.load(b.gep(p, [b.mul(q, const(64))], inbounds=True, source_etype=I8), typ=V64, align=64)
                      for p in panels]
                for i, u in enumerate(u_rows):
                    quad = b.load(b.gep(u, [b.mul(q, const(4))], inbounds=True, source_etype=I8), typ=I32, align=4)
                    av = b.bitcast(splat(b, quad, LANES), V64)
                    for j in range(GROUP):
                        out[i * GROUP + j] = dot(out[i * GROUP + j], av, bv[j])
                return out

            _, acc = counted_loop(b, "kq", const(0), lambda q: b.icmp_signed("<", q, const(kq)), 1, step, acc)
        base = const(first) if isinstance(first, int) else first
        for i, r in enumerate(rows):
            shift = splat(b, b.load(_word(b, ctx.scratch, shift_at, r), typ=I32, align=4), LANES)
            for j in range(GROUP):
                col = b.add(b.mul(block0, const(LANES)), const(j * LANES))
                sums = b.load(b.gep(colsum, [col], inbounds=True, source_etype=I32), typ=V16, align=64)
                value = b.add(acc[i * GROUP + j], b.mul(shift, sums))
                if offsets is not None:
                    row_sum = splat(b, b.load(_word(b, ctx.scratch, sum_at, r), typ=I32, align=4), LANES)
                    offset = b.load(b.gep(offsets, [col], inbounds=True, source_etype=I32), typ=V16, align=64)
                    value = b.add(value, b.mul(offset, row_sum))
                at = b.add(b.mul(b.add(base, const(i)), const(GROUP * LANES)), const(j * LANES))
                b.store(value, b.gep(tile, [at], inbounds=True, source_etype=I32), align=64)

    def _scalar(self, ctx: Ctx, r0: Val, rows: Val, n0: Val, cols: Val, packed: Val, offsets: Val | None,
                tile: Val) -> None:
        """The rule's own int32 sums, for rows that do not fit uint8 after their shift."""
        b = ctx.b
        kq = self.kq

        def row(i: Val) -> None:
            a_row = b.gep(ctx.ins[self.c.lhs], [b.mul(b.add(r0, i), const(self.k))], inbounds=True,
                          source_etype=I32)

            def col(j: Val) -> None:
                n = b.add(n0, j)
                panel = b.gep(packed, [b.add(b.mul(b.udiv(n, const(LANES)), const(self.halves * kq * 64)),
                                             b.mul(b.urem(n, const(LANES)), const(4)))],
                              inbounds=True, source_etype=I8)

                def term(k: Val, acc: list[Val]) -> list[Val]:
                    a = b.load(b.gep(a_row, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
                    at = b.add(b.mul(b.udiv(k, const(4)), const(64)), b.urem(k, const(4)))
                    w = _weight(b, panel, at, kq * 64, self.halves)
                    if offsets is not None:
                        w = b.add(w, b.load(b.gep(offsets, [n], inbounds=True, source_etype=I32), typ=I32, align=4))
                    return [b.add(acc[0], b.mul(a, w))]

                _, (s,) = counted_loop(b, "sk", const(0), lambda k: b.icmp_signed("<", k, const(self.k)), 1, term,
                                       [ir.Constant(I32, 0)])
                b.store(s, b.gep(tile, [b.add(b.mul(i, const(GROUP * LANES)), j)], inbounds=True,
                                 source_etype=I32), align=4)

            for_range(b, 0, cols, "scol", col)

        for_range(b, 0, rows, "srow", row)


def _weight(b: Builder, base: Val, at: Val, half_bytes: int, halves: int) -> Val:
    """The int32 weight at ``base + at`` whose halves lie ``half_bytes`` apart: their sum."""
    w: Val = ir.Constant(I32, 0)
    for half in range(halves):
        byte = b.load(b.gep(base, [b.add(at, const(half * half_bytes))], inbounds=True, source_etype=I8), typ=I8,
                      align=1)
        w = b.add(w, b.sext(byte, I32))
    return w


def _word(b: Builder, base: Val, at: int, index: Val | int = 0) -> Val:
    """``&((int32*)(base + at))[index]``: a per-row (or per-tensor) word of a kernel's scratch."""
    word = b.gep(base, [const(at)], inbounds=True, source_etype=I8)
    return b.gep(word, [const(index) if isinstance(index, int) else index], inbounds=True, source_etype=I32)


def _spans_uint8(b: Builder, lo: Val, hi: Val) -> Val:
    """Whether every value in ``[lo, hi]`` fits uint8 once ``lo`` is subtracted."""
    return b.icmp_unsigned("<=", b.sub(b.sext(hi, I64), b.sext(lo, I64)), const(255))


def vnni_matmul(op: str, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                rhs: np.ndarray | None) -> VnniMatmulKernel | None:
    """The VNNI kernel for an int32 ``matmul`` of a run-time ``[..., M, K]`` (its leading dims are more rows) and
    a constant 2-D rhs whose columns each span at most 256 values (:func:`column_offsets`) or whose values lie in
    [-256, 254] (:func:`int8_halves`), or None."""
    if c.op != "matmul" or rhs is None or c.attrs.get("transpose_a"):
        return None
    if c.lhs_type.rank < 2 or c.rhs_type.rank != 2 or c.rhs == c.lhs:
        return None
    if any(t.dtype is not DType.i32 for t in (c.lhs_type, c.rhs_type, c.out_type)):
        return None
    w = np.asarray(rhs)
    if not np.issubdtype(w.dtype, np.integer) or host_int8_dot() is None:
        return None
    w_nk = w if c.attrs.get("transpose_b") else w.T
    m, k = math.prod(int(d) for d in c.lhs_type.shape[:-1]), int(c.lhs_type.shape[-1])
    n = int(w_nk.shape[0])
    if math.prod((m, n, k)) == 0:
        return None
    offsets = None if fits_int8(w_nk) else column_offsets(w_nk)
    if offsets is not None:  # one int8 weight per weight, less its column's offset
        packed, _ = pack_vnni((w_nk.astype(np.int64) - offsets[:n, None]).astype(np.int32))
        colsum = np.zeros(packed.shape[0] * LANES, dtype=np.int32)
        colsum[:n] = w_nk.astype(np.int64).sum(axis=1).astype(np.int32)
        return VnniMatmulKernel(op, c, tuple(in_types), out_type, packed, colsum, 1, m, n, k, offsets)
    halves = int8_halves(w_nk)
    if not halves:
        return None
    packed, colsum = pack_vnni(w_nk, halves)
    return VnniMatmulKernel(op, c, tuple(in_types), out_type, packed, colsum, halves, m, n, k)


# --------------------------------------------------------------------------------------
# convolution: output pixels in the lanes


CONV_MR = 4
"""Output channels per register tile (their weights are broadcast)."""

CONV_NV = 4
"""Most vectors of sixteen output pixels per register tile."""


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution's geometry (groups of one), and the planes its shifted input is laid out in.

    For stride ``(sy, sx)`` the padded input is split into ``sy * sx`` phase planes (row ``yp`` and
    column ``xp`` go to plane ``(yp % sy, xp % sx)`` at ``(yp // sy, xp // sx)``), each ``wq`` quads
    wide. Output pixel ``(oy, ox)`` is numbered ``p = oy * wq + ox``: for tap ``(ky, kx)`` it reads
    plane ``(ky*dy % sy, kx*dx % sx)`` at quad ``p + (ky*dy // sy) * wq + kx*dx // sx``, so sixteen
    consecutive ``p`` read sixteen consecutive quads. Numbers with ``ox >= ow`` are computed and dropped
    (``wq - ow`` per row: the width of the window past the row)."""

    n: int
    c: int
    h: int
    w: int
    co: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]  # top, left
    dilation: tuple[int, int]

    @property
    def c4(self) -> int:
        return -(-self.c // 4)

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    @property
    def wq(self) -> int:
        """Quads per row of a plane: every column of the row a window reads."""
        return self.ow + (self.kw - 1) * self.dilation[1] // self.stride[1]

    @property
    def hq(self) -> int:
        return self.oh + (self.kh - 1) * self.dilation[0] // self.stride[0]

    @property
    def pixels(self) -> int:
        """Numbers ``p`` computed per image (valid ones and the dropped ones between rows)."""
        return self.oh * self.wq

    @property
    def nv(self) -> int:
        return min(CONV_NV, -(-self.pixels // LANES))

    @property
    def pixel_groups(self) -> int:
        """Register tiles over an image's pixel numbers."""
        vectors = -(-self.pixels // LANES)
        return -(-vectors // self.nv)

    @property
    def plane_quads(self) -> int:
        """A plane's quads, with room for the last tile's whole vectors past the last row."""
        return self.hq * self.wq + self.nv * LANES + self.wq

    @property
    def phases(self) -> int:
        return self.stride[0] * self.stride[1]

    @property
    def quad_bytes(self) -> int:
        """Bytes of one channel quad's planes."""
        return self.phases * self.plane_quads * 4

    @property
    def image_bytes(self) -> int:
        return self.c4 * self.quad_bytes


def pack_conv_weights(w: np.ndarray, halves: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``w[co, c, kh, kw]`` (int8 values, or split in ``halves`` of them) -> ``[co, kh*kw, halves*ceil(c/4)*4]``
    int8 (channels zero padded to quads, a tap's halves one after the other: one broadcast per output
    channel, tap, half and quad) and the int32 sums of ``w`` over each output channel."""
    co, c, kh, kw = w.shape
    c4 = -(-c // 4)
    packed = np.zeros((co, kh * kw, halves * c4 * 4), dtype=np.int8)
    for half, part in enumerate((w,) if halves == 1 else split_int8(w)):
        packed[:, :, half * c4 * 4:half * c4 * 4 + c] = part.reshape(co, c, kh * kw).transpose(0, 2, 1)
    return packed, w.astype(np.int64).reshape(co, -1).sum(axis=1).astype(np.int32)


@dataclass(frozen=True)
class VnniConvKernel(_IntegerProduct):
    """``i32 name(ptr out, ptr x, ..., ptr scratch)`` for a 2-D int32 ``conv`` (groups of one) of a run-time
    input by constant int8-valued weights, and its fused epilogue.

    The input is shifted by its minimum (zero included: the padding) into uint8, laid out in phase
    planes (:class:`ConvShape`) so that sixteen consecutive output pixel numbers of a tap read sixteen
    consecutive quads; each output channel's weights for a tap and quad are broadcast. The correction
    is ``shift * sum(w[co])`` per output channel. An input spanning more than 255 values takes the
    rule's scalar sums."""

    g: ConvShape

    @property
    def name(self) -> str:
        return f"int8.{self.how}.conv.{CONV_MR}x{self.g.nv * LANES}{'.halves' if self.halves == 2 else ''}"

    def _layout(self) -> tuple[int, int, int]:
        """Scratch offsets: the shift, the 'fits' flag, the shifted input."""
        return 0, 4, _aligned(8)

    @property
    def scratch_bytes(self) -> int:
        return self._layout()[2] + _aligned(self.g.n * self.g.image_bytes)

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        g = self.g
        kf = KernelFunction(mod, name, len(self.in_types))
        packed = embed_array(mod, f"{name}.packed_w", self.packed)
        colsum = embed_array(mod, f"{name}.colsum", self.colsum)
        kf.phase(1, 0.0, self._shift)
        kf.phase(g.n * g.c4, float(g.n * g.c * g.h * g.w) * 8, self._lay_out)
        blocks = -(-g.co // CONV_MR)
        pgroups = g.pixel_groups

        def chunk(ctx: Ctx, c: Val) -> None:
            self._chunk(ctx, c, blocks, pgroups, packed, colsum)

        kf.phase(g.n * blocks * pgroups, 2.0 * g.n * g.co * g.oh * g.ow * g.c * g.taps, chunk)
        return kf.finish()

    def _scratch_i32(self, ctx: Ctx, at: int) -> Val:
        return ctx.b.load(_word(ctx.b, ctx.scratch, at), typ=I32, align=4)

    def _shift(self, ctx: Ctx, _c: Val) -> None:
        """The input's minimum with zero (the shift) and whether everything fits 255 above it."""
        b = ctx.b
        g = self.g
        shift_at, flag_at, _ = self._layout()
        lo, hi = min_max(b, ctx.ins[self.c.lhs], g.n * g.c * g.h * g.w, ir.Constant(I32, 0))
        b.store(lo, _word(b, ctx.scratch, shift_at), align=4)
        b.store(b.zext(_spans_uint8(b, lo, hi), I32), _word(b, ctx.scratch, flag_at), align=4)

    def _lay_out(self, ctx: Ctx, c: Val) -> None:
        """Image ``c / c4``, channel quad ``c % c4``: its planes, the padding (and what no window reads) as the
        shifted zero."""
        b = ctx.b
        g = self.g
        shift_at, flag_at, u_at = self._layout()
        sy, sx = g.stride
        top, left = g.pad
        lo = self._scratch_i32(ctx, shift_at)
        fits = b.icmp_signed("!=", self._scratch_i32(ctx, flag_at), ir.Constant(I32, 0))
        n, q = b.udiv(c, const(g.c4)), b.urem(c, const(g.c4))
        planes = b.gep(ctx.scratch, [b.add(const(u_at), b.add(b.mul(n, const(g.image_bytes)),
                                                             b.mul(q, const(g.quad_bytes))))],
                       inbounds=True, source_etype=I8)
        memset = declare(b.module, "llvm.memset.p0.i64", ir.VoidType(), [ir.PointerType(), I8, I64, I1])
        x_img = b.gep(ctx.ins[self.c.lhs], [b.mul(n, const(g.c * g.h * g.w))], inbounds=True, source_etype=I32)
        rows = min(g.h, g.hq * sy - top)  # input rows some window reads
        cols = min(g.w, g.wq * sx - left)

        def fill() -> None:
            b.call(memset, [planes, b.trunc(b.sub(ir.Constant(I32, 0), lo), I8), const(g.quad_bytes),
                            ir.Constant(I1, 0)])

            def row(y: Val) -> None:
                yp = b.add(y, const(top))
                plane_row = b.add(b.mul(b.urem(yp, const(sy)), const(sx * g.plane_quads)),
                                  b.mul(b.udiv(yp, const(sy)), const(g.wq)))

                def quad_byte(x: Val, t: int) -> Val:
                    xp = b.add(x, const(left))
                    quad = b.add(plane_row, b.add(b.mul(b.urem(xp, const(sx)), const(g.plane_quads)),
                                                  b.udiv(xp, const(sx))))
                    return b.gep(planes, [b.add(b.mul(quad, const(4)), const(t))], inbounds=True, source_etype=I8)

                def shifted(t: int, x: Val) -> Val:
                    ch = b.add(b.mul(q, const(4)), const(t))
                    src = b.gep(x_img, [b.add(b.mul(ch, const(g.h * g.w)), b.add(b.mul(y, const(g.w)), x))],
                                inbounds=True, source_etype=I32)
                    return b.trunc(b.sub(b.load(src, typ=I32, align=4), lo), I8)

                def whole_quad() -> None:
                    """All four channels a column at a time: the four byte stores next to each other, which
                    vectorize as one interleaved group (a loop per channel stored every fourth byte, and
                    LLVM unrolled each into a scatter of single bytes)."""
                    def column(x: Val) -> None:
                        for t in range(4):
                            b.store(shifted(t, x), quad_byte(x, t), align=1)

                    for_range(b, 0, cols, "x", column)

                def channels() -> None:
                    for t in range(4):
                        ch = b.add(b.mul(q, const(4)), const(t))

                        def channel(t: int = t) -> None:
                            for_range(b, 0, cols, "x", lambda x: b.store(shifted(t, x), quad_byte(x, t), align=1))

                        if_then(b, b.icmp_signed("<", ch, const(g.c)), f"ch{t}", channel)

                if g.c % 4 == 0:
                    whole_quad()
                else:  # the last quad holds fewer than four channels
                    if_else(b, b.icmp_signed("<", q, const(g.c4 - 1)), "whole", whole_quad, channels)

            for_range(b, 0, rows, "y", row)

        if_then(b, fits, "fits", fill)

    def _chunk(self, ctx: Ctx, c: Val, blocks: int, pgroups: int, packed: Val, colsum: Val) -> None:
        """Image, block of CONV_MR output channels, group of pixel vectors: accumulate, then the epilogue."""
        b = ctx.b
        g = self.g
        flag_at = self._layout()[1]
        width = g.nv * LANES
        tile = ctx.entry_alloca(ir.ArrayType(I32, CONV_MR * width), "tile")
        p0 = b.mul(b.urem(c, const(pgroups)), const(width))
        rest = b.udiv(c, const(pgroups))
        co0 = b.mul(b.urem(rest, const(blocks)), const(CONV_MR))
        n = b.udiv(rest, const(blocks))
        rows = imin(b, const(CONV_MR), b.sub(const(g.co), co0))
        count = imin(b, const(width), b.sub(const(g.pixels), p0))
        fits = b.icmp_signed("!=", self._scratch_i32(ctx, flag_at), ir.Constant(I32, 0))
        vector, scalar, done = (ctx.fn.append_basic_block(f"conv8.{x}") for x in ("vector", "scalar", "stored"))
        b.cbranch(fits, vector, scalar)
        b.position_at_end(vector)
        self._micro(ctx, n, co0, p0, packed, colsum, tile)
        b.branch(done)
        b.position_at_end(scalar)
        self._scalar(ctx, n, co0, p0, rows, count, packed, tile)
        b.branch(done)
        b.position_at_end(done)
        epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)

        end = b.add(p0, count)
        first_row, last_row = b.udiv(p0, const(g.wq)), b.udiv(b.sub(end, const(1)), const(g.wq))

        def row(i: Val) -> None:
            co = b.add(co0, i)
            plane = b.mul(b.add(b.mul(n, const(g.co)), co), const(g.oh * g.ow))
            tile_row = b.gep(tile, [b.mul(i, const(width))], inbounds=True, source_etype=I32)

            def output_row(oy: Val) -> None:  # the row's pixels inside this tile: contiguous, no division
                start = b.mul(oy, const(g.wq))
                x_lo = b.select(b.icmp_signed(">", p0, start), b.sub(p0, start), const(0))
                x_hi = imin(b, const(g.ow), b.sub(end, start))
                out_row = b.add(plane, b.mul(oy, const(g.ow)))
                at = b.sub(start, p0)

                def pixel(ox: Val) -> None:
                    acc = b.load(b.gep(tile_row, [b.add(at, ox)], inbounds=True, source_etype=I32), typ=I32, align=4)
                    epi.store(b.add(out_row, ox), epi.element([n, co, oy, ox], acc))

                for_range(b, x_lo, x_hi, "px", pixel)

            for_range(b, first_row, b.add(last_row, const(1)), "orow", output_row)

        for_range(b, 0, rows, "oc", row)

    def _micro(self, ctx: Ctx, n: Val, co0: Val, p0: Val, packed: Val, colsum: Val, tile: Val) -> None:
        """``tile[i][k] = sum u * w + shift * colsum[co0 + i]`` for CONV_MR channels (the last clamped) and
        ``nv`` vectors of pixel numbers from ``p0``."""
        b = ctx.b
        g = self.g
        shift_at, _, u_at = self._layout()
        sy, sx = g.stride
        dy, dx = g.dilation
        nv, width = g.nv, g.nv * LANES
        dot = dot_quads(b, self.how)
        image = b.gep(ctx.scratch, [b.add(const(u_at), b.mul(n, const(g.image_bytes)))], inbounds=True,
                      source_etype=I8)
        cos = [imin(b, b.add(co0, const(i)), const(g.co - 1)) for i in range(CONV_MR)]
        tap_bytes = self.halves * g.c4 * 4
        w_rows = [b.gep(packed, [b.mul(co, const(g.taps * tap_bytes))], inbounds=True, source_etype=I8) for co in cos]

        def tap(t: Val, acc: list[Val]) -> list[Val]:
            kyd, kxd = b.mul(b.udiv(t, const(g.kw)), const(dy)), b.mul(b.urem(t, const(g.kw)), const(dx))
            plane = b.add(b.mul(b.urem(kyd, const(sy)), const(sx)), b.urem(kxd, const(sx)))
            quad = b.add(b.add(b.mul(plane, const(g.plane_quads)), p0),
                         b.add(b.mul(b.udiv(kyd, const(sy)), const(g.wq)), b.udiv(kxd, const(sx))))
            a0 = b.gep(image, [b.mul(quad, const(4))], inbounds=True, source_etype=I8)
            for half in range(self.halves):  # each half of the weights against the same input
                w_tap = [b.gep(w, [b.add(b.mul(t, const(tap_bytes)), const(half * g.c4 * 4))], inbounds=True,
                               source_etype=I8) for w in w_rows]

                def channel_quad(q: Val, acc: list[Val], w_tap: Sequence[Val] = w_tap) -> list[Val]:
                    out = list(acc)
                    a_q = b.gep(a0, [b.mul(q, const(g.quad_bytes))], inbounds=True, source_etype=I8)
                    av = [b.load(b.gep(a_q, [const(64 * j)], inbounds=True, source_etype=I8), typ=V64, align=4)
                          for j in range(nv)]
                    for i, w in enumerate(w_tap):
                        wq = b.load(b.gep(w, [b.mul(q, const(4))], inbounds=True, source_etype=I8), typ=I32, align=4)
                        wv = b.bitcast(splat(b, wq, LANES), V64)
                        for j in range(nv):
                            out[i * nv + j] = dot(out[i * nv + j], av[j], wv)
                    return out

                _, acc = counted_loop(b, "cq", const(0), lambda q: b.icmp_signed("<", q, const(g.c4)), 1,
                                      channel_quad, acc)
            return acc

        _, acc = counted_loop(b, "tap", const(0), lambda t: b.icmp_signed("<", t, const(g.taps)), 1, tap,
                              [ir.Constant(V16, None)] * (CONV_MR * nv))
        shift = self._scratch_i32(ctx, shift_at)
        for i, co in enumerate(cos):
            total = b.load(b.gep(colsum, [co], inbounds=True, source_etype=I32), typ=I32, align=4)
            fix = splat(b, b.mul(shift, total), LANES)
            for j in range(nv):
                b.store(b.add(acc[i * nv + j], fix), b.gep(tile, [const(i * width + j * LANES)], inbounds=True,
                                                           source_etype=I32), align=64)

    def _scalar(self, ctx: Ctx, n: Val, co0: Val, p0: Val, rows: Val, count: Val, packed: Val, tile: Val) -> None:
        """The rule's own int32 sums (zero outside the input), for an input that does not fit uint8 after its shift."""
        b = ctx.b
        g = self.g
        sy, sx = g.stride
        dy, dx = g.dilation
        top, left = g.pad
        width = g.nv * LANES
        x_img = b.gep(ctx.ins[self.c.lhs], [b.mul(n, const(g.c * g.h * g.w))], inbounds=True, source_etype=I32)

        def row(i: Val) -> None:
            tap_bytes = self.halves * g.c4 * 4
            w_row = b.gep(packed, [b.mul(b.add(co0, i), const(g.taps * tap_bytes))], inbounds=True, source_etype=I8)

            def col(k: Val) -> None:
                p = b.add(p0, k)
                oy, ox = b.udiv(p, const(g.wq)), b.urem(p, const(g.wq))

                def term(k: Val, acc: list[Val]) -> list[Val]:
                    t, ch = b.udiv(k, const(g.c)), b.urem(k, const(g.c))
                    ky, kx = b.udiv(t, const(g.kw)), b.urem(t, const(g.kw))
                    y = b.sub(b.add(b.mul(oy, const(sy)), b.mul(ky, const(dy))), const(top))
                    x = b.sub(b.add(b.mul(ox, const(sx)), b.mul(kx, const(dx))), const(left))
                    inside = b.and_(b.icmp_unsigned("<", y, const(g.h)), b.icmp_unsigned("<", x, const(g.w)))
                    at = b.add(b.mul(ch, const(g.h * g.w)), b.add(b.mul(imin(b, y, const(g.h - 1)), const(g.w)),
                                                                  imin(b, x, const(g.w - 1))))
                    safe = b.select(inside, at, const(0))
                    v = b.load(b.gep(x_img, [safe], inbounds=True, source_etype=I32), typ=I32, align=4)
                    wv = _weight(b, w_row, b.add(b.mul(t, const(tap_bytes)), ch), g.c4 * 4, self.halves)
                    return [b.add(acc[0], b.select(inside, b.mul(v, wv), ir.Constant(I32, 0)))]

                _, (s,) = counted_loop(b, "ck", const(0), lambda k: b.icmp_signed("<", k, const(g.taps * g.c)), 1,
                                       term, [ir.Constant(I32, 0)])
                b.store(s, b.gep(tile, [b.add(b.mul(i, const(width)), k)], inbounds=True, source_etype=I32), align=4)

            for_range(b, 0, count, "scol", col)

        for_range(b, 0, rows, "srow", row)


def min_max(b: Builder, data: Val, count: int, seed: Val) -> tuple[Val, Val]:
    """The smallest and largest of ``count`` int32 values at ``data`` and ``seed``."""
    smin = declare(b.module, "llvm.smin.i32", I32, [I32, I32])
    smax = declare(b.module, "llvm.smax.i32", I32, [I32, I32])

    def step(k: Val, carried: list[Val]) -> list[Val]:
        x = b.load(b.gep(data, [k], inbounds=True, source_etype=I32), typ=I32, align=4)
        return [b.call(smin, [carried[0], x]), b.call(smax, [carried[1], x])]

    _, (lo, hi) = counted_loop(b, "minmax", const(0), lambda k: b.icmp_signed("<", k, const(count)), 1, step,
                               [seed, seed])
    return lo, hi


def vnni_conv(op: str, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
              weights: np.ndarray | None) -> VnniConvKernel | None:
    """The VNNI kernel for an int32 2-D ``conv`` (groups of one) whose constant weights hold values in [-256, 254]
    (:func:`int8_halves`), or None."""
    if c.op != "conv" or weights is None or int(c.attrs.get("groups", 1)) != 1:
        return None
    if c.lhs_type.rank != 4 or any(t.dtype is not DType.i32 for t in (c.lhs_type, c.rhs_type, c.out_type)):
        return None
    w = np.asarray(weights)
    halves = int8_halves(w) if np.issubdtype(w.dtype, np.integer) else 0
    if not halves or host_int8_dot() is None:
        return None
    from cuvil.ir.ops.nn import window_params

    s, pb, _pe, d = window_params(2, c.attrs.get("strides", ()), c.attrs.get("pads", ()), c.attrs.get("dilations", ()))
    if any(p < 0 for p in pb):
        return None
    n, ch, h, wd = (int(x) for x in c.lhs_type.shape)
    co, _, kh, kw = w.shape
    oh, ow = (int(x) for x in c.out_type.shape[2:])
    g = ConvShape(n, ch, h, wd, int(co), int(kh), int(kw), oh, ow, (int(s[0]), int(s[1])), (int(pb[0]), int(pb[1])),
                  (int(d[0]), int(d[1])))
    if g.n * g.image_bytes > MAX_SCRATCH:
        return None
    packed, colsum = pack_conv_weights(w, halves)
    return VnniConvKernel(op, c, tuple(in_types), out_type, packed, colsum, halves, g)


MAX_SCRATCH = 64 << 20
"""Largest shifted input a conv kernel keeps in its scratch."""
