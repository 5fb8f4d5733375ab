"""Cuvil: an inference compiler whose optimizations are proved.

Public entry points: :func:`import_model` (ONNX / torch -> CIR),
:func:`run_reference` (the reference interpreter), :func:`compile` (a native
library and a callable over it), :class:`CuvilError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError
from cuvil.log import set_log_level
from cuvil.version import __version__

if TYPE_CHECKING:
    from cuvil.compiler import compile
    from cuvil.frontend.dispatch import import_model
    from cuvil.interp import run_reference

_LAZY = {"compile": "cuvil.compiler", "import_model": "cuvil.frontend.dispatch", "run_reference": "cuvil.interp"}
"""Imported on first use: a process that only loads and runs a compiled library (cuvil.runtime) never
imports the compiler, LLVM or the frontends."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cuvil' has no attribute {name!r}")


__all__ = ["CuvilError", "__version__", "compile", "import_model", "run_reference", "set_log_level"]
