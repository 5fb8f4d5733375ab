"""`cuvil compile` and `cuvil run`: files written, outputs printed and saved, errors as exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from runtime_models import scaled_softmax, softmax_module

from cuvil.cli import main
from cuvil.codegen.artifact import file_sha256
from cuvil.ir.printer import export_ir

onnx = pytest.importorskip("onnx")


def _onnx_model(path: Path, rows: int | str) -> Path:
    """y = softmax(relu(x * w), axis=-1) over x: f32[rows, 3, 4]."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3, 4])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _onnx_formula(x: np.ndarray) -> np.ndarray:
    h = np.maximum(x.astype(np.float64) * np.linspace(-1.0, 1.0, 12).reshape(3, 4), 0.0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_compile_then_run(tmp_path, capsys, rng):
    model = _onnx_model(tmp_path / "tiny.onnx", 2)
    lib = tmp_path / "out" / "libtiny.so"
    assert main(["compile", "--input", str(model), "--output", str(lib), "--opt-level", "O2"]) == 0
    printed = capsys.readouterr().out
    assert "cache miss" in printed and "x: f32[2, 3, 4]" in printed
    header, manifest_path = tmp_path / "out" / "tiny.h", tmp_path / "out" / "tiny.json"
    assert lib.is_file() and header.is_file() and manifest_path.is_file()
    manifest = json.loads(manifest_path.read_text())
    assert manifest["library"] == "libtiny.so" and manifest["header"] == "tiny.h"
    assert manifest["library_sha256"] == file_sha256(lib) and manifest["opt_level"] == 2
    assert "int32_t cuvil_tiny_run_checked(" in header.read_text()

    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = tmp_path / "outs"
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(outs)]) == 0
    printed = capsys.readouterr().out
    want = _onnx_formula(x)
    saved = np.load(outs / "y.npy")
    np.testing.assert_allclose(saved, want, rtol=1e-5, atol=1e-7)
    assert printed.startswith("y: float32[2, 3, 4]")
    assert f"max={want.max():.6g}" in printed and f"min={want.min():.6g}" in printed and "mean=" in printed
    assert "first=[" in printed

    # a second compile of the same file is a cache hit
    assert main(["compile", str(model), "-o", str(lib), "--opt-level", "2"]) == 0
    assert "cache hit" in capsys.readouterr().out


def test_compile_cir_with_symbolic_dims_and_shape(tmp_path, capsys, rng):
    path = export_ir(softmax_module("N"), tmp_path / "m.cir")
    lib = tmp_path / "libm.so"
    assert main(["compile", "--input", str(path), "--output", str(lib)]) == 2
    err = capsys.readouterr().err
    assert "CUVIL-CODEGEN" in err and "--dim-max N=" in err and "--specialize" in err
    assert main(["compile", "--input", str(path), "--output", str(lib), "--shape", "x=5x8"]) == 0
    assert "N=5" in capsys.readouterr().out
    x = rng.standard_normal((5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(lib), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), scaled_softmax(x), rtol=1e-5, atol=1e-7)


def test_compile_without_shapes_gives_one_library_for_the_shape_class(tmp_path, capsys, rng):
    path = export_ir(softmax_module("N"), tmp_path / "m.cir")
    lib = tmp_path / "libm.so"
    assert main(["compile", str(path), "-o", str(lib), "--dim-max", "N=16", "--shape", "x=5x8"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main(["compile", str(path), "-o", str(lib), "--dim-max", "N=16", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "N in [1, 16]" in out and "one library for the shape class" in out
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["verification"]["shapes"]["scope"] == "shape class"
    assert "cuvil_m_run_dims" in (tmp_path / "m.h").read_text()
    for n in (1, 5, 16):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        assert main(["run", str(lib), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")]) == 0
        np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), scaled_softmax(x), rtol=1e-5, atol=1e-7)
    np.save(tmp_path / "x.npy", np.zeros((17, 8), np.float32))
    capsys.readouterr()
    assert main(["run", str(lib), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")]) == 2
    assert "outside the library's shape class" in capsys.readouterr().err
    for bad in (["--dim-max", "N"], ["--dim-max", "N=x"], ["--dim-max", "N=4", "--dim-max", "N=5"],
                ["--dim-max", "M=4"]):
        assert main(["compile", str(path), "-o", str(lib), *bad]) == 2
        assert "--dim-max" in capsys.readouterr().err


def test_no_cache_leaves_the_cache_empty(tmp_path, capsys, private_cache):
    model = _onnx_model(tmp_path / "tiny.onnx", 2)
    lib = tmp_path / "libtiny.so"
    assert main(["compile", "--input", str(model), "--output", str(lib), "--no-cache"]) == 0
    assert "cache off" in capsys.readouterr().out
    assert lib.is_file() and not private_cache.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["libtiny.so", "tiny.h", "tiny.json", "tiny.onnx"]


def test_run_casts_inputs_on_request(tmp_path, capsys, rng):
    lib = tmp_path / "libm.so"
    assert main(["compile", str(export_ir(softmax_module(), tmp_path / "m.cir")), "-o", str(lib)]) == 0
    x = rng.standard_normal((4, 8))  # float64
    np.save(tmp_path / "x.npy", x)
    capsys.readouterr()
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "dtype float64, expected f32" in capsys.readouterr().err
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--cast", "-o", str(tmp_path)]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), scaled_softmax(x.astype(np.float32)),
                               rtol=1e-5, atol=1e-7)


def test_run_refuses_a_modified_library(tmp_path, capsys):
    lib = tmp_path / "libm.so"
    assert main(["compile", str(export_ir(softmax_module(), tmp_path / "m.cir")), "-o", str(lib)]) == 0
    data = bytearray(lib.read_bytes())
    data[-8] ^= 0x01
    lib.write_bytes(bytes(data))
    np.save(tmp_path / "x.npy", np.zeros((4, 8), np.float32))
    capsys.readouterr()
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "CUVIL-INTEGRITY" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "riscv64-unknown-linux-gnu"], "is not supported"),
    (["--opt-level", "O7"], "O0, O1, O2, O3"),
    (["--shape", "x2x3"], "--shape 'x2x3' is malformed"),
    (["--shape", "y=2x3x4"], "unknown ['y']"),
    (["--threads", "0"], "--threads"),
    (["--passes", "no-such-pass"], "unknown pass"),
])
def test_compile_errors_exit_2(tmp_path, capsys, args, message):
    model = _onnx_model(tmp_path / "tiny.onnx", "N")
    shape = [] if any(a.startswith("--shape") for a in args) else ["--shape", "x=2x3x4"]
    code = main(["compile", "--input", str(model), "--output", str(tmp_path / "libt.so"), *shape, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and err.startswith("error[CUVIL-")
    assert not (tmp_path / "libt.so").exists()


def test_missing_files_exit_2(tmp_path, capsys):
    assert main(["compile", "--input", str(tmp_path / "nope.onnx")]) == 2
    assert "CUVIL-LOAD" in capsys.readouterr().err
    assert main(["compile", "--input", str(tmp_path)]) == 2
    assert main(["run", str(tmp_path / "libnope.so")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "model.txt").write_text("x")
    assert main(["compile", str(tmp_path / "model.txt")]) == 2
    assert "unknown model format" in capsys.readouterr().err


def test_default_output_is_next_to_the_working_directory(tmp_path, capsys, monkeypatch):
    model = _onnx_model(tmp_path / "tiny.onnx", 2)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["compile", str(model)]) == 0
    assert sorted(os.listdir(work)) == ["libtiny.so", "tiny.h", "tiny.json"]


def test_dim_range_lets_one_library_serve_a_graph_that_branches_on_a_dim(tmp_path, capsys, rng):
    """y = x[..., 0] when the third dim of x is 1 (an If on a Shape comparison, as exporters write a
    squeeze), else x summed over it: imported per shape unless the declared range decides the branch."""
    import onnx
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Squeeze", ["x", "ax"], ["y_t"])], "then", [],
                             [helper.make_tensor_value_info("y_t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x", "ax"], ["y_e"], keepdims=0)], "else", [],
                              [helper.make_tensor_value_info("y_e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "two"], ["d"]),
             helper.make_node("Equal", ["d", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    i64 = TensorProto.INT64
    inits = [helper.make_tensor("ax", i64, [1], [2]), helper.make_tensor("two", i64, [], [2]),
             helper.make_tensor("one", i64, [], [1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "k"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "branchy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    lib = tmp_path / "libbranchy.so"
    assert main(["compile", str(path), "-o", str(lib), "--dim-max", "n=8"]) == 2
    assert "--dim-range" in capsys.readouterr().err
    assert main(["compile", str(path), "-o", str(lib), "--dim-max", "n=8", "--dim-range", "k=1:1"]) == 0
    assert "k in [1, 1]" in capsys.readouterr().out
    for n in (1, 8):
        x = rng.standard_normal((n, 3, 1)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        assert main(["run", str(lib), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / "o" / "y.npy"), x[..., 0])
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 2), np.float32))  # outside the declared range
    assert main(["run", str(lib), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")]) == 2
    assert "k=2" in capsys.readouterr().err
    for bad in (["--dim-range", "k=2:1"], ["--dim-range", "k"], ["--dim-range", "q=1:2"]):
        assert main(["compile", str(path), "-o", str(lib), "--dim-max", "n=8", *bad]) == 2
        err = capsys.readouterr().err
        assert "dim-range" in err or "dim_ranges" in err, err
