"""``cuvil compile --gate / --verify / --on-proof-failure``: a refuted or unproved pass stops code
generation and writes nothing; degrade rolls it back and the library still matches the
interpreter; the certificate goes into the manifest and ``cuvil verify --artifact`` checks it."""

import json
from pathlib import Path

import numpy as np
import pytest
from unprovable_passes import doubling_model
from wrong_passes import relu6_model

from cuvil import cli
from cuvil import compiler as compiler_mod
from cuvil.compiler import job as compile_job
from cuvil.compiler.keys import callable_key
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.printer import export_ir
from cuvil.runtime.loader import load
from verify import make_gate

WRONG = ["--pass-plugin", "wrong_passes:Relu6AsRelu", "--passes", "canonicalize,wrong-relu6,fuse-elementwise"]


UNPROVABLE = ["--pass-plugin", "unprovable_passes:DoubleAsSum", "--passes", "double-as-sum-plugin"]


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def relu6_cir(tmp_path):
    path = tmp_path / "relu6.cir"
    export_ir(relu6_model(), path)
    return path


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _written(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_gate_stops_a_refuted_pass_and_writes_nothing(capsys, tmp_path, relu6_cir):
    out_dir = tmp_path / "out"
    code, _, err = run(capsys, "compile", relu6_cir, "-o", out_dir / "librelu6.so", *WRONG, "--gate")
    assert code == 1
    assert "CUVIL-PROOF-REFUTED" in err and "counterexample" in err and "wrong-relu6" in err
    assert _written(out_dir) == []


def test_gate_stops_an_unproved_pass_with_exit_3(capsys, tmp_path):
    model = tmp_path / "double.cir"
    export_ir(doubling_model(), model)
    out_dir = tmp_path / "out"
    code, _, err = run(capsys, "compile", model, "-o", out_dir / "libd.so", *UNPROVABLE, "--gate", "--no-cache")
    assert code == 3
    assert "CUVIL-PROOF-UNKNOWN" in err and "double-as-sum-plugin" in err
    assert _written(out_dir) == []


def test_degrade_rolls_back_the_refuted_pass_and_the_library_matches_the_interpreter(capsys, tmp_path, relu6_cir):
    lib = tmp_path / "out" / "librelu6.so"
    code, out, _ = run(capsys, "compile", relu6_cir, "-o", lib, *WRONG, "--on-proof-failure=degrade")
    assert code == 0 and lib.is_file()
    assert "rolled back" in out and "wrong-relu6" in out
    manifest = json.loads(lib.with_name("relu6.json").read_text())
    cert = manifest["verification"]
    assert cert["policy"] == "degrade"
    assert [r["pass"] for r in cert["rollbacks"]] == ["wrong-relu6"]
    assert "refuted" in cert["rollbacks"][0]["reason"]
    assert cert["summary"]["rolled_back"] == ["wrong-relu6"]
    rolled = [a for a in cert["applications"] if a["rolled_back"]]
    assert [a["pass"] for a in rolled] == ["wrong-relu6"]
    # large inputs: x * 4 exceeds 6, where relu and clip(0, 6) differ
    x = (np.random.default_rng(3).standard_normal((3, 4)) * 10).astype(np.float32)
    (got,) = load(lib).run([x])
    (want,) = run_reference(relu6_model(), [x])
    np.testing.assert_array_equal(got, want)
    assert got.max() == 6.0


def test_degrade_rolls_back_an_unproved_pass(capsys, tmp_path):
    model = tmp_path / "double.cir"
    export_ir(doubling_model(), model)
    lib = tmp_path / "out" / "libd.so"
    code, _, _ = run(capsys, "compile", model, "-o", lib, *UNPROVABLE, "--on-proof-failure", "degrade")
    assert code == 0
    cert = json.loads(lib.with_name("d.json").read_text())["verification"]
    assert [r["pass"] for r in cert["rollbacks"]] == ["double-as-sum-plugin"]
    assert "unknown" in cert["rollbacks"][0]["reason"]


def test_verify_embeds_the_certificate_and_still_emits(capsys, tmp_path, relu6_cir):
    lib = tmp_path / "out" / "librelu6.so"
    code, out, err = run(capsys, "compile", relu6_cir, "-o", lib, *WRONG, "--verify")
    assert code == 0 and lib.is_file()
    cert = json.loads(lib.with_name("relu6.json").read_text())["verification"]
    assert cert["policy"] == "audit" and cert["summary"]["refuted"] == 1 and cert["rollbacks"] == []
    assert "not proved" in err
    code, out, _ = run(capsys, "verify", "--artifact", lib)
    assert code == 1 and "wrong-relu6" in out


def test_default_compile_does_not_verify(capsys, tmp_path, relu6_cir):
    lib = tmp_path / "out" / "librelu6.so"
    code, _, _ = run(capsys, "compile", relu6_cir, "-o", lib, *WRONG)
    assert code == 0
    assert "verification" not in json.loads(lib.with_name("relu6.json").read_text())
    code, out, _ = run(capsys, "verify", "--artifact", lib)
    assert code == 1 and "no verification certificate" in out


def test_verify_artifact_passes_fresh_and_fails_after_tampering(capsys, tmp_path):
    model = Path(__file__).resolve().parents[2] / "bench" / "examples" / "tiny_cnn.onnx"
    lib = tmp_path / "out" / "libtiny.so"
    code, out, _ = run(capsys, "compile", model, "-o", lib, "--gate", "--shape", "x=2x1x16x16")
    assert code == 0 and "verified" in out
    code, out, _ = run(capsys, "verify", "--artifact", lib)
    assert code == 0 and out.startswith("OK")

    original = lib.read_bytes()
    lib.write_bytes(original + b"\0")
    code, out, _ = run(capsys, "verify", "--artifact", lib)
    assert code == 1 and "library hash" in out
    lib.write_bytes(original)

    manifest_path = lib.with_name("tiny.json")
    manifest = json.loads(manifest_path.read_text())
    for tamper in ("pipeline", "verdict", "function"):
        m = json.loads(json.dumps(manifest))
        if tamper == "pipeline":
            m["verification"]["pipeline"] = m["verification"]["pipeline"][:-1]
        elif tamper == "verdict":
            m["verification"]["applications"][0]["obligations"][0]["verdict"] = "refuted"
        else:
            m["function_hash"] = "f" + "0" * 32
        manifest_path.write_text(json.dumps(m))
        code, out, _ = run(capsys, "verify", "--artifact", lib)
        assert code == 1 and out.startswith("FAIL"), tamper
    manifest_path.write_text(json.dumps(manifest))
    assert run(capsys, "verify", "--artifact", lib)[0] == 0


def test_gate_flags_conflict_exit_2(capsys, tmp_path, relu6_cir):
    code, _, err = run(capsys, "compile", relu6_cir, "-o", tmp_path / "libx.so", "--verify", "--gate")
    assert code == 2 and "error[" in err


def test_cache_keys_distinguish_gate_policies():
    keys = {callable_key(make_gate(p)) for p in ("strict", "degrade", "audit")}
    keys.add(callable_key(make_gate("degrade", roll_back_refuted=True)))
    keys.add(callable_key(None))
    assert len(keys) == 5
    gate = make_gate("strict")
    before = callable_key(gate)
    gate(relu_pass(), *_relu_pair())
    assert callable_key(gate) == before  # what was checked does not change the key


def relu_pass():
    from cuvil.passes.canonicalize import Canonicalize

    return Canonicalize()


def _relu_pair() -> tuple[Module, Module]:
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    before = b.module(b.function("main", [x], [b.exp(b.relu(b.relu(x)))]))
    return before, relu_pass().run(before).module


def test_a_cached_artifact_without_certificate_does_not_serve_a_gated_request(tmp_path, monkeypatch, relu6_cir):
    # make gated and ungated requests share one cache key, so only the certificate check tells them apart
    monkeypatch.setattr(compile_job, "callable_key", lambda obj: None)
    plain = compiler_mod.compile(relu6_cir, passes="canonicalize")
    assert plain.manifest is not None
    assert plain.cache_info["cache"] == "miss" and "verification" not in plain.manifest
    gated = compiler_mod.compile(relu6_cir, passes="canonicalize", gate=make_gate("strict"))
    assert gated.cache_info["cache"] == "miss"
    assert gated.manifest is not None and "verification" in gated.manifest
    again = compiler_mod.compile(relu6_cir, passes="canonicalize", gate=make_gate("strict"))
    assert again.manifest is not None
    assert again.cache_info["cache"] == "hit" and "verification" in again.manifest
