"""The decision network inside a synthesized policy (Simplex): a mode that relies on the network is
chosen with the region where the network is proved and a proved fallback for every other state; the
policy file carries both and ``check_policy`` decides them again; the simulation runs the network
inside the region and the fallback outside it.

The shipped example (``failsafe/examples/braking.yaml``) brakes too little around one state on purpose;
a second network has a violation in a sub-box 0.01 m/s wide that random sampling of the whole box
misses, simulated on a box narrowed around it (where sampling does hit it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuvil.cli import main
from failsafe.expr import parse_expr
from failsafe.load import load_spec
from failsafe.network import DecisionNetwork, load_decision_model, load_network
from failsafe.policy import Policy, PolicyError, check_policy, digest_of
from failsafe.simulate import simulate
from failsafe.spec import Invariant, Mode, Spec, StateVar
from failsafe.synth import synthesize

EXAMPLES = Path(__file__).resolve().parents[2] / "failsafe" / "examples"
SPEC = EXAMPLES / "braking.yaml"
DIP = (15.0, 10.0)
BUG = (12.3, 31.7)
KINDS = {"speed": "real", "gap": "real", "decel": "real", "extra": "real", "max_decel": "real"}


def expr(text: str) -> Any:
    return parse_expr(text, KINDS)


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(SPEC)


@pytest.fixture(scope="module")
def network(spec: Spec) -> DecisionNetwork:
    assert spec.model is not None
    return load_decision_model(spec.model, spec)


@pytest.fixture(scope="module")
def policy(spec: Spec) -> Policy:
    return synthesize(spec)  # loads the spec's model


def trust_everywhere(policy: Policy, scenario: str = "none") -> Policy:
    """The policy with every cell of ``scenario``'s region marked proved: the network trusted blindly."""
    table = []
    for e in policy.table:
        if e.scenario == scenario:
            assert e.network is not None
            cells = tuple(replace(c, verdict="proved", counterexample=None) for c in e.network.region.cells)
            e = replace(e, network=replace(e.network, region=replace(e.network.region, cells=cells)))
        table.append(e)
    return replace(policy, table=tuple(table))


# --- the shipped example -----------------------------------------------------------------------------------------

def test_the_network_mode_is_chosen_with_a_region_and_a_proved_fallback(policy: Policy,
                                                                       spec: Spec) -> None:
    assert not policy.unrealizable and all(e.verdict == "proved" for e in policy.table)
    nominal = policy.entry(frozenset())
    assert nominal is not None and nominal.mode == "learned" and nominal.network is not None
    use = nominal.network
    assert (use.fallback, use.fallback_parameters) == ("rule_based", {"extra": 1.0})
    region = use.region
    assert region.label == "none" and region.mode == "learned"
    assert 0.9 <= region.coverage() < 1.0 and region.counts()["refuted"] >= 1 and region.counts()["unknown"] == 0
    dip = {"speed": np.array([DIP[0]]), "gap": np.array([DIP[1]])}
    assert not region.contains(dip)[0]
    assert "Simplex" in nominal.reason and "rule_based elsewhere" in nominal.reason
    assert nominal.counterexamples, "the network mode alone (any output) is refuted first"
    wet = policy.entry(frozenset({"wet"}))
    assert wet is not None and wet.network is not None
    assert wet.network.fallback_parameters == {"extra": 3.0}
    assert wet.network.region.counts()["empty"] >= 1, "cells beyond the wet speed limit hold no state"
    for faults in (frozenset({"input_out_of_box"}), frozenset({"wet", "network_nonfinite"})):
        entry = policy.entry(faults)
        assert entry is not None and entry.mode == "rule_based" and entry.network is None


def test_check_policy_proves_every_entry_again(spec: Spec, policy: Policy, network: DecisionNetwork) -> None:
    verdicts = check_policy(spec, policy, network=network)
    assert [v.status for v in verdicts] == ["proved"] * len(policy.table)
    none = next(v for v in verdicts if v.scenario == "none")
    entry = policy.entry(frozenset())
    assert entry is not None and entry.network is not None
    assert f"{entry.network.region.counts()['proved']} proved cells decided again" in none.reason
    assert "fallback rule_based: proved" in none.reason


def test_100000_steps_with_random_faults_show_no_violation(spec: Spec, policy: Policy,
                                                          network: DecisionNetwork) -> None:
    sim = simulate(spec, policy, steps=100_000, seed=1, network=network)
    assert sim.passed and sim.uncovered == 0 and sim.unsampled == 0, sim.first_violation
    assert sim.fault_changes > 1000 and len(sim.per_scenario) >= 4
    assert sim.network_steps > 50_000, "the network acts on most states of its scenarios"
    assert sim.fallback_steps > 500, "the fallback acts outside the trusted region"
    none = sim.per_scenario["none"]
    assert none["network"] + none["fallback"] == none["steps"]


def test_the_network_trusted_everywhere_is_caught(spec: Spec, policy: Policy, network: DecisionNetwork) -> None:
    """The harness and the re-check can fail: with every cell marked proved the dip is hit by sampling and
    refuted by the proof, with a state where the network breaks the invariant."""
    blind = trust_everywhere(policy)
    sim = simulate(spec, blind, steps=20_000, seed=3, network=network)
    assert sim.violations > 0 and sim.first_violation is not None
    assert sim.first_violation["mode"] == "learned" and sim.first_violation["invariant"] == "brakes_enough"
    verdict = next(v for v in check_policy(spec, blind, network=network) if v.scenario == "none")
    assert verdict.status == "refuted" and verdict.counterexample is not None
    state = {k: np.array([v]) for k, v in verdict.counterexample.state.items()}
    decel = network.evaluate(state)["decel"][0]
    assert decel < 0.5 * state["speed"][0] - 0.1 * state["gap"][0]
    assert "brakes_enough" in verdict.counterexample.violated


def test_simulating_a_network_entry_needs_the_network(spec: Spec, policy: Policy) -> None:
    with pytest.raises(ValueError, match="network"):
        simulate(spec, policy, steps=100, seed=0)


# --- the file ----------------------------------------------------------------------------------------------------

def test_json_round_trip(policy: Policy) -> None:
    text = policy.to_json()
    back = Policy.from_json(text)
    assert back == policy and back.to_json() == text
    data = json.loads(text)
    rows = {row["scenario"]: row for row in data["table"]}
    assert set(rows["none"]["network"]) == {"fallback", "fallback_parameters", "region"}
    assert rows["none"]["network"]["region"]["format"] == "cuvil-failsafe-trusted-region/1"
    assert "network" not in rows["input_out_of_box"]
    assert data["guard"]["inputs"] == {"speed": [0.0, 18.0], "gap": [0.0, 50.0]}
    assert data["guard"]["input_fault"] == "input_out_of_box" and data["guard"]["output_fault"] == "network_nonfinite"


def edited(policy: Policy, change: Any) -> str:
    data = policy.to_dict()
    change(next(row for row in data["table"] if row["scenario"] == "none")["network"])
    data["digest"] = digest_of(data)
    return json.dumps(data)


@pytest.mark.parametrize(("change", "message"), [
    (lambda n: n.update(fallback="learned"), "not a mode of the policy after 'learned'"),
    (lambda n: n.update(fallback="cruise"), "not a mode of the policy after"),
    (lambda n: n.update(extra=1), "unknown fields extra"),
    (lambda n: n["region"].update(mode="rule_based"), "region.mode"),
    (lambda n: n["region"].update(scenario="wet"), "region.scenario"),
    (lambda n: n["region"].update(parameters={"extra": 1.0}), "region.parameters"),
    (lambda n: n["region"].update(format="cuvil-failsafe-policy/1"), "region.format"),
    (lambda n: n["region"]["counts"].update(proved=99), "region.counts"),
    (lambda n: n["region"].update(coverage=1.0), "region.coverage"),
    (lambda n: n["region"]["cells"][0].update(verdict="trusted"), "not one of proved"),
    (lambda n: n["region"]["cells"][0].update(lo=[0.0]), "one per network input"),
    (lambda n: n["region"]["cells"][0].update(lo=[5.0, 60.0]), "empty range"),
    (lambda n: n["region"]["cells"][0].update(phases=[1, 2, 3]), "pair"),
    (lambda n: n["region"]["cells"][0].update(counterexample={"state": {}}), "missing field 'outputs'"),
    (lambda n: n.update(fallback_parameters={"extra": "1"}), "expected a number"),
])
def test_malformed_network_sections_are_refused(policy: Policy, change: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message) as info:
        Policy.from_json(edited(policy, change))
    assert "$.table" in str(info.value)


def test_an_edited_fallback_is_refuted_or_refused(spec: Spec, policy: Policy, network: DecisionNetwork) -> None:
    def unsafe(n: dict[str, Any]) -> None:
        n["fallback_parameters"]["extra"] = 2.5

    verdicts = {v.scenario: v for v in check_policy(spec, Policy.from_json(edited(policy, unsafe)),
                                                    network=network)}
    assert verdicts["none"].status == "refuted" and "fallback rule_based: refuted" in verdicts["none"].reason
    assert verdicts["none"].counterexample is not None

    def earlier(n: dict[str, Any]) -> None:
        n["fallback"] = "emergency"
        n["fallback_parameters"] = {"extra": 1.0}

    verdicts = {v.scenario: v for v in check_policy(spec, Policy.from_json(edited(policy, earlier)),
                                                    network=network)}
    assert verdicts["none"].status == "error" and "unknown parameter(s) extra" in verdicts["none"].reason


# --- specs around the example ------------------------------------------------------------------------------------

def test_without_a_fallback_the_region_must_prove_the_whole_scenario(spec: Spec, network: DecisionNetwork) -> None:
    """Only the brakes' limit: the network keeps it on every cell, so the network mode is proved with no
    fallback (the unsafe emergency mode is none); with the braking invariant too it is not usable."""
    overbrake = Mode("emergency", define={"decel": expr("11")})
    limit = replace(spec, modes=(spec.modes[0], overbrake),
                    invariants=(Invariant("within_brakes", expr("decel <= max_decel")),), faults=spec.faults[1:])
    policy = synthesize(limit, model=network)
    nominal = policy.entry(frozenset())
    assert nominal is not None and nominal.mode == "learned" and nominal.network is not None
    assert nominal.network.fallback is None and nominal.network.region.coverage() == 1.0
    assert {v.scenario: v.status for v in check_policy(limit, policy, network=network)}["none"] == "proved"
    gapped = replace(nominal.network.region, cells=nominal.network.region.cells[1:])
    holed = replace(policy, table=tuple(replace(e, network=replace(e.network, region=gapped))
                                        if e.network is not None else e for e in policy.table))
    verdict = next(v for v in check_policy(limit, holed, network=network) if v.scenario == "none")
    assert verdict.status == "refuted" and "do not cover" in verdict.reason

    both = replace(limit, invariants=spec.invariants)
    policy = synthesize(both, model=network)
    assert policy.entry(frozenset()) is None
    failed = next(u for u in policy.unrealizable if u.scenario == "none")
    learned = next(m for m in failed.per_mode if m.mode == "learned")
    assert learned.verdict == "refuted" and "no later mode that does not rely on the network" in learned.reason


def test_a_network_mode_safe_for_every_output_never_loads_the_model(spec: Spec) -> None:
    """A mode that is safe whatever the network outputs is proved as before; the model file is never read."""
    assert spec.model is not None
    safe = replace(spec, model=replace(spec.model, path="missing.onnx"),
                   invariants=(Invariant("slow", expr("speed <= 18")),))
    policy = synthesize(safe)
    nominal = policy.entry(frozenset())
    assert nominal is not None and nominal.mode == "learned"
    assert all(e.network is None for e in policy.table)


# --- the seeded bug ----------------------------------------------------------------------------------------------

def bug_network() -> DecisionNetwork:
    torch = pytest.importorskip("torch")
    from tests.failsafe.braking import maker

    net = maker.braking_network(dip=BUG, width=0.005, depth=20.0, noise=0.0)
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return load_network(net, (torch.zeros(4, 2),), inputs=("speed", "gap"), outputs=("decel",),
                        dynamic_shapes=({0: batch},))


@pytest.fixture(scope="module")
def bug_case(spec: Spec) -> tuple[Spec, DecisionNetwork, Policy]:
    """The box narrowed around the bug (it is then 0.6 % of the box: sampling hits it); no wet fault."""
    near = replace(spec, state=(StateVar("speed", 12.2, 12.4, "m/s"), StateVar("gap", 31.6, 31.8, "m")),
                   faults=tuple(f for f in spec.faults if f.name != "wet"))
    network = bug_network()
    return near, network, synthesize(near, model=network)


def test_the_region_excludes_a_planted_violation_and_the_fallback_acts_there(
        bug_case: tuple[Spec, DecisionNetwork, Policy]) -> None:
    near, network, policy = bug_case
    entry = policy.entry(frozenset())
    assert entry is not None and entry.mode == "learned" and entry.network is not None
    region = entry.network.region
    bug = {"speed": np.array([BUG[0]]), "gap": np.array([BUG[1]])}
    decel = network.evaluate(bug)["decel"][0]
    assert decel < 0.5 * BUG[0] - 0.1 * BUG[1], "the bug is real"
    assert not region.contains(bug)[0] and region.coverage() > 0.9
    sim = simulate(near, policy, steps=100_000, seed=4, network=network)
    assert sim.passed and sim.uncovered == 0, sim.first_violation
    assert sim.fallback_steps > 0 and sim.network_steps > 50_000
    blind = simulate(near, trust_everywhere(policy), steps=100_000, seed=4, network=network)
    assert blind.violations > 0, "sampling this box hits the bug when the network is trusted blindly"


def test_a_cell_flipped_to_proved_over_the_bug_is_refuted(bug_case: tuple[Spec, DecisionNetwork, Policy]) -> None:
    near, network, policy = bug_case
    entry = policy.entry(frozenset())
    assert entry is not None and entry.network is not None
    cells = entry.network.region.cells
    k = next(i for i, c in enumerate(cells) if all(c.lo[j] <= BUG[j] <= c.hi[j] for j in range(2))
             and c.verdict != "proved")
    flipped = replace(cells[k], verdict="proved", counterexample=None)
    region = replace(entry.network.region, cells=(*cells[:k], flipped, *cells[k + 1:]))
    use = replace(entry.network, region=region)
    data = replace(policy, table=tuple(replace(e, network=use) if e is entry else e for e in policy.table)).to_dict()
    data["table"][0]["network"]["region"]["counts"] = region.counts()
    data["table"][0]["network"]["region"]["coverage"] = region.coverage()
    data["digest"] = digest_of(data)
    read = Policy.from_json(json.dumps(data))
    verdict = next(v for v in check_policy(near, read, network=network) if v.scenario == "none")
    assert verdict.status == "refuted", verdict.reason
    assert verdict.counterexample is not None and "decided again" in verdict.reason


# --- the command line ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_synth_check_simulate_with_the_model(tmp_path: Path) -> None:
    policy, summary = tmp_path / "policy.json", tmp_path / "sim.json"
    copy = tmp_path / "other.onnx"
    copy.write_bytes((EXAMPLES / "braking.onnx").read_bytes())
    assert main(["failsafe", "synth", str(SPEC), "--model", str(copy), "-o", str(policy), "-q"]) == 0
    data = json.loads(policy.read_text())
    assert next(row for row in data["table"] if row["scenario"] == "none")["network"]["fallback"] == "rule_based"
    assert main(["failsafe", "check", str(SPEC), str(policy), "-q"]) == 0
    assert main(["failsafe", "simulate", str(SPEC), str(policy), "--steps", "5000", "--json", str(summary),
                 "-q"]) == 0
    counts = json.loads(summary.read_text())
    assert counts["violations"] == 0 and counts["network_steps"] > 0 and counts["fallback_steps"] > 0
    assert main(["failsafe", "synth", str(SPEC), "--model", str(tmp_path / "absent.onnx"), "-q"]) == 2


def test_fault_kinds_of_the_example(spec: Spec) -> None:
    kinds = {f.name: f.kind for f in spec.faults}
    assert kinds == {"wet": "other", "input_out_of_box": "input-box", "network_nonfinite": "non-finite"}
