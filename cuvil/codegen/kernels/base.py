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


class RunsInner:
    """For kernels that run another, ``inner``, in a context or between conversions: what they do not
    change about it (the operands it leaves unread, its constants, its scratch) is ``inner``'s."""

    inner: Kernel

    @property
    def unused_operands(self) -> frozenset[int]:
        return self.inner.unused_operands

    @property
    def constant_bytes(self) -> int:
        return self.inner.constant_bytes

    @property
    def scratch_bytes(self) -> int:
        return self.inner.scratch_bytes
