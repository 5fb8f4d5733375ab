"""``reshape`` as a schedule of its rule: the rule reads the input at the output's own row-major
position (``in[unravel(ravel(i))]``), so the output's bytes are the input's, in order, and the kernel
is one copy of them. At static shapes the generic lowering already compiles to that (the divisions
by constant extents fold away); over symbolic extents it would pay a division and a remainder per
element and dim, so a shape-class library copies instead (the size read from the dims)."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.dims import DimValues
from cuvil.codegen.llvm_types import I1, I32, I64, PTR, declare
from cuvil.codegen.scalar import Builder
from cuvil.codegen.sizing import numel
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@dataclass(frozen=True)
class CopyKernel:
    """``i32 name(ptr out, ptr in, ptr scratch, ptr dims)``: ``out``'s size in bytes copied from ``in``."""

    out_type: TensorType
    runtime: tuple[str, ...]  # the symbols of the dims argument, in order

    name = "copy"
    unused_operands: frozenset[int] = frozenset()
    scratch_bytes = 0
    constant_bytes = 0

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * 4), name=name)
        fn.linkage = "hidden"
        out, src, _, dims_ptr = fn.args
        out.name, src.name, dims_ptr.name = "out", "in0", "dims"
        b = Builder(fn.append_basic_block("entry"))
        size = numel(b, DimValues(b, dims_ptr, self.runtime), tuple(self.out_type.shape),
                     self.out_type.dtype.np.itemsize)
        memcpy = declare(mod, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
        b.call(memcpy, [out, src, size, ir.Constant(I1, 0)])
        b.ret(ir.Constant(I32, abi.OK))
        return fn


def copy_kernel(v: Value, symbols: tuple[str, ...]) -> CopyKernel | None:
    """The copy that computes ``v`` exactly, when ``v`` is a reshape over symbolic dims (its storage one
    element per ``itemsize`` bytes, as every ABI dtype is)."""
    if v.op != "reshape" or len(v.operands) != 1 or v.type.is_static or v.dtype != v.operands[0].dtype:
        return None
    return CopyKernel(v.type, symbols)
