"""Regions: the body of a fused op, a single block of CIR over its own block arguments."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, param, walk


@dataclass(frozen=True)
class Region:
    """Block arguments ``params`` (``param`` values) and the value the block yields.
    A body refers only to its own arguments: constants enter as operands of the fused op."""

    params: tuple[Value, ...]
    result: Value

    @staticmethod
    def arg(index: int, type: TensorType) -> Value:
        return param(f"arg{index}", type)

    def ops(self) -> list[Value]:
        return [v for v in walk([self.result]) if not v.is_param]

    def check(self) -> None:
        own = set(self.params)
        for v in walk([self.result]):
            if v.is_const:
                raise ValueError("a region body may not refer to constants; pass them as operands")
            if v.is_param and v not in own:
                raise ValueError(f"region body refers to %{v.name}, which is not one of its arguments")

    def __str__(self) -> str:
        return f"region({len(self.params)} args, {len(self.ops())} ops)"
