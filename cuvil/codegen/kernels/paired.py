"""``bf16_matmul`` and ``bf16_conv`` on the float32 GEMM and convolution schedules, two bfloat16 to each
32-bit element (``vdpbf16ps``).

The op's rule is a ``dot_ftz`` along K in pairs, each pair's odd term first (:mod:`cuvil.ir.ops.linalg`):
what one ``vdpbf16ps`` step computes in a lane whose 32-bit words of A and B hold the pair, the even term
in the low half. A row of a row-major bfloat16 A is such a sequence of words as it lies in memory; a
constant B is packed at compile time into the words ``b[2j, n] | b[2j + 1, n] << 16``. The float32 GEMM
kernel over the words (K / 2 steps, every step one instruction per accumulator, from -0.0), written under
:func:`~cuvil.codegen.kernels.gemm.bf16_pairs`, therefore computes the rule bit for bit: it only moves
the words, never does arithmetic on them, so no bit of a pair changes on the way. An odd K, a transposed
A, a B that is not constant, and a target without AVX512-BF16 use the generic lowering of the rule.

``bf16_conv``'s rule runs over (channel pair, tap) with the pair's odd channel first: the convolution
schedule over a padded copy of the input whose 32-bit elements are channel pairs
(``x[2j] | x[2j + 1] << 16``, written by the copy; a zero completes an odd count) and weights packed the
same way, i.e. the float32 convolution of ``⌈C / 2⌉`` word channels under :func:`bf16_pairs`. The input is
always copied (a 1x1 convolution too: its channels are planes apart in the model's layout).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen.kernels.base import Kernel, RunsInner
from cuvil.codegen.kernels.conv import MAX_SCRATCH_BYTES, ConvGeometry, ConvKernel
from cuvil.codegen.kernels.epilogue import Contraction, reads_operand
from cuvil.codegen.kernels.gemm import ISAS, Ctx, MatmulKernel, bf16_pairs, host_isa
from cuvil.codegen.llvm_types import I32, I64, PTR
from cuvil.codegen.loops import const, for_range
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.target import codegen_target
from cuvil.ir.dtypes import DType
from cuvil.ir.ops.nn import window_params
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@dataclass(frozen=True)
class PairedKernel(RunsInner):
    """The float32 GEMM or convolution ``inner`` over bfloat16 pairs: emitted under :func:`bf16_pairs`."""

    inner: Kernel

    @property
    def name(self) -> str:
        return f"{self.inner.name}.bf16x2"

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        with bf16_pairs():
            return self.inner.emit(mod, name)


def pair_words(b: np.ndarray) -> np.ndarray:
    """A bfloat16 ``[K, N]`` matrix (K even) as ``[K / 2, N]`` words ``b[2j, n] | b[2j + 1, n] << 16``, read
    as float32 (the bits kept; the kernel never computes with them)."""
    k, n = b.shape
    bits = np.ascontiguousarray(b).view(np.uint16).astype(np.uint32).reshape(k // 2, 2, n)
    return np.ascontiguousarray(bits[:, 0] | (bits[:, 1] << 16)).view(np.float32)


def paired_matmul_kernel(v: Value, c: Contraction, constants: Mapping[str, np.ndarray]) -> Kernel | None:
    """The paired kernel of ``v``, a ``bf16_matmul`` (contraction ``c``, its fused epilogue included) with a
    constant 2-D right operand, or None."""
    if c.op != "bf16_matmul" or not _pairs_available():
        return None
    lhs, rhs = v.operands[c.lhs], v.operands[c.rhs]
    b = constants.get(rhs.const_hash) if rhs.is_const else None
    if b is None or not (lhs.type.is_static and rhs.type.is_static and v.type.is_static):
        return None
    if c.attrs.get("transpose_a") or rhs.type.rank != 2 or c.lhs == c.rhs:
        return None
    if reads_operand(c.epilogue, c.lhs) or reads_operand(c.epilogue, c.rhs):
        return None  # (the epilogue would read the words as float32)
    k = int(lhs.type.shape[-1])
    if k % 2 or k == 0 or any(int(d) == 0 for d in v.type.shape):
        return None
    words = pair_words(b.T if c.attrs.get("transpose_b") else b)
    lhs_words = TensorType(DType.f32, (*lhs.type.shape[:-1], k // 2))
    rhs_words = TensorType(DType.f32, words.shape)
    in_types = [o.type for o in v.operands]
    in_types[c.lhs], in_types[c.rhs] = lhs_words, rhs_words
    words_c = Contraction("matmul", {"transpose_a": False, "transpose_b": False}, c.lhs, c.rhs, lhs_words, rhs_words,
                          c.out_type, c.epilogue, c.marker)
    return PairedKernel(MatmulKernel(v.op, words_c, in_types, v.type, words, host_isa()))


def _pairs_available() -> bool:
    return codegen_target().has("avx512bf16") and host_isa() is ISAS["avx512"]


I16 = ir.IntType(16)


def conv_pair_words(w: np.ndarray) -> np.ndarray:
    """bfloat16 weights ``[O, C, *k]`` as ``[O, ⌈C / 2⌉, *k]`` words ``w[:, 2j] | w[:, 2j + 1] << 16`` (a zero past
    an odd ``C``), read as float32."""
    bits = np.ascontiguousarray(w).view(np.uint16).astype(np.uint32)
    if bits.shape[1] % 2:
        bits = np.concatenate([bits, np.zeros((bits.shape[0], 1, *bits.shape[2:]), np.uint32)], axis=1)
    pairs = bits.reshape(bits.shape[0], bits.shape[1] // 2, 2, *bits.shape[2:])
    return np.ascontiguousarray(pairs[:, :, 0] | (pairs[:, :, 1] << 16)).view(np.float32)


@dataclass(frozen=True)
class PairedGeometry(ConvGeometry):
    """A convolution over channel pairs: ``c_in`` counts the pairs, ``channels`` the input's channels."""

    channels: int = 0

    @property
    def direct(self) -> bool:
        return False  # the copy is what pairs the channels


class PairedConvKernel(ConvKernel):
    """The float32 convolution schedule over word channels: the padded copy pairs the input's channels.

    Output positions are always the GEMM rows (where a vector's worth of output channels allows): with two
    products per lane and step, reading the weights as packed panels and the positions' words as
    broadcasts beats the other way round even on large feature maps. Measured one thread, ResNet-18's
    layers: the 7x7 stem 1.21 -> 0.80 ms, 64 -> 64 3x3 at 56x56 0.69 -> 0.54 ms, the 1x1 stride-2
    projection the same either way. The float32 convolutions, measured alike, gained nothing (the stem
    1.31 against 1.31 ms, the 56x56 layer 1.09 against 1.05), so they keep their thresholds."""

    positions_as_rows = True

    def _row_copier(self, ctx: Ctx, c: Val) -> Callable[[Val, Val, list[Val]], object]:
        g = self.g
        assert isinstance(g, PairedGeometry)
        b = ctx.b
        image, pair = b.udiv(c, const(g.c_in)), b.urem(c, const(g.c_in))
        plane = math.prod(g.in_sp)
        first = b.add(b.mul(image, const(g.channels)), b.mul(pair, const(2)))
        src0 = _hgep(b, ctx.ins[self.c.lhs], b.mul(first, const(plane)))
        second = b.icmp_unsigned("<", b.add(b.mul(pair, const(2)), const(1)), const(g.channels))
        src1 = b.select(second, _hgep(b, src0, const(plane)), src0)
        high = b.select(second, ir.Constant(I32, 0xFFFF0000), ir.Constant(I32, 0))
        fn = _pair_row_function(ctx.fn.module)
        return lambda dst_row, at, rest: b.call(fn, [dst_row, _hgep(b, src0, at), _hgep(b, src1, at), high, *rest])


def _hgep(b: Builder, ptr: Val, index: Val) -> Val:
    return b.gep(ptr, [index], inbounds=True, source_etype=I16)


def _pair_row_function(mod: ir.Module) -> ir.Function:
    """``pair_row(dst, src0, src1, high, lo, hi, w, stride, shift)``: ``dst[q]`` (32 bits) holds ``src0[at]`` in its
    low half and ``src1[at]`` in its high half (``at = q * stride + shift``; 16 bits each; the high half masked by
    ``high``) for ``lo <= q < hi``, and 0 for the other ``q < w``. One per module."""
    name = "cuvil.conv.pair_row"
    found = mod.globals.get(name)
    if isinstance(found, ir.Function):
        return found
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I32, I64, I64, I64, I64, I64]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    dst, src0, src1, high, lo, hi, w, stride, shift = fn.args
    for a, n in zip(fn.args, ("dst", "src0", "src1", "high", "lo", "hi", "w", "stride", "shift"), strict=True):
        a.name = n
    dst.add_attribute("noalias")
    b = Builder(fn.append_basic_block("entry"))
    zero = ir.Constant(I32, 0)

    def at(q: Val) -> Val:
        return b.gep(dst, [q], inbounds=True, source_etype=I32)

    for_range(b, 0, lo, "zl", lambda q: b.store(zero, at(q), align=4))

    def element(q: Val) -> None:
        k = b.add(b.mul(q, stride), shift)
        low = b.zext(b.load(_hgep(b, src0, k), typ=I16, align=2), I32)
        top = b.shl(b.zext(b.load(_hgep(b, src1, k), typ=I16, align=2), I32), ir.Constant(I32, 16))
        b.store(b.or_(low, b.and_(top, high)), at(q), align=4)

    for_range(b, lo, hi, "cp", element)
    for_range(b, b.select(b.icmp_signed(">", hi, lo), hi, lo), w, "zr", lambda q: b.store(zero, at(q), align=4))
    b.ret_void()
    return fn


def paired_conv_kernel(v: Value, c: Contraction, constants: Mapping[str, np.ndarray]) -> Kernel | None:
    """The paired convolution of ``v``, a ``bf16_conv`` (contraction ``c``, its fused epilogue included) with
    constant weights and 1-3 spatial axes, or None."""
    if c.op != "bf16_conv" or not _pairs_available():
        return None
    lhs, rhs = v.operands[c.lhs], v.operands[c.rhs]
    weights = constants.get(rhs.const_hash) if rhs.is_const else None
    if weights is None or not (lhs.type.is_static and rhs.type.is_static and v.type.is_static) or c.lhs == c.rhs:
        return None
    if reads_operand(c.epilogue, c.lhs) or reads_operand(c.epilogue, c.rhs):
        return None
    x, out = (tuple(int(d) for d in t.shape) for t in (lhs.type, c.out_type))
    nsp = len(x) - 2
    if not 1 <= nsp <= 3 or any(d == 0 for d in (*x, *out, *weights.shape)):
        return None
    s, pb, _, d = window_params(nsp, c.attrs.get("strides", ()), c.attrs.get("pads", ()),
                                c.attrs.get("dilations", ()))
    if any(p < 0 for p in pb):
        return None
    words = conv_pair_words(weights)
    geometry = PairedGeometry(x[0], words.shape[1], int(weights.shape[0]), 1, x[2:], out[2:],
                              tuple(int(k) for k in weights.shape[2:]), tuple(s), tuple(pb), tuple(d), channels=x[1])
    kernel = PairedConvKernel(v.op, c, [o.type for o in v.operands], v.type, words, geometry, host_isa())
    if kernel.scratch_bytes > MAX_SCRATCH_BYTES or int(kernel.koff.max(initial=0)) + kernel.tiling.nr >= 2**31:
        return None
    return PairedKernel(kernel)
