"""ONNX BitCast imports as CIR bitcast: the output has the input's bits, compared word for word with
ONNX Runtime and with numpy's view (signaling NaNs and payloads included); widths that differ are
refused with the reason, a cast to the input's own type forwards it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
             np.dtype(np.uint32): TensorProto.UINT32, np.dtype(np.float64): TensorProto.DOUBLE,
             np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float16): TensorProto.FLOAT16,
             np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.int16): TensorProto.INT16, BF16: TensorProto.BFLOAT16,
             np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
             np.dtype(np.bool_): TensorProto.BOOL}


def _model(src: np.dtype, to: np.dtype, shape: tuple[int, ...]) -> onnx.ModelProto:
    node = helper.make_node("BitCast", ["x"], ["y"], to=ONNX_TYPE[to])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", ONNX_TYPE[src], shape)],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[to], shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])


def _words(src: np.dtype) -> np.ndarray:
    """Signaling and quiet NaNs with payloads, -0.0, infinities and random words, read as ``src``."""
    if src == np.dtype(np.bool_):
        return np.array([[True, False, True], [False, False, True]])
    ints = np.dtype(f"u{src.itemsize}")
    top = np.iinfo(ints).max
    edge = [0, 1, top, top >> 1, (top >> 1) + 1, 0x7F800001 & top, 0x7C01 & top, 0x7FF0000000000001 & top]
    rand = np.random.default_rng(src.itemsize).integers(0, top, 16, dtype=np.uint64, endpoint=True)
    return np.concatenate([np.array(edge, dtype=np.uint64), rand]).astype(ints).reshape(4, 6).view(src)


PAIRS = [(np.float32, np.int32), (np.int32, np.float32), (np.float64, np.int64), (np.int64, np.float64),
         (np.uint32, np.int32), (np.int8, np.uint8), (np.uint16, np.int16), (np.float16, np.uint16),
         (np.uint16, np.float16), (BF16, np.int16), (np.int16, BF16), (np.bool_, np.uint8)]


@pytest.mark.parametrize(("src", "to"), PAIRS, ids=lambda t: np.dtype(t).name)
def test_bitcast_keeps_every_bit(src: type, to: type) -> None:
    s, t = np.dtype(src), np.dtype(to)
    x = _words(s)
    (y,) = run_reference(import_onnx(_model(s, t, x.shape)), [x])
    assert y.dtype == t and y.tobytes() == x.view(t).tobytes()


ORT_PAIRS = [p for p in PAIRS if BF16 not in p and np.bool_ not in p]
"""ONNX Runtime has no BitCast for bool, and its Python binding takes no bfloat16 arrays."""


@pytest.mark.parametrize(("src", "to"), ORT_PAIRS, ids=lambda t: np.dtype(t).name)
def test_bitcast_matches_onnxruntime_word_for_word(src: type, to: type) -> None:
    s, t = np.dtype(src), np.dtype(to)
    x = _words(s)
    (want,) = ort.InferenceSession(_model(s, t, x.shape).SerializeToString()).run(None, {"x": x})
    (got,) = run_reference(import_onnx(_model(s, t, x.shape)), [x])
    assert got.tobytes() == np.asarray(want).tobytes()


@pytest.mark.parametrize(("src", "to", "reason"), [
    (np.float32, np.int64, "f32 -> i64: 32 bits cannot be read as 64"),
    (np.uint8, np.bool_, "a byte other than 0 or 1 is no bool"),
])
def test_unequal_widths_are_refused_with_the_reason(src: type, to: type, reason: str) -> None:
    with pytest.raises(UnsupportedOpError, match=reason):
        import_onnx(_model(np.dtype(src), np.dtype(to), (3,)))


def test_a_bitcast_to_the_same_type_forwards_its_input() -> None:
    m = import_onnx(_model(np.dtype(np.float32), np.dtype(np.float32), (3,)))
    assert not any(v.op == "bitcast" for v in m.main.values())
