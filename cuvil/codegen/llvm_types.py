"""The LLVM types the code generator uses, and how it declares the external functions it calls."""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

F16 = ir.HalfType()
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
