"""cuvil.onnx_backend: the onnx.backend.base API (prepare once, list/dict inputs, run-time specialization)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil.onnx_backend as backend
from cuvil.errors import CuvilError, InputError
from cuvil.onnx_backend import CuvilBackend, CuvilRep


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[str],
           initializers: list[onnx.TensorProto] = (), opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _add_relu() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["out"])],
                  [("x", TensorProto.FLOAT, [2, 3]), ("y", TensorProto.FLOAT, [3])], ["out"])


def _reshape_by_input() -> onnx.ModelProto:
    """Reshape whose target shape is a graph input: it can only be imported once its value is known."""
    return _model([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                   helper.make_node("Transpose", ["r"], ["out"])],
                  [("x", TensorProto.FLOAT, [2, 6]), ("shape", TensorProto.INT64, [2])], ["out"])


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3)).astype(np.float32)
Y = RNG.standard_normal((3,)).astype(np.float32)


def test_backend_module_exposes_the_onnx_backend_api() -> None:
    assert issubclass(CuvilBackend, onnx.backend.base.Backend)
    assert backend.supports_device("CPU") and backend.supports_device("cpu")
    assert not backend.supports_device("CUDA")
    for name in ("prepare", "run_model", "run_node", "supports_device"):
        assert callable(getattr(backend, name))


def test_prepare_imports_once_and_runs_list_dict_and_tuple_inputs() -> None:
    rep = backend.prepare(_add_relu())
    assert isinstance(rep, CuvilRep) and rep.module is not None
    module = rep.module
    want = np.maximum(X + Y, 0)
    for inputs in ([X, Y], (X, Y), {"x": X, "y": Y}):
        (out,) = rep.run(inputs)
        np.testing.assert_array_equal(out, want)
    assert rep.module is module
    outs = rep.run([X, Y])
    np.testing.assert_array_equal(outs["out"], want)  # outputs are addressable by name too


def test_run_model_accepts_bytes_and_paths(tmp_path) -> None:
    model = _add_relu()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (model, model.SerializeToString(), str(path)):
        (out,) = backend.run_model(source, [X, Y])
        np.testing.assert_array_equal(out, np.maximum(X + Y, 0))


def test_tensor_proto_inputs_are_accepted() -> None:
    (out,) = backend.run_model(_add_relu(), [numpy_helper.from_array(X), numpy_helper.from_array(Y)])
    np.testing.assert_array_equal(out, np.maximum(X + Y, 0))


def test_attribute_like_graph_inputs_specialize_at_run_time_and_are_cached() -> None:
    rep = backend.prepare(_reshape_by_input())
    assert rep.module is None and rep.static_names == {"shape"}
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (a,) = rep.run([x, np.array([3, 4], np.int64)])
    np.testing.assert_array_equal(a, x.reshape(3, 4).T)
    (b,) = rep.run([x, np.array([4, -1], np.int64)])
    np.testing.assert_array_equal(b, x.reshape(4, 3).T)
    (c,) = rep.run({"x": x + 1, "shape": np.array([3, 4], np.int64)})
    np.testing.assert_array_equal(c, (x + 1).reshape(3, 4).T)
    assert len(rep._cache) == 2  # the third run reused the first specialization


def test_specialized_input_must_be_given() -> None:
    rep = backend.prepare(_reshape_by_input())
    with pytest.raises(InputError, match="shape"):
        rep.run({"x": np.zeros((2, 6), np.float32)})


@pytest.mark.parametrize("inputs, pattern", [
    ({"x": X, "y": Y, "z": Y}, "unknown inputs"),
    ([X, Y, Y], "takes 2 inputs"),
    ([X], "missing inputs"),
    ([X.astype(np.float64), Y], "dtype"),
    ([np.zeros((4, 3), np.float32), Y], "shape"),
])
def test_bad_inputs_raise_input_errors(inputs, pattern: str) -> None:
    rep = backend.prepare(_add_relu())
    with pytest.raises(InputError, match=pattern):
        rep.run(inputs)


def test_unsupported_device_is_a_cuvil_error() -> None:
    with pytest.raises(CuvilError, match="device"):
        backend.prepare(_add_relu(), device="CUDA")


def test_run_node_wraps_a_single_node() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (out,) = backend.run_node(node, [X, Y])
    np.testing.assert_array_equal(out, X + Y)


def test_unsupported_ops_fail_at_prepare_with_a_located_error() -> None:
    model = _model([helper.make_node("Bernoulli", ["x"], ["out"])], [("x", TensorProto.FLOAT, [2, 3])], ["out"])
    with pytest.raises(CuvilError) as err:
        backend.prepare(model)
    assert "Bernoulli" in str(err.value)
