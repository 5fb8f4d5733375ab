"""A region's ops as kernels run in order over a work area: what a lowered ``loop`` runs once per
iteration and a lowered ``cond`` in the branch it takes (:mod:`.loop_kernel`, :mod:`.cond_kernel`).

The results of one structured op (a loop's final states and scan outputs, a cond's results) are
separate CIR values that share operands and regions; the code generator runs them as one
:class:`StructuredGroup`, in one function whose null ``out`` pointers are results nothing reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen.abi import OK
from cuvil.codegen.dims import DimValues
from cuvil.codegen.kernels import Kernel, choose_kernel, operand_args, operand_data, takes_dims
from cuvil.codegen.llvm_types import I1, I32, I64, PTR, declare
from cuvil.codegen.loops import const, fail_unless
from cuvil.codegen.lower_rule import emit_rule_kernel
from cuvil.codegen.plan import order_steps, plan_steps
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.sizing import STATIC, Sizing
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, walk

WORK_ALIGN = 64


@dataclass
class StructuredGroup:
    """The results of one structured op present in a function, by output index."""

    members: dict[int, Value]

    @property
    def first(self) -> Value:
        return next(iter(self.members.values()))


def round_up(n: int) -> int:
    return -(-n // WORK_ALIGN) * WORK_ALIGN


class RegionSteps:
    """The ops computing ``results`` (over a region's arguments), each on its tuned kernel or its
    rule's loop nest (a nested loop or cond on its own lowering, its work area after the values),
    their values planned in the work area from ``base`` on."""

    def __init__(self, results: Sequence[Value], constants: Mapping[str, np.ndarray], base: int,
                 sizing: Sizing = STATIC) -> None:
        from cuvil.codegen.structured import structured_kernels  # which imports this module

        self.results = list(results)
        self.sizing = sizing
        self.steps = list(order_steps([u for u in walk(self.results) if not (u.is_param or u.is_const)]))
        self.nested = structured_kernels(self.steps, constants, sizing)
        self.passed: dict[Value, dict[int, ir.GlobalVariable]] = {}  # filled as the kernels are emitted
        self.kernels: list[Kernel | None] = [None if get_op(u.op).structured
                                             else choose_kernel(u, constants, sizing.shape_class) for u in self.steps]
        offsets, size = plan_steps(self.steps, keep=[r for r in self.results if not r.is_const],
                                   size_of=sizing.planned)
        self.value_at = {u: base + off for u, off in offsets.items()}
        top = base + round_up(size)
        self.nested_work: dict[Value, int] = {}
        for first, kn in self.nested.items():
            self.nested_work[first] = top
            top += round_up(kn.work_bytes)
        self.end = top
        tuned = [kn for kn in self.kernels if kn is not None]
        self.scratch_bytes = max([kn.scratch_bytes for kn in tuned] + [kn.scratch_bytes for kn in self.nested.values()],
                                 default=0)
        self.constant_bytes = sum(kn.constant_bytes for kn in tuned) + \
            sum(kn.constant_bytes for kn in self.nested.values())

    @property
    def constants_read(self) -> list[Value]:
        """The constants the kernels read as they are (a packed weight is embedded packed)."""
        out: list[Value] = []
        for u, kn in zip(self.steps, self.kernels, strict=True):
            if get_op(u.op).structured:
                continue
            unused = kn.unused_operands if kn is not None else frozenset()
            out += [o for j, o in enumerate(u.operands) if o.is_const and j not in unused]
        out += [c for kn in self.nested.values() for c in kn.constants_read]
        return out + [r for r in self.results if r.is_const]

    def emit_functions(self, mod: ir.Module, name: str, constant: Callable[[Value], ir.Value]
                       ) -> list[ir.Function | None]:
        """One function per step (its tuned kernel, its rule's loop nest, a nested loop's or cond's
        function for the first of its results; None for the others, which that function writes)."""
        fns: list[ir.Function | None] = []
        for k, (u, kn) in enumerate(zip(self.steps, self.kernels, strict=True)):
            if u in self.nested:
                fns.append(self.nested[u].emit(mod, f"{name}.{k}.{u.op}", constant))
            elif get_op(u.op).structured:
                fns.append(None)
            elif kn is not None:
                fns.append(kn.emit(mod, f"{name}.{k}.{u.op}"))
                self.passed[u] = operand_data(kn, mod, f"{name}.{k}.{u.op}")
            else:
                in_types = [o.type for o in u.operands]
                rule = get_op(u.op).make_rule(in_types, u.attr_dict, u.type)
                fns.append(emit_rule_kernel(mod, f"{name}.{k}.{u.op}", rule, in_types, u.type, u.op,
                                            dims=self.sizing.symbols))
        return fns

    def emit_run(self, b: Builder, fns: Sequence[ir.Function | None], where: dict[Value, ir.Value],
                 at: Callable[[int], ir.Value], constant: Callable[[Value], ir.Value], scratch: ir.Value,
                 dims: ir.Value | None = None) -> None:
        """Call the steps in order; ``where`` holds the arguments' pointers and gains each step's; ``dims``
        is the shape class's dims pointer every kernel takes last."""
        for u, kn, kfn in zip(self.steps, self.kernels, fns, strict=True):
            where[u] = at(self.value_at[u])
            if kfn is None:
                continue
            if u in self.nested:
                nested = self.nested[u]
                members = nested.group.members
                args = [at(self.value_at[members[j]]) if j in members else ir.Constant(PTR, None)
                        for j in range(len(nested.results))]
                args += [pointer(o, where, constant) for o in nested.operands]
                args += [at(self.nested_work[u]), scratch]
            else:
                args = [where[u], *operand_args(u.operands, kn, self.passed.get(u, {}),
                                                lambda o: pointer(o, where, constant))]
                if kn is not None:
                    args.append(scratch)
            if dims is not None and (kn is None or takes_dims(kn)):  # sizes read at run time
                args.append(dims)
            return_unless_ok(b, b.call(kfn, args))


@dataclass
class StructuredFunction:
    """The function a lowered loop or cond runs as, ``i32 name(ptr out_0, ..., ptr in_0, ..., ptr work,
    ptr scratch[, ptr dims])``: its outputs, inputs, work area, scratch and (for a shape class) dims
    arguments, and the dims' values read at its entry (so they dominate every block)."""

    fn: ir.Function
    outs: list[ir.Argument]
    ins: list[ir.Argument]
    work: ir.Argument
    scratch: ir.Argument
    dims_ptr: ir.Argument | None
    b: Builder
    dims: DimValues | None

    @classmethod
    def create(cls, mod: ir.Module, name: str, n_out: int, n_in: int, sizing: Sizing) -> StructuredFunction:
        symbols = sizing.symbols
        fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * (n_out + n_in + 2 + (symbols is not None))), name=name)
        fn.linkage = "internal"
        args = list(fn.args)
        dims_ptr = args.pop() if symbols is not None else None
        b = Builder(fn.append_basic_block("entry"))
        dims = DimValues(b, dims_ptr, symbols) if dims_ptr is not None and symbols is not None else None
        if dims is not None:
            for s in symbols or ():
                dims.symbol(s)
        return cls(fn, args[:n_out], args[n_out:n_out + n_in], args[-2], args[-1], dims_ptr, b, dims)

    def size(self, sizing: Sizing, t: TensorType) -> Val:
        """The bytes of ``t`` in this run (computed where the builder stands: call it at the entry)."""
        return sizing.runtime(self.b, self.dims, t)


def pointer(o: Value, where: Mapping[Value, ir.Value], constant: Callable[[Value], ir.Value]) -> ir.Value:
    return constant(o) if o.is_const else where[o]


def work_pointer(b: Builder, work: ir.Value, off: int) -> ir.Value:
    return b.gep(work, [const(off)], inbounds=True, source_etype=ir.IntType(8))


def copier(b: Builder) -> Callable[[ir.Value, ir.Value, Val], None]:
    """``copy(dst, src, size)``: a memcpy of ``size`` bytes (nothing for an empty static tensor)."""
    memcpy = declare(b.module, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])

    def copy(dst: ir.Value, src: ir.Value, size: Val) -> None:
        if not (isinstance(size, ir.Constant) and size.constant == 0):
            b.call(memcpy, [dst, src, size, ir.Constant(I1, 0)])

    return copy


def return_unless_ok(b: Builder, rc: Val) -> None:
    """Return a kernel's error code from the calling function unless it is OK."""
    fail_unless(b, b.icmp_signed("==", rc, ir.Constant(I32, OK)), rc)
