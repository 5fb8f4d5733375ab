"""What both frontends share about converters: the record of each one (so `cuvil ops` can be
generated, not written), the base of the context a converter sees, and how one is run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from cuvil.errors import CuvilError, IRError, UnsupportedOpError
from cuvil.ir.builder import Builder

CONVERTER_BUGS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, IndexError)
"""Python errors escaping a converter: a bug in it (or a variant it does not handle), not the model's fault."""


@dataclass(frozen=True)
class ConverterEntry:
    """One source op (ONNX op type or aten op) and the CIR ops its converter emits."""

    op_type: str
    domain: str
    fn: Callable[..., Any]
    cir_ops: tuple[str, ...]

    def run(self, ctx: ConverterCtx[Any], bugs: tuple[type[Exception], ...] = CONVERTER_BUGS) -> Any:
        """The converter's result; its errors carry the node's location, and ``bugs`` become IRErrors."""
        where = ctx.location
        try:
            return self.fn(ctx)
        except CuvilError as e:
            if e.location is None:
                e.location = where
            elif where not in e.location:
                e.location = f"{where}: {e.location}"
            raise
        except bugs as e:
            raise IRError(f"converting {ctx.op_name} failed: {type(e).__name__}: {e}", location=where,
                          hint="this is a bug in the converter or an unsupported variant of the op") from e


class HasBuilder(Protocol):
    """A frontend driver: converters build through its Builder."""

    b: Builder


ImporterT = TypeVar("ImporterT", bound=HasBuilder)


class ConverterCtx(Generic[ImporterT]):
    """What every converter sees: the driver's services, the source node, the builder, and errors
    that name the node."""

    def __init__(self, imp: ImporterT, node: Any) -> None:
        self.imp = imp
        self.node = node
        self.b: Builder = imp.b

    @property
    def node_name(self) -> str:
        raise NotImplementedError

    @property
    def op_name(self) -> str:
        raise NotImplementedError

    @property
    def location(self) -> str:
        return f"node {self.node_name} ({self.op_name})"

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.op_name}: {what}", location=self.location)
