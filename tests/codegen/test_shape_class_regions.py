"""Loops and conds in a library for a whole shape class: a recurrence over a symbolic sequence length,
a run-time ``If`` and a while loop over symbolic sizes each compile once, with the trip count and
every size read from the dims at run time, and match the oracles (ONNX Runtime, onnx's reference
evaluator) at several shapes; the O3 pipeline is proved on the symbolic function, loop bodies
included."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.codegen.kernels import tuned_kernels
from cuvil.errors import ConstraintError
from tests.frontend.test_onnx_recurrent_loops import _feeds, _model
from verify.gate import make_gate

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
F = TensorProto.FLOAT


@pytest.mark.parametrize(("op", "direction", "lens"), [("LSTM", "bidirectional", True), ("GRU", "reverse", False),
                                                       ("RNN", "forward", True)])
def test_a_recurrence_compiles_once_for_every_length(op: str, direction: str, lens: bool) -> None:
    model = _model(op, direction, lens, seed=3, clip=3.0)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False, shape_class=True, dim_max={"T": 40, "N": 8},
                             gate=make_gate())
    man = compiled.manifest
    assert man is not None and man["shape_class"]["maxima"] == {"N": 8, "T": 40}
    cert = man["verification"]
    assert cert["summary"]["proved"] == cert["summary"]["obligations"] > 0
    assert cert["shapes"]["scope"] == "shape class"
    if "matmul" in tuned_kernels():  # the input projection over every step: the tuned GEMM, M read at run time
        assert any(k.endswith("runtime_m") for k in man["kernels"]), man["kernels"]
    where = Counter(o["function"] for a in cert["applications"] for o in a["obligations"])
    assert any(f.endswith("loop_body") for f in where), where  # the body's rewrites were proved too
    for trips in (1, 6, 40):
        feeds = _feeds(trips, lens, trips)
        for g, w in zip(compiled(**feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConstraintError, match="T=41"):
        compiled(**_feeds(41, lens, 0))


def _branch(name: str, nodes: list[onnx.NodeProto], outs: list[str]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, F, None) for o in outs])


def _if_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0): relu(x @ w) else x @ w - 1, for x[N, 4] (the branches read an outer value)."""
    then = _branch("then", [helper.make_node("Relu", ["m"], ["y_t"])], ["y_t"])
    other = _branch("else", [helper.make_node("Sub", ["m", "one"], ["y_e"])], ["y_e"])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = {"w": np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32),
             "zero": np.array(0, np.float32), "one": np.array(1, np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["N", 4])],
                              [helper.make_tensor_value_info("y", F, ["N", 6])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_run_time_if_over_symbolic_sizes_takes_each_branch() -> None:
    model = _if_model()
    compiled = cuvil.compile(model.SerializeToString(), cache=False, shape_class=True, dim_max={"N": 16})
    rng = np.random.default_rng(7)
    for n, shift in ((1, 1.0), (5, -1.0), (16, 1.0), (9, -2.0)):
        x = (rng.standard_normal((n, 4)) + shift).astype(np.float32)
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_allclose(compiled(x), want, rtol=1e-6, atol=1e-6)


def _while_model() -> onnx.ModelProto:
    """x[N] <- x * 2 + 0.5 while sum(|x|) < 100, at most M times; also counts the iterations."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_in", "two"], ["m"]), helper.make_node("Add", ["m", "half"], ["x_out"]),
         helper.make_node("Abs", ["x_out"], ["a"]), helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["c_out"]), helper.make_node("Add", ["n_in", "one"], ["n_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("x_in", F, ["N"]),
                 helper.make_tensor_value_info("n_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("x_out", F, ["N"]),
         helper.make_tensor_value_info("n_out", TensorProto.INT64, [])])
    inits = {"two": np.array(2, np.float32), "half": np.array(0.5, np.float32), "limit": np.array(100, np.float32),
             "one": np.array(1, np.int64), "zero": np.array(0, np.int64), "M": np.array(30, np.int64)}
    node = helper.make_node("Loop", ["M", "go", "x", "zero"], ["y", "n"], body=body)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, ["N"]),
                                            helper.make_tensor_value_info("go", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, ["N"]),
                               helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_while_loop_over_a_symbolic_size_stops_where_the_reference_does() -> None:
    model = _while_model()
    compiled = cuvil.compile(model.SerializeToString(), cache=False, shape_class=True, dim_max={"N": 64})
    counts = set()
    for n, x0 in ((1, 0.1), (7, 3.0), (64, 0.01), (3, 60.0)):
        feeds = {"x": np.full(n, x0, np.float32), "go": np.array(True)}
        want = ReferenceEvaluator(model).run(None, feeds)
        got = compiled.run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        counts.add(int(got[1]))
    assert len(counts) >= 3
