"""Building CIR: every frontend and pass creates values through a Builder, so every
value is checked against its op definition (arity, attributes, shape rule) when made."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.errors import IRError, OpDefinitionError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module, content_hash, frozen_array
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value, param


class Builder:
    """Creates values and collects the constant data they refer to."""

    def __init__(self, constants: Mapping[str, np.ndarray] | None = None) -> None:
        self.constants: dict[str, np.ndarray] = dict(constants or {})

    # leaves ---------------------------------------------------------------------
    def param(self, name: str, dtype: DType, shape: Sequence[Dim]) -> Value:
        return param(name, TensorType(dtype, tuple(shape)))

    def const(self, data: Any, dtype: DType | None = None) -> Value:
        """A constant; ``dtype`` converts python/numpy data (default: the array's own dtype)."""
        arr = np.asarray(data, dtype=dtype.np if dtype is not None else None)
        cir_dtype = DType.from_numpy(arr.dtype)
        key = content_hash(arr)
        if key not in self.constants:
            self.constants[key] = frozen_array(arr)
        return Value("const", (), {"hash": key}, TensorType(cir_dtype, tuple(arr.shape)))

    def scalar(self, value: float | int | bool | np.number, dtype: DType) -> Value:
        return self.const(np.array(value, dtype=dtype.np))

    def data(self, v: Value) -> np.ndarray:
        if not v.is_const:
            raise IRError(f"{v!r} is not a constant")
        return self.constants[v.const_hash]

    # ops ------------------------------------------------------------------------
    def op(self, name: str, *operands: Value, **attrs: Any) -> Value:
        opdef = get_op(name)
        for o in operands:
            if not isinstance(o, Value):
                raise OpDefinitionError(f"operand of {name} is {type(o).__name__}, not a CIR value",
                                        location=name)
        full = opdef.check_attrs(attrs)
        out_type = opdef.infer([o.type for o in operands], full)
        return Value(name, tuple(operands), full, out_type)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        get_op(name)  # raises UnsupportedOpError for an unknown op

        def make(*operands: Value, **attrs: Any) -> Value:
            return self.op(name, *operands, **attrs)

        return make

    # containers -----------------------------------------------------------------
    def function(self, name: str, params: Iterable[Value], results: Iterable[Value],
                 result_names: Iterable[str] | None = None,
                 constraints: Iterable[DimConstraint] = ()) -> Function:
        res = tuple(results)
        names = tuple(result_names) if result_names is not None else tuple(f"out{i}" for i in range(len(res)))
        return Function(name, tuple(params), res, names, tuple(constraints))

    def module(self, *functions: Function, metadata: Mapping[str, str] | None = None) -> Module:
        return Module(tuple(functions), self.constants, metadata or {})
