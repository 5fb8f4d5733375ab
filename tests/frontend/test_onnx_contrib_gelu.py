"""ONNX Runtime's GELU-family contrib ops (``com.microsoft``), which its graph optimizer writes into the files
it saves: each imported as Cuvil's own ops, run on the interpreter and as a compiled library, and compared
with ONNX Runtime (the oracle) on values spread over the activations' curved range."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]

CASES: list[tuple[str, bool, dict[str, Any], list[str]]] = [
    ("Gelu", False, {}, ["gelu"]),
    ("BiasGelu", True, {}, ["add", "gelu"]),
    ("FastGelu", False, {}, ["gelu"]),
    ("FastGelu", True, {}, ["add", "gelu"]),
    ("QuickGelu", False, {}, ["mul", "sigmoid", "mul"]),
    ("QuickGelu", False, {"alpha": 1.0}, ["silu"]),
]


def _model(op: str, bias: bool, attrs: dict[str, Any]) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8])]
    if bias:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]))
    node = helper.make_node(op, [i.name for i in inputs], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


@pytest.mark.parametrize(("op", "bias", "attrs", "ops"), CASES, ids=[f"{c[0]}{'-bias' if c[1] else ''}"
                                                                      f"{'-alpha' if c[2] else ''}" for c in CASES])
def test_contrib_gelu_matches_onnxruntime(op: str, bias: bool, attrs: dict[str, Any], ops: list[str]) -> None:
    model = _model(op, bias, attrs)
    rng = np.random.default_rng(len(op))
    feeds = {"x": (rng.standard_normal((2, 3, 8)) * 3).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(8).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    module = import_onnx(model)
    assert [v.op for v in module.main.ops() if v.op != "const"] == ops
    (got,) = run_reference(module, list(feeds.values()))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    library = cuvil.compile(model, cache=False)
    np.testing.assert_allclose(np.asarray(library(*feeds.values())), want, rtol=2e-6, atol=2e-6)


def test_other_contrib_ops_are_refused_by_name() -> None:
    node = helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                                            helper.make_tensor_value_info("g", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=8)
    with pytest.raises(UnsupportedOpError, match="SkipLayerNormalization"):
        import_onnx(model)
