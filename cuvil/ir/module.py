"""Functions and modules: the units passes transform and codegen compiles."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value, walk


def content_hash(array: np.ndarray) -> str:
    """The key a constant is stored under: dtype, shape and bytes, hashed."""
    arr = np.asarray(array)  # not ascontiguousarray: it turns a scalar into shape (1,)
    h = hashlib.sha256()
    h.update(DType.from_numpy(arr.dtype).value.encode())
    h.update(repr(tuple(arr.shape)).encode())
    h.update(arr.tobytes(order="C"))
    return "k" + h.hexdigest()[:20]


def frozen_array(array: np.ndarray) -> np.ndarray:
    arr = np.array(array, copy=True, order="C")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True)
class Function:
    """One entry block: named parameters in, named results out, constraints on symbols."""

    name: str
    params: tuple[Value, ...]
    results: tuple[Value, ...]
    result_names: tuple[str, ...]
    constraints: tuple[DimConstraint, ...] = ()

    # Values are interned, so the generated __eq__ (tuple equality) compares them by identity.
    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "results", tuple(self.results))
        object.__setattr__(self, "result_names", tuple(self.result_names))
        object.__setattr__(self, "constraints", tuple(self.constraints))

    @property
    def param_types(self) -> tuple[TensorType, ...]:
        return tuple(p.type for p in self.params)

    @property
    def result_types(self) -> tuple[TensorType, ...]:
        return tuple(r.type for r in self.results)

    def values(self) -> list[Value]:
        """All values the function uses, operands before users."""
        return list(walk(list(self.results)))

    def ops(self) -> list[Value]:
        return [v for v in self.values() if not (v.is_param or v.is_const)]

    def users(self) -> dict[Value, list[Value]]:
        """For each used value, the values taking it as an operand, in order (once per operand slot)."""
        users: dict[Value, list[Value]] = {}
        for v in self.values():
            for o in v.operands:
                users.setdefault(o, []).append(v)
        return users

    def constraint(self, symbol: str) -> DimConstraint:
        for c in self.constraints:
            if c.symbol == symbol:
                return c
        return DimConstraint(symbol)

    def symbols(self) -> list[str]:
        seen: list[str] = []
        for p in self.params:
            for s in sorted(p.type.symbols()):
                if s not in seen:
                    seen.append(s)
        return seen



@dataclass(frozen=True, eq=False)
class Module:
    """Functions plus the constant data they refer to, stored once by content hash."""

    functions: tuple[Function, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        used = self.used_constants()
        consts = {k: v if isinstance(v, np.ndarray) and not v.flags.writeable else frozen_array(v)
                  for k, v in self.constants.items() if k in used}
        object.__setattr__(self, "functions", tuple(self.functions))
        object.__setattr__(self, "constants", MappingProxyType(consts))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def used_constants(self) -> set[str]:
        return {v.const_hash for f in self.functions for v in f.values() if v.is_const}

    @property
    def main(self) -> Function:
        return self.function("main") if any(f.name == "main" for f in self.functions) else self.functions[0]

    def function(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        from cuvil.errors import IRError

        raise IRError(f"module has no function @{name}",
                      hint="functions: " + ", ".join(f.name for f in self.functions))

    def constant(self, value: Value) -> np.ndarray:
        return self.constants[value.const_hash]

    def replace(self, functions: Iterable[Function] | None = None,
                constants: Mapping[str, np.ndarray] | None = None) -> Module:
        """A new module; constants merge (old ones stay available to the new functions)."""
        merged = dict(self.constants)
        if constants:
            merged.update(constants)
        return Module(tuple(functions) if functions is not None else self.functions, merged, self.metadata)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Module) and self.functions == other.functions
                and set(self.constants) == set(other.constants))

    def __hash__(self) -> int:
        return hash((self.functions, frozenset(self.constants)))

    def __str__(self) -> str:
        from cuvil.ir.printer import print_module

        return print_module(self)
