"""What identifies a build in the artifact cache: the toolchain, the options, the pipeline (with
the sources of plug-in passes), the model file's bytes, and the prober that decides an FP16 build.

Every key is run-to-run stable text: a value with no stable description (an object known only
by its address) makes the request unkeyable, and it is compiled without the cache's alias.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.errors import InputError
from cuvil.interp import to_numpy
from cuvil.passes import parse_pipeline
from cuvil.runtime.cache import ArtifactCache, key_of

CACHE_KEY_FORMAT = 2
OPT_LEVEL_PIPELINES = ("O0", "O1", "O2", "O3")
# a file's stat identity is trusted for its digest only once it is this old (a write in the same
# clock tick as the stat could otherwise go unnoticed)
STAT_SETTLE_S = 2.0
# the key bytes of an ONNX external-data reference (StringStringEntryProto key "location")
_ONNX_EXTERNAL_DATA_MARK = b"\n\x08location"


@functools.cache
def toolchain_fingerprint() -> dict[str, str]:
    """What, besides the model and options, decides the generated code: cuvil's own sources
    (so an edited compiler never reuses stale artifacts), llvmlite/LLVM and the ABI."""
    import llvmlite
    import llvmlite.binding as llvm

    from cuvil.version import __version__

    root = Path(__file__).resolve().parents[1]  # the cuvil package
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
    return {"cuvil": __version__, "sources": h.hexdigest(), "llvmlite": llvmlite.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info)), "abi": str(abi.ABI_VERSION),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


class Unkeyable(Exception):
    """A value with no stable text (an object identified by its address)."""


def stable(obj: Any) -> Any:
    """A JSON-able, run-to-run stable description of an option value."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.ndarray) or (hasattr(obj, "__array__") and not isinstance(obj, (list, tuple, dict))):
        arr = np.ascontiguousarray(to_numpy(obj))
        return {"array": hashlib.sha256(arr.dtype.str.encode() + repr(arr.shape).encode() + arr.tobytes())
                .hexdigest()}
    if isinstance(obj, Mapping):
        return {str(k): stable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [stable(x) for x in obj]
    text = repr(obj)
    if " at 0x" in text:
        raise Unkeyable(text)
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{text}"


def _certifies(gate: Any) -> bool:
    """A gate that records what it checked (the verifier's): its certificate goes into the manifest."""
    return callable(getattr(gate, "mark", None)) and callable(getattr(gate, "report", None))


def callable_key(obj: Any) -> str | None:
    if obj is None:
        return None
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    text = repr(obj)
    qual = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return qual if " at 0x" in text else f"{qual}:{text}"


PLUGIN_SOURCE_FILES = 2000
"""The most source files of a pass plugin's package hashed into the cache key."""


def module_source_digest(obj: Any) -> str | None:
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
        digest = module_source_digest(p)
        out.append(repr(p) if digest is None else f"{p!r}@{digest}")
    return out


def source_digest(model: Any, store: ArtifactCache | None = None) -> str | None:
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
        digest = bytes_digest(path.read_bytes(), path.suffix.lower())
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
    return bytes_digest(data, kind)


def bytes_digest(data: bytes, kind: str) -> str | None:
    if kind not in (".cir", ".pt2") and _ONNX_EXTERNAL_DATA_MARK in data:
        return None  # weights in other files: the file alone does not determine the model
    return hashlib.sha256(kind.encode() + b"\0" + data).hexdigest()


@functools.cache
def prober_digest() -> str:
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
