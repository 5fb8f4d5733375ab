"""Tensor types (dtype + possibly symbolic shape) and constraints on symbols."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cuvil.errors import BudgetError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, Sym, evaluate_dim, free_symbols, normalize_dim

MAX_TENSOR_ELEMENTS = 2**40
"""The most elements one tensor may have (4 TiB of f32): beyond any real tensor, and small
enough that byte sizes and flat indices never overflow 64 bits."""


def check_tensor_size(shape: Iterable[int], what: str, location: str) -> None:
    """Refuse a concrete shape past :data:`MAX_TENSOR_ELEMENTS` (or with a negative dim) before
    anything is allocated or any size is computed in 64-bit arithmetic."""
    dims = [int(d) for d in shape]
    n = 1
    for d in dims:
        n *= d
    if any(d < 0 for d in dims) or n > MAX_TENSOR_ELEMENTS:
        raise BudgetError(f"{what} would have the shape {dims}: {n} elements, more than 2**40",
                          location=location,
                          hint="check the model's shapes and any --shape given; no tensor may exceed 2**40 elements")


@dataclass(frozen=True)
class TensorType:
    """``dtype[d0, d1, ...]``: each dim an int or a symbolic expression."""

    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(normalize_dim(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for d in self.shape:
            out |= free_symbols(d)
        return out

    def concrete(self, env: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(evaluate_dim(d, env) for d in self.shape)

    def numel(self) -> Dim:
        n: Dim = 1
        for d in self.shape:
            n = n * d
        return n

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def with_shape(self, shape: Iterable[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


class Typed:
    """Something with a tensor ``type`` (a CIR value, an operand as a rule sees it): its shape,
    dtype and rank read through to the type."""

    __slots__ = ()
    type: TensorType

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank


@dataclass(frozen=True)
class DimConstraint:
    """The values a symbol may take: ``lo <= sym <= hi`` and ``sym % multiple_of == 0``."""

    symbol: str
    lo: int = 1
    hi: int | None = None
    multiple_of: int = 1

    def admits(self, value: int) -> bool:
        if value < self.lo:
            return False
        if self.hi is not None and value > self.hi:
            return False
        return value % self.multiple_of == 0

    def __str__(self) -> str:
        text = f"{self.lo} <= {self.symbol}"
        if self.hi is not None:
            text += f" <= {self.hi}"
        if self.multiple_of != 1:
            text += f", {self.symbol} % {self.multiple_of} == 0"
        return text


def bind_symbols(types: Iterable[TensorType], shapes: Iterable[tuple[int, ...]]) -> dict[str, int]:
    """Solve symbol values from concrete shapes: plain symbols first, then check the rest.

    Raises ``ValueError`` with a readable message on rank/dim mismatch.
    """
    pairs = list(zip(types, shapes, strict=True))
    env: dict[str, int] = {}
    for t, shape in pairs:
        if len(shape) != t.rank:
            raise ValueError(f"expected rank {t.rank} ({t}), got shape {tuple(shape)}")
        for d, v in zip(t.shape, shape, strict=True):
            if isinstance(d, Sym) and len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1 \
                    and isinstance(d.terms[0][0][0], str):
                name = d.terms[0][0][0]
                if name in env and env[name] != v:
                    raise ValueError(f"symbol {name} is {env[name]} in one input and {v} in another")
                env[name] = int(v)
    for t, shape in pairs:
        for i, (d, v) in enumerate(zip(t.shape, shape, strict=True)):
            try:
                expect = evaluate_dim(d, env)
            except KeyError as e:
                raise ValueError(f"dim {d} cannot be solved from the input shapes (symbol {e})") from None
            if expect != v:
                raise ValueError(f"dim {i} of {t} must be {expect}, got {v}")
    return env
