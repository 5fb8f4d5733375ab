"""ONNX ``Loop`` whose condition only a run knows (the initial one fed as an input, or the body's),
imported as one while ``loop`` bounded by its trip count: compared with onnx's reference evaluator
(an oracle only) through the interpreter and compiled code for inputs that stop it at different
iterations, and proved through its body like any loop."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.frontend.onnx_node import StaticInputRequired
from cuvil.interp import run_reference
from cuvil.ir.unroll import unroll_module
from verify import check_rewrite

F = TensorProto.FLOAT


def _doubling_body(swap: bool = False) -> onnx.GraphProto:
    """x <- x * 2 + step; go on while sum(|x|) < limit; also counts iterations in n."""
    add = ["m", "step"] if not swap else ["step", "m"]
    nodes = [helper.make_node("Mul", ["x_in", "two"], ["m"]), helper.make_node("Add", add, ["x_out"]),
             helper.make_node("Abs", ["x_out"], ["a"]), helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "limit"], ["c_out"]),
             helper.make_node("Add", ["n_in", "one"], ["n_out"])]
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", F, [3]), helper.make_tensor_value_info("n_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("x_out", F, [3]),
         helper.make_tensor_value_info("n_out", TensorProto.INT64, [])])


def _model(trips: int | None = 20, swap: bool = False, cond_input: bool = True) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", F, [3])]
    if cond_input:
        inputs.append(helper.make_tensor_value_info("go", TensorProto.BOOL, []))
    loop_in = ["M" if trips is not None else "", "go" if cond_input else "", "x", "zero"]
    inits = {"two": np.array(2, np.float32), "step": np.array([0.5, -0.25, 1.0], np.float32),
             "limit": np.array(100, np.float32), "one": np.array(1, np.int64), "zero": np.array(0, np.int64)}
    if trips is not None:
        inits["M"] = np.array(trips, np.int64)
    node = helper.make_node("Loop", loop_in, ["y", "n"], body=_doubling_body(swap))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, [3]),
                                                    helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("trips", [20, 3])
def test_a_while_loop_stops_where_the_reference_does(trips: int) -> None:
    model = _model(trips)
    module = import_onnx(model)
    (loops,) = {v.attr("stop") for v in module.main.ops() if v.op == "loop"}
    assert loops == 0
    compiled = cuvil.compile(module, cache=False)
    counts = set()
    for x0, go in ((0.1, True), (3.0, True), (60.0, True), (0.1, False)):
        x = np.array([x0, -x0, x0 / 2], np.float32)
        feeds = {"x": x, "go": np.array(go)}
        want = ReferenceEvaluator(model).run(None, feeds)
        got = run_reference(module, feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        for c, w in zip(compiled.run(feeds), want, strict=True):
            np.testing.assert_array_equal(c, w)
        counts.add(int(got[1]))
    assert len(counts) >= 3  # the inputs stop it after different numbers of iterations


def test_without_an_initial_condition_the_body_condition_is_ignored() -> None:
    """ONNX: Loop(M, "") is a for loop (the condition the body computes is ignored), so the body's
    data-dependent condition does not make it a while loop. (onnx's reference evaluator runs no
    iteration at all here, against the specification: the expected values are computed directly.)"""
    module = import_onnx(_model(5, cond_input=False))
    assert all(v.attr("stop") == -1 for v in module.main.ops() if v.op == "loop")
    x = np.array([0.1, -0.1, 0.05], np.float32)
    want = x.copy()
    for _ in range(5):
        want = want * np.float32(2) + np.array([0.5, -0.25, 1.0], np.float32)
    y, n = run_reference(module, {"x": x})
    np.testing.assert_array_equal(y, want)
    assert int(n) == 5


def test_a_while_loop_is_proved_through_its_body_and_never_unrolled() -> None:
    cert = check_rewrite(import_onnx(_model()), import_onnx(_model(swap=True))).certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    assert any(o["function"] == "main/loop_body" and o["verdict"] == "proved"
               for o in cert["applications"][0]["obligations"])
    with pytest.raises(UnsupportedOpError, match="while loop"):
        unroll_module(import_onnx(_model()))


def test_a_while_loop_without_a_trip_count_is_refused() -> None:
    """It could run forever: the condition is then needed at import (a caller that can bind the
    input it comes from imports the loop unrolled at that value), and the hint says why."""
    with pytest.raises(StaticInputRequired) as e:
        import_onnx(_model(trips=None))
    assert e.value.hint is not None and "may not terminate" in e.value.hint
