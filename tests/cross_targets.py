"""What the tests of cross-compiled libraries need: the aarch64 cross C compiler, its sysroot and
qemu-aarch64; wasm-ld, wasi-libc, compiler-rt's wasm32 builtins and wasmtime (CI installs
gcc-aarch64-linux-gnu, qemu-user, lld, wasi-libc and libclang-rt-14-dev-wasm32; without them those
tests are skipped and say why)."""

from __future__ import annotations

import glob
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

AARCH64 = "aarch64-linux-gnu"
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")


def aarch64_missing() -> str | None:
    """Why aarch64 libraries cannot be built and run here (None when they can)."""
    missing = [what for what, ok in (("aarch64-linux-gnu-gcc", shutil.which("aarch64-linux-gnu-gcc")),
                                     ("qemu-aarch64", shutil.which("qemu-aarch64")),
                                     (str(AARCH64_SYSROOT), AARCH64_SYSROOT.is_dir())) if not ok]
    return ("no " + ", ".join(missing) + " (Debian: gcc-aarch64-linux-gnu, qemu-user)") if missing else None


needs_aarch64 = pytest.mark.skipif(aarch64_missing() is not None, reason=str(aarch64_missing()))

WASM32 = "wasm32-wasi"


def wasm_missing() -> str | None:
    """Why wasm32-wasi modules cannot be built and run here (None when they can)."""
    found = (("wasm-ld (lld)", shutil.which("wasm-ld")),
             ("wasi-libc", Path("/usr/lib/wasm32-wasi/libc.a").is_file()),
             ("libclang-rt-14-dev-wasm32", glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/wasi/*builtins-wasm32.a")),
             ("the wasmtime package", importlib.util.find_spec("wasmtime") is not None))
    missing = [what for what, ok in found if not ok]
    return ("no " + ", ".join(missing)) if missing else None


needs_wasm = pytest.mark.skipif(wasm_missing() is not None, reason=str(wasm_missing()))


def c_toolchain(target: str | None) -> tuple[str | None, list[str]]:
    """The C compiler for programs of ``target`` (None: the host) and the command prefix that runs them."""
    if target is None:
        return shutil.which("cc"), []
    assert target == AARCH64, target
    return shutil.which("aarch64-linux-gnu-gcc"), [str(shutil.which("qemu-aarch64")), "-L", str(AARCH64_SYSROOT)]


def run_c_program(cc: str, run_prefix: list[str], program: str, include: Path, exe: Path, *args: object) -> str:
    """Build ``program`` (C11 with GNU extensions, warnings as errors, the generated header under ``include``)
    into ``exe``, run it with ``args`` and return its standard output; a failed build or run fails the test."""
    build = subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-I", str(include), "-o", str(exe), "-x", "c", "-",
                            "-ldl"], input=program, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    res = subprocess.run([*run_prefix, str(exe), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


# the C consumer tests run for the host and, where the toolchain is, for aarch64 under qemu
C_TARGETS = [pytest.param(None, id="host"), pytest.param(AARCH64, id="aarch64", marks=needs_aarch64)]
