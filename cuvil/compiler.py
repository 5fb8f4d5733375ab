"""``compile``: a model in, a native callable out.

Native code is compiled for static shapes. A function with symbolic dims is *specialized*:
the dims are solved from input shapes, checked against the function's constraints and
substituted into every type and attribute, and every op's shape rule is re-run at those
shapes. By default (no ``output_dir``) the returned model specializes on first sight of
each shape signature and keeps every specialization, in memory and in the artifact cache;
with ``output_dir`` (one artifact on disk) the dims come from ``example_inputs`` or
``input_shapes``.

Compiles are cached (see :mod:`cuvil.runtime.cache`) under a key made of the model's
structural hash, the options, the specialized dims, the toolchain and the CPU. For a model
given as a file, a digest of the file maps to the model hash, so a cache hit skips even the
import.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.artifact import Artifact, build_library
from cuvil.codegen.link import HostTarget, host_target
from cuvil.errors import CodegenError, InputError
from cuvil.frontend.dispatch import import_model
from cuvil.interp import to_numpy
from cuvil.ir import hashing
from cuvil.ir.module import Function, Module
from cuvil.ir.specialize import Shapes, requested_shapes, specialize_dims
from cuvil.log import stage
from cuvil.passes import parse_pipeline, run_pipeline
from cuvil.runtime.cache import ArtifactCache, key_of
from cuvil.runtime.loader import CompiledModel, NativeLibrary, Signature

logger = logging.getLogger("cuvil")

BACKENDS = ("llvm",)
HOST_TARGET_NAMES = ("host", "native")
X86_64_NAMES = ("x86-64", "x86_64", "amd64")
CACHE_KEY_FORMAT = 1
OPT_LEVEL_PIPELINES = ("O0", "O1", "O2", "O3")
# a file's stat identity is trusted for its digest only once it is this old (a write in the same
# clock tick as the stat could otherwise go unnoticed)
STAT_SETTLE_S = 2.0
# the key bytes of an ONNX external-data reference (StringStringEntryProto key "location")
_ONNX_EXTERNAL_DATA_MARK = b"\n\x08location"



def compile(model: Any, *, backend: str = "llvm", target: str | None = None, opt_level: int = 3,
            threads: int | None = None, example_inputs: Any = None, input_shapes: Shapes | None = None,
            passes: str | Sequence[Any] | None = None, gate: Any = None, function: str | None = None,
            output_dir: str | Path | None = None, name: str | None = None, keep_ir: bool = False,
            cache: bool = True, dynamic: bool | None = None, fp16: bool = False,
            ranges: Mapping[str, tuple[float, float]] | None = None, fp16_strict: bool | None = None,
            **import_options: Any) -> CompiledModel:
    """Compile ``model`` (anything :func:`cuvil.import_model` accepts) to a shared library and load it.

    The optimization pipeline is ``O<opt_level>`` unless ``passes`` names one (``"O2"``,
    ``"fold-batchnorm,fuse-elementwise"`` or a list of Pass objects); ``gate`` is the pass
    manager's gate hook (the verifier's). ``example_inputs`` doubles as the torch export inputs
    and as the source of concrete dims. ``target`` is the host (``None``, ``"host"``,
    ``"x86-64"``, ``"x86_64-linux-gnu"``); other targets are refused for now.

    ``cache=True`` loads and stores the artifact in the user's cache; ``output_dir`` (or
    ``cache=False``) bypasses it: the library, header and manifest go to ``output_dir`` (default
    a fresh temporary folder). ``dynamic`` (default: true unless ``output_dir`` is given) makes a
    function with symbolic dims specialize per shape signature at call time.

    ``fp16=True`` runs in float16 every float32 op whose float16 sites the overflow prober proves
    finite for inputs in ``ranges`` (``{"x": (-1.0, 1.0)}``, one ``(lo, hi)`` per input, integer
    inputs such as token ids included); every other op stays float32, and the manifest's
    ``precision`` entry lists them with the reason. ``fp16_strict=True`` (default: whether
    ``gate`` is a strict gate) refuses instead (``CUVIL-FP16-UNPROVED``, nothing emitted) when any
    op float16 applies to is not proved.
    """
    fp16_request = _fp16_request(fp16, ranges, fp16_strict, gate)
    if backend not in BACKENDS:
        raise CodegenError(f"unknown backend {backend!r}", hint="backends: " + ", ".join(BACKENDS))
    if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
        raise CodegenError(f"opt_level must be 0..3, got {opt_level!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise CodegenError(f"threads must be a positive integer, got {threads!r}")
    host = resolve_target(target)
    store = ArtifactCache() if cache and output_dir is None else None
    job = _CompileJob(model, example_inputs=example_inputs, import_options=import_options, function=function,
                      passes=passes if passes is not None else f"O{opt_level}", gate=gate, opt_level=opt_level,
                      name=name, keep_ir=keep_ir, threads=threads, target=host, store=store,
                      output_dir=Path(output_dir) if output_dir is not None else None, fp16=fp16_request)
    sig = job.signature()
    if sig.is_static:
        lib = job.library({})
        job.release()
        return CompiledModel.from_library(lib, ir=job.optimized)
    shapes = requested_shapes(sig.function, [(s.name, s.shape) for s in sig.inputs], example_inputs, input_shapes)
    if dynamic is None:
        dynamic = output_dir is None
    if not dynamic:
        if shapes is None:
            symbolic = ", ".join(str(s) for s in sig.inputs if not all(isinstance(d, int) for d in s.shape))
            raise CodegenError(f"@{sig.function} has symbolic dims ({symbolic}); one artifact is compiled for "
                               "static shapes", location=sig.function,
                               hint="pass example_inputs=... or input_shapes=... to compile() (on the command "
                                    "line: --shape INPUT=2x3x...), or compile without output_dir to specialize "
                                    "per shape at run time")
        lib = job.library(sig.bind(shapes))
        job.release()
        return CompiledModel.from_library(lib, ir=job.optimized)
    job.per_shape_folders = True
    compiled = CompiledModel.specializing(sig, job.library, ir=job.optimized)
    if shapes is not None:
        compiled.specialize(sig.bind(shapes))
    return compiled


def _fp16_request(fp16: bool, ranges: Mapping[str, Any] | None, strict: bool | None, gate: Any
                  ) -> dict[str, Any] | None:
    """What an FP16 compile asks for (part of the cache key): the declared ranges and whether an
    unproved op refuses the build. The ranges are checked against the inputs when the plan is made."""
    if not fp16:
        if ranges:
            raise InputError("input ranges only apply to an FP16 compile", location="ranges",
                             hint="pass fp16=True (on the command line: --enable-fp16) or drop the ranges")
        return None
    if not ranges:
        raise InputError("an FP16 compile needs the declared range of every input: only ops proved safe for "
                         "those ranges run in float16", location="ranges",
                         hint="pass ranges={'x': (-1.0, 1.0)} (on the command line: --range x=-1:1, repeatable, "
                              "or --calibrate DIR of .npy samples)")
    box: dict[str, list[float]] = {}
    for k, r in sorted(ranges.items(), key=lambda kv: str(kv[0])):
        try:
            lo, hi = (float(x) for x in r)
        except (TypeError, ValueError):
            raise InputError(f"the range of {k!r} must be a pair (lo, hi) of numbers, got {r!r}",
                             location="ranges") from None
        box[str(k)] = [lo, hi]
    return {"ranges": box, "strict": bool(strict) if strict is not None else getattr(gate, "policy", None) == "strict",
            "prober": _prober_digest()}


@functools.cache
def _prober_digest() -> str:
    """A digest of the overflow prober's sources: its proofs decide an FP16 build, so they key the cache."""
    import importlib.util

    spec = importlib.util.find_spec("verify.probe")
    if spec is None or spec.origin is None:
        raise InputError("an FP16 compile needs the overflow prober (verify.probe), which is not installed",
                         location="fp16", hint="install cuvil with its verifier")
    h = hashlib.sha256()
    for path in sorted(Path(spec.origin).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# targets


def resolve_target(target: str | None) -> HostTarget:
    """The host target, when ``target`` names it; anything else is refused (no cross-compiling yet)."""
    host = host_target()
    if target is None or target.lower() in HOST_TARGET_NAMES:
        return host
    host_arch, _, rest = host.triple.partition("-")
    wanted = target.lower()
    arch = wanted.split("-")[0] if wanted not in X86_64_NAMES else "x86_64"
    arch = "x86_64" if arch in ("amd64", "x86_64") else arch
    same_os = wanted in X86_64_NAMES or ("linux" in wanted and "linux" in rest)
    if arch == host_arch and same_os:
        return host
    raise CodegenError(f"target {target!r} is not supported yet: this build compiles for the host "
                       f"({host.triple}, CPU {host.cpu})", location="target",
                       hint="omit the target, or pass 'host' / 'x86_64-linux-gnu'; cross-compiling "
                            "(aarch64, wasm32, nvptx64) is not available in this version")


# --------------------------------------------------------------------------------------
# cache keys


@functools.cache
def toolchain_fingerprint() -> dict[str, str]:
    """What, besides the model and options, decides the generated code: cuvil's own sources
    (so an edited compiler never reuses stale artifacts), llvmlite/LLVM and the ABI."""
    import llvmlite
    import llvmlite.binding as llvm

    from cuvil.version import __version__

    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
    return {"cuvil": __version__, "sources": h.hexdigest(), "llvmlite": llvmlite.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info)), "abi": str(abi.ABI_VERSION),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


def module_hash(fn: Function, constants: Mapping[str, np.ndarray] | None = None) -> str:
    """The content hash of ``fn`` with the bytes of the constants it uses (``cuvil.ir.hashing``)."""
    used = {v.const_hash for v in fn.values() if v.is_const}
    return hashing.module_hash(Module((fn,), {k: a for k, a in (constants or {}).items() if k in used}))


class _Unkeyable(Exception):
    """A value with no stable text (an object identified by its address)."""


def _stable(obj: Any) -> Any:
    """A JSON-able, run-to-run stable description of an option value."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.ndarray) or (hasattr(obj, "__array__") and not isinstance(obj, (list, tuple, dict))):
        arr = np.ascontiguousarray(to_numpy(obj))
        return {"array": hashlib.sha256(arr.dtype.str.encode() + repr(arr.shape).encode() + arr.tobytes())
                .hexdigest()}
    if isinstance(obj, Mapping):
        return {str(k): _stable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_stable(x) for x in obj]
    text = repr(obj)
    if " at 0x" in text:
        raise _Unkeyable(text)
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{text}"


def _certifies(gate: Any) -> bool:
    """A gate that records what it checked (the verifier's): its certificate goes into the manifest."""
    return callable(getattr(gate, "mark", None)) and callable(getattr(gate, "report", None))


def _callable_key(obj: Any) -> str | None:
    if obj is None:
        return None
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    text = repr(obj)
    qual = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return qual if " at 0x" in text else f"{qual}:{text}"


PLUGIN_SOURCE_FILES = 2000
"""The most source files of a pass plugin's package hashed into the cache key."""


def _module_source_digest(obj: Any) -> str | None:
    """For a class defined outside cuvil (a user's pass): the sources its behaviour may depend on,
    so a change in a helper module changes the cache key too. For a pass in a package: every
    ``.py`` file of its top-level package (imported yet or not); for a top-level module: the loaded
    modules beside it."""
    name = type(obj).__module__
    mod = sys.modules.get(name)
    if mod is None or name.startswith(("cuvil.", "verify.")):
        return None
    try:
        path = inspect.getsourcefile(mod)
    except TypeError:
        return None
    if not path or not os.path.isfile(path):
        return None
    top = sys.modules.get(name.split(".")[0])
    top_file = getattr(top, "__file__", None) if top is not None else None
    files: list[Path] = []
    if top_file and "." in name:
        root = Path(top_file).parent
        files = sorted(p for p in root.rglob("*.py") if p.is_file())[:PLUGIN_SOURCE_FILES + 1]
    if not files or len(files) > PLUGIN_SOURCE_FILES:
        root = Path(path).parent if not (top_file and "." in name) else Path(top_file).parent
        loaded = {Path(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))
                  and f.endswith(".py")}
        files = sorted(p for p in loaded if p.is_relative_to(root) and "site-packages" not in p.parts
                       and p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root)}\0".encode() + p.read_bytes())
    return h.hexdigest()


def pipeline_key(passes: str | Sequence[Any]) -> list[str]:
    """The pipeline as the exact list of pass instances (with their options) it expands to.

    A bare opt level (``"O3"``) stands for itself: cuvil's sources, which define it, are in
    the toolchain fingerprint already (and the pass catalogue need not be imported on a hit)."""
    if isinstance(passes, str) and passes.strip().upper() in OPT_LEVEL_PIPELINES:
        return [passes.strip().upper()]
    out = []
    for p in parse_pipeline(passes if isinstance(passes, str) else list(passes)):
        digest = _module_source_digest(p)
        out.append(repr(p) if digest is None else f"{p!r}@{digest}")
    return out


def _source_digest(model: Any, store: ArtifactCache | None = None) -> str | None:
    """A digest of a self-contained model file or serialized model (None when it is not one).

    For a file, the digest is remembered under its stat identity (device, inode, size, mtime,
    ctime), as version control systems do, so an unchanged file is not read again."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not path.is_file():
            return None
        ident = key_of({"kind": "stat", "path": str(path.resolve()), "dev": st.st_dev, "ino": st.st_ino,
                        "size": st.st_size, "mtime": st.st_mtime_ns, "ctime": st.st_ctime_ns})
        known = store.read_alias(ident) if store is not None else None
        if known is not None and isinstance(known.get("digest"), (str, type(None))):
            return known["digest"]
        digest = _bytes_digest(path.read_bytes(), path.suffix.lower())
        settled = time.time() - max(st.st_mtime, st.st_ctime) > STAT_SETTLE_S
        if store is not None and settled and os.stat(path).st_mtime_ns == st.st_mtime_ns:
            store.write_alias(ident, {"digest": digest})
        return digest
    elif isinstance(model, bytes):
        data, kind = model, ".onnx"
    elif type(model).__module__.startswith("onnx") and hasattr(model, "SerializeToString"):
        try:
            data = model.SerializeToString()
        except Exception:  # a proto over 2 GiB cannot be serialized in one piece
            return None
        kind = ".onnx"
    else:
        return None
    return _bytes_digest(data, kind)


def _bytes_digest(data: bytes, kind: str) -> str | None:
    if kind not in (".cir", ".pt2") and _ONNX_EXTERNAL_DATA_MARK in data:
        return None  # weights in other files: the file alone does not determine the model
    return hashlib.sha256(kind.encode() + b"\0" + data).hexdigest()


# --------------------------------------------------------------------------------------
# one compile request


def _valid_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """An alias record that names a module hash and a readable signature (else None: import)."""
    if record is None or not isinstance(record.get("module_hash"), str):
        return None
    try:
        Signature.from_json(record["signature"])
    except (KeyError, TypeError, ValueError):
        return None
    return record


class _CompileJob:
    """Everything needed to produce (or find) the library of one specialization of one model."""

    def __init__(self, model: Any, *, example_inputs: Any, import_options: Mapping[str, Any], function: str | None,
                 passes: str | Sequence[Any], gate: Any, opt_level: int, name: str | None, keep_ir: bool,
                 threads: int | None, target: HostTarget, store: ArtifactCache | None,
                 output_dir: Path | None, fp16: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.fp16 = fp16  # {"ranges": ..., "strict": ...}: lower to float16 where proved (see _fp16_plan)
        self._fp16_plans: dict[tuple[tuple[str, int], ...], Any] = {}
        self.example_inputs = example_inputs
        self.import_options = dict(import_options)
        self.function_name = function
        self.passes = passes
        self.gate = gate
        self.opt_level = opt_level
        self.name = name
        self.keep_ir = keep_ir
        self.threads = threads
        self.target = target
        self.store = store
        self.output_dir = output_dir
        self.per_shape_folders = False  # a dynamic model writes each specialization to output_dir/<dims>/
        self._module: Module | None = model if isinstance(model, Module) else None
        self._function: Function | None = None
        self._record: dict[str, Any] | None = None
        self._alias = self._alias_key() if store is not None else None
        if self._alias is not None and store is not None:
            self._record = _valid_record(store.read_alias(self._alias))
            if self._record is not None:
                logger.debug("cache: %s is known (module %s); import skipped", self._describe(),
                             str(self._record["module_hash"])[:16])
        self._options = self._options_key()

    def _describe(self) -> str:
        return str(self.model) if isinstance(self.model, (str, os.PathLike)) else type(self.model).__name__

    def _alias_key(self) -> str | None:
        if isinstance(self.model, Module):
            return None
        digest = _source_digest(self.model, self.store)
        if digest is None:
            return None
        try:
            options = _stable(self.import_options)
        except _Unkeyable:
            return None
        return key_of({"kind": "alias", "format": CACHE_KEY_FORMAT, "source": digest, "options": options,
                       "function": self.function_name, "toolchain": toolchain_fingerprint()})

    def _options_key(self) -> dict[str, Any]:
        pipeline = self.passes if isinstance(self.passes, str) else [str(p) for p in self.passes]
        return {"backend": "llvm", "opt_level": self.opt_level, "pipeline_spec": pipeline,
                "pipeline": pipeline_key(self.passes), "gate": _callable_key(self.gate), "name": self.name,
                "keep_ir": self.keep_ir, "threads": self.threads,
                **({"fp16": dict(self.fp16)} if self.fp16 is not None else {})}

    # -- the model -----------------------------------------------------------------------
    def module(self) -> Module:
        if self._module is None:
            with stage(f"import {self._describe()}"):
                self._module = import_model(self.model, self.example_inputs, **self.import_options)
        return self._module

    def function(self) -> Function:
        if self._function is None:
            m = self.module()
            self._function = m.function(self.function_name) if self.function_name else m.main
        return self._function

    def release(self) -> None:
        """Drop the imported module (it is imported again if the IR is asked for)."""
        if not isinstance(self.model, Module):
            self._module = None
            self._function = None

    def _ensure_record(self) -> dict[str, Any]:
        if self._record is None:
            fn = self.function()
            self._record = {"module_hash": module_hash(fn, self.module().constants),
                            "signature": Signature.of(fn).to_json()}
            if self._alias is not None and self.store is not None:
                self.store.write_alias(self._alias, self._record)
        return self._record

    def signature(self) -> Signature:
        record = self._ensure_record()
        if self._function is not None:
            return Signature.of(self._function)
        return Signature.from_json(record["signature"])

    # -- building ------------------------------------------------------------------------
    def material(self, env: Mapping[str, int]) -> dict[str, Any]:
        record = self._ensure_record()
        return {"format": CACHE_KEY_FORMAT, "module": record["module_hash"],
                "function": record["signature"]["function"], "dims": dict(sorted(env.items())),
                "options": self._options, "toolchain": toolchain_fingerprint(),
                "target": {"triple": self.target.triple, "cpu": self.target.cpu, "features": self.target.features}}

    def optimized(self, env: Mapping[str, int] | None) -> Module:
        """The optimized module at ``env`` (the symbolic one when ``env`` is None)."""
        fn = self.function()
        if env:
            with stage("specialize " + ", ".join(f"{k}={v}" for k, v in sorted(env.items()))):
                fn = specialize_dims(fn, env)
        label = self.passes if isinstance(self.passes, str) else "custom pipeline"
        module = self.module()
        start = Module((fn,), module.constants, module.metadata)
        if self.fp16 is not None:
            start = self._fp16_plan(start, env).module
        with stage(f"optimize ({label})"):
            return run_pipeline(start, self.passes, gate=self.gate).module

    def _fp16_plan(self, module: Module, env: Mapping[str, int] | None) -> Any:
        """The float16 program of ``module`` (float16 exactly where the prober proves it safe), planned
        once per specialization; under a strict request, an unproved op stops the compile here."""
        assert self.fp16 is not None
        key = tuple(sorted((env or {}).items()))
        if key not in self._fp16_plans:
            if not all(p.type.is_static for p in module.main.params):
                raise InputError("FP16 is planned per specialization (the prober needs static shapes)",
                                 location=module.main.name, hint="give the dims to export the IR of")
            from verify.probe.fp16_policy import plan_fp16

            with stage("fp16 policy"):
                plan = plan_fp16(module, self.fp16["ranges"])
            logger.debug("fp16: %d ops in float16, %d kept float32 (%d unproved) in %.2f s", len(plan.fp16_ops),
                         len(plan.fp32_ops), len(plan.unproved), plan.seconds)
            self._fp16_plans[key] = plan
        plan = self._fp16_plans[key]
        if self.fp16["strict"]:
            plan.require_all_proved()
        return plan

    def _build(self, env: Mapping[str, int], out_dir: Path, cache_key: str | None) -> Artifact:
        mark = self.gate.mark() if _certifies(self.gate) else None
        optimized = self.optimized(env)
        extra: dict[str, Any] = {"specialized_dims": dict(env)} if env else {}
        extra["pipeline"] = self._options["pipeline_spec"]
        if self.fp16 is not None:
            extra["precision"] = {**self._fp16_plans[tuple(sorted(env.items()))].manifest(),
                                  "strict": self.fp16["strict"]}
        provenance: dict[str, str] = {}
        if mark is not None:
            extra["verification"] = self._certificate(mark, optimized)
            provenance["certificate"] = extra["verification"]["digest"]
        if cache_key is not None:
            extra["cache_key"] = cache_key
        kwargs: dict[str, Any] = {}
        if self.threads is not None:
            if "threads" in inspect.signature(build_library).parameters:
                kwargs["threads"] = self.threads
            else:
                extra["threads_requested"] = self.threads
                logger.warning("threads=%d: this version's libraries run on one thread", self.threads)
        with stage("codegen"):
            artifact = build_library(optimized.main, optimized.constants, out_dir, name=self.name,
                                     opt_level=self.opt_level, keep_ir=self.keep_ir, extra_manifest=extra,
                                     provenance=provenance, **kwargs)
        for step, seconds in artifact.manifest.get("compile_times", {}).items():
            logger.debug("  codegen %s: %.3f s", step.removesuffix("_s").replace("optimize", "llvm-optimize"),
                         seconds)
        return artifact

    def _certificate(self, mark: int, optimized: Module) -> dict[str, Any]:
        """The gate's certificate for the applications since ``mark``, bound to the function compiled."""
        from cuvil.codegen.llvm_module import function_hash

        names = [p.name for p in parse_pipeline(self.passes)]
        report = self.gate.report(names, since=mark)
        return report.certificate(function_hash=function_hash(optimized.main, optimized.constants))

    def _usable(self, entry: Any) -> bool:
        """A cached artifact serves a verified request only if it carries a certificate."""
        return entry is not None and (not _certifies(self.gate) or "verification" in entry.manifest)

    def library(self, env: Mapping[str, int]) -> NativeLibrary:
        """The loaded library of the specialization at ``env``: from the cache, or built now."""
        if self.store is None:
            return self._library_uncached(env)
        store = self.store
        key = key_of(self.material(env))
        start = time.perf_counter()
        entry = store.lookup(key)
        if self._usable(entry):
            return self._load_entry(entry.library_path, entry.manifest, key, start, "hit")
        logger.debug("cache miss %s", key[:16])
        with store.lock(key) as waited:
            entry = store.lookup(key)
            if self._usable(entry):  # built by the process we waited for
                return self._load_entry(entry.library_path, entry.manifest, key, start, "hit", waited=waited)
            build_dir = store.new_build_dir(key)
            try:
                artifact = self._build(env, build_dir, key)
                with stage("cache store"):
                    entry = store.publish(key, artifact.library_path, artifact.manifest_path, self.material(env))
            finally:
                if build_dir.parent.exists():
                    shutil.rmtree(build_dir.parent, ignore_errors=True)
        return self._load_entry(entry.library_path, entry.manifest, key, start, "miss", waited=waited)

    def _load_entry(self, path: Path, manifest: dict[str, Any], key: str, start: float, status: str,
                    waited: float = 0.0) -> NativeLibrary:
        with stage("load"):
            lib = NativeLibrary(path, manifest, verify_hash=False)  # the cache checked the hash just now
        seconds = time.perf_counter() - start
        lib.info = {"cache": status, "key": key, "seconds": round(seconds, 4), "waited_s": round(waited, 4)}
        logger.debug("cache %s %s: %s in %.3f s", status, key[:16], path.name, seconds)
        return lib

    def _library_uncached(self, env: Mapping[str, int]) -> NativeLibrary:
        start = time.perf_counter()
        if self.output_dir is None:
            out = Path(tempfile.mkdtemp(prefix="cuvil-"))
        elif self.per_shape_folders:
            out = self.output_dir / "_".join(f"{k}{v}" for k, v in sorted(env.items()))
        else:
            out = self.output_dir
        artifact = self._build(env, out, None)
        with stage("load"):
            lib = NativeLibrary(artifact.library_path, artifact.manifest)
        lib.info = {"cache": "off", "seconds": round(time.perf_counter() - start, 4)}
        return lib


__all__ = ["compile", "module_hash", "resolve_target", "toolchain_fingerprint"]
