"""2-D transposed convolution as a schedule of ``conv_transpose``'s rule: per output, the left fold over the
input channels and then the taps, in row-major order, of ``x * w`` where the tap reaches an input position
(``(oy + pad - ky * dilation) / stride`` exact and inside the input) and of -0.0 where it does not.

Adding -0.0 leaves any sum as it is, so a tap that reaches nothing is skipped, and the fold starts from -0.0
(the rule folds from its first term, and ``-0.0 + t`` is ``t``). The generic lowering ran the rule's nest one
output at a time, testing every tap's divisibility (a text detector's two upsampling layers: 3.9 ms on one
thread, where ONNX Runtime takes 0.07). Here a chunk is one output row of one channel. Its columns fall into
``stride`` phases, and within a phase the taps that reach across are fixed at compile time, each at a fixed
offset from the column's index in the phase: sixteen consecutive outputs of a phase read sixteen consecutive
inputs. The taps that reach down are fixed per row. Each output is ``acc = acc + x * w`` (a product rounded,
then the sum, as the rule) for its reached taps in the rule's order, sixteen outputs to a vector with
``VECTORS`` vectors in flight; lanes whose tap falls outside the input keep their sum. A phase's outputs are
kept in a row buffer and laid out in the output row after the last phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.kernels.base import ReadsEveryOperand
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, fgep, masked_load_where, masked_store, splat
from cuvil.codegen.llvm_types import F32, I1, I64
from cuvil.codegen.loops import NO_UNROLL, const, counted_loop, for_range
from cuvil.codegen.scalar import ScalarEmitter, Val
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.ops.nn import window_params
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

LANES = 16
"""Outputs per vector (AVX-512 float32; narrower targets split them)."""

VECTORS = 4
"""Vectors of one phase's outputs accumulated together: four independent sums hide the add's latency."""


@dataclass(frozen=True)
class ConvTransposeKernel(ReadsEveryOperand):
    """``conv_transpose`` of a static float32 ``[N, C, H, W]`` input by ``[C, O/groups, kh, kw]`` weights (either
    may be known only at run time); see the module's docstring."""

    in_type: TensorType
    w_type: TensorType
    out_type: TensorType
    groups: int
    strides: tuple[int, int]
    pads: tuple[int, int]  # top, left
    dilations: tuple[int, int]

    @property
    def name(self) -> str:
        return "conv_transpose.rows"

    @property
    def constant_bytes(self) -> int:
        return 0

    def _phases(self) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """Per column phase ``rx`` (outputs ``rx, rx + sx, ...``): its output count and its taps across, each
        ``(kx, offset)``: output ``j`` of the phase reads input column ``j + offset``."""
        ow, kw = int(self.out_type.shape[3]), int(self.w_type.shape[3])
        sx, px, dx = self.strides[1], self.pads[1], self.dilations[1]
        out = []
        for rx in range(min(sx, ow)):
            taps = [(kx, (rx + px - kx * dx) // sx) for kx in range(kw) if (rx + px - kx * dx) % sx == 0]
            out.append((rx, -(-(ow - rx) // sx), taps))
        return out

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        n, c, h, w = (int(d) for d in self.in_type.shape)
        _, og, kh, kw = (int(d) for d in self.w_type.shape)
        o_all, oh, ow = (int(d) for d in self.out_type.shape[1:])
        cg = c // self.groups
        phases = self._phases()
        reached = sum(count * len(taps) for _, count, taps in phases) * -(-kh // self.strides[0])
        kf = KernelFunction(mod, name, 2)

        def chunk(ctx: Ctx, index: Val) -> None:
            b = ctx.b
            oy = b.urem(index, const(oh))
            rest = b.udiv(index, const(oh))
            o, image = b.urem(rest, const(o_all)), b.udiv(rest, const(o_all))
            base = b.mul(b.udiv(o, const(og)), const(cg))  # the group's first input channel
            x_base = fgep(b, ctx.ins[0], b.mul(b.add(b.mul(image, const(c)), base), const(h * w)))
            w_base = fgep(b, ctx.ins[1], b.mul(b.add(b.mul(base, const(og)), b.urem(o, const(og))), const(kh * kw)))
            rows = self._rows(ctx, oy, h)
            out_row = fgep(b, ctx.out, b.add(b.mul(rest, const(oh * ow)), b.mul(oy, const(ow))))
            interleave = len(phases) > 1
            most = max(count for _, count, _ in phases)
            buf = ctx.entry_alloca(ir.ArrayType(F32, len(phases) * most), "ctrow") if interleave else None
            for rx, count, taps in phases:
                dst = fgep(b, buf, rx * most) if buf is not None else out_row
                self._phase(ctx, x_base, w_base, rows, count, taps, dst, w, og * kh * kw, kw)
            if buf is not None:
                sx = len(phases)

                def lay_out(ox: Val) -> None:
                    at = b.add(b.mul(b.urem(ox, const(sx)), const(most)), b.udiv(ox, const(sx)))
                    b.store(b.load(fgep(b, buf, at), typ=F32, align=4), fgep(b, out_row, ox), align=4)

                for_range(b, 0, ow, "ctout", lay_out)

        flops = 2.0 * n * o_all * oh * cg * max(reached, 1)
        kf.phase(n * o_all * oh, flops, chunk)
        return kf.finish()

    def _rows(self, ctx: Ctx, oy: Val, h: int) -> list[tuple[Val, Val]]:
        """Per tap down: whether it reaches an input row from output row ``oy``, and that row (0 where not)."""
        b = ctx.b
        kh = int(self.w_type.shape[2])
        sy, py, dy = self.strides[0], self.pads[0], self.dilations[0]
        out = []
        for ky in range(kh):
            num = b.sub(b.add(oy, const(py)), const(ky * dy))  # may be negative
            inside = b.and_(b.icmp_signed(">=", num, const(0)), b.icmp_signed("<", num, const(h * sy)))
            exact = b.icmp_signed("==", b.srem(num, const(sy)), const(0)) if sy > 1 else ir.Constant(I1, 1)
            ok = b.and_(inside, exact)
            out.append((ok, b.select(ok, b.sdiv(num, const(sy)), const(0))))
        return out

    def _phase(self, ctx: Ctx, x_base: Val, w_base: Val, rows: list[tuple[Val, Val]], count: int,
               taps: list[tuple[int, int]], dst: Val, w: int, ci_stride: int, kw: int) -> None:
        """One column phase's ``count`` outputs into ``dst[0:count]``."""
        b = ctx.b
        h = int(self.in_type.shape[2])
        cg = int(self.in_type.shape[1]) // self.groups
        nv = max(1, min(VECTORS, -(-count // LANES)))
        width = nv * LANES
        iota = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
        mask_t = ir.VectorType(I1, LANES)
        zeros = ir.Constant(ir.VectorType(F32, LANES), None)
        start = ir.Constant(ir.VectorType(F32, LANES), [-0.0] * LANES)
        emit = ScalarEmitter(b)
        f32 = [DType.f32, DType.f32]

        def step(acc: Val, x: Val, w: Val) -> Val:
            """The rule's term and fold, by its own primitives: ``acc + x * w``, each rounded."""
            return emit.call(R.REDUCTIONS["sum"].combine, [acc, emit.call("mul", [x, w], f32, DType.f32, {})], f32,
                             DType.f32, {})

        def block(j0: Val) -> None:
            lanes = [b.add(splat(b, b.add(j0, const(v * LANES)), LANES), iota) for v in range(nv)]
            valid = [b.icmp_signed("<", lane, splat(b, const(count), LANES)) for lane in lanes]
            masks: dict[tuple[int, int, int], Val] = {}
            for ky, (ok, _) in enumerate(rows):
                row_ok = b.select(ok, ir.Constant(mask_t, [1] * LANES), ir.Constant(mask_t, [0] * LANES))
                for kx, off in taps:
                    for v in range(nv):
                        col = b.add(lanes[v], splat(b, const(off), LANES))
                        inside = b.and_(b.icmp_signed(">=", col, splat(b, const(0), LANES)),
                                        b.icmp_signed("<", col, splat(b, const(w), LANES)))
                        masks[ky, kx, v] = b.and_(b.and_(inside, valid[v]), row_ok)

            def channel(ci: Val, acc: list[Val]) -> list[Val]:
                acc = list(acc)
                plane = fgep(b, x_base, b.mul(ci, const(h * w)))
                weights = fgep(b, w_base, b.mul(ci, const(ci_stride)))
                for ky, (_, iy) in enumerate(rows):
                    row = fgep(b, plane, b.mul(iy, const(w)))
                    for kx, off in taps:
                        wv = splat(b, b.load(fgep(b, weights, ky * kw + kx), typ=F32, align=4), LANES)
                        for v in range(nv):
                            at = fgep(b, row, b.add(j0, const(v * LANES + off)), inbounds=False)
                            m = masks[ky, kx, v]
                            xv = masked_load_where(b, at, m, zeros)
                            acc[v] = b.select(m, step(acc[v], xv, wv), acc[v])
                return acc

            _, acc = counted_loop(b, "ctc", const(0), lambda ci: b.icmp_signed("<", ci, const(cg)), 1, channel,
                                  [start] * nv)
            for v in range(nv):
                masked_store(b, acc[v], fgep(b, dst, b.add(j0, const(v * LANES)), inbounds=False), valid[v])

        for_range(b, 0, count, "ctj", block, step=width, hints=NO_UNROLL)


def conv_transpose_kernel(v: Value) -> ConvTransposeKernel | None:
    """The kernel of a 2-D float32 ``conv_transpose`` at static shapes, else None."""
    if v.op != "conv_transpose" or v.dtype is not DType.f32 or v.type.rank != 4:
        return None
    x, wt = v.operands
    if any(t.dtype is not DType.f32 or not t.is_static for t in (x.type, wt.type, v.type)):
        return None
    if math.prod(int(d) for d in v.type.shape) == 0 or math.prod(int(d) for d in x.type.shape) == 0:
        return None
    s, pb, _, d = window_params(2, v.attr("strides"), v.attr("pads"), v.attr("dilations"))
    return ConvTransposeKernel(x.type, wt.type, v.type, int(v.attr("groups")), (s[0], s[1]), (pb[0], pb[1]),
                               (d[0], d[1]))


__all__ = ["ConvTransposeKernel", "conv_transpose_kernel"]
