"""Running a wasm32-wasi module compiled by Cuvil, in this process, through wasmtime.

The module is a WASI reactor with the library's entry points, ``malloc`` and ``free``: a call copies
the inputs and the tensor descriptors (32-bit pointers: 16 bytes each) into the module's linear
memory, calls the checked entry point and copies the outputs back. The module gets WASI with no
files, no environment and no arguments: it can compute and allocate, nothing else.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.errors import BudgetError, CodegenError, RuntimeEvalError
from cuvil.runtime.loader import NativeLibrary

_DESCRIPTOR = struct.Struct("<IIii")  # data, shape, rank, dtype
_ALIGN = 64


def _wasmtime() -> Any:
    try:
        import wasmtime
    except ImportError:
        raise CodegenError("running a wasm32-wasi module needs the wasmtime package", location="target",
                           hint="pip install wasmtime (or run the .wasm in another WASI runtime or a browser)"
                           ) from None
    return wasmtime


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class WasmLibrary(NativeLibrary):
    """A wasm32-wasi library: checked like a native one, run by wasmtime in this process."""

    def _bind(self, path: Path, m: Mapping[str, Any]) -> None:
        wt = _wasmtime()
        self._wt = wt
        engine = wt.Engine()
        self._store = wt.Store(engine)
        self._store.set_wasi(wt.WasiConfig())
        linker = wt.Linker(engine)
        linker.define_wasi()
        try:
            instance = linker.instantiate(self._store, wt.Module.from_file(engine, str(path)))
        except Exception as e:  # a malformed module or a missing import: not one of Cuvil's
            raise CodegenError(f"{path.name} could not be instantiated: {e}", location=str(path),
                               hint="recompile it with --target wasm32-wasi") from None
        ex = instance.exports(self._store)
        init = ex.get("_initialize")
        if init is not None:
            init(self._store)
        sym = m["symbols"]
        self._memory = ex["memory"]
        self._malloc, self._free = ex["malloc"], ex["free"]
        self._create, self._destroy = ex[sym["create"]], ex[sym["destroy"]]
        self._wasm_run = ex[sym["run_checked"]]
        self._run_checked = None  # no native entry point
        self._ctx = self._create(self._store)
        if not self._ctx:
            raise BudgetError(f"{path.name}: could not allocate {m.get('arena_bytes')} bytes of working memory "
                              "in the module's linear memory", location=str(path),
                              hint="wasm32 addresses at most 4 GiB; compile the model for smaller shapes")

    def _call(self, arrays: Sequence[np.ndarray], outputs: list[np.ndarray],
              run_checked: Callable[..., int] | None) -> int:
        tensors = [*arrays, *outputs]
        sizes = [_aligned(_DESCRIPTOR.size * len(tensors) + 8 * sum(a.ndim for a in tensors) + 1)]
        sizes += [_aligned(max(a.nbytes, 1)) for a in tensors]
        with self._lock:
            if not self._ctx:
                raise self.closed_error()
            store = self._store
            base = self._malloc(store, sum(sizes) + _ALIGN)
            if not base:
                raise BudgetError(f"{self.path.name}: the module's memory cannot hold this call's tensors",
                                  location=str(self.path), hint="wasm32 addresses at most 4 GiB")
            try:
                return self._run_in(base, sizes, arrays, outputs)
            finally:
                self._free(store, base)

    def _run_in(self, base: int, sizes: list[int], arrays: Sequence[np.ndarray], outputs: list[np.ndarray]) -> int:
        """Lay out descriptors, shapes and data from ``base`` (aligned), run, copy the outputs back."""
        from cuvil.ir.dtypes import DType

        store = self._store
        start = _aligned(base)
        tensors = [*arrays, *outputs]
        data_at = [start + sum(sizes[: k + 1]) for k in range(len(tensors))]
        table = bytearray()
        shapes = bytearray()
        shapes_at = start + _DESCRIPTOR.size * len(tensors)
        for a, at in zip(tensors, data_at, strict=True):
            table += _DESCRIPTOR.pack(at, shapes_at + len(shapes), a.ndim, abi.DTYPE_CODES[DType.from_numpy(a.dtype)])
            shapes += struct.pack(f"<{a.ndim}q", *a.shape)
        memory = ctypes.c_void_p.from_buffer(self._memory.data_ptr(store)).value
        if memory is None:
            raise RuntimeEvalError("the module has no memory", location=str(self.path))
        ctypes.memmove(memory + start, bytes(table + shapes), len(table) + len(shapes))
        for a, at in zip(arrays, data_at, strict=False):
            ctypes.memmove(memory + at, np.ascontiguousarray(a).ctypes.data, a.nbytes)
        try:
            rc = self._wasm_run(store, self._ctx, start, len(arrays), start + _DESCRIPTOR.size * len(arrays),
                                len(outputs))
        except self._wt.Trap as e:
            raise RuntimeEvalError(f"{self.path.name} trapped: {str(e).splitlines()[0]}", location=str(self.path),
                                   hint="this is a bug in the code generator") from None
        memory = ctypes.c_void_p.from_buffer(self._memory.data_ptr(store)).value  # it may have grown
        assert memory is not None
        if rc == abi.OK:
            for a, at in zip(outputs, data_at[len(arrays):], strict=True):
                ctypes.memmove(a.ctypes.data, memory + at, a.nbytes)
        return int(rc)

    def close(self) -> None:
        with self._lock:
            if self._ctx:
                self._destroy(self._store, self._ctx)
                self._ctx = None
