"""Float16 and bfloat16 matrix products and convolutions (and their fused epilogues) on the float32
kernels.

The rules of ``matmul`` and ``conv`` on halves (float16, bfloat16) widen every operand to float32,
accumulate in float32 in K order and round the result to the half type once. Widening is exact and
the float32 kernels sum K in order: run on the widened operands, they compute exactly the rule's
accumulation. A product of two float16 values is exact in float32, so the kernels' fused multiply-adds
round as the rule's product and sum do; a product of two bfloat16 values may overflow float32 or fall
under its subnormals, so bfloat16 kernels round each product before adding it (``products_rounded``).
The epilogue is rewritten to say the same thing over the widened buffers: the accumulator is
rounded to the half type (the contraction's own rounding), each half operand it reads is read as
float32 and narrowed back (exact), every epilogue op keeps its own rounding, and its half result is
stored widened (exact) and narrowed on the way out (exact). A constant weight is
widened when the float32 kernel packs it at compile time; the other half operands are widened into
the kernel's scratch (with the conversions the generic lowering uses,
:class:`cuvil.codegen.scalar.ScalarEmitter`). Before this, a half-precision matrix product or
convolution ran on the generic rule lowering, 10-85x slower than its float32 counterpart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.kernels.base import Kernel, RunsInner
from cuvil.codegen.kernels.epilogue import Contraction
from cuvil.codegen.kernels.gemm import products_rounded
from cuvil.codegen.llvm_types import F32, I32, I64, PTR
from cuvil.codegen.loops import for_range
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val, storage_type
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.rulewalk import dyn_exprs
from cuvil.ir.types import TensorType

HALVES = (DType.f16, DType.bf16)


def _aligned(n: int) -> int:
    return -(-n // abi.ARENA_ALIGN) * abi.ARENA_ALIGN


def _numel(t: TensorType) -> int:
    return int(t.numel())


@dataclass(frozen=True)
class WidenedKernel(RunsInner):
    """``i32 name(ptr out, ptr in0, ..., ptr scratch)`` for half-precision operands and result: the
    float32 ``inner`` kernel between a widening of its half operands and a rounding of its result."""

    inner: Kernel
    in_types: tuple[TensorType, ...]
    out_type: TensorType

    @property
    def name(self) -> str:
        return f"{self.inner.name}, halves widened"

    def _layout(self) -> tuple[list[int | None], int, int]:
        """Scratch offsets: each widened operand's (None: not read), the float32 result's, the total."""
        at = _aligned(self.inner.scratch_bytes)
        offsets: list[int | None] = []
        for i, t in enumerate(self.in_types):
            if i in self.inner.unused_operands or t.dtype not in HALVES:
                offsets.append(None)
                continue
            offsets.append(at)
            at += _aligned(4 * _numel(t))
        return offsets, at, at + _aligned(4 * _numel(self.out_type))

    @property
    def scratch_bytes(self) -> int:
        return self._layout()[2]

    @property
    def products_exact(self) -> bool:
        """Whether every product of two operands is exact in float32, so that the kernel may fuse it
        into its sum: float16's are (|x·y| lies in [2^-48, 2^32]); bfloat16's, in float32's exponent
        range, may overflow or underflow, so they are rounded before the sum as the rule rounds them."""
        return all(t.dtype is not DType.bf16 for t in self.in_types)

    def inner_name(self, name: str) -> str:
        return f"{name}.f32"

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        with contextlib.nullcontext() if self.products_exact else products_rounded():
            inner = self.inner.emit(mod, self.inner_name(name))
        n = len(self.in_types)
        fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * (n + 2)), name=name)
        fn.linkage = "hidden"
        out, ins, scratch = fn.args[0], list(fn.args[1:n + 1]), fn.args[n + 1]
        b = Builder(fn.append_basic_block("entry"))
        offsets, out_at, _ = self._layout()

        def at(offset: int) -> Val:
            return b.gep(scratch, [ir.Constant(I64, offset)], source_etype=ir.IntType(8), inbounds=True)

        wide: list[Val] = []
        for src, t, offset in zip(ins, self.in_types, offsets, strict=True):
            if offset is None:
                wide.append(src)
                continue
            dst = at(offset)
            _widen(b, src, t, dst)
            wide.append(dst)
        narrow_out = self.out_type.dtype in HALVES
        result = at(out_at) if narrow_out else out
        rc = b.call(inner, [result, *wide, scratch])
        failed = b.icmp_signed("!=", rc, ir.Constant(I32, abi.OK))
        with b.if_then(failed):
            b.ret(rc)
        if narrow_out:
            _narrow(b, result, out, self.out_type)
        b.ret(ir.Constant(I32, abi.OK))
        return fn


def _widen(b: Builder, src: Val, t: TensorType, dst: Val) -> None:
    """``dst[i] = float32(src[i])`` over ``t``'s elements (exact)."""
    s, ty = ScalarEmitter(b), storage_type(t.dtype)

    def one(i: Val) -> None:
        x = s.from_storage(b.load(b.gep(src, [i], source_etype=ty, inbounds=True), typ=ty), t.dtype)
        b.store(x, b.gep(dst, [i], source_etype=F32, inbounds=True))

    for_range(b, 0, _numel(t), "i", one)


def _narrow(b: Builder, src: Val, dst: Val, t: TensorType) -> None:
    """``dst[i] = src[i]`` rounded to ``t``'s half type (exact here: the epilogue rounded already)."""
    s, ty = ScalarEmitter(b), storage_type(t.dtype)

    def one(i: Val) -> None:
        x = b.load(b.gep(src, [i], source_etype=F32, inbounds=True), typ=F32)
        b.store(s.to_storage(x, t.dtype), b.gep(dst, [i], source_etype=ty, inbounds=True))

    for_range(b, 0, _numel(t), "i", one)


class _Declined(Exception):
    pass


def _f32(t: TensorType) -> TensorType:
    return TensorType(DType.f32, t.shape) if t.dtype in HALVES else t


def widened_contraction(c: Contraction) -> Contraction | None:
    """``c`` over float32 buffers where it has float16 ones (see the module's docstring), or None when
    its epilogue has a form this does not rewrite (a reduction, a data-dependent index)."""

    def go(e: R.Expr) -> R.Expr:
        if isinstance(e, R.Load):
            if any(dyn_exprs(i) for i in e.index):
                raise _Declined
            if e.operand == c.marker:
                return R.cast(e, c.out_type.dtype)
            if e.dtype in HALVES:
                return R.cast(replace(e, dtype=DType.f32), e.dtype)
            return e
        if isinstance(e, R.Call):
            return replace(e, args=tuple(go(a) for a in e.args))
        if isinstance(e, (R.Lit, R.IndexValue)):
            return e
        raise _Declined

    try:
        epilogue = R.cast(go(c.epilogue), DType.f32)
    except _Declined:
        return None
    return replace(c, lhs_type=_f32(c.lhs_type), rhs_type=_f32(c.rhs_type), out_type=_f32(c.out_type),
                   epilogue=epilogue)


def widened(inner: Kernel | None, in_types: Sequence[TensorType], out_type: TensorType) -> WidenedKernel | None:
    return WidenedKernel(inner, tuple(in_types), out_type) if inner is not None else None


def widened_types(in_types: Sequence[TensorType], out_type: TensorType) -> tuple[list[TensorType], TensorType]:
    return [_f32(t) for t in in_types], _f32(out_type)


__all__ = ["WidenedKernel", "widened", "widened_contraction", "widened_types"]
