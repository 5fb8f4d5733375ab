"""The `cuvil` command: generated compatibility table, IR printing, reference runs, error reporting."""

import json
import logging
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil import cli
from cuvil.cli import ir as cli_ir
from cuvil.cli import ops as cli_ops
from cuvil.frontend.onnx_import import converters, import_onnx
from cuvil.ir.opdef import all_ops
from cuvil.ir.parser import parse_module

W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 7.0


@pytest.fixture
def mlp(tmp_path):
    """x[N, 4] -> relu(x @ W)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [numpy_helper.from_array(W, "w")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------
# version and help


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"cuvil {cuvil.__version__}"


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run([sys.executable, "-m", "cuvil", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout.strip() == f"cuvil {cuvil.__version__}"


def test_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes (the same for every subcommand):" in out
    assert "2   usage or input error" in out and "70  internal error" in out


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["no-such-command"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["ops", "--format", "yaml"])
    assert e.value.code == 2


# --------------------------------------------------------------------------------------
# cuvil ops


def test_ops_json_has_one_row_per_catalogue_op(capsys):
    code, out, _ = run(capsys, "ops", "--format", "json")
    assert code == 0
    table = json.loads(out)
    rows = {r["op"]: r for r in table["ops"]}
    assert sorted(rows) == sorted(o.name for o in all_ops())
    assert len(rows) == len(table["ops"])
    for op in all_ops():
        r = rows[op.name]
        assert r["family"] == op.family
        if op.structured:  # control flow: its meaning is the region it runs
            assert r["interpreter"] == cli_ops.STRUCTURED[op.name]["interpreter"]
            continue
        assert r["interpreter"] == ("rule + fast path" if op.numpy is not None else "rule only")
        emitted_by = sorted(t for (d, t), e in converters().items() if not d and op.name in e.cir_ops)
        listed = sorted(x for x in r["onnx"].split(", ") if "::" not in x and x != "—")
        assert listed == emitted_by, op.name
    assert "Relu" in rows["relu"]["onnx"].split(", ")
    assert "MatMul" in rows["matmul"]["onnx"].split(", ")


def test_ops_json_lists_every_onnx_converter(capsys):
    _, out, _ = run(capsys, "ops", "--format", "json")
    onnx_rows = {r["onnx_op"]: r for r in json.loads(out)["onnx"]}
    expected = {f"{d}::{t}" if d else t for d, t in converters()}
    assert set(onnx_rows) == expected
    assert onnx_rows["Relu"]["cir_ops"].split(", ").count("relu") == 1
    assert onnx_rows["Transpose"]["cir_ops"] == "transpose"


def test_reader_columns_come_from_the_readers_tables(capsys):
    """Every rule primitive and reduction the catalogue uses is implemented by both readers; the
    LLVM column names the tuned kernel where one exists."""
    from cuvil.codegen.kernels import tuned_kernels

    _, out, _ = run(capsys, "ops", "--format", "json")
    rows = {r["op"]: r for r in json.loads(out)["ops"]}
    structured = {o.name for o in all_ops() if o.structured}
    for name in structured:
        assert rows.pop(name)["z3"] == cli_ops.STRUCTURED[name]["z3"]
    assert {r["z3"] for r in rows.values()} == {"yes"}
    tuned = tuned_kernels()
    assert set(tuned) == {"matmul", "conv", "fused", "softmax", "log_softmax", "layer_norm", "max_pool", "avg_pool",
                          "bf16_matmul", "bf16_conv", "transpose", "conv_transpose", "reduce_min", "reduce_max"}
    for name, r in rows.items():
        assert r["llvm"] == (f"{tuned[name]}; else loop nest from the rule" if name in tuned
                             else "loop nest from the rule"), name


def test_a_reader_without_a_primitive_marks_the_ops_whose_rules_use_it(capsys, monkeypatch, tmp_path):
    from verify.cone_encoder import SUPPORTED_REDUCTIONS
    from verify.scalar_semantics import SUPPORTED_PRIMITIVES

    without_exp = {k: sorted(v - {"exp"}) for k, v in SUPPORTED_PRIMITIVES.items()}
    reductions = {k: sorted(v - {"prod"}) for k, v in SUPPORTED_REDUCTIONS.items()}
    (tmp_path / "fake_reader.py").write_text(f"SUPPORTED_PRIMITIVES = {without_exp!r}\n"
                                             f"SUPPORTED_REDUCTIONS = {reductions!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli_ops, "READERS", {**cli_ops.READERS, "z3": ("fake_reader",)})
    _, out, _ = run(capsys, "ops", "--format", "json")
    rows = {r["op"]: r for r in json.loads(out)["ops"]}
    assert rows["exp"]["z3"] == "no: exp on float"
    assert rows["softmax"]["z3"] == "no: exp on float"  # composed from exp in its rule
    assert rows["reduce_prod"]["z3"].startswith("no: ") and "prod-reduction on" in rows["reduce_prod"]["z3"]
    assert rows["relu"]["z3"] == "yes"
    assert rows["exp"]["llvm"] == "loop nest from the rule"


def test_torch_column_degrades_without_torch(capsys, monkeypatch):
    real = cli_ops.importlib.util.find_spec
    monkeypatch.setattr(cli_ops.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    _, out, _ = run(capsys, "ops", "--format", "json")
    assert {r["torch"] for r in json.loads(out)["ops"]} == {cli_ops.TORCH_MISSING}


def test_ops_name_prints_one_op_in_detail(capsys):
    code, out, _ = run(capsys, "ops", "pad")
    assert code == 0
    assert out.startswith("pad (layout)\n")
    assert "pads[k] before and pads[k + rank] after" in out  # the layout note its doc states
    assert "pads: ints, required" in out and "mode: str = 'constant'" in out and "value: float = 0.0" in out
    assert "precision: narrow" in out and "contraction: no" in out
    assert "shape rule   cuvil.ir.ops.shape._pad_type" in out
    assert "out[i0, i1] = x[i0 - 1, i1 - 2] ?? 1.5" in out
    code, out, _ = run(capsys, "ops", "matmul")
    assert "contraction: yes" in out and "tuned GEMM" in out
    assert "sum[r0 < 4](lhs[" in out


def test_ops_name_json(capsys):
    code, out, _ = run(capsys, "ops", "softmax", "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["op"] == "softmax" and d["family"] == "nn"
    assert d["operands"] == [{"name": "x", "variadic": False}]
    assert d["attributes"] == [{"name": "axis", "kind": "int", "required": False, "default": -1}]
    assert d["properties"] == {"commutative": False, "contraction": False, "epilogue_fusible": False,
                               "precision_policy": "keep-fp32"}
    assert d["readers"]["z3"] == "yes" and d["readers"]["interpreter"] == "rule + fast path"
    assert "Softmax" in d["onnx"]
    assert d["rule"]["example"]["operands"] == {"x": "f32[2, 3, 4]"}
    assert d["rule"]["text"].splitlines()[0] == "t0 = max[r0 < 3](x[i0, r0, i2])"
    _, out, _ = run(capsys, "ops", "einsum", "--format", "json")
    assert json.loads(out)["rule"]["example"]["operands"] == {"xs0": "f32[2, 3]", "xs1": "f32[3, 4]"}


def test_ops_unknown_name_is_a_usage_error(capsys):
    code, out, err = run(capsys, "ops", "padd")
    assert code == 2 and not out
    assert "CUVIL-USAGE" in err and "'padd'" in err and "pad" in err
    code, _, err = run(capsys, "ops", "pad", "--format", "markdown")
    assert code == 2 and "CUVIL-USAGE" in err


def test_ops_markdown_and_table(capsys):
    code, out, _ = run(capsys, "ops", "--format", "markdown")
    assert code == 0
    assert "| CIR op | family | ONNX import | torch import | interpreter | z3 | LLVM |" in out
    assert out.count("\n| ") >= len(all_ops()) + len(converters())
    code, out, _ = run(capsys, "ops")
    assert code == 0
    assert f"CIR ops ({len(all_ops())})" in out
    assert f"ONNX ops ({len(converters())})" in out


# --------------------------------------------------------------------------------------
# cuvil ir / run-reference


def test_ir_prints_the_module_the_importer_builds(capsys, mlp, tmp_path):
    code, out, _ = run(capsys, "ir", mlp)
    assert code == 0
    assert parse_module(out) == import_onnx(mlp)
    assert "func @main(%x: f32[N, 4]) -> (%y: f32[N, 3])" in out
    code, _, err = run(capsys, "ir", mlp, "-o", tmp_path / "mlp.cir")
    assert code == 0 and "wrote" in err
    assert (tmp_path / "mlp.cir").read_text() == out
    # a .cir file is itself a model
    code, again, _ = run(capsys, "ir", tmp_path / "mlp.cir")
    assert code == 0 and again == out


def test_run_reference_matches_numpy(capsys, mlp, tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "outs"
    code, out, _ = run(capsys, "run-reference", mlp, "--input", f"x={tmp_path / 'x.npy'}", "-o", out_dir)
    assert code == 0
    assert out.startswith("y: float32[5, 3]")
    np.testing.assert_allclose(np.load(out_dir / "y.npy"), np.maximum(x @ W, 0), rtol=1e-6, atol=1e-6)
    # positional and .npz inputs
    np.savez(tmp_path / "in.npz", x=x[:2])
    for spec in (tmp_path / "x.npy", tmp_path / "in.npz"):
        code, out, _ = run(capsys, "run-reference", mlp, "--input", spec)
        assert code == 0, out


# --------------------------------------------------------------------------------------
# errors


def test_missing_model_is_one_clear_message(capsys, tmp_path):
    code, out, err = run(capsys, "ir", tmp_path / "nope.onnx")
    assert code == 2
    assert out == ""
    assert err.startswith("error[CUVIL-LOAD]: model file")
    assert "  at: " in err and "  hint: " in err
    assert "Traceback" not in err


def test_wrong_inputs_exit_2(capsys, mlp, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    np.save(tmp_path / "bad.npy", np.zeros((2, 5), np.float32))
    np.save(tmp_path / "f64.npy", np.zeros((2, 4), np.float64))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases = [(["--input", f"z={tmp_path / 'x.npy'}"], "CUVIL-INPUT", "missing ['x']"),
             (["--input", f"x={tmp_path / 'bad.npy'}"], "CUVIL-INPUT", "input shapes do not match"),
             (["--input", f"x={tmp_path / 'f64.npy'}"], "CUVIL-INPUT", "has dtype float64"),
             (["--input", f"x={tmp_path / 'obj.npy'}"], "CUVIL-INPUT", "cannot read input file"),
             (["--input", f"x={tmp_path / 'gone.npy'}"], "CUVIL-INPUT", "does not exist"),
             (["--input", "x="], "CUVIL-INPUT", "is malformed")]
    for extra, code_name, fragment in cases:
        code, _, err = run(capsys, "run-reference", mlp, *extra)
        assert code == 2, err
        assert err.startswith(f"error[{code_name}]"), err
        assert fragment in err, err


def test_malformed_cir_reports_line_and_column(capsys, tmp_path):
    path = tmp_path / "bad.cir"
    path.write_text("module {\n  func @main(%x: f32[2]) -> (%y: f32[2]) {\n    %0 = relu(%x : f32[2]\n"
                    "    return %0\n  }\n}\n")
    code, _, err = run(capsys, "ir", path)
    assert code == 2
    assert err.startswith("error[CUVIL-PARSE]: expected ',' or ')', found ':'")
    assert f"at: {path}:3:18" in err


def test_internal_errors_have_their_own_exit_code(capsys, monkeypatch, mlp):
    def boom(args):
        raise RuntimeError("kaput")

    monkeypatch.setattr(cli_ir, "cmd_ir", boom)
    code, _, err = run(capsys, "ir", mlp)
    assert code == 70  # never a verdict's code (1 refuted, 3 unknown) nor a usage error's (2)
    assert "internal error[CUVIL-INTERNAL]: RuntimeError: kaput" in err and "Traceback" not in err
    assert "report" in err
    logger = logging.getLogger("cuvil")
    level, handlers = logger.level, list(logger.handlers)
    try:
        code, _, err = run(capsys, "-v", "ir", mlp)
    finally:  # -v installs a handler on this test's captured stderr
        logger.setLevel(level)
        logger.handlers[:] = handlers
    assert code == 70 and "Traceback" in err


def test_torch_column_lists_the_aten_converters(capsys):
    pytest.importorskip("torch")
    from cuvil.frontend.torch_import import aten_converters

    _, out, _ = run(capsys, "ops", "--format", "json")
    rows = {r["op"]: r for r in json.loads(out)["ops"]}
    for op in ("relu", "matmul", "add"):
        expected = sorted({e.op_type for e in aten_converters().values() if op in e.cir_ops})
        assert rows[op]["torch"].split(", ") == expected, op
        assert expected


def test_pt2_models_print_and_run(capsys, tmp_path):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 4)
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "net.pt2")
    code, out, _ = run(capsys, "ir", tmp_path / "net.pt2")
    assert code == 0
    assert "func @main(%x: f32[2, 4])" in out
    np.save(tmp_path / "x.npy", x.numpy())
    code, _, _ = run(capsys, "run-reference", tmp_path / "net.pt2", "--input", f"x={tmp_path / 'x.npy'}",
                     "-o", tmp_path / "outs")
    assert code == 0
    (name,) = [p.name for p in (tmp_path / "outs").iterdir()]
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "outs" / name), expected, rtol=1e-5, atol=1e-6)
