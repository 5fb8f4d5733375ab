"""``cuvil probe``: exit codes 0/1/3/2, the JSON/SARIF/HTML reports it writes, witness files,
calibration ranges and usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import incidents
import numpy as np
import pytest
from jsonschema_lite import validate

from cuvil.cli import main
from cuvil.ir.printer import export_ir
from verify.probe.budget import DEFAULT_EFFORT

ROOT = Path(__file__).resolve().parents[3]
REPORT_SCHEMA = json.loads((ROOT / "reports" / "report.schema.json").read_text())
SARIF_SCHEMA = json.loads((ROOT / "tests" / "reports" / "data" / "sarif-schema-2.1.0.json").read_text())


def _cir(tmp: Path, name: str, module) -> str:  # type: ignore[no-untyped-def]
    path = tmp / f"{name}.cir"
    export_ir(module, path)
    return str(path)


def test_confirmed_overflow_exit_1_with_reports_and_witness(tmp_path: Path) -> None:
    model = _cir(tmp_path, "t5", incidents.t5_ffn(1))
    out = tmp_path / "out"
    code = main(["probe", model, "--range", "x=-1:1", "--json", str(out / "r.json"), "--sarif",
                 str(out / "r.sarif"), "--html", str(out / "r.html"), "--witness-dir", str(out / "w"),
                 "--time-limit", "20", "-q"])
    assert code == 1
    report = json.loads((out / "r.json").read_text())
    validate(report, REPORT_SCHEMA)
    validate(json.loads((out / "r.sarif").read_text()), SARIF_SCHEMA, "#/definitions/Root")
    assert report["summary"]["fail"] >= 1
    failed = [r for r in report["results"] if r["kind"] == "fail"]
    files = failed[0]["evidence"][0]["files"]
    x = np.load(files["x"])
    assert x.shape == (1, 10) and incidents.t5_overflows(x)
    assert Path(files["x"]).parent.parent == out / "w"
    assert "<svg" in (out / "r.html").read_text()
    assert report["sections"]["boundary"]["safe_scale"] is not None
    # per site: proved at least up to the model's safe scale; the confirmed site witnessed at scale 1 or below
    model_safe = report["sections"]["boundary"]["safe_scale"]
    assert all(r["metrics"]["safe_scale"] >= model_safe for r in report["results"])
    assert all(r["metrics"]["witness_scale"] <= 1.0 for r in failed)
    assert 'id="safe_scale"' in (out / "r.html").read_text()
    assert report["settings"]["effort_units"] == DEFAULT_EFFORT  # the default budget, named in the report


def test_proved_safe_exit_0(tmp_path: Path) -> None:
    model = _cir(tmp_path, "t5_safe", incidents.t5_ffn_safe(1))
    assert main(["probe", model, "--range", "x=-1:1", "--time-limit", "10", "-q", "--no-boundary"]) == 0


def test_open_sites_exit_3(tmp_path: Path) -> None:
    model = _cir(tmp_path, "ln", incidents.open_layer_norm())
    out = tmp_path / "r.json"
    code = main(["probe", model, "--range", "x=-1:1", "--json", str(out), "--time-limit", "10", "-q",
                 "--no-boundary"])
    assert code == 3
    report = json.loads(out.read_text())
    assert report["summary"]["open"] >= 1 and report["summary"]["fail"] == 0


def test_int8_precision(tmp_path: Path) -> None:
    model = _cir(tmp_path, "q", incidents.int8_layer(1))
    assert main(["probe", model, "--precision", "int8", "--range", "x=-1:1", "--time-limit", "10", "-q",
                 "--no-boundary", "--witness-dir", str(tmp_path / "w")]) == 1
    x = np.load(tmp_path / "w" / "w1" / "x.npy")
    assert incidents.int8_saturates(x)
    float_model = _cir(tmp_path, "f", incidents.t5_ffn_safe(1))
    assert main(["probe", float_model, "--precision", "int8", "--range", "x=-1:1", "-q"]) == 2


def test_calibration_sets_the_ranges(tmp_path: Path) -> None:
    model = _cir(tmp_path, "t5", incidents.t5_ffn(1))
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):  # small inputs: the overflow needs the full [-1, 1] box
        np.save(calib / f"x_{k}.npy", rng.uniform(-0.1, 0.1, (1, 10)).astype(np.float32))
    out = tmp_path / "r.json"
    assert main(["probe", model, "--calibrate", str(calib), "--json", str(out), "-q", "--no-boundary"]) == 0
    lo, hi = json.loads(out.read_text())["settings"]["ranges"]["x"].split(":")
    assert -0.1 <= float(lo) < 0 < float(hi) <= 0.1
    # an explicit range wins over calibration
    assert main(["probe", model, "--calibrate", str(calib), "--range", "x=-1:1", "-q", "--no-boundary",
                 "--time-limit", "10", "--witness-dir", str(tmp_path / "w")]) == 1


@pytest.mark.parametrize("args", [
    ["--range", "x=1:-1"],
    ["--range", "x=-1..1"],
    ["--range", "y=-1:1"],
    [],
    ["--range", "x=-inf:1"],
    ["--calibrate", "/nonexistent/folder"],
])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    model = _cir(tmp_path, "t5", incidents.t5_ffn_safe(1))
    assert main(["probe", model, *args, "-q"]) == 2
    assert "error[CUVIL-" in capsys.readouterr().err


def test_missing_model_exit_2(tmp_path: Path) -> None:
    assert main(["probe", str(tmp_path / "none.onnx"), "--range", "x=0:1"]) == 2


def test_onnx_model_reports_node_names(tmp_path: Path) -> None:
    """ONNX models: a site's location names the ONNX node it came from."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((4, 3), 30000.0, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="big_matmul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "r.json"
    assert main(["probe", str(path), "--range", "x=-1:1", "--json", str(out), "-q", "--no-boundary",
                 "--witness-dir", str(tmp_path / "w")]) == 1
    report = json.loads(out.read_text())
    nodes = {r["location"]["node"] for r in report["results"] if r["kind"] == "fail"}
    assert "big_matmul (MatMul)" in nodes
