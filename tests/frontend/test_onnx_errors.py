"""Malformed ONNX input: each case fails with its own error class, stable code and a useful message."""

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.errors import (
    AttributeTypeError,
    ConstraintError,
    ExternalDataError,
    InputError,
    MissingInitializerError,
    ModelLoadError,
    RuntimeEvalError,
    UnsupportedOpError,
    UnsupportedOpsetError,
)
from cuvil.frontend.onnx_import import converters, import_onnx
from cuvil.interp import run_reference
from cuvil.ir.parser import parse_module

X23 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def model(nodes, inputs=(X23,), outputs=(Y,), initializers=(), opset=17):
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def relu_model(**kw):
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], **kw)


def fails(source, cls, code, fragment, **kw):
    with pytest.raises(cls) as e:
        import_onnx(source, **kw)
    err = e.value
    assert err.code == code
    assert fragment in err.message, err.message
    assert err.location, "errors name where they happened"
    return err


# --------------------------------------------------------------------------------------
# the file itself


def test_truncated_protobuf(tmp_path):
    data = relu_model().SerializeToString()
    path = tmp_path / "trunc.onnx"
    path.write_bytes(data[: len(data) // 2])
    err = fails(path, ModelLoadError, "CUVIL-LOAD", "not a valid ONNX protobuf")
    assert err.location == str(path)
    assert "complete ONNX" in err.hint


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    fails(path, ModelLoadError, "CUVIL-LOAD", "model file is empty")


def test_missing_file(tmp_path):
    fails(tmp_path / "nope.onnx", ModelLoadError, "CUVIL-LOAD", "does not exist")


@pytest.mark.parametrize("opset", [3, 99])
def test_unsupported_opset(opset):
    err = fails(relu_model(opset=opset), UnsupportedOpsetError, "CUVIL-OPSET", f"ONNX opset {opset} is not supported")
    assert err.location == "opset_import"


# --------------------------------------------------------------------------------------
# the graph


def test_unknown_op_type():
    m = model([helper.make_node("FooBar", ["x"], ["y"], name="weird")])
    err = fails(m, UnsupportedOpError, "CUVIL-UNSUPPORTED-OP", "ONNX op FooBar is not supported")
    assert "weird" in err.location
    assert "cuvil ops" in err.hint


def test_undefined_input_or_missing_initializer():
    m = model([helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")])
    err = fails(m, MissingInitializerError, "CUVIL-MISSING-TENSOR", "input 'bias' is not defined")
    assert "add_bias" in err.location


@pytest.mark.parametrize("perm", [1.5, [1.0, 0.0]], ids=["float", "floats"])
def test_wrong_attribute_type(perm):
    m = model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=perm)])
    err = fails(m, AttributeTypeError, "CUVIL-ATTR", "attribute 'perm' must be a list of ints")
    assert "Transpose" in err.location


def test_unsupported_element_type():
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    m = model([helper.make_node("Identity", ["s"], ["y"])], inputs=[s])
    err = fails(m, UnsupportedOpError, "CUVIL-UNSUPPORTED-OP", "element type STRING is not supported")
    assert err.location == "input 's'"


@pytest.mark.parametrize("dim", [-5, 2**62])
def test_impossible_declared_dim(dim):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3])
    start = time.perf_counter()
    fails(relu_model(inputs=[x]), ModelLoadError, "CUVIL-LOAD", "which no tensor can have")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("nodes", [
    [helper.make_node("Relu", ["z"], ["y"], name="a"), helper.make_node("Relu", ["y"], ["z"], name="b")],
    [helper.make_node("Add", ["x", "y"], ["y"], name="self_loop")],
], ids=["two-node-cycle", "self-loop"])
def test_cyclic_graph(nodes):
    start = time.perf_counter()
    err = fails(model(nodes), ModelLoadError, "CUVIL-LOAD", "the graph has a cycle or is not topologically sorted")
    assert "topological order" in err.hint
    assert time.perf_counter() - start < 5


# --------------------------------------------------------------------------------------
# external data


def external_model(tmp_path, location):
    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "b")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", location
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    path = d / "m.onnx"
    path.write_bytes(model([helper.make_node("Add", ["x", "b"], ["y"])], initializers=[t]).SerializeToString())
    return path


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_external_data_escaping_the_model_directory(tmp_path, where):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones(6, np.float32).tobytes())  # readable, but outside: must not be read
    location = "../secret.bin" if where == "relative" else str(secret)
    err = fails(external_model(tmp_path, location), ExternalDataError, "CUVIL-EXTERNAL-DATA",
                "escapes the model directory")
    assert "initializer 'b'" in err.location
    assert "inside the model's directory" in err.hint


def test_external_data_file_missing(tmp_path):
    fails(external_model(tmp_path, "weights.bin"), ExternalDataError, "CUVIL-EXTERNAL-DATA",
          "external data file 'weights.bin' of tensor 'b' does not exist")


def test_external_data_inside_the_directory_loads(tmp_path):
    """The control case: the same model with its data in place imports and runs."""
    path = external_model(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.full(6, 2.0, np.float32).tobytes())
    m = import_onnx(path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_reference(m, [x])[0], x + 2.0)


# --------------------------------------------------------------------------------------
# run time


def symbolic_relu():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    return import_onnx(relu_model(inputs=[x]))


def test_run_time_shape_mismatch():
    m = symbolic_relu()
    with pytest.raises(InputError) as e:
        run_reference(m, [np.zeros((2, 4), np.float32)])
    assert e.value.code == "CUVIL-INPUT"
    assert "input shapes do not match" in e.value.message
    with pytest.raises(InputError, match="expected rank 2"):
        run_reference(m, [np.zeros(3, np.float32)])


def test_run_time_dtype_mismatch():
    with pytest.raises(InputError) as e:
        run_reference(symbolic_relu(), [np.zeros((2, 3), np.float64)])
    assert e.value.code == "CUVIL-INPUT"
    assert "has dtype float64, expected f32" in e.value.message


def test_dim_constraint_violation():
    with pytest.raises(ConstraintError) as e:
        run_reference(symbolic_relu(), [np.zeros((0, 3), np.float32)])
    assert e.value.code == "CUVIL-DIM-CONSTRAINT"
    assert "dim N=0 violates the constraint 1 <= N" in e.value.message
    text = ("module {\n  func @main(%x: f32[N, 3]) -> (%y: f32[N, 3]) where 1 <= N <= 4, N % 2 == 0 {\n"
            "    %0 = relu(%x) : f32[N, 3]\n    return %0\n  }\n}\n")
    m = parse_module(text)
    run_reference(m, [np.zeros((4, 3), np.float32)])
    for rows in (3, 6):
        with pytest.raises(ConstraintError, match=f"dim N={rows} violates"):
            run_reference(m, [np.zeros((rows, 3), np.float32)])


def test_gather_index_out_of_range_at_run_time():
    if ("", "Gather") not in converters():
        pytest.skip("the ONNX Gather converter has not landed yet")
    idx = helper.make_tensor_value_info("i", TensorProto.INT64, [2])
    m = import_onnx(model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], inputs=[X23, idx]))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_reference(m, [x, np.array([1, 0])])[0], x[[1, 0]])
    with pytest.raises(RuntimeEvalError) as e:
        run_reference(m, [x, np.array([0, 7])])
    assert e.value.code == "CUVIL-EVAL"
    assert "out of range" in e.value.message


# --------------------------------------------------------------------------------------
# nothing hangs


HANG_CHECK = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))  # a runaway allocation fails fast
    from cuvil.errors import CuvilError
    from cuvil.frontend.onnx_import import import_onnx
    out = {}
    for path in sys.argv[1:]:
        start = time.perf_counter()
        try:
            import_onnx(path)
            result = "ok"
        except CuvilError as e:
            result = e.code
        except BaseException as e:
            result = "crash: " + type(e).__name__ + ": " + str(e)[:200]
        out[path] = [result, time.perf_counter() - start]
    print(json.dumps(out))
""")


def test_importing_never_hangs(tmp_path):
    """Bogus sizes and broken graphs end in an error (or a cheap import), never in a hang or a crash;
    run in a child process with a memory cap and a timeout so a regression cannot stall the suite."""
    big = [numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "shape")]
    rng = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in ((0, "a"), (10**12, "b"), (1, "d"))]
    x_huge = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**62, 2**62])
    no_data = onnx.TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[2**40])
    cases = {
        "huge_dim": relu_model(inputs=[x_huge]),
        "cycle": model([helper.make_node("Relu", ["z"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]),
        "huge_constant_of_shape": model([helper.make_node("ConstantOfShape", ["shape"], ["z"]),
                                         helper.make_node("Add", ["z", "z"], ["y"])], inputs=[], initializers=big),
        "huge_expand": model([helper.make_node("Expand", ["x", "shape"], ["y"])],
                             inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                             initializers=big),
        "huge_range": model([helper.make_node("Range", ["a", "b", "d"], ["y"])], inputs=[], initializers=rng),
        "initializer_without_data": model([helper.make_node("Relu", ["c"], ["y"])], inputs=[],
                                          initializers=[no_data]),
    }
    paths = []
    for name, m in cases.items():
        p = tmp_path / f"{name}.onnx"
        p.write_bytes(m.SerializeToString())
        paths.append(str(p))
    done = subprocess.run([sys.executable, "-c", HANG_CHECK, *paths], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    for path, (result, seconds) in results.items():
        assert not result.startswith("crash"), f"{path}: {result}"
        assert seconds < 10, f"{path} took {seconds:.1f} s"
    by_name = {p.rsplit("/", 1)[-1][:-5]: r for p, (r, _) in results.items()}
    assert by_name["huge_dim"] == "CUVIL-LOAD"
    assert by_name["cycle"] == "CUVIL-LOAD"
    assert by_name["initializer_without_data"] == "CUVIL-LOAD"

