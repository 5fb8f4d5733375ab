"""ONNX RNN, GRU and LSTM over a symbolic sequence length import as one ``loop`` (not unrolled), and
match ONNX Runtime (the oracle) at several lengths, on the interpreter and compiled."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil import onnx_backend as backend
from cuvil.errors import CuvilError
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


def _counted_loop_model(*, while_loop: bool = False) -> onnx.ModelProto:
    """``for i in range(x.shape[0]): acc = acc * 0.5 + x[i]; ys.append(tanh(acc))``, exported as an
    ONNX Loop whose trip count is the symbolic dim; ``while_loop`` makes the body compute its condition."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
             helper.make_node("Mul", ["acc", "half"], ["decayed"]),
             helper.make_node("Add", ["decayed", "row"], ["acc_out"]),
             helper.make_node("Tanh", ["acc_out"], ["y"])]
    if while_loop:
        nodes.append(helper.make_node("ReduceMax", ["acc_out"], ["peak"], keepdims=0))
        nodes.append(helper.make_node("Less", ["peak", "limit"], ["cond_out"]))
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                        helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                        helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    outer = [helper.make_node("Shape", ["x"], ["shape"], end=1), helper.make_node("Squeeze", ["shape"], ["n"]),
             helper.make_node("Loop", ["n", "true", "acc0"], ["acc_final", "ys"], body=body)]
    consts = [numpy_helper.from_array(np.array(True), "true"), numpy_helper.from_array(np.float32(0.5), "half"),
              numpy_helper.from_array(np.float32(3.0), "limit")]
    graph = helper.make_graph(outer, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
                                           helper.make_tensor_value_info("acc0", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("acc_final", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_onnx_loop_over_a_symbolic_count_is_one_loop_matching_onnxruntime() -> None:
    model = _counted_loop_model()
    assert any(v.op == "loop" for v in import_onnx(model).main.values())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    rng = np.random.default_rng(7)
    for n in (1, 6):
        feeds = {"x": rng.standard_normal((n, 3)).astype(np.float32),
                 "acc0": rng.standard_normal(3).astype(np.float32)}
        want = session.run(None, feeds)
        _assert_matches(backend.run_model(model, feeds), want)
        _assert_matches(compiled(**feeds), want)


def test_a_while_loop_over_a_symbolic_count_is_refused_with_the_reason() -> None:
    with pytest.raises(CuvilError, match="while loop"):
        import_onnx(_counted_loop_model(while_loop=True))
