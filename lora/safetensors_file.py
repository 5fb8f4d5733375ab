"""A safetensors file read without copying: the header is parsed and checked (dtypes, shapes,
offsets inside the file, no overlaps) and each tensor is a read-only memory map, so checking a
multi-gigabyte adapter costs what the checks read, not the file's size. Never pickle."""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from lora.errors import AdapterError

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # byte offset in the file
    end: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class SafetensorsFile:
    """The tensors of one file, by name, each memory-mapped on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._error("the file is shorter than a safetensors header")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES:
                    raise self._error(f"the header claims {n} bytes, more than the {MAX_HEADER_BYTES} allowed")
                raw = f.read(n)
            size = path.stat().st_size
        except FileNotFoundError:
            raise AdapterError(f"{path.name} is missing", location=str(path.parent)) from None
        except OSError as e:
            raise AdapterError(f"cannot read {path}: {e.strerror}", location=str(path)) from None
        if len(raw) < n:
            raise self._error("the file ends inside its header")
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as e:  # malformed, undecodable, too deep, a number too long
            raise self._error(f"the header is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(header, dict):
            raise self._error("the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise self._error("__metadata__ is not a JSON object")
        self.metadata: dict[str, str] = {str(k): str(v) for k, v in metadata.items()}
        self.data_start = 8 + n
        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, entry in header.items():
            info = self._info(name, entry, size - self.data_start)
            self.tensors[name] = info
            spans.append((info.begin, info.end, name))
        spans.sort()
        for (_, e0, n0), (b1, _, n1) in itertools.pairwise(spans):
            if b1 < e0:
                raise self._error(f"tensors {n0!r} and {n1!r} overlap in the file")

    def _error(self, message: str) -> AdapterError:
        return AdapterError(f"{self.path.name}: {message}", location=str(self.path),
                            hint="the file is damaged or not a safetensors file; save the adapter again")

    def _info(self, name: str, entry: object, data_bytes: int) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._error(f"the entry of {name!r} is not an object")
        dtype = DTYPES.get(str(entry.get("dtype")))
        if dtype is None:
            raise self._error(f"tensor {name!r} has the unsupported dtype {entry.get('dtype')!r}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                 for d in shape):
            raise self._error(f"tensor {name!r} has the malformed shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise self._error(f"tensor {name!r} has data offsets {offsets!r} outside the file's "
                              f"{data_bytes} data bytes")
        info = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
        if info.size * dtype.itemsize != info.end - info.begin:
            raise self._error(f"tensor {name!r} of shape {list(shape)} and dtype {entry['dtype']} needs "
                              f"{info.size * dtype.itemsize} bytes, its offsets span {info.end - info.begin}")
        return info

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only array mapped from the file (nothing is read until it is used)."""
        info = self.tensors[name]
        if info.size == 0:
            return np.zeros(info.shape, info.dtype)
        return np.memmap(self.path, dtype=info.dtype, mode="r", offset=self.data_start + info.begin,
                         shape=info.shape)


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
                      ) -> None:
    """Write ``tensors`` in the safetensors format (for merged weights and for tests)."""
    names = {v: k for k, v in DTYPES.items()}
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        a = np.asarray(arr, order="C")
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for a in arrays:
            f.write(a.tobytes())
