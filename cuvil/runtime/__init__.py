"""Running compiled models: loading a library with its manifest into a Python callable."""

from cuvil.runtime.guard import GuardFault
from cuvil.runtime.loader import CompiledModel, load

__all__ = ["CompiledModel", "GuardFault", "load"]
