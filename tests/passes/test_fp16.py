"""fp16: float32 compute moves to float16 with casts at the boundaries, sensitive ops stay
float32, the signature stays float32, and results stay within the declared tolerance."""

import numpy as np
import pytest
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil.ir import Builder, DType
from cuvil.ir.values import walk
from cuvil.passes import run_pipeline
from cuvil.passes.base import Contract
from cuvil.passes.fp16 import KEEP_FP32, Fp16

RNG = np.random.default_rng(13)
RTOL, ATOL = Fp16.tolerance


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _mlp():
    b = Builder()
    x = b.param("x", DType.f32, [4, 16])
    h = b.relu(b.add(b.matmul(x, b.const(_f(16, 32, scale=0.25))), b.const(_f(32))))
    out = b.softmax(b.matmul(h, b.const(_f(32, 8, scale=0.2))))
    return b.module(b.function("main", [x], [out]))


def _dtype_of(m, op):
    return [v.dtype for v in m.main.ops() if v.op == op]


def test_mlp_runs_in_fp16_with_casts_at_the_boundaries():
    before = _mlp()
    res = run_pipeline(before, [Fp16(), "fold-constants", "dce"])
    after = res.module
    assert ops(after) == ["cast", "matmul", "add", "relu", "matmul", "cast", "softmax"]
    assert _dtype_of(after, "matmul") == [DType.f16, DType.f16]
    assert _dtype_of(after, "softmax") == [DType.f32]  # kept by default
    assert after.main.param_types == before.main.param_types
    assert after.main.result_types == before.main.result_types
    # the weights became f16 constants through constant expressions
    assert all(after.constants[v.const_hash].dtype == np.float16 for v in walk(list(after.main.results))
               if v.is_const)
    assert_same_results(before, after, exact=False, rtol=RTOL, atol=ATOL, trials=4)


def test_constants_are_cast_as_constant_expressions():
    after = Fp16().run(_mlp()).module
    mm = next(v for v in after.main.ops() if v.op == "matmul")
    w = mm.operand("rhs")
    assert w.op == "cast" and w.operand("x").is_const and w.attr("to") is DType.f16


def test_keep_fp32_option():
    before = _mlp()
    after = Fp16(keep_fp32=("relu", "softmax")).run(before).module
    assert _dtype_of(after, "relu") == [DType.f32]
    assert _dtype_of(after, "add") == [DType.f16]
    assert_same_results(before, after, exact=False, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["exp", "reduce_sum", "layer_norm", "softmax", "erf"])
def test_sensitive_ops_stay_fp32_by_default(op):
    assert op in KEEP_FP32
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.mul(x, x)
    if op == "layer_norm":
        z = b.layer_norm(y, b.const(_f(5)), b.const(_f(5)))
    elif op == "reduce_sum":
        z = b.reduce_sum(y, axes=[1], keepdims=True)
    else:
        z = b.op(op, y)
    before = b.module(b.function("main", [x], [b.neg(z)]))
    after = Fp16().run(before).module
    assert _dtype_of(after, op) == [DType.f32]
    assert _dtype_of(after, "mul") == [DType.f16] and _dtype_of(after, "neg") == [DType.f16]
    assert_same_results(before, after, exact=False, rtol=RTOL, atol=ATOL)


def test_constant_outside_fp16_range_keeps_its_op_fp32():
    b = Builder()
    x = b.param("x", DType.f32, [3])
    big = b.const(np.array([1e5, 2.0, 3.0], np.float32))
    before = b.module(b.function("main", [x], [b.relu(b.mul(x, big))]))
    after = Fp16().run(before).module
    assert _dtype_of(after, "mul") == [DType.f32]
    assert_same_results(before, after, exact=False, rtol=RTOL, atol=ATOL)


def test_integer_and_f64_compute_is_untouched():
    b = Builder()
    i = b.param("i", DType.i32, [3])
    d = b.param("d", DType.f64, [3])
    before = b.module(b.function("main", [i, d], [b.add(i, i), b.mul(d, d)]))
    assert_unchanged(Fp16(), before)


def test_contract_is_bounded():
    assert Fp16.contract is Contract.BOUNDED


def test_a_models_float32_island_over_a_half_stays_float32():
    """A half model that widens a row to float32 for its norm (as LpNormalization imports) keeps that
    computation wide; float32 compute fed by a float32 input next to it is narrowed as before."""
    b = Builder()
    h = b.param("h", DType.f16, [2, 8])
    x = b.param("x", DType.f32, [2, 8])
    wide = b.cast(h, to=DType.f32)
    norm = b.sqrt(b.reduce_sum(b.mul(wide, wide), axes=(-1,), keepdims=True))
    island = b.cast(b.div(wide, b.add(norm, b.scalar(1e-6, DType.f32))), to=DType.f16)
    mixed = b.mul(x, b.cast(island, to=DType.f32))
    before = b.module(b.function("main", [h, x], [island, mixed]))
    after = Fp16(keep_fp32=()).run(before).module
    assert _dtype_of(after, "sqrt") == [DType.f32] and _dtype_of(after, "div") == [DType.f32]
    assert _dtype_of(after, "add") == [DType.f32] and _dtype_of(after, "reduce_sum") == [DType.f32]
    assert _dtype_of(after, "mul") == [DType.f32, DType.f16]  # the island's square, then x's product
