"""Cuvil: an inference compiler whose optimizations are proved.

Public entry points: :func:`import_model` (ONNX / torch -> CIR),
:func:`run_reference` (the reference interpreter), :func:`compile` (a native
library and a callable over it), :class:`CuvilError`.
"""

from cuvil.compiler import compile
from cuvil.errors import CuvilError
from cuvil.frontend.dispatch import import_model
from cuvil.interp import run_reference
from cuvil.log import set_log_level
from cuvil.version import __version__

__all__ = ["CuvilError", "__version__", "compile", "import_model", "run_reference", "set_log_level"]
