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
