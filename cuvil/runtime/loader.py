"""Loading a compiled library back into Python: a callable with the model's signature.

Inputs are checked against the manifest (count, dtype, shape) before anything is
passed to native code, and the library's own checked entry point checks them again.
Output buffers are allocated here, by the caller, as the ABI requires.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.artifact import MANIFEST_FORMAT, file_sha256
from cuvil.errors import CodegenError, CuvilError, InputError, RuntimeEvalError
from cuvil.interp import to_numpy
from cuvil.ir.dtypes import DType


class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("rank", ctypes.c_int32), ("dtype", ctypes.c_int32)]


class _Spec:
    __slots__ = ("dtype", "name", "shape")

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.name = str(entry["name"])
        self.dtype = DType(entry["dtype"])
        self.shape = tuple(int(d) for d in entry["shape"])

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def read_manifest(library_path: Path) -> dict[str, Any]:
    candidates = sorted(library_path.parent.glob("*.json"))
    for c in candidates:
        try:
            m = json.loads(c.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("format") == MANIFEST_FORMAT and m.get("library") == library_path.name:
            return m
    raise CodegenError(f"no manifest for {library_path.name} next to it", location=str(library_path),
                       hint="a compiled library is loaded together with the .json manifest written beside it")


class CompiledModel:
    """A compiled function: call it with numpy arrays (or torch tensors), get numpy arrays back.

    ``model(x, y)`` returns one array when the function has one result and a tuple otherwise;
    ``model.run(inputs)`` always returns a list (like ``cuvil.run_reference``).
    """

    def __init__(self, library_path: str | Path, manifest: Mapping[str, Any] | None = None, *,
                 verify_hash: bool = True) -> None:
        path = Path(library_path).resolve()
        if not path.is_file():
            raise CodegenError(f"compiled library {path} does not exist", location=str(path))
        m = dict(manifest) if manifest is not None else read_manifest(path)
        if m.get("format") != MANIFEST_FORMAT or m.get("abi_version") != abi.ABI_VERSION:
            raise CodegenError(f"{path.name}: manifest format {m.get('format')!r} / ABI {m.get('abi_version')!r} "
                               f"is not {MANIFEST_FORMAT!r} / {abi.ABI_VERSION}", location=str(path),
                               hint="recompile the model with this version of cuvil")
        if verify_hash and m.get("library_sha256") != file_sha256(path):
            raise CodegenError(f"{path.name} does not match the hash in its manifest", location=str(path),
                               hint="the library was modified or replaced after it was compiled; recompile it")
        self._path = path
        self._manifest = m
        self.inputs = tuple(_Spec(e) for e in m["inputs"])
        self.outputs = tuple(_Spec(e) for e in m["outputs"])
        self._lib = ctypes.CDLL(str(path))
        sym = m["symbols"]
        self._create = getattr(self._lib, sym["create"])
        self._create.restype = ctypes.c_void_p
        self._create.argtypes = []
        self._destroy = getattr(self._lib, sym["destroy"])
        self._destroy.restype = None
        self._destroy.argtypes = [ctypes.c_void_p]
        self._run_checked = getattr(self._lib, sym["run_checked"])
        self._run_checked.restype = ctypes.c_int32
        self._run_checked.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.c_int64,
                                      ctypes.POINTER(CTensor), ctypes.c_int64]
        self._lock = threading.Lock()
        self._ctx = self._create()
        if not self._ctx:
            raise CuvilError(f"{path.name}: could not allocate {m.get('arena_bytes')} bytes of working memory")

    # -- properties -----------------------------------------------------------------------
    @property
    def library_path(self) -> Path:
        return self._path

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"<CompiledModel {self._manifest['function']}({ins}) -> ({outs}) at {self._path}>"

    # -- calling --------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        if args and kwargs:
            raise InputError("pass inputs either by position or by name, not both",
                             hint="inputs: " + ", ".join(map(str, self.inputs)))
        outs = self.run(kwargs if kwargs else list(args))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _arrays(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
        sig = ", ".join(map(str, self.inputs))
        if isinstance(inputs, Mapping):
            names = [s.name for s in self.inputs]
            missing = [n for n in names if n not in inputs]
            extra = sorted(set(inputs) - set(names))
            if missing or extra:
                raise InputError(f"inputs do not match: missing {missing}, unexpected {extra}", hint="inputs: " + sig)
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
            if len(values) != len(self.inputs):
                raise InputError(f"{self._manifest['function']} takes {len(self.inputs)} inputs, got {len(values)}",
                                 hint="inputs: " + sig)
        arrays = []
        for spec, v in zip(self.inputs, values, strict=True):
            a = to_numpy(v)
            if a.dtype != spec.dtype.np:
                raise InputError(f"input {spec.name!r} has dtype {a.dtype}, expected {spec.dtype}",
                                 location=spec.name, hint=f"convert with .astype({spec.dtype.np.name!r})")
            if tuple(a.shape) != spec.shape:
                raise InputError(f"input {spec.name!r} has shape {tuple(a.shape)}, expected {list(spec.shape)}",
                                 location=spec.name,
                                 hint="this library was compiled for static shapes; recompile for other shapes")
            arrays.append(a if a.flags.c_contiguous else np.array(a, order="C"))
        return arrays

    def run(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
        arrays = self._arrays(inputs)
        outputs = [np.empty(s.shape, dtype=s.dtype.np) for s in self.outputs]
        keep: list[Any] = []

        def descriptors(arrs: list[np.ndarray]) -> ctypes.Array[CTensor]:
            table = (CTensor * max(len(arrs), 1))()
            for k, a in enumerate(arrs):
                shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
                keep.append(shape)
                table[k] = CTensor(a.ctypes.data, ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), a.ndim,
                                   abi.DTYPE_CODES[DType.from_numpy(a.dtype)])
            return table

        tin, tout = descriptors(arrays), descriptors(outputs)
        with self._lock:
            if not self._ctx:
                raise CuvilError(f"{self._path.name} was closed")
            rc = self._run_checked(self._ctx, tin, len(arrays), tout, len(outputs))
        if rc != abi.OK:
            text = abi.ERROR_TEXT.get(rc, f"unknown error code {rc}")
            if rc == abi.ERR_INDEX:
                raise RuntimeEvalError(f"{self._manifest['function']}: {text}", location=str(self._path.name),
                                       hint="check the index inputs (gather, embedding, ...)")
            raise InputError(f"{self._manifest['function']} rejected its inputs: {text} (code {rc})",
                             location=str(self._path.name))
        return outputs

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._ctx:
                self._destroy(self._ctx)
                self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def load(library_path: str | Path, *, verify_hash: bool = True) -> CompiledModel:
    """Load a compiled library with the manifest beside it."""
    return CompiledModel(library_path, verify_hash=verify_hash)
