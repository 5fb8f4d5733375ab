"""2-D max pooling as a schedule of ``max_pool``'s rule: per output, ``max`` folded over the window's taps
in row-major order from -inf, a tap outside the input reading -inf (the rule's ``oob``).

The generic lowering ran the rule's nest one output at a time (ResNet-18's stem pool: 0.23 ms on one
thread, where ONNX Runtime's takes 0.14 in its network). Here, per channel and output row, one loop
along the row computes every input column's window at stride 1 across (a tap outside the row is a
load not taken, which vectorizes as a masked load; a kernel row outside the input reads a row of
-inf); at a stride across, those go to a row buffer and every stride-th is stored. Each output's
taps are the rule's, folded in the rule's order with the rule's ``max`` (NaN-propagating, a tie
giving the later tap), so the results are the rule's bit for bit, signed zeros and NaNs included.

At a stride of 2 across (ResNet's stem pool) that computes twice the windows it keeps, and each row's
taps once per output row that reads it. There every input row's maxima along the row are computed once,
at the output columns (from the even elements of two contiguous vectors), then each output folds its
kernel rows' maxima: one thread, the stem pool 0.21 -> 0.15 ms.
"""

from __future__ import annotations

import math
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
)
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.llvm_types import F32
from cuvil.codegen.loops import MASKED_TAIL, NO_UNROLL, const, for_range, load_tap, plane_row
from cuvil.codegen.scalar import ScalarEmitter, Val, identity
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


@dataclass(frozen=True)
class MaxPoolKernel(ReadsEveryOperand):
    """``max_pool`` (values) of a static float32 NCHW tensor; see the module's docstring."""

    in_type: TensorType
    out_type: TensorType
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]  # the window's start before the first row and column
    dilations: tuple[int, int]

    @property
    def name(self) -> str:
        return "max_pool.rows"

    @property
    def constant_bytes(self) -> int:
        return 4 * int(self.in_type.shape[3])

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        n, c, h, w = (int(d) for d in self.in_type.shape)
        oh, ow = (int(d) for d in self.out_type.shape[2:])
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.strides, self.pads, self.dilations
        full = (ow - 1) * sw + 1  # the input columns' windows computed per row (stride 1 across)
        start = identity("max", DType.f32)  # the rule's fold starts from the reduction's identity
        pad = float(R.lowest(DType.f32))  # and reads this for a tap outside the input (its oob)
        outside = ir.Constant(F32, pad)
        kf = KernelFunction(mod, name, 1)
        below = embed_array(mod, f"{name}.low", np.full(w, pad, dtype=np.float32))

        def chunk(ctx: Ctx, plane: Val) -> None:
            b = ctx.b
            s = ScalarEmitter(b)
            src = fgep(b, ctx.ins[0], b.mul(plane, const(h * w)))
            out_base = b.mul(plane, const(oh * ow))
            buf = ctx.entry_alloca(ir.ArrayType(F32, full), "poolrow") if sw > 1 else None

            def row(y: Val) -> None:
                rows = [plane_row(b, src, b.add(b.mul(y, const(sh)), const(ky * dh - ph)), h, w, below, F32)
                        for ky in range(kh)]
                out_row = b.add(out_base, b.mul(y, const(ow)))

                def column(x: Val) -> None:
                    acc: Val = start
                    for ky in range(kh):
                        for kx in range(kw):
                            v = load_tap(b, rows[ky], x, kx * dw - pw, full, w, outside)
                            acc = s.call("max", [acc, v], [DType.f32, DType.f32], DType.f32, {})
                    if buf is None:
                        b.store(acc, fgep(b, ctx.out, b.add(out_row, x)), align=4)
                    else:
                        b.store(acc, fgep(b, buf, x), align=4)

                for_range(b, 0, full, "px", column, hints=MASKED_TAIL)
                if buf is not None:
                    row_buf: Val = buf

                    def pick(x: Val) -> None:
                        v = b.load(fgep(b, row_buf, b.mul(x, const(sw))), typ=F32, align=4)
                        b.store(v, fgep(b, ctx.out, b.add(out_row, x)), align=4)

                    for_range(b, 0, ow, "pick", pick)

            for_range(b, 0, oh, "py", row, hints=NO_UNROLL)

        if self._by_rows:
            kf.phase(n * c, STEP_FLOPS * n * c * (h * kw + oh * kh) * ow, self._rows_then_columns)
        else:
            kf.phase(n * c, STEP_FLOPS * n * c * oh * full * kh * kw, chunk)
        return kf.finish()

    @property
    def _by_rows(self) -> bool:
        """Stride 2 across, where every input row's maxima along the row fit a chunk's stack."""
        h = int(self.in_type.shape[2])
        return self.strides[1] == 2 and h * self._row_floats * 4 <= ROWS_MAX_BYTES

    @property
    def _row_floats(self) -> int:
        lanes = host_isa().lanes
        return -(-int(self.out_type.shape[3]) // lanes) * lanes

    def _inside_blocks(self, lanes: int) -> tuple[int, int]:
        """The row pass's blocks ``[lo, hi)`` whose every tap reads ``2 * lanes`` floats inside the row."""
        w = int(self.in_type.shape[3])
        (_, kw), (_, pw), (_, dw) = self.kernel, self.pads, self.dilations
        blocks = self._row_floats // lanes
        lo = min(blocks, -(-pw // (2 * lanes)))
        reach = (kw - 1) * dw - pw + 2 * lanes  # past the block's first input column
        hi = max(lo, min(blocks, (w - reach) // (2 * lanes) + 1 if w >= reach else 0))
        return lo, hi

    def _rows_then_columns(self, ctx: Ctx, plane: Val) -> None:
        """One plane at a stride of 2 across: each input row's window maxima along the row, at the output
        columns (the even elements of two contiguous vectors, a tap outside the row reading -inf through
        the load's mask), once per row; then each output as the fold of its kernel rows' maxima. The rule
        folds the taps row by row from -inf; a fold of the rows' own folds (each from -inf) gives the same
        value and bits: the first NaN in the rule's order, else the last tap equal to the maximum (its
        sign, for a tie of zeros), as the rule's ``max`` keeps."""
        b = ctx.b
        s = ScalarEmitter(b)
        h, w = (int(d) for d in self.in_type.shape[2:])
        oh, ow = (int(d) for d in self.out_type.shape[2:])
        (kh, kw), (sh, _), (ph, pw), (dh, dw) = self.kernel, self.strides, self.pads, self.dilations
        lanes = host_isa().lanes
        wide = self._row_floats
        start = identity("max", DType.f32)
        pad = ir.Constant(F32, float(R.lowest(DType.f32)))
        src = fgep(b, ctx.ins[0], b.mul(plane, const(h * w)))
        maxima = ctx.entry_alloca(ir.ArrayType(F32, h * wide), "rowmax")

        def vmax(acc: Val, v: Val) -> Val:
            return s.call("max", [acc, v], [DType.f32, DType.f32], DType.f32, {})

        def columns(row: Val, first: Val | int, inside: bool = False) -> Val:
            """Row elements ``first + 2 i`` (-inf outside the row); ``inside``: all of them are in it (plain
            loads)."""
            fill = splat(b, pad, lanes)
            second = first + lanes if isinstance(first, int) else b.add(first, const(lanes))
            if inside:
                return even_lanes(b, b.load(fgep(b, row, first), typ=fill.type, align=4),
                                  b.load(fgep(b, row, second), typ=fill.type, align=4))
            return even_lanes(b, span_inside(b, row, first, w, fill), span_inside(b, row, second, w, fill))

        def along(r: Val) -> None:
            row = fgep(b, src, b.mul(r, const(w)))
            if ROWS_AHEAD:  # the row that many rows on (past the plane: the next plane's; a hint either way)
                ahead = b.gep(row, [const(ROWS_AHEAD * w)], source_etype=F32)
                for line in range(0, w, 16):
                    prefetch(b, b.gep(ahead, [const(line)], source_etype=F32))

            def block(j: Val | int, inside: bool = False) -> None:
                """Outputs ``j * lanes`` on; ``inside``: every tap's span lies in the row (plain loads)."""
                x0 = const(j * lanes) if isinstance(j, int) else b.mul(j, const(lanes))
                acc = splat(b, start, lanes)
                for kx in range(kw):
                    if isinstance(j, int):  # edge blocks: the spans known when compiling (masks as constants)
                        first: Val | int = 2 * j * lanes + kx * dw - pw
                    else:
                        first = b.add(b.mul(x0, const(2)), const(kx * dw - pw))
                    acc = vmax(acc, columns(row, first, inside))
                b.store(acc, fgep(b, maxima, b.add(b.mul(r, const(wide)), x0)), align=4)

            blocks = wide // lanes
            lo, hi = self._inside_blocks(lanes)
            if blocks - (hi - lo) <= EDGE_BLOCKS_MAX:
                for j in [*range(lo), *range(hi, blocks)]:
                    block(j)
                for_range(b, lo, hi, "hx", lambda j: block(j, inside=True), hints=NO_UNROLL)
            else:
                for_range(b, 0, blocks, "hx", block, hints=NO_UNROLL)

        for_range(b, 0, h, "hy", along, hints=NO_UNROLL)
        out_base = b.mul(plane, const(oh * ow))

        def down(y: Val) -> None:
            out_row = fgep(b, ctx.out, b.add(out_base, b.mul(y, const(ow))))

            def column(x: Val) -> None:
                acc: Val = start
                for ky in range(kh):
                    r = b.sub(b.add(b.mul(y, const(sh)), const(ky * dh)), const(ph))
                    inside = b.icmp_unsigned("<", r, const(h))
                    at = b.add(b.mul(b.select(inside, r, const(0)), const(wide)), x)
                    v = b.select(inside, b.load(fgep(b, maxima, at), typ=F32, align=4), pad)
                    acc = vmax(acc, v)
                b.store(acc, fgep(b, out_row, x), align=4)

            for_range(b, 0, ow, "vx", column, hints=MASKED_TAIL)

        for_range(b, 0, oh, "vy", down, hints=NO_UNROLL)


def max_pool_kernel(v: Value) -> MaxPoolKernel | None:
    """The kernel of a 2-D float32 ``max_pool`` of its values at static shapes, else None."""
    if v.op != "max_pool" or v.attr("output") != "values" or v.dtype is not DType.f32 or v.type.rank != 4:
        return None
    (x,) = v.operands
    if not (x.type.is_static and v.type.is_static) or math.prod(int(d) for d in v.type.shape) == 0:
        return None
    kernel = tuple(int(k) for k in v.attr("kernel"))
    s, pb, _, d = window_params(2, v.attr("strides"), v.attr("pads"), v.attr("dilations"))
    return MaxPoolKernel(x.type, v.type, (kernel[0], kernel[1]), (s[0], s[1]), (pb[0], pb[1]), (d[0], d[1]))


__all__ = ["MaxPoolKernel", "max_pool_kernel"]
