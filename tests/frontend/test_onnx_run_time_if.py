"""ONNX ``If`` on a condition only a run knows, imported as one CIR ``cond``: compared with onnx's
reference evaluator (an oracle only) through the interpreter and compiled code on inputs taking each
branch; the compiled library runs only the branch taken; the flattened form the prober reads, the
text format and passes inside branches keep the meaning."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.errors import RuntimeEvalError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference
from cuvil.ir.parser import parse_module
from cuvil.ir.printer import print_module
from cuvil.ir.unroll import flatten_conds
from cuvil.passes.manager import PassManager, parse_pipeline
from verify.gate import make_gate

F = TensorProto.FLOAT


def _branch(name: str, nodes: list[onnx.NodeProto], outs: list[str]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, F, None) for o in outs])


def _if_model(nested: bool = False) -> onnx.ModelProto:
    """y, z = If(sum(x) > 0): (relu(x @ w + b), x * x) else (x - b, inner If or x + x); the branches read
    the input, a value computed before the If, and initializers."""
    then = _branch("then", [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                            helper.make_node("Relu", ["a"], ["y_t"]), helper.make_node("Mul", ["x", "x"], ["z_t"])],
                   ["y_t", "z_t"])
    if nested:
        inner_then = _branch("inner_then", [helper.make_node("Add", ["x", "x"], ["i_t"])], ["i_t"])
        inner_else = _branch("inner_else", [helper.make_node("Neg", ["t"], ["i_e"])], ["i_e"])
        tail = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                helper.make_node("Greater", ["mx", "one"], ["c2"]),
                helper.make_node("If", ["c2"], ["z_e"], then_branch=inner_then, else_branch=inner_else)]
    else:
        tail = [helper.make_node("Add", ["x", "x"], ["z_e"])]
    other = _branch("else", [helper.make_node("Sub", ["x", "b"], ["y_e"]), *tail], ["y_e", "z_e"])
    nodes = [helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y", "z"], then_branch=then, else_branch=other)]
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((4, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
             "zero": np.array(0, np.float32), "one": np.array(1, np.float32)}
    outputs = [helper.make_tensor_value_info(n, F, [3, 4]) for n in ("y", "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 4])], outputs,
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs() -> list[np.ndarray]:
    """Inputs taking every branch: positive sums (then), negative sums with a max above and below 1."""
    rng = np.random.default_rng(11)
    out = []
    for shift in (1.0, -1.0, -2.0):
        x = (rng.standard_normal((3, 4)) * (0.3 if shift < -1 else 1.0) + shift).astype(np.float32)
        out.append(x)
    return out


@pytest.mark.parametrize("nested", [False, True])
def test_a_run_time_if_matches_the_reference_on_every_branch(nested: bool) -> None:
    model = _if_model(nested)
    module = import_onnx(model)
    assert [v.op for v in module.main.ops()].count("cond") == 2  # one cond, two results
    compiled = cuvil.compile(module, cache=False)
    for x in _inputs():
        want = ReferenceEvaluator(model).run(None, {"x": x})
        got = run_reference(module, {"x": x})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        for g, c in zip(got, compiled.run({"x": x}), strict=True):  # O3: sums may be reassociated
            np.testing.assert_allclose(c, g, rtol=1e-5, atol=1e-6)


def test_only_the_branch_taken_runs_in_compiled_code() -> None:
    """The then-branch gathers at an index read from the input; with the else-branch taken, an index
    out of range must not fail the call (it would if both branches ran)."""
    then = _branch("then", [helper.make_node("Gather", ["x", "i"], ["g"], axis=0)], ["g"])
    other = _branch("else", [helper.make_node("Neg", ["x"], ["n"])], ["n"])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                           helper.make_tensor_value_info("x", F, [4]),
                                           helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", F, [4])])
    module = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = cuvil.compile(module, cache=False)
    x = np.arange(4, dtype=np.float32)
    bad = np.array([0, 1, 2, 99], np.int64)
    np.testing.assert_array_equal(compiled.run({"c": np.array(False), "x": x, "i": bad})[0], -x)
    np.testing.assert_array_equal(compiled.run({"c": np.array(True), "x": x, "i": bad[::-1] % 4})[0],
                                  x[bad[::-1] % 4])
    with pytest.raises(RuntimeEvalError):
        compiled.run({"c": np.array(True), "x": x, "i": bad})


def test_flattened_conds_compute_the_same_bits() -> None:
    module = import_onnx(_if_model(nested=True))
    flat = flatten_conds(module)
    assert not any(v.op == "cond" for v in flat.main.ops())
    for x in _inputs():
        for g, f in zip(run_reference(module, {"x": x}), run_reference(flat, {"x": x}), strict=True):
            np.testing.assert_array_equal(g, f)


def test_a_cond_round_trips_through_the_text_format() -> None:
    module = import_onnx(_if_model(nested=True))
    again = parse_module(print_module(module))
    assert print_module(again) == print_module(module)
    x = _inputs()[1]
    for a, b in zip(run_reference(module, {"x": x}), run_reference(again, {"x": x}), strict=True):
        np.testing.assert_array_equal(a, b)


def test_passes_rewrite_inside_branches_and_the_gate_proves_them() -> None:
    """A branch computing with constants only (w @ w) gets it folded inside the branch, proved."""
    then = _branch("then", [helper.make_node("MatMul", ["w", "w"], ["ww"]),
                            helper.make_node("MatMul", ["x", "ww"], ["y_t"])], ["y_t"])
    other = _branch("else", [helper.make_node("Sub", ["x", "w"], ["y_e"])], ["y_e"])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    rng = np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((4, 4)) * 0.5).astype(np.float32), "zero": np.array(0, np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4, 4])],
                              [helper.make_tensor_value_info("y", F, [4, 4])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    module = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    gate = make_gate("strict")
    out = PassManager(parse_pipeline("fold-constants"), gate=gate).run(module).module
    (cond,) = [v for v in out.main.ops() if v.op == "cond"]
    then_ops = [u.op for u in cond.attr("then_body").ops()]
    assert then_ops == ["matmul"], then_ops  # w @ w folded into a constant operand
    x = rng.standard_normal((4, 4)).astype(np.float32)
    for a, b in zip(run_reference(module, {"x": x}), run_reference(out, {"x": x}), strict=True):
        np.testing.assert_array_equal(a, b)
    cert = gate.report().certificate()
    assert cert["summary"]["unknown"] == 0 and cert["summary"]["refuted"] == 0
    assert any(o["function"] == "main/loop_body" and o["verdict"] == "proved"
               for app in cert["applications"] for o in app["obligations"])


def test_branches_of_different_types_need_the_condition_at_compile_time() -> None:
    then = _branch("then", [helper.make_node("Identity", ["x"], ["y_t"])], ["y_t"])
    other = _branch("else", [helper.make_node("Concat", ["x", "x"], ["y_e"], axis=0)], ["y_e"])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from cuvil.frontend.onnx_node import StaticInputRequired

    with pytest.raises(StaticInputRequired, match="'c'"):
        import_onnx(model)
    from cuvil.onnx_backend import CuvilBackend

    rep = CuvilBackend.prepare(model)
    x = np.array([1.0, 2.0], np.float32)
    feeds: dict[str, Any] = {"c": np.array(False), "x": x}
    np.testing.assert_array_equal(rep.run(feeds)[0], np.concatenate([x, x]))
