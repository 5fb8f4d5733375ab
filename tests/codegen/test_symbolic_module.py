"""A function with symbolic dims lowered once for its shape class: one library, its arena sized for
the dims' maxima, run at several sizes through ``run_dims`` and compared with the interpreter; a dim
without an upper bound is refused."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from cuvil.codegen.link import emit_object, host_target, link_shared, optimize, target_machine
from cuvil.codegen.symbolic_module import lower_symbolic_function, symbol_maxima
from cuvil.errors import CodegenError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.types import DimConstraint


def _mlp(hi: int | None) -> Module:
    """x[N, 8] -> relu(x W1 + b1) W2 -> softmax over 4 classes, plus the input's column sums; N <= hi."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, ["N", 8])
    w1 = b.const(rng.standard_normal((8, 16)).astype(np.float32))
    b1 = b.const(rng.standard_normal(16).astype(np.float32))
    w2 = b.const(rng.standard_normal((16, 4)).astype(np.float32))
    h = b.relu(b.add(b.matmul(x, w1), b1))
    y = b.softmax(b.matmul(h, w2), axis=1)
    s = b.reduce_sum(x, axes=[0], keepdims=False)
    return b.module(b.function("main", [x], [y, s, x], ["y", "s", "x_again"],
                               [DimConstraint("N", lo=1, hi=hi)]))


def test_one_library_runs_every_size_up_to_its_maximum(tmp_path: Path) -> None:
    module = _mlp(hi=32)
    fn = module.main
    lowered = lower_symbolic_function(fn, module.constants, symbol_maxima(fn), name="mlp")
    tm = target_machine(host_target(), 2)
    path = tmp_path / "libmlp.so"
    link_shared(emit_object(optimize(lowered.module, tm, 2), tm), path)
    lib = ctypes.CDLL(str(path))
    lib.cuvil_mlp_create.restype = ctypes.c_void_p
    lib.cuvil_mlp_run_dims.restype = ctypes.c_int32
    lib.cuvil_mlp_run_dims.argtypes = [ctypes.c_void_p] * 4
    lib.cuvil_mlp_destroy.argtypes = [ctypes.c_void_p]
    ctx = lib.cuvil_mlp_create()
    assert lowered.plan.arena_bytes >= 32 * 16 * 4  # the hidden layer at N = 32
    rng = np.random.default_rng(1)
    try:
        for n in (1, 5, 32, 2):
            x = rng.standard_normal((n, 8)).astype(np.float32)
            outs = [np.empty((n, 4), np.float32), np.empty(8, np.float32), np.empty((n, 8), np.float32)]
            ins = (ctypes.c_void_p * 1)(x.ctypes.data)
            out_ptrs = (ctypes.c_void_p * 3)(*(o.ctypes.data for o in outs))
            dims = np.array([n], np.int64)
            assert lib.cuvil_mlp_run_dims(ctx, dims.ctypes.data, ins, out_ptrs) == 0
            want = run_reference(module, {"x": x})
            for got, w in zip(outs, want, strict=True):  # sums in the rule's order, not numpy's
                np.testing.assert_allclose(got, w, rtol=2e-6, atol=1e-6, err_msg=f"N={n}")
            np.testing.assert_array_equal(outs[2], x)
        assert lib.cuvil_mlp_run_dims(ctx, None, None, None) == 1  # ERR_NULL
    finally:
        lib.cuvil_mlp_destroy(ctx)


def test_a_dim_without_an_upper_bound_is_refused() -> None:
    fn = _mlp(hi=None).main
    with pytest.raises(CodegenError, match="no upper bound"):
        symbol_maxima(fn)
    assert symbol_maxima(fn, {"N": 64}) == {"N": 64}
    with pytest.raises(CodegenError, match="exceeds its constraint"):
        symbol_maxima(_mlp(hi=8).main, {"N": 9})
