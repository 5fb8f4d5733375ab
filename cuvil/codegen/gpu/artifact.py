"""One function compiled for CUDA: ``lib<prefix>.ptx``, ``<prefix>.consts.safetensors`` and ``<prefix>.json``.

The PTX holds one kernel per op and ends with the provenance comment (function hash, certificate,
manifest digest), as a native library embeds it. The manifest carries what the host needs to run
it: the launch plan (kernel, grid, block, buffers per step), the arena size, which outputs are
filled by a copy, and the constants file with its hash. The PTX is assembled with ``ptxas`` for
every architecture in :data:`SM_TARGETS` when ``ptxas`` is installed; the manifest says which.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.artifact import Artifact
from cuvil.codegen.gpu.ptx import SM_TARGETS, check_ptx, lower_to_ptx, ptxas_path
from cuvil.codegen.manifest import MANIFEST_FORMAT, PROVENANCE_PREFIX, entry_symbols, file_sha256, manifest_digest
from cuvil.codegen.target import Target
from cuvil.ir import hashing
from cuvil.ir.module import Function


def _write(path: Path, data: bytes | str) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(staged, path)


def build_cuda_module(fn: Function, constants: Mapping[str, np.ndarray], out_dir: str | os.PathLike[str], *,
                      target: Target, name: str | None = None, opt_level: int = 3,
                      extra_manifest: Mapping[str, Any] | None = None,
                      provenance: Mapping[str, str] | None = None) -> Artifact:
    from safetensors.numpy import save

    from cuvil.version import __version__

    start = time.perf_counter()
    prefix = abi.symbol_prefix(name or fn.name)
    program = lower_to_ptx(fn, constants, sm=target.cpu)
    lower_s = time.perf_counter() - start
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"lib{prefix}.ptx"
    consts = out / f"{prefix}.consts.safetensors"
    _write(consts, save({h: np.ascontiguousarray(a) for h, a in program.constants.items()}) if program.constants
           else save({"none": np.zeros(1, np.uint8)}))
    checked: dict[str, str] = {}
    start = time.perf_counter()
    for sm in SM_TARGETS if ptxas_path() is not None else ():
        check_ptx(program.ptx, sm)
        checked[sm] = "ptxas ok"
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "abi_version": abi.ABI_VERSION,
        "cuvil_version": __version__,
        "function": fn.name,
        "symbol_prefix": prefix,
        "symbols": entry_symbols(prefix),
        "library": lib.name,
        "inputs": [TensorSpec(p.name, p.dtype, tuple(p.type.shape)).to_json() for p in fn.params],  # type: ignore[arg-type]
        "outputs": [TensorSpec(n, r.dtype, tuple(r.type.shape)).to_json()  # type: ignore[arg-type]
                    for n, r in zip(fn.result_names, fn.results, strict=True)],
        "arena_bytes": program.arena_bytes,
        "ops": {},
        "kernels": [f"cuda.rule.{launch.op}" for launch in program.launches],
        "target": target.to_json(),
        "opt_level": opt_level,  # of the CIR pipeline; the PTX itself is always optimized at LLVM -O3
        "function_hash": hashing.compiled_function_hash(fn, constants),
        "error_codes": {abi.ERROR_NAMES[c]: c for c in sorted(abi.ERROR_NAMES)},
        "cuda": {"launches": [launch.to_json() for launch in program.launches],
                 "copies": [[list(src), r] for src, r in program.copies],
                 "constants": consts.name, "constants_sha256": file_sha256(consts),
                 "ptxas": checked or {"note": "ptxas was not found: the PTX was not assembled"}},
        **(extra_manifest or {}),
    }
    for launch in program.launches:
        manifest["ops"][launch.op] = manifest["ops"].get(launch.op, 0) + 1
    fields = {"function": manifest["function_hash"], **(provenance or {}), "manifest": manifest_digest(manifest)}
    tail = "// " + PROVENANCE_PREFIX.decode() + "".join(f"{k}={v};" for k, v in sorted(fields.items()))
    _write(lib, program.ptx + "\n" + tail)  # the last line: read_provenance reads to the end of the file
    manifest["library_sha256"] = file_sha256(lib)
    manifest["compile_times"] = {"lower_s": round(lower_s, 4), "ptxas_s": round(time.perf_counter() - start, 4)}
    manifest_path = out / f"{prefix}.json"
    _write(manifest_path, json.dumps(manifest, indent=2))
    return Artifact(lib, out / f"{prefix}.h", manifest_path, manifest)
