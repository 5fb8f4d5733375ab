"""CIR -> LLVM IR (llvmlite) -> a shared library with a C ABI.

Every op is lowered from its compute rule (the same one the interpreter and the
verifier read); see :mod:`cuvil.codegen.lower_rule` for the loop nests (:mod:`cuvil.codegen.loops` for
the loops themselves),
:mod:`cuvil.codegen.llvm_module` for the entry points and :mod:`cuvil.codegen.artifact`
for the files a compile produces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuvil.codegen.artifact import Artifact, build_library


def __getattr__(name: str) -> Any:
    """``Artifact`` and ``build_library`` on first use: loading a library (cuvil.runtime) reads only
    :mod:`cuvil.codegen.abi` and :mod:`cuvil.codegen.manifest`, and never imports LLVM."""
    if name in ("Artifact", "build_library"):
        from cuvil.codegen import artifact

        return getattr(artifact, name)
    raise AttributeError(f"module 'cuvil.codegen' has no attribute {name!r}")


__all__ = ["Artifact", "build_library"]
