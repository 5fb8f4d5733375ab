"""CIR -> LLVM IR (llvmlite) -> a shared library with a C ABI.

Every op is lowered from its compute rule (the same one the interpreter and the
verifier read); see :mod:`cuvil.codegen.lower_rule` for the loop nests,
:mod:`cuvil.codegen.module` for the entry points and :mod:`cuvil.codegen.artifact`
for the files a compile produces.
"""

from cuvil.codegen.artifact import Artifact, build_library


def supported_ops() -> dict[str, str]:
    """What the LLVM column of `cuvil ops` shows: every catalogue op lowers from its rule
    (tests/codegen walks the whole catalogue against the interpreter); narrow storage types
    (float8/float4/int4/int2) are one byte per element, widened on load and narrowed on store."""
    from cuvil.ir.opdef import all_ops

    return {op.name: "loop nest from the rule" for op in all_ops()}


__all__ = ["Artifact", "build_library", "supported_ops"]
