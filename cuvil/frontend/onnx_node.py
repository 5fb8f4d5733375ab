"""What an ONNX converter sees: the node context, the converter registry, ONNX element types.

Converters (``cuvil/frontend/onnx_ops``) depend on this module only; the driver
(``onnx_import``) hands each node to them through :class:`Importer`'s few services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import numpy as np
import onnx

from cuvil.errors import (
    AttributeTypeError,
    UnsupportedOpError,
)
from cuvil.frontend.registry import ConverterCtx, ConverterEntry
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.rules import HALF_DTYPES
from cuvil.ir.values import Value


@dataclass(frozen=True)
class SeqValue:
    """An ONNX sequence whose length is known at import: its tensors, in order. CIR has no
    sequence type: a sequence lives only while a model is imported, as the list of its elements
    (a sequence graph input or output becomes one parameter or result per element)."""

    elems: tuple[Value, ...]
    dtype: DType
    """The element type (an empty sequence has one too)."""


@dataclass(frozen=True)
class OptValue:
    """An ONNX optional, decided at import: its content, or None when it is empty."""

    content: Value | SeqValue | None


Entity = Value | SeqValue | OptValue
"""What an ONNX name denotes while a model is imported: a tensor, a sequence or an optional."""


class Importer(Protocol):
    """The services of the import driver a converter may call."""

    b: Builder

    def opset_for(self, domain: str) -> int: ...

    def tensor_to_numpy(self, t: onnx.TensorProto, where: str) -> np.ndarray: ...

    def static_value(self, v: Value, where: str) -> np.ndarray: ...

    def import_subgraph(self, graph: onnx.GraphProto, inputs: Sequence[Entity] = ()) -> list[Any]: ...

    def charge_unroll(self, steps: int, location: str) -> None: ...

    def expect_unroll(self, steps: int, location: str) -> None: ...

    def scope_values(self) -> set[Value]: ...

    def limit_dim(self, symbol: str, hi: int) -> None: ...


ONNX_DTYPES: dict[int, DType] = {
    onnx.TensorProto.FLOAT: DType.f32, onnx.TensorProto.DOUBLE: DType.f64, onnx.TensorProto.FLOAT16: DType.f16,
    onnx.TensorProto.BFLOAT16: DType.bf16, onnx.TensorProto.INT64: DType.i64, onnx.TensorProto.INT32: DType.i32,
    onnx.TensorProto.INT16: DType.i16, onnx.TensorProto.INT8: DType.i8, onnx.TensorProto.UINT64: DType.u64,
    onnx.TensorProto.UINT32: DType.u32, onnx.TensorProto.UINT16: DType.u16, onnx.TensorProto.UINT8: DType.u8,
    onnx.TensorProto.BOOL: DType.bool,
    onnx.TensorProto.FLOAT8E4M3FN: DType.f8e4m3fn, onnx.TensorProto.FLOAT8E4M3FNUZ: DType.f8e4m3fnuz,
    onnx.TensorProto.FLOAT8E5M2: DType.f8e5m2, onnx.TensorProto.FLOAT8E5M2FNUZ: DType.f8e5m2fnuz,
    onnx.TensorProto.FLOAT8E8M0: DType.f8e8m0, onnx.TensorProto.FLOAT4E2M1: DType.f4e2m1,
    onnx.TensorProto.INT4: DType.i4, onnx.TensorProto.UINT4: DType.u4,
    onnx.TensorProto.INT2: DType.i2, onnx.TensorProto.UINT2: DType.u2,
}


def onnx_dtype(code: int, where: str) -> DType:
    try:
        return ONNX_DTYPES[code]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else code
        raise UnsupportedOpError(f"element type {name} is not supported", location=where,
                                 hint="supported: " + ", ".join(d.value for d in DType)) from None


# --------------------------------------------------------------------------------------
# converter registry

Converter = Callable[["NodeCtx"], "Entity | Sequence[Entity | None]"]

CONVERTERS: dict[tuple[str, str], ConverterEntry] = {}


def onnx_op(*op_types: str, domain: str = "",
            emits: Sequence[str] | Mapping[str, str | Sequence[str]] = ()) -> Callable[[Converter], Converter]:
    """Register a converter for one or more ONNX op types. ``emits`` names the CIR ops it builds:
    one list for all the types, or a mapping from op type to its own CIR op(s)."""

    def deco(fn: Converter) -> Converter:
        for t in op_types:
            key = (domain, t)
            if key in CONVERTERS:
                raise RuntimeError(f"ONNX converter for {domain or 'ai.onnx'}::{t} registered twice")
            own = emits.get(t, ()) if isinstance(emits, Mapping) else emits
            CONVERTERS[key] = ConverterEntry(t, domain, fn, (own,) if isinstance(own, str) else tuple(own))
        return fn

    return deco


def converters() -> dict[tuple[str, str], ConverterEntry]:
    """Every registered converter (the families register when ``cuvil.frontend.onnx_ops`` is imported)."""
    return CONVERTERS


HALF = HALF_DTYPES


def in_f32(b: Builder, x: Value, compute: Callable[[Value], Value]) -> Value:
    """``compute(x)``, with a float16/bfloat16 ``x`` widened to f32 and the result rounded once, as ONNX
    Runtime runs its reductions and normalizations (a half sum of squares overflows long before its norm)."""
    if x.dtype not in HALF:
        return compute(x)
    return b.cast(compute(b.cast(x, to=DType.f32)), to=x.dtype)


class StaticInputRequired(UnsupportedOpError):
    """A converter needs the value of a graph input (e.g. a Reshape shape fed as input)."""

    code = "CUVIL-DYNAMIC-INPUT"

    def __init__(self, param_name: str, location: str) -> None:
        self.param_name = param_name
        super().__init__(f"input {param_name!r} is used where a compile-time value is required",
                         location=location,
                         hint="make it an initializer, or pass its value via static_inputs=")


class SymbolicValueRequired(UnsupportedOpError):
    """A compile-time value (a Reshape target, a Range bound, a comparison deciding one) depends
    on the run-time size of a symbolic dim, as ``N == 1`` does."""

    code = "CUVIL-DYNAMIC-INPUT"

    def __init__(self, what: str, location: str) -> None:
        super().__init__(f"{what} depends on the run-time value of symbolic dims, but it is needed at "
                         "compile time", location=location,
                         hint="give the inputs concrete sizes for these dims (dim_value instead of "
                              "dim_param), or export the model with static shapes")


# --------------------------------------------------------------------------------------
# node context


_MISSING: Any = object()


class NodeCtx(ConverterCtx[Importer]):
    """What a converter sees: the node, its CIR inputs, typed attribute access, the builder."""

    node: onnx.NodeProto

    def __init__(self, imp: Importer, node: onnx.NodeProto, inputs: list[Entity | None]) -> None:
        super().__init__(imp, node)
        self.inputs = inputs
        self.opset = imp.opset_for(node.domain)
        self._attrs = {a.name: a for a in node.attribute}

    @property
    def node_name(self) -> str:
        return self.node.name or "<unnamed>"

    @property
    def op_name(self) -> str:
        return self.node.op_type

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def input(self, i: int) -> Value:
        """Input ``i``, a tensor (a sequence or optional there is refused with the reason)."""
        v = self.entity(i)
        if not isinstance(v, Value):
            kind = "a sequence" if isinstance(v, SeqValue) else "an optional"
            raise self.unsupported(f"input {i} is {kind}, where a tensor is required")
        return v

    def entity(self, i: int) -> Entity:
        """Input ``i`` as it is: a tensor, a sequence or an optional."""
        if not self.has_input(i):
            raise AttributeTypeError(f"input {i} is required", location=self.location)
        v = self.inputs[i]
        assert v is not None
        return v

    def sequence(self, i: int) -> SeqValue:
        """Input ``i``, which must be a sequence."""
        v = self.entity(i)
        if not isinstance(v, SeqValue):
            raise self.unsupported(f"input {i} must be a sequence")
        return v

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        """The attribute as a python value (ints, floats, strings, lists, tensors as numpy)."""
        a = self._attrs.get(name)
        if a is None:
            if default is _MISSING:
                raise AttributeTypeError(f"required attribute {name!r} is missing", location=self.location)
            return default
        if a.ref_attr_name:
            raise UnsupportedOpError("attribute references (functions) are not supported", location=self.location)
        t = a.type
        A = onnx.AttributeProto
        if t == A.INT:
            return int(a.i)
        if t == A.FLOAT:
            return float(a.f)
        if t == A.STRING:
            return a.s.decode("utf-8", errors="replace")
        if t == A.INTS:
            return [int(x) for x in a.ints]
        if t == A.FLOATS:
            return [float(x) for x in a.floats]
        if t == A.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in a.strings]
        if t == A.TENSOR:
            return self.imp.tensor_to_numpy(a.t, self.location)
        if t == A.GRAPH:
            return a.g
        raise AttributeTypeError(f"attribute {name!r} has unsupported type "
                                 f"{A.AttributeType.Name(t)}", location=self.location)

    def _typed(self, name: str, default: Any, check: Callable[[Any], bool], what: str) -> Any:
        v = self.attr(name, default)
        if v is default and default is not _MISSING:
            return v
        if not check(v):
            raise AttributeTypeError(f"attribute {name!r} must be {what}, got {type(v).__name__} {v!r}",
                                     location=self.location)
        return v

    def attr_int(self, name: str, default: Any = _MISSING) -> int:
        return self._typed(name, default, lambda v: isinstance(v, int), "an int")

    @overload
    def attr_float(self, name: str, default: float = ...) -> float: ...

    @overload
    def attr_float(self, name: str, default: None) -> float | None: ...

    def attr_float(self, name: str, default: Any = _MISSING) -> float | None:
        """A float attribute, or its default as the float32 an ONNX attribute holds (ONNX Runtime reads a
        float64 LeakyRelu's default alpha as 0.01f, as it reads a written one)."""
        v = self._typed(name, default, lambda v: isinstance(v, (int, float)), "a float")
        return float(np.float32(v)) if v is not None else v

    def attr_str(self, name: str, default: Any = _MISSING) -> str:
        return self._typed(name, default, lambda v: isinstance(v, str), "a string")

    def attr_ints(self, name: str, default: Any = _MISSING) -> list[int]:
        return self._typed(name, default, lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v),
                           "a list of ints")

    def attr_floats(self, name: str, default: Any = _MISSING) -> list[float]:
        return self._typed(name, default,
                           lambda v: isinstance(v, list) and all(isinstance(x, (int, float)) for x in v),
                           "a list of floats")

    def static(self, i: int) -> np.ndarray:
        """The compile-time value of input ``i``: a constant, or derived from shapes.
        Elements may be symbolic dims (object array) when derived from a symbolic shape."""
        return self.imp.static_value(self.input(i), self.location)

