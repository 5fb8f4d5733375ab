"""2-D max and average pooling as schedules of ``max_pool``'s and ``avg_pool``'s rules: per output, the
window's taps folded in row-major order (``max`` from -inf, a tap outside the input reading -inf; ``add``
from -0.0, a tap outside reading +0.0, the sum then divided by the window's count), as the rules do.

The generic lowering ran the rule's nest one output at a time (ResNet-18's stem pool: 0.23 ms on one
thread, where ONNX Runtime's takes 0.14 in its network). Here, per channel and output row, one loop
along the row computes every input column's window at stride 1 across (a kernel row outside the input
reads a row of the padding's value); at a stride across, those go to a row buffer and every stride-th
is stored. Where the plane fits the stack it is first copied between columns of the padding's value, so
that every tap is a plain load; else a tap past a row's end is a load not taken (a masked load). Each
output's taps are the rule's, folded in the rule's order with the rule's primitive (``max``:
NaN-propagating, a tie giving the later tap), so the results are the rule's bit for bit, signed zeros
and NaNs included.

A max pool at a stride of 1 or 2 across computes each input row's maxima along the row once, at the
output columns (at stride 2 from the even elements of two contiguous vectors), then each output folds its
kernel rows' maxima (a fold of folds of ``max`` is the rule's fold, bit for bit; a sum's is not, so an
average pool folds its whole window): one thread, ResNet's stem pool 0.21 -> 0.15 ms.

Where every reader of its output is a position-row convolution (:mod:`cuvil.codegen.activation_layout`), such a
max pool stores channels-last: per group of :data:`CHANNEL_GROUP` channels, each plane made as above into its
NCHW place in scratch, then the group stored transposed, one vector of sixteen channels per output position.
ResNet-18, one thread, two profiled builds called in turn: the pool 0.19 -> 0.23 ms, the first block's two
sums 2.09 -> 2.03-2.04 ms each (no transposed store, the residual read channels-last) and the layers after
them 0.01-0.02 faster; whole calls (eight rounds of 30 each) 33.13 -> 33.04 ms, two threads (six rounds)
16.75 -> 16.68. Making each output row of the group's channels in turn (each input row's maxima kept in
a ring, no scratch) read sixteen planes at once and took the pool to 0.24-0.34 ms; groups of 8, 32 and 64
planes measured slower than 16.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen.kernels.base import ReadsEveryOperand
from cuvil.codegen.kernels.chunked import STEP_FLOPS
from cuvil.codegen.kernels.gemm import (
    Ctx,
    KernelFunction,
    even_lanes,
    fgep,
    host_isa,
    prefetch,
    span_inside,
    splat,
    store_transposed,
)
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.kernels.widen import HALVES, WidenedKernel, widened, widened_types
from cuvil.codegen.llvm_types import F32
from cuvil.codegen.loops import MASKED_TAIL, NO_UNROLL, OUTER_ONLY, const, for_range, load_if_inside, plane_row
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val, identity
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.ops.nn import window_params
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

ROWS_AHEAD = 8
"""At a stride of 2 across, each input row's pass first fetches the row this many rows on: the plane comes
from L3 or memory (ResNet-18's stem writes 3.2 MB just before), and the row maxima's masked loads left the
hardware prefetchers behind. One thread, two profiled ResNet-18 builds interleaved: the stem's max pool
0.355 -> 0.272 ms (4 rows ahead: 0.275 against 0.263 for 8 in the same run; 16: 0.306 against 0.289)."""

EDGE_BLOCKS_MAX = 4
"""At a stride of 2 across, the row pass's blocks that read past a row's ends (a tap's lanes masked) are
emitted one by one with their masks as constants, where there are at most this many; the blocks between
them read plain vectors. On a 2-core Zen 4 the masks, computed per block from lane indices, had made the
stem's pool of ResNet-18 instruction-bound: alone 0.22 ms where ONNX Runtime's takes 0.06."""

ROWS_MAX_BYTES = 64 * 1024
"""Bound on the stack a chunk's row maxima take (:meth:`MaxPoolKernel._rows_then_columns`)."""

CHANNEL_GROUP = 16
"""Channels a channels-last max pool computes together (:meth:`MaxPoolKernel._channel_groups`): their planes, then
one vector of them per output position."""

PADDED_MAX_BYTES = 64 * 1024
"""Bound on the stack a plane's padded copy takes (:meth:`WindowsAlongRows._pad_plane`); a larger plane's
taps at a row's ends load under a branch."""


def _along(count: int) -> tuple[str, ...]:
    """Hints for a loop of ``count`` steps along a row, inside one over rows (which is :data:`OUTER_ONLY`):
    vectorized with a masked tail, and where it is one vector or less, not unrolled: LLVM unrolled such a
    loop whole and vectorized nothing (a 14 x 14 average pool: 1.3 ns an element, 0.53 not unrolled)."""
    return (*MASKED_TAIL, *NO_UNROLL) if count <= host_isa().lanes else MASKED_TAIL


@dataclass(frozen=True)
class WindowsAlongRows(ReadsEveryOperand):
    """A 2-D pool of a static float32 NCHW tensor whose windows are folded per output in the rule's order,
    one output row at a time along the row (the module's docstring); subclasses give the fold."""

    in_type: TensorType
    out_type: TensorType
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]  # the window's start before the first row and column
    dilations: tuple[int, int]

    def _windows(self, kf: KernelFunction, mod: ir.Module, name: str, fold: str, start: ir.Constant,
                 outside: ir.Constant, finish: Callable[[Builder, Val, Val, Val], Val] | None = None) -> None:
        """Each output ``fold`` of its taps from ``start``, a tap outside the input reading ``outside``;
        ``finish(builder, y, x, acc)`` (``x``: the input column the window starts at, plus the left pad)
        turns the fold into the output."""
        n, c, h, w = (int(d) for d in self.in_type.shape)
        oh, ow = (int(d) for d in self.out_type.shape[2:])
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.strides, self.pads, self.dilations
        full = (ow - 1) * sw + 1  # the input columns' windows computed per row (stride 1 across)
        wide = self._padded_width
        below = embed_array(mod, f"{name}.outside", np.full(self._outside_bytes // 4, outside.constant, np.float32))

        def chunk(ctx: Ctx, plane: Val) -> None:
            b = ctx.b
            s = ScalarEmitter(b)
            src = fgep(b, ctx.ins[0], b.mul(plane, const(h * w)))
            out_base = b.mul(plane, const(oh * ow))
            buf = ctx.entry_alloca(ir.ArrayType(F32, full), "poolrow") if sw > 1 else None
            width, left = w, pw  # the rows the taps read, and where a row's first input column lies in them
            if wide is not None:
                src, width, left = self._pad_plane(ctx, src, outside, wide), wide, 0

            def row(y: Val) -> None:
                rows = [plane_row(b, src, b.add(b.mul(y, const(sh)), const(ky * dh - ph)), h, width, below, F32)
                        for ky in range(kh)]
                out_row = b.add(out_base, b.mul(y, const(ow)))

                def columns(first: int, stop: int) -> None:
                    def column(x: Val) -> None:
                        acc: Val = start
                        for ky in range(kh):
                            for kx in range(kw):
                                shift = kx * dw - left
                                if first + shift >= 0 and stop - 1 + shift < width:  # inside for every x
                                    v = b.load(fgep(b, rows[ky], b.add(x, const(shift))), typ=F32, align=4)
                                else:
                                    v = load_if_inside(b, rows[ky], b.add(x, const(shift)), const(width), outside)
                                acc = s.call(fold, [acc, v], [DType.f32, DType.f32], DType.f32, {})
                        if finish is not None:
                            acc = finish(b, y, x, acc)
                        if buf is None:
                            b.store(acc, fgep(b, ctx.out, b.add(out_row, x)), align=4)
                        else:
                            b.store(acc, fgep(b, buf, x), align=4)

                    for_range(b, first, stop, "px", column, hints=_along(stop - first))

                lo, hi = self._inside_columns if wide is None else (0, full)
                columns(0, lo)
                columns(lo, hi)
                columns(hi, full)
                if buf is not None:
                    row_buf: Val = buf

                    def pick(x: Val) -> None:
                        v = b.load(fgep(b, row_buf, b.mul(x, const(sw))), typ=F32, align=4)
                        b.store(v, fgep(b, ctx.out, b.add(out_row, x)), align=4)

                    for_range(b, 0, ow, "pick", pick)

            for_range(b, 0, oh, "py", row, hints=OUTER_ONLY)

        kf.phase(n * c, STEP_FLOPS * n * c * oh * full * kh * kw, chunk)

    @property
    def _outside_bytes(self) -> int:
        """The constant row of the padding's value that a kernel row outside the input reads."""
        return 4 * max(int(self.in_type.shape[3]), self._padded_width or 0)

    @property
    def _padded_width(self) -> int | None:
        """The row length of the plane's padded copy (the left pads, the row, every column a window
        reads past it), where that copy fits :data:`PADDED_MAX_BYTES` of stack, else None."""
        h, w, ow = int(self.in_type.shape[2]), int(self.in_type.shape[3]), int(self.out_type.shape[3])
        (_, kw), (_, sw), (_, pw), (_, dw) = self.kernel, self.strides, self.pads, self.dilations
        wide = max(pw + w, (ow - 1) * sw + 1 + (kw - 1) * dw)
        return wide if h * wide * 4 <= PADDED_MAX_BYTES else None

    def _pad_plane(self, ctx: Ctx, src: Val, outside: ir.Constant, wide: int) -> Val:
        """A copy of the plane at ``src`` whose rows hold ``outside`` before and after the row's
        elements, so that every tap along a row is a plain load: the loads under a branch at a row's
        edges had cost the most on short rows (a 14 x 14 average pool: 1.8 ns an element)."""
        b = ctx.b
        h, w = (int(d) for d in self.in_type.shape[2:])
        pw = self.pads[1]
        padded = ctx.entry_alloca(ir.ArrayType(F32, h * wide), "padded")

        def copy(r: Val) -> None:
            row = fgep(b, padded, b.mul(r, const(wide)))
            for_range(b, 0, pw, "pl", lambda x: b.store(outside, fgep(b, row, x), align=4))
            for_range(b, 0, w, "pc", lambda x: b.store(b.load(fgep(b, src, b.add(b.mul(r, const(w)), x)), typ=F32,
                                                               align=4), fgep(b, row, b.add(x, const(pw))), align=4),
                      hints=MASKED_TAIL)
            for_range(b, pw + w, wide, "pr", lambda x: b.store(outside, fgep(b, row, x), align=4))

        for_range(b, 0, h, "pad", copy, hints=OUTER_ONLY)
        return fgep(b, padded, const(0))

    @property
    def _inside_columns(self) -> tuple[int, int]:
        """The window positions ``[lo, hi)`` along a row (stride 1 across) whose every tap lies inside the
        row: there the taps are plain loads, which the loop vectorizes whole; the edges load under a
        branch (a masked load, whose control flow had kept an average pool's loop scalar)."""
        w, ow = int(self.in_type.shape[3]), int(self.out_type.shape[3])
        (_, kw), (_, sw), (_, pw), (_, dw) = self.kernel, self.strides, self.pads, self.dilations
        full = (ow - 1) * sw + 1
        lo = min(full, max(pw, 0))
        return lo, max(lo, min(full, w - ((kw - 1) * dw - pw)))


@dataclass(frozen=True)
class MaxPoolKernel(WindowsAlongRows):
    """``max_pool`` (values) of a static float32 NCHW tensor; see the module's docstring. With ``out_last`` it
    stores its output channels-last (:mod:`cuvil.codegen.activation_layout` decides; the input stays NCHW)."""

    out_last: bool = False

    @property
    def name(self) -> str:
        return "max_pool.rows" + (".olast" if self.out_last else "")

    @property
    def constant_bytes(self) -> int:
        return self._outside_bytes

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        n, c, h, _ = (int(d) for d in self.in_type.shape)
        (ow, kh, kw) = (int(self.out_type.shape[3]), *self.kernel)
        kf = KernelFunction(mod, name, 1)
        flops = STEP_FLOPS * n * c * (h * kw + int(self.out_type.shape[2]) * kh) * ow
        if self.out_last:
            assert self.can_store_channels_last()
            kf.phase(n * (c // CHANNEL_GROUP), flops, self._channel_groups)
        elif self._by_rows:
            kf.phase(n * c, flops, self._rows_then_columns)
        else:  # the rule's fold starts from the reduction's identity and reads its oob outside the input
            lowest = ir.Constant(F32, float(R.lowest(DType.f32)))
            self._windows(kf, mod, name, "max", identity("max", DType.f32), lowest)
        return kf.finish()

    def can_store_channels_last(self) -> bool:
        """Whether ``out_last`` applies: the row maxima schedule and whole groups of :data:`CHANNEL_GROUP`
        channels."""
        return self._by_rows and int(self.in_type.shape[1]) % CHANNEL_GROUP == 0

    @property
    def _by_rows(self) -> bool:
        """Stride 1 or 2 across, where every input row's maxima along the row fit a chunk's stack."""
        h = int(self.in_type.shape[2])
        return self.strides[1] in (1, 2) and h * self._row_floats * 4 <= ROWS_MAX_BYTES

    @property
    def _row_floats(self) -> int:
        lanes = host_isa().lanes
        return -(-int(self.out_type.shape[3]) // lanes) * lanes

    def _inside_blocks(self, lanes: int) -> tuple[int, int]:
        """The row pass's blocks ``[lo, hi)`` whose every tap reads its ``stride * lanes`` floats inside
        the row."""
        w = int(self.in_type.shape[3])
        (_, kw), (_, sw), (_, pw), (_, dw) = self.kernel, self.strides, self.pads, self.dilations
        blocks = self._row_floats // lanes
        lo = min(blocks, -(-pw // (sw * lanes)))
        reach = (kw - 1) * dw - pw + sw * lanes  # past the block's first input column
        hi = max(lo, min(blocks, (w - reach) // (sw * lanes) + 1 if w >= reach else 0))
        return lo, hi

    def _max(self, b: Builder) -> Callable[[Val, Val], Val]:
        s = ScalarEmitter(b)
        return lambda acc, v: s.call("max", [acc, v], [DType.f32, DType.f32], DType.f32, {})

    def _row_maxima(self, b: Builder, row: Val, dst: Val) -> None:
        """The input row at ``row``: its windows' maxima along the row at the output columns, into the
        :attr:`_row_floats` floats at ``dst`` (a vector at a time, or at stride 2 from the even elements of two
        contiguous vectors; a tap outside the row reads -inf through the load's mask)."""
        w = int(self.in_type.shape[3])
        (_, kw), (_, sw), (_, pw), (_, dw) = self.kernel, self.strides, self.pads, self.dilations
        lanes = host_isa().lanes
        vmax = self._max(b)
        start = identity("max", DType.f32)
        fill = splat(b, ir.Constant(F32, float(R.lowest(DType.f32))), lanes)
        if ROWS_AHEAD:  # the row that many rows on (past the plane: the next plane's; a hint either way)
            ahead = b.gep(row, [const(ROWS_AHEAD * w)], source_etype=F32)
            for line in range(0, w, 16):
                prefetch(b, b.gep(ahead, [const(line)], source_etype=F32))

        def columns(first: Val | int, inside: bool) -> Val:
            """Row elements ``first + sw i`` (-inf outside the row); ``inside``: all of them are in it."""
            spans = [first + k * lanes if isinstance(first, int) else b.add(first, const(k * lanes)) for k in range(sw)]
            if inside:
                loaded = [b.load(fgep(b, row, at), typ=fill.type, align=4) for at in spans]
            else:
                loaded = [span_inside(b, row, at, w, fill) for at in spans]
            return even_lanes(b, loaded[0], loaded[1]) if sw == 2 else loaded[0]

        def block(j: Val | int, inside: bool = False) -> None:
            """Outputs ``j * lanes`` on; ``inside``: every tap's span lies in the row (plain loads)."""
            x0 = const(j * lanes) if isinstance(j, int) else b.mul(j, const(lanes))
            acc = splat(b, start, lanes)
            for kx in range(kw):
                if isinstance(j, int):  # edge blocks: the spans known when compiling (masks as constants)
                    first: Val | int = sw * j * lanes + kx * dw - pw
                else:
                    first = b.add(b.mul(x0, const(sw)), const(kx * dw - pw))
                acc = vmax(acc, columns(first, inside))
            b.store(acc, fgep(b, dst, x0), align=4)

        blocks = self._row_floats // lanes
        lo, hi = self._inside_blocks(lanes)
        if blocks - (hi - lo) <= EDGE_BLOCKS_MAX:
            for j in [*range(lo), *range(hi, blocks)]:
                block(j)
            for_range(b, lo, hi, "hx", lambda j: block(j, inside=True), hints=NO_UNROLL)
        else:
            for_range(b, 0, blocks, "hx", block, hints=NO_UNROLL)

    def _fold_rows(self, b: Builder, y: Val, maxima_of: Callable[[Val], Val], out_row: Val) -> None:
        """Output row ``y``: each output the fold of its kernel rows' maxima (``maxima_of(r)``: input row ``r``'s,
        for ``r`` inside the input; a row outside reads -inf), stored along ``out_row``."""
        h, ow = int(self.in_type.shape[2]), int(self.out_type.shape[3])
        (kh, _), (sh, _), (ph, _), (dh, _) = self.kernel, self.strides, self.pads, self.dilations
        vmax = self._max(b)
        pad = ir.Constant(F32, float(R.lowest(DType.f32)))
        rows = []
        for ky in range(kh):
            r = b.sub(b.add(b.mul(y, const(sh)), const(ky * dh)), const(ph))
            inside = b.icmp_unsigned("<", r, const(h))
            rows.append((inside, maxima_of(b.select(inside, r, const(0)))))

        def column(x: Val) -> None:
            acc: Val = identity("max", DType.f32)
            for inside, at in rows:
                acc = vmax(acc, b.select(inside, b.load(fgep(b, at, x), typ=F32, align=4), pad))
            b.store(acc, fgep(b, out_row, x), align=4)

        for_range(b, 0, ow, "vx", column, hints=_along(ow))

    def _rows_then_columns(self, ctx: Ctx, plane: Val, out: Val | None = None) -> None:
        """One plane at a stride of 1 or 2 across, into its place in the NCHW output (or in ``out``, laid out
        so): each input row's window maxima along the row (:meth:`_row_maxima`), once per row; then each output
        as the fold of its kernel rows' maxima. The rule folds the taps row by row from -inf; a fold of the
        rows' own folds (each from -inf) gives the same value and bits: the first NaN in the rule's order, else
        the last tap equal to the maximum (its sign, for a tie of zeros), as the rule's ``max`` keeps."""
        b = ctx.b
        h, w = (int(d) for d in self.in_type.shape[2:])
        oh, ow = (int(d) for d in self.out_type.shape[2:])
        wide = self._row_floats
        src = fgep(b, ctx.ins[0], b.mul(plane, const(h * w)))
        maxima = ctx.entry_alloca(ir.ArrayType(F32, h * wide), "rowmax")
        for_range(b, 0, h, "hy", lambda r: self._row_maxima(b, fgep(b, src, b.mul(r, const(w))),
                                                            fgep(b, maxima, b.mul(r, const(wide)))),
                  hints=OUTER_ONLY)
        dst = fgep(b, ctx.out if out is None else out, b.mul(plane, const(oh * ow)))
        for_range(b, 0, oh, "vy", lambda y: self._fold_rows(
            b, y, lambda r: fgep(b, maxima, b.mul(r, const(wide))), fgep(b, dst, b.mul(y, const(ow)))),
            hints=OUTER_ONLY)

    @property
    def scratch_bytes(self) -> int:
        """Channels-last, the planes are first made NCHW in scratch (:meth:`_channel_groups`)."""
        return 4 * math.prod(int(d) for d in self.out_type.shape) if self.out_last else 0

    def _channel_groups(self, ctx: Ctx, chunk: Val) -> None:
        """Chunk ``image * groups + group``: :data:`CHANNEL_GROUP` channels, stored channels-last. Each plane is
        made as :meth:`_rows_then_columns` makes it, into its NCHW place in scratch (one plane at a time: each
        read as one stream, as the row-major kernel reads it), then the group's planes are stored transposed,
        each output position's channels as one vector: the same values, the same bits."""
        b = ctx.b
        c = int(self.in_type.shape[1])
        oh, ow = (int(d) for d in self.out_type.shape[2:])
        groups = c // CHANNEL_GROUP
        image, group = b.udiv(chunk, const(groups)), b.urem(chunk, const(groups))
        first = b.add(b.mul(image, const(c)), b.mul(group, const(CHANNEL_GROUP)))  # the group's first plane
        for_range(b, 0, CHANNEL_GROUP, "ch", lambda j: self._rows_then_columns(ctx, b.add(first, j), ctx.scratch),
                  hints=OUTER_ONLY)
        at = b.add(b.mul(image, const(oh * ow * c)), b.mul(group, const(CHANNEL_GROUP)))
        store_transposed(b, ctx.out, fgep(b, ctx.scratch, b.mul(first, const(oh * ow))), oh * ow, CHANNEL_GROUP,
                         oh * ow, lambda p: b.add(at, b.mul(p, const(c))), CHANNEL_GROUP)


@dataclass(frozen=True)
class AvgPoolKernel(WindowsAlongRows):
    """``avg_pool`` of a static float32 NCHW tensor: each window summed in the rule's order from -0.0 (a
    tap outside the input reading +0.0, the rule's ``oob``), then divided by its count. The rule sums the
    count as float32 ones and zeros, which is exactly the product of the window's counted rows and
    columns (integers far below 2**24); that product, made per row and per column, is the divisor."""

    counted: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    """Per axis, the positions ``[lo, hi)`` a tap counts at: the input, or with ``count_include_pad`` the
    input and its pads (never a ceil-mode window's overhang)."""

    @property
    def name(self) -> str:
        return "avg_pool.rows"

    @property
    def constant_bytes(self) -> int:
        return self._outside_bytes + 4 * self._full

    @property
    def _full(self) -> int:
        return (int(self.out_type.shape[3]) - 1) * self.strides[1] + 1

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        (kh, kw), (sh, _), (ph, pw), (dh, dw) = self.kernel, self.strides, self.pads, self.dilations
        (top, bottom), (left, right) = self.counted
        across = np.arange(self._full)[:, None] - pw + np.arange(kw)[None, :] * dw
        columns = embed_array(mod, f"{name}.columns", ((across >= left) & (across < right)).sum(axis=1)
                              .astype(np.float32))

        def divide(b: Builder, y: Val, x: Val, total: Val) -> Val:
            rows: Val = ir.Constant(F32, 0.0)
            for ky in range(kh):
                r = b.add(b.mul(y, const(sh)), const(ky * dh - ph))
                inside = b.and_(b.icmp_signed(">=", r, const(top)), b.icmp_signed("<", r, const(bottom)))
                rows = b.fadd(rows, b.uitofp(inside, F32))  # whole numbers below 2**24: exact
            count = b.fmul(rows, b.load(fgep(b, columns, x), typ=F32, align=4))
            return ScalarEmitter(b).call("div", [total, count], [DType.f32, DType.f32], DType.f32, {})

        kf = KernelFunction(mod, name, 1)
        # the rule folds from its first term; from -0.0 that is the same bits (x + -0.0 is x)
        self._windows(kf, mod, name, R.REDUCTIONS["sum"].combine, ir.Constant(F32, -0.0), ir.Constant(F32, 0.0),
                      divide)
        return kf.finish()


def _pool_geometry(v: Value, op: str, dtypes: tuple[DType, ...] = (DType.f32,)
                   ) -> tuple[TensorType, TensorType, dict] | None:
    """The operand type, result type and window of a 2-D ``op`` of one of ``dtypes`` at static, non-empty shapes."""
    if v.op != op or v.dtype not in dtypes or v.type.rank != 4:
        return None
    (x,) = v.operands
    if not (x.type.is_static and v.type.is_static) or math.prod(int(d) for d in v.type.shape) == 0:
        return None
    kernel = tuple(int(k) for k in v.attr("kernel"))
    s, pb, pe, d = window_params(2, v.attr("strides"), v.attr("pads"), v.attr("dilations"))
    return x.type, v.type, {"kernel": (kernel[0], kernel[1]), "strides": (s[0], s[1]), "pads": (pb[0], pb[1]),
                            "dilations": (d[0], d[1]), "pads_end": (pe[0], pe[1])}


def max_pool_kernel(v: Value) -> MaxPoolKernel | WidenedKernel | None:
    """The kernel of a 2-D float32, float16 or bfloat16 ``max_pool`` of its values at static shapes, else None.

    On halves the rule's ``max`` widens both operands, compares in float32 and rounds the result back: every
    value it keeps is one of the taps (or -inf), which the rounding returns unchanged, so the float32 kernel on
    the widened plane, its result rounded once, keeps the same taps and gives the same bits (NaNs through the
    same conversions). ResNet-18's stem pool in float16 ran on the generic lowering: 7.8 ms a call."""
    found = _pool_geometry(v, "max_pool", (DType.f32, *HALVES))
    if found is None or v.attr("output") != "values":
        return None
    in_type, out_type, window = found
    del window["pads_end"]
    if v.dtype is DType.f32:
        return MaxPoolKernel(in_type, out_type, **window)
    (wide_in,), wide_out = widened_types([in_type], out_type)
    return widened(MaxPoolKernel(wide_in, wide_out, **window), [in_type], out_type)


def avg_pool_kernel(v: Value) -> AvgPoolKernel | None:
    """The kernel of a 2-D float32 ``avg_pool`` at static shapes, else None."""
    found = _pool_geometry(v, "avg_pool")
    if found is None:
        return None
    in_type, out_type, window = found
    h, w = (int(d) for d in in_type.shape[2:])
    (pb_h, pb_w), (pe_h, pe_w) = window["pads"], window.pop("pads_end")
    counted = ((-pb_h, h + pe_h), (-pb_w, w + pe_w)) if v.attr("count_include_pad") else ((0, h), (0, w))
    return AvgPoolKernel(in_type, out_type, counted=counted, **window)


__all__ = ["AvgPoolKernel", "MaxPoolKernel", "avg_pool_kernel", "max_pool_kernel"]
