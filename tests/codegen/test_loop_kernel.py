"""The lowered loop reads its body with constant invariants in place: a weight the body multiplies by
is packed once at compile time (like any constant weight), not on every iteration."""

from __future__ import annotations

import pytest

from cuvil.codegen.kernels import tuned_kernels
from cuvil.codegen.plan import ordered_steps
from cuvil.codegen.structured import structured_kernels
from cuvil.frontend.onnx_import import import_onnx
from cuvil.ir.specialize import specialize_dims
from cuvil.passes.manager import PassManager, parse_pipeline
from tests.frontend.test_onnx_recurrent_loops import _model


def test_a_recurrent_weight_is_packed_at_compile_time() -> None:
    mod = import_onnx(_model("GRU", "forward", False))
    mod = mod.replace(functions=[specialize_dims(mod.main, {"T": 5, "N": 3})])
    mod = PassManager(parse_pipeline("O3")).run(mod).module  # folds the weights' splits to constants
    (kernel,) = structured_kernels(ordered_steps(mod.main), mod.constants).values()
    if "matmul" not in tuned_kernels():
        pytest.skip("the tuned kernels are off in this process (CUVIL_KERNELS=0)")
    names = [k.name for k in kernel.body.kernels if k is not None]
    assert names and all("packed" in n for n in names), names
    assert kernel.constant_bytes > 0
    assert not any(o.is_const for o in kernel.operands[kernel.carried + kernel.scanned:]), \
        "constant invariants are read in place, not passed"
