"""Running a CUDA module compiled by Cuvil (``--target cuda``) through the CUDA driver API.

The PTX is loaded with ``cuModuleLoadData`` on device 0 (its primary context), the constants are
uploaded once, and the arena, the error word and the input and output buffers are allocated once
per library. A call copies the inputs to the device, launches the kernels of the manifest's launch
plan in order on one stream, copies the outputs back and reads the error word (an index out of
range sets it, as the native library returns ``CUVIL_ERR_INDEX``). With ``graph=True`` the launches
are captured once into a CUDA graph, so a call is one graph launch. Needs ``cuda-bindings`` and an
NVIDIA driver; without them loading fails with a CodegenError that says so.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.manifest import file_sha256
from cuvil.errors import CodegenError, RuntimeEvalError
from cuvil.runtime.loader import NativeLibrary


def _driver() -> Any:
    try:  # an optional package (not needed to compile): imported by name
        driver = importlib.import_module("cuda.bindings.driver")
    except ImportError:
        raise CodegenError("running a CUDA module needs the cuda-bindings package", location="target",
                           hint="pip install cuda-bindings (and an NVIDIA driver), or run the PTX elsewhere") from None
    return driver


class CudaLibrary(NativeLibrary):
    """A CUDA module: checked like a native library, run on GPU 0."""

    graph = False  # capture the launches once into a CUDA graph: ``cuvil.runtime.load(path, cuda_graph=True)``

    def _bind(self, path: Path, m: Mapping[str, Any]) -> None:
        """Check the constants file; the driver is opened at the first call (compiling needs no GPU)."""
        self._run_checked = None
        self._consts_path = path.with_name(m["cuda"]["constants"])
        if file_sha256(self._consts_path) != m["cuda"]["constants_sha256"]:
            raise CodegenError(f"{self._consts_path.name} does not match the hash in the manifest",
                               location=str(self._consts_path), hint="recompile the model")
        self._loaded = False
        self._ctx = 1  # open

    def _load(self) -> None:
        """Open GPU 0, load the PTX, upload the constants and allocate every buffer once."""
        self._cu = _driver()
        try:
            self._call_cu("cuInit", 0)
        except RuntimeEvalError as e:
            raise CodegenError(f"no usable NVIDIA GPU: {e.message}", location="target",
                               hint="run the module on a machine with an NVIDIA GPU and driver") from None
        except Exception as e:  # cuda-bindings raises its own errors when libcuda is missing
            raise CodegenError(f"no NVIDIA driver: {e}", location="target",
                               hint="run the module on a machine with an NVIDIA GPU and driver") from None
        plan = self.manifest["cuda"]
        self._device = self._call_cu("cuDeviceGet", 0)
        self._ctx_handle = self._call_cu("cuDevicePrimaryCtxRetain", self._device)
        self._call_cu("cuCtxSetCurrent", self._ctx_handle)
        image = np.frombuffer(self.path.read_bytes() + b"\0", np.uint8)  # kept alive across the call
        self._module = self._call_cu("cuModuleLoadData", image.ctypes.data)
        self._functions = {k["kernel"]: self._call_cu("cuModuleGetFunction", self._module, k["kernel"].encode())
                           for k in plan["launches"]}
        self._stream = self._call_cu("cuStreamCreate", 0)
        from safetensors.numpy import load_file

        self._const = {h: self._upload(a) for h, a in load_file(str(self._consts_path)).items() if h != "none"}
        self._arena = self._alloc(max(int(self.manifest["arena_bytes"]), 1))
        self._err = self._alloc(4)
        self._in = [self._alloc(max(s.nbytes, 1)) for s in self.inputs]
        self._out = [self._alloc(max(s.nbytes, 1)) for s in self.outputs]
        self._graph_exec: Any = None
        self._loaded = True

    # -- driver calls --------------------------------------------------------------------
    def _call_cu(self, name: str, *args: Any) -> Any:
        result = getattr(self._cu, name)(*args)
        err, rest = result[0], result[1:]
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise RuntimeEvalError(f"{name} failed: {err.name if hasattr(err, 'name') else err}",
                                   location=str(self.path))
        return rest[0] if len(rest) == 1 else rest

    def _alloc(self, n: int) -> Any:
        return self._call_cu("cuMemAlloc", n)

    def _upload(self, a: np.ndarray) -> Any:
        a = np.ascontiguousarray(a)
        ptr = self._alloc(max(a.nbytes, 1))
        if a.nbytes:
            self._call_cu("cuMemcpyHtoD", ptr, a.ctypes.data, a.nbytes)
        return ptr

    def _buffer(self, where: Sequence[Any]) -> int:
        kind, index = where
        base = {"input": lambda: self._in[index], "output": lambda: self._out[index],
                "const": lambda: self._const[index], "arena": lambda: self._arena}[kind]()
        return int(base) + (int(index) if kind == "arena" else 0)

    def _launch_all(self) -> None:
        for launch in self.manifest["cuda"]["launches"]:
            ptrs = [self._buffer(b) for b in launch["buffers"]] + [int(self._err)]
            params = (tuple(ptrs), tuple(ctypes.c_void_p for _ in ptrs))
            self._call_cu("cuLaunchKernel", self._functions[launch["kernel"]], launch["grid"], 1, 1,
                          launch["block"], 1, 1, 0, self._stream, params, 0)
        for (kind, index), r in self.manifest["cuda"]["copies"]:  # outputs that are an input or a constant
            nbytes = self.outputs[r].nbytes
            if nbytes:
                self._call_cu("cuMemcpyDtoDAsync", self._out[r], self._buffer((kind, index)), nbytes, self._stream)

    def _call(self, arrays: Sequence[np.ndarray], outputs: list[np.ndarray],
              run_checked: Callable[..., int] | None) -> int:
        with self._lock:
            if not self._ctx:
                raise self.closed_error()
            if not self._loaded:
                self._load()
            self._call_cu("cuCtxSetCurrent", self._ctx_handle)
            for a, ptr in zip(arrays, self._in, strict=True):
                a = np.ascontiguousarray(a)
                if a.nbytes:
                    self._call_cu("cuMemcpyHtoDAsync", ptr, a.ctypes.data, a.nbytes, self._stream)
            self._call_cu("cuMemsetD32Async", self._err, 0, 1, self._stream)
            if self.graph:
                if self._graph_exec is None:
                    cu = self._cu
                    self._call_cu("cuStreamBeginCapture", self._stream,
                                  cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    self._launch_all()
                    graph = self._call_cu("cuStreamEndCapture", self._stream)
                    self._graph_exec = self._call_cu("cuGraphInstantiate", graph, 0)
                self._call_cu("cuGraphLaunch", self._graph_exec, self._stream)
            else:
                self._launch_all()
            for a, ptr in zip(outputs, self._out, strict=True):
                if a.nbytes:
                    self._call_cu("cuMemcpyDtoHAsync", a.ctypes.data, ptr, a.nbytes, self._stream)
            err = np.zeros(1, np.int32)
            self._call_cu("cuMemcpyDtoHAsync", err.ctypes.data, self._err, 4, self._stream)
            self._call_cu("cuStreamSynchronize", self._stream)
        return abi.ERR_INDEX if err[0] else abi.OK

    def close(self) -> None:
        with self._lock:
            if self._ctx and self._loaded:
                self._call_cu("cuModuleUnload", self._module)
                self._call_cu("cuDevicePrimaryCtxRelease", self._device)
            self._ctx = None

