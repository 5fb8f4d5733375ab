"""What an aten converter sees: the node context, the converter registry, torch element types.

Converters (``cuvil/frontend/torch_ops``) depend on this module only; the driver
(``torch_import``) hands each node to them through :class:`Importer`'s few services.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cuvil.arrays import from_torch
from cuvil.errors import IRError, UnsupportedOpError
from cuvil.frontend.registry import ConverterCtx, ConverterEntry
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value

try:  # torch is an optional dependency: importing this module without it must fail politely
    import torch
except ImportError:  # pragma: no cover - exercised only where torch is absent
    torch = None

INT64_MAX = 2**63 - 1

# --------------------------------------------------------------------------------------
# dtypes


def _torch_dtypes() -> dict[Any, DType]:
    assert torch is not None, "converters run only under the torch importer, which needs torch"
    return {
        torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
        torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
        torch.uint8: DType.u8, torch.uint16: DType.u16, torch.uint32: DType.u32, torch.uint64: DType.u64,
        torch.bool: DType.bool,
    }


def cir_dtype(dtype: Any, where: str = "") -> DType:
    """The CIR element type of a torch dtype."""
    found = _torch_dtypes().get(dtype)
    if found is None:
        raise UnsupportedOpError(f"torch dtype {dtype} is not supported", location=where or None,
                                 hint="supported: " + ", ".join(d.value for d in DType))
    return found


def torch_dtype(dtype: DType) -> Any:
    """The torch dtype of a CIR element type."""
    for t, d in _torch_dtypes().items():
        if d is dtype:
            return t
    raise KeyError(dtype)


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A real (not fake) tensor as a numpy array; bf16 keeps its bits via ml_dtypes."""
    return from_torch(t, "a constant")


# --------------------------------------------------------------------------------------
# converter registry

AtenConverter = Callable[["AtenCtx"], Any]

CONVERTERS: dict[str, ConverterEntry] = {}


def aten_op(*names: str, emits: Sequence[str] = ()) -> Callable[[AtenConverter], AtenConverter]:
    """Register a converter for aten overloads (``"convolution.default"`` or ``"aten.convolution.default"``);
    ``emits`` names the CIR ops it may build (for ``cuvil ops``)."""

    def deco(fn: AtenConverter) -> AtenConverter:
        for n in names:
            key = n if n.startswith("aten.") else f"aten.{n}"
            if key in CONVERTERS:
                raise RuntimeError(f"aten converter for {key} registered twice")
            CONVERTERS[key] = ConverterEntry(key, "aten", fn, tuple(emits))
        return fn

    return deco


@dataclass(frozen=True)
class Unavailable:
    """A node whose value Cuvil cannot represent; an error only if something uses it."""

    reason: str


class Importer(Protocol):
    """The services of the import driver a converter may call."""

    b: Builder

    def dims(self, shape: Sequence[Any], where: str) -> tuple[Dim, ...]: ...

    def as_value(self, x: Any, dtype: DType | None, where: str) -> Value: ...

    def promote(self, xs: Sequence[Any], where: str) -> DType: ...


# --------------------------------------------------------------------------------------
# node context


class AtenCtx(ConverterCtx[Importer]):
    """What a converter sees: the node, its arguments by schema name (CIR values, dims,
    python scalars), the node's output metadata, and the builder."""

    def __init__(self, imp: Importer, node: Any, args: dict[str, Any]) -> None:
        super().__init__(imp, node)
        self.args = args

    @property
    def node_name(self) -> str:
        return str(self.node.name)

    @property
    def op_name(self) -> str:
        return str(self.node.target)

    def __getitem__(self, name: str) -> Any:
        if name not in self.args:
            raise IRError(f"{self.op_name} has no argument {name!r}", location=self.location)
        return self.args[name]

    def get(self, name: str, default: Any = None) -> Any:
        v = self.args.get(name, default)
        return default if v is None else v

    def arg_names(self) -> list[str]:
        return list(self.args)

    # output metadata ---------------------------------------------------------
    @property
    def meta(self) -> Any:
        return self.node.meta.get("val")

    def _meta_at(self, k: int | None) -> Any:
        m = self.meta
        if k is not None:
            m = m[k]
        if m is None or not hasattr(m, "dtype"):
            raise IRError(f"{self.op_name}: no tensor metadata for output {k}", location=self.location)
        return m

    def out_dtype(self, k: int | None = None) -> DType:
        return cir_dtype(self._meta_at(k).dtype, self.location)

    def out_shape(self, k: int | None = None) -> tuple[Dim, ...]:
        return self.imp.dims(self._meta_at(k).shape, self.location)

    # operands ----------------------------------------------------------------
    def tensor(self, name: str, dtype: DType | None = None) -> Value:
        """Argument ``name`` as a CIR value, converted to ``dtype`` (python scalars become constants)."""
        return self.imp.as_value(self[name], dtype, self.location)

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.dtype is dtype else self.b.cast(v, to=dtype)

    def promote(self, *xs: Any) -> DType:
        """torch's type promotion over tensors (CIR values) and python scalars."""
        return self.imp.promote(xs, self.location)
