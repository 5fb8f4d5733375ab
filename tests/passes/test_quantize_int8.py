"""quantize-int8: QDQ matmul / conv become int8 x int8 -> int32 products with ONNX QLinear
requantization. Oracles: a numpy formula of QLinearMatMul / QLinearConv semantics (exact),
onnxruntime's QLinearMatMul (within one step), and the float QDQ graph (within one step)."""

from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_testing import assert_unchanged, ops

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.passes import run_pipeline
from cuvil.passes.base import Contract
from cuvil.passes.quantize_int8 import QuantizeInt8

RNG = np.random.default_rng(17)
SX, ZX, SY, ZY = np.float32(0.05), np.int8(3), np.float32(0.2), np.int8(-5)


def _q(shape, dtype=np.int8):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _dq(b, q, s, z, axis=1):
    return b.dequantize_linear(q, b.const(s), b.const(z), axis=axis)


def _qdq_matmul(w_scale, w_zero, *, relu=False, bias=None, weight_param=False, x_dtype: type[np.integer] = np.int8):
    b = Builder()
    x = b.param("x", DType.from_numpy(x_dtype), [3, 6])
    wq = b.param("w", DType.i8, [6, 5]) if weight_param else b.const(_q((6, 5)))
    zx = np.array(ZX, x_dtype) if x_dtype == np.int8 else np.array(128, x_dtype)
    y = b.matmul(_dq(b, x, np.array(SX), zx), _dq(b, wq, w_scale, w_zero))
    if bias is not None:
        y = b.add(y, bias(b))
    if relu:
        y = b.relu(y)
    out = b.quantize_linear(y, b.const(np.array(SY)), b.const(np.array(ZY)))
    params = [x, wq] if weight_param else [x]
    return b.module(b.function("main", params, [out])), wq


def _inputs(m):
    return [RNG.integers(-128, 128, p.type.shape).astype(p.dtype.np) if p.dtype is DType.i8 else
            RNG.integers(0, 256, p.type.shape).astype(p.dtype.np) for p in m.main.params]


def _qlinear(acc: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ONNX QLinear requantization of an int32 accumulator: round half to even, add zero point, saturate."""
    y = np.rint(acc.astype(np.float32) * scale.astype(np.float32)) + np.float32(ZY)
    return np.clip(y, -128, 127).astype(np.int8)


def _check_within_one_step(before, after, trials=4):
    for _ in range(trials):
        xs = _inputs(before)
        ref, got = run_reference(before, xs)[0], run_reference(after, xs)[0]
        assert got.dtype == ref.dtype == np.int8
        assert np.max(np.abs(ref.astype(np.int32) - got.astype(np.int32))) <= QuantizeInt8.tolerance


def test_per_tensor_matmul_becomes_integer():
    w_scale, w_zero = np.array(0.02, np.float32), np.array(0, np.int8)
    before, wq = _qdq_matmul(w_scale, w_zero)
    res = run_pipeline(before, "quantize-int8,fold-constants,dce")
    after = res.module
    assert "dequantize_linear" not in ops(after) and "quantize_linear" not in ops(after)
    (mm,) = [v for v in after.main.ops() if v.op == "matmul"]
    assert mm.dtype is DType.i32 and mm.operand("lhs").dtype is DType.i32
    assert "round" in ops(after) and "clip" in ops(after)
    xs = _inputs(before)
    w = before.constants[wq.const_hash].astype(np.int32)
    acc = (xs[0].astype(np.int32) - int(ZX)) @ w
    np.testing.assert_array_equal(run_reference(after, xs)[0], _qlinear(acc, SX * w_scale / SY))
    _check_within_one_step(before, after)


def test_combined_scale_is_a_constant_expression():
    before, _ = _qdq_matmul(np.array(0.02, np.float32), np.array(0, np.int8))
    after = QuantizeInt8().run(before).module
    scale_mul = next(v for v in after.main.ops() if v.op == "mul" and v.operand("lhs").op == "cast")
    combined = scale_mul.operand("rhs")
    assert combined.op == "div" and combined.operand("lhs").op == "mul"
    assert combined.operand("rhs").is_const


def test_per_channel_weights_with_zero_points_and_relu():
    w_scale = RNG.uniform(0.01, 0.05, 5).astype(np.float32)
    w_zero = RNG.integers(-3, 4, 5).astype(np.int8)
    before, wq = _qdq_matmul(w_scale, w_zero, relu=True)
    after = run_pipeline(before, "quantize-int8,fold-constants,dce").module
    assert "relu" in ops(after)
    xs = _inputs(before)
    w = before.constants[wq.const_hash].astype(np.int32) - w_zero.astype(np.int32)
    acc = (xs[0].astype(np.int32) - int(ZX)) @ w
    y = np.maximum(acc.astype(np.float32) * (SX * w_scale / SY).astype(np.float32), np.float32(0))
    want = np.clip(np.rint(y) + np.float32(ZY), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(run_reference(after, xs)[0], want)
    _check_within_one_step(before, after)


def test_uint8_activations():
    before, _ = _qdq_matmul(np.array(0.03, np.float32), np.array(0, np.int8), x_dtype=np.uint8)
    after = QuantizeInt8().run(before).module
    assert "dequantize_linear" not in ops(after)
    _check_within_one_step(before, after)


def test_int32_bias_at_accumulator_scale_joins_the_accumulator():
    w_scale = np.array(0.02, np.float32)
    bias_q = RNG.integers(-500, 500, 5).astype(np.int32)

    def bias(b):
        return b.dequantize_linear(b.const(bias_q), b.const(np.array(SX * w_scale, np.float32)),
                                   b.const(np.array(0, np.int32)), axis=0)

    before, wq = _qdq_matmul(w_scale, np.array(0, np.int8), bias=bias)
    after = run_pipeline(before, "quantize-int8,fold-constants,dce").module
    add = next(v for v in after.main.ops() if v.op == "add" and v.dtype is DType.i32)
    assert add.operand("rhs").is_const
    xs = _inputs(before)
    acc = (xs[0].astype(np.int32) - int(ZX)) @ before.constants[wq.const_hash].astype(np.int32) + bias_q
    np.testing.assert_array_equal(run_reference(after, xs)[0], _qlinear(acc, SX * w_scale / SY))
    _check_within_one_step(before, after)


def test_float_bias_is_quantized_to_the_accumulator_scale():
    before, _ = _qdq_matmul(np.array(0.02, np.float32), np.array(0, np.int8),
                            bias=lambda b: b.const(RNG.standard_normal(5).astype(np.float32)))
    after = run_pipeline(before, "quantize-int8,fold-constants,dce").module
    assert "dequantize_linear" not in ops(after)
    _check_within_one_step(before, after)


def test_per_channel_conv_with_bias_matches_qlinearconv_semantics():
    b = Builder()
    x = b.param("x", DType.u8, [2, 4, 5, 5])
    wq_data = _q((6, 4, 3, 3))
    w_scale = RNG.uniform(0.005, 0.02, 6).astype(np.float32)
    sx, zx = np.float32(0.04), np.uint8(120)
    bias_q = RNG.integers(-300, 300, 6).astype(np.int32)
    xd = b.dequantize_linear(x, b.const(np.array(sx)), b.const(np.array(zx)))
    wd = b.dequantize_linear(b.const(wq_data), b.const(w_scale), b.const(np.zeros(6, np.int8)), axis=0)
    bd = b.dequantize_linear(b.const(bias_q), b.const((sx * w_scale).astype(np.float32)),
                             b.const(np.zeros(6, np.int32)), axis=0)
    y = b.add(b.conv(xd, wd, pads=[1, 1, 1, 1]), b.reshape(bd, shape=[6, 1, 1]))
    out = b.quantize_linear(y, b.const(np.array(SY)), b.const(np.array(ZY)))
    before = b.module(b.function("main", [x], [out]))
    after = run_pipeline(before, "quantize-int8,fold-constants,dce").module
    (conv,) = [v for v in after.main.ops() if v.op == "conv"]
    assert conv.dtype is DType.i32
    xs = _inputs(before)
    xi = np.pad(xs[0].astype(np.int64) - int(zx), [(0, 0), (0, 0), (1, 1), (1, 1)])
    windows = np.lib.stride_tricks.sliding_window_view(xi, (3, 3), axis=(2, 3))  # n, c, h, w, kh, kw
    acc = np.einsum("nchwij,ocij->nohw", windows, wq_data.astype(np.int64))
    acc = acc.astype(np.int32) + bias_q.reshape(6, 1, 1)
    scale = (sx * w_scale / SY).astype(np.float32).reshape(6, 1, 1)
    np.testing.assert_array_equal(run_reference(after, xs)[0], _qlinear(acc, scale))
    _check_within_one_step(before, after)


def _ort_qlinear_matmul(xq, wq, w_scale) -> np.ndarray:
    nodes = [helper.make_node("QLinearMatMul", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"])]
    inits = [numpy_helper.from_array(np.array(SX), "sx"), numpy_helper.from_array(np.array(ZX), "zx"),
             numpy_helper.from_array(wq, "w"), numpy_helper.from_array(w_scale, "sw"),
             numpy_helper.from_array(np.array(0, np.int8), "zw"), numpy_helper.from_array(np.array(SY), "sy"),
             numpy_helper.from_array(np.array(ZY), "zy")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT8, list(xq.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, [xq.shape[0], wq.shape[1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return cast(np.ndarray, sess.run(None, {"x": xq})[0])  # ONNX Runtime types its outputs wider than a tensor


def test_agrees_with_onnxruntime_qlinearmatmul():
    w_scale = np.array(0.02, np.float32)
    before, wq = _qdq_matmul(w_scale, np.array(0, np.int8))
    after = QuantizeInt8().run(before).module
    xs = _inputs(before)
    want = _ort_qlinear_matmul(xs[0], np.asarray(before.constants[wq.const_hash]), w_scale)
    got = run_reference(after, xs)[0]
    assert np.max(np.abs(want.astype(np.int32) - got.astype(np.int32))) <= 1


def _other_user():
    b = Builder()
    x = b.param("x", DType.i8, [3, 6])
    y = b.matmul(_dq(b, x, np.array(SX), np.array(ZX)), _dq(b, b.const(_q((6, 5))), np.array(0.02, np.float32),
                                                         np.array(0, np.int8)))
    out = b.quantize_linear(y, b.const(np.array(SY)), b.const(np.array(ZY)))
    return b.module(b.function("main", [x], [out, y]))


def _per_channel_activation():
    b = Builder()
    x = b.param("x", DType.i8, [3, 6])
    xd = b.dequantize_linear(x, b.const(np.full(6, SX, np.float32)), b.const(np.zeros(6, np.int8)), axis=1)
    y = b.matmul(xd, _dq(b, b.const(_q((6, 5))), np.array(0.02, np.float32), np.array(0, np.int8)))
    return b.module(b.function("main", [x], [b.quantize_linear(y, b.const(np.array(SY)), b.const(np.array(ZY)))]))


def _contraction_axis_case():
    """A per-channel weight scale along the contraction axis is not a per-output-column scale."""
    b = Builder()
    x = b.param("x", DType.i8, [3, 6])
    wd = b.dequantize_linear(b.const(_q((6, 5))), b.const(RNG.uniform(0.01, 0.05, 6).astype(np.float32)),
                             b.const(np.zeros(6, np.int8)), axis=0)
    y = b.matmul(_dq(b, x, np.array(SX), np.array(ZX)), wd)
    return b.module(b.function("main", [x], [b.quantize_linear(y, b.const(np.array(SY)), b.const(np.array(ZY)))]))


NEGATIVE = {
    "weights are a parameter": lambda: _qdq_matmul(np.array(0.02, np.float32), np.array(0, np.int8),
                                                   weight_param=True)[0],
    "the float product has another user": _other_user,
    "activation quantized per channel": _per_channel_activation,
    "weight scale along the contraction axis": _contraction_axis_case,
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_does_not_fire(case):
    before = NEGATIVE[case]()
    assert_unchanged(QuantizeInt8(), before)


def test_contract_is_bounded():
    assert QuantizeInt8.contract is Contract.BOUNDED
