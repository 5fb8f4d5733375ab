"""Loading compiled libraries back into Python: a callable with the model's signature.

Inputs are checked against the signature (count, dtype, shape, dim constraints) before
anything is passed to native code, and the library's own checked entry point checks them
again. Output buffers are allocated here, by the caller, as the ABI requires.

A :class:`CompiledModel` holds one library (static shapes, or one compiled for a whole shape
class, which takes the dims at run time) or, for a function with symbolic dims compiled per
specialization, one library per shape signature it has been called with: the first call with a
new signature compiles (or loads from the cache) that specialization.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np

from cuvil.arrays import as_array, is_torch_tensor, to_torch
from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.manifest import (
    MANIFEST_FORMAT,
    IntegrityError,
    ManifestError,
    check_manifest,
    entry_symbols,
    manifest_problems,
    profile_symbol,
)
from cuvil.codegen.shape_class import ShapeClass
from cuvil.errors import BudgetError, CodegenError, ConstraintError, InputError, RuntimeEvalError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import DimConstraint, bind_symbols
from cuvil.runtime.guard import GuardFault, guard_fault
from cuvil.runtime.profile import Profile, profile_steps, read_profile

_addressof = ctypes.addressof
_from_buffer = cast(Callable[[Any], Any], ctypes.c_char.from_buffer)


def _address(a: np.ndarray) -> int:
    """The data pointer of a C-contiguous array: through the buffer protocol (a third of the time of
    ``a.ctypes.data``), or numpy's own view of it for read-only and empty arrays."""
    try:
        return _addressof(_from_buffer(a))  # an ndarray exports its buffer
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("rank", ctypes.c_int32), ("dtype", ctypes.c_int32)]


@dataclass(frozen=True)
class Signature:
    """What a caller must pass: parameter and result specs, and the constraints on symbolic dims."""

    function: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    constraints: tuple[DimConstraint, ...] = ()

    @classmethod
    def of(cls, fn: Function) -> Signature:
        return cls(fn.name, tuple(TensorSpec(p.name, p.dtype, p.type.shape) for p in fn.params),
                   tuple(TensorSpec(n, r.dtype, r.type.shape) for n, r in zip(fn.result_names, fn.results,
                                                                               strict=True)),
                   fn.constraints)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for s in (*self.inputs, *self.outputs) for d in s.shape)

    def constraint(self, symbol: str) -> DimConstraint:
        for c in self.constraints:
            if c.symbol == symbol:
                return c
        return DimConstraint(symbol)

    def bind(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
        """The value of every symbolic dim for these input shapes (checked against the constraints)."""
        try:
            env = bind_symbols([s.type for s in self.inputs], [tuple(s) for s in shapes])
        except ValueError as e:
            raise InputError(f"input shapes do not match @{self.function}: {e}",
                             hint="inputs: " + ", ".join(map(str, self.inputs))) from None
        for symbol, value in env.items():
            c = self.constraint(symbol)
            if not c.admits(value):
                raise ConstraintError(f"dim {symbol}={value} violates the constraint {c}",
                                      location=f"@{self.function}",
                                      hint="inputs: " + ", ".join(map(str, self.inputs)))
        return env

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs],
                "constraints": [{"symbol": c.symbol, "lo": c.lo, "hi": c.hi, "multiple_of": c.multiple_of}
                                for c in self.constraints]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Signature:
        return cls(str(data["function"]), tuple(TensorSpec.from_json(e) for e in data["inputs"]),
                   tuple(TensorSpec.from_json(e) for e in data["outputs"]),
                   tuple(DimConstraint(str(c["symbol"]), int(c["lo"]), None if c["hi"] is None else int(c["hi"]),
                                       int(c["multiple_of"])) for c in data["constraints"]))


def read_manifest(library_path: Path) -> dict[str, Any]:
    """The manifest beside a library: the ``.json`` file in its folder whose ``library`` names it
    (checked for the shape this version writes)."""
    for c in sorted(library_path.parent.glob("*.json")):
        try:
            m = json.loads(c.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("format") == MANIFEST_FORMAT and m.get("library") == library_path.name:
            return check_manifest(m, library_path)
    raise CodegenError(f"no manifest for {library_path.name} next to it", location=str(library_path),
                       hint="a compiled library is loaded together with the .json manifest written beside it")


def _dlopen(path: Path) -> ctypes.CDLL:
    """The one place a library is mapped into the process (after its hash was checked)."""
    return ctypes.CDLL(str(path))


class NativeLibrary:
    """One loaded library (static shapes, or a whole shape class) with its working context."""

    def __init__(self, library_path: str | Path, manifest: Mapping[str, Any] | None = None, *,
                 verify_hash: bool = True) -> None:
        path = Path(library_path).resolve()
        if not path.is_file():
            raise CodegenError(f"compiled library {path} does not exist", location=str(path))
        m = check_manifest(dict(manifest) if manifest is not None else read_manifest(path), path)
        if verify_hash:
            problems = manifest_problems(path, m)
            if problems:
                raise IntegrityError("; ".join(problems), location=str(path))
        self.path = path
        self.manifest = m
        self.inputs = tuple(TensorSpec.from_json(e) for e in m["inputs"])
        self.outputs = tuple(TensorSpec.from_json(e) for e in m["outputs"])
        self.shape_class = ShapeClass.from_json(m["shape_class"]) if "shape_class" in m else None
        self.signature = Signature(m["function"], self.inputs, self.outputs,
                                   self.shape_class.constraints if self.shape_class is not None else ())
        self.info: dict[str, Any] = {}  # how it was obtained (cache hit/miss, timings), set by the compiler
        self._lock = threading.Lock()
        self._expect = tuple((spec.name, np.dtype(spec.dtype.np), tuple(spec.shape)) for spec in self.inputs)
        self._made = tuple((tuple(spec.shape), spec.dtype.np) for spec in self.outputs)
        self._bind(path, m)

    def _bind(self, path: Path, m: Mapping[str, Any]) -> None:
        """Map the library into this process and make its working context."""
        self._lib = _dlopen(path)
        sym = entry_symbols(m["symbol_prefix"], self.shape_class is not None)  # never names from the manifest
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
        self._tables = (self._table(self.inputs), self._table(self.outputs))
        (tin, _), (tout, _) = self._tables
        # the per-call path: each descriptor's view kept (indexing a ctypes array makes a new one), the
        # entry point called with the tables' addresses as plain pointers (ctypes converts them fastest)
        self._views = [*(tin[k] for k in range(len(self.inputs))), *(tout[k] for k in range(len(self.outputs)))]
        entry = ctypes.cast(self._run_checked, ctypes.c_void_p).value
        if not entry:
            raise ManifestError(f"{path.name}: its entry point resolved to NULL", location=str(path),
                                hint="recompile the model: the library is damaged")
        raw = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64)(entry)
        self._raw_run = (raw, ctypes.addressof(tin), len(self.inputs), ctypes.addressof(tout), len(self.outputs))
        self._ctx = self._create()
        if not self._ctx:
            raise BudgetError(f"{path.name}: could not allocate {m.get('arena_bytes')} bytes of working memory",
                              location=str(path), hint="free memory, or compile the model for smaller shapes")

    @staticmethod
    def _table(specs: Sequence[TensorSpec]) -> tuple[ctypes.Array[CTensor], list[Any]]:
        """The descriptors of tensors of these specs, built once: a call only sets the data pointers
        (and, in a shape class, the dims; the shapes they point to stay alive with the table)."""
        table = (CTensor * max(len(specs), 1))()
        shapes = []
        for k, spec in enumerate(specs):
            dims = tuple(d if isinstance(d, int) else 0 for d in spec.shape)
            shape = (ctypes.c_int64 * max(len(dims), 1))(*dims)
            shapes.append(shape)
            table[k] = CTensor(None, ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), len(dims),
                               abi.DTYPE_CODES[spec.dtype])
        return table, shapes

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self._expect):
            raise InputError(f"{self.manifest['function']} takes {len(self._expect)} inputs, got {len(arrays)}",
                             hint="inputs: " + ", ".join(map(str, self.inputs)))
        for (name, dtype, shape), a in zip(self._expect, arrays):  # noqa: B905 (counted above)
            if a.dtype is not dtype and a.dtype != dtype:  # numpy's built-in dtypes are one object each
                raise InputError(f"input {name!r} has dtype {a.dtype}, expected {DType.from_numpy(dtype)}",
                                 location=name, hint=f"convert with .astype({dtype.name!r})")
            if self.shape_class is None and a.shape != shape:
                raise InputError(f"input {name!r} has shape {tuple(a.shape)}, expected {list(shape)}",
                                 location=name,
                                 hint="this library was compiled for static shapes; recompile for other shapes")
        if self.shape_class is not None:
            self.dims(arrays)

    def dims(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """The values of the shape class's dims for these inputs (checked against the class)."""
        assert self.shape_class is not None
        env = self.signature.bind([a.shape for a in arrays])
        why = self.shape_class.admits(env)
        if why is not None:
            sc = self.shape_class
            raise ConstraintError(why, location=f"@{self.manifest['function']}",
                                  hint="the library was compiled for " + ", ".join(
                                      f"{s} in [{sc.bound(s)[0]}, {sc.bound(s)[1]}]" for s in sc.symbols)
                                  + "; recompile with a larger --dim-max for larger inputs")
        return env

    def run(self, arrays: Sequence[np.ndarray], run_checked: Callable[..., int] | None = None) -> list[np.ndarray]:
        """Run on C-contiguous arrays already checked by :meth:`check`; returns fresh output arrays. The
        descriptor tables are the library's own, filled and used under its lock."""
        if self.shape_class is None:
            made = self._made
        else:
            env = self.dims(arrays)
            made = tuple((tuple(evaluate_dim(d, env) for d in shape), dtype) for shape, dtype in self._made)
        outputs = [np.empty(shape, dtype=dtype) for shape, dtype in made]
        rc = self._call(arrays, outputs, run_checked)
        if rc != abi.OK:
            self._fail(rc, arrays, outputs)
        return outputs

    def fast_run(self, args: Sequence[Any]) -> list[np.ndarray] | None:
        """:meth:`check` and :meth:`run` in one for the common call of a static library: writable, C-contiguous
        numpy arrays of exactly its inputs' dtypes and shapes (checked here as :meth:`check` does); None for
        any other call, which the checked path then runs or explains. About 1.2 µs less a call (of 4.5)."""
        if self.shape_class is not None or len(args) != len(self._expect):
            return None
        for (_, dtype, shape), a in zip(self._expect, args):  # noqa: B905 (counted above)
            if type(a) is not np.ndarray or a.dtype is not dtype or a.shape != shape:
                return None
            flags = a.flags  # a read-only array: the checked path takes its address another way
            if not (flags.c_contiguous and flags.writeable):
                return None
        if not self._ctx:  # closed: the checked path explains
            return None
        outputs = [np.empty(shape, dtype=dtype) for shape, dtype in self._made]
        rc = self._call(args, outputs, None)
        if rc != abi.OK:
            self._fail(rc, args, outputs)
        return outputs

    def _fail(self, rc: int, arrays: Sequence[np.ndarray], outputs: list[np.ndarray]) -> NoReturn:
        """Raise what the entry point's return code ``rc`` (not OK) means."""
        if rc in abi.GUARD_CODES:
            raise guard_fault(self.manifest, rc, arrays, outputs, self.path.name)
        function = self.manifest["function"]
        text = abi.ERROR_TEXT.get(rc, f"unknown error code {rc}")
        if rc == abi.ERR_INDEX:
            raise RuntimeEvalError(f"{function}: {text}", location=self.path.name,
                                   hint="check the index inputs (gather, embedding, ...)")
        raise InputError(f"{function} rejected its inputs: {text} (code {rc})", location=self.path.name)

    def _call(self, arrays: Sequence[np.ndarray], outputs: list[np.ndarray],
              run_checked: Callable[..., int] | None) -> int:
        """One call of the checked entry point, writing ``outputs``; its return code."""
        (tin, in_shapes), (tout, out_shapes) = self._tables
        buffers = (*arrays, *outputs)  # in the order of the kept descriptor views; counted by check()
        with self._lock:
            if not self._ctx:
                raise self.closed_error()
            try:  # as _address does, without its call for each tensor
                for view, a in zip(self._views, buffers):  # noqa: B905 (a keyword makes zip slower)
                    view.data = _addressof(_from_buffer(a))
            except (TypeError, ValueError, BufferError):
                for view, a in zip(self._views, buffers):  # noqa: B905
                    view.data = _address(a)
            if self.shape_class is not None:
                for tensors, shapes in ((arrays, in_shapes), (outputs, out_shapes)):
                    for a, shape in zip(tensors, shapes, strict=True):
                        for axis, n in enumerate(a.shape):
                            shape[axis] = n
            if run_checked is None or run_checked is self._run_checked:
                raw, tin_at, n_in, tout_at, n_out = self._raw_run
                return raw(self._ctx, tin_at, n_in, tout_at, n_out)
            return run_checked(self._ctx, tin, len(arrays), tout, len(outputs))

    def profile(self, reset: bool = False) -> Profile:
        """The time each step of the runs so far took (a library compiled with ``profile=True``); ``reset``
        zeroes the counters after reading them."""
        steps = profile_steps(self.manifest, self.path.name)
        reader = getattr(self._lib, profile_symbol(self.manifest["symbol_prefix"]), None)
        if reader is None:
            raise ManifestError(f"{self.path.name}: its manifest lists profiled steps but the library does not "
                                "export the profile reader", location=str(self.path),
                                hint="recompile the model: the library and its manifest do not belong together")
        reader.restype = ctypes.c_int64
        reader.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int32]
        with self._lock:
            if not self._ctx:
                raise self.closed_error()
            return read_profile(reader, steps, reset)

    def closed_error(self) -> InputError:
        return InputError(f"{self.path.name} was closed", location=str(self.path),
                          hint="load the library again to run it")

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


def open_library(library_path: str | Path, manifest: Mapping[str, Any] | None = None, *,
                 verify_hash: bool = True) -> NativeLibrary:
    """A library for this machine's architecture, mapped into the process; a wasm32-wasi module, run by
    wasmtime in the process; a CUDA module, run on GPU 0; one built for another architecture
    (``--target aarch64-linux-gnu``) runs call by call under its emulator."""
    from cuvil.codegen.target import host_arch, normalize_arch

    m = dict(manifest) if manifest is not None else read_manifest(Path(library_path).resolve())
    target = m.get("target")
    triple = target.get("triple") if isinstance(target, dict) else None
    arch = normalize_arch(triple.split("-", 1)[0]) if isinstance(triple, str) else host_arch()
    if arch == "wasm32":
        from cuvil.runtime.wasm import WasmLibrary

        return WasmLibrary(library_path, m, verify_hash=verify_hash)
    if arch == "nvptx64":
        from cuvil.runtime.cuda import CudaLibrary

        return CudaLibrary(library_path, m, verify_hash=verify_hash)
    if arch != host_arch():
        from cuvil.runtime.emulated import EmulatedLibrary

        return EmulatedLibrary(library_path, m, verify_hash=verify_hash)
    return NativeLibrary(library_path, m, verify_hash=verify_hash)


# --------------------------------------------------------------------------------------
# the callable

Specializer = Callable[[Mapping[str, int]], NativeLibrary]
IRProvider = Callable[[Mapping[str, int] | None], Module]


class CompiledModel:
    """A compiled function: call it like the original model.

    ``model(x, y)`` takes numpy arrays (numpy out) or torch tensors (torch out, sharing memory
    with the outputs; CPU-contiguous inputs are passed without a copy). It returns one value
    when the function has one result and a tuple otherwise; ``model.run(inputs)`` always
    returns a list. For a function with symbolic dims each new shape signature compiles
    (or loads from the cache) its own specialization once.
    """

    def __init__(self, library_path: str | Path, manifest: Mapping[str, Any] | None = None, *,
                 verify_hash: bool = True, ir: IRProvider | None = None, cuda_graph: bool = False) -> None:
        lib = open_library(library_path, manifest, verify_hash=verify_hash)
        if cuda_graph:
            if not hasattr(lib, "graph"):
                raise InputError("cuda_graph applies to a library compiled for CUDA", location=str(library_path),
                                 hint="compile with target='cuda', or drop cuda_graph")
            lib.graph = True  # type: ignore[attr-defined]
        self._setup(lib.signature, ir)
        self._variants[()] = lib
        self._last = lib
        self._run_checked = lib._run_checked

    @classmethod
    def from_library(cls, lib: NativeLibrary, *, ir: IRProvider | None = None) -> CompiledModel:
        self = cls.__new__(cls)
        self._setup(lib.signature, ir)
        self._variants[()] = lib
        self._last = lib
        self._run_checked = lib._run_checked
        return self

    @classmethod
    def specializing(cls, signature: Signature, specialize: Specializer, *,
                     ir: IRProvider | None = None) -> CompiledModel:
        """A model over symbolic dims that builds a library per shape signature on first use."""
        self = cls.__new__(cls)
        self._setup(signature, ir)
        self._specialize = specialize
        return self

    def _setup(self, signature: Signature, ir: IRProvider | None) -> None:
        self.signature = signature
        self._ir = ir
        self._specialize: Specializer | None = None
        self._variants: dict[tuple[tuple[str, int], ...], NativeLibrary] = {}
        self._last: NativeLibrary | None = None
        self._run_checked: Callable[..., int] | None = None  # the static library's native entry point
        self._lock = threading.Lock()

    # -- properties -----------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.signature.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.signature.outputs

    @property
    def is_dynamic(self) -> bool:
        """Whether the model specializes per shape signature (its function has symbolic dims)."""
        return self._specialize is not None

    @property
    def library_path(self) -> Path | None:
        """The library file (for a dynamic model: that of the most recent call; None before the first)."""
        return self._last.path if self._last is not None else None

    @property
    def manifest(self) -> dict[str, Any] | None:
        """The library's manifest (for a dynamic model: that of the most recent call)."""
        return self._last.manifest if self._last is not None else None

    @property
    def cache_info(self) -> dict[str, Any]:
        """How the most recently used library was obtained: ``{"cache": "hit"|"miss"|"off", ...}``."""
        return dict(self._last.info) if self._last is not None else {}

    @property
    def specializations(self) -> dict[tuple[tuple[str, int], ...], Path]:
        """Loaded libraries by their dim values (one entry, keyed ``()``, for a static model)."""
        return {k: v.path for k, v in self._variants.items()}

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        where = f"{len(self._variants)} specialization(s)" if self.is_dynamic else str(self.library_path)
        return f"<CompiledModel {self.signature.function}({ins}) -> ({outs}) at {where}>"

    # -- calling --------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outs = None if kwargs else self._fast_run(args)
        if outs is not None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        if args and kwargs:
            raise InputError("pass inputs either by position or by name, not both",
                             hint="inputs: " + ", ".join(map(str, self.inputs)))
        outs = self.run(kwargs if kwargs else list(args))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _fast_run(self, args: Sequence[Any]) -> list[np.ndarray] | None:
        """A static library's :meth:`NativeLibrary.fast_run`, or None (a dynamic model, or a call it declines)."""
        return self._last.fast_run(args) if self._run_checked is not None and self._last is not None else None

    def run_guarded(self, *args: Any, **kwargs: Any) -> tuple[Any, GuardFault | None]:
        """``(outputs, None)`` as a call returns them, or ``(None, fault)`` when a library compiled with a
        fail-safe policy refused the values: a control loop switches to ``fault.mode`` without a ``try``.
        Every other error (inputs that do not match the signature) still raises."""
        try:
            return self(*args, **kwargs), None
        except GuardFault as fault:
            return None, fault

    def _values(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        if not isinstance(inputs, (list, tuple)) and isinstance(inputs, Mapping):
            names = [s.name for s in self.inputs]
            missing = [n for n in names if n not in inputs]
            extra = sorted(set(inputs) - set(names))
            if missing or extra:
                raise InputError(f"inputs do not match: missing {missing}, unexpected {extra}",
                                 hint="inputs: " + ", ".join(map(str, self.inputs)))
            return [inputs[n] for n in names]
        values = list(inputs)
        if len(values) != len(self.inputs):
            raise InputError(f"{self.signature.function} takes {len(self.inputs)} inputs, got {len(values)}",
                             hint="inputs: " + ", ".join(map(str, self.inputs)))
        return values

    def library_for(self, arrays: Sequence[np.ndarray]) -> NativeLibrary:
        """The library that runs these inputs, specializing for their shapes if needed."""
        if self._specialize is None:
            return self._variants[()]
        for spec, a in zip(self.inputs, arrays, strict=True):
            if a.dtype != spec.dtype.np:
                raise InputError(f"input {spec.name!r} has dtype {a.dtype}, expected {spec.dtype}",
                                 location=spec.name, hint=f"convert with .astype({spec.dtype.np.name!r})")
        return self._variant(self.signature.bind([a.shape for a in arrays]))

    def specialize(self, dims: Mapping[str, int]) -> Path:
        """Compile (or load from the cache) the specialization at ``dims`` ahead of its first call."""
        if self._specialize is None:
            raise InputError(f"@{self.signature.function} has static shapes; there is nothing to specialize",
                             location=f"@{self.signature.function}")
        symbols = self._symbols()
        missing = [s for s in symbols if s not in dims]
        extra = sorted(set(dims) - set(symbols))
        if missing or extra:
            raise InputError(f"dims do not match @{self.signature.function}: missing {missing}, unexpected {extra}",
                             hint="symbolic dims: " + ", ".join(symbols))
        for symbol, value in dims.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"dim {symbol}={value!r} is not an integer", location=f"@{self.signature.function}",
                                 hint="give every symbolic dim a whole number, e.g. specialize({'N': 8})")
            c = self.signature.constraint(symbol)
            if not c.admits(int(value)):
                raise ConstraintError(f"dim {symbol}={value} violates the constraint {c}",
                                      location=f"@{self.signature.function}")
        lib = self._variant({k: int(v) for k, v in dims.items()})
        self._last = lib
        return lib.path

    def _symbols(self) -> list[str]:
        out: set[str] = set()
        for spec in self.inputs:
            out |= spec.type.symbols()
        return sorted(out)

    def _variant(self, env: Mapping[str, int]) -> NativeLibrary:
        assert self._specialize is not None
        key = tuple(sorted(env.items()))
        found = self._variants.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._variants.get(key)
            if found is None:
                found = self._specialize(env)
                self._variants[key] = found
        return found

    def run(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        outs = self._fast_run(inputs) if isinstance(inputs, (list, tuple)) else None
        if outs is not None:
            return outs
        values = self._values(inputs)
        torch_out = False
        arrays = []
        for v, spec in zip(values, self.inputs, strict=True):
            if type(v) is np.ndarray and v.flags.c_contiguous:  # the common case, checked first
                arrays.append(v)
                continue
            torch_out = torch_out or is_torch_tensor(v)
            arrays.append(as_array(v, spec.name))
        lib = self.library_for(arrays)
        lib.check(arrays)
        self._last = lib
        outs = lib.run(arrays, None if self.is_dynamic else self._run_checked)
        return [to_torch(o) for o in outs] if torch_out else outs

    def profile(self, reset: bool = False) -> Profile:
        """Where the runs so far spent their time, per op (a model compiled with ``profile=True``; for a
        dynamic model, the most recently run specialization's)."""
        lib = self._last if self._last is not None else next(iter(self._variants.values()), None)
        if lib is None:
            raise InputError(f"@{self.signature.function} has not been specialized for any shape yet",
                             location=f"@{self.signature.function}", hint="run it once before reading its profile")
        return lib.profile(reset)

    # -- the optimized IR -----------------------------------------------------------------
    def export_ir(self, path: str | Path, dims: Mapping[str, int] | None = None) -> Path:
        """Write the optimized CIR this model was compiled from (for a dynamic model: of the
        specialization at ``dims``, default the most recent one; the symbolic module before any)."""
        from cuvil.ir.printer import export_ir

        if self._ir is None:
            raise InputError("this model was loaded from a library file; its IR is not available",
                             location=str(self.library_path),
                             hint="compile the model with cuvil.compile(...) to export its optimized IR")
        if dims is None and self._last is not None:
            dims = self._last.manifest.get("specialized_dims") or None
        return export_ir(self._ir(dims), path)

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        for lib in list(self._variants.values()):
            lib.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def load(library_path: str | Path, *, verify_hash: bool = True, cuda_graph: bool = False) -> CompiledModel:
    """Load a compiled library with the manifest beside it (``cuda_graph``: a CUDA module's launches are
    captured into one CUDA graph at the first call, so each call is one graph launch)."""
    return CompiledModel(library_path, verify_hash=verify_hash, cuda_graph=cuda_graph)
