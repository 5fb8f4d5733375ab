"""ONNX Runtime's quantized contrib ops: the operator format (QOperator) of ``onnxruntime.quantization`` and the
dynamic-quantization products its optimizer saves. Each against ONNX Runtime on the interpreter (quantized
results within one step), over per-tensor and per-column parameters and the optional inputs; and networks
quantized both ways, compiled, against ONNX Runtime's run of the same file."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_testing import CONTRIB_OPSETS, contrib_model, ort_agrees

import cuvil
from cuvil.errors import ShapeError, UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference
from tests.oracles import oracle_int8_weights, ort_sums_u8s8_exactly

RNG = np.random.default_rng(7)


def _q(dtype: type, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _s(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def _zp(dtype: type, value: int) -> np.ndarray:
    return np.array(value, dtype)


def _binary_feeds(op: str, dtype: type, b_shape: tuple[int, ...]) -> dict[str, np.ndarray | None]:
    """Scales of no short decimal form: with 0.05 and 0.03 over 0.08 an eighth of the sums are exact halves,
    which ONNX Runtime's scale ratios round either way."""
    zps = (5, 200, 100) if dtype is np.uint8 else (-3, 3, -6)
    return {"a": _q(dtype, 2, 3, 4), "a_s": _s(0.0473), "a_zp": _zp(dtype, zps[0]),
            "b": _q(dtype, *b_shape), "b_s": _s(0.0291), "b_zp": _zp(dtype, zps[1]),
            "c_s": _s(0.0817 if op == "QLinearAdd" else 0.513), "c_zp": _zp(dtype, zps[2])}


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape", [(2, 3, 4), (4,)], ids=["same", "broadcast"])
def test_qlinear_binary(op: str, dtype: type, b_shape: tuple[int, ...]) -> None:
    feeds = _binary_feeds(op, dtype, b_shape)
    ort_agrees(contrib_model(op, feeds, ["y"]), feeds)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_zero_points_left_out_are_zero(op: str) -> None:
    """ONNX Runtime cannot type such a node; the op's definition can: the same as zero points of 0."""
    feeds = _binary_feeds(op, np.int8, (2, 3, 4))
    for name in ("a_zp", "b_zp", "c_zp"):
        feeds[name] = _zp(np.int8, 0)
    (want,) = run_reference(import_onnx(contrib_model(op, feeds, ["y"])), [v for v in feeds.values() if v is not None])
    bare = {n: (None if n.endswith("_zp") else v) for n, v in feeds.items()}
    (got,) = run_reference(import_onnx(contrib_model(op, bare, ["y"])), [v for v in bare.values() if v is not None])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("op", "attrs"), [
    ("QLinearLeakyRelu", {"alpha": 0.2}), ("QLinearSigmoid", {}),
    ("QLinearSoftmax", {"opset": 13, "axis": -1}), ("QLinearSoftmax", {"opset": 11, "axis": 1}),
    ("QLinearGlobalAveragePool", {}), ("QLinearGlobalAveragePool", {"channels_last": 1}),
    ("QLinearAveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("QLinearAveragePool", {"kernel_shape": [2, 2], "count_include_pad": 1, "pads": [1, 1, 0, 0],
                            "channels_last": 1}),
], ids=["leaky", "sigmoid", "softmax-13", "softmax-11-flat", "gap", "gap-nhwc", "avgpool", "avgpool-nhwc-pad"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_unary(op: str, attrs: dict[str, Any], dtype: type) -> None:
    zp = 128 if dtype is np.uint8 else 0
    feeds = {"x": _q(dtype, 2, 3, 6, 5), "x_s": _s(0.0437), "x_zp": _zp(dtype, zp - 7),
             "y_s": _s(1 / 255 if op in ("QLinearSigmoid", "QLinearSoftmax") else 0.0291),
             "y_zp": _zp(dtype, 0 if dtype is np.uint8 and op in ("QLinearSigmoid", "QLinearSoftmax") else zp)}
    # ONNX Runtime's softmax reads exponentials from a table and rounds its scaled quotients its own way: a fifth
    # of them one step below the rounded probability (the op's meaning here, the QDQ reading of it)
    ort_agrees(contrib_model(op, feeds, ["y"], **attrs), feeds, equal_share=0.7 if op == "QLinearSoftmax" else 0.99)


def test_qlinear_reduce_mean() -> None:
    """ONNX Runtime has no CPU kernel for it: the oracle is its definition, Q(mean(DQ(x))), in f32."""
    x = _q(np.uint8, 2, 3, 4)
    feeds = {"x": x, "x_s": _s(0.0437), "x_zp": _zp(np.uint8, 121), "y_s": _s(0.0291), "y_zp": _zp(np.uint8, 128)}
    model = contrib_model("QLinearReduceMean", feeds, ["y"], axes=[1], keepdims=0)
    (got,) = run_reference(import_onnx(model), list(feeds.values()))
    mean = ((x.astype(np.float32) - np.float32(121)) * np.float32(0.0437)).mean(axis=1, dtype=np.float32)
    want = np.clip(np.rint(mean / np.float32(0.0291)) + 128, 0, 255).astype(np.uint8)
    assert got.shape == (2, 4) and np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_qlinear_concat_and_where() -> None:
    feeds = {"y_s": _s(0.05), "y_zp": _zp(np.uint8, 100), "a": _q(np.uint8, 2, 3), "a_s": _s(0.04),
             "a_zp": _zp(np.uint8, 120), "b": _q(np.uint8, 2, 5), "b_s": _s(0.07), "b_zp": _zp(np.uint8, 90)}
    ort_agrees(contrib_model("QLinearConcat", feeds, ["y"], axis=1), feeds)
    feeds = {"cond": RNG.random((2, 4)) > 0.5, "x": _q(np.int8, 2, 4), "x_s": _s(0.04), "x_zp": _zp(np.int8, 3),
             "y": _q(np.int8, 4), "y_s": _s(0.02), "y_zp": _zp(np.int8, -2), "z_s": _s(0.05),
             "z_zp": _zp(np.int8, 1)}
    ort_agrees(contrib_model("QLinearWhere", feeds, ["z"]), feeds)


@pytest.mark.parametrize("trans", [(0, 0), (1, 1)], ids=["plain", "transposed"])
@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
@pytest.mark.parametrize("output", ["quantized", "float"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_qgemm(trans: tuple[int, int], per_column: bool, output: str, bias: bool) -> None:
    m, k, n = 3, 16, 5
    a = _q(np.uint8, *((k, m) if trans[0] else (m, k)))
    w = oracle_int8_weights(RNG, *((n, k) if trans[1] else (k, n)))
    feeds: dict[str, np.ndarray | None] = {
        "a": a, "a_s": _s(0.02), "a_zp": _zp(np.uint8, 130), "b": w,
        "b_s": (RNG.random(n).astype(np.float32) * 0.01 + 0.005) if per_column else _s(0.01),
        "b_zp": np.zeros(n, np.int8) if per_column else _zp(np.int8, 0),
        "c": RNG.integers(-500, 500, n).astype(np.int32) if bias else None,
        "y_s": _s(0.2) if output == "quantized" else None,
        "y_zp": _zp(np.uint8, 128) if output == "quantized" else None}
    ort_agrees(contrib_model("QGemm", feeds, ["y"], transA=trans[0], transB=trans[1], alpha=0.75), feeds, tol=1e-4)


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
@pytest.mark.parametrize("extras", [True, False], ids=["zp-bias", "bare"])
def test_dynamic_quantize_matmul(per_column: bool, extras: bool) -> None:
    n = 6
    feeds: dict[str, np.ndarray | None] = {
        "a": RNG.standard_normal((2, 3, 8)).astype(np.float32), "b": oracle_int8_weights(RNG, 8, n),
        "b_s": (RNG.random(n).astype(np.float32) * 0.02 + 0.01) if per_column else _s(0.02),
        "b_zp": (np.zeros(n, np.int8) if per_column else _zp(np.int8, 0)) if extras else None,
        "bias": RNG.standard_normal(n).astype(np.float32) if extras else None}
    ort_agrees(contrib_model("DynamicQuantizeMatMul", feeds, ["y"]), feeds, tol=1e-5)


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_matmul_integer_to_float(per_column: bool) -> None:
    n = 5
    feeds: dict[str, np.ndarray | None] = {
        "a": _q(np.uint8, 2, 3, 8), "b": oracle_int8_weights(RNG, 8, n), "a_s": _s(0.03),
        "b_s": (RNG.random(n).astype(np.float32) * 0.02 + 0.01) if per_column else _s(0.02),
        "a_zp": _zp(np.uint8, 128), "b_zp": np.zeros(n, np.int8) if per_column else _zp(np.int8, 0),
        "bias": RNG.standard_normal(n).astype(np.float32)}
    ort_agrees(contrib_model("MatMulIntegerToFloat", feeds, ["y"]), feeds, tol=1e-5)


def test_bad_quantized_inputs_are_refused() -> None:
    feeds = {"y_s": _s(0.05), "y_zp": _zp(np.uint8, 100), "a": _q(np.uint8, 2, 3), "a_s": _s(0.04)}
    with pytest.raises(ShapeError, match="triples"):
        import_onnx(contrib_model("QLinearConcat", feeds, ["y"], axis=1))
    feeds = {"x": _q(np.uint8, 2, 3), "x_s": np.full(3, 0.1, np.float32), "x_zp": _zp(np.uint8, 1),
             "y_s": _s(0.1), "y_zp": _zp(np.uint8, 1)}
    with pytest.raises(UnsupportedOpError, match="per-axis scale"):
        import_onnx(contrib_model("QLinearSigmoid", feeds, ["y"]))


@pytest.mark.parametrize("form", ["qoperator", "dynamic-saved"])
def test_quantized_networks_compile_and_agree(form: str, tmp_path: Any) -> None:
    """The zoo's ResNet-18 (reduced) quantized statically in the operator format (QLinearConv, QLinearAdd,
    QLinearGlobalAveragePool, QGemm), and its BERT quantized dynamically and saved by an ONNX Runtime session
    (DynamicQuantizeMatMul, MatMulIntegerToFloat): compiled, against ONNX Runtime's run of the same file."""
    pytest.importorskip("torch")
    quantization = pytest.importorskip("onnxruntime.quantization")
    from bench.models import ZOO_SMALL

    zoo = ZOO_SMALL["resnet18" if form == "qoperator" else "bert"]
    source, quantized = tmp_path / "model.onnx", tmp_path / "quantized.onnx"
    onnx.save(zoo.to_onnx(), str(source))
    inputs = zoo.example_inputs_numpy()
    feeds = dict(zip(zoo.input_names, inputs, strict=True))
    if form == "qoperator":
        class Calibration(quantization.CalibrationDataReader):
            def __init__(self) -> None:
                self.left = [feeds]

            def get_next(self) -> dict[str, np.ndarray] | None:
                return self.left.pop() if self.left else None

        quantization.quantize_static(str(source), str(quantized), Calibration(),
                                     quant_format=quantization.QuantFormat.QOperator)
        path = quantized
        wanted = {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"}
    else:
        quantization.quantize_dynamic(str(source), str(quantized), weight_type=quantization.QuantType.QInt8,
                                      reduce_range=not ort_sums_u8s8_exactly())
        path = tmp_path / "saved.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(path)
        ort.InferenceSession(str(quantized), options, providers=["CPUExecutionProvider"])
        wanted = {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
    assert wanted <= {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "com.microsoft"}
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[:1]
    got = cuvil.compile(str(path), cache=False)(*inputs)
    got = np.asarray(got[0] if isinstance(got, tuple) else got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Rows of unsigned ``bits``-wide values packed into bytes, the lowest bits first (rows padded to bytes)."""
    per_byte = 8 // bits
    rows, count = values.shape
    padded = np.zeros((rows, -(-count // per_byte) * per_byte), np.uint16)
    padded[:, :count] = values
    grouped = padded.reshape(rows, -1, per_byte) << (np.arange(per_byte, dtype=np.uint16) * bits)
    return grouped.sum(axis=2).astype(np.uint8)


_NBITS = [(2, "packed"), (2, "none"), (4, "packed"), (4, "float"), (4, "none"), (8, "packed"), (8, "none")]
"""Bit widths and zero-point forms (ONNX Runtime's CPU kernel takes float zero points at 4 bits only)."""


@pytest.mark.parametrize(("bits", "zero_points"), _NBITS, ids=[f"{b}bit-{z}" for b, z in _NBITS])
@pytest.mark.parametrize(("k", "block"), [(64, 32), (40, 16)], ids=["whole-blocks", "ragged-last-block"])
def test_matmul_nbits(bits: int, zero_points: str, k: int, block: int) -> None:
    """Weights quantized and packed here, block by block along K, against ONNX Runtime's MatMulNBits."""
    rng = np.random.default_rng(bits * 7 + k)
    n = 12
    blocks = -(-k // block)
    q = rng.integers(0, 1 << bits, (n, blocks * block))
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    feeds: dict[str, np.ndarray | None] = {"a": rng.standard_normal((3, 5, k)).astype(np.float32)}
    model_b = _pack(q, bits).reshape(n, blocks, block * bits // 8)
    zp: np.ndarray | None = None
    if zero_points == "packed":
        zp = _pack(rng.integers(0, 1 << bits, (n, blocks)), bits).reshape(-1)
    elif zero_points == "float":
        zp = (rng.random((n, blocks)) * 15).astype(np.float32).reshape(-1)
    consts = {"b": model_b, "scales": scales.reshape(-1), "zp": zp}
    node = helper.make_node("MatMulNBits", ["a", "b", "scales", "zp" if zp is not None else "", "", "bias"], ["y"],
                            domain="com.microsoft", K=k, N=n, bits=bits, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 5, k])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, name) for name, v in
                               {**consts, "bias": rng.standard_normal(n).astype(np.float32)}.items() if v is not None])
    model = helper.make_model(graph, opset_imports=CONTRIB_OPSETS, ir_version=8)
    ort_agrees(model, feeds, tol=1e-4)


def test_matmul_nbits_refuses_what_it_does_not_read() -> None:
    rng = np.random.default_rng(0)
    b = np.zeros((4, 1, 16), np.uint8)
    feeds = {"a": rng.standard_normal((2, 32)).astype(np.float32), "b": b, "s": np.ones(4, np.float32)}
    with pytest.raises(UnsupportedOpError, match="compile-time value"):
        import_onnx(contrib_model("MatMulNBits", feeds, ["y"], K=32, N=4, bits=4, block_size=32))
    with pytest.raises(UnsupportedOpError, match="bits=3"):
        import_onnx(contrib_model("MatMulNBits", feeds, ["y"], K=32, N=4, bits=3, block_size=32))
