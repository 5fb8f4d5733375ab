"""What frontends record about each converter, so `cuvil ops` can be generated, not written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConverterEntry:
    """One source op (ONNX op type or aten op) and the CIR ops its converter emits."""

    op_type: str
    domain: str
    fn: Callable[..., Any]
    cir_ops: tuple[str, ...]
