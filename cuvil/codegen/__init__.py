"""CIR -> LLVM IR (llvmlite) -> a shared library with a C ABI.

Every op is lowered from its compute rule (the same one the interpreter and the
verifier read); see :mod:`cuvil.codegen.lower_rule` for the loop nests (:mod:`cuvil.codegen.loops` for
the loops themselves),
:mod:`cuvil.codegen.llvm_module` for the entry points and :mod:`cuvil.codegen.artifact`
for the files a compile produces.
"""

from cuvil.codegen.artifact import Artifact, build_library

__all__ = ["Artifact", "build_library"]
