"""Running a library built for another architecture on this machine, under qemu-user.

A cross-compiled library cannot be mapped into this process. Each call writes the inputs to a
request file, runs a small C runner (``runner.c``, built once per process with the target's C
compiler) under the target's emulator, and reads the outputs back: the same checked entry point a
native caller uses, so shapes, dtypes and error codes behave as on the device. It is meant for
tests and checks (a call costs an emulator start), not for serving.
"""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.target import Target
from cuvil.errors import CodegenError, RuntimeEvalError
from cuvil.runtime.loader import NativeLibrary

# By architecture: (emulator variable, emulator, Debian package, sysroot variable, sysroot).
EMULATORS = {"aarch64": ("CUVIL_QEMU_AARCH64", "qemu-aarch64", "qemu-user",
                         "CUVIL_SYSROOT_AARCH64", "/usr/aarch64-linux-gnu")}
RUNNER_SOURCE = Path(__file__).with_name("runner.c")
CALL_TIMEOUT_S = 600.0
_REQUEST, _RESPONSE = b"CUVLREQ1", b"CUVLRES1"

_runners: dict[str, Path] = {}
_runner_lock = threading.Lock()


def emulator(arch: str) -> tuple[list[str], dict[str, str]]:
    """The command prefix that runs a program of ``arch`` here, and its environment additions."""
    if arch not in EMULATORS:
        raise CodegenError(f"no emulator is known for {arch} libraries", location="target",
                           hint="run the library on a machine of its architecture (its C header gives the ABI)")
    var, default, package, root_var, root_default = EMULATORS[arch]
    wanted = os.environ.get(var) or default
    exe = shutil.which(wanted)
    if exe is None:
        raise CodegenError(f"cannot run the {arch} library here: no {wanted}", location="target",
                           hint=f"install it (Debian: apt-get install {package}) or set ${var}; or copy the "
                                "library, header and manifest to a machine of its architecture")
    sysroot = os.environ.get(root_var) or root_default
    return [exe, "-L", sysroot], {"QEMU_LD_PREFIX": sysroot}


def _runner(target: Target) -> Path:
    """The runner for ``target``, compiled once per process into a private temporary folder."""
    from cuvil.codegen.link import compiler

    with _runner_lock:
        found = _runners.get(target.arch)
        if found is not None and found.is_file():
            return found
        folder = Path(tempfile.mkdtemp(prefix=f"cuvil-runner-{target.arch}-"))
        atexit.register(shutil.rmtree, folder, True)
        exe = folder / "cuvil-runner"
        cmd = [compiler(target), "-O2", "-o", str(exe), str(RUNNER_SOURCE), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CodegenError(f"building the {target.arch} runner failed: {proc.stderr.strip()}",
                               location=str(RUNNER_SOURCE), hint="command: " + " ".join(cmd))
        _runners[target.arch] = exe
        return exe


def _tensor_header(a: np.ndarray) -> bytes:
    from cuvil.ir.dtypes import DType

    code = abi.DTYPE_CODES[DType.from_numpy(a.dtype)]
    return struct.pack(f"<ii{a.ndim}qQ", code, a.ndim, *a.shape, a.nbytes)


def write_request(path: Path, prefix: str, arrays: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
    with open(path, "wb") as f:
        name = prefix.encode()
        f.write(_REQUEST + struct.pack("<I", len(name)) + name + struct.pack("<II", len(arrays), len(outputs)))
        for a in arrays:
            f.write(_tensor_header(a))
            f.write(np.ascontiguousarray(a).tobytes())
        for a in outputs:
            f.write(_tensor_header(a))


def read_response(path: Path, outputs: Sequence[np.ndarray]) -> int:
    """Fill ``outputs`` from the runner's response; the library's return code."""
    data = path.read_bytes()
    if data[:8] != _RESPONSE or len(data) < 12:
        raise RuntimeEvalError(f"the runner wrote a malformed response ({len(data)} bytes)", location=str(path))
    (rc,) = struct.unpack_from("<i", data, 8)
    at = 12
    for a in outputs:
        (n,) = struct.unpack_from("<Q", data, at)
        at += 8
        if n:
            if n != a.nbytes or at + n > len(data):
                raise RuntimeEvalError(f"the runner returned {n} bytes for an output of {a.nbytes}", location=str(path))
            a.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8, n, at)
            at += n
    return rc


class EmulatedLibrary(NativeLibrary):
    """A library of another architecture: checked like a native one, each call run by the emulator."""

    def _bind(self, path: Path, m: Mapping[str, Any]) -> None:
        t = m["target"]
        self.target = Target(t["triple"], t["cpu"], t["features"])
        self._run_checked = None  # no in-process entry point
        self._closed = False  # the emulator is looked for at the first call: cross-compiling needs none

    def _call(self, arrays: Sequence[np.ndarray], outputs: list[np.ndarray],
              run_checked: Callable[..., int] | None) -> int:
        if self._closed:
            raise self.closed_error()
        command, env = emulator(self.target.arch)
        runner = _runner(self.target)
        with tempfile.TemporaryDirectory(prefix="cuvil-call-") as tmp:
            request, response = Path(tmp) / "request", Path(tmp) / "response"
            write_request(request, self.manifest["symbol_prefix"], arrays, outputs)
            cmd = [*command, str(runner), str(self.path), str(request), str(response)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=CALL_TIMEOUT_S,
                                      env={**os.environ, **env})
            except subprocess.TimeoutExpired:
                raise RuntimeEvalError(f"{self.path.name}: the emulated call ran past {CALL_TIMEOUT_S:.0f} s",
                                       location=str(self.path)) from None
            if proc.returncode != 0:
                raise RuntimeEvalError(f"{self.path.name}: the {self.target.arch} runner exited with "
                                       f"{proc.returncode}: {proc.stderr.strip()[-2000:]}",
                                       location=str(self.path), hint="command: " + " ".join(cmd))
            return read_response(response, outputs)

    def close(self) -> None:
        self._closed = True
