"""Models whose import decides on the value of a dim (an If on ``x.shape[0] == 1``, a Reshape target
computed from a dim comparison) have no one function for every shape: they are imported once per shape
signature with the dims pinned, each shape taking its own branch, and match ONNX Runtime at each."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontend.onnx_import import declared_types, import_onnx
from cuvil.frontend.onnx_node import SymbolicValueRequired

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")


def _squeeze_if_single() -> onnx.ModelProto:
    """``y = squeeze(x, 0) * 2 if x.shape[0] == 1 else x + 1``, the branches of different ranks, as
    PyTorch exports ``if x.dim(0) == 1``."""
    zero, one = numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(
        np.array(1, np.int64), "one")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "zero"], ["s"]),
                              helper.make_node("Mul", ["s", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Add", ["x", "two"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"]),
             helper.make_node("Squeeze", ["n"], ["n0"]),
             helper.make_node("Equal", ["n0", "one"], ["single"]),
             helper.make_node("If", ["single"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [zero, one, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_import_says_which_value_it_needs() -> None:
    with pytest.raises(SymbolicValueRequired, match="N"):
        import_onnx(_squeeze_if_single())


def test_pinned_dims_import_one_branch_each() -> None:
    single = import_onnx(_squeeze_if_single(), dims={"N": 1}).main
    many = import_onnx(_squeeze_if_single(), dims={"N": 4}).main
    assert single.params[0].type.shape == (1, 3) and single.results[0].type.shape == (3,)
    assert many.results[0].type.shape == (4, 3)
    inputs, outputs = declared_types(_squeeze_if_single())
    assert [(n, str(t)) for n, t in inputs] == [("x", "f32[N, 3]")]
    assert [n for n, _ in outputs] == ["y"]


def test_a_dynamic_compile_imports_per_shape_and_matches_onnxruntime() -> None:
    model = _squeeze_if_single()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False)
    assert compiled.is_dynamic
    rng = np.random.default_rng(0)
    for n in (1, 4, 2, 1):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        got = compiled(x)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_static_compile_without_shapes_names_what_to_give(tmp_path) -> None:
    with pytest.raises(CuvilError) as err:
        cuvil.compile(_squeeze_if_single().SerializeToString(), output_dir=tmp_path)
    assert "--shape" in (err.value.hint or "")


def test_verify_and_probe_import_at_the_shapes_they_are_given(tmp_path, capsys) -> None:
    """``cuvil verify --shape`` and ``cuvil probe --dim`` pin the dims the import needs, as compile does."""
    from cuvil import cli

    path = tmp_path / "m.onnx"
    path.write_bytes(_squeeze_if_single().SerializeToString())
    assert cli.main(["verify", str(path), "--shape", "x=1x3", "-q"]) == 0
    assert "0 refuted, 0 unknown" in capsys.readouterr().out
    code = cli.main(["probe", str(path), "--dim", "N=4", "--range", "x=-1:1", "--witness-dir", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert code == 0 and "0 open" in out
    assert cli.main(["verify", str(path)]) != 0  # no shapes: the import says which dim it needs
    assert "depends on the run-time value of symbolic dims" in capsys.readouterr().err
