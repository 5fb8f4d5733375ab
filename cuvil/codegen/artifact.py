"""One compiled function on disk: ``lib<prefix>.so``, ``<prefix>.h`` and ``<prefix>.json``.

The manifest records the signature, the ABI, the target the code was tuned for and
content hashes (of the function and of the library file), so a loader can refuse a
library that does not match what it was told it is.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.guard import GuardChecks
from cuvil.codegen.header import render_header
from cuvil.codegen.link import emit_object, link_shared, optimize, target_machine
from cuvil.codegen.llvm_module import embed_provenance, lower_function
from cuvil.codegen.manifest import (  # noqa: F401  (re-exported: the names a loader and the tests use)
    MANIFEST_FORMAT,
    IntegrityError,
    ManifestError,
    check_manifest,
    entry_symbols,
    file_sha256,
    manifest_digest,
    manifest_problems,
    read_provenance,
)
from cuvil.codegen.shape_class import ShapeClass
from cuvil.codegen.target import Target, compiling_for, host_target
from cuvil.ir.module import Function


@dataclass(frozen=True)
class Artifact:
    library_path: Path
    header_path: Path
    manifest_path: Path
    manifest: dict[str, Any]


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def build_library(fn: Function, constants: Mapping[str, np.ndarray], out_dir: str | os.PathLike, *,
                  name: str | None = None, opt_level: int = 3, keep_ir: bool = False,
                  extra_manifest: Mapping[str, Any] | None = None, threads: int | None = None,
                  provenance: Mapping[str, str] | None = None, guard: GuardChecks | None = None,
                  shape_class: ShapeClass | None = None, target: Target | None = None,
                  profile: bool = False) -> Artifact:
    """Compile ``fn`` into a shared library with its header and manifest in ``out_dir``: at its static
    shapes, or once for its whole ``shape_class`` (see :mod:`cuvil.codegen.shape_class`).
    ``threads`` is the library's default thread count (None: the CPUs it may use when it runs);
    ``provenance``: fields embedded in the library besides its function hash (a certificate digest);
    ``guard``: the value checks of a fail-safe policy (listed in the manifest's ``guard``);
    ``target``: the CPU the library is for (default: this machine); ``profile``: time every op of a run
    (:mod:`cuvil.codegen.profile`; the manifest's ``profile.steps`` names them in run order)."""
    from cuvil.version import __version__

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    target = target if target is not None else host_target()
    with compiling_for(target):
        lowered = lower_function(fn, constants, name=name, threads=threads, guard=guard, shape_class=shape_class,
                                 profile=profile)
    p = lowered.prefix
    lib = Path(out_dir) / f"lib{p}{target.library_suffix}"
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "abi_version": abi.ABI_VERSION,
        "cuvil_version": __version__,
        "function": lowered.name,
        "symbol_prefix": p,
        "symbols": entry_symbols(p, shape_class is not None),
        "library": lib.name,
        "header": f"{p}.h",
        "inputs": [s.to_json() for s in lowered.inputs],
        "outputs": [s.to_json() for s in lowered.outputs],
        "arena_bytes": lowered.arena_bytes,
        **({"shape_class": shape_class.to_json()} if shape_class is not None else {}),
        "constants_bytes": lowered.constants_bytes,
        "ops": dict(sorted(collections.Counter(lowered.ops).items())),
        "kernels": list(lowered.kernels),  # per step, in run order: a tuned kernel's name, "rule" or "view"
        "threads": threads if threads is not None else "auto",
        "target": target.to_json(),
        "opt_level": opt_level,
        "function_hash": lowered.function_hash,
        "error_codes": {abi.ERROR_NAMES[c]: c for c in sorted(abi.ERROR_NAMES)},
        **({"guard": guard.to_json(p, lowered.inputs, lowered.outputs)} if guard is not None else {}),
        **({"profile": {"steps": [{"op": op, "kernel": kernel, "type": ty} for op, kernel, ty in
                                  zip(lowered.ops, lowered.kernels, lowered.types, strict=True)]}} if profile else {}),
        **(extra_manifest or {}),
    }
    embed_provenance(lowered.module, p, {"function": lowered.function_hash, **(provenance or {}),
                                         "manifest": manifest_digest(manifest)})
    times["lower_s"] = time.perf_counter() - t0

    tm = target_machine(target, opt_level)
    t0 = time.perf_counter()
    mod = optimize(lowered.module, tm, opt_level)
    times["optimize_s"] = time.perf_counter() - t0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if keep_ir:
        _write_atomic(out / f"{p}.ll", str(mod))
    t0 = time.perf_counter()
    obj = emit_object(mod, tm)
    times["emit_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    link_shared(obj, lib, target, (*manifest["symbols"].values(), f"{p}_provenance"))
    times["link_s"] = time.perf_counter() - t0
    manifest["library_sha256"] = file_sha256(lib)
    manifest["compile_times"] = {k: round(v, 4) for k, v in times.items()}
    text = json.dumps(manifest, indent=2, sort_keys=False)
    manifest_hash = hashlib.sha256(text.encode()).hexdigest()[:16]
    header = out / f"{p}.h"
    _write_atomic(header, render_header(lowered, manifest_hash))
    manifest_path = out / f"{p}.json"
    _write_atomic(manifest_path, text)
    return Artifact(lib, header, manifest_path, manifest)
