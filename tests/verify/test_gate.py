"""The gate in the pass manager: refuted stops, unknown stops under strict and is rolled back
under degrade; reports and certificates record every obligation."""

import json
from dataclasses import dataclass

import pytest
import unprovable_passes
from wrong_passes import CORPUS

from cuvil.errors import CuvilError
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.passes import PassManager, run_pipeline
from cuvil.passes.canonicalize import Canonicalize
from cuvil.passes.fp16 import Fp16
from cuvil.passes.fuse_elementwise import FuseElementwise
from verify import ProofFailure, ProofIncomplete, Proved, Unknown, check_pass, check_pipeline, make_gate


@dataclass(frozen=True)
class DoubleAsSum(unprovable_passes.DoubleAsSum):
    """x * 2 -> x + x: exact in IEEE arithmetic, but only provable with a law the abstract
    float sort does not have, so the verdict is unknown (equal over the reals only). The plugin's
    rewrite, under the name these tests report."""

    name = "double-as-sum"


def _model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.mul(b.exp(x), b.scalar(2.0, DType.f32))
    return b.module(b.function("main", [x], [b.relu(b.mul(y, b.scalar(1.0, DType.f32)))]))


def test_unprovable_but_correct_rewrite_is_unknown_not_proved():
    (o,) = check_pass(DoubleAsSum(), _model()).obligations
    assert isinstance(o.verdict, Unknown)
    assert "real arithmetic" in o.verdict.reason


def test_strict_gate_stops_on_a_refuted_pass_with_the_counterexample():
    pass_, make = CORPUS["dropped-clamp"]
    with pytest.raises(ProofFailure) as info:
        PassManager([pass_], gate=make_gate("strict")).run(make())
    err = info.value
    assert err.code == "CUVIL-PROOF-REFUTED" and err.location == f"pass {pass_.name}"
    assert "before" in err.message and "after" in err.message and "%x" in err.message
    assert isinstance(err, CuvilError)


def test_degrade_still_stops_on_refuted():
    pass_, make = CORPUS["activation-before-bias"]
    with pytest.raises(ProofFailure):
        PassManager([pass_], gate=make_gate("degrade")).run(make())


def test_strict_gate_stops_on_unknown():
    with pytest.raises(ProofIncomplete) as info:
        PassManager([DoubleAsSum()], gate=make_gate("strict")).run(_model())
    assert info.value.code == "CUVIL-PROOF-UNKNOWN"
    assert info.value.location == "pass double-as-sum"


def test_degrade_rolls_back_the_unknown_application_and_continues():
    gate = make_gate("degrade")
    m = _model()
    res = PassManager([DoubleAsSum(), Canonicalize(), FuseElementwise()], gate=gate).run(m)
    first = res.records[0]
    assert first.rolled_back and first.after is first.before
    assert gate.rolled_back == ["double-as-sum"]
    assert not any(v.op == "add" for v in res.module.main.ops())  # the rewrite is gone
    assert all(r.gate.accept for r in res.records[1:] if r.gate is not None)
    report = gate.report()
    assert report.rolled_back == ["double-as-sum"]
    assert report.count("proved") >= 2 and report.count("refuted") == 0


def test_bounded_contracts_are_left_to_the_overflow_prober():
    (o,) = check_pass(Fp16(), _model()).obligations
    assert isinstance(o.verdict, Unknown) and o.verdict.reason == "bounded contracts are checked by the overflow prober"
    with pytest.raises(ProofIncomplete):
        PassManager([Fp16()], gate=make_gate("strict")).run(_model())


def test_pipeline_through_the_gate_proves_and_certifies():
    gate = make_gate("strict", timeout=10)
    run_pipeline(_model(), "O2", gate=gate)
    report = gate.report()
    assert report.obligations and report.proved
    cert = json.loads(report.to_json())
    assert set(cert["versions"]) == {"cuvil", "z3", "python"}
    assert cert["model_hash"] and cert["summary"]["refuted"] == 0
    ob = cert["applications"][0]["obligations"][0]
    for key in ("pass", "contract", "output", "cone_size", "encoder", "verdict", "seconds", "shapes"):
        assert key in ob
    assert ob["verdict"] == "proved" and ob["axioms"] is not None


def test_check_pipeline_reports_every_application():
    report = check_pipeline(_model(), ["canonicalize", DoubleAsSum(), "fuse-elementwise"])
    statuses = [(o.pass_name, o.status) for o in report.obligations]
    assert ("canonicalize", "proved") in statuses
    assert ("double-as-sum", "unknown") in statuses
    assert report.pipeline == ["canonicalize", "double-as-sum", "fuse-elementwise"]
    assert not report.proved
    assert "unknown" in report.summary()


def test_proved_verdict_states_encoder_shapes_and_time():
    (o,) = check_pass(Canonicalize(), _model()).obligations
    assert isinstance(o.verdict, Proved)
    assert o.verdict.encoder == "abstract-fp" and o.verdict.seconds >= 0
    assert any("f32[3, 5]" in s for s in o.verdict.shapes)
    assert "mul-one" in o.verdict.axioms


def test_unknown_gate_policy_is_rejected():
    with pytest.raises(CuvilError):
        make_gate("lenient")
