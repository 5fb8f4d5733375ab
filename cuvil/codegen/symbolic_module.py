"""A function with symbolic dims lowered once for its whole shape class: every op on its rule kernel
over symbolic extents (:mod:`.dims`), every value planned at the largest size the dims' constraints
allow, and an entry point that takes the dims' values with the tensors.

``{prefix}_create()`` allocates the arena for the constraint maxima; ``{prefix}_run_dims(ctx, dims,
inputs, outputs)`` runs the ops with ``dims`` (``i64`` values of :attr:`SymbolicLowering.symbols`, in
order; each within its constraint, which the caller checks) and returns 0 or an index error. Tuned
kernels (compiled for static shapes), loops and conds are not lowered this way yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.dims import DimValues
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.llvm_module import emit_context_functions, slot_pointer
from cuvil.codegen.loops import fail_unless, not_null
from cuvil.codegen.lower_rule import emit_rule_kernel
from cuvil.codegen.plan import MemoryPlan, plan_memory
from cuvil.codegen.region_steps import return_unless_ok
from cuvil.codegen.scalar import I1, I32, I64, PTR, Builder, declare
from cuvil.errors import CodegenError
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@dataclass(frozen=True)
class SymbolicLowering:
    """The LLVM module of a function lowered for its shape class."""

    module: ir.Module
    prefix: str
    symbols: tuple[str, ...]
    maxima: dict[str, int]
    plan: MemoryPlan


def symbol_maxima(fn: Function, given: Mapping[str, int] | None = None) -> dict[str, int]:
    """The largest value of each symbol: ``given``, else the function's constraint. A symbol with
    neither is refused: the arena is sized for the maxima."""
    out: dict[str, int] = {}
    for c in fn.constraints:
        hi = (given or {}).get(c.symbol, c.hi)
        if hi is None:
            raise CodegenError(f"symbolic dim {c.symbol} has no upper bound", location=fn.name,
                               hint=f"give its largest size (e.g. {c.symbol}=512) or a constraint {c.symbol} <= N")
        if c.hi is not None and hi > c.hi:
            raise CodegenError(f"the largest size {hi} of {c.symbol} exceeds its constraint {c}", location=fn.name)
        out[c.symbol] = int(hi)
    return out


def lower_symbolic_function(fn: Function, constants: Mapping[str, np.ndarray], maxima: Mapping[str, int],
                            *, name: str | None = None) -> SymbolicLowering:
    """Build the LLVM module of ``fn`` for every size its dims may take up to ``maxima``."""
    prefix = abi.symbol_prefix(name or fn.name)
    symbols = tuple(sorted(maxima))
    missing = sorted({s for v in fn.values() for s in v.type.symbols()} - set(symbols))
    if missing:
        raise CodegenError(f"no largest size for symbolic dims {missing}", location=fn.name)

    def at_most(t: TensorType) -> int:
        n = t.dtype.np.itemsize
        for d in t.shape:
            n *= max(evaluate_dim(d, maxima), 0)
        return n

    plan = plan_memory(fn, size_of=at_most)
    mod = ir.Module(name=prefix)
    kernels: list[ir.Function] = []
    for k, v in enumerate(plan.steps):
        op = get_op(v.op)
        if op.structured:
            raise CodegenError(f"a {v.op} in a function compiled for a shape class is not supported yet",
                               location=v.op, hint="compile at concrete shapes (--shape)")
        in_types = [o.type for o in v.operands]
        rule = op.make_rule(in_types, v.attr_dict, v.type)
        kernels.append(emit_rule_kernel(mod, f"k{k}.{v.op}", rule, in_types, v.type, v.op, dims=symbols))
    const_globals = {v.const_hash: embed_array(mod, f"const.{v.const_hash}",
                                               np.ascontiguousarray(constants[v.const_hash]))
                     for v in fn.values() if v.is_const}
    _emit_entry_points(mod, prefix, plan, kernels, const_globals, symbols)
    return SymbolicLowering(mod, prefix, symbols, dict(maxima), plan)


def _emit_entry_points(mod: ir.Module, prefix: str, plan: MemoryPlan, kernels: list[ir.Function],
                       const_globals: Mapping[str, ir.GlobalVariable], symbols: tuple[str, ...]) -> None:
    emit_context_functions(mod, prefix, plan.arena_bytes)
    run = ir.Function(mod, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), name=f"{prefix}_run_dims")
    ctx, dims_ptr, in_arr, out_arr = run.args
    ctx.name, dims_ptr.name, in_arr.name, out_arr.name = "ctx", "dims", "inputs", "outputs"
    b = Builder(run.append_basic_block("entry"))
    for p in (ctx, dims_ptr, in_arr, out_arr):
        fail_unless(b, not_null(b, p), abi.ERR_NULL)
    dims = DimValues(b, dims_ptr, symbols)

    def slot_ptr(v: Value) -> ir.Value:
        return slot_pointer(b, plan, v, ctx, in_arr, out_arr, const_globals)

    for v, kernel in zip(plan.steps, kernels, strict=True):
        return_unless_ok(b, b.call(kernel, [slot_ptr(v), *(slot_ptr(o) for o in v.operands), dims_ptr]))
    memcpy = declare(mod, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
    for v, r in plan.copies:  # results that are inputs or constants: copied, at their run-time size
        dst = b.load(b.gep(out_arr, [ir.Constant(I64, r)], inbounds=True, source_etype=PTR), typ=PTR)
        size: ir.Value = ir.Constant(I64, v.dtype.np.itemsize)
        for d in v.type.shape:
            size = b.mul(size, dims.value(d))
        b.call(memcpy, [dst, slot_ptr(v), size, ir.Constant(I1, 0)])
    b.ret(ir.Constant(I32, abi.OK))
