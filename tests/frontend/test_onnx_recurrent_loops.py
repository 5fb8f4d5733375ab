"""ONNX RNN, GRU and LSTM over a symbolic sequence length import as one ``loop`` (not unrolled), and
match ONNX Runtime (the oracle) at several lengths, on the interpreter and compiled."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil import onnx_backend as backend
from cuvil.frontend.onnx_import import import_onnx

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
BATCH, INPUT, HIDDEN = 3, 5, 6


def _model(op: str, direction: str, lens: bool, seed: int = 0, **attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    gates, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    weights = {"W": rng.standard_normal((dirs, gates * HIDDEN, INPUT)) * 0.5,
               "R": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)) * 0.5,
               "B": rng.standard_normal((dirs, 2 * gates * HIDDEN)) * 0.1}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", INPUT])]
    names = ["X", "W", "R", "B", "lens" if lens else ""]
    if lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["N"]))
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=HIDDEN, direction=direction, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outs],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(trips: int, lens: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"X": rng.standard_normal((trips, BATCH, INPUT)).astype(np.float32)}
    if lens:
        feeds["lens"] = np.array([trips, max(1, trips - 2), 1], np.int32)
    return feeds


def _assert_matches(got: object, want: list[np.ndarray]) -> None:
    got_list = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got_list) == len(want)
    for g, w in zip(got_list, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


CASES = [(op, direction, lens) for op in GATES for direction in ("forward", "reverse", "bidirectional")
         for lens in (False, True)]


@pytest.mark.parametrize("op, direction, lens", CASES)
def test_a_symbolic_length_recurrence_matches_onnxruntime_on_the_interpreter(op: str, direction: str,
                                                                             lens: bool) -> None:
    model = _model(op, direction, lens)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for trips in (1, 4, 9):
        feeds = _feeds(trips, lens, trips)
        _assert_matches(backend.run_model(model, feeds), session.run(None, feeds))


@pytest.mark.parametrize("op, direction, lens", [("LSTM", "bidirectional", True), ("GRU", "reverse", False),
                                                 ("RNN", "forward", True)])
def test_a_symbolic_length_recurrence_compiles_to_a_loop_that_matches_onnxruntime(op: str, direction: str,
                                                                                  lens: bool) -> None:
    model = _model(op, direction, lens, seed=3, clip=3.0)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    for trips in (1, 6, 17):
        feeds = _feeds(trips, lens, trips)
        _assert_matches(compiled(**feeds), session.run(None, feeds))


def test_the_recurrence_is_one_loop_whatever_the_length() -> None:
    """Not unrolled: the imported function has the same ops for any sequence length."""
    fn = import_onnx(_model("LSTM", "bidirectional", True)).main
    loops = [v for v in fn.values() if v.op == "loop"]
    assert loops and {v.attr("reverse") for v in loops} == {False, True}
    assert all(str(v.attr("trips")[0]) == "T" for v in loops)
    assert not any(v.op == "gather" and v.operands[0].type.shape[:1] == ("T",) for v in fn.values())


def _scan_model(in_axis: int, in_dir: int, out_axis: int, out_dir: int) -> onnx.ModelProto:
    """A running sum scaled by an outer weight: state s, scan input x_t; yields s + x_t * w (the new
    state) and relu(s) * w (a scan output); w is read from the enclosing graph."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "w"], ["xw"]), helper.make_node("Add", ["s", "xw"], ["s_new"]),
         helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Mul", ["r", "w"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
                 helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("s_new", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [2, 3])])
    x_shape: list[object] = [2, 3]
    x_shape.insert(in_axis, "T")
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    w = numpy_helper.from_array(np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32), "w")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2, 3]),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("in_axis, in_dir, out_axis, out_dir", [(0, 0, 0, 0), (1, 1, 0, 1), (2, 0, 1, 1),
                                                                (0, 1, 2, 0)])
def test_a_symbolic_length_scan_is_one_loop_matching_onnxruntime(in_axis: int, in_dir: int, out_axis: int,
                                                                  out_dir: int) -> None:
    model = _scan_model(in_axis, in_dir, out_axis, out_dir)
    assert any(v.op == "loop" for v in import_onnx(model).main.values())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    rng = np.random.default_rng(in_axis * 4 + out_axis)
    for trips in (1, 5):
        shape = [2, 3]
        shape.insert(in_axis, trips)
        feeds = {"s0": rng.standard_normal((2, 3)).astype(np.float32),
                 "x": rng.standard_normal(shape).astype(np.float32)}
        want = session.run(None, feeds)
        _assert_matches(backend.run_model(model, feeds), want)
        _assert_matches(compiled(**feeds), want)
