"""``cuvil.onnx_backend`` in compiled mode: models run as native code from ``cuvil.compile``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil.onnx_backend as backend
from bench.onnx_conformance import compare_exact
from cuvil.errors import InputError

RNG = np.random.default_rng(7)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[str],
           opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [onnx.ValueInfoProto(name=n) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_compiled_mode_runs_native_code_and_matches_numpy() -> None:
    model = _model([helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["out"])],
                   [("x", TensorProto.FLOAT, [2, 3]), ("y", TensorProto.FLOAT, [3])], ["out"])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    y = RNG.standard_normal(3).astype(np.float32)
    rep = backend.prepare(model, mode="compiled", opt_level=1)
    (out,) = rep.run([x, y])
    np.testing.assert_array_equal(out, np.maximum(x + y, 0))
    assert rep.module is not None  # no input is needed statically
    compiled = rep.compiled(rep.module)
    assert compiled.library_path is not None and compiled.library_path.suffix == ".so"
    assert rep.compiled(rep.module) is compiled  # compiled once per module


def test_compiled_mode_specializes_attribute_like_inputs() -> None:
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["out"])],
                   [("x", TensorProto.INT32, [2, 6]), ("shape", TensorProto.INT64, [2])], ["out"])
    x = np.arange(12, dtype=np.int32).reshape(2, 6)
    rep = backend.prepare(model, mode="compiled")
    for shape in ([3, 4], [4, 3]):
        (out,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(out, x.reshape(shape))


def test_run_node_takes_the_mode() -> None:
    node = helper.make_node("Mul", ["a", "b"], ["c"])
    a = RNG.integers(-50, 50, (3, 4)).astype(np.int64)
    b = RNG.integers(-50, 50, (3, 4)).astype(np.int64)
    (c,) = backend.run_node(node, [a, b], mode="compiled")
    np.testing.assert_array_equal(c, a * b)


def test_interpreter_and_reference_modes_and_unknown_modes() -> None:
    model = _model([helper.make_node("Neg", ["x"], ["out"])], [("x", TensorProto.FLOAT, [4])], ["out"])
    x = RNG.standard_normal(4).astype(np.float32)
    for mode in ("interpreter", "reference"):
        rep = backend.prepare(model, mode=mode)
        assert rep.mode == "interpreter"
        np.testing.assert_array_equal(rep.run([x])[0], -x)
    with pytest.raises(InputError, match="unknown backend mode"):
        backend.prepare(model, mode="jit")


def test_narrow_element_types_compile_bit_for_bit() -> None:
    model = _model([helper.make_node("Cast", ["x"], ["out"], to=TensorProto.FLOAT8E4M3FN)],
                   [("x", TensorProto.FLOAT, [5])], ["out"])
    x = np.array([0.5, 1.0, -2.0, 3.0, np.nan], np.float32)
    expected = x.astype(ml_dtypes.float8_e4m3fn)
    got = backend.run_model(model, [x], mode="compiled")[0]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
    assert compare_exact(got, backend.run_model(model, [x])[0]) == ""  # NaN compares by its bits


def test_compare_exact_is_exact_for_integers_and_relative_for_floats() -> None:
    a = np.array([1, 2, 3], np.int32)
    assert compare_exact(a, a.copy()) == ""
    assert "1 of 3" in compare_exact(a, np.array([1, 2, 4], np.int32))
    f = np.array([1.0, -2.0, np.nan, np.inf], np.float32)
    assert compare_exact(f, f.copy()) == ""
    assert compare_exact(f * np.float32(1 + 5e-6), f) == ""
    assert "differ" in compare_exact(f * np.float32(1 + 1e-4), f)
    assert "!= interpreter float64" in compare_exact(np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0]))
