"""Immutable, hash-consed SSA values.

A :class:`Value` is an op applied to operand values with attributes and a
result type. Building the same value twice returns the same object, so
structural equality is identity and common subexpressions are shared for free.
Parameters (``param``) and constants (``const``, referring to module data by
content hash) are values too.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Sym
from cuvil.ir.types import TensorType, Typed

AttrValue = Any  # int | float | bool | str | DType | Dim | None | tuple[AttrValue, ...] | Region


def attr_key(v: AttrValue) -> object:
    """A hashable key that tells apart what Python's ``==`` merges (1 / True / 1.0, 0.0 / -0.0, NaN)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", "nan" if math.isnan(v) else v.hex())
    if isinstance(v, tuple):
        return ("t", tuple(attr_key(x) for x in v))
    if isinstance(v, (str, DType, Sym)) or v is None:
        return (type(v).__name__, v)
    return ("o", v)


def normalize_attr(v: AttrValue) -> AttrValue:
    if isinstance(v, list):
        return tuple(normalize_attr(x) for x in v)
    if isinstance(v, tuple):
        return tuple(normalize_attr(x) for x in v)
    if hasattr(v, "item") and not isinstance(v, (DType, Sym)):  # numpy scalars
        return v.item()
    if isinstance(v, Sym):
        return v.simplify()
    return v


class Value(Typed):
    """One SSA value: ``op(operands...) {attrs} : type``. Immutable and interned."""

    __slots__ = ("__weakref__", "_key", "attrs", "op", "operands", "type")
    _table: ClassVar[weakref.WeakValueDictionary[object, Value]] = weakref.WeakValueDictionary()

    op: str
    operands: tuple[Value, ...]
    attrs: tuple[tuple[str, AttrValue], ...]
    type: TensorType

    def __new__(cls, op: str, operands: tuple[Value, ...], attrs: Mapping[str, AttrValue],
                type: TensorType) -> Value:
        norm = tuple(sorted((k, normalize_attr(v)) for k, v in attrs.items()))
        key = (op, tuple(id(o) for o in operands), tuple((k, attr_key(v)) for k, v in norm), type)
        found = cls._table.get(key)
        if found is not None:
            return found
        self = object.__new__(cls)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "operands", tuple(operands))
        object.__setattr__(self, "attrs", norm)
        object.__setattr__(self, "type", type)
        # the operands are held by `self`, so their ids stay unique while the key lives
        object.__setattr__(self, "_key", key)
        cls._table[key] = self
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CIR values are immutable")

    def __reduce__(self) -> object:
        raise TypeError("CIR values are not picklable; print the module to .cir instead")

    # accessors ------------------------------------------------------------------
    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def is_param(self) -> bool:
        return self.op == "param"

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def name(self) -> str:
        """The parameter name of a ``param`` value."""
        return str(self.attr("name"))

    @property
    def const_hash(self) -> str:
        return str(self.attr("hash"))

    def operand(self, name: str) -> Value:
        """The operand the op's definition calls ``name`` (e.g. ``v.operand("lhs")``)."""
        from cuvil.ir.opdef import get_op

        return self.operands[get_op(self.op).operand_index(name, len(self.operands))]

    def __repr__(self) -> str:
        if self.is_param:
            return f"<param %{self.name}: {self.type}>"
        if self.is_const:
            return f"<const @{self.const_hash}: {self.type}>"
        return f"<{self.op}/{len(self.operands)}: {self.type}>"


def param(name: str, type: TensorType) -> Value:
    return Value("param", (), {"name": name}, type)


def reachable(roots: Iterable[Value], step: Callable[[Value], Iterable[Value]]) -> list[Value]:
    """Every value reachable from ``roots``, each once, in the depth-first order they are first met.
    ``step(v)`` gives the values to go on to from ``v`` (none: the walk stops there); it is called
    once per value reached, so it may also record what it sees."""
    seen: set[Value] = set()
    order: list[Value] = []
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        order.append(v)
        stack.extend(step(v))
    return order


def walk(roots: tuple[Value, ...] | list[Value]) -> Iterator[Value]:
    """Yield every value reachable from ``roots`` once, operands before users."""
    seen: set[int] = set()
    stack: list[tuple[Value, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            yield v
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack.append((v, True))
        for o in reversed(v.operands):
            if id(o) not in seen:
                stack.append((o, False))
