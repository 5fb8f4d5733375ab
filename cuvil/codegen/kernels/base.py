"""What every tuned kernel offers the code generator (see :mod:`cuvil.codegen.kernels`)."""

from __future__ import annotations

from typing import Protocol

from llvmlite import ir


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
    """For kernels that read every operand as it is and need no scratch (no packed constants)."""

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
