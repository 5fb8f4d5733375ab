"""The base an adapter was made for, by content: a digest of each targeted base weight, recorded in
the adapter's own safetensors metadata (``cuvil lora stamp``; PEFT keeps the key and ignores it)
and compared by ``cuvil lora check`` whenever the adapter carries it. Names and revisions can
lie or drift; the numbers an adapter adds to cannot.

A digest is over the weight's values (as float64, exact for every float type a base is stored
in) and its shape, so the same numbers stored in bf16 or float32 hash the same."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from lora.adapter import WEIGHTS_FILE, Adapter
from lora.base import BaseModel
from lora.errors import AdapterError
from lora.merged import to_float64
from lora.safetensors_file import SafetensorsFile, write_safetensors

RECORD_KEY = "cuvil.base_tensors"
BLOCK_ROWS = 1024


def tensor_digest(weight: np.ndarray) -> str:
    """``sha256:<hex>`` of the shape and the float64 values, read a block of rows at a time."""
    h = hashlib.sha256(repr(tuple(int(d) for d in weight.shape)).encode())
    rows = weight.reshape(weight.shape[0], -1) if weight.ndim > 1 else weight.reshape(1, -1)
    for start in range(0, rows.shape[0], BLOCK_ROWS):
        h.update(np.ascontiguousarray(to_float64(rows[start:start + BLOCK_ROWS])).tobytes())
    return "sha256:" + h.hexdigest()


def recorded(adapter: Adapter) -> dict[str, str]:
    """The digests the adapter records, by module (empty when it records none)."""
    raw = adapter.file.metadata.get(RECORD_KEY)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise AdapterError(f"the metadata {RECORD_KEY!r} is not JSON: {e.msg}",
                           location=str(adapter.file.path)) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.startswith("sha256:")
                                             for k, v in data.items()):
        raise AdapterError(f"the metadata {RECORD_KEY!r} is not a map of module names to sha256 digests",
                           location=str(adapter.file.path))
    return data


def stamp(directory: str | Path, base: BaseModel) -> dict[str, str]:
    """Record in the adapter's weights file the digest of every base weight it adapts; the file is
    rewritten whole (tensors unchanged) and replaced atomically."""
    adapter = Adapter(directory)
    missing = [m.module for m in adapter.lora_modules if m.module not in base.modules]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise AdapterError(f"the base has no module {missing[0]!r}{more}", location=str(adapter.directory),
                           hint="stamp an adapter with the base it was trained on; `cuvil lora check` says what "
                                "does not fit")
    digests = {m.module: tensor_digest(base.modules[m.module].weight) for m in adapter.lora_modules}
    path = adapter.directory / WEIGHTS_FILE
    source = SafetensorsFile(path)
    tensors = {k: np.asarray(source.array(k)) for k in source}
    metadata = {**source.metadata, RECORD_KEY: json.dumps(digests, sort_keys=True)}
    tmp = path.with_name(path.name + ".stamping")
    write_safetensors(tmp, tensors, metadata)
    os.replace(tmp, path)
    return digests
