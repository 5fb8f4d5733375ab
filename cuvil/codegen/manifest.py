"""What a compiled library's manifest must hold, and how a loader checks a library against it.

Kept apart from the code generator (:mod:`cuvil.codegen.artifact` writes the files): a process that
only loads and runs compiled libraries (:mod:`cuvil.runtime`) reads this module and never imports
LLVM.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cuvil.codegen import abi
from cuvil.codegen.shape_class import check_shape_class_json
from cuvil.errors import CodegenError, CuvilError
from cuvil.ir.symbolic import evaluate_dim, free_symbols, parse_dim
from cuvil.ir.types import check_tensor_size

PROVENANCE_PREFIX = b"cuvil-provenance;"
"""How the provenance string a library embeds begins (its fields follow as ``key=value;``)."""

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


def profile_symbol(prefix: str) -> str:
    """The profile reader a library compiled with ``profile=True`` exports (:mod:`cuvil.codegen.profile`);
    a loader derives it from the prefix, as the entry points."""
    return f"{prefix}_profile"


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
