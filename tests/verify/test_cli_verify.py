"""``cuvil verify``: exit codes, the summary, the certificate / SARIF / HTML files, user passes
loaded with --pass-plugin, and verdicts that do not depend on --jobs."""

import json
from pathlib import Path

import pytest
from jsonschema_lite import validate
from unprovable_passes import doubling_model
from wrong_passes import relu6_model

from cuvil import cli
from cuvil.ir import Builder, DType
from cuvil.ir.printer import export_ir

ROOT = Path(__file__).resolve().parents[2]

SARIF_SCHEMA = json.loads((ROOT / "tests" / "reports" / "data" / "sarif-schema-2.1.0.json").read_text())
TINY_CNN = ROOT / "bench" / "examples" / "tiny_cnn.onnx"


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def relu6_cir(tmp_path):
    path = tmp_path / "relu6.cir"
    export_ir(relu6_model(), path)
    return path


def _verdicts(cert: dict) -> list[tuple[str, list[str]]]:
    return [(a["pass"], [o["verdict"] for o in a["obligations"]]) for a in cert["applications"]]


def test_verify_proves_a_small_model_and_writes_its_certificate(capsys, tmp_path):
    cert_path, sarif_path, html_path = tmp_path / "c.json", tmp_path / "c.sarif", tmp_path / "c.html"
    code, out, _ = run(capsys, "verify", TINY_CNN, "-O3", "-j", "1", "-q", "--json", cert_path, "--sarif",
                       sarif_path, "--html", html_path)
    assert code == 0
    assert "fold-batchnorm" in out and "refuted" in out  # the per-pass table and its columns
    cert = json.loads(cert_path.read_text())
    assert cert["format"] == "cuvil-certificate/2"
    verdicts = [v for _, vs in _verdicts(cert) for v in vs]
    assert verdicts and set(verdicts) == {"proved"}
    assert cert["summary"]["obligations"] == len(verdicts) == cert["summary"]["proved"]
    assert "fold-batchnorm" in [p for p, _ in _verdicts(cert)]
    assert f"{len(verdicts)} obligations" in out
    sarif = json.loads(sarif_path.read_text())
    validate(sarif, SARIF_SCHEMA)
    results = sarif["runs"][0]["results"]
    assert len(results) == len(verdicts) and {r["kind"] for r in results} == {"pass"}
    assert "<html" in html_path.read_text().lower()


def test_a_wrong_user_pass_is_refuted_with_a_counterexample(capsys, tmp_path, relu6_cir):
    cert_path, sarif_path = tmp_path / "c.json", tmp_path / "c.sarif"
    code, out, _ = run(capsys, "verify", relu6_cir, "-p", "wrong-relu6", "--pass-plugin",
                       "wrong_passes:Relu6AsRelu", "-j", "1", "-q", "--json", cert_path, "--sarif", sarif_path)
    assert code == 1
    assert "REFUTED" in out and "wrong-relu6" in out and "counterexample" in out
    assert "before out0" in out and "after  out0" in out
    cert = json.loads(cert_path.read_text())
    assert cert["summary"]["refuted"] == 1
    (ob,) = cert["applications"][0]["obligations"]
    assert ob["verdict"] == "refuted" and ob["counterexample"]["before"] != ob["counterexample"]["after"]
    sarif = json.loads(sarif_path.read_text())
    validate(sarif, SARIF_SCHEMA)
    results = sarif["runs"][0]["results"]
    assert [r["kind"] for r in results] == ["fail"] and results[0]["level"] == "error"


def test_an_unprovable_pass_exits_3_with_its_reason(capsys, tmp_path):
    path = tmp_path / "double.cir"
    export_ir(doubling_model(), path)
    cert_path = tmp_path / "c.json"
    code, out, _ = run(capsys, "verify", path, "-p", "double-as-sum-plugin", "--pass-plugin",
                       "unprovable_passes:DoubleAsSum", "-j", "1", "-q", "--json", cert_path)
    assert code == 3
    assert "UNKNOWN" in out and "double-as-sum-plugin" in out
    cert = json.loads(cert_path.read_text())
    assert cert["summary"]["unknown"] == 1 and cert["summary"]["refuted"] == 0


def test_a_plugin_not_named_in_the_pipeline_runs_last(capsys, tmp_path, relu6_cir):
    cert_path = tmp_path / "c.json"
    code, _, _ = run(capsys, "verify", relu6_cir, "-p", "canonicalize", "--pass-plugin", "wrong_passes:Relu6AsRelu",
                     "-j", "1", "-q", "--json", cert_path)
    cert = json.loads(cert_path.read_text())
    assert cert["pipeline"] == ["canonicalize", "wrong-relu6"]
    assert code == 1


def _several_applications(tmp_path) -> Path:
    """A model where several passes fire, one of them wrong (so the verdicts are not all alike)."""
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    y = b.clip(b.mul(b.mul(x, b.scalar(1.0, DType.f32)), b.scalar(4.0, DType.f32)), min=0.0, max=6.0)
    z = b.transpose(b.transpose(b.exp(x), perm=[1, 0]), perm=[1, 0])
    path = tmp_path / "several.cir"
    export_ir(b.module(b.function("main", [x], [y, b.neg(b.neg(z))])), path)
    return path


def test_jobs_do_not_change_the_verdicts(capsys, tmp_path):
    model = _several_applications(tmp_path)
    certs = []
    for jobs in (1, 2):
        path = tmp_path / f"c{jobs}.json"
        code, _, _ = run(capsys, "verify", model, "-p", "canonicalize,wrong-relu6,cse,fuse-elementwise",
                         "--pass-plugin", "wrong_passes:Relu6AsRelu", "-j", jobs, "-q", "--json", path)
        assert code == 1
        certs.append(json.loads(path.read_text()))
    assert len(certs[0]["applications"]) >= 3
    assert _verdicts(certs[0]) == _verdicts(certs[1])
    for key in ("obligations", "proved", "refuted", "unknown"):
        assert certs[0]["summary"][key] == certs[1]["summary"][key]
    assert certs[0]["model_hash"] == certs[1]["model_hash"]


def test_check_pipeline_jobs_match_the_gate_path(tmp_path):
    from verify import check_pipeline

    model = relu6_model()
    serial = check_pipeline(model, ["canonicalize", "fuse-elementwise"])
    parallel = check_pipeline(model, ["canonicalize", "fuse-elementwise"], jobs=2)
    assert [o.status for o in serial.obligations] == [o.status for o in parallel.obligations]
    assert serial.module == parallel.module and serial.pipeline == parallel.pipeline


@pytest.mark.parametrize("argv", [
    ["verify"],                                               # nothing to verify
    ["verify", "missing.onnx"],                               # no such model
    ["verify", str(TINY_CNN), "-O2", "-p", "canonicalize"],   # two pipelines
    ["verify", str(TINY_CNN), "--pass-plugin", "no_colon"],   # malformed plugin spec
    ["verify", str(TINY_CNN), "--pass-plugin", "no_such_module_here:P"],
    ["verify", str(TINY_CNN), "--pass-plugin", "json:JSONDecoder"],  # not a Pass
    ["verify", str(TINY_CNN), "-p", "no-such-pass"],
    ["verify", str(TINY_CNN), "--jobs", "0"],
    ["verify", "--rules", "--artifact", "lib.so"],
])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "error[" in err


def test_verify_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    out = capsys.readouterr().out
    assert "exit codes" in out and "refuted" in out and "--pass-plugin" in out


def test_shapes_specialize_before_proving(capsys, tmp_path):
    b = Builder()
    x = b.param("x", DType.f32, ["n", 4])
    path = tmp_path / "sym.cir"
    export_ir(b.module(b.function("main", [x], [b.exp(b.neg(b.neg(x)))])), path)
    cert_path = tmp_path / "c.json"
    code, _, _ = run(capsys, "verify", path, "-p", "canonicalize", "--shape", "x=3x4", "-j", "1", "-q",
                     "--json", cert_path)
    assert code == 0
    (ob,) = json.loads(cert_path.read_text())["applications"][0]["obligations"]
    assert ob["verdict"] == "proved"
    code, _, err = run(capsys, "verify", path, "--shape", "x=3x5", "-q")
    assert code == 2 and "error[" in err
