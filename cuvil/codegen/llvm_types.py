"""The LLVM types the code generator uses, and how it declares the external functions it calls."""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir


class BFloatType(ir.HalfType):
    """LLVM's ``bfloat`` (llvmlite has no class for it): only ever an operand type of intrinsics, values
    of it are bit-cast from 16-bit words, never written as constants."""

    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value: float) -> str:
        raise NotImplementedError("bfloat constants are written as i16 bit patterns")


BFloatType._create_instance()  # (llvmlite's float types are one instance per class)

F16 = ir.HalfType()
BF16 = BFloatType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()


def declare(mod: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """The module's function ``name`` (an intrinsic, libc or libm), declared on first use."""
    found = mod.globals.get(name)
    if isinstance(found, ir.Function):
        return found
    return ir.Function(mod, ir.FunctionType(ret, list(args)), name=name)
