"""The simulation harness and ``cuvil failsafe``: a synthesized policy of each shipped example shows no
violation over 100,000 random steps with random faults; an edited policy that is not safe is caught
by both the re-check (refuted with a state) and the simulation; the commands' exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cuvil.cli import main
from failsafe.load import load_spec
from failsafe.simulate import fault_sequence, simulate
from failsafe.synth import synthesize

EXAMPLES = Path(__file__).resolve().parents[2] / "failsafe" / "examples"


@pytest.fixture(scope="module", params=["driving", "infusion"])
def example(request):
    spec = load_spec(EXAMPLES / f"{request.param}.yaml")
    return spec, synthesize(spec)


def test_a_proved_policy_shows_no_violation_in_100000_steps(example):
    spec, policy = example
    sim = simulate(spec, policy, steps=100_000, seed=1)
    assert sim.passed and sim.uncovered == 0 and sim.unsampled == 0, sim.first_violation
    assert sim.fault_changes > 1000  # faults really come and go
    assert len(sim.per_scenario) >= 4  # more than the nominal scenario is exercised


def test_an_unsafe_edit_is_caught_by_the_simulation(example):
    """The harness must be able to fail: each parameter an invariant binds (a value past it was refuted)
    pushed halfway to the end of its range."""
    from dataclasses import replace

    spec, policy = example

    def pushed(entry):
        mode = spec.mode(entry.mode) if entry.mode else None
        params = dict(entry.parameters)
        for o in entry.optimum:
            if o.bound is not None and mode is not None:
                end = next(p for p in mode.parameters if p.name == o.parameter)
                params[o.parameter] = o.value + 0.5 * ((end.hi if o.objective == "maximize" else end.lo) - o.value)
        return replace(entry, parameters=params)

    table = tuple(pushed(e) for e in policy.table)
    assert table != policy.table
    sim = simulate(spec, replace(policy, table=table), steps=20_000, seed=2)
    assert sim.violations > 0 and sim.first_violation is not None
    state = sim.first_violation["state"]
    assert set(state) == {v.name for v in spec.state}


def test_fault_sequences_follow_the_chain():
    seq = fault_sequence(("a", "b"), 50_000, np.random.default_rng(0), p_on=0.1, p_off=0.5)
    on_rate = seq.mean(axis=0)
    assert np.allclose(on_rate, 0.1 / 0.6, atol=0.02)  # stationary probability p_on / (p_on + p_off)


def test_cli_synth_check_simulate(tmp_path, capsys):
    spec = str(EXAMPLES / "driving.yaml")
    policy, report = tmp_path / "policy.json", tmp_path / "r.json"
    assert main(["failsafe", "synth", spec, "-o", str(policy), "--json", str(report), "-q"]) == 0
    results = json.loads(report.read_text())["results"]
    assert results and all(r["kind"] == "pass" for r in results)
    assert main(["failsafe", "check", spec, str(policy), "-q"]) == 0
    assert main(["failsafe", "simulate", spec, str(policy), "--steps", "5000", "-q"]) == 0
    data = json.loads(policy.read_text())
    entry = next(e for e in data["table"] if e["parameters"])
    name = next(iter(entry["parameters"]))
    entry["parameters"][name] *= 1.5
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    assert main(["failsafe", "check", spec, str(edited), "--json", str(report), "-q"]) == 1
    failed = [r for r in json.loads(report.read_text())["results"] if r["kind"] == "fail"]
    assert len(failed) == 1 and entry["scenario"] in failed[0]["message"]
    assert main(["failsafe", "simulate", spec, str(edited), "--steps", "20000", "-q"]) == 1
    capsys.readouterr()
    assert main(["failsafe", "check", spec, str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_reports_an_unrealizable_spec_with_exit_1(tmp_path, capsys):
    text = (EXAMPLES / "driving.yaml").read_text()
    spec = load_spec(EXAMPLES / "driving.yaml")
    last = spec.modes[-1].name
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    policy = synthesize(spec)
    assert not policy.unrealizable
    # a spec whose only modes are the parameterless last one, with an invariant it cannot keep
    import yaml

    data = yaml.safe_load(text)
    data["modes"] = [m for m in data["modes"] if m["name"] == last]
    data["invariants"] = {"impossible": "distance < 0"}
    bad.write_text(yaml.safe_dump(data))
    out = tmp_path / "r.json"
    assert main(["failsafe", "synth", str(bad), "--json", str(out), "-q"]) == 1
    failed = [r for r in json.loads(out.read_text())["results"] if r["kind"] == "fail"]
    assert failed


BRAKING_YAML = """
name: braking
state:
  speed: {range: [0, 18], unit: m/s}
  gap: {range: [0, 50], unit: m}
faults:
  wet: {kind: other, active: "speed <= 9"}
modes:
  - name: nominal
  - name: emergency
    define: {decel: "10"}
invariants:
  brake: "decel >= 0.5 * speed - 0.1 * gap"
  limit: "decel <= 10"
model: {path: braking.onnx, inputs: [speed, gap], outputs: [decel]}
"""


def test_cli_region_proves_where_the_network_is_trusted(tmp_path, capsys):
    """A braking network with three hidden ReLU layers and a dip in braking near one state: the region
    command proves most of the box, refutes the cells around the dip, and writes every cell."""
    pytest.importorskip("torch")
    from tests.failsafe.braking import maker

    maker.export(maker.braking_network(), tmp_path / "braking.onnx")
    (tmp_path / "braking.yaml").write_text(BRAKING_YAML)
    out = tmp_path / "region.json"
    code = main(["failsafe", "region", str(tmp_path / "braking.yaml"), "--grid", "4", "--depth", "3", "-o", str(out)])
    err = capsys.readouterr().err
    assert code in (0, 3) and "of the box proved" in err
    region = json.loads(out.read_text())
    verdicts = [c["verdict"] for c in region["cells"]]
    assert "proved" in verdicts and "refuted" in verdicts  # the dip is found, the rest is trusted
    assert main(["failsafe", "region", str(tmp_path / "braking.yaml"), "--scenario", "gremlin"]) == 2
