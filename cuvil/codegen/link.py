"""From an llvmlite IR module to a shared library: verify, optimize, emit, link.

The optimizer is LLVM's new pass manager with a target machine for the target's CPU
(its name and feature string go into the manifest); the object is emitted
position-independent and linked with ``-shared`` by the target's C compiler (for the host
``$CC``, else ``cc``; for aarch64 ``$CUVIL_CC_AARCH64``, else ``aarch64-linux-gnu-gcc``), so the
library needs nothing beyond libc and libm. For wasm32-wasi, ``wasm-ld`` links a WASI reactor module
with wasi-libc and the compiler-rt builtins (``$CUVIL_WASM_LD``, ``$CUVIL_WASI_SYSROOT``,
``$CUVIL_WASM_BUILTINS`` override where they are) that exports the entry points, ``malloc``, ``free``
and its memory.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from cuvil.codegen.target import Target, host_target, init_llvm
from cuvil.errors import CodegenError
from cuvil.log import logger


def target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    """The machine code is tuned for; on an AVX-512 host the loop vectorizer may use 512-bit vectors
    (LLVM prefers 256 on these CPUs by default: the requantizing epilogues of the INT8 kernels then ran
    8 lanes at a time; with 16 the QDQ ResNet-18 is 7 % faster, the float models unchanged)."""
    init_llvm()
    t = llvm.Target.from_triple(target.triple)
    feats = target.features + (",-prefer-256-bit" if target.has("avx512f") else "")
    return t.create_target_machine(cpu=target.cpu, features=feats, opt=min(max(opt_level, 0), 3),
                                   reloc="pic", codemodel="default")


_HALF_TYPES = re.compile(r"\b(half|bfloat)\b")


def optimize(module: ir.Module, tm: llvm.TargetMachine, opt_level: int) -> llvm.ModuleRef:
    """Parse and verify the module, then run the standard -O<opt_level> pipeline on it and verify the result.

    LLVM's optimizer has been seen to return a module that fails verification (its loop vectorizer on a loop
    that reads back, sixteen lanes at a time, vectors a kernel stored eight lanes at a time, which another pass
    then joined before they were computed), and its code generator aborts the process on such a module. The
    module is then optimized again without the loop vectorizer, then without any vectorizer: slower code for
    the same meaning. A module that fails even so is a :class:`CodegenError`, not an abort."""
    init_llvm()
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    text = str(module)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"the generated LLVM IR is malformed: {e}", location=module.name,
                           hint="this is a bug in the code generator") from None
    if opt_level <= 0:
        return mod
    # Not for a wasm32 module with half-precision values: LLVM 22's WebAssembly backend turns
    # vectorized f16 conversions into invalid modules (an i64.load16_u passed where i32 is expected)
    # and spends minutes on vectorized element-wise loops over them.
    vectorize = opt_level >= 2 and not (tm.triple.startswith("wasm32") and _HALF_TYPES.search(text))
    tries = [(vectorize, vectorize), (False, vectorize), (False, False)] if vectorize else [(False, False)]
    problem = ""
    for k, (loops, slp) in enumerate(tries):
        if k:  # the first module was changed in place: start again from the text
            mod = llvm.parse_assembly(text)
        pto = llvm.create_pipeline_tuning_options(speed_level=min(opt_level, 3))
        pto.loop_vectorization = loops
        pto.slp_vectorization = slp
        pto.loop_unrolling = opt_level >= 2
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        try:
            mod.verify()
            if k:
                logger.warning("%s: LLVM's optimizer returned an invalid module (%s); optimized again with the "
                               "loop vectorizer%s off", module.name, problem, "" if slp else " and the SLP vectorizer")
            return mod
        except RuntimeError as e:
            problem = problem or str(e).strip().splitlines()[0]
    raise CodegenError(f"LLVM's optimizer returned an invalid module, with and without its vectorizers: {problem}",
                       location=module.name, hint="a bug in LLVM or in the code generator")


def emit_object(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> bytes:
    return tm.emit_object(mod)


# Cross linkers by architecture: (environment variable, default command, Debian package).
CROSS_LINKERS = {"aarch64": ("CUVIL_CC_AARCH64", "aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")}


def compiler(target: Target | None = None) -> str:
    """The C compiler that links libraries for ``target`` (default: the host)."""
    if target is None or target.arch == host_target().arch:
        cc = os.environ.get("CC") or "cc"
        hint = "install a C toolchain (gcc or clang) or set $CC"
    elif target.arch in CROSS_LINKERS:
        var, default, package = CROSS_LINKERS[target.arch]
        cc = os.environ.get(var) or default
        hint = f"install the cross toolchain (Debian: apt-get install {package}) or set ${var}"
    else:
        raise CodegenError(f"no linker is known for target {target.triple}", location="target",
                           hint="targets: the host, " + ", ".join(sorted(CROSS_LINKERS)))
    found = shutil.which(cc)
    if found is None:
        raise CodegenError(f"no C compiler {cc!r} to link the {target.arch if target else 'host'} shared "
                           "library with", location="target", hint=hint)
    return found


WASM_STACK_BYTES = 1 << 20  # the shadow stack (wasm-ld's default of 64 KiB is too small for kernel tiles)


def _wasm_tool(var: str, found: str | None, what: str, package: str) -> str:
    path = os.environ.get(var) or found
    if not path or not Path(path).exists():
        raise CodegenError(f"no {what} to link the wasm32-wasi module with", location="target",
                           hint=f"install it (Debian: apt-get install {package}) or set ${var}")
    return path


def wasm_link_command(obj: Path, out: Path, exports: tuple[str, ...]) -> list[str]:
    """wasm-ld: a WASI reactor (``_initialize`` runs libc's constructors) exporting ``exports``."""
    ld = _wasm_tool("CUVIL_WASM_LD", shutil.which("wasm-ld"), "wasm-ld", "lld")
    root = _wasm_tool("CUVIL_WASI_SYSROOT", "/usr/lib/wasm32-wasi", "wasi-libc", "wasi-libc")
    builtins = sorted(glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a"))
    rt = _wasm_tool("CUVIL_WASM_BUILTINS", builtins[-1] if builtins else None, "compiler-rt builtins for wasm32",
                    "libclang-rt-14-dev-wasm32")
    return [ld, "--no-entry", "-o", str(out), str(Path(root) / "crt1-reactor.o"), str(obj), f"-L{root}", "-lc",
            "-lm", rt, "-z", f"stack-size={WASM_STACK_BYTES}", "--export=_initialize", "--export=malloc",
            "--export=free", *(f"--export={e}" for e in exports)]


def link_shared(obj: bytes, out: Path, target: Target | None = None, exports: tuple[str, ...] = ()) -> None:
    """Link one object into ``out`` for ``target`` (written atomically: a reader never sees a partial
    file); ``exports``: the entry points a module without a dynamic symbol table (wasm) exports."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuvil-link-") as tmp:
        o = Path(tmp) / "model.o"
        o.write_bytes(obj)
        partial = Path(tmp) / out.name
        if target is not None and target.arch == "wasm32":
            cmd = wasm_link_command(o, partial, exports)
        else:
            cmd = [compiler(target), "-shared", "-o", str(partial), str(o), "-Wl,--as-needed", "-lm",
                   "-Wl,-z,noexecstack", "-Wl,-z,now"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CodegenError(f"linking {out.name} failed: {proc.stderr.strip() or proc.stdout.strip()}",
                               location=str(out), hint="command: " + " ".join(cmd))
        staged = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
        shutil.copyfile(partial, staged)
        os.replace(staged, out)
