"""ONNX Runtime's contrib op com.microsoft::DynamicQuantizeLSTM (what ``quantize_dynamic`` makes of an LSTM):
imported as the LSTM recurrence with u8-quantized-on-the-fly products, a ``loop`` over a symbolic sequence
length, matching ONNX Runtime (the oracle) on the interpreter and compiled.

ONNX Runtime runs single-threaded here: with more threads its kernel quantizes the hidden state of each
thread's share of a larger batch apart, so its result depends on the thread count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil import onnx_backend as backend
from cuvil.frontend.onnx_import import import_onnx
from tests.oracles import ort_sums_u8s8_exactly

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
quantization = pytest.importorskip("onnxruntime.quantization", reason="quantize_dynamic makes the models")

INPUT, HIDDEN = 5, 8
RTOL = 1e-4
OUTPUTS = ("Y", "Y_h", "Y_c")


def _quantized(tmp_path: Path, direction: str, *, batch: int | str = 1, lens: bool = False,
               per_channel: bool = False, outputs: tuple[str, ...] = OUTPUTS, steps: int | str = "T",
               seed: int = 0) -> onnx.ModelProto:
    """A float LSTM with random weights, dynamically quantized by ONNX Runtime's own tool."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    weights = {"W": rng.standard_normal((dirs, 4 * HIDDEN, INPUT)) * 0.5,
               "R": rng.standard_normal((dirs, 4 * HIDDEN, HIDDEN)) * 0.5,
               "B": rng.standard_normal((dirs, 8 * HIDDEN)) * 0.1}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, batch, INPUT])]
    if lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "lens" if lens else ""], list(outputs),
                            hidden_size=HIDDEN, direction=direction)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outputs if o],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "float.onnx")
    quantization.quantize_dynamic(tmp_path / "float.onnx", tmp_path / "int8.onnx",
                                  weight_type=quantization.QuantType.QInt8, per_channel=per_channel,
                                  reduce_range=not ort_sums_u8s8_exactly())
    model = onnx.load(tmp_path / "int8.onnx")
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("com.microsoft", "DynamicQuantizeLSTM")]
    return model


def _unsigned(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same op with uint8 weights: int8 ones shifted by 128, their zero point 128."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.int8:
            init.CopyFrom(numpy_helper.from_array((a.astype(np.int16) + 128).astype(np.uint8), init.name))
    return out


def _session(model: onnx.ModelProto) -> object:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(steps: int, batch: int, lens: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"X": rng.standard_normal((steps, batch, INPUT)).astype(np.float32)}
    if lens:
        feeds["lens"] = np.array([steps, max(1, steps - 2), 1][:batch], np.int32)
    return feeds


def _assert_matches(got: object, want: list[np.ndarray]) -> None:
    got_list = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got_list) == len(want)
    for g, w in zip(got_list, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g64.shape == w64.shape
        error = float(np.max(np.abs(g64 - w64))) / (float(np.max(np.abs(w64))) + 1e-30)
        assert error <= RTOL, error


CASES = [(direction, per_channel) for direction in ("forward", "reverse", "bidirectional")
         for per_channel in (False, True)]


@pytest.mark.parametrize("direction, per_channel", CASES)
def test_a_symbolic_length_quantized_lstm_matches_onnxruntime_on_the_interpreter(tmp_path: Path, direction: str,
                                                                                 per_channel: bool) -> None:
    model = _quantized(tmp_path, direction, per_channel=per_channel)
    session = _session(model)
    for steps in (1, 4, 9):
        feeds = _feeds(steps, 1, False, steps)
        _assert_matches(backend.run_model(model, feeds), session.run(None, feeds))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_a_symbolic_length_quantized_lstm_compiles_to_a_loop_that_matches_onnxruntime(tmp_path: Path,
                                                                                      direction: str) -> None:
    model = _quantized(tmp_path, direction, seed=3)
    assert any(v.op == "loop" for v in import_onnx(model).main.values())
    session = _session(model)
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    for steps in (1, 6, 17):
        feeds = _feeds(steps, 1, False, steps)
        _assert_matches(compiled(**feeds), session.run(None, feeds))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("outputs", [OUTPUTS, ("", "Y_h", "Y_c")], ids=["Y", "no-Y"])
def test_a_batch_of_sequences_of_different_lengths_matches_onnxruntime(tmp_path: Path, direction: str,
                                                                       outputs: tuple[str, ...]) -> None:
    """The hidden state is quantized over the whole batch at once, so the rows of sequences that already
    ended count: ONNX Runtime reads zeros there where the op outputs Y (the last hidden state where it
    does not), and steps a reverse direction from every sequence's own end at once."""
    model = _quantized(tmp_path, direction, batch="N", lens=True, per_channel=True, outputs=outputs, seed=1)
    session = _session(model)
    for steps in (4, 9):
        feeds = _feeds(steps, 3, True, steps)
        _assert_matches(backend.run_model(model, feeds), session.run(None, feeds))


def test_uint8_weights_with_a_zero_point_match_onnxruntime(tmp_path: Path) -> None:
    model = _unsigned(_quantized(tmp_path, "bidirectional", seed=2))
    session = _session(model)
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    for steps in (2, 7):
        feeds = _feeds(steps, 1, False, steps)
        want = session.run(None, feeds)
        _assert_matches(backend.run_model(model, feeds), want)
        _assert_matches(compiled(**feeds), want)


def test_a_static_length_quantized_lstm_is_unrolled_and_matches_onnxruntime(tmp_path: Path) -> None:
    model = _quantized(tmp_path, "bidirectional", batch=2, steps=5, per_channel=True, seed=4)
    assert not any(v.op == "loop" for v in import_onnx(model).main.values())
    feeds = _feeds(5, 2, False, 5)
    _assert_matches(backend.run_model(model, feeds), _session(model).run(None, feeds))
