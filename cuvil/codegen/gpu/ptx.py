"""A function as a PTX module for NVIDIA GPUs (sm_75 and newer) and the plan that launches it.

Every op becomes one ``.entry`` kernel lowered from its compute rule: one thread per output element
(``RuleKernel``'s body with the output loops replaced by the thread's global index), so a kernel
computes exactly what the rule says, with the rule's order of summation (no contraction into FMA:
``mul.rn`` then ``add.rn``). Math functions come from libdevice (``__nv_expf``, ...), linked in
before the optimizer runs. Values live where the CPU memory plan puts them (inputs, outputs,
constants, one arena); the :class:`LaunchPlan` lists the kernels in order with the buffers each one
takes, which the host side (``cuvil.runtime.cuda``) turns into launches. Thread-block tiled GEMM and
conv schedules are not written yet: contractions run one output element per thread.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir

from cuvil.codegen.llvm_types import I1, I32, I64, PTR, declare
from cuvil.codegen.loops import start_block
from cuvil.codegen.lower_rule import RuleKernel, _symbolic_strides, op_rule, static_shape
from cuvil.codegen.plan import MemoryPlan, Slot, plan_memory
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.target import Target, compiling_for, init_llvm
from cuvil.errors import CodegenError
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.values import Value

BLOCK = 256  # threads per block of every kernel
SM_TARGETS = ("sm_75", "sm_90")  # the architectures the PTX is checked for
PTX_FEATURES = "+ptx80"  # PTX ISA 8.0: CUDA 12.0 and newer drivers


def cuda_target(sm: str = "sm_75") -> Target:
    return Target("nvptx64-nvidia-cuda", sm, PTX_FEATURES)


VOID = ir.VoidType()


def _thread_index(b: Builder) -> Val:
    """``blockIdx.x * blockDim.x + threadIdx.x`` as ``i64``."""
    mod = b.module
    assert mod is not None
    sreg = {s: b.zext(b.call(declare(mod, f"llvm.nvvm.read.ptx.sreg.{s}", I32, []), []), I64)
            for s in ("ctaid.x", "ntid.x", "tid.x")}
    return b.add(b.mul(sreg["ctaid.x"], sreg["ntid.x"]), sreg["tid.x"])


class _ThreadRuleKernel(RuleKernel):
    """The rule for the one output element the calling thread owns (``i32`` status, as on the CPU;
    threads past the last element do nothing)."""

    def emit_element(self, numel: int) -> ir.Function:
        b = self.b
        env = {f"i{k}": ("o", k) for k in range(len(self.out_shape))}
        strides = _symbolic_strides(self.out_shape)
        index = _thread_index(b)
        with b.if_then(b.icmp_unsigned("<", index, ir.Constant(I64, numel))):
            rem: Val = index
            for k, s in enumerate(strides):
                assert isinstance(s, int)
                self.bound[("o", k)] = b.udiv(rem, ir.Constant(I64, s)) if s != 1 else rem
                rem = b.urem(rem, ir.Constant(I64, s)) if s != 1 else rem
            with self._layer():
                self._hoist(self.rule, env, 0)
                v = self.lower(self.rule, env, 0)
                flat = self._flat([self.bound[("o", k)] for k in range(len(self.out_shape))], strides)
                self._store(self.out, flat, v)
        failed = b.load(self.err, typ=I1)
        b.ret(b.zext(failed, I32))
        self.alloca_builder.branch(start_block(self.fn))
        return self.fn


def _element_function(mod: ir.Module, name: str, v: Value) -> tuple[ir.Function, int]:
    """``i32 name(ptr out, ptr in...)``: the op's rule at the calling thread's output element."""
    in_types = [o.type for o in v.operands]
    k = _ThreadRuleKernel(mod, name, op_rule(v), in_types, v.type, v.op)
    k.fn.attributes.discard("noinline")
    k.fn.attributes.add("alwaysinline")
    k.fn.linkage = "internal"
    numel = int(np.prod(static_shape(v.type, v.op), dtype=np.int64))
    return k.emit_element(numel), numel


def _entry(mod: ir.Module, name: str, element: ir.Function, n_in: int) -> ir.Function:
    """``.entry name(ptr out, ptr in..., ptr err)``: a grid of threads, one element each; a thread whose
    element fails an index check sets ``*err``."""
    fn = ir.Function(mod, ir.FunctionType(VOID, [PTR] * (n_in + 2)), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    rc = b.call(element, list(fn.args[:n_in + 1]))
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0))):
        b.store(rc, fn.args[n_in + 1])
    b.ret_void()
    annotations = mod.get_named_metadata("nvvm.annotations") if "nvvm.annotations" in mod.namedmetadata \
        else mod.add_named_metadata("nvvm.annotations")
    annotations.add(mod.add_metadata([fn, "kernel", ir.Constant(I32, 1)]))
    return fn


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``grid`` blocks of :data:`BLOCK` threads, the buffers it takes (output first)."""

    kernel: str
    op: str
    grid: int
    buffers: tuple[tuple[str, int | str], ...]  # (input|output|arena, index/offset) or (const, hash)

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "op": self.op, "grid": self.grid, "block": BLOCK,
                "buffers": [list(b) for b in self.buffers]}


@dataclass(frozen=True)
class PtxProgram:
    ptx: str
    launches: tuple[Launch, ...]
    arena_bytes: int
    constants: dict[str, np.ndarray]  # by content hash: uploaded once when the module is loaded
    copies: tuple[tuple[tuple[str, int | str], int], ...]  # outputs filled by a copy: (source, output index)


def _where(plan: MemoryPlan, v: Value) -> tuple[str, int | str]:
    s: Slot = plan.slots[v]
    return ("const", v.const_hash) if s.kind == "const" else (s.kind, s.index)


def lower_to_ptx(fn: Function, constants: Mapping[str, np.ndarray], sm: str = "sm_75") -> PtxProgram:
    """``fn`` (static shapes, no loop or cond ops) as PTX for ``sm`` and its launch plan."""
    for p in fn.params:
        static_shape(p.type, f"input {p.name!r}")
    plan = plan_memory(fn)
    target = cuda_target(sm)
    mod = ir.Module(name=fn.name)
    launches = []
    with compiling_for(target):
        for k, v in enumerate(plan.steps):
            if get_op(v.op).structured:
                raise CodegenError(f"{v.op} (a loop or cond) is not compiled for CUDA yet", location=v.op,
                                   hint="compile for the CPU, or unroll the loop first (passes unroll-loops)")
            element, numel = _element_function(mod, f"e{k}.{v.op}", v)
            name = f"k{k}_{v.op}"
            _entry(mod, name, element, len(v.operands))
            launches.append(Launch(name, v.op, max(1, -(-numel // BLOCK)),
                                   (_where(plan, v), *(_where(plan, o) for o in v.operands))))
        ptx = emit_ptx(mod, target)
    used = {o.const_hash for v in plan.steps for o in v.operands if o.is_const}
    used |= {v.const_hash for v, _ in plan.copies if v.is_const}
    return PtxProgram(ptx, tuple(launches), plan.arena_bytes, {h: np.asarray(constants[h]) for h in sorted(used)},
                      tuple((_where(plan, v), r) for v, r in plan.copies))


@functools.cache
def libdevice_path() -> str | None:
    """CUDA's libdevice bitcode (``$CUVIL_LIBDEVICE``, else under ``$CUDA_HOME`` or /usr/local/cuda*)."""
    explicit = os.environ.get("CUVIL_LIBDEVICE")
    if explicit:
        return explicit
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "nvvm", "libdevice", "libdevice*.bc"))) if root else []
        if found:
            return found[-1]
    return None


def emit_ptx(mod: ir.Module, target: Target) -> str:
    """Link libdevice when the module calls it, optimize at O3 and print PTX."""
    import llvmlite.binding as llvm

    from cuvil.codegen.link import target_machine

    init_llvm()
    tm = target_machine(target, 3)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    ref = llvm.parse_assembly(str(mod))
    ref.verify()
    if any(f.is_declaration and f.name.startswith("__nv_") for f in ref.functions):
        path = libdevice_path()
        if path is None:
            raise CodegenError("the CUDA module calls math functions and no libdevice was found", location="target",
                               hint="install the CUDA toolkit or set $CUVIL_LIBDEVICE to libdevice.10.bc")
        lib = llvm.parse_bitcode(Path(path).read_bytes())
        lib.triple = tm.triple
        lib.data_layout = str(tm.target_data)
        ref.link_in(lib)
        kernels = {f.name for f in ref.functions if f.name.startswith("k") and not f.is_declaration}
        for f in ref.functions:  # only the kernels stay visible: unused libdevice code is dropped
            if not f.is_declaration and f.name not in kernels:
                f.linkage = llvm.Linkage.internal
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(ref, pb)
    return tm.emit_assembly(ref)


def ptxas_path() -> str | None:
    return os.environ.get("CUVIL_PTXAS") or shutil.which("ptxas")


def check_ptx(ptx: str, sm: str) -> None:
    """Assemble ``ptx`` for ``sm`` with NVIDIA's ``ptxas`` (a CodegenError with its message if it refuses)."""
    exe = ptxas_path()
    if exe is None:
        raise CodegenError("no ptxas to check the PTX with", location="target",
                           hint="install the CUDA toolkit (ptxas) or set $CUVIL_PTXAS")
    with tempfile.TemporaryDirectory(prefix="cuvil-ptx-") as tmp:
        src = Path(tmp) / "module.ptx"
        src.write_text(ptx)
        proc = subprocess.run([exe, f"-arch={sm}", str(src), "-o", str(Path(tmp) / "module.cubin")],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CodegenError(f"ptxas refused the PTX for {sm}: {proc.stderr.strip()[-2000:]}", location="target",
                           hint="this is a bug in the code generator")
