"""ONNX quantization converters (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger, QLinearConv) against ONNX Runtime. Integer outputs must match exactly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_testing import NodeCase

from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference
from tests.oracles import oracle_int8_weights


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*shape: int, seed: int = 0, scale: float = 4.0) -> np.ndarray:
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def q(dtype: Any, *shape: int, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng(seed).integers(info.min, int(info.max) + 1, shape).astype(dtype)


def scalar(v: Any, dtype: Any) -> np.ndarray:
    return np.array(v, dtype=dtype)


@dataclass
class Case(NodeCase):
    """The quantization cases default to opset 21 (blocked scales, 16-bit types, output_dtype)."""

    opset: int = 21


def run_both(case: Case) -> tuple[list[np.ndarray], list[np.ndarray]]:
    model = case.model()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = cast(list[np.ndarray], sess.run(None, case.feeds))  # a single-node model returns tensors only
    module = import_onnx(model)
    got = run_reference(module, {p.name: case.feeds[p.name] for p in module.main.params})
    return got, want


def _cases() -> dict[str, Case]:
    x = f32(2, 3, 4)
    c: dict[str, Case] = {}
    c["Quantize-u8-default-zp"] = Case("QuantizeLinear", {"x": x}, {"s": scalar(0.05, np.float32)}, opset=13)
    c["Quantize-i8"] = Case("QuantizeLinear", {"x": x}, {"s": scalar(0.03, np.float32), "z": scalar(-3, np.int8)},
                            opset=13)
    c["Quantize-ties"] = Case("QuantizeLinear", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0],
                                                               np.float32)},
                              {"s": scalar(1.0, np.float32), "z": scalar(0, np.int8)}, opset=13)
    c["Quantize-per-axis"] = Case("QuantizeLinear", {"x": x}, {"s": np.array([0.01, 0.05, 0.2], np.float32),
                                                               "z": np.array([0, 10, 250], np.uint8)},
                                  attrs={"axis": 1}, opset=13)
    c["Quantize-i16"] = Case("QuantizeLinear", {"x": x * 1000}, {"s": scalar(0.07, np.float32),
                                                                 "z": scalar(-200, np.int16)})
    c["Quantize-u16-per-axis"] = Case("QuantizeLinear", {"x": x * 1000},
                                      {"s": np.array([0.1, 0.2, 0.3, 0.4], np.float32),
                                       "z": np.array([0, 100, 30000, 65000], np.uint16)}, attrs={"axis": -1})
    c["Quantize-blocked"] = Case("QuantizeLinear", {"x": f32(4, 6)}, {"s": np.array([[0.1, 0.2]] * 4, np.float32),
                                                                      "z": np.array([[1, -1]] * 4, np.int8)},
                                 attrs={"axis": 1, "block_size": 3})
    c["Quantize-output-dtype"] = Case("QuantizeLinear", {"x": x}, {"s": scalar(0.02, np.float32)},
                                      attrs={"output_dtype": TensorProto.INT8})
    c["Quantize-f16"] = Case("QuantizeLinear", {"x": x.astype(np.float16)}, {"s": scalar(0.05, np.float16),
                                                                             "z": scalar(5, np.uint8)}, opset=19)
    c["Dequantize-u8"] = Case("DequantizeLinear", {"x": q(np.uint8, 2, 3, 4)}, {"s": scalar(0.02, np.float32),
                                                                                "z": scalar(128, np.uint8)}, opset=13)
    c["Dequantize-i8-no-zp"] = Case("DequantizeLinear", {"x": q(np.int8, 5)}, {"s": scalar(0.5, np.float32)},
                                    opset=13)
    c["Dequantize-per-axis"] = Case("DequantizeLinear", {"x": q(np.int8, 2, 3, 4)},
                                    {"s": np.array([0.1, 0.2, 0.3], np.float32), "z": np.array([0, -5, 7], np.int8)},
                                    attrs={"axis": 1}, opset=13)
    c["Dequantize-i32"] = Case("DequantizeLinear", {"x": q(np.int32, 6)}, {"s": scalar(1e-3, np.float32)},
                               opset=13)
    c["Dequantize-blocked"] = Case("DequantizeLinear", {"x": q(np.int8, 4, 5)},
                                   {"s": np.array([[0.5] * 5, [0.25] * 5], np.float32),
                                    "z": np.array([[3] * 5, [-3] * 5], np.int8)},
                                   attrs={"axis": 0, "block_size": 2})
    c["Dequantize-i16"] = Case("DequantizeLinear", {"x": q(np.int16, 2, 5)}, {"s": scalar(0.01, np.float32),
                                                                              "z": scalar(77, np.int16)})
    c["DynamicQuantize"] = Case("DynamicQuantizeLinear", {"x": f32(3, 5)}, opset=11, outputs=3)
    c["DynamicQuantize-positive"] = Case("DynamicQuantizeLinear", {"x": np.abs(f32(2, 4, seed=2)) + 1.0}, opset=11,
                                         outputs=3)
    # integer matmul / conv
    a_u8, b_u8 = q(np.uint8, 3, 4, seed=1), q(np.uint8, 4, 5, seed=2)
    c["MatMulInteger"] = Case("MatMulInteger", {"a": a_u8, "b": b_u8}, {"az": scalar(12, np.uint8),
                                                                        "bz": scalar(200, np.uint8)}, opset=10)
    b_s8 = oracle_int8_weights(np.random.default_rng(4), 4, 5)  # int8 weights: ONNX Runtime sums them exactly
    c["MatMulInteger-batched-per-col"] = Case("MatMulInteger", {"a": q(np.uint8, 2, 3, 4), "b": b_s8},
                                              {"az": scalar(3, np.uint8), "bz": q(np.int8, 5, seed=3)}, opset=10)
    c["MatMulInteger-no-zp"] = Case("MatMulInteger", {"a": q(np.int8, 3, 4), "b": q(np.int8, 4, 2)}, opset=10)
    for dt in (np.uint8, np.int8):
        zp = 7 if dt == np.uint8 else -7
        c[f"QLinearMatMul-{dt.__name__}"] = Case(
            "QLinearMatMul", {"a": q(dt, 3, 4, seed=4), "b": q(dt, 4, 5, seed=5)},
            {"as": scalar(0.02, np.float32), "az": scalar(zp, dt), "bs": scalar(0.015, np.float32),
             "bz": scalar(zp, dt), "ys": scalar(0.9, np.float32), "yz": scalar(zp, dt)},
            inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"], opset=10)
    c["QLinearMatMul-per-col"] = Case(
        "QLinearMatMul", {"a": q(np.uint8, 2, 3, 4, seed=6), "b": q(np.uint8, 4, 5, seed=7)},
        {"as": scalar(0.05, np.float32), "az": scalar(100, np.uint8),
         "bs": np.linspace(0.01, 0.03, 5).astype(np.float32), "bz": q(np.uint8, 5, seed=8),
         "ys": scalar(1.5, np.float32), "yz": scalar(30, np.uint8)},
        inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"], opset=21)
    x_u8, w_u8 = q(np.uint8, 1, 2, 5, 5, seed=9), q(np.uint8, 3, 2, 3, 3, seed=10)
    c["ConvInteger"] = Case("ConvInteger", {"x": x_u8, "w": w_u8}, {"xz": scalar(100, np.uint8),
                                                                    "wz": scalar(120, np.uint8)},
                            attrs={"pads": [1, 0, 1, 2], "strides": [1, 2]}, opset=10)
    c["ConvInteger-no-zp"] = Case("ConvInteger", {"x": x_u8, "w": w_u8}, attrs={"auto_pad": "SAME_UPPER"}, opset=10)
    for dt in (np.uint8, np.int8):
        zp = 50 if dt == np.uint8 else -5
        c[f"QLinearConv-{dt.__name__}"] = Case(
            "QLinearConv", {"x": q(dt, 1, 4, 5, 6, seed=11), "w": q(dt, 6, 2, 3, 3, seed=12)},
            {"xs": scalar(0.03, np.float32), "xz": scalar(zp, dt), "ws": np.linspace(0.01, 0.05, 6).astype(np.float32),
             "wz": np.zeros(6, dt), "ys": scalar(1.2, np.float32), "yz": scalar(zp, dt),
             "bias": rng(13).integers(-500, 500, 6).astype(np.int32)},
            inputs=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"],
            attrs={"group": 2, "pads": [1, 1, 1, 1], "dilations": [1, 2]}, opset=10)
    return c


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_converter_matches_onnxruntime(name):
    got, want = run_both(CASES[name])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_qdq_round_trip_error_is_at_most_half_a_step():
    """QuantizeLinear then DequantizeLinear: values inside the range come back within scale / 2."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    s, z = np.float32(0.05), np.uint8(128)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(s), "s"), numpy_helper.from_array(np.array(z), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    module = import_onnx(model)
    for n in (1, 7):
        xv = rng(n).uniform(-6.0, 6.0, (n, 4)).astype(np.float32)
        [y] = run_reference(module, {"x": xv})
        assert np.abs(y - xv).max() <= s / 2 + 1e-6
