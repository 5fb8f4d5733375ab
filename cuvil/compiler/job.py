"""One compile request: the model imported once (or not at all on a cache hit), specialized per
shape signature, planned for FP16 when asked, optimized under the gate, and built into a library
(or found in the artifact cache)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.artifact import Artifact, build_library
from cuvil.codegen.kernels.threads import default_pool_size
from cuvil.codegen.shape_class import ShapeClass
from cuvil.codegen.target import Target, certificate_target
from cuvil.compiler.bf16_plan import plan_bf16
from cuvil.compiler.keys import (
    CACHE_KEY_FORMAT,
    Unkeyable,
    callable_key,
    pipeline_key,
    source_digest,
    stable,
    toolchain_fingerprint,
)
from cuvil.errors import CodegenError, InputError
from cuvil.frontend.dispatch import import_model
from cuvil.frontend.onnx_import import declared_types
from cuvil.frontend.onnx_node import SymbolicValueRequired
from cuvil.ir import hashing
from cuvil.ir.module import Function, Module
from cuvil.ir.specialize import specialize_dims
from cuvil.log import stage
from cuvil.passes import parse_pipeline, run_pipeline
from cuvil.runtime.cache import ArtifactCache, Entry, key_of
from cuvil.runtime.loader import NativeLibrary, Signature, open_library

if TYPE_CHECKING:
    from failsafe.guard import GuardSpec

logger = logging.getLogger("cuvil")


def certifies(gate: Any) -> bool:
    """A gate that records what it checked (the verifier's): its certificate goes into the manifest."""
    return callable(getattr(gate, "mark", None)) and callable(getattr(gate, "report", None))


def valid_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """An alias record that names a module hash and a readable signature (else None: import)."""
    if record is None or not isinstance(record.get("module_hash"), str):
        return None
    try:
        Signature.from_json(record["signature"])
    except (KeyError, TypeError, ValueError):
        return None
    return record


class CompileJob:
    """Everything needed to produce (or find) the library of one specialization of one model."""

    def __init__(self, model: Any, *, example_inputs: Any, import_options: Mapping[str, Any], function: str | None,
                 passes: str | Sequence[Any], gate: Any, opt_level: int, name: str | None, keep_ir: bool,
                 threads: int | None, target: Target, store: ArtifactCache | None,
                 output_dir: Path | None, fp16: Mapping[str, Any] | None = None,
                 guard: GuardSpec | None = None, dim_max: Mapping[str, int] | None = None,
                 int8: bool = False, bf16: bool = False, profile: bool = False) -> None:
        self.model = model
        self.profile = profile  # time every op of a run (cuvil.codegen.profile)
        self.dim_max = dict(dim_max) if dim_max is not None else None  # a shape-class library's largest dims
        self.guard = guard  # a fail-safe policy's guard, built into every library of this job
        self.fp16 = fp16  # {"ranges": ..., "strict": ...}: lower to float16 where proved (see _fp16_plan)
        self._fp16_plans: dict[tuple[tuple[str, int], ...], Any] = {}
        self.int8 = int8  # lower a QDQ model's products to integers where the accumulators are proved (_int8_plan)
        self._int8_plans: dict[tuple[tuple[str, int], ...], Any] = {}
        self.bf16 = bf16  # run the float32 products by constant weights in bfloat16 (cuvil.compiler.bf16_plan)
        self._bf16_plans: dict[tuple[tuple[str, int], ...], Any] = {}
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
            self._record = valid_record(store.read_alias(self._alias))
            if self._record is not None:
                logger.debug("cache: %s is known (module %s); import skipped", self._describe(),
                             str(self._record["module_hash"])[:16])
        self._options = self._options_key()

    def _describe(self) -> str:
        return str(self.model) if isinstance(self.model, (str, os.PathLike)) else type(self.model).__name__

    def _alias_key(self) -> str | None:
        if isinstance(self.model, Module):
            return None
        digest = source_digest(self.model, self.store)
        if digest is None:
            return None
        try:
            options = stable(self.import_options)
        except Unkeyable:
            return None
        return key_of({"kind": "alias", "format": CACHE_KEY_FORMAT, "source": digest, "options": options,
                       "function": self.function_name, "toolchain": toolchain_fingerprint()})

    def _options_key(self) -> dict[str, Any]:
        pipeline = self.passes if isinstance(self.passes, str) else [str(p) for p in self.passes]
        return {"backend": "llvm", "opt_level": self.opt_level, "pipeline_spec": pipeline,
                "pipeline": pipeline_key(self.passes), "gate": callable_key(self.gate), "name": self.name,
                "keep_ir": self.keep_ir, "threads": self.threads,
                **({"pool_size": default_pool_size()} if self.threads is None else {}),  # the blocks are cut for them
                **({"fp16": dict(self.fp16)} if self.fp16 is not None else {}),
                **({"int8": True} if self.int8 else {}),
                **({"bf16": True} if self.bf16 else {}),
                **({"profile": True} if self.profile else {}),
                **({"failsafe": self.guard.cache_key()} if self.guard is not None else {}),
                **({"dim_max": dict(sorted(self.dim_max.items()))} if self.dim_max is not None else {})}

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
            try:
                fn = self.function()
                self._record = {"module_hash": hashing.compiled_function_hash(fn, self.module().constants),
                                "signature": Signature.of(fn).to_json()}
            except SymbolicValueRequired as e:
                self._record = self._per_shape_record(e)
            if self._alias is not None and self.store is not None:
                self.store.write_alias(self._alias, self._record)
        return self._record

    @property
    def per_shape_import(self) -> bool:
        """Whether the model is imported once per shape: its import decides on a dim's value (a branch
        chosen by a shape), so no one function serves every shape."""
        return "per_shape" in self._ensure_record()

    def _per_shape_record(self, why: SymbolicValueRequired) -> dict[str, Any]:
        """The record of an ONNX model whose import needs concrete dims: its declared signature, keyed
        by the source's digest and the import options."""
        onnx_source = isinstance(self.model, bytes) or type(self.model).__module__.startswith("onnx") or (
            isinstance(self.model, (str, os.PathLike)) and Path(self.model).suffix.lower() == ".onnx")
        digest = source_digest(self.model, self.store) if onnx_source and self.function_name is None else None
        try:
            options = stable(self.import_options)
        except Unkeyable:
            digest = None
        if digest is None:
            raise why
        inputs, outputs = declared_types(self.model, static_inputs=self.import_options.get("static_inputs"))
        sig = Signature("main", tuple(TensorSpec(n, t.dtype, t.shape) for n, t in inputs),
                        tuple(TensorSpec(n, t.dtype, t.shape) for n, t in outputs))
        logger.debug("import needs concrete dims (%s); importing once per shape", why.message)
        return {"module_hash": key_of({"kind": "per-shape import", "source": digest, "options": options}),
                "signature": sig.to_json(), "per_shape": why.message}

    def _imported_at(self, env: Mapping[str, int]) -> Module:
        with stage(f"import {self._describe()} at " + ", ".join(f"{k}={v}" for k, v in sorted(env.items()))):
            return import_model(self.model, self.example_inputs, **self.import_options, dims=dict(env))

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
                "target": self.target.to_json()}

    def optimized(self, env: Mapping[str, int] | None) -> Module:
        """The optimized module at ``env`` (the symbolic one when ``env`` is None)."""
        if self.per_shape_import:
            if not env:
                raise InputError("this model is imported once per shape: its import decides on the value of "
                                 f"a dim ({self._record['per_shape'] if self._record else ''})",
                                 hint="give the input shapes (--specialize NAME=2x3x..., or example_inputs=...), or "
                                      "declare ranges of the dims that decide it (--dim-range DIM=LO:HI, or "
                                      "dim_ranges=...) for one library")
            module = self._imported_at(env)
            fn = module.main
        else:
            fn = self.function()
            if env:
                with stage("specialize " + ", ".join(f"{k}={v}" for k, v in sorted(env.items()))):
                    fn = specialize_dims(fn, env)
            module = self.module()
        label = self.passes if isinstance(self.passes, str) else "custom pipeline"
        start = Module((fn,), module.constants, module.metadata)
        if self.int8:
            start = self._int8_lowered(start, env)
        if self.fp16 is not None:
            start = self._fp16_plan(start, env).module
        if self.bf16:
            start = self._bf16_lowered(start, env)
        with stage(f"optimize ({label})"):
            return run_pipeline(start, self.passes, gate=self.gate).module

    def _int8_lowered(self, module: Module, env: Mapping[str, int] | None) -> Module:
        """The QDQ model with its quantized products in integer arithmetic when the prober proves that no
        int32 accumulator wraps (verify.probe.int8_policy), planned once per specialization; a model
        without QDQ passes through."""
        key = tuple(sorted((env or {}).items()))
        if key not in self._int8_plans:
            from verify.probe.int8_policy import needs_plan, plan_int8

            if not needs_plan(module):
                return module
            with stage("int8 policy"):
                plan = plan_int8(module)
            logger.debug("int8: %s (%d integer products) in %.2f s", "applied" if plan.applied else "not applied",
                         plan.products, plan.seconds)
            if not plan.applied and plan.products:  # products that could have run in int8 did not
                logger.warning("int8: the QDQ graph is compiled in float32: %s", plan.reason)
            self._int8_plans[key] = plan
        return self._int8_plans[key].module

    def _bf16_lowered(self, module: Module, env: Mapping[str, int] | None) -> Module:
        """The module with its float32 products by constant weights in bfloat16, once per specialization."""
        key = tuple(sorted((env or {}).items()))
        if key not in self._bf16_plans:
            with stage("bf16 products"):
                self._bf16_plans[key] = plan_bf16(module)
            plan = self._bf16_plans[key]
            logger.debug("bf16: %d products in bfloat16, %d kept float32", plan.products, len(plan.kept))
        return self._bf16_plans[key].module

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
        mark = self.gate.mark() if certifies(self.gate) else None
        optimized = self.optimized(env)
        extra: dict[str, Any] = {"specialized_dims": dict(env)} if env else {}
        shape_class = None
        if not env and not all(p.type.is_static for p in optimized.main.params):
            shape_class = ShapeClass.of(optimized.main, self.dim_max)
        extra["pipeline"] = self._options["pipeline_spec"]
        int8 = self._int8_plans.get(tuple(sorted(env.items())))
        if int8 is not None:
            extra["int8"] = int8.manifest()
        if self.fp16 is not None:
            extra["precision"] = {**self._fp16_plans[tuple(sorted(env.items()))].manifest(),
                                  "strict": self.fp16["strict"]}
        bf16 = self._bf16_plans.get(tuple(sorted(env.items())))
        if bf16 is not None:
            extra["precision"] = bf16.manifest()
        provenance: dict[str, str] = {}
        if mark is not None:
            extra["verification"] = self._certificate(mark, optimized, shape_class)
            provenance["certificate"] = extra["verification"]["digest"]
        if self.guard is not None:
            extra["failsafe"] = self.guard.manifest()
        if cache_key is not None:
            extra["cache_key"] = cache_key
        if self.target.arch == "nvptx64":
            return self._build_cuda(optimized, out_dir, extra, provenance, shape_class)
        with stage("codegen"):
            artifact = build_library(optimized.main, optimized.constants, out_dir, name=self.name,
                                     opt_level=self.opt_level, keep_ir=self.keep_ir, extra_manifest=extra,
                                     provenance=provenance, threads=self.threads,
                                     guard=self.guard.checks() if self.guard is not None else None,
                                     shape_class=shape_class, target=self.target, profile=self.profile)
        for step, seconds in artifact.manifest.get("compile_times", {}).items():
            logger.debug("  codegen %s: %.3f s", step.removesuffix("_s").replace("optimize", "llvm-optimize"),
                         seconds)
        return artifact

    def _build_cuda(self, optimized: Module, out_dir: Path, extra: dict[str, Any], provenance: dict[str, str],
                    shape_class: ShapeClass | None) -> Artifact:
        """The PTX module and launch plan (cuvil.codegen.gpu): static shapes, no fail-safe guard yet."""
        from cuvil.codegen.gpu.artifact import build_cuda_module

        if shape_class is not None or self.guard is not None or self.profile:
            raise CodegenError("a CUDA module is compiled at concrete shapes, without a fail-safe guard and "
                               "without per-step profiling", location=optimized.main.name,
                               hint="give the input shapes (--shape NAME=1x3x224x224) and drop --failsafe "
                                    "and --profile")
        with stage("codegen (cuda)"):
            return build_cuda_module(optimized.main, optimized.constants, out_dir, target=self.target,
                                     name=self.name, opt_level=self.opt_level, extra_manifest=extra,
                                     provenance=provenance)

    def _certificate(self, mark: int, optimized: Module, shape_class: ShapeClass | None) -> dict[str, Any]:
        """The gate's certificate for the applications since ``mark``, bound to the function compiled and
        saying which shapes its proofs cover."""
        names = [p.name for p in parse_pipeline(self.passes)]
        report = self.gate.report(names, since=mark)
        fn = optimized.main
        if shape_class is not None:
            shapes = {"scope": "shape class", "constraints": [str(c) for c in fn.constraints],
                      "library_maxima": dict(shape_class.maxima),
                      "meaning": "the proofs are over symbolic dims: they hold for every value of the dims the "
                                 "constraints admit; the library serves those up to its maxima"}
        else:
            shapes = {"scope": "static shapes", "inputs": {p.name: list(p.type.shape) for p in fn.params}}
        return report.certificate(function_hash=hashing.compiled_function_hash(fn, optimized.constants),
                                  shapes=shapes, target=certificate_target(self.target))

    def _usable(self, entry: Entry | None) -> TypeGuard[Entry]:
        """A cached artifact serves a verified request only if it carries a certificate."""
        return entry is not None and (not certifies(self.gate) or "verification" in entry.manifest)

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
            lib = open_library(path, manifest, verify_hash=False)  # the cache checked the hash just now
        seconds = time.perf_counter() - start
        lib.info = {"cache": status, "key": key, "seconds": round(seconds, 4), "waited_s": round(waited, 4)}
        logger.debug("cache %s %s: %s in %.3f s", status, key[:16], path.name, seconds)
        return lib

    def _library_uncached(self, env: Mapping[str, int]) -> NativeLibrary:
        start = time.perf_counter()
        if self.output_dir is None:
            return self._library_scratch(env, start)
        out = self.output_dir
        if self.per_shape_folders:
            out = out / "_".join(f"{k}{v}" for k, v in sorted(env.items()))
        artifact = self._build(env, out, None)
        with stage("load"):
            lib = open_library(artifact.library_path, artifact.manifest)
        lib.info = {"cache": "off", "seconds": round(time.perf_counter() - start, 4)}
        return lib

    def _library_scratch(self, env: Mapping[str, int], start: float) -> NativeLibrary:
        """No cache and no output folder: the library lives in a temporary folder that goes with it (an
        emulated or wasm library reads its files on every call, so not before)."""
        out = Path(tempfile.mkdtemp(prefix="cuvil-"))
        try:
            artifact = self._build(env, out, None)
            with stage("load"):
                lib = open_library(artifact.library_path, artifact.manifest)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        weakref.finalize(lib, shutil.rmtree, out, True)
        lib.info = {"cache": "off", "seconds": round(time.perf_counter() - start, 4)}
        return lib
