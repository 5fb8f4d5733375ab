"""The C ABI of a compiled artifact: dtype codes, error codes and the tensor descriptor.

These numbers are part of the artifact format: the generated header, the manifest
and the Python loader all read them from here, so they can never drift apart.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.printer import format_dim
from cuvil.ir.symbolic import Dim, parse_dim
from cuvil.ir.types import TensorType

ABI_VERSION = 1

# dtype codes in `cuvil_tensor.dtype` (stable; never renumber)
DTYPE_CODES: dict[DType, int] = {
    DType.f32: 1, DType.f64: 2, DType.f16: 3, DType.bf16: 4,
    DType.i8: 5, DType.i16: 6, DType.i32: 7, DType.i64: 8,
    DType.u8: 9, DType.u16: 10, DType.u32: 11, DType.u64: 12,
    DType.bool: 13,
    # narrow storage types: one byte per element, the bytes of the ml_dtypes array
    DType.f8e4m3fn: 14, DType.f8e4m3fnuz: 15, DType.f8e5m2: 16, DType.f8e5m2fnuz: 17, DType.f8e8m0: 18,
    DType.f4e2m1: 19, DType.i4: 20, DType.u4: 21, DType.i2: 22, DType.u2: 23,
}

# return codes of the entry points (stable; never renumber)
OK = 0
ERR_NULL = 1  # a null context, tensor array, data or shape pointer
ERR_ARITY = 2  # wrong number of inputs or outputs
ERR_RANK = 3  # a tensor's rank differs from the manifest
ERR_SHAPE = 4  # a tensor's dims differ from the manifest
ERR_DTYPE = 5  # a tensor's dtype code differs from the manifest
ERR_INDEX = 6  # a data-dependent index (gather, ...) was out of range
# the fail-safe guard (a library compiled with a policy; see cuvil.codegen.guard)
ERR_INPUT_BOX = 7  # an input element outside the box the policy's proofs cover
ERR_INPUT_NONFINITE = 8  # an input element is NaN or infinite
ERR_OUTPUT_NONFINITE = 9  # an output element is NaN or infinite (the outputs were written: do not use them)
# a library compiled for a shape class (see cuvil.codegen.shape_class)
ERR_SHAPE_CLASS = 10  # a dim solved from the input shapes is outside the library's shape class
GUARD_CODES = frozenset({ERR_INPUT_BOX, ERR_INPUT_NONFINITE, ERR_OUTPUT_NONFINITE})

ERROR_NAMES: dict[int, str] = {
    OK: "OK", ERR_NULL: "ERR_NULL", ERR_ARITY: "ERR_ARITY", ERR_RANK: "ERR_RANK",
    ERR_SHAPE: "ERR_SHAPE", ERR_DTYPE: "ERR_DTYPE", ERR_INDEX: "ERR_INDEX",
    ERR_INPUT_BOX: "ERR_INPUT_BOX", ERR_INPUT_NONFINITE: "ERR_INPUT_NONFINITE",
    ERR_OUTPUT_NONFINITE: "ERR_OUTPUT_NONFINITE", ERR_SHAPE_CLASS: "ERR_SHAPE_CLASS",
}

ERROR_TEXT: dict[int, str] = {
    ERR_NULL: "a null pointer was passed (context, tensor array, data or shape)",
    ERR_ARITY: "wrong number of inputs or outputs",
    ERR_RANK: "a tensor has the wrong rank",
    ERR_SHAPE: "a tensor has the wrong shape",
    ERR_DTYPE: "a tensor has the wrong dtype",
    ERR_INDEX: "an index read from the input data is out of range",
    ERR_INPUT_BOX: "an input element is outside the box the fail-safe policy was proved for",
    ERR_INPUT_NONFINITE: "an input element is NaN or infinite",
    ERR_OUTPUT_NONFINITE: "an output element is NaN or infinite",
    ERR_SHAPE_CLASS: "a dim of the input shapes is outside the library's shape class",
}

ARENA_ALIGN = 64


COMMENT_NAME_LIMIT = 120


def c_comment(text: str) -> str:
    """``text`` made safe inside a C block comment: no comment end, no line break, no control or
    non-ASCII character, at most ``COMMENT_NAME_LIMIT`` characters (the full name is in the manifest)."""
    safe = "".join(ch if " " <= ch <= "~" else "?" for ch in text).replace("*/", "*?").replace("/*", "/?")
    return safe if len(safe) <= COMMENT_NAME_LIMIT else safe[:COMMENT_NAME_LIMIT] + "..."


SYMBOL_NAME_LIMIT = 48
"""Longer function names are cut and suffixed with a hash, so symbols and the library's file
name stay within what linkers and file systems accept (255 bytes)."""


def symbol_prefix(name: str) -> str:
    """``cuvil_<name>``: the prefix of every exported symbol of one function's library."""
    return f"cuvil_{c_identifier(name, limit=SYMBOL_NAME_LIMIT)}"


def c_identifier(name: str, *, limit: int | None = None) -> str:
    """A C identifier made from ``name`` (anything but ASCII letters, digits and ``_`` becomes ``_``);
    past ``limit`` characters it is cut and ends in 8 hex digits of the full name's hash."""
    out = "".join(ch if (ch.isascii() and ch.isalnum()) or ch == "_" else "_" for ch in name)
    if not out or out[0].isdigit():
        out = "_" + out
    if limit is not None and len(out) > limit:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        out = f"{out[: limit - 9]}_{digest}"
    return out


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a compiled function as the manifest, the header and the loader see it:
    name, dtype and shape (ints, or symbolic dims in a signature before specialization)."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape)

    @property
    def nbytes(self) -> int:
        n = self.dtype.np.itemsize
        for d in self.shape:
            if not isinstance(d, int):
                raise ValueError(f"{self} has a symbolic dim: its size is not known")
            n *= d
        return n

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.value, "dtype_code": DTYPE_CODES[self.dtype],
                "shape": [d if isinstance(d, int) else format_dim(d) for d in self.shape]}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> TensorSpec:
        return cls(str(entry["name"]), DType(entry["dtype"]),
                   tuple(d if isinstance(d, int) else parse_dim(str(d)) for d in entry["shape"]))

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def element_bounds(dt: DType, lo: float, hi: float) -> tuple[float, float] | tuple[int, int] | None:
    """The least and greatest values of ``dt``'s compare type (f64, f32 for every other float type, the
    integer itself) inside ``[lo, hi]``; None when there is none."""
    if dt.is_float:
        ft = np.float64 if dt is DType.f64 else np.float32
        with np.errstate(over="ignore"):
            least, greatest = ft(lo), ft(hi)
        if float(least) < lo:
            least = np.nextafter(least, ft(np.inf))
        if float(greatest) > hi:
            greatest = np.nextafter(greatest, ft(-np.inf))
        return (float(least), float(greatest)) if least <= greatest else None
    first, last = max(math.ceil(lo), int(dt.min_value)), min(math.floor(hi), int(dt.max_value))
    return (first, last) if first <= last else None
