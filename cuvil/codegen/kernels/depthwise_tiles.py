"""A 2-D depthwise convolution's plane in register tiles: a block of output rows, each as the whole row's
vectors, accumulated in registers and written once.

The loop LLVM vectorizes along a row (the other depthwise schedule) keeps one output vector's nine fused
steps in a row of code, so each vector's chain of dependent FMAs runs at the FMA's latency with little
to overlap, and it reads a shifted tap through masked loads on every vector. Here the tap loop is outside
the accumulators: for each input row, each tap column and each vector along the row, one load (or, at a
stride of 2, the even elements of two) feeds every output row of the block that uses it, so up to
:func:`tile_shape`'s accumulators advance together. Which lanes of a load fall outside the row is known
when the kernel is compiled (the row's vectors are unrolled), so only edge vectors are masked.

Every output's sum is the rule's: its taps in the rule's order (kernel row, then column; each accumulator
receives its input rows in increasing order, so its kernel rows too), each a fused step from +0, a tap in
the padding a product with 0 (a zero row, or a masked lane read as 0). The sums go to a buffer on the
stack laid out as the output plane, and the epilogue runs over it as one loop. One thread, MobileNet-v1's
3x3 layers alone (µs, row loop -> tiles): 128 channels of 56x56 85 -> 62-68, 256 of 28x28 40 -> 32-35,
512 of 14x14 23 -> 19-20, 256 of 28x28 at stride 2 28 -> 21-23; in the whole model, where the large
planes come from and go to L3, 0-0.6 %."""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from cuvil.codegen.kernels.epilogue import EpilogueEmitter
from cuvil.codegen.kernels.gemm import Ctx, Isa, even_lanes, fgep, fma, span_inside, splat, vec_type
from cuvil.codegen.llvm_types import F32
from cuvil.codegen.loops import NO_UNROLL, const, for_range, plane_row
from cuvil.codegen.scalar import Val

STRIDES_ACROSS = (1, 2)
"""Strides along the row the tiles read: contiguous vectors, or the even elements of two."""

MAX_TAPS = 49
"""The largest kernel that takes the tiles: 7x7 (ConvNeXt's). Up to 5x5 the weights stay in registers beside the
accumulators; a 7x7 kernel's are read again from the stack, and still the tiles win. One thread, two builds
interleaved with ONNX Runtime between calls (the same bits): ConvNeXt built from its config (depths 1-1-1-1,
widths 32-256, 128x128) its depthwise layers 0.294 -> 0.112 ms, the model 1.552 -> 1.368 (ONNX Runtime 1.481);
ConvNeXt-T at 224x224 114.5 -> 98.5 ms (ONNX Runtime 99.2)."""


WIDE_ROW_BLOCK = 4
"""Output rows per block where a row is wider than half the accumulators, at a stride across of 1: the row then
runs in segments of the vectors the rest of the accumulators hold (AVX2's rows of 56 and 112: two vectors).
Zen 3, one thread, MobileNet-v1's stride-1 layers in the network, two profiled builds interleaved with ONNX
Runtime between calls (three runs), the row loop -> segments: 32 channels at 112x112 0.86-1.05 -> 0.17-0.23 ms,
128 at 56x56 0.85-1.00 -> 0.17-0.22 (ONNX Runtime 0.29 each). At a stride of 2 (64 channels of 112x112 into
56x56) segments of 8 rows, 4 and 2 measured 0.33-0.37, 0.31-0.39 and 0.31 against the row loop's 0.25-0.32:
those rows keep the row loop."""


def tile_shape(isa: Isa, out_sp: Sequence[int], strides: Sequence[int], taps: int) -> tuple[int, int] | None:
    """``(rows, vectors)``: output rows per block and vectors per segment of a row (all the row's where it is
    at most half the accumulators wide, else :data:`WIDE_ROW_BLOCK` rows in segments), or None where the tiles
    do not apply (a stride across other than 1 or 2, a wider row at a stride of 2, a kernel over
    :data:`MAX_TAPS`). The accumulators are two thirds of the GEMM tile's (the weights stay in registers
    too): 16 of AVX-512's 32 registers."""
    (oh, ow), sw = out_sp, strides[-1]
    accumulators = max(r * v for r, v in isa.tiles) * 2 // 3
    vectors = -(-ow // isa.lanes)
    if sw not in STRIDES_ACROSS or taps > MAX_TAPS:
        return None
    if 2 * vectors > accumulators:
        return (min(oh, WIDE_ROW_BLOCK), max(1, accumulators // WIDE_ROW_BLOCK)) if sw == 1 else None
    return max(1, min(oh, accumulators // vectors)), vectors


def emit_plane_tiles(ctx: Ctx, isa: Isa, shape: tuple[int, int], geometry: tuple[Sequence[int], ...],
                     src: Val, weights: Sequence[Val], zero_row: Val, epi: EpilogueEmitter,
                     index: tuple[Val, Val], out_base: Val) -> None:
    """One channel's output plane (``out[out_base + y * ow + x]``) from its input plane at ``src``.

    ``shape``: :func:`tile_shape`'s; ``geometry``: ``(in_sp, out_sp, kernel, strides, pads, dilations)``
    of the two spatial axes; ``weights``: the channel's taps (scalars, row-major); ``zero_row``: a row of
    zeros at least as wide as the input's; ``index``: the (image, channel) the epilogue is given."""
    b = ctx.b
    (h, w_in), (oh, ow), (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    rows, segment = shape
    lanes = isa.lanes
    vectors = -(-ow // lanes)
    vt = vec_type(lanes)
    zeros = ir.Constant(vt, None)
    wv = [splat(b, w, lanes) for w in weights]
    buf = ctx.entry_alloca(ir.ArrayType(F32, rows * ow + lanes), "dwtile")

    def taps_at(row: Val, at: int, pairs: dict[int, tuple[Val, Val]]) -> Val:
        """The input elements ``at + sw * i`` that lane ``i`` of an output vector reads for one tap (0 outside
        the row). At a stride of 2 they are the even elements of the two vectors from ``at`` on, or the odd
        ones of the two from ``at - 1`` where that tap loaded them (``pairs``, per input row): a 3-wide
        kernel loads four vectors instead of six."""
        if sw == 1:
            return span_inside(b, row, at, w_in, zeros)
        if at - 1 in pairs:
            return even_lanes(b, *pairs[at - 1], odd=True)
        pair = pairs[at] = (span_inside(b, row, at, w_in, zeros), span_inside(b, row, at + lanes, w_in, zeros))
        return even_lanes(b, *pair)

    def block(y0: Val, count: int) -> None:
        """Output rows ``y0 .. y0 + count - 1``, a segment of their vectors at a time: every input row they
        read, in order, each tap column and vector along it loaded once and given to the output rows whose
        kernel row reads it."""
        users: dict[int, list[tuple[int, int]]] = {}
        for r in range(count):
            for ky in range(kh):
                users.setdefault(r * sh + ky * dh - ph, []).append((r, ky))
        # the last segment first: a row's last vector runs into the next row's start, which a segment
        # after it (or, in one segment, the next row) then writes
        for start in reversed(range(0, vectors, segment)):
            js = range(start, min(vectors, start + segment))
            accs: dict[tuple[int, int], Val] = {(r, j): zeros for r in range(count) for j in js}
            for o in sorted(users):
                row = plane_row(b, src, b.add(b.mul(y0, const(sh)), const(o)), h, w_in, zero_row, F32)
                pairs: dict[int, tuple[Val, Val]] = {}
                for kx in range(kw):
                    for j in js:
                        v = taps_at(row, j * lanes * sw + kx * dw - pw, pairs)
                        for r, ky in users[o]:
                            accs[r, j] = fma(b, wv[ky * kw + kx], v, accs[r, j])
            for r in range(count):
                for j in js:
                    b.store(accs[r, j], fgep(b, buf, r * ow + j * lanes), align=4)
        first = b.mul(y0, const(ow))

        def element(f: Val) -> None:
            y, x = b.add(y0, b.udiv(f, const(ow))), b.urem(f, const(ow))
            value = epi.element([*index, y, x], b.load(fgep(b, buf, f), typ=F32, align=4))
            epi.store(b.add(out_base, b.add(first, f)), value)

        for_range(b, 0, count * ow, "dwe", element)

    blocks, rest = divmod(oh, rows)
    for_range(b, 0, blocks, "dwt", lambda t: block(b.mul(t, const(rows)), rows), hints=NO_UNROLL)
    if rest:
        block(const(blocks * rows), rest)


__all__ = ["emit_plane_tiles", "tile_shape"]
