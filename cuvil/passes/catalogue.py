"""The built-in passes (importing this module registers them) and the O0..O3 pipelines."""

from cuvil.passes import (  # noqa: F401
    bf16,
    canonicalize,
    cse,
    dce,
    decompose,
    eliminate_layout,
    fold_batchnorm,
    fold_constants,
    fp16,
    fuse_elementwise,
    layout_nchwc,
    merge_low_rank,
    quantize_int8,
    unroll_loops,
)

_O1 = ("canonicalize", "cse", "dce")
# fold-constants follows every pass that emits constant expressions (fold-batchnorm, and the
# reshapes of constants eliminate-layout-ops may add), and runs before fusion so that fused
# bodies never carry computations on constants alone
_O2 = ("canonicalize", "cse", "fold-batchnorm", "eliminate-layout-ops", "fold-constants", "canonicalize", "cse",
       "fuse-elementwise", "dce")
# layout-nchwc records a plan only when the module has a conv (memory is planned by the code generator)
_O3 = (*_O2, "layout-nchwc")

PIPELINES: dict[str, tuple[str, ...]] = {
    "O0": (),
    "O1": _O1,
    "O2": _O2,
    "O3": _O3,
}
