"""What a library is compiled for: a target triple, a CPU name and its feature string.

The host is read from LLVM. A cross target (``aarch64``) is a fixed, conservative description
(the base ISA every CPU of that architecture has), so a library built for it runs on any of them.
Kernels ask :func:`codegen_target` which one is being compiled for (the host outside a build):
vector widths, ``vpdpbusd`` and the spin-wait hint follow the target, not the machine compiling.
"""

from __future__ import annotations

import contextlib
import contextvars
import platform
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """What a compiled library assumes about the CPU it runs on."""

    triple: str
    cpu: str
    features: str

    @property
    def arch(self) -> str:
        """The architecture part of the triple, normalized (``x86_64``, ``aarch64``)."""
        return normalize_arch(self.triple.split("-", 1)[0])

    @property
    def feature_set(self) -> frozenset[str]:
        return frozenset(f for f in self.features.split(",") if f)

    @property
    def threads(self) -> bool:
        """Whether libraries for it may start threads (wasm32-wasi has none: kernels run serially)."""
        return self.arch != "wasm32"

    @property
    def fused_multiply_add(self) -> bool:
        """Whether ``llvm.fma`` is an instruction (wasm32 SIMD128 has none: it would be a call to libm's
        ``fmaf`` per lane, so kernels multiply and add there)."""
        return self.arch != "wasm32"

    @property
    def pointer_bits(self) -> int:
        """The width of a pointer and of C's ``size_t``."""
        return 32 if self.arch == "wasm32" else 64

    @property
    def library_suffix(self) -> str:
        return {"wasm32": ".wasm", "nvptx64": ".ptx"}.get(self.arch, ".so")

    def has(self, *features: str) -> bool:
        """Whether every one of ``features`` (names without the ``+``) is enabled."""
        return all(f"+{f}" in self.feature_set for f in features)

    @property
    def l1_data_bytes(self) -> int:
        """The L1 data cache of one core of the CPU, from its name (:data:`L1_DATA_32K`); 48 KB where the
        name is not listed (what the kernels' blocks were first measured on)."""
        return 32 * 1024 if self.cpu in L1_DATA_32K else 48 * 1024

    def to_json(self) -> dict[str, str]:
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features}


L1_DATA_32K = frozenset({"haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake", "cooperlake",
                         "cannonlake", "znver1", "znver2", "znver3", "znver4"})
"""LLVM's names of the x86 CPUs whose cores have 32 KB of L1 data cache (Ice Lake and later Intel cores and
Zen 5 have 48 KB). Read from the name, as the build's key holds it, so a cached library's blocks match it."""


def normalize_arch(arch: str) -> str:
    arch = arch.lower()
    if arch in ("x86-64", "x86_64", "amd64"):
        return "x86_64"
    if arch in ("arm64", "aarch64"):
        return "aarch64"
    return arch


_init_lock = threading.Lock()
_initialized = False


def init_llvm() -> None:
    """Every target LLVM was built with (the host and the cross targets) and their code emitters."""
    global _initialized
    import llvmlite.binding as llvm  # here, not at the top: a process that only runs libraries needs no LLVM

    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def host_target() -> Target:
    import llvmlite.binding as llvm

    init_llvm()
    return Target(llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())


# ARMv8-A with Advanced SIMD (NEON) and FP: every 64-bit ARM Linux CPU has them.
AARCH64_LINUX = Target("aarch64-unknown-linux-gnu", "generic", "+neon,+fp-armv8")

# WebAssembly with 128-bit SIMD, for a WASI runtime (wasmtime) or a browser; no threads.
WASM32_WASI = Target("wasm32-unknown-wasi", "generic", "+simd128")

CROSS_TARGETS = {"aarch64": AARCH64_LINUX, "wasm32": WASM32_WASI}

# What tests back the code of each target: the proofs are about CIR and hold for every target; the
# code is a schedule of the rules, differential-tested per target against the interpreter.
SCHEDULE_TESTS = {
    "x86_64": "op catalogue (-O0/-O2/-O3), zoo, ONNX node suite and tuned-kernel tests, run natively "
              "against the interpreter",
    "aarch64": "op catalogue (-O0/-O2/-O3), zoo, ONNX node suite and C consumer programs, run under "
               "qemu-aarch64 against the interpreter",
    "wasm32": "op catalogue (-O0/-O2/-O3), zoo and ONNX node suite, run in wasmtime against the "
              "interpreter; the bundled example in headless Chromium",
    "nvptx64": "PTX of the op catalogue and the zoo assembled by ptxas for sm_75 and sm_90; not run "
               "on a GPU by the test suite",
}


def certificate_target(target: Target) -> dict[str, str]:
    """The target entry of a certificate: what the library is for and which tests back its code."""
    return {**target.to_json(), "scope": "the proofs are about the CIR and hold on every target; the code "
            "for this one is a schedule of the ops' rules", "tested_by": SCHEDULE_TESTS.get(target.arch, "none")}


_active: contextvars.ContextVar[Target | None] = contextvars.ContextVar("cuvil_codegen_target", default=None)


def codegen_target() -> Target:
    """The target of the library being built (the host outside :func:`compiling_for`)."""
    found = _active.get()
    return found if found is not None else host_target()


@contextlib.contextmanager
def compiling_for(target: Target) -> Iterator[Target]:
    """Kernels chosen and written inside this block are for ``target``."""
    token = _active.set(target)
    try:
        yield target
    finally:
        _active.reset(token)


def host_arch() -> str:
    """This machine's architecture, without asking LLVM (the runtime does not load it)."""
    return normalize_arch(platform.machine())
