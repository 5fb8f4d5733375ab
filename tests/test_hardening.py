"""Regression tests for hostile input, one group per weakness found by attacking Cuvil as a user
would: ambiguous errors, header injection, unbounded work, silent wrong results, a trusted
manifest, stale plugin cache keys, and the prober's flags. The process-level campaign is in
``tests/hostile``; these pin each fix at the API it lives in."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.cli import main
from cuvil.codegen import abi
from cuvil.codegen.artifact import IntegrityError, ManifestError, manifest_digest
from cuvil.errors import BudgetError, CuvilError, InputError, ModelLoadError, PluginError
from cuvil.frontend import onnx_import
from cuvil.frontend.onnx_import import import_onnx
from cuvil.ir import Builder, DType
from cuvil.passes.manager import PassManager
from cuvil.runtime.loader import load, read_manifest
from tests.hostile.campaign import nested_loops

ROOT = Path(__file__).resolve().parents[1]


def _vi(name: str, dims: list, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# --------------------------------------------------------------------------------------
# 1. every user-caused failure is a coded error


def _all_error_classes() -> list[type]:
    import importlib
    import pkgutil

    for package in ("cuvil", "verify"):
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            if not info.name.endswith(("__main__",)):
                importlib.import_module(info.name)
    found, todo = [], [CuvilError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_error_class_has_its_own_code_and_a_hint():
    classes = _all_error_classes()
    assert len(classes) >= 20
    for cls in classes:
        assert cls.code != CuvilError.code and cls.code.startswith("CUVIL-"), cls
        assert cls.default_hint, f"{cls.__name__} has no default hint"


def test_no_source_raises_the_bare_base_error():
    """``CuvilError(...)`` itself would reach the user as CUVIL-000 with no hint."""
    for package in ("cuvil", "verify", "lora", "failsafe", "reports"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    func = node.exc.func
                    assert not (isinstance(func, ast.Name) and func.id == "CuvilError"), f"{path}:{node.lineno}"


def _dynamic_model() -> cuvil.CompiledModel:
    b = Builder()
    x = b.param("x", DType.f32, ["N", 4])
    return cuvil.compile(b.module(b.function("main", [x], [b.relu(x)])), cache=False)


@pytest.mark.parametrize(("value", "error"), [("abc", InputError), (2.5, InputError), (True, InputError),
                                              (2**62, BudgetError)])
def test_specialize_rejects_what_is_not_a_size(value, error):
    model = _dynamic_model()
    with pytest.raises(error):
        model.specialize({"N": value})


def test_output_paths_are_checked_before_any_work(tmp_path, capsys):
    model = ROOT / "bench" / "examples" / "tiny_cnn.onnx"
    assert main(["verify", str(model), "--json", str(tmp_path / "no" / "such" / "c.json"), "-q"]) == 0
    assert (tmp_path / "no" / "such" / "c.json").is_file()  # a missing folder is made
    (tmp_path / "file").write_text("")
    assert main(["verify", str(model), "--json", str(tmp_path / "file" / "c.json"), "-q"]) == 2
    assert "CUVIL-IO" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# 2. names never become C code


HOSTILE = ['x */ static const char *injected = "pwned"; /*', "a\nb", "é\u202e", "x" * 5000, "*/#define X 1"]


@pytest.mark.parametrize("name", HOSTILE)
def test_names_are_escaped_in_comments_and_identifiers(name):
    comment = abi.c_comment(name)
    assert "*/" not in comment and "/*" not in comment and "\n" not in comment
    assert all(" " <= ch <= "~" for ch in comment) and len(comment) <= abi.COMMENT_NAME_LIMIT + 3
    ident = abi.c_identifier(name)
    assert ident.replace("_", "a").isalnum() and ident.isascii() and not ident[0].isdigit()
    prefix = abi.symbol_prefix(name)
    assert len(prefix) <= len("cuvil_") + abi.SYMBOL_NAME_LIMIT


def test_long_names_that_share_a_beginning_keep_distinct_symbols():
    a, b = "n" * 100 + "a", "n" * 100 + "b"
    assert abi.symbol_prefix(a) != abi.symbol_prefix(b)


# --------------------------------------------------------------------------------------
# 3. every stage a model or a plugin can make unbounded has a budget


def test_nested_loops_share_one_unroll_budget(monkeypatch):
    monkeypatch.setattr(onnx_import, "MAX_UNROLL_TOTAL", 200)
    out = cuvil.interp.run_reference(import_onnx(nested_loops(10, 2)), [np.zeros(1, np.float32)])
    np.testing.assert_array_equal(out[0], [110.0])  # 10 outer trips of (10 inner + 1): within budget
    with pytest.raises(BudgetError, match="200 loop iterations"):
        import_onnx(nested_loops(15, 2))  # each loop alone is small; together 15 + 225 > 200


@pytest.mark.parametrize(("trips", "fits"), [(5, True), (6, False)])
def test_nested_for_loops_past_the_budget_are_refused_before_any_body_is_imported(monkeypatch, trips, fits):
    """Three for loops nested: 5 * (1 + 5 * (1 + 5)) = 155 iterations fit a budget of 200 (the model's output
    counts them); 6 * (1 + 6 * (1 + 6)) = 258 do not, and the import says so before it unrolls one of them."""
    monkeypatch.setattr(onnx_import, "MAX_UNROLL_TOTAL", 200)
    imported = []
    real = onnx_import.OnnxImporter.import_subgraph
    monkeypatch.setattr(onnx_import.OnnxImporter, "import_subgraph",
                        lambda self, *a, **k: imported.append(1) or real(self, *a, **k))
    if fits:
        out = cuvil.interp.run_reference(import_onnx(nested_loops(trips, 3)), [np.zeros(1, np.float32)])
        np.testing.assert_array_equal(out[0], [155.0])
    else:
        with pytest.raises(BudgetError, match="200 loop iterations"):
            import_onnx(nested_loops(trips, 3))
        assert not imported


def test_a_loop_that_stops_early_is_not_charged_its_trip_count(monkeypatch):
    """The early refusal counts only what is sure to run: an inner loop of 1,000 trips whose body stops it after
    3 (i < 2) runs 10 * (1 + 3) = 40 iterations in all, within a budget of 200."""
    monkeypatch.setattr(onnx_import, "MAX_UNROLL_TOTAL", 200)
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(1, np.float32)))
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2, np.int64)))
    inner = helper.make_graph(
        [one, two, helper.make_node("Add", ["v1", "one"], ["vo1"]), helper.make_node("Less", ["i1", "two"], ["co1"])],
        "inner", [_vi("i1", [], TensorProto.INT64), _vi("c1", [], TensorProto.BOOL), _vi("v1", [1])],
        [_vi("co1", [], TensorProto.BOOL), _vi("vo1", [1])])
    outer = helper.make_graph(
        [helper.make_node("Constant", [], ["one0"], value=numpy_helper.from_array(np.ones(1, np.float32))),
         helper.make_node("Constant", [], ["n1"], value=numpy_helper.from_array(np.array(1000, np.int64))),
         helper.make_node("Constant", [], ["t1"], value=numpy_helper.from_array(np.array(True))),
         helper.make_node("Loop", ["n1", "t1", "v0"], ["w0"], body=inner),
         helper.make_node("Add", ["w0", "one0"], ["vo0"]), helper.make_node("Identity", ["c0"], ["co0"])],
        "outer", [_vi("i0", [], TensorProto.INT64), _vi("c0", [], TensorProto.BOOL), _vi("v0", [1])],
        [_vi("co0", [], TensorProto.BOOL), _vi("vo0", [1])])
    inits = [numpy_helper.from_array(np.array(10, np.int64), "n"), numpy_helper.from_array(np.array(True), "t")]
    model = _model([helper.make_node("Loop", ["n", "t", "x"], ["y"], body=outer)], [_vi("x", [1])], [_vi("y", [1])],
                   inits)
    out = cuvil.interp.run_reference(import_onnx(model), [np.zeros(1, np.float32)])
    np.testing.assert_array_equal(out[0], [40.0])


def test_a_malformed_count_of_a_nested_loop_is_a_load_error() -> None:
    """The early unroll bound reads a nested loop's count before the import would: a count whose raw bytes do not
    fill its type is still the model's fault (CUVIL-LOAD), not a converter's (CUVIL-IR)."""
    count = numpy_helper.from_array(np.array(5, np.int64), "n1")
    count.raw_data = b"\x01\x02\x03"
    inner = helper.make_graph(
        [helper.make_node("Identity", ["v1"], ["vo1"]), helper.make_node("Identity", ["c1"], ["co1"])], "inner",
        [_vi("i1", [], TensorProto.INT64), _vi("c1", [], TensorProto.BOOL), _vi("v1", [1])],
        [_vi("co1", [], TensorProto.BOOL), _vi("vo1", [1])])
    outer = helper.make_graph(
        [helper.make_node("Constant", [], ["n1"], value=count), helper.make_node("Loop", ["n1", "", "v0"], ["w0"],
                                                                                 body=inner),
         helper.make_node("Identity", ["w0"], ["vo0"]), helper.make_node("Identity", ["c0"], ["co0"])], "outer",
        [_vi("i0", [], TensorProto.INT64), _vi("c0", [], TensorProto.BOOL), _vi("v0", [1])],
        [_vi("co0", [], TensorProto.BOOL), _vi("vo0", [1])])
    model = _model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=outer)], [_vi("x", [1])], [_vi("y", [1])],
                   [numpy_helper.from_array(np.array(3, np.int64), "n")])
    with pytest.raises(ModelLoadError, match="'n1' is malformed"):
        import_onnx(model)


def test_a_plugin_pass_that_never_returns_is_stopped(tmp_path, monkeypatch):
    (tmp_path / "forever_pass.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from cuvil.passes import Pass

        @dataclass(frozen=True)
        class Forever(Pass):
            name = "forever"

            def run(self, module):
                while True:
                    pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from forever_pass import Forever

    b = Builder()
    x = b.param("x", DType.f32, [2])
    module = b.module(b.function("main", [x], [b.relu(x)]))
    with pytest.raises(BudgetError, match=r"time limit of 0\.5 s"):
        PassManager([Forever()], plugin_time_limit=0.5).run(module)


# --------------------------------------------------------------------------------------
# 4. no silent wrong results


def test_duplicate_output_names_are_rejected():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    with pytest.raises(ModelLoadError, match="'y'"):
        import_onnx(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_a_graph_input_shadowed_by_an_initializer_is_rejected():
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2]), _vi("w", [2])], [_vi("y", [2])], [w])
    with pytest.raises(ModelLoadError, match="'w'"):
        import_onnx(m)


@pytest.mark.parametrize("reps", [2**20, 2**31])
def test_intermediates_past_the_element_limit_do_not_compile(reps):
    r = numpy_helper.from_array(np.array([reps, reps], dtype=np.int64), "r")
    m = _model([helper.make_node("Tile", ["x", "r"], ["y"])], [_vi("x", [2, 2])], [_vi("y", [2 * reps, 2 * reps])],
               [r])
    with pytest.raises(BudgetError, match="2\\*\\*40"):
        cuvil.compile(import_onnx(m), cache=False)


def test_compile_refuses_an_output_that_is_not_a_library(tmp_path, capsys):
    model = ROOT / "bench" / "examples" / "tiny_cnn.onnx"
    assert main(["compile", str(model), "--no-cache", "-o", str(tmp_path / "x.json")]) == 2
    assert "must end in .so" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_folder_is_not_a_model(tmp_path, capsys):
    (tmp_path / "m.onnx").mkdir()
    assert main(["ir", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "CUVIL-LOAD" in err and "folder" in err


# --------------------------------------------------------------------------------------
# 5. the manifest is validated and sealed into the library


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lib")
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    model = cuvil.compile(b.module(b.function("main", [x], [b.relu(x)])), output_dir=d, cache=False)
    return model.library_path


def _edited(library: Path, tmp_path: Path, edit) -> Path:
    import shutil

    for f in library.parent.iterdir():
        if f.suffix in (".so", ".json", ".h"):
            shutil.copy(f, tmp_path / f.name)
    man = next(p for p in tmp_path.glob("*.json"))
    data = json.loads(man.read_text())
    edit(data)
    man.write_text(json.dumps(data))
    return tmp_path / library.name


@pytest.mark.parametrize(("edit", "error"), [
    (lambda d: d["symbols"].__setitem__("create", "abort"), ManifestError),
    (lambda d: d.__setitem__("symbol_prefix", "x; rm -rf /"), ManifestError),
    (lambda d: d.__setitem__("inputs", "x"), ManifestError),
    (lambda d: d["inputs"][0].__setitem__("dtype", "complex256"), ManifestError),
    (lambda d: d.pop("library_sha256"), ManifestError),
    (lambda d: d["inputs"][0].__setitem__("shape", [4, 3]), IntegrityError),  # well-formed, but not sealed
    (lambda d: d.__setitem__("opt_level", 0), IntegrityError),
])
def test_an_edited_manifest_is_refused(library, tmp_path, edit, error):
    with pytest.raises(error):
        load(_edited(library, tmp_path, edit))


def test_the_library_seals_every_field_but_its_own_names_and_hash(library, tmp_path):
    m = read_manifest(library)
    renamed = dict(m, library="libother.so", header="other.h", compile_times={})
    assert manifest_digest(renamed) == manifest_digest(m)
    assert manifest_digest(dict(m, function="other")) != manifest_digest(m)
    lib = _edited(library, tmp_path, lambda d: d.__setitem__("compile_times", {"link_s": 9.0}))
    out = load(lib)(np.ones((2, 3), np.float32))
    assert np.asarray(out).shape == (2, 3)


# --------------------------------------------------------------------------------------
# 6. a plugin's cache key covers the helpers it imports


def test_a_plugin_cache_key_changes_with_its_helper_module(tmp_path, monkeypatch):
    from cuvil.compiler import pipeline_key

    pkg = tmp_path / "userpasses"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "constants.py").write_text("SCALE = 2.0\n")
    (pkg / "scaling.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from cuvil.passes import Pass

        @dataclass(frozen=True)
        class Scale(Pass):
            name = "scale"

            def run(self, module):
                from userpasses.constants import SCALE  # read when the pass runs
                return super().run(module) if SCALE is None else None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from userpasses.scaling import Scale

    before = pipeline_key([Scale()])
    (pkg / "constants.py").write_text("SCALE = 3.0\n")
    assert pipeline_key([Scale()]) != before


# --------------------------------------------------------------------------------------
# 7. the prober's flags


@pytest.mark.parametrize("flags", [["--range", "x=-1:1", "--range", "x=0:1"],
                                   ["--range", "x=-1:1", "--time-limit", "nan"],
                                   ["--range", "x=-1:1", "--time-limit", "-5"],
                                   ["--range", "x=-1:1", "--keep-fp32", "no_such_op"]])
def test_probe_rejects_bad_flags(tmp_path, capsys, flags):
    from cuvil.ir.printer import export_ir

    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    path = tmp_path / "m.cir"
    export_ir(b.module(b.function("main", [x], [b.relu(x)])), path)
    assert main(["probe", str(path), *flags, "-q"]) == 2
    assert capsys.readouterr().err.startswith("error[CUVIL-")


def test_probe_rejects_a_range_outside_an_integer_input(tmp_path, capsys):
    from cuvil.ir.printer import export_ir

    b = Builder()
    x = b.param("x", DType.i8, [2])
    path = tmp_path / "m.cir"
    export_ir(b.module(b.function("main", [x], [b.relu(x)])), path)
    assert main(["probe", str(path), "--range", "x=0:1000", "-q"]) == 2
    assert "CUVIL-" in capsys.readouterr().err


@pytest.mark.parametrize(("source", "error"), [("raise ImportError('missing helper')\n", InputError),
                                               ("raise RuntimeError('boom')\n", PluginError),
                                               ("def broken(:\n", PluginError),
                                               ("class P:\n    name = 'p'\n", InputError)])
def test_plugin_errors_are_coded(tmp_path, monkeypatch, source, error):
    from cuvil.passes.plugins import load_pass_plugin

    (tmp_path / "broken_plugin.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "broken_plugin", raising=False)
    with pytest.raises(error):
        load_pass_plugin("broken_plugin:P")
