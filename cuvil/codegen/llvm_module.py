"""A CIR function as one LLVM module: a kernel per op (ops whose kernels come out the same share one:
:mod:`cuvil.codegen.kernel_sharing`), the constants, and the C entry points.

Exported symbols (``P`` is ``cuvil_<function name>``; see :mod:`cuvil.codegen.header`):

- ``void* P_create(void)``: a context owning the arena for intermediates (NULL when out of memory);
- ``void P_destroy(void* ctx)``;
- ``int32_t P_run(void* ctx, void* const* inputs, void* const* outputs)``: trusts its caller
  about shapes and dtypes (the data pointers are in manifest order); a library compiled for a
  shape class (:mod:`cuvil.codegen.shape_class`) has ``int32_t P_run_dims(void* ctx, const int64_t*
  dims, void* const* inputs, void* const* outputs)`` instead, ``dims`` giving each symbol's value;
- ``int32_t P_run_checked(void* ctx, const cuvil_tensor* inputs, int64_t n_inputs,
  const cuvil_tensor* outputs, int64_t n_outputs)``: checks counts, ranks, dims, dtypes and
  null pointers against the compiled signature first (for a shape class: solves the dims from the
  input shapes and checks them against the class), and returns an error code instead of touching
  memory when anything differs;
- ``const char* P_guard_fault(int32_t code)``, in a library compiled with a fail-safe policy only:
  the policy's fault a guard code stands for (see :mod:`cuvil.codegen.guard`; ``P_run`` then checks
  the input and output values too);
- ``int64_t P_profile(int64_t* ns, int64_t capacity, int32_t reset)``, in a library compiled with
  ``profile`` only: the time each op took over the runs so far (:mod:`cuvil.codegen.profile`).

Every entry point returns 0 or one of the codes in :mod:`cuvil.codegen.abi`. One context
must not run on two threads at once; separate contexts are independent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.activation_layout import lay_out
from cuvil.codegen.dims import DimValues
from cuvil.codegen.guard import GuardChecks, TensorCheck, emit_checks, emit_fault_names
from cuvil.codegen.kernel_sharing import share_identical_kernels, step_prefix
from cuvil.codegen.kernels import Kernel, choose_kernel, operand_args, operand_data, takes_dims
from cuvil.codegen.kernels.gemm import pool_threads
from cuvil.codegen.kernels.pack import embed_array
from cuvil.codegen.kernels.threads import default_pool_size, in_run, set_default_threads, settle_wake
from cuvil.codegen.llvm_types import I1, I8, I32, I64, PTR, declare
from cuvil.codegen.loops import fail_unless, not_null
from cuvil.codegen.lower_rule import emit_rule_kernel, op_rule, scalar_operands, static_shape
from cuvil.codegen.manifest import PROVENANCE_PREFIX
from cuvil.codegen.plan import MemoryPlan, ordered_steps, plan_memory
from cuvil.codegen.profile import StepClock, check_profile_target
from cuvil.codegen.scalar import Builder, GlobalVariable, Val
from cuvil.codegen.shape_class import ShapeClass
from cuvil.codegen.sizing import Sizing, numel
from cuvil.codegen.structured import StructuredKernel, structured_kernels
from cuvil.codegen.target import codegen_target
from cuvil.errors import CodegenError
from cuvil.ir import hashing
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType, check_tensor_size
from cuvil.ir.values import Value
from cuvil.log import logger

# struct cuvil_tensor { void* data; const int64_t* shape; int32_t rank; int32_t dtype; }: 24 bytes
TENSOR_STRUCT = ir.LiteralStructType([PTR, PTR, I32, I32])


@dataclass(frozen=True)
class LoweredFunction:
    """The LLVM module of one function, plus what the manifest and header say about it."""

    module: ir.Module
    name: str
    prefix: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    plan: MemoryPlan
    constants_bytes: int
    ops: tuple[str, ...]
    function_hash: str
    kernels: tuple[str, ...] = ()  # per step: the tuned kernel's name, or "rule" (generic lowering)
    guard: GuardChecks | None = None  # the value checks of a fail-safe policy
    shape_class: ShapeClass | None = None  # the dims it takes at run time (None: static shapes)
    types: tuple[str, ...] = ()  # per step: its result's type, as CIR prints it
    profiled: bool = False  # whether its run times every step (cuvil.codegen.profile)

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes


def embed_provenance(mod: ir.Module, prefix: str, fields: Mapping[str, str]) -> None:
    """A constant string in the library naming what it was compiled from and the certificate that
    vouches for it (``cuvil-provenance;function=...;certificate=...;``), so a manifest or a
    certificate taken from another library does not match it."""
    text = PROVENANCE_PREFIX + "".join(f"{k}={v};" for k, v in sorted(fields.items())).encode() + b"\0"
    arr = ir.ArrayType(ir.IntType(8), len(text))
    g = GlobalVariable(mod, arr, name=f"{prefix}_provenance")
    g.initializer = ir.Constant(arr, bytearray(text))
    g.global_constant = True


def lower_function(fn: Function, constants: Mapping[str, np.ndarray], *, name: str | None = None,
                   threads: int | None = None, guard: GuardChecks | None = None,
                   shape_class: ShapeClass | None = None, profile: bool = False) -> LoweredFunction:
    """Build the LLVM module of ``fn``: at its static shapes, or, given its ``shape_class``, once for
    every size its symbolic dims may take (kernels read the dims at run time; the arena is planned at
    the maxima). ``threads`` is the default size of the thread pool tuned kernels run on (None: what the
    pool finds where it runs, ``$CUVIL_NUM_THREADS`` or the CPUs the process may use); ``guard``: the
    value checks the run entry point makes before and after the ops; ``profile``: time every op of a run
    (:mod:`cuvil.codegen.profile`). Kernels cut their blocks for a pool of ``threads``, or of the size a
    pool started here would take."""
    with pool_threads(threads or default_pool_size()):
        return _lower(fn, constants, name=name, threads=threads, guard=guard, shape_class=shape_class,
                      profile=profile)


def _lower(fn: Function, constants: Mapping[str, np.ndarray], *, name: str | None, threads: int | None,
           guard: GuardChecks | None, shape_class: ShapeClass | None, profile: bool) -> LoweredFunction:
    name = name or fn.name
    prefix = abi.symbol_prefix(name)
    _check_storage(fn)
    sizing = Sizing(shape_class)
    symbols = sizing.symbols
    if shape_class is None:
        def shape_of(t: TensorType, where: str) -> tuple[int, ...]:
            return static_shape(t, where)
    else:
        _check_shape_class(fn, shape_class, guard)

        def shape_of(t: TensorType, where: str) -> tuple[int, ...]:
            return tuple(t.shape)  # type: ignore[arg-type]  (symbolic dims: the manifest formats them)
    inputs = tuple(TensorSpec(p.name, p.dtype, shape_of(p.type, f"input {p.name!r}")) for p in fn.params)
    outputs = tuple(TensorSpec(n, r.dtype, shape_of(r.type, f"output {n!r}"))
                    for n, r in zip(fn.result_names, fn.results, strict=True))
    loops = structured_kernels(ordered_steps(fn), constants, sizing)
    work = {first: lk.work_bytes for first, lk in loops.items()}
    plan = plan_memory(fn, work, size_of=sizing.planned, views=True)
    mod = ir.Module(name=prefix)

    for v in fn.values():
        if v.is_const and v.const_hash not in constants:
            raise CodegenError(f"constant {v.const_hash} is missing from the module", location=fn.name)

    kernels: list[ir.Function | None] = []
    tuned: dict[Value, Kernel] = {}
    passed: dict[Value, dict[int, ir.GlobalVariable]] = {}  # constants a call passes in operand slots (packed weights)

    def emitted_below(v: Value) -> bool:  # a structured op, or a view of its operand's memory
        return get_op(v.op).structured or v in plan.views

    for v in plan.steps:
        if not emitted_below(v) and (kernel := choose_kernel(v, constants, shape_class)) is not None:
            tuned[v] = kernel  # a tuned schedule of the op's rule (cuvil.codegen.kernels)
    if not loops:  # (a loop's body may read any value of the function, row-major)
        keep = {*fn.results, *(v for v, _ in plan.copies), *plan.views, *plan.views.values()}
        laid_out = lay_out(plan.steps, tuned, keep)
        if laid_out:  # the same steps and views, those values' slots larger
            plan = plan_memory(fn, work, size_of=sizing.planned, views=True, laid_out=laid_out)
    for k, v in enumerate(plan.steps):
        if emitted_below(v):
            kernels.append(None)
            continue
        if v in tuned:
            kernel = tuned[v]
            kernels.append(kernel.emit(mod, f"{step_prefix(k)}{v.op}"))
            passed[v] = operand_data(kernel, mod, f"{step_prefix(k)}{v.op}")
            logger.debug("op %d %s: kernel %s", k, v.op, kernel.name)
            continue
        kernels.append(emit_rule_kernel(mod, f"{step_prefix(k)}{v.op}", op_rule(v), [o.type for o in v.operands],
                                        v.type, v.op, dims=symbols, scalars=scalar_operands(v, constants)))

    # raw constants: only those some kernel reads as they are (a packed weight is embedded packed)
    const_globals: dict[str, ir.GlobalVariable] = {}
    const_bytes = 0
    needed = [o for v in plan.steps for j, o in enumerate(v.operands)
              if o.is_const and (v not in tuned or j not in tuned[v].unused_operands)]
    needed += [v for v, _ in plan.copies if v.is_const]
    needed += [c for lk in loops.values() for c in lk.constants_read]
    for v in needed:
        if v.const_hash in const_globals:
            continue
        data = np.ascontiguousarray(constants[v.const_hash])
        const_bytes += data.nbytes
        const_globals[v.const_hash] = embed_array(mod, f"const.{v.const_hash}", data)

    const_bytes += sum(kn.constant_bytes for kn in tuned.values()) + sum(lk.constant_bytes for lk in loops.values())
    for k, v in enumerate(plan.steps):  # the group's first result runs the op; the others are written by it
        if v in loops:
            kernels[k] = loops[v].emit(mod, f"{step_prefix(k)}{v.op}", lambda c: const_globals[c.const_hash])
    share_identical_kernels(mod, kernels)
    scratch = max([kn.scratch_bytes for kn in tuned.values()] + [lk.scratch_bytes for lk in loops.values()],
                  default=0)
    set_default_threads(mod, threads)
    settle_wake(mod)
    checks: list[tuple[TensorCheck, ir.Function]] = []
    if guard is not None:
        checks = emit_checks(mod, prefix, guard.plan(inputs, outputs))
        emit_fault_names(mod, prefix, guard)
    if profile:
        check_profile_target(codegen_target())
    entry = EntryPoints(mod, prefix, plan, const_globals, inputs, outputs, scratch, sizing, profile)
    run = entry.emit_run(kernels, tuned, passed, loops, checks)
    entry.emit_run_checked(run)
    return LoweredFunction(mod, name, prefix, inputs, outputs, plan, const_bytes,
                           tuple(v.op for v in plan.steps), hashing.compiled_function_hash(fn, constants),
                           tuple(tuned[v].name if v in tuned else "view" if v in plan.views else "rule"
                                 for v in plan.steps), guard, shape_class, tuple(str(v.type) for v in plan.steps),
                           profile)


def _check_shape_class(fn: Function, shape_class: ShapeClass, guard: GuardChecks | None) -> None:
    """Refuse what a shape-class library cannot hold yet, naming the way out."""
    hint = "compile at concrete shapes (--specialize NAME=2x3x...)"
    if guard is not None:
        raise CodegenError("a fail-safe guard is compiled at concrete shapes", location=fn.name, hint=hint)
    missing = sorted({s for v in fn.values() for s in v.type.symbols()} - set(shape_class.symbols))
    if missing:
        raise CodegenError(f"no largest size for symbolic dims {missing}", location=fn.name, hint=hint)


def _check_storage(fn: Function) -> None:
    """Refuse element types the code generator has no storage layout (ABI dtype code) for, and
    tensors too large to address, before any size is computed in 64-bit arithmetic."""
    for v in fn.values():
        where = f"input {v.name!r}" if v.is_param else ("a constant" if v.is_const else f"{v.op}")
        if v.type.is_static:
            check_tensor_size(v.type.concrete({}), f"the tensor of {where}", where)
        if v.dtype not in abi.DTYPE_CODES:
            raise CodegenError(f"element type {v.dtype.value} is not supported by the LLVM backend ({where})",
                               location=where,
                               hint="compiled code handles: " + ", ".join(d.value for d in abi.DTYPE_CODES))


# --------------------------------------------------------------------------------------
# entry points


def emit_context_functions(mod: ir.Module, prefix: str, arena_bytes: int) -> None:
    """``{prefix}_create()``, which allocates the arena (aligned), and ``{prefix}_destroy(ctx)``."""
    create = ir.Function(mod, ir.FunctionType(PTR, []), name=f"{prefix}_create")
    b = Builder(create.append_basic_block("entry"))
    target = codegen_target()
    size_t = ir.IntType(target.pointer_bits)
    aligned_alloc = declare(mod, "aligned_alloc", PTR, [size_t, size_t])
    size = -(-max(arena_bytes, abi.ARENA_ALIGN) // abi.ARENA_ALIGN) * abi.ARENA_ALIGN
    if size >= 2 ** target.pointer_bits:
        raise CodegenError(f"{prefix} needs {size} bytes of working memory, more than a {target.triple} "
                           "address space holds", location=prefix,
                           hint="compile for smaller shapes, or for a 64-bit target")
    b.ret(b.call(aligned_alloc, [ir.Constant(size_t, abi.ARENA_ALIGN), ir.Constant(size_t, size)]))
    destroy = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR]), name=f"{prefix}_destroy")
    b = Builder(destroy.append_basic_block("entry"))
    b.call(declare(mod, "free", ir.VoidType(), [PTR]), [destroy.args[0]])
    b.ret_void()


def slot_pointer(b: Builder, plan: MemoryPlan, v: Value, ctx: Val, in_arr: Val, out_arr: Val,
                 const_globals: Mapping[str, ir.GlobalVariable]) -> ir.Value:
    """Where ``v`` lives while the run entry point runs: a constant's global, its arena offset in
    ``ctx``, or the caller's input or output buffer."""
    s = plan.slots[v]
    if s.kind == "const":
        return const_globals[v.const_hash]
    if s.kind == "arena":
        return b.gep(ctx, [ir.Constant(I64, s.index)], inbounds=True, source_etype=I8)
    arr = in_arr if s.kind == "input" else out_arr
    return b.load(b.gep(arr, [ir.Constant(I64, s.index)], inbounds=True, source_etype=PTR), typ=PTR)


def _guard(b: Builder, checks: list[tuple[TensorCheck, ir.Function]], side: str, tensors: Val) -> None:
    """Run the guard's checks of one side on the data pointers in ``tensors``; return the first failure."""
    for check, fn in checks:
        if check.side == side:
            data = b.load(b.gep(tensors, [ir.Constant(I64, check.index)], inbounds=True, source_etype=PTR), typ=PTR)
            rc = b.call(fn, [data])
            fail_unless(b, b.icmp_signed("==", rc, ir.Constant(I32, abi.OK)), rc)


class EntryPoints:
    """The exported entry points of one lowered function: create/destroy, the run entry point (``P_run``,
    or ``P_run_dims`` for a shape class) and ``P_run_checked`` in front of it."""

    def __init__(self, mod: ir.Module, prefix: str, plan: MemoryPlan, const_globals: Mapping[str, ir.GlobalVariable],
                 inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], scratch: int,
                 sizing: Sizing, profile: bool = False) -> None:
        self.mod, self.prefix, self.plan, self.const_globals = mod, prefix, plan, const_globals
        self.clock = StepClock(mod, prefix, len(plan.steps)) if profile else None  # per-step timing (profile)
        self.inputs, self.outputs, self.scratch, self.sizing = inputs, outputs, scratch, sizing
        self.shape_class = sizing.shape_class
        # tuned kernels share one scratch area after the arena (they run one at a time)
        self.scratch_at = -(-plan.arena_bytes // abi.ARENA_ALIGN) * abi.ARENA_ALIGN
        emit_context_functions(mod, prefix, max(self.scratch_at + scratch if scratch else plan.arena_bytes,
                                                abi.ARENA_ALIGN))

    def emit_run(self, kernels: list[ir.Function | None], tuned: Mapping[Value, Kernel],
                 passed: Mapping[Value, Mapping[int, ir.GlobalVariable]], loops: Mapping[Value, StructuredKernel],
                 checks: list[tuple[TensorCheck, ir.Function]]) -> ir.Function:
        """The ops in plan order, on trusted buffers (and, for a shape class, trusted dims); the exported
        function counts as a run in progress for the thread pool (:func:`in_run`) around them."""
        plan, sc = self.plan, self.shape_class
        name = f"{self.prefix}_run" if sc is None else f"{self.prefix}_run_dims"
        fnty = ir.FunctionType(I32, [PTR, PTR, PTR] if sc is None else [PTR, PTR, PTR, PTR])
        run = ir.Function(self.mod, fnty, name=f"{name}.ops")
        run.linkage = "internal"
        if sc is None:
            ctx, in_arr, out_arr = run.args
            dims_ptr: Val | None = None
        else:
            ctx, dims_ptr, in_arr, out_arr = run.args
            dims_ptr.name = "dims"
        ctx.name, in_arr.name, out_arr.name = "ctx", "inputs", "outputs"
        b = Builder(run.append_basic_block("entry"))
        if plan.arena_bytes > 0 or self.scratch > 0:
            fail_unless(b, not_null(b, ctx), abi.ERR_NULL)
        for ptr, needed in ((in_arr, self.inputs), (out_arr, self.outputs), (dims_ptr, sc and sc.symbols)):
            if ptr is not None and needed:
                fail_unless(b, not_null(b, ptr), abi.ERR_NULL)
        _guard(b, checks, "input", in_arr)
        dims = DimValues(b, dims_ptr, sc.symbols) if sc is not None and dims_ptr is not None else None

        def slot_ptr(v: Value) -> ir.Value:
            return slot_pointer(b, plan, v, ctx, in_arr, out_arr, self.const_globals)

        def scratch_ptr() -> ir.Value:
            return b.gep(ctx, [ir.Constant(I64, self.scratch_at)], inbounds=True, source_etype=I8) if self.scratch \
                else ir.Constant(PTR, None)

        for k, (v, kernel) in enumerate(zip(plan.steps, kernels, strict=True)):
            if kernel is None:  # a loop or cond result its group's first result writes, or a view
                continue
            if v in loops:
                lk = loops[v]
                members = lk.group.members
                args = [slot_ptr(members[j]) if j in members else ir.Constant(PTR, None)
                        for j in range(len(lk.results))]
                args += [slot_ptr(o) for o in lk.operands]
                args += [b.gep(ctx, [ir.Constant(I64, plan.work[v])], inbounds=True, source_etype=I8), scratch_ptr()]
                if dims_ptr is not None:
                    args.append(dims_ptr)
            else:
                args = [slot_ptr(v), *operand_args(v.operands, tuned.get(v), passed.get(v, {}), slot_ptr)]
                if v in tuned:
                    args.append(scratch_ptr())
                if dims_ptr is not None and (v not in tuned or takes_dims(tuned[v])):  # sizes read at run time
                    args.append(dims_ptr)
            start = self.clock.now(b) if self.clock is not None else None
            rc = b.call(kernel, args)
            if self.clock is not None and start is not None:
                self.clock.add(b, k, start)
            fail_unless(b, b.icmp_signed("==", rc, ir.Constant(I32, abi.OK)), rc)
        if plan.copies:  # results that are inputs or constants: copied
            memcpy = declare(self.mod, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
            for v, r in plan.copies:
                dst = b.load(b.gep(out_arr, [ir.Constant(I64, r)], inbounds=True, source_etype=PTR), typ=PTR)
                size = self.sizing.runtime(b, dims, v.type)
                b.call(memcpy, [dst, slot_ptr(v), size, ir.Constant(I1, 0)])
        _guard(b, checks, "output", out_arr)
        if self.clock is not None:
            self.clock.count_run(b)
            self.clock.emit_reader()
        b.ret(ir.Constant(I32, abi.OK))
        exported = ir.Function(self.mod, fnty, name=name)
        eb = Builder(exported.append_basic_block("entry"))
        eb.ret(in_run(self.mod, eb, lambda: eb.call(run, list(exported.args))))
        return exported

    def emit_run_checked(self, run: ir.Function) -> None:
        """Validate the descriptors (for a shape class: solve the dims from the input shapes, check them
        against the class and every dim against its formula), then call ``run``."""
        sc = self.shape_class
        checked = ir.Function(self.mod, ir.FunctionType(I32, [PTR, PTR, I64, PTR, I64]),
                              name=f"{self.prefix}_run_checked")
        cctx, tin, n_in, tout, n_out = checked.args
        cctx.name, tin.name, n_in.name, tout.name, n_out.name = "ctx", "inputs", "n_inputs", "outputs", "n_outputs"
        b = Builder(checked.append_basic_block("entry"))
        sides = ((tin, self.inputs, b.alloca(PTR, size=ir.Constant(I64, max(len(self.inputs), 1)), name="input_data")),
                 (tout, self.outputs, b.alloca(PTR, size=ir.Constant(I64, max(len(self.outputs), 1)),
                                               name="output_data")))
        dims_arr = b.alloca(I64, size=ir.Constant(I64, max(len(sc.symbols), 1)), name="dims") if sc else None
        fail_unless(b, b.and_(b.icmp_signed("==", n_in, ir.Constant(I64, len(self.inputs))),
                               b.icmp_signed("==", n_out, ir.Constant(I64, len(self.outputs)))), abi.ERR_ARITY)

        def field(tensors: Val, k: int, i: int, ty: ir.Type) -> Val:
            p = b.gep(tensors, [ir.Constant(I64, k), ir.Constant(I32, i)], inbounds=True, source_etype=TENSOR_STRUCT)
            return b.load(p, typ=ty)

        def dim_of(tensors: Val, k: int, axis: int) -> Val:
            shape = field(tensors, k, 1, PTR)
            return b.load(b.gep(shape, [ir.Constant(I64, axis)], inbounds=True, source_etype=I64), typ=I64)

        # the descriptors' own fields, first
        for tensors, specs, ptrs in sides:
            if not specs:
                continue
            fail_unless(b, not_null(b, tensors), abi.ERR_NULL)
            for k, spec in enumerate(specs):
                data = field(tensors, k, 0, PTR)
                if sc is None and spec.nbytes:
                    fail_unless(b, not_null(b, data), abi.ERR_NULL)
                fail_unless(b, b.icmp_signed("==", field(tensors, k, 3, I32),
                                             ir.Constant(I32, abi.DTYPE_CODES[spec.dtype])), abi.ERR_DTYPE)
                fail_unless(b, b.icmp_signed("==", field(tensors, k, 2, I32), ir.Constant(I32, len(spec.shape))),
                            abi.ERR_RANK)
                if spec.shape:
                    fail_unless(b, not_null(b, field(tensors, k, 1, PTR)), abi.ERR_NULL)
                b.store(data, b.gep(ptrs, [ir.Constant(I64, k)], inbounds=True, source_etype=PTR))
        # the dims of a shape class: each from its source, inside the class
        dims: DimValues | None = None
        if sc is not None and dims_arr is not None:
            for j, (symbol, (i, axis)) in enumerate(zip(sc.symbols, sc.sources, strict=True)):
                value = dim_of(tin, i, axis)
                lo, hi, mult = sc.bound(symbol)
                ok = b.and_(b.icmp_signed(">=", value, ir.Constant(I64, lo)),
                            b.icmp_signed("<=", value, ir.Constant(I64, hi)))
                fail_unless(b, ok, abi.ERR_SHAPE_CLASS)
                if mult != 1:
                    fail_unless(b, b.icmp_signed("==", b.srem(value, ir.Constant(I64, mult)), ir.Constant(I64, 0)),
                                abi.ERR_SHAPE_CLASS)
                b.store(value, b.gep(dims_arr, [ir.Constant(I64, j)], inbounds=True, source_etype=I64))
            dims = DimValues(b, dims_arr, sc.symbols)
        # every dim against the signature (its formula, for a shape class)
        for tensors, specs, ptrs in sides:
            for k, spec in enumerate(specs):
                if not spec.shape:
                    continue
                ok: Val = ir.Constant(I1, 1)
                for axis, d in enumerate(spec.shape):
                    expect = ir.Constant(I64, d) if isinstance(d, int) or dims is None else dims.value(d)
                    ok = b.and_(ok, b.icmp_signed("==", dim_of(tensors, k, axis), expect))
                    if not isinstance(expect, ir.Constant):  # a formula may fall below zero (``N - 5``)
                        fail_unless(b, b.icmp_signed(">=", expect, ir.Constant(I64, 0)), abi.ERR_SHAPE_CLASS)
                fail_unless(b, ok, abi.ERR_SHAPE)
                if dims is not None:  # data may be null only when the tensor is empty
                    data = b.load(b.gep(ptrs, [ir.Constant(I64, k)], inbounds=True, source_etype=PTR), typ=PTR)
                    empty = b.icmp_signed("==", numel(b, dims, spec.shape), ir.Constant(I64, 0))
                    fail_unless(b, b.or_(not_null(b, data), empty), abi.ERR_NULL)
        args = [cctx, sides[0][2], sides[1][2]]
        if dims_arr is not None:
            args.insert(1, dims_arr)
        b.ret(b.call(run, args))
