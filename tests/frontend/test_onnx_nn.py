"""ONNX nn, reduce and linalg converters: single-node models imported by Cuvil and run on the
reference interpreter, with ONNX Runtime as the oracle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

_NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
               np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
               np.dtype(np.int32): TensorProto.INT32, np.dtype(np.uint8): TensorProto.UINT8}


@dataclass
class Case:
    """One node: its op, runtime inputs, initializers (constant inputs) and attributes."""

    op: str
    inputs: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    order: list[str] | None = None  # input names in node order ("" for an omitted optional input)
    outputs: int = 1
    opset: int = 21
    tol: float = 1e-5
    id: str = ""


def make_model(c: Case, dims: dict[str, list[Any]] | None = None) -> onnx.ModelProto:
    order = c.order if c.order is not None else [*c.inputs, *c.consts]
    outs = [f"y{k}" for k in range(c.outputs)]
    node = helper.make_node(c.op, order, outs, name="n", **c.attrs)
    ins = [helper.make_tensor_value_info(n, _NP_TO_ONNX[a.dtype], (dims or {}).get(n, list(a.shape)))
           for n, a in c.inputs.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in c.consts.items()]
    graph = helper.make_graph([node], "g", ins, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)], ir_version=10)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare(c: Case, dims: dict[str, list[Any]] | None = None) -> None:
    model = make_model(c, dims)
    expected = run_ort(model, c.inputs)
    got = run_reference(import_onnx(model), c.inputs)
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape, f"{c.op} output {k}: shape {g.shape} != {e.shape}"
        assert g.dtype == e.dtype, f"{c.op} output {k}: dtype {g.dtype} != {e.dtype}"
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=f"{c.op} output {k}")
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=c.tol, atol=c.tol,
                                       err_msg=f"{c.op} output {k}")


R = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def pos32(*shape: int) -> np.ndarray:
    return R.uniform(0.5, 2.0, shape).astype(np.float32)


def i64(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


# --------------------------------------------------------------------------------------
# conv family

CONV_CASES = [
    Case("Conv", {"x": f32(2, 3, 7, 6)}, {"pads": [1, 0, 2, 1], "strides": [2, 1]}, {"w": f32(4, 3, 3, 3)},
         id="asymmetric-pads"),
    Case("Conv", {"x": f32(1, 4, 7, 8)}, {"group": 2, "dilations": [2, 1]}, {"w": f32(6, 2, 3, 3), "b": f32(6)},
         id="groups-bias"),
    Case("Conv", {"x": f32(1, 6, 9, 9)}, {"group": 6, "strides": [2, 2], "auto_pad": "SAME_UPPER"},
         {"w": f32(6, 1, 4, 4), "b": f32(6)}, id="depthwise-same-upper"),
    Case("Conv", {"x": f32(1, 3, 8, 7)}, {"auto_pad": "SAME_LOWER", "strides": [3, 2], "kernel_shape": [2, 3]},
         {"w": f32(2, 3, 2, 3)}, id="same-lower"),
    Case("Conv", {"x": f32(2, 3, 10)}, {"auto_pad": "VALID", "strides": [3]}, {"w": f32(5, 3, 4), "b": f32(5)},
         id="1d-valid"),
    Case("Conv", {"x": f32(1, 2, 5, 4, 6)}, {"pads": [1, 0, 1, 0, 1, 1]}, {"w": f32(3, 2, 3, 2, 3)}, id="3d"),
    Case("Conv", {"x": f32(1, 3, 6, 6), "w": f32(2, 3, 3, 3)}, {}, id="weights-as-input"),
    Case("ConvTranspose", {"x": f32(2, 3, 4, 5)}, {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]},
         {"w": f32(3, 2, 3, 3), "b": f32(2)}, id="t-pads-output-padding"),
    Case("ConvTranspose", {"x": f32(1, 4, 3, 3)}, {"group": 2, "strides": [2, 3], "dilations": [2, 1]},
         {"w": f32(4, 3, 2, 3)}, id="t-groups-dilations"),
    Case("ConvTranspose", {"x": f32(1, 2, 3, 4)}, {"strides": [3, 2], "output_shape": [10, 9]},
         {"w": f32(2, 3, 3, 3)}, id="t-output-shape"),
    Case("ConvTranspose", {"x": f32(1, 2, 3, 4)}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
         {"w": f32(2, 3, 3, 3)}, id="t-same-upper"),
    Case("ConvTranspose", {"x": f32(1, 2, 3, 4)}, {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
         {"w": f32(2, 3, 3, 3)}, id="t-same-lower"),
    Case("ConvTranspose", {"x": f32(2, 3, 5)}, {"strides": [2]}, {"w": f32(3, 2, 3)}, id="t-1d"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.id)
def test_conv_converters_match_onnxruntime(case):
    compare(case)


def test_conv_with_symbolic_batch_and_spatial_dims():
    c = Case("Conv", {"x": f32(2, 3, 9, 7)}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {"w": f32(4, 3, 3, 3)})
    model = make_model(c, {"x": ["N", 3, "H", "W"]})
    module = import_onnx(model)
    for shape in [(2, 3, 9, 7), (1, 3, 6, 10)]:
        x = f32(*shape)
        (got,) = run_reference(module, [x])
        (expected,) = run_ort(make_model(Case("Conv", {"x": x}, c.attrs, c.consts)), {"x": x})
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------
# pooling

POOL_CASES = [
    Case("MaxPool", {"x": f32(2, 3, 7, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    Case("MaxPool", {"x": f32(1, 2, 7, 8)}, {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    Case("MaxPool", {"x": f32(1, 2, 9, 8)}, {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]}),
    Case("MaxPool", {"x": f32(1, 2, 7, 8)}, {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    Case("MaxPool", {"x": f32(1, 2, 7, 8)}, {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    Case("MaxPool", {"x": R.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)}, {"kernel_shape": [2, 2]}, id="uint8"),
    Case("MaxPool", {"x": f32(1, 2, 9)}, {"kernel_shape": [3], "strides": [2], "storage_order": 0}),
    Case("AveragePool", {"x": f32(2, 3, 7, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    Case("AveragePool", {"x": f32(2, 3, 7, 8)},
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "count_include_pad": 1}),
    Case("AveragePool", {"x": f32(1, 2, 7, 8)},
         {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    Case("AveragePool", {"x": f32(1, 2, 7, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    Case("AveragePool", {"x": f32(1, 2, 5, 6, 4)}, {"kernel_shape": [2, 3, 2], "pads": [0, 1, 0, 1, 1, 1]}),
    Case("LpPool", {"x": f32(1, 3, 6, 7)}, {"kernel_shape": [3, 2], "strides": [2, 2], "p": 3}),
    Case("LpPool", {"x": f32(1, 3, 6, 7)}, {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}),
    Case("GlobalAveragePool", {"x": f32(2, 3, 5, 4)}),
    Case("GlobalMaxPool", {"x": f32(2, 3, 5, 4, 2)}),
    Case("GlobalLpPool", {"x": f32(2, 3, 5, 4)}, {"p": 2}),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: c.id or f"{c.op}-{c.attrs}")
def test_pool_converters_match_onnxruntime(case):
    compare(case)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 1, 0, 1]},
                                   {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                                   {"kernel_shape": [2, 2], "dilations": [2, 1]}])
def test_maxpool_indices_output_matches_onnxruntime(attrs, storage_order):
    x = R.integers(0, 4, (2, 3, 6, 7)).astype(np.float32)  # ties: the first maximum in scan order wins
    compare(Case("MaxPool", {"x": x}, {**attrs, "storage_order": storage_order}, outputs=2, opset=12))


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_3d_indices_output_matches_onnxruntime(storage_order):
    x = R.integers(0, 5, (1, 2, 4, 5, 6)).astype(np.float32)
    attrs = {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 0],
             "storage_order": storage_order}
    compare(Case("MaxPool", {"x": x}, attrs, outputs=2, opset=12))


# --------------------------------------------------------------------------------------
# normalization

NORM_CASES = [
    Case("BatchNormalization", {"x": f32(2, 3, 4, 5)}, {"epsilon": 1e-3},
         {"s": f32(3), "b": f32(3), "m": f32(3), "v": pos32(3)}, opset=15),
    Case("BatchNormalization", {"x": f32(4, 3)}, {}, {"s": f32(3), "b": f32(3), "m": f32(3), "v": pos32(3)}, opset=9),
    Case("LayerNormalization", {"x": f32(2, 3, 4)}, {"axis": -1}, {"s": f32(4), "b": f32(4)}, opset=17),
    Case("LayerNormalization", {"x": f32(2, 3, 4)}, {"axis": 1, "epsilon": 1e-3}, {"s": f32(3, 4)}, opset=17,
         id="no-bias"),
    Case("LayerNormalization", {"x": f32(2, 3, 4)}, {"axis": -2}, {"s": f32(3, 4), "b": f32(3, 4)}, opset=17,
         outputs=3, tol=1e-4, id="mean-invstd"),
    Case("LayerNormalization", {"x": f32(2, 3, 4).astype(np.float16)}, {},
         {"s": f32(4).astype(np.float16), "b": f32(4).astype(np.float16)}, opset=17, tol=2e-3, id="f16"),
    Case("InstanceNormalization", {"x": f32(2, 3, 4, 5)}, {"epsilon": 1e-4}, {"s": f32(3), "b": f32(3)}),
    Case("GroupNormalization", {"x": f32(2, 6, 3, 2)}, {"num_groups": 3}, {"s": f32(6), "b": f32(6)}, opset=21),
    Case("GroupNormalization", {"x": f32(2, 4, 5)}, {"num_groups": 2, "epsilon": 1e-3}, {"s": f32(4), "b": f32(4)},
         opset=21),
    Case("LRN", {"x": f32(2, 6, 3, 4)}, {"size": 3, "alpha": 1e-2, "beta": 0.6, "bias": 1.5}),
    Case("MeanVarianceNormalization", {"x": f32(2, 3, 4, 5)}),
    Case("MeanVarianceNormalization", {"x": f32(2, 3, 4, 5)}, {"axes": [1, 3]}),
    Case("LpNormalization", {"x": f32(3, 4)}, {"axis": 1, "p": 1}),
    Case("LpNormalization", {"x": f32(3, 4, 2)}, {"axis": 0, "p": 2}),
    Case("RMSNormalization", {"x": f32(2, 3, 4)}, {"axis": -1}, {"s": f32(4)}, opset=23),
    Case("RMSNormalization", {"x": f32(2, 3, 4)}, {"axis": 1, "epsilon": 1e-3}, {"s": f32(3, 4)}, opset=23),
]


@pytest.mark.parametrize("case", NORM_CASES, ids=lambda c: c.id or f"{c.op}-{c.attrs}-{c.opset}")
def test_norm_converters_match_onnxruntime(case):
    compare(case)


def test_group_norm_opset18_scale_per_group():
    """Opset 18 gave one scale and bias per group; ONNX Runtime no longer runs it, so the oracle
    is the formula: normalize each group, then scale[g] * y + bias[g]."""
    x, scale, bias = f32(2, 6, 3), f32(3), f32(3)
    c = Case("GroupNormalization", {"x": x}, {"num_groups": 3}, {"s": scale, "b": bias}, opset=18)
    (got,) = run_reference(import_onnx(make_model(c)), [x])
    g = x.astype(np.float64).reshape(2, 3, -1)
    norm = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    expected = (norm * scale[:, None] + bias[:, None]).reshape(x.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_mode_matches_onnx_runtime():
    c = Case("BatchNormalization", {"x": f32(2, 3, 4)}, {"training_mode": 1, "momentum": 0.8},
             {"s": f32(3), "b": f32(3), "m": f32(3), "v": pos32(3)}, opset=15, outputs=3)
    compare(c)


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_batch_norm_training_outputs_of_old_opsets_match_onnx_runtime(opset: int) -> None:
    """Before opset 14 training mode is the five outputs (the TorchScript exporter writes weight standardization
    so): the output by the batch's own statistics, the blended running ones, the batch mean, and the saved
    "variance" as ONNX Runtime computes it, an inverse standard deviation."""
    x = f32(3, 4, 5) * 2 + 1
    c = Case("BatchNormalization", {"x": x}, {"momentum": 0.8, "epsilon": 1e-3},
             {"s": f32(4), "b": f32(4), "m": f32(4), "v": pos32(4)}, opset=opset, outputs=5, tol=1e-5)
    compare(c)


@pytest.mark.parametrize(("opset", "outputs"), [(9, 3), (13, 2), (15, 3)])
def test_batch_norm_statistics_outputs_outside_training_mode_are_refused(opset: int, outputs: int) -> None:
    """Statistics outputs without training mode (fewer than five before opset 14, no ``training_mode`` after)."""
    c = Case("BatchNormalization", {"x": f32(2, 3, 4)}, {}, {"s": f32(3), "b": f32(3), "m": f32(3), "v": pos32(3)},
             opset=opset, outputs=outputs)
    with pytest.raises(UnsupportedOpError, match="running statistics outputs"):
        import_onnx(make_model(c))


# --------------------------------------------------------------------------------------
# softmax family

SOFTMAX_CASES = [
    Case(op, {"x": f32(2, 3, 4) * 5}, attrs, opset=opset)
    for op in ("Softmax", "LogSoftmax", "Hardmax")
    for attrs, opset in [({}, 13), ({"axis": 1}, 13), ({"axis": 0}, 13), ({}, 11), ({"axis": 1}, 11),
                         ({"axis": 0}, 11), ({"axis": -1}, 11)]
]


@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=lambda c: f"{c.op}-{c.attrs}-{c.opset}")
def test_softmax_converters_match_onnxruntime(case):
    compare(case)


def test_hardmax_ties_pick_the_first():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2]], dtype=np.float32)
    compare(Case("Hardmax", {"x": x}, {"axis": 1}, opset=13))


# --------------------------------------------------------------------------------------
# reductions, arg-reductions, cumsum, topk

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _reduce_case(op: str, opset: int, axes: list[int] | None, keepdims: int, noop: int = 0) -> Case:
    x = pos32(3, 4, 5) if op == "ReduceLogSum" else f32(3, 4, 5)
    attrs: dict[str, Any] = {"keepdims": keepdims}
    consts: dict[str, np.ndarray] = {}
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    if axes_as_input:
        if noop:
            attrs["noop_with_empty_axes"] = 1
        if axes is not None:
            consts["axes"] = i64(*axes)
    elif axes is not None:
        attrs["axes"] = axes
    return Case(op, {"x": x}, attrs, consts, opset=opset, tol=1e-4)


REDUCE_CASES = [_reduce_case(op, opset, axes, keep)
                for op in REDUCE_OPS
                for opset in (11, 18)
                for axes, keep in [([1], 1), ([0, -1], 0), (None, 1), (None, 0)]]
REDUCE_CASES += [_reduce_case(op, 18, None, 1, noop=1) for op in REDUCE_OPS]


@pytest.mark.parametrize("case", REDUCE_CASES, ids=lambda c: f"{c.op}-{c.opset}-{c.attrs}-{list(c.consts)}")
def test_reduce_converters_match_onnxruntime(case):
    compare(case)


def test_reduce_log_sum_exp_is_stable_for_large_inputs():
    x = (f32(2, 5) + 500).astype(np.float32)
    compare(Case("ReduceLogSumExp", {"x": x}, {"keepdims": 0}, {"axes": i64(1)}, opset=18, tol=1e-4))


def test_reduce_over_an_empty_axis():
    x = np.zeros((2, 0, 3), dtype=np.float32)
    for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceLogSumExp"):
        compare(Case(op, {"x": x}, {"keepdims": 1}, {"axes": i64(1)}, opset=18))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_arg_converters_match_onnxruntime(op, attrs):
    x = R.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    compare(Case(op, {"x": x}, attrs, opset=13))


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum_converter_matches_onnxruntime(attrs, axis):
    compare(Case("CumSum", {"x": f32(3, 4)}, attrs, {"axis": np.array(axis, dtype=np.int64)}, opset=14))


@pytest.mark.parametrize("attrs", [{}, {"axis": 0, "largest": 0}, {"axis": 1, "sorted": 1}])
def test_topk_converter_matches_onnxruntime(attrs):
    x = R.integers(0, 4, (4, 5)).astype(np.float32)  # ties: lower index first
    compare(Case("TopK", {"x": x}, attrs, {"k": i64(3)}, outputs=2, opset=11))


def test_topk_opset1_k_attribute():
    compare(Case("TopK", {"x": f32(3, 6)}, {"k": 2}, outputs=2, opset=9))


# --------------------------------------------------------------------------------------
# linalg

GEMM_CASES = [
    Case("Gemm", {"a": f32(3, 4), "b": f32(4, 5)}, {}, id="plain"),
    Case("Gemm", {"a": f32(4, 3), "b": f32(5, 4), "c": f32(5)}, {"transA": 1, "transB": 1}, id="trans-vector-c"),
    Case("Gemm", {"a": f32(3, 4), "b": f32(4, 5), "c": f32(3, 1)}, {"alpha": 0.5, "beta": 2.0}, id="alpha-beta"),
    Case("Gemm", {"a": f32(3, 4), "b": f32(4, 5)}, {"beta": 0.0}, {"c": f32(1)}, id="beta-zero"),
    Case("Gemm", {"a": f32(3, 4), "b": f32(4, 5)}, {"alpha": 2.0}, {"c": np.array(1.5, dtype=np.float32)},
         id="scalar-c"),
    Case("Gemm", {"a": f32(3, 4), "b": f32(4, 5)}, {}, order=["a", "b", ""], id="omitted-c"),
]


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: c.id)
def test_gemm_converter_matches_onnxruntime(case):
    compare(case)


@pytest.mark.parametrize("eq, shapes", [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                                        ("ii->i", [(4, 4)]), ("...ii->...i", [(2, 3, 3)]), ("ij->", [(3, 4)]),
                                        ("i,i", [(5,), (5,)]), ("ij", [(3, 4)])])
def test_einsum_converter_matches_onnxruntime(eq, shapes):
    inputs = {f"x{k}": f32(*s) for k, s in enumerate(shapes)}
    compare(Case("Einsum", inputs, {"equation": eq}, opset=12))
