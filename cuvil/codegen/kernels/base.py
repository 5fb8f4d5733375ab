"""What every tuned kernel offers the code generator (see :mod:`cuvil.codegen.kernels`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from llvmlite import ir

if TYPE_CHECKING:
    from cuvil.ir.values import Value


class Kernel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def unused_operands(self) -> frozenset[int]: ...

    @property
    def scratch_bytes(self) -> int: ...

    @property
    def constant_bytes(self) -> int: ...

    def emit(self, mod: ir.Module, name: str) -> ir.Function: ...


class ReadsEveryOperand:
    """For kernels that read every operand as it is (no packed constants) and, unless they say otherwise, need no
    scratch."""

    @property
    def unused_operands(self) -> frozenset[int]:
        return frozenset()

    @property
    def scratch_bytes(self) -> int:
        return 0


def operand_data(kernel: Kernel, mod: ir.Module, name: str) -> dict[int, ir.GlobalVariable]:
    """The constants the call of ``kernel``'s function ``name`` passes in operand slots in place of the raw
    operands (packed weights, kept out of the kernel's code so that kernels differing only in them share it)."""
    data = getattr(kernel, "operand_data", None)
    return {} if data is None else data(mod, name)


def operand_args(operands: Sequence[Value], kernel: Kernel | None, data: Mapping[int, ir.GlobalVariable],
                 pointer: Callable[[Value], ir.Value]) -> list[ir.Value]:
    """The operand arguments of a call of a step's kernel (``kernel`` None: its rule's loop nest): the data the
    kernel takes in a slot (:func:`operand_data`), null for an operand it never reads, else the operand's
    pointer."""
    unused = kernel.unused_operands if kernel is not None else frozenset()
    return [data[j] if j in data else ir.Constant(ir.PointerType(), None) if j in unused else pointer(o)
            for j, o in enumerate(operands)]


class RunsInner:
    """For kernels that run another, ``inner``, in a context or between conversions: what they do not
    change about it (the operands it leaves unread, its constants, its scratch, the data passed in its operand
    slots) is ``inner``'s."""

    inner: Kernel

    def inner_name(self, name: str) -> str:
        """The name the inner kernel's function is emitted under."""
        return name

    def operand_data(self, mod: ir.Module, name: str) -> dict[int, ir.GlobalVariable]:
        return operand_data(self.inner, mod, self.inner_name(name))

    @property
    def unused_operands(self) -> frozenset[int]:
        return self.inner.unused_operands

    @property
    def constant_bytes(self) -> int:
        return self.inner.constant_bytes

    @property
    def scratch_bytes(self) -> int:
        return self.inner.scratch_bytes
