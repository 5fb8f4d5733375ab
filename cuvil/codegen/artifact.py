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
import re
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
from cuvil.codegen.link import emit_object, host_target, link_shared, optimize, target_machine
from cuvil.codegen.llvm_module import PROVENANCE_PREFIX, embed_provenance, lower_function
from cuvil.codegen.shape_class import ShapeClass, check_shape_class_json
from cuvil.errors import CodegenError, CuvilError
from cuvil.ir.module import Function
from cuvil.ir.symbolic import evaluate_dim, free_symbols, parse_dim
from cuvil.ir.types import check_tensor_size

MANIFEST_FORMAT = "cuvil-artifact"
UNSEALED_FIELDS = frozenset({"library", "header", "library_sha256", "compile_times"})
"""Manifest fields the library cannot vouch for: its own file names and hash, and link times.
Every other field is sealed: the library embeds their digest (``manifest=`` in its provenance)."""
MAX_DIM_TEXT = 2000
"""Longest dim formula a manifest may write (the formulas Cuvil writes are far shorter)."""
PREFIX_PATTERN = re.compile(r"cuvil_[A-Za-z0-9_]{1,64}")


class ManifestError(CodegenError):
    """A manifest that is not one Cuvil wrote: missing or mistyped fields, symbols that are not
    the library's entry points. Nothing is loaded from it."""

    code = "CUVIL-MANIFEST"
    default_hint = "the manifest was damaged or edited; recompile the model to get a matching pair"


@dataclass(frozen=True)
class Artifact:
    library_path: Path
    header_path: Path
    manifest_path: Path
    manifest: dict[str, Any]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_provenance(library: Path) -> dict[str, str] | None:
    """The provenance fields a library embeds (``embed_provenance``), read from its bytes without
    loading it; None when it has none or more than one."""
    data = Path(library).read_bytes()
    at = data.find(PROVENANCE_PREFIX)
    if at < 0 or data.find(PROVENANCE_PREFIX, at + 1) >= 0:
        return None
    end = data.find(b"\0", at)
    text = data[at + len(PROVENANCE_PREFIX):end if end >= 0 else len(data)].decode("ascii", "replace")
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    return fields


class IntegrityError(CodegenError):
    """A library's bytes, or its manifest's sealed fields, differ from what was recorded when it
    was compiled; it is not loaded."""

    code = "CUVIL-INTEGRITY"
    default_hint = "the library or its manifest was modified or replaced after it was compiled; recompile it"


def entry_symbols(prefix: str, shape_class: bool = False) -> dict[str, str]:
    """The four entry points every library exports (``run_dims`` in place of ``run`` for a shape
    class); a loader derives them from the prefix."""
    run = ("run_dims", f"{prefix}_run_dims") if shape_class else ("run", f"{prefix}_run")
    return {"create": f"{prefix}_create", "destroy": f"{prefix}_destroy", run[0]: run[1],
            "run_checked": f"{prefix}_run_checked"}


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The digest of a manifest's sealed fields, as they read back from JSON."""
    sealed = {k: v for k, v in json.loads(json.dumps(manifest)).items() if k not in UNSEALED_FIELDS}
    text = json.dumps(sealed, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_manifest(manifest: Any, library: Path) -> dict[str, Any]:
    """``manifest`` if it has the shape this version writes (types, symbols, tensor specs),
    else a :class:`ManifestError` naming the first field that does not."""
    where = str(library)

    def bad(field: str, why: str) -> ManifestError:
        return ManifestError(f"{library.name}'s manifest: {field} {why}", location=where)

    if not isinstance(manifest, dict):
        raise bad("the document", "is not a JSON object")
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("abi_version") != abi.ABI_VERSION:
        raise ManifestError(f"{library.name}: manifest format {manifest.get('format')!r} / ABI "
                            f"{manifest.get('abi_version')!r} is not {MANIFEST_FORMAT!r} / {abi.ABI_VERSION}",
                            location=where, hint="recompile the model with this version of cuvil")
    for key in ("function", "symbol_prefix", "library", "library_sha256", "function_hash"):
        if not isinstance(manifest.get(key), str):
            raise bad(key, "is missing or not a string")
    prefix = manifest["symbol_prefix"]
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise bad("symbol_prefix", f"{prefix!r} is not a prefix Cuvil generates")
    shape_class = manifest.get("shape_class")
    if manifest.get("symbols") != entry_symbols(prefix, shape_class is not None):
        raise bad("symbols", f"are not the entry points of prefix {prefix!r}")
    if not isinstance(manifest.get("arena_bytes"), int) or manifest["arena_bytes"] < 0:
        raise bad("arena_bytes", "is not a non-negative integer")
    codes = {d.value for d in abi.DTYPE_CODES}
    for side in ("inputs", "outputs"):
        specs = manifest.get(side)
        if not isinstance(specs, list) or (side == "outputs" and not specs):
            raise bad(side, "is not a list of tensors" + (" (a function has at least one output)"
                                                          if side == "outputs" else ""))
        for k, e in enumerate(specs):
            if not (isinstance(e, dict) and isinstance(e.get("name"), str) and e.get("dtype") in codes
                    and isinstance(e.get("shape"), list)
                    and all((isinstance(d, int) and not isinstance(d, bool) and d >= 0)
                            or (shape_class is not None and _symbolic_dim(d, shape_class)) for d in e["shape"])):
                raise bad(f"{side}[{k}]", "is not {name, dtype, shape} with a known dtype and sizes >= 0"
                          + (" or dims of the shape class's symbols" if shape_class is not None else ""))
            try:
                check_tensor_size([d for d in e["shape"] if isinstance(d, int)], f"{side}[{k}]", where)
            except CuvilError as err:
                raise bad(f"{side}[{k}]", err.message) from None
    if shape_class is not None:
        why = check_shape_class_json(shape_class, manifest["inputs"])
        if why is not None:
            raise bad("shape_class", why)
    return manifest


def _symbolic_dim(d: Any, shape_class: Any) -> bool:
    """Whether ``d`` is a dim formula over the shape class's symbols (as the manifest writes it)."""
    if not isinstance(d, str) or len(d) > MAX_DIM_TEXT or not isinstance(shape_class, dict) \
            or not isinstance(shape_class.get("symbols"), list) or not isinstance(shape_class.get("maxima"), dict):
        return False
    try:
        dim = parse_dim(d)
        if not free_symbols(dim) <= set(shape_class["symbols"]):
            return False
        evaluate_dim(dim, shape_class["maxima"])  # a formula that cannot be evaluated (``N // 0``) is refused
    except (CuvilError, ValueError, ArithmeticError, RecursionError, KeyError, TypeError):
        return False
    return True


def manifest_problems(library: Path, manifest: Mapping[str, Any]) -> list[str]:
    """How a library and its (well-formed) manifest disagree: the library's bytes, or a sealed
    field edited after compilation."""
    problems = []
    if manifest.get("library_sha256") != file_sha256(library):
        problems.append(f"{library.name} does not match the library hash recorded in its manifest")
        return problems
    sealed = (read_provenance(library) or {}).get("manifest")
    if sealed != manifest_digest(manifest):
        problems.append(f"the manifest's fields were edited after {library.name} was compiled "
                        f"(sealed digest {sealed}, the manifest gives {manifest_digest(manifest)})")
    return problems


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def build_library(fn: Function, constants: Mapping[str, np.ndarray], out_dir: str | os.PathLike, *,
                  name: str | None = None, opt_level: int = 3, keep_ir: bool = False,
                  extra_manifest: Mapping[str, Any] | None = None, threads: int | None = None,
                  provenance: Mapping[str, str] | None = None, guard: GuardChecks | None = None,
                  shape_class: ShapeClass | None = None) -> Artifact:
    """Compile ``fn`` into a shared library with its header and manifest in ``out_dir``: at its static
    shapes, or once for its whole ``shape_class`` (see :mod:`cuvil.codegen.shape_class`).
    ``threads`` is the library's default thread count (None: the CPUs it may use when it runs);
    ``provenance``: fields embedded in the library besides its function hash (a certificate digest);
    ``guard``: the value checks of a fail-safe policy (listed in the manifest's ``guard``)."""
    from cuvil.version import __version__

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    lowered = lower_function(fn, constants, name=name, threads=threads, guard=guard, shape_class=shape_class)
    target = host_target()
    p = lowered.prefix
    lib = Path(out_dir) / f"lib{p}.so"
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
        "kernels": list(lowered.kernels),  # per step, in run order: a tuned kernel's name or "rule"
        "threads": threads if threads is not None else "auto",
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "opt_level": opt_level,
        "function_hash": lowered.function_hash,
        "error_codes": {abi.ERROR_NAMES[c]: c for c in sorted(abi.ERROR_NAMES)},
        **({"guard": guard.to_json(p, lowered.inputs, lowered.outputs)} if guard is not None else {}),
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
    link_shared(obj, lib)
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
