"""ONNX ReduceL1/L2/SumSquare/LogSum/LogSumExp, LpNormalization and MeanVarianceNormalization on float16
and bfloat16: reduced in float32 and rounded once, as ONNX Runtime does. An L2 norm of values up to 300
over 32 elements is about 1,000 (finite) though its squares sum past float16's 65,504; the sum of squares
itself is inf in both, and a row normalized by it is not all zeros; E[x²] - E[x]² of halves would cancel
to nothing."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil import import_model
from cuvil.interp import run_reference

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
OPS = ["ReduceL2", "ReduceL1", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "LpNormalization",
       "MeanVarianceNormalization"]


def _model(op: str, dtype: int) -> bytes:
    attrs = {"LpNormalization": {"axis": 1, "p": 2}, "MeanVarianceNormalization": {"axes": [1]}}.get(
        op, {"keepdims": 0, "axes": [1]})
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", dtype, [4, 32])],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("op", OPS)
def test_float16_reductions_match_onnx_runtime(op):
    x = np.random.default_rng(0).uniform(1, 300, (4, 32)).astype(np.float16)
    model = _model(op, TensorProto.FLOAT16)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_reference(import_model(model), [x])[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    if op in ("ReduceL2", "LpNormalization"):
        assert np.all(np.isfinite(got)) and np.all(np.square(x.astype(np.float32)).sum(axis=1) > 65504)
        assert np.all(got != 0)


@pytest.mark.parametrize("op", OPS)
def test_float32_reductions_have_no_casts(op):
    module = import_model(_model(op, TensorProto.FLOAT))
    assert "cast" not in {v.op for v in module.main.ops()}
