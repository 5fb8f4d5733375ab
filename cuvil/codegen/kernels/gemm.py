"""GEMM as a schedule of matmul's rule ``out[..., i, j] = sum_k a[..., i, k] * b[..., k, j]``.

The schedule: the output is cut into ``MR x NR`` register tiles (``NR = nv`` vectors of the
host's width: 16 floats with AVX-512, 8 with AVX2); a tile's accumulators live in registers for
a whole block of ``k`` while the micro-kernel broadcasts one A element per row and loads ``nv``
B vectors per step, with one ``llvm.fma`` per accumulator. Tiles are grouped into blocks
(``mb_tiles x nb_tiles`` tiles over a ``kc`` slice of K) sized for L1/L2; a block is one unit of
parallel work. A constant operand is packed at compile time (:mod:`.pack`); a non-constant B is
read in place (row-major) or packed per tile at run time (transposed, or N known only at run
time). Results go through the
op's epilogue (:mod:`.epilogue`) on their way to memory.

:class:`GemmCore` is the engine; :class:`MatmulKernel` applies it to ``matmul`` (and fused
matmul epilogues); :mod:`.conv` applies it to convolution.

In a function compiled for a shape class, any of M, N, K and the batch dims may be known only at
run time (:class:`RunTimeDims`): attention's ``Q @ K^T`` and ``P @ V``, or symbolic leading dims
of a linear layer's input seen as one row dim by :func:`rows_view`. The schedule is the same: the
tiling is chosen for the sizes' largest values, edge rows and columns are cut at run time anyway,
and a B read in place whose N is symbolic is packed per tile (its last tile's mask would depend on
N). Sizes are dims (:class:`cuvil.ir.symbolic.Sym`) until the code is emitted: the kernel reads
them, and the tile, block and chunk counts, strides and offsets that follow from them, from a
trailing ``ptr dims`` argument, once per call; the number of chunks and whether they go to the
pool (:meth:`KernelFunction.phase`) are decided per call, an empty output runs nothing, and K = 0
stores the epilogue of a zero sum. At static shapes those dims are numbers, and the emitted code
is exactly what it was before the run-time variant existed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.dims import DimValues
from cuvil.codegen.kernels.epilogue import Contraction, EpilogueEmitter, is_identity_index, reads_operand
from cuvil.codegen.kernels.pack import embed_array, pack_b_panels
from cuvil.codegen.kernels.threads import TASK_TYPE, note_pooled_work, thread_pool
from cuvil.codegen.llvm_types import BF16, F16, F32, I1, I32, I64, PTR, declare
from cuvil.codegen.loops import (
    MASKED_TAIL,
    NO_UNROLL,
    OUTER_ONLY,
    const,
    counted_loop,
    for_range,
    i64,
    if_else,
    if_then,
    imin,
    opaque_alloca,
    unravel,
)
from cuvil.codegen.lower_rule import Buffer, ErfBlocks
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.target import codegen_target
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.rulewalk import FreeVars, walk_exprs
from cuvil.ir.symbolic import Dim, evaluate_dim, sym_max
from cuvil.ir.types import TensorType

PARALLEL_MIN_FLOPS = 2_000_000
"""Below this much work a kernel runs on the calling thread: waking the pool costs more."""

STREAM_FLOPS_PER_BYTE = 4
"""What reading one byte of a product's B operand weighs in flops (the 1024³ GEMM's rate over a core's
bandwidth from L3 is about 6): a matrix-vector product does two flops per weight it reads, so its flops
understate its time; counted by the bytes it streams, a 784x512 one (1.6 MB) goes to the pool."""


def product_work(m: int, n: int, k: int) -> float:
    """The work of an ``m x k`` by ``k x n`` product, in flops, against :data:`PARALLEL_MIN_FLOPS`: its
    multiply-adds, or the bytes of B it reads at :data:`STREAM_FLOPS_PER_BYTE`, whichever is larger."""
    return max(2.0 * m * n * k, STREAM_FLOPS_PER_BYTE * 4.0 * k * n)


# --------------------------------------------------------------------------------------
# the vector ISA


@dataclass(frozen=True)
class Isa:
    """The vector width kernels are written for."""

    name: str
    lanes: int
    tiles: tuple[tuple[int, int], ...]  # register tiles (rows, vectors) that fit the register file
    other_tile_gain: float = 1.0
    """How much less padded work another tile must compute than the first before it is chosen
    (:func:`choose_tiling`; 1: whichever pads least)."""


ISAS = {
    "avx512": Isa("avx512", 16, ((6, 4), (8, 3))),  # 24 accumulators of 32 zmm
    # 12 of 16 ymm. 4x3 only where it pads a tenth less: on a Zen 3, one thread, a 1x1 convolution at 56x56 whose
    # input panels are copied (MobileNet-v1's, which 4x3 pads 0.25 % less) took 1.2 and 2.6 ms in 4x3 against
    # 0.59 and 1.33 in 6x2 (ONNX Runtime 0.72 and 1.49; the network, profiled, 17.8 -> 15.9 ms), and no layer of
    # it or of ResNet-18 measured faster in 4x3 by more than 3 %
    "avx2": Isa("avx2", 8, ((6, 2), (4, 3)), other_tile_gain=1.1),
    "sse": Isa("sse", 4, ((4, 2),)),
    "neon": Isa("neon", 4, ((8, 3), (6, 4))),  # 24 accumulators of 32 q registers
    "simd128": Isa("simd128", 4, ((4, 3),)),  # wasm: 12 of the 16 xmm registers a JIT maps it to
}

_forced_isa: Isa | None = None


def host_isa() -> Isa:
    """The vectors of the target being compiled for (the host outside a build): AVX-512 when it has
    it, else AVX2 + FMA, NEON's 32 registers on aarch64, else 4-lane vectors (``force_isa`` overrides)."""
    if _forced_isa is not None:
        return _forced_isa
    target = codegen_target()
    if target.has("avx512f"):
        return ISAS["avx512"]
    if target.has("avx2", "fma"):
        return ISAS["avx2"]
    if target.arch == "aarch64" and target.has("neon"):
        return ISAS["neon"]
    if target.arch == "wasm32" and target.has("simd128"):
        return ISAS["simd128"]
    return ISAS["sse"]


def force_isa(name: str | None) -> None:
    """Write kernels for ``name`` (a key of ``ISAS``) instead of the host's best; None restores it."""
    global _forced_isa
    _forced_isa = ISAS[name] if name is not None else None


# --------------------------------------------------------------------------------------
# small IR helpers


def fgep(b: Builder, ptr: Val, offset: Val | int, inbounds: bool = True) -> Val:
    """``&((float*)ptr)[offset]``; ``inbounds=False`` for an address only fetched ahead, which may lie past
    the object (a prefetch never faults; an ``inbounds`` address past the object would be poison)."""
    off = const(offset) if isinstance(offset, int) else offset
    return b.gep(ptr, [off], inbounds=inbounds, source_etype=F32)


def hgep(b: Builder, ptr: Val, offset: Val | int) -> Val:
    """``&((half*)ptr)[offset]``."""
    off = const(offset) if isinstance(offset, int) else offset
    return b.gep(ptr, [off], inbounds=True, source_etype=F16)


def vec_type(lanes: int) -> ir.VectorType:
    return ir.VectorType(F32, lanes)


def splat(b: Builder, x: Val, lanes: int) -> Val:
    """``lanes`` copies of the scalar ``x`` (of any element type)."""
    vt = ir.VectorType(x.type, lanes)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


_products_rounded: ContextVar[bool] = ContextVar("products_rounded", default=False)


@contextlib.contextmanager
def products_rounded() -> Iterator[None]:
    """Kernels written inside round each product before adding it, as the rule does, instead of fusing
    the two: for operands whose products need not be exact in float32 (bfloat16 shares float32's
    exponent range, so its products can overflow or fall below float32's subnormals, where a fused
    multiply-add and the rule's product-then-sum give different results)."""
    token = _products_rounded.set(True)
    try:
        yield
    finally:
        _products_rounded.reset(token)


_pool_threads: ContextVar[int] = ContextVar("pool_threads", default=2)


@contextlib.contextmanager
def pool_threads(n: int) -> Iterator[None]:
    """Kernels written inside cut their blocks for a pool of ``n`` threads (:func:`_even_split`): the size
    a library is compiled with, else the size a pool started in the compiling process takes
    (:func:`.threads.default_pool_size`: the pool's size at run time where the library was built). Outside, two."""
    token = _pool_threads.set(max(1, int(n)))
    try:
        yield
    finally:
        _pool_threads.reset(token)


def pool_size() -> int:
    """The pool size kernels are being written for (:func:`pool_threads`)."""
    return _pool_threads.get()


_bf16_pairs: ContextVar[bool] = ContextVar("bf16_pairs", default=False)


@contextlib.contextmanager
def bf16_pairs() -> Iterator[None]:
    """Kernels written inside read each 32-bit element of A and B as a pair of bfloat16 (K in pairs) and
    add a step with ``vdpbf16ps``, from -0.0: ``bf16_matmul``'s rule (a ``dot_ftz`` of each pair, odd
    term first) on the float32 GEMM's blocking, with K counted in pairs."""
    token = _bf16_pairs.set(True)
    try:
        yield
    finally:
        _bf16_pairs.reset(token)


def paired() -> bool:
    """Whether kernels are being written for bfloat16 pairs (:func:`bf16_pairs`)."""
    return _bf16_pairs.get()


def fused() -> bool:
    """Whether :func:`fma` fuses here: the target has the instruction and products need no rounding."""
    return codegen_target().fused_multiply_add and not _products_rounded.get()


def dot_bf16_pairs(b: Builder, x: Val, y: Val, acc: Val) -> Val:
    """``vdpbf16ps``: each lane of ``acc`` plus the products of the two bfloat16 in the same lane of ``x``
    and ``y`` (float32 vectors of 16 lanes, read as 32 bfloat16), odd one first, flushing subnormals."""
    assert isinstance(x.type, ir.VectorType), "vdpbf16ps works on vectors"
    pairs = ir.VectorType(BF16, 2 * x.type.count)
    fn = declare(b.module, f"llvm.x86.avx512bf16.dpbf16ps.{32 * x.type.count}", acc.type, [acc.type, pairs, pairs])
    return b.call(fn, [acc, b.bitcast(x, pairs), b.bitcast(y, pairs)])


def fma(b: Builder, x: Val, y: Val, acc: Val) -> Val:
    """``x * y + acc`` on float32 vectors or scalars: fused where :func:`fused` says so, else a multiply
    and an add (each rounded, as the rule's product and sum are); on bfloat16 pairs (:func:`bf16_pairs`)
    one ``vdpbf16ps``."""
    if paired():
        return dot_bf16_pairs(b, x, y, acc)
    if not fused():
        return b.fadd(b.fmul(x, y), acc)
    name = f"llvm.fma.v{x.type.count}f32" if isinstance(x.type, ir.VectorType) else "llvm.fma.f32"
    fn = declare(b.module, name, x.type, [x.type] * 3)
    return b.call(fn, [x, y, acc])


def masked_load(b: Builder, ptr: Val, lanes: int, valid: int) -> Val:
    """The first ``valid`` lanes of ``ptr[0:lanes]``; the others read as 0 without touching memory."""
    mask = ir.Constant(ir.VectorType(I1, lanes), [1 if j < valid else 0 for j in range(lanes)])
    return masked_load_where(b, ptr, mask, ir.Constant(vec_type(lanes), None))


def masked_load_where(b: Builder, ptr: Val, mask: Val, otherwise: Val) -> Val:
    """``ptr[0:lanes]`` where ``mask`` (``<lanes x i1>``) holds, ``otherwise``'s lanes elsewhere, those not
    read (``ptr`` may point outside the data where they are)."""
    lanes = mask.type.count  # type: ignore[attr-defined]
    vt, mt = vec_type(lanes), ir.VectorType(I1, lanes)
    fn = declare(b.module, f"llvm.masked.load.v{lanes}f32.p0", vt, [PTR, I32, mt, vt])
    return b.call(fn, [ptr, ir.Constant(I32, 4), mask, otherwise])


def span_inside(b: Builder, row: Val, at: Val | int, width: int, fill: Val) -> Val:
    """``row[at : at + lanes]`` (``lanes``: ``fill``'s), the lanes outside ``[0, width)`` reading ``fill``'s
    and not touching memory (``at`` may lie before the row). With ``at`` known when compiling, a span wholly
    inside is a plain load and one wholly outside is ``fill``."""
    vt = fill.type
    lanes = vt.count  # type: ignore[attr-defined]
    if isinstance(at, int):
        inside = [0 <= at + i < width for i in range(lanes)]
        if all(inside):
            return b.load(b.gep(row, [const(at)], inbounds=True, source_etype=F32), typ=vt, align=4)
        if not any(inside):
            return fill
        mask: Val = ir.Constant(ir.VectorType(I1, lanes), inside)
    else:
        iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
        mask = b.icmp_unsigned("<", b.add(splat(b, at, lanes), iota), splat(b, const(width), lanes))
    return masked_load_where(b, b.gep(row, [const(at) if isinstance(at, int) else at], source_etype=F32), mask, fill)


def even_lanes(b: Builder, first: Val, second: Val, odd: bool = False) -> Val:
    """The even (``odd``: odd) elements of two vectors laid end to end: a stride-2 read of ``2 * lanes``
    contiguous floats (from the second of them, for the odd ones)."""
    lanes = first.type.count  # type: ignore[attr-defined]
    return b.shuffle_vector(first, second, ir.Constant(ir.VectorType(I32, lanes),
                                                       [2 * i + int(odd) for i in range(lanes)]))


def masked_store(b: Builder, value: Val, ptr: Val, mask: Val) -> None:
    """``ptr[i] = value[i]`` for the lanes where ``mask`` holds; the others are not written."""
    lanes = mask.type.count  # type: ignore[attr-defined]
    vt, mt = vec_type(lanes), ir.VectorType(I1, lanes)
    fn = declare(b.module, f"llvm.masked.store.v{lanes}f32.p0", ir.VoidType(), [vt, PTR, I32, mt])
    b.call(fn, [value, ptr, ir.Constant(I32, 4), mask])


# --------------------------------------------------------------------------------------
# operand access inside the micro-kernel


class AAccess(Protocol):
    def rows(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        """Row ``i``'s element at step ``k`` of the block, splatted, for ``i < count``."""
        ...


class BAccess(Protocol):
    def vectors(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        """Vector ``j`` of row ``k`` of the block, for ``j < count``."""
        ...


@dataclass
class PackedA:
    """A tile packed as ``[k][mr]`` (``base`` points at the block's first step)."""

    base: Val
    stride: int

    def rows(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        step = fgep(b, self.base, b.mul(k, const(self.stride), flags=("nsw",)))
        return [splat(b, b.load(fgep(b, step, i), typ=F32, align=4), lanes) for i in range(count)]


@dataclass
class RowsA:
    """Rows read in place: row ``i`` at ``rows[i] + k * kstride``."""

    row_ptrs: list[Val]
    kstride: Val

    def offset(self, b: Builder, k: Val) -> Val:
        """Where step ``k`` lies from each row's pointer."""
        return b.mul(k, self.kstride, flags=("nsw",))

    def rows(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        off = self.offset(b, k)
        return [splat(b, b.load(fgep(b, self.row_ptrs[i], off), typ=F32, align=4), lanes) for i in range(count)]


@dataclass
class RowsTableA:
    """Rows read in place at ``rows[i] + table[k]`` (i32 element offsets shared by the rows):
    a convolution's output positions as GEMM rows, the (channel, tap) offsets as the table."""

    row_ptrs: list[Val]
    table: Val

    def offset(self, b: Builder, k: Val) -> Val:
        """Where step ``k`` lies from each row's pointer."""
        return b.sext(b.load(b.gep(self.table, [k], inbounds=True, source_etype=I32), typ=I32, align=4), I64)

    def rows(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        off = self.offset(b, k)
        return [splat(b, b.load(fgep(b, self.row_ptrs[i], off), typ=F32, align=4), lanes) for i in range(count)]


@dataclass
class PackedB:
    """A panel packed as ``[k][nr]``; with ``half``, of float16 values, each vector widened (exactly) as it
    is loaded: half the bytes to stream, the same float32 products."""

    base: Val
    stride: int
    align: int = 4
    half: bool = False

    def vectors(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        if self.half:
            step = hgep(b, self.base, b.mul(k, const(self.stride), flags=("nsw",)))
            ht = ir.VectorType(F16, lanes)
            return [b.fpext(b.load(hgep(b, step, j * lanes), typ=ht, align=self.align), vec_type(lanes))
                    for j in range(count)]
        step = fgep(b, self.base, b.mul(k, const(self.stride), flags=("nsw",)))
        vt = vec_type(lanes)
        return [b.load(fgep(b, step, j * lanes), typ=vt, align=self.align) for j in range(count)]


@dataclass
class DirectB:
    """Rows read in place at ``base + koff(k)``: ``kstride * k``, or ``table[k]`` (i32) when given.
    ``valid`` lanes of the last vector are read (a masked load) when it would run past the data."""

    base: Val
    kstride: Val
    table: Val | None = None
    valid_last: int | None = None

    def vectors(self, b: Builder, k: Val, count: int, lanes: int) -> list[Val]:
        if self.table is not None:
            off = b.sext(b.load(b.gep(self.table, [k], inbounds=True, source_etype=I32), typ=I32, align=4), I64)
        else:
            off = b.mul(k, self.kstride, flags=("nsw",))
        row = fgep(b, self.base, off)
        vt = vec_type(lanes)
        out = []
        for j in range(count):
            p = fgep(b, row, j * lanes)
            if j == count - 1 and self.valid_last is not None and self.valid_last < lanes:
                out.append(masked_load(b, p, lanes, self.valid_last))
            else:
                out.append(b.load(p, typ=vt, align=4))
        return out


L2_LOCALITY = 2
STREAMED_LOCALITY = 0
"""``llvm.prefetch`` localities: 2 (``prefetcht1``) fetches into L2 and the last level; 0 (``prefetchnta``)
marks the line as used once, so that it does not displace what the last level holds for the next call (a
convolution's weights that stream from memory: :attr:`GemmCore.ahead_locality`)."""


def micro_kernel(b: Builder, a: AAccess, bb: BAccess, rows: int, nv: int, lanes: int, count: Val,
                 init: list[Val], ahead: Val | None = None, ahead_every: int = 1,
                 read_ahead: Val | None = None, ahead_locality: int = L2_LOCALITY) -> list[Val]:
    """``acc[i*nv + j] += a[i, k] * b[k, j-th vector]`` for ``k < count``; accumulators stay in registers.
    ``ahead``: memory to pull into the caches meanwhile, one line every ``ahead_every`` steps (every step
    asks for its share, so a line is asked for ``ahead_every`` times), with the prefetch's ``ahead_locality``
    (:data:`STREAMED_LOCALITY` for weights read once a call). ``read_ahead`` (A's rows read in place):
    a pointer whose step-``k`` element is fetched at every step, at the offset the rows read step ``k`` at (a
    later tile row's, which another core may have written last).

    The loop is not unrolled: unrolled, LLVM schedules the next step's B loads and broadcasts ahead of
    this step's multiply-adds, and a tile of 24 accumulators plus twice its B vectors outgrows AVX-512's
    32 registers, so accumulators go to the stack on every step (one thread, Zen 5: a 1024x1024x1024
    product 218 against 236 GFLOP/s, 64x784x512 178 against 230; a 128-channel 3x3 convolution at 28x28
    196 against 243). The loop's own count and branch are two of some 40 instructions a step."""
    def step(k: Val, acc: list[Val]) -> list[Val]:
        if ahead is not None:
            prefetch(b, fgep(b, ahead, b.mul(k, const(LINE_FLOATS // ahead_every), flags=("nsw",))), ahead_locality)
        if read_ahead is not None:
            assert isinstance(a, (RowsA, RowsTableA))
            prefetch(b, fgep(b, read_ahead, a.offset(b, k), inbounds=False))
        bv = bb.vectors(b, k, nv, lanes)
        av = a.rows(b, k, rows, lanes)
        return [fma(b, av[i], bv[j], acc[i * nv + j]) for i in range(rows) for j in range(nv)]

    # the bound as ``k + 1 <= count`` with no wrap flags: written ``k < count``, LLVM's own passes reshape the
    # loop and the 6x4 tile spills again (tests/codegen/test_register_tile.py fails on Zen 4/5)
    _, acc = counted_loop(b, "kloop", const(0), lambda k: b.icmp_signed("<=", b.add(k, const(1)), count), 1, step,
                          init, index_name="kloop.k", flags=())
    return acc


@dataclass
class AOperand:
    """Where a tile's A rows come from: ``packed`` (``ptr``: the tile's ``[k][mr]`` panel),
    ``rows`` (``ptr``: one pointer per row, read at ``k * kstride``) or ``rowtable``."""

    kind: str
    ptr: Val | list[Val]
    kstride: Val | int = 0
    table: Val | None = None  # ``rowtable``: row i's step k is at ``ptr[i] + table[k]``


@dataclass
class BOperand:
    """Where a tile's B vectors come from: ``packed`` (a ``[k][nr]`` panel), ``direct`` (row ``k``
    at ``k * kstride``) or ``table`` (row ``k`` at ``table[k]``, i32 element offsets)."""

    kind: str
    ptr: Val
    kstride: Val | int = 0
    table: Val | None = None


PACKED_B = ("packed", "packed16")
"""B operands packed as zero-padded ``[k][nr]`` panels: of float32, or of float16 widened as they are read."""

MICRO_TYPE = ir.FunctionType(ir.VoidType(), [PTR, I64, PTR, I64, PTR, I64, PTR, I1, PTR, PTR])
"""``micro(a, a_kstride, b, b_kstride, b_table, count, tile, accumulate, ahead, read_ahead)``."""

LINE_FLOATS = 16
"""Floats per cache line (64 bytes)."""

AHEAD_PANELS = 1
"""How far a GEMM block fetches its packed B panels ahead, in panels: its register tile rows share the
fetching of the next ones while they use the current one. Otherwise a panel read by few tile rows
(a 7x7 or 14x14 convolution's weights, always coming from L3) waits on memory at its first use:
M=49 N=512 K=4608 took 2.55 ms without, 1.76 with, and M=196 6.2 and 4.8 (cold weights, one thread)."""


def prefetch(b: Builder, p: Val, locality: int = L2_LOCALITY) -> None:
    """A read prefetch of ``p``'s line (by default into L2 and the last level; not L1, which the panel in use
    holds)."""
    b.call(declare(b.module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32]),
           [p, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)])


def write_prefetch(b: Builder, p: Val) -> None:
    """A prefetch of ``p``'s line for writing (owned, into L2 and L1): a store to it later finds it there."""
    b.call(declare(b.module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32]),
           [p, ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def ahead_every(tiling: Tiling) -> int:
    """Steps per line fetched ahead (1, 2 or 4), so that a block's tile rows cover ``AHEAD_PANELS``."""
    lines_per_row = AHEAD_PANELS * tiling.nr / LINE_FLOATS / max(1, tiling.mb_tiles)  # lines per tile row and step
    every = 1
    while every < 4 and lines_per_row * every * 2 <= 1.0 + 1e-9:
        every *= 2
    return every


def micro_function(mod: ir.Module, a_kind: str, b_kind: str, mr: int, nv: int, lanes: int, tile_stride: int,
                   valid_last: int | None, ahead_every: int = 0, a_stride: int | None = None,
                   read_ahead: bool = False, ahead_locality: int = L2_LOCALITY) -> ir.Function:
    """The micro-kernel as a function, one per tile shape and operand kind in a module (every
    kernel of a model shares it, so LLVM optimizes and compiles it once). It adds
    ``count`` steps of A x B to the ``mr x nv`` vectors at ``tile`` (or starts from zero).
    ``a_stride``: the packed A tile's rows (``mr`` or more: a bottom tile uses its first ``mr``)."""
    a_stride = a_stride or mr
    name = f"cuvil.micro.{a_kind}.{b_kind}.{mr}x{nv}x{lanes}.s{tile_stride}" + \
        (f".a{a_stride}" if a_kind == "packed" and a_stride != mr else "") + \
        (f".v{valid_last}" if valid_last is not None else "") + (f".ahead{ahead_every}" if ahead_every else "") + \
        (".nta" if ahead_every and ahead_locality != L2_LOCALITY else "") + (".ra" if read_ahead else "") + \
        (".bf16x2" if paired() else "" if fused() else ".unfused")
    found = mod.globals.get(name)
    if isinstance(found, ir.Function):
        return found
    fn = ir.Function(mod, MICRO_TYPE, name=name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    a_ptr, a_kstride, b_ptr, b_kstride, table, count, tile, accumulate, ahead_ptr, read_ahead_ptr = fn.args
    for arg, nm in zip(fn.args, ("a", "a_kstride", "b", "b_kstride", "table", "count", "tile", "accumulate",
                                 "ahead", "read_ahead"), strict=True):
        arg.name = nm
    for arg in (a_ptr, b_ptr, table, tile):
        arg.add_attribute("noalias")
    b = Builder(fn.append_basic_block("entry"))
    if a_kind == "packed":
        a: AAccess = PackedA(a_ptr, a_stride)
    else:
        rows: list[Val] = [b.load(b.gep(a_ptr, [const(i)], inbounds=True, source_etype=PTR), typ=PTR)
                           for i in range(mr)]
        a = RowsTableA(rows, table) if a_kind == "rowtable" else RowsA(rows, a_kstride)
    assert not (a_kind == "rowtable" and b_kind == "table"), "one offset table per micro-kernel"
    if b_kind in PACKED_B:
        bb: BAccess = PackedB(b_ptr, tile_stride, 64 if b_kind == "packed" else 32, half=b_kind == "packed16")
    elif b_kind == "direct":
        bb = DirectB(b_ptr, b_kstride, valid_last=valid_last)
    else:
        bb = DirectB(b_ptr, b_kstride, table=table, valid_last=valid_last)
    vt = vec_type(lanes)
    zero = ir.Constant(vt, [-0.0] * lanes) if paired() else ir.Constant(vt, None)  # (a dot folds from -0.0)
    init = []
    for i in range(mr):
        for j in range(nv):
            old = b.load(fgep(b, tile, i * tile_stride + j * lanes), typ=vt, align=64)
            init.append(b.select(accumulate, old, zero))
    assert not read_ahead or a_kind in ("rows", "rowtable"), "only rows read in place read ahead"
    acc = micro_kernel(b, a, bb, mr, nv, lanes, count, init, ahead=ahead_ptr if ahead_every else None,
                       ahead_every=max(1, ahead_every), read_ahead=read_ahead_ptr if read_ahead else None,
                       ahead_locality=ahead_locality)
    for i in range(mr):
        for j in range(nv):
            b.store(acc[i * nv + j], fgep(b, tile, i * tile_stride + j * lanes), align=64)
    b.ret_void()
    return fn


# --------------------------------------------------------------------------------------
# the kernel function: phases of chunked work, run serially or on the pool


@dataclass
class Ctx:
    """The function a chunk is being emitted into."""

    fn: ir.Function
    b: Builder
    alloca: Builder
    out: Val
    ins: list[Val]
    scratch: Val
    err: Val
    dims: Val | None = None  # the ``i64`` dim values of a kernel compiled for a shape class

    def entry_alloca(self, ty: ir.Type, name: str, align: int = 64) -> Val:
        return opaque_alloca(self.alloca, ty, name, align)


class KernelFunction:
    """``i32 name(ptr out, ptr in0, ..., ptr scratch)``, made of phases; each phase is a body
    function over a range of chunks, called directly or through the pool's task trampoline.
    With ``dims`` the function takes one more argument, ``ptr dims`` (the ``i64`` values of the
    symbols of a function compiled for a shape class), passed on to every body as ``Ctx.dims``."""

    def __init__(self, mod: ir.Module, name: str, n_inputs: int, *, dims: bool = False) -> None:
        self.mod = mod
        self.name = name
        self.n_inputs = n_inputs
        self.n_args = n_inputs + 2 + (1 if dims else 0)  # the pointers a body and a task pass on
        self.fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * self.n_args), name=name)
        self.fn.linkage = "hidden"
        self.fn.attributes.add("noinline")
        self.fn.args[0].name = "out"
        for k, a in enumerate(self.fn.args[1:n_inputs + 1]):
            a.name = f"in{k}"
        self.fn.args[n_inputs + 1].name = "scratch"
        if dims:
            self.fn.args[-1].name = "dims"
        self.b = Builder(self.fn.append_basic_block("entry"))
        self.phases = 0

    @property
    def dims(self) -> Val | None:
        """The kernel's ``ptr dims`` argument (None at static shapes)."""
        return self.fn.args[-1] if self.n_args > self.n_inputs + 2 else None

    def phase(self, nchunks: int | Val, flops: float | Val, emit_chunk: Callable[[Ctx, Val], None]) -> None:
        """Run ``emit_chunk`` for chunks ``0..nchunks`` (in parallel when the work is large enough).
        ``nchunks`` and ``flops`` (``i64``) may be run-time values: then the choice between the pool
        and the calling thread is made at run time, and zero chunks run nothing."""
        if isinstance(nchunks, int) and nchunks <= 0:
            return
        k = self.phases
        self.phases += 1
        body = self._body(f"{self.name}.p{k}", emit_chunk)
        b = self.b
        if not codegen_target().threads:  # no pool on this target
            rc = self._serial(body, i64(nchunks))
        elif isinstance(nchunks, int) and isinstance(flops, (int, float)):
            pooled = nchunks > 1 and flops >= PARALLEL_MIN_FLOPS
            if pooled:
                note_pooled_work(self.mod, flops)
            group = chunks_per_claim(nchunks, flops)
            rc = self._pooled(k, body, const(-(-nchunks // group)), group=(group, nchunks)) if pooled \
                else self._serial(body, const(nchunks))
        else:
            if not isinstance(flops, (int, float)) or flops >= PARALLEL_MIN_FLOPS:
                note_pooled_work(self.mod, None)  # its work is known at run time only
            rc = self._pooled_or_serial(k, body, i64(nchunks), flops)
        fail = self.fn.append_basic_block(f"p{k}.fail")
        ok = self.fn.append_basic_block(f"p{k}.ok")
        b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, abi.OK)), ok, fail)
        b.position_at_end(fail)
        b.ret(rc)
        b.position_at_end(ok)

    def _serial(self, body: ir.Function, nchunks: Val) -> Val:
        return self.b.call(body, [*self.fn.args, const(0), nchunks])

    def _pooled(self, k: int, body: ir.Function, nchunks: Val, slots: Val | None = None,
                group: tuple[int, int] = (1, 0)) -> Val:
        """The chunks on the pool: the kernel's arguments and a return-code slot go through ``slots``.
        ``group``: (chunks per claim, chunks in all) where a claim runs several chunks."""
        b = self.b
        args = list(self.fn.args)
        task = self._task(f"{self.name}.p{k}.task", body, *group)
        if slots is None:
            slots = opaque_alloca(b, ir.ArrayType(I64, len(args) + 1), f"args{k}", 8)
        for j, a in enumerate(args):
            b.store(a, b.gep(slots, [const(j)], inbounds=True, source_etype=I64))
        rc_slot = b.gep(slots, [const(len(args))], inbounds=True, source_etype=I64)
        b.store(ir.Constant(I64, 0), rc_slot)
        b.call(thread_pool(self.mod).run, [task, slots, nchunks])
        return b.trunc(b.load(rc_slot, typ=I64), I32)

    def _pooled_or_serial(self, k: int, body: ir.Function, nchunks: Val, flops: float | Val) -> Val:
        """The pool when there is more than one chunk and enough work, decided at run time."""
        b = self.b
        slots = opaque_alloca(b, ir.ArrayType(I64, len(self.fn.args) + 1), f"args{k}", 8)  # not in a branch
        enough = ir.Constant(I1, flops >= PARALLEL_MIN_FLOPS) if isinstance(flops, (int, float)) \
            else b.icmp_signed(">=", flops, const(PARALLEL_MIN_FLOPS))
        pool = self.fn.append_basic_block(f"p{k}.pool")
        serial = self.fn.append_basic_block(f"p{k}.serial")
        done = self.fn.append_basic_block(f"p{k}.done")
        b.cbranch(b.and_(b.icmp_signed(">", nchunks, const(1)), enough), pool, serial)
        b.position_at_end(pool)
        pooled = self._pooled(k, body, nchunks, slots)
        pool_end = b.block
        b.branch(done)
        b.position_at_end(serial)
        alone = self._serial(body, nchunks)
        b.branch(done)
        b.position_at_end(done)
        rc = b.phi(I32, name=f"rc{k}")
        rc.add_incoming(pooled, pool_end)
        rc.add_incoming(alone, serial)
        return rc

    def finish(self) -> ir.Function:
        self.b.ret(ir.Constant(I32, abi.OK))
        return self.fn

    def _body(self, name: str, emit_chunk: Callable[[Ctx, Val], None]) -> ir.Function:
        n, nargs = self.n_inputs, self.n_args
        fn = ir.Function(self.mod, ir.FunctionType(I32, [PTR] * nargs + [I64, I64]), name=name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        for a in fn.args[:nargs]:
            a.add_attribute("noalias")
        entry = Builder(fn.append_basic_block("entry"))
        start = fn.append_basic_block("start")
        b = Builder(start)
        err = entry.alloca(I1, name="err")
        entry.store(ir.Constant(I1, 0), err)
        ctx = Ctx(fn, b, entry, fn.args[0], list(fn.args[1:n + 1]), fn.args[n + 1], err,
                  fn.args[n + 2] if nargs > n + 2 else None)
        for_range(b, fn.args[nargs], fn.args[nargs + 1], "chunk", lambda c: emit_chunk(ctx, c))
        failed = b.load(err, typ=I1)
        b.ret(b.select(failed, ir.Constant(I32, abi.ERR_INDEX), ir.Constant(I32, abi.OK)))
        entry.branch(start)
        return fn

    def _task(self, name: str, body: ir.Function, group: int = 1, total: int = 0) -> ir.Function:
        """The pool's ``task(slots, claim)``: chunk ``claim``, or chunks ``claim * group`` up to the next
        claim's first (at most ``total``) where a claim runs ``group`` of them."""
        fn = ir.Function(self.mod, TASK_TYPE, name=name)
        fn.linkage = "internal"
        slots, chunk = fn.args
        b = Builder(fn.append_basic_block("entry"))
        nargs = self.n_args
        ptrs = [b.load(b.gep(slots, [const(j)], inbounds=True, source_etype=I64), typ=PTR) for j in range(nargs)]
        if group > 1:
            first = b.mul(chunk, const(group))
            rc = b.call(body, [*ptrs, first, imin(b, b.add(first, const(group)), const(total))])
        else:
            rc = b.call(body, [*ptrs, chunk, b.add(chunk, const(1))])
        failed = b.icmp_signed("!=", rc, ir.Constant(I32, abi.OK))
        rc_slot = b.gep(slots, [const(nargs)], inbounds=True, source_etype=I64)
        if_then(b, failed, "fail", lambda: b.atomic_rmw("xchg", rc_slot, b.sext(rc, I64), "seq_cst"))
        b.ret_void()
        return fn


# --------------------------------------------------------------------------------------
# the engine


@dataclass(frozen=True)
class Tiling:
    mr: int
    nv: int
    lanes: int
    kc: int  # reduction block
    mb_tiles: int  # register tiles per block, along M
    nb_tiles: int  # along N

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


KC_MAX = 256
"""K is cut into blocks of at most this many steps, so a B panel (kc x NR) stays in L1/L2."""

A_BLOCK_BYTES = 128 * 1024
B_BLOCK_BYTES = 512 * 1024
A_BLOCK_STREAMING_B = 256 * 1024
"""A block (``mb_tiles * MR x kc``) bound, and B block (``kc x nb_tiles * NR``) bound, within L2; the A bound
where B streams from memory (see :func:`choose_tiling`)."""

B_STREAMS_BYTES = 1 << 20
"""A convolution's B operand (its weights where positions are the rows, else its input) of this size or
more comes from memory at each call: a network's weights do not stay in the caches from one call to the
next. A GEMM's B counts as streaming whatever its size (BERT and the batch-64 MLP measured the same
either way)."""


def streams_from_memory(k: int, n: int) -> bool:
    """Whether a convolution's ``k x n`` float32 B operand is big enough to stream (:data:`B_STREAMS_BYTES`)."""
    return k * n * 4 >= B_STREAMS_BYTES


PARTIALS_MAX_BYTES = 96 * 1024
"""Bound on the stack a block's partial sums take between K blocks (worker stacks are MBs)."""

CLAIM_FLOPS = 250_000
MIN_CLAIMS = 16


def chunks_per_claim(nchunks: int, flops: float) -> int:
    """Chunks a thread of the pool takes at once: each claim is an atomic update of one word that every
    thread reads, so a phase of many small chunks (a depthwise convolution's 512 channels of 14x14, a
    padded copy's channels) is claimed ``CLAIM_FLOPS`` of work at a time, in at least ``MIN_CLAIMS``
    claims. Two threads, in-process A/B: MobileNet-v1 5.14 -> 4.61 ms (one claim per channel before),
    ResNet-18 12.33 -> 12.09, QDQ ResNet-18 7.28 -> 7.02; BERT and one thread unchanged; 60,000 gained
    less, 1,000,000 no more."""
    if nchunks <= MIN_CLAIMS or flops <= 0:
        return 1
    group = math.ceil(CLAIM_FLOPS * nchunks / flops)
    return max(1, min(group, nchunks // MIN_CLAIMS))


MIN_PARALLEL_BLOCKS = 8
"""Cache blocks a problem that may run on the pool is cut into at least (when it has that many register
tiles): with two or three, one thread would finish early and wait (a 7x7 convolution had two)."""


def choose_tiling(isa: Isa, m: int, n: int, k: int, *, mr: int | None = None, nv: int | None = None,
                  kc_max: int = KC_MAX, b_streams: bool = True) -> Tiling:
    """Register tile from the ISA (fewer rows/vectors for small problems), blocks for the caches
    (K in blocks of at most ``kc_max`` steps).

    Every M block reads all of B, so where B streams from memory (``b_streams``) M is cut into as few
    blocks as the caches allow (A blocks up to :data:`A_BLOCK_STREAMING_B`) and the blocks the pool needs
    are cut along N first: each B panel is then read from memory once and used by many tile rows while
    it is in L1/L2. One thread: ResNet-18 27.2 -> 24.3 ms (a 512-channel 3x3 convolution at 7x7, weights
    cold, 2.39 -> 1.79 ms)."""
    lanes = isa.lanes
    if mr is None or nv is None:  # the tile that computes the fewest padded elements (first on a tie)
        def padded(tile: tuple[int, int]) -> int:
            rows, width = min(tile[0], m), min(tile[1], -(-n // lanes)) * lanes
            return -(-m // rows) * rows * -(-n // width) * width

        mr, nv = min(isa.tiles, key=padded)
        if padded((mr, nv)) * isa.other_tile_gain > padded(isa.tiles[0]):
            mr, nv = isa.tiles[0]
    mr = min(mr, m)
    nv = max(1, min(nv, -(-n // lanes)))
    if mr <= 2 and n >= 4 * lanes * nv:  # few rows (a GEMV): more independent vectors per row
        nv = min(2 * nv, -(-n // lanes))
    nblocks = -(-k // kc_max)
    kc = -(-k // nblocks)
    nr = nv * lanes
    mt = -(-m // mr)
    nt = -(-n // nr)
    nb_tiles = max(1, min(nt, B_BLOCK_BYTES // max(1, kc * nr * 4)))
    mb_tiles = max(1, min(mt, (A_BLOCK_STREAMING_B if b_streams else A_BLOCK_BYTES) // max(1, kc * mr * 4)))
    if nblocks > 1:  # partial sums of a whole block wait on the stack between K blocks: bound them
        while mb_tiles * nb_tiles * mr * nr * 4 > PARTIALS_MAX_BYTES and mb_tiles * nb_tiles > 1:
            if mb_tiles >= nb_tiles and not (b_streams and nb_tiles > 1):
                mb_tiles -= 1
            else:
                nb_tiles -= 1
    if product_work(m, n, k) >= PARALLEL_MIN_FLOPS:  # enough blocks for the pool to share out evenly
        while -(-mt // mb_tiles) * -(-nt // nb_tiles) < MIN_PARALLEL_BLOCKS and mb_tiles * nb_tiles > 1:
            if nb_tiles >= mb_tiles or (b_streams and nb_tiles > 1):
                nb_tiles = -(-nb_tiles // 2)
            else:
                mb_tiles = -(-mb_tiles // 2)
    if EVEN_BLOCKS and product_work(m, n, k) >= PARALLEL_MIN_FLOPS:
        nb_tiles = _even_split(nt, nb_tiles, _sizes(mt, mb_tiles), pool_size())
        mb_tiles = _even_split(mt, mb_tiles, _sizes(nt, nb_tiles), pool_size(), rows=True)
    return Tiling(mr, nv, lanes, kc, mb_tiles, nb_tiles)


EVEN_BLOCKS = True
"""Whether column blocks are resized so that the pool's threads finish together (:func:`_even_split`). Two threads,
two profiled builds interleaved: ResNet-18's stem 1.03 -> 0.99 ms (15 blocks -> 18), MobileNet-v1's 128-channel
1x1 at 56x56 0.39 -> 0.37 (11 -> 17); one thread unchanged. Letting blocks grow to twice ``per_block`` as
well (ONNX Runtime run between calls, as in the bench): ResNet-18's 56x56 layers 0.77-0.86 -> 0.71-0.76 ms
(9 blocks -> 4) and its stem 0.88 -> 0.85 (18 -> 10), the network 2 % faster; MobileNet-v1, BERT, the MLP and
the INT8 ResNet-18 unchanged; one thread unchanged."""


def _sizes(tiles: int, per_block: int) -> list[int]:
    return [per_block] * (tiles // per_block) + ([tiles % per_block] if tiles % per_block else [])


def _span(row_sizes: list[int], col_sizes: list[int], threads: int = 2) -> int:
    """When the last of ``threads`` threads finishes, each taking the next block (row blocks outer) when it is
    free."""
    free = [0] * threads
    for size in (r * c for r in row_sizes for c in col_sizes):
        free[free.index(min(free))] += size
    return max(free)


EVEN_SHARE_SLACK = 1.03
"""How far past its even share of the tiles (the pool's work over its threads) the last thread to finish may be
before :func:`_even_split` resizes the blocks."""


def _even_split(tiles: int, per_block: int, other: list[int], threads: int = 2, rows: bool = False) -> int:
    """Column tiles per block (``other``: the row blocks' sizes), from three quarters of ``per_block`` to a little
    over twice it, that share the blocks out most evenly among ``threads`` threads claiming them as they become
    free, where ``per_block`` leaves the last thread more than :data:`EVEN_SHARE_SLACK` past its even share. On
    two threads an odd count of blocks of a size leaves one thread a whole block longer: ResNet-18's stem had
    15 blocks of 18 column tiles; its 56x56 layers have 67 column tiles, in 9 blocks of 8 one thread 35 tiles
    and the other 32, in four blocks of 17 and 16 34 and 33; on eight threads, eight blocks of 9. Blocks twice
    as wide hold twice the B panel: measured no slower on one thread. (The blocks were resized only where that
    shortened the last thread by 3 %, which 35 -> 34 is not; the 56x56 layers alone on two threads, caches
    flushed between calls: 1.17-1.18 -> 1.13-1.15 ms in four runs of five.)

    ``rows``: row tiles per block instead (``other``: the column blocks' sizes), from three quarters of
    ``per_block`` to ``per_block`` (the A block's bound in L2), once the column blocks are chosen: a schedule with
    one column block has only its rows to share (a 64-channel 3x3 convolution at 56x56 with positions as rows:
    532 row tiles in eleven blocks of 47 and one of 15 leave one thread 282 tiles and the other 250, fourteen
    blocks of 38 give 266 each; ResNet-18's 1x1 stride-2 layer into 14x14, 33 row tiles by three column tiles,
    69 against 66 -> 67 against 66)."""
    if threads <= 1:
        return per_block
    widest = per_block if rows else 2 * per_block + 1

    def span(size: int) -> int:
        return _span(_sizes(tiles, size), other, threads) if rows else _span(other, _sizes(tiles, size), threads)

    spans = {size: span(size) for size in range(max(1, (3 * per_block) // 4), widest + 1)}
    if spans[per_block] <= EVEN_SHARE_SLACK * sum(other) * tiles / threads:
        return per_block
    best = min(spans, key=lambda cols: (spans[cols], -cols))
    return best if spans[best] < spans[per_block] else per_block


StoreAhead = Callable[[Ctx, Any, Val, Val], None]
"""``store_ahead(ctx, problem, m0, n0)``: what to fetch for the stores of a tile to come, issued before the tile
at ``(m0, n0)`` is computed."""

StoreTile = Callable[[Ctx, Any, Val, Val, Val, Val, Val, int], None]
"""``store(ctx, problem, m0, n0, rows, cols, tile_ptr, tile_row_stride)``: write the valid part of a tile."""


WHOLE_PANEL_ROWS = True
"""Whether a whole B panel packed at run time copies its rows at their known length (vector moves) rather than
at a length known at run time, which LLVM turns into a call to ``memcpy`` per row (a 48-float row: 0.8 % of
MobileNet-v1's samples in ``perf``). One thread, two profiled builds called in turn: its 1x1 layers at 112x112
and 56x56 0.586 -> 0.572, 0.520 -> 0.513, 0.984 -> 0.971 ms; whole calls (six rounds) 11.47 -> 11.45 ms; two
threads unchanged."""


def pack_panel(b: Builder, src: Val, row_stride: Val, kn: Val, cols: Val, panel: Val, nr: int) -> None:
    """``panel[kk][j] = src[kk * row_stride + j]`` for ``kk < kn``, ``j < cols``, and 0 for ``cols <= j
    < nr``: a B panel whose rows lie ``row_stride`` apart, copied at run time (zero padded)."""
    def rows(width: Val | int) -> None:
        """Every row, ``width`` floats copied (and, at a width known only at run time, zeros to ``nr``)."""
        def row(kk: Val) -> None:
            s_row = fgep(b, src, b.mul(kk, row_stride))
            d_row = fgep(b, panel, b.mul(kk, const(nr)))
            for_range(b, 0, width, "bp", lambda j: b.store(b.load(fgep(b, s_row, j), typ=F32, align=4),
                                                          fgep(b, d_row, j), align=4))
            if not isinstance(width, int):
                for_range(b, width, nr, "bz", lambda j: b.store(ir.Constant(F32, 0.0), fgep(b, d_row, j), align=4))

        for_range(b, 0, kn, "bk", row, hints=NO_UNROLL)

    if WHOLE_PANEL_ROWS:
        if_else(b, b.icmp_signed("==", cols, const(nr)), "wholepanel", lambda: rows(nr), lambda: rows(cols))
    else:
        rows(cols)


def ceil_div(x: Dim, d: int) -> Dim:
    """``ceil(x / d)`` for ``x >= 0``; a symbolic ``x`` gives a symbolic dim (read at run time)."""
    return (x + (d - 1)) // d


SizeOf = Callable[[Dim], Val]
"""A size as an ``i64`` value: a constant at static shapes, else read from the kernel's dims
(:meth:`cuvil.codegen.dims.DimValues.value`, emitted once in the entry block of the function)."""


def static_size(d: Dim) -> Val:
    return const(int(d))


BALANCED_EDGE = True
EDGE_ROWS = 2
"""Whether a GEMM whose A is read in place shares its rows out so that no register tile row has at most
``EDGE_ROWS`` rows (:meth:`GemmCore.balance_rows`)."""


class GemmCore:
    """``C = A @ B`` over one problem instance (``m x k`` by ``k x n``), one block per call of
    :meth:`emit_block`. The operand accessors and the store are given by the user of the engine.

    Every register tile is computed whole: packed operands are zero padded and in-place rows
    are clamped to the last one, so edge tiles read valid memory and only the store is cut
    (``rows``/``cols`` at run time). The one exception is a B read in place, whose last tile
    loads its partial vector with a mask (``b_masked_edge``): that is a second micro-kernel.

    ``m``, ``n`` and ``k`` may be symbolic (a shape class): the tiling is then chosen for their
    largest values (``maxima``, each symbol's), and :meth:`emit_block` reads them, and the tile
    and block counts that follow from them (:attr:`blocks` too is a dim), from the kernel's dims.
    Edge rows and columns are cut at run time anyway, so the schedule is the same; a B read in
    place with a symbolic N must be packed (``b_pack``), the masked edge needing N's value. K = 0
    runs one empty K block, so every tile is stored with the epilogue of a zero sum.
    """

    def __init__(self, m: Dim, n: Dim, k: Dim, tiling: Tiling,
                 a_at: Callable[[Ctx, Any, Val, Val], AOperand],
                 b_at: Callable[[Ctx, Any, Val, Val, int, Val | None], BOperand],
                 store: StoreTile, b_pack: Callable[[Ctx, Any, Val, Val, Val], None] | None = None,
                 b_masked_edge: bool = False, maxima: Mapping[str, int] | None = None) -> None:
        self.m, self.n, self.k = m, n, k
        self.t = tiling
        self.a_at = a_at  # (ctx, problem, m0, k0) -> rows of the tile at m0, from step k0 on
        self.b_at = b_at  # (ctx, problem, n0, k0, cols, packed_buffer) -> vectors of the tile at n0
        self.store = store
        self.b_pack = b_pack  # (ctx, problem, n0, k0, buffer): fill a [kc][NR] panel at run time
        self.store_ahead: StoreAhead | None = None  # (ctx, problem, m0, n0): before each micro-kernel call
        self.rows_outer = False  # tile rows outside the column tiles in a block (B read in place, or by a table)
        self.read_ahead = 0  # A rows read in place: fetch, step by step, the element this many floats past row 0's
        self.ahead_every = ahead_every(tiling)
        self.ahead_locality = L2_LOCALITY  # of the fetches of the packed B panels to come
        t = tiling
        self.mt = ceil_div(m, t.mr)
        self.nt = ceil_div(n, t.nr)
        self.mblocks = ceil_div(self.mt, t.mb_tiles)
        self.nblocks = ceil_div(self.nt, t.nb_tiles)
        self.kblocks = ceil_div(sym_max(k, 1), t.kc)  # one (empty) block when K is 0
        self.blocked = evaluate_dim(self.kblocks, maxima or {}) > 1  # partial sums kept between K blocks
        # rows of the last tile row at a static M; the whole tile otherwise (edge rows then computed and dropped)
        self.m_edge = m - (self.mt - 1) * t.mr if isinstance(m, int) and isinstance(self.mt, int) else t.mr
        self.short_from: int | None = None  # see balance_rows
        if isinstance(n, int) and isinstance(self.nt, int):
            self.n_edge = n - (self.nt - 1) * t.nr
            self.b_masked_edge = b_masked_edge and self.n_edge != t.nr
        else:
            assert not b_masked_edge, "a B read in place with a symbolic N is packed per tile"
            self.n_edge, self.b_masked_edge = t.nr, False

    @property
    def blocks(self) -> Dim:
        return self.mblocks * self.nblocks

    def balance_rows(self) -> None:
        """Where the last register tile row would have at most :data:`EDGE_ROWS` rows, give the last tile rows
        one row less than the others instead (``short_from`` on), as many as it takes to share M out with the
        same number of tile rows. A tile of one or two rows reads the whole B panel for a few products; a tile
        one row short runs near the rate of a whole one. Only for A read in place, whose tiles may start at
        any row (packed A tiles start at multiples of ``mr``)."""
        t = self.t
        m, mt = self.m, self.mt
        if not BALANCED_EDGE or not isinstance(m, int) or not isinstance(mt, int) or t.mr < 3:
            return
        if self.m_edge > EDGE_ROWS or self.m_edge == t.mr:
            return
        whole = m - mt * (t.mr - 1)  # tile rows of mr rows; the rest have mr - 1
        if 0 <= whole < mt:
            self.short_from = whole

    def _next_panel(self, ctx: Ctx, problem: Any, mtv: Val, mt0: Val, nt: Val, nt0: Val, nt1: Val,
                    k0: Val, last_k: Val, n_tiles: Val) -> Val:
        """Where register tile row ``mtv`` of the block fetches ahead: its share of the packed B panel
        used next (the next column tile's, or the next K block's first; after the block's last panel,
        the first panel of the block that follows it), ``kc / every`` lines per tile row."""
        b = ctx.b
        t = self.t
        last_nt = b.icmp_signed("==", nt, b.sub(nt1, const(1)))
        done = b.and_(last_nt, last_k)
        following = b.select(b.icmp_signed("<", nt1, n_tiles), nt1, const(0))
        col = b.select(done, following, b.select(last_nt, nt0, b.add(nt, const(1))))
        k_next = b.select(done, const(0), b.select(last_nt, b.add(k0, const(t.kc)), k0))
        nxt = self.b_at(ctx, problem, b.mul(col, const(t.nr)), k_next, t.nr, None)
        share = b.mul(b.sub(mtv, mt0), const(LINE_FLOATS * -(-t.kc // self.ahead_every)))
        return fgep(b, nxt.ptr, share)

    def emit_block(self, ctx: Ctx, problem: Any, block: Val, size: SizeOf = static_size) -> None:
        """Emit block ``block`` (``0 <= block < self.blocks``) of ``problem``; ``size`` gives the
        value of a symbolic dim (:data:`SizeOf`)."""
        b = ctx.b
        t = self.t
        nr = t.nr
        lanes = t.lanes
        m_rows = size(self.m)
        m_tiles = size(self.mt)
        mb = b.udiv(block, size(self.nblocks))
        nb = b.urem(block, size(self.nblocks))
        mt0 = b.mul(mb, const(t.mb_tiles))
        mt1 = imin(b, b.add(mt0, const(t.mb_tiles)), m_tiles)
        nt0 = b.mul(nb, const(t.nb_tiles))
        nt1 = imin(b, b.add(nt0, const(t.nb_tiles)), size(self.nt))
        blocked = self.blocked
        tile_floats = t.mr * nr
        cbuf = ctx.entry_alloca(ir.ArrayType(F32, tile_floats * (t.mb_tiles * t.nb_tiles if blocked else 1)),
                                "cbuf")
        panel = ctx.entry_alloca(ir.ArrayType(F32, t.kc * nr), "panel") if self.b_pack is not None else None
        row_ptrs = ctx.entry_alloca(ir.ArrayType(PTR, t.mr), "rows", 8)

        def k_block(kb: Val) -> None:
            k0 = b.mul(kb, const(t.kc))
            kn = imin(b, const(t.kc), b.sub(size(self.k), k0))
            first = b.icmp_signed("==", kb, const(0))
            last = b.icmp_signed("==", kb, size(self.kblocks - 1))

            def n_tile(nt: Val) -> None:
                if self.b_pack is not None:
                    assert panel is not None
                    self.b_pack(ctx, problem, b.mul(nt, const(nr)), k0, panel)
                for_range(b, mt0, mt1, "mt", lambda mtv: tile_at(nt, mtv))

            def tile_at(nt: Val, mtv: Val) -> None:
                n0 = b.mul(nt, const(nr))
                cols = imin(b, const(nr), b.sub(size(self.n), n0))
                short = None
                if self.short_from is not None:
                    whole = self.short_from
                    short = b.icmp_signed(">=", mtv, const(whole))
                    m0 = b.select(short, b.add(const(whole * t.mr), b.mul(b.sub(mtv, const(whole)), const(t.mr - 1))),
                                  b.mul(mtv, const(t.mr)))
                    rows = b.select(short, const(t.mr - 1), const(t.mr))
                else:
                    m0 = b.mul(mtv, const(t.mr))
                    rows = imin(b, const(t.mr), b.sub(m_rows, m0))
                slot = b.add(b.mul(b.sub(mtv, mt0), const(t.nb_tiles)), b.sub(nt, nt0)) if blocked else const(0)
                tile = fgep(b, cbuf, b.mul(slot, const(tile_floats)))

                def compute(width: int, height: int) -> None:
                    nv = -(-width // lanes)
                    a = self.a_at(ctx, problem, m0, k0)
                    bb = self.b_at(ctx, problem, n0, k0, width, panel)
                    valid = width % lanes if bb.kind not in PACKED_B and width % lanes else None
                    ahead = self._next_panel(ctx, problem, mtv, mt0, nt, nt0, nt1, k0, last, size(self.nt)) \
                        if bb.kind == "packed" and self.b_pack is None else None
                    a_in_place = a.kind in ("rows", "rowtable")
                    reads_ahead = self.read_ahead > 0 and a_in_place
                    fn = micro_function(ctx.fn.module, a.kind, bb.kind, height, nv, lanes, nr, valid,
                                        self.ahead_every if ahead is not None else 0, a_stride=t.mr,
                                        read_ahead=reads_ahead, ahead_locality=self.ahead_locality)
                    null = ir.Constant(PTR, None)
                    if a_in_place:
                        rows = a.ptr
                        assert isinstance(rows, list)
                        a_arg = row_ptrs
                        for i, p in enumerate(rows):
                            b.store(p, b.gep(row_ptrs, [const(i)], inbounds=True, source_etype=PTR))
                        read_at = fgep(b, rows[0], self.read_ahead, inbounds=False) if reads_ahead else null
                    else:
                        assert not isinstance(a.ptr, list)
                        a_arg = a.ptr
                        read_at = null
                    if self.store_ahead is not None:  # in the K block that stores
                        fetch = self.store_ahead
                        if blocked:
                            if_then(b, last, "store.ahead", lambda: fetch(ctx, problem, m0, n0))
                        else:
                            fetch(ctx, problem, m0, n0)
                    acc = b.not_(first) if blocked else ir.Constant(I1, 0)
                    table = a.table if a.kind == "rowtable" else bb.table
                    b.call(fn, [a_arg, i64(a.kstride), bb.ptr, i64(bb.kstride), table or null, kn, tile, acc,
                                ahead or null, read_at])

                def across(height: int) -> None:
                    if self.b_masked_edge:
                        if_else(b, b.icmp_signed("==", nt, size(self.nt - 1)), "tile.edge",
                               lambda: compute(self.n_edge, height), lambda: compute(nr, height))
                    else:
                        compute(nr, height)

                if short is not None:  # the last tile rows are one row short
                    if_else(b, short, "tile.short", lambda: across(t.mr - 1), lambda: across(t.mr))
                elif self.m_edge != t.mr:  # the last tile row has fewer rows: a shorter micro-kernel
                    if_else(b, b.icmp_signed("==", mtv, const(int(self.mt) - 1)), "tile.bottom",
                           lambda: across(self.m_edge), lambda: across(t.mr))
                else:
                    across(t.mr)
                if blocked:
                    if_then(b, last, "store", lambda: self.store(ctx, problem, m0, n0, rows, cols, tile, nr))
                else:
                    self.store(ctx, problem, m0, n0, rows, cols, tile, nr)

            if self.rows_outer:  # each tile row sweeps the block's columns: its stores are a few streams
                assert self.b_pack is None, "a panel packed at run time is shared by the tile rows: columns outer"
                for_range(b, mt0, mt1, "mt", lambda mtv: for_range(b, nt0, nt1, "nt", lambda nt: tile_at(nt, mtv)))
            else:
                for_range(b, nt0, nt1, "nt", n_tile)

        for_range(b, 0, self.kblocks if isinstance(self.kblocks, int) else size(self.kblocks), "kb", k_block)


# --------------------------------------------------------------------------------------
# epilogue stores


def epilogue_emitter(ctx: Ctx, contraction: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                     op: str, dims: DimValues | None = None) -> EpilogueEmitter:
    """The epilogue of one chunk body; with ``dims`` the types may hold symbolic dims (read from them)."""
    def shape(t: TensorType) -> tuple[Dim, ...]:
        return tuple(t.shape) if dims is not None else tuple(int(d) for d in t.shape)

    inputs = [Buffer(p, t.dtype, shape(t)) for p, t in zip(ctx.ins, in_types, strict=True)]
    out = Buffer(ctx.out, out_type.dtype, shape(out_type))
    return EpilogueEmitter(ctx.fn, ctx.alloca, ctx.b, contraction.epilogue, inputs, out, op, contraction.marker,
                           ctx.err, dims)


TRANSPOSE_GROUP = 16
"""Tile columns a transposed store moves at once: one vector per tile row, turned into one per column."""


def reads_by_row(epi: EpilogueEmitter, row_axes: frozenset[str]) -> bool:
    """Whether the epilogue stores float32 and reads no operand along the output axes ``row_axes`` (a
    bias or scale per channel; a residual is read along them): it can then run along tile rows."""
    free = FreeVars()
    return epi.out.dtype == DType.f32 and not any(
        isinstance(e, R.Load) and e.operand != epi.marker and free(e) & row_axes for e in walk_exprs(epi.rule))


IN_PLACE_COLUMNS = True
"""Whether a transposed store whose epilogue reads a residual (:func:`reads_in_place_along`) transposes the tile
first and runs the epilogue down its columns (see :func:`store_rows`); else element by element, a gather."""


def reads_in_place_along(epi: EpilogueEmitter, row_axes: frozenset[str]) -> bool:
    """Whether every operand the epilogue reads along the output axes ``row_axes`` is read at the output
    element's own place (a residual of the output's shape: :meth:`EpilogueEmitter.in_place`)."""
    free = FreeVars()
    return all(epi.in_place(e) for e in walk_exprs(epi.rule)
               if isinstance(e, R.Load) and e.operand != epi.marker and free(e) & row_axes)


def store_rows(ctx: Ctx, epi: EpilogueEmitter, tile: Val, tile_stride: int, rows: int | Val,
               cols: int | Val, index_of: Callable[[Val, Val], Sequence[Val]],
               flat_of: Callable[[Val, Val], Val], col0: Val | int = 0,
               by_columns: bool = False, max_rows: int | None = None,
               row_axes: frozenset[str] = frozenset(), flat_reads: bool = False) -> None:
    """For ``i < rows``, ``j < cols``: ``out[flat_of(i, j)] = epilogue(tile[i][col0 + j])`` at
    output index ``index_of(i, j)``. The inner loop runs along a tile row (contiguous there, so
    LLVM vectorizes it), or down a tile column when ``by_columns`` (where the output is contiguous:
    ``flat_of(i, j) = flat_of(0, j) + i``). Given ``max_rows`` (the tile's rows, at most eight) and the
    output axes ``row_axes`` that the tile's rows run along, the latter moves the tile in registers: where
    the epilogue reads nothing along ``row_axes`` (:func:`reads_by_row`) it first runs along the tile's rows
    in place and then stores the tile transposed; where it reads along them only at the output element's own
    place (:func:`reads_in_place_along`: a residual) the tile is first transposed into a buffer and the
    epilogue runs down each column from it, reading the residual as contiguously as it stores. Otherwise
    (or without ``max_rows``) a column of elements is read one by one, a gather. ``flat_reads`` (along rows):
    operands of the output's shape are read at the output element's flat index (the epilogue's in-place reads),
    where their layout is the output's and not the row-major one the index would give."""
    b = ctx.b
    c0 = const(col0) if isinstance(col0, int) else col0
    # the tile's rows where it moves in registers (a transposed store of at most eight rows), else None
    moves = by_columns and isinstance(col0, int) and col0 == 0 and max_rows is not None and max_rows <= 8
    tile_rows = max_rows if moves else None
    if tile_rows is not None and reads_by_row(epi, row_axes):
        def in_place(i: Val) -> None:
            base = fgep(b, tile, b.mul(i, const(tile_stride)))

            def col(j: Val) -> None:
                at = fgep(b, base, j)
                value = epi.element(index_of(i, j), b.load(at, typ=F32, align=4))
                b.store(epi.s.to_storage(value, DType.f32), at)

            for_range(b, 0, cols, "col", col)

        for_range(b, 0, rows, "row", in_place, hints=OUTER_ONLY)
        store_transposed(b, epi.out.ptr, tile, tile_stride, rows, cols, lambda j: flat_of(const(0), j), tile_rows)
        return
    if tile_rows is not None and IN_PLACE_COLUMNS and reads_in_place_along(epi, row_axes):
        width = 1 << (tile_rows - 1).bit_length()
        columns = ctx.entry_alloca(ir.ArrayType(F32, tile_stride * width), "columns")
        store_transposed(b, columns, tile, tile_stride, rows, cols, lambda j: b.mul(j, const(width)), tile_rows)

        def down(j: Val) -> None:
            def element(i: Val) -> None:
                acc = b.load(fgep(b, columns, b.add(b.mul(j, const(width)), i)), typ=F32, align=4)
                flat = flat_of(i, j)
                epi.store(flat, epi.element(index_of(i, j), acc, flat=flat))

            for_range(b, 0, rows, "row", element, hints=MASKED_TAIL)

        for_range(b, 0, cols, "col", down, hints=OUTER_ONLY)
        return
    if by_columns:
        def column(j: Val) -> None:
            def element(i: Val) -> None:
                acc = b.load(fgep(b, tile, b.add(b.mul(i, const(tile_stride)), b.add(c0, j))), typ=F32, align=4)
                epi.store(flat_of(i, j), epi.element(index_of(i, j), acc))

            for_range(b, 0, rows, "row", element)

        for_range(b, 0, cols, "col", column, hints=OUTER_ONLY)
        return

    erf = epi.erf_arguments() or []
    blocks = ErfBlocks(b, ctx.alloca, epi.s, len(erf), tile_stride, "col") if erf else None

    def row(i: Val, width: int | Val) -> None:
        base = fgep(b, tile, b.add(b.mul(i, const(tile_stride)), c0))

        def col(j: Val, known: Sequence[Val] = ()) -> None:
            acc = b.load(fgep(b, base, j), typ=F32, align=4)
            flat = flat_of(i, j)
            value = epi.element(index_of(i, j), acc, list(zip(erf, known, strict=True)) if known else (),
                                flat=flat if flat_reads else None)
            epi.store(flat, value)

        if blocks is None:
            for_range(b, 0, width, "col", col)
            return
        blocks.run(const(0), const(width) if isinstance(width, int) else width,
                   lambda j: epi.values(index_of(i, j), b.load(fgep(b, base, j), typ=F32, align=4), erf,
                                        flat=flat_of(i, j) if flat_reads else None), col)

    if isinstance(cols, int) or not isinstance(col0, int) or col0 != 0:
        for_range(b, 0, rows, "row", lambda i: row(i, cols), hints=OUTER_ONLY)  # one copy of the epilogue loop
        return
    # a whole tile row is a loop of known length: vectorized whole, with no remainder to run
    if_else(b, b.icmp_signed("==", cols, const(tile_stride)), "whole",
            lambda: for_range(b, 0, rows, "row", lambda i: row(i, tile_stride), hints=OUTER_ONLY),
            lambda: for_range(b, 0, rows, "row", lambda i: row(i, cols), hints=OUTER_ONLY))


def transpose(b: Builder, rows: Sequence[Val], width: int) -> list[Val]:
    """The columns of the matrix whose rows are ``rows`` (vectors of one length), each a vector of ``width``
    lanes (``width`` a power of two, at least ``len(rows)``; the lanes past the rows undefined): the rows
    are concatenated pairwise, then each column picked out by one shuffle (LLVM lowers the tree to
    unpacks and permutes)."""
    row_t = rows[0].type
    assert isinstance(row_t, ir.VectorType)
    n = row_t.count
    if n == width == len(rows) == 16:
        return _transpose16(b, rows)
    if n == 16 and width == 8 and len(rows) <= 8:
        return _transpose8(b, [*rows, *[ir.Constant(row_t, None)] * (8 - len(rows))])
    vectors = [*rows, *[ir.Constant(row_t, None)] * (width - len(rows))]
    size = n
    while len(vectors) > 1:  # concatenate pairs: element i * n + j is rows[i][j]
        pair = ir.Constant(ir.VectorType(I32, 2 * size), list(range(2 * size)))
        vectors = [b.shuffle_vector(vectors[k], vectors[k + 1], pair) for k in range(0, len(vectors), 2)]
        size *= 2
    every = vectors[0]
    spare = ir.Constant(every.type, None)
    return [b.shuffle_vector(every, spare, ir.Constant(ir.VectorType(I32, width), [i * n + j for i in range(width)]))
            for j in range(n)]


def _shuffle(b: Builder, x: Val, y: Val, mask: Sequence[int]) -> Val:
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, len(mask)), list(mask)))


def _within_lanes(pick: Sequence[int]) -> list[int]:
    """A two-source shuffle within 128-bit lanes: ``pick`` indexes a lane's element of x (0-3) or of y (4-7)."""
    return [(16 if p >= 4 else 0) + 4 * lane + p % 4 for lane in range(4) for p in pick]


def _lanes_of(pick: Sequence[int]) -> list[int]:
    """A two-source shuffle of whole 128-bit lanes: ``pick``, four lanes of x (0-3) or of y (4-7)."""
    return [4 * p + i for p in pick for i in range(4)]


def _quads(b: Builder, r: Sequence[Val]) -> list[Val]:
    """Four rows of sixteen, in two rounds of four interleaves within 128-bit lanes: vector q holds in lane L the
    four rows' elements 4L + q."""
    lo01, hi01 = (_shuffle(b, r[0], r[1], _within_lanes(p)) for p in ([0, 4, 1, 5], [2, 6, 3, 7]))
    lo23, hi23 = (_shuffle(b, r[2], r[3], _within_lanes(p)) for p in ([0, 4, 1, 5], [2, 6, 3, 7]))
    return [_shuffle(b, x, y, _within_lanes(p)) for x, y in ((lo01, lo23), (hi01, hi23))
            for p in ([0, 1, 4, 5], [2, 3, 6, 7])]


def _transpose16(b: Builder, rows: Sequence[Val]) -> list[Val]:
    """A 16x16 transpose in four rounds of sixteen two-source shuffles (32-bit and 64-bit interleaves within
    128-bit lanes, then two rounds moving whole lanes), each one instruction, where the generic tree of
    :func:`transpose` left LLVM some 165 shuffles per transpose."""
    quads = [_quads(b, rows[4 * g:4 * g + 4]) for g in range(4)]
    columns: list[Val | None] = [None] * 16
    for q in range(4):  # rounds 3 and 4: column 4L + q gathers lane L of the four groups' vector q
        g0, g1, g2, g3 = (quads[g][q] for g in range(4))
        a, c = _shuffle(b, g0, g1, _lanes_of([0, 2, 4, 6])), _shuffle(b, g2, g3, _lanes_of([0, 2, 4, 6]))
        bb, d = _shuffle(b, g0, g1, _lanes_of([1, 3, 5, 7])), _shuffle(b, g2, g3, _lanes_of([1, 3, 5, 7]))
        columns[q] = _shuffle(b, a, c, _lanes_of([0, 2, 4, 6]))
        columns[8 + q] = _shuffle(b, a, c, _lanes_of([1, 3, 5, 7]))
        columns[4 + q] = _shuffle(b, bb, d, _lanes_of([0, 2, 4, 6]))
        columns[12 + q] = _shuffle(b, bb, d, _lanes_of([1, 3, 5, 7]))
    return [cast(Val, col) for col in columns]


def _transpose8(b: Builder, rows: Sequence[Val]) -> list[Val]:
    """Eight rows of sixteen into sixteen columns of eight: the 16x16 transpose's first two rounds per four rows,
    then one round pairing the two groups' 128-bit lanes (each column the low or high half of a vector), 24
    two-source shuffles (and the halves) where the generic tree left LLVM some 100 and spills for six rows."""
    g0, g1 = _quads(b, rows[:4]), _quads(b, rows[4:8])
    columns: list[Val | None] = [None] * 16
    spare = ir.Constant(rows[0].type, None)
    for q in range(4):  # column 4L + q: lane L of the first group's vector q, then lane L of the second's
        low = _shuffle(b, g0[q], g1[q], _lanes_of([0, 4, 1, 5]))
        high = _shuffle(b, g0[q], g1[q], _lanes_of([2, 6, 3, 7]))
        for k, (v, half) in enumerate(((low, 0), (low, 1), (high, 0), (high, 1))):
            columns[4 * k + q] = _shuffle(b, v, spare, list(range(8 * half, 8 * half + 8)))
    return [cast(Val, col) for col in columns]


def store_transposed(b: Builder, out: Val, tile: Val, tile_stride: int, rows: int | Val, cols: int | Val,
                     column_at: Callable[[Val], Val], max_rows: int) -> None:
    """``out[column_at(j) + i] = tile[i][j]`` for ``i < rows <= max_rows``, ``j < cols``: every
    :data:`TRANSPOSE_GROUP` columns are read as one vector per tile row, shuffled into one vector per
    column and stored with ``rows`` lanes enabled; the columns past the last whole group one element at a time."""
    width = 1 << (max_rows - 1).bit_length()
    group = TRANSPOSE_GROUP
    row_t = vec_type(group)
    rows_v = const(rows) if isinstance(rows, int) else rows
    lanes = ir.Constant(ir.VectorType(I64, width), list(range(width)))
    mask = b.icmp_unsigned("<", lanes, splat(b, rows_v, width))
    cols_v = const(cols) if isinstance(cols, int) else cols
    whole = b.and_(cols_v, const(-group))

    def columns(j0: Val) -> None:
        rows_of_tile = [b.load(fgep(b, tile, b.add(const(i * tile_stride), j0)), typ=row_t, align=4)
                        for i in range(max_rows)]
        for j, column in enumerate(transpose(b, rows_of_tile, width)):
            masked_store(b, column, fgep(b, out, column_at(b.add(j0, const(j)))), mask)

    def group_of_columns(j0: Val, carried: list[Val]) -> list[Val]:
        columns(j0)
        return carried

    counted_loop(b, "tcols", const(0), lambda j: b.icmp_signed("<", j, whole), group, group_of_columns,
                 hints=NO_UNROLL)

    def rest(j: Val) -> None:
        def element(i: Val) -> None:
            value = b.load(fgep(b, tile, b.add(b.mul(i, const(tile_stride)), j)), typ=F32, align=4)
            b.store(value, fgep(b, out, b.add(column_at(j), i)))

        for_range(b, 0, rows, "trow", element)

    for_range(b, whole, cols_v, "tcol", rest)


def broadcast_offset(b: Builder, index: Sequence[Val], in_shape: Sequence[Dim],
                     out_shape: Sequence[Dim], block: Dim, size: SizeOf = static_size) -> Val:
    """Element offset of the batch ``index`` (of ``out_shape``) in an operand with batch dims
    ``in_shape`` (numpy broadcasting: a dim that is 1 is broadcast) whose batch entries are ``block``
    elements apart; ``size`` gives the strides' values where they are symbolic."""
    strides: list[Dim] = [block] * len(in_shape)
    for d in range(len(in_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * in_shape[d + 1]
    off: Val = const(0)
    lead = len(out_shape) - len(in_shape)
    for d, (n, s) in enumerate(zip(in_shape, strides, strict=True)):
        if n == 1:
            continue
        off = b.add(off, b.mul(index[lead + d], size(s)))
    return off


def agrees_at_every_size(c: Contraction) -> bool:
    """Whether the matmul ``c``'s sizes are the same dims wherever they appear (K of both operands, M
    of the lhs and the output, N of the rhs and the output), and each operand's batch dims broadcast
    to the output's the same way at every size: each is 1 or the output's own dim. (A kernel whose
    sizes are read at run time reads each once; a symbolic dim that would broadcast only at some
    sizes, or a K the type leaves to be equal to another only when the function runs, is refused.)"""
    lhs, rhs, out = tuple(c.lhs_type.shape), tuple(c.rhs_type.shape), tuple(c.out_type.shape)
    if min(len(lhs), len(rhs)) < 2 or len(out) != max(len(lhs), len(rhs)):
        return False
    m, k = (lhs[-1], lhs[-2]) if c.attrs.get("transpose_a", False) else (lhs[-2], lhs[-1])
    k_rhs, n = (rhs[-1], rhs[-2]) if c.attrs.get("transpose_b", False) else (rhs[-2], rhs[-1])
    if k != k_rhs or m != out[-2] or n != out[-1]:
        return False
    lead = len(out) - 2
    return all(d == 1 or d == out[lead - len(batch) + j] for batch in (lhs[:-2], rhs[:-2]) for j, d in enumerate(batch))


# --------------------------------------------------------------------------------------
# matmul


@dataclass(frozen=True)
class RunTimeDims:
    """The sizes of a kernel in a function compiled for a shape class: its types' symbolic dims are
    read at run time from its trailing ``dims`` argument (``symbols``' values, in that order), each
    symbol at most its ``maxima``, which the tiling is chosen for (any run-time value is computed
    correctly; it is only the better fit)."""

    symbols: tuple[str, ...]
    maxima: Mapping[str, int]

    def largest(self, d: Dim) -> int:
        """The size to tile ``d`` for (at least 1)."""
        return max(1, evaluate_dim(d, self.maxima))

    def values(self, b: Builder, dims_ptr: Val | None) -> DimValues:
        """The dims of a call of the function whose ``dims`` argument is ``dims_ptr``, emitted at ``b``."""
        assert dims_ptr is not None
        return DimValues(b, dims_ptr, self.symbols)


def _at_least_zero(d: Dim) -> Dim:
    """A symbolic size, a negative value read as 0 (static sizes are as they are)."""
    return d if isinstance(d, int) else sym_max(d, 0)


def rows_view(c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
              ) -> tuple[Contraction, list[TensorType], TensorType, Dim] | None:
    """``[*lead, K] @ [K, N] -> [*lead, N]`` seen as one GEMM of ``M = prod(lead)`` rows (they are
    contiguous in a row-major lhs and output), the way a kernel whose leading dims are symbolic
    runs it: the lhs, the output and each epilogue operand of the output's shape get the shape
    ``(1, ..., 1, M, last)`` (same rank; the kernel indexes them ``[0, ..., 0, row, col]``, which
    is the same element). Returns the contraction, operand types and output type of that view,
    and ``M``; or None when the view is not exact: a transposed lhs, a batched rhs, or an
    epilogue that reads an operand by row other than in the output's own layout (a ``[S, N]``
    residual of a ``[B, S, N]`` output, the lhs itself, a row index used as a value)."""
    lhs, rhs, out = tuple(c.lhs_type.shape), tuple(c.rhs_type.shape), tuple(out_type.shape)
    if c.attrs.get("transpose_a", False) or len(rhs) != 2 or len(lhs) < 2 or len(out) != len(lhs):
        return None
    if lhs[:-1] != out[:-1] or tuple(c.out_type.shape) != out:
        return None
    lead = len(lhs) - 1
    row_vars = {f"i{k}" for k in range(lead)}
    free = FreeVars()
    nodes = walk_exprs(c.epilogue)
    if any(isinstance(x, R.IndexValue) and free(x) & row_vars for x in nodes):
        return None
    loads = [x for x in nodes if isinstance(x, R.Load) and x.operand != c.marker]
    by_row = {x.operand for x in loads if free(x) & row_vars}  # read at the output's own index, or refused
    if reads_operand(c.epilogue, c.lhs):
        return None
    for x in loads:
        if x.operand in by_row and (not is_identity_index(x.index) or tuple(in_types[x.operand].shape) != out):
            return None
    m: Dim = 1
    for d in lhs[:-1]:
        m = m * d

    def view(t: TensorType) -> TensorType:
        return TensorType(t.dtype, (1,) * (lead - 1) + (m, t.shape[-1]))

    types = [view(t) if k == c.lhs or k in by_row else t for k, t in enumerate(in_types)]
    viewed = replace(c, lhs_type=view(c.lhs_type), out_type=view(c.out_type))
    return viewed, types, view(out_type), m


class MatmulKernel:
    """``matmul`` (batched, transposes, broadcasting batch dims) with its fused epilogue.

    A constant rhs is packed into column panels at compile time; a constant lhs is read in
    place like any other (rows are broadcast, so packing buys little there).

    With ``runtime`` (a shape class) any of M, N, K and the batch dims may be symbolic, read from
    the kernel's trailing ``ptr dims`` argument: the tiling is chosen for their largest values, the
    number of chunks, the offsets and strides of each problem and the choice of the pool are
    computed at run time, and an empty output runs nothing. A B read in place with a symbolic N is
    packed per tile (as a transposed one is). The sizes must agree at every size
    (:func:`agrees_at_every_size`). For a constant ``[K, N]`` rhs, the caller gives
    the types of :func:`rows_view` instead: one GEMM of the leading dims' product rows."""

    def __init__(self, op: str, contraction: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                 rhs_const: np.ndarray | None, isa: Isa, runtime: RunTimeDims | None = None) -> None:
        self.op = op
        self.c = contraction
        self.in_types = list(in_types)
        self.out_type = out_type
        self.isa = isa
        self.runtime = runtime
        a_shape, b_shape = tuple(contraction.lhs_type.shape), tuple(contraction.rhs_type.shape)
        self.ta = bool(contraction.attrs.get("transpose_a", False))
        self.tb = bool(contraction.attrs.get("transpose_b", False))
        m, k = (a_shape[-1], a_shape[-2]) if self.ta else (a_shape[-2], a_shape[-1])
        n = b_shape[-2] if self.tb else b_shape[-1]
        self.m, self.n, self.k = (_at_least_zero(d) for d in (m, n, k))
        self.a_batch, self.b_batch = a_shape[:-2], b_shape[:-2]
        self.out_batch = tuple(contraction.out_type.shape)[:-2]
        self.batch: Dim = _at_least_zero(math.prod(self.out_batch))
        largest = runtime.largest if runtime is not None else int
        self.tiling = choose_tiling(isa, largest(self.m), largest(self.n), largest(self.k))
        self.packed: np.ndarray | None = None
        self.half_panels = rhs_const is not None and rhs_const.dtype == np.float16
        """A float16 constant rhs (a widened kernel's) stays float16 in its panels: each is widened as it is
        read (exact), so the products are the same and half the bytes stream."""
        if rhs_const is not None:
            mat = np.swapaxes(rhs_const, -1, -2) if self.tb else rhs_const
            self.packed = pack_b_panels(mat, self.tiling.nr, np.float16 if self.half_panels else np.float32)
        in_place = "pack" if self.tb or not isinstance(self.n, int) else "direct"
        self.b_mode = ("packed16" if self.half_panels else "packed") if self.packed is not None else in_place

    @property
    def name(self) -> str:
        t = self.tiling
        base = f"gemm.{self.isa.name}.{t.mr}x{t.nr}.{self.b_mode}_b"
        if self.runtime is None:
            return base
        sizes = {"b": self.batch, "m": self.m, "n": self.n, "k": self.k}
        return base + ".runtime_" + ("".join(x for x, d in sizes.items() if not isinstance(d, int)) or "epilogue")

    @property
    def unused_operands(self) -> frozenset[int]:
        """The raw rhs is not read when it was packed (unless the epilogue reads it too)."""
        if self.packed is None or reads_operand(self.c.epilogue, self.c.rhs) or self.c.rhs == self.c.lhs:
            return frozenset()
        return frozenset([self.c.rhs])

    scratch_bytes = 0  # a B packed at run time goes to a panel on the stack

    @property
    def constant_bytes(self) -> int:
        return 0 if self.packed is None else int(self.packed.nbytes)

    def _dims(self, b: Builder, dims_ptr: Val | None) -> tuple[DimValues | None, SizeOf]:
        """The dims of a call (emitted at ``b``, once per function) and the values of sizes; at
        static shapes, no dims and constants."""
        if self.runtime is None:
            return None, static_size
        dims = self.runtime.values(b, dims_ptr)
        return dims, dims.value

    @property
    def _packed_in_slot(self) -> bool:
        return self.packed is not None and self.c.rhs in self.unused_operands

    def operand_data(self, mod: ir.Module, name: str) -> dict[int, ir.GlobalVariable]:
        """The packed rhs, which the call passes in the raw rhs's slot where that is not read: the kernel's
        code is then the same for every weight of its shape (one function for a network's repeated layers)."""
        if not self._packed_in_slot or self.packed is None:
            return {}
        data: dict[int, ir.GlobalVariable] = {self.c.rhs: embed_array(mod, f"{name}.packed_b", self.packed)}
        return data

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, len(self.in_types), dims=self.runtime is not None)
        t = self.tiling
        packed = None if self.packed is None or self._packed_in_slot else \
            embed_array(mod, f"{name}.packed_b", self.packed)
        m, n, k = self.m, self.n, self.k
        a_block, b_block = m * k, k * n
        packed_block = self.packed.shape[-3] * k * t.nr if self.packed is not None else 0

        def a_at(ctx: Ctx, prob: Any, m0: Val, k0: Val) -> AOperand:
            b = ctx.b
            size: SizeOf = prob["size"]
            base = fgep(ctx.b, ctx.ins[self.c.lhs], prob["a_off"])
            ptrs = []
            for i in range(t.mr):
                row = imin(b, b.add(m0, const(i)), prob["last_row"])
                if self.ta:
                    ptrs.append(fgep(b, base, b.add(row, b.mul(k0, size(m)))))
                else:
                    ptrs.append(fgep(b, base, b.add(b.mul(row, size(k)), k0)))
            return AOperand("rows", ptrs, size(m) if self.ta else 1)

        def b_at(ctx: Ctx, prob: Any, n0: Val, k0: Val, cols: int, panel: Val | None) -> BOperand:
            b = ctx.b
            size: SizeOf = prob["size"]
            if self.packed is not None:
                base = ctx.ins[self.c.rhs] if packed is None else packed
                nt = b.udiv(n0, const(t.nr))
                off = b.add(prob["b_off"], b.add(b.mul(nt, size(k * t.nr)), b.mul(k0, const(t.nr))))
                if self.half_panels:
                    return BOperand("packed16", hgep(b, base, off))
                return BOperand("packed", fgep(b, base, off))
            if panel is not None:
                return BOperand("packed", panel)
            base = fgep(b, ctx.ins[self.c.rhs], b.add(prob["b_off"], b.add(b.mul(k0, size(n)), n0)))
            return BOperand("direct", base, size(n))

        def b_pack(ctx: Ctx, prob: Any, n0: Val, k0: Val, panel: Val) -> None:
            """panel[kk][j] = B[k0 + kk, n0 + j] (0 past N), B read in place: a transposed rhs, or
            one whose N is symbolic (then its last tile would need a mask known only at run time)."""
            b = ctx.b
            size: SizeOf = prob["size"]
            src = fgep(b, ctx.ins[self.c.rhs], prob["b_off"])
            kn = imin(b, const(t.kc), b.sub(size(k), k0))
            if not self.tb:
                cols = imin(b, const(t.nr), b.sub(size(n), n0))
                pack_panel(b, fgep(b, src, b.add(b.mul(k0, size(n)), n0)), size(n), kn, cols, panel, t.nr)
                return

            def col(j: Val) -> None:
                nn = b.add(n0, j)
                inside = b.icmp_signed("<", nn, size(n))
                row = fgep(b, src, b.add(b.mul(imin(b, nn, size(n - 1)), size(k)), k0))

                def step(kk: Val) -> None:
                    v = b.load(fgep(b, row, kk), typ=F32, align=4)
                    b.store(b.select(inside, v, ir.Constant(F32, 0.0)),
                            fgep(b, panel, b.add(b.mul(kk, const(t.nr)), j)), align=4)

                for_range(b, 0, kn, "pk", step)

            for_range(b, 0, t.nr, "pj", col)

        def store(ctx: Ctx, prob: Any, m0: Val, n0: Val, rows: Val, cols: Val,
                  tile: Val, stride: int) -> None:
            b = ctx.b
            size: SizeOf = prob["size"]
            epi = prob["epi"]
            out_base = b.mul(prob["batch"], size(m * n))

            def index_of(i: Val, j: Val) -> list[Val]:
                return [*prob["bidx"], b.add(m0, i), b.add(n0, j)]

            def flat_of(i: Val, j: Val) -> Val:
                return b.add(out_base, b.add(b.mul(b.add(m0, i), size(n)), b.add(n0, j)))

            store_rows(ctx, epi, tile, stride, rows, cols, index_of, flat_of)

        core = GemmCore(m, n, k, t, a_at, b_at, store, b_pack if self.b_mode == "pack" else None,
                        b_masked_edge=self.b_mode == "direct", maxima=self.runtime.maxima if self.runtime else None)
        core.balance_rows()  # A is read in place

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            dims, size = self._dims(ctx.alloca, ctx.dims)  # read once per body, in its entry block
            if self.runtime is not None and self.batch == 1:  # one problem: a chunk is a block
                batch, block = const(0), c
            else:
                batch = b.udiv(c, size(core.blocks))
                block = b.urem(c, size(core.blocks))
            bidx = unravel(b, batch, [d if isinstance(d, int) else size(d) for d in self.out_batch])
            prob = {
                "size": size,
                "batch": batch,
                "bidx": bidx,
                "a_off": broadcast_offset(b, bidx, self.a_batch, self.out_batch, a_block, size),
                "b_off": broadcast_offset(b, bidx, self.b_batch, self.out_batch,
                                          packed_block if self.packed is not None else b_block, size),
                "epi": epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op, dims),
                "last_row": size(m - 1),
            }
            core.emit_block(ctx, prob, block, size)

        size = self._dims(kf.b, kf.dims)[1]
        if self.runtime is None:
            kf.phase(int(self.batch * core.blocks), int(self.batch) * product_work(int(m), int(n), int(k)), chunk)
        else:
            kf.phase(size(self.batch * core.blocks), size(2 * self.batch * m * n * k), chunk)
        return kf.finish()


__all__ = ["ISAS", "GemmCore", "Isa", "KernelFunction", "MatmulKernel", "RunTimeDims", "Tiling",
           "agrees_at_every_size", "choose_tiling", "force_isa", "host_isa", "rows_view"]
