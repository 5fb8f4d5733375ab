"""A decision network in the loop: exact encoding, rounding margin, trusted region, the switch.

The network is a braking controller with three hidden ReLU layers, written by hand and perturbed
from a fixed seed: ``decel = clamp(0.5 speed - 0.1 gap + 0.5, 0, 10) - depth * bump(speed, gap)``.
Away from the bump it brakes 0.5 m/s^2 more than the invariant needs; the bump (a pyramid of
ReLUs) takes braking away near one state, so the invariant holds on most but not all of the box.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import z3

import failsafe.network as network_module
from failsafe.expr import parse_expr
from failsafe.network import (
    DecisionNetwork,
    NetworkError,
    Switch,
    TrustedRegion,
    load_decision_model,
    load_network,
    mode_fallback,
    trusted_region,
)
from failsafe.spec import DecisionModel, Fault, Invariant, Mode, Parameter, Spec, StateVar
from tests.failsafe.braking import maker

torch = pytest.importorskip("torch")

SPEED, GAP = (0.0, 18.0), (0.0, 50.0)
BUMP = (15.0, 10.0)  # a broad dip in braking: found by sampling and by proof
BUG = (12.3, 31.7)  # a dip 0.01 m/s wide: sampling misses it
KINDS = {"speed": "real", "gap": "real", "decel": "real", "wet": "bool", "max_decel": "real"}
INPUTS, OUTPUTS = ("speed", "gap"), ("decel",)


def braking_controller(bump: tuple[float, float], width: float, depth: float, noise: float,
                       seed: int = 0) -> Any:
    """The shipped example's design (``make_braking_network.braking_network``) with its dip at ``bump``."""
    return maker.braking_network(dip=bump, width=width, depth=depth, noise=noise, seed=seed)


def braking_spec(source: str = "", invariants: tuple[tuple[str, str], ...] | None = None,
                 modes: tuple[Mode, ...] | None = None) -> Spec:
    def p(text: str) -> Any:
        return parse_expr(text, KINDS)

    invariants = invariants or (("brake", "decel >= 0.5 * speed - 0.1 * gap"), ("limit", "decel <= 10"))
    modes = modes or (Mode("nominal"), Mode("emergency", define={"decel": p("10")}))
    return Spec("braking", (StateVar("speed", *SPEED, "m/s"), StateVar("gap", *GAP, "m")),
                (Fault("wet", "other", active=p("speed <= 9")),), modes,
                tuple(Invariant(n, p(t)) for n, t in invariants),
                model=DecisionModel("braking.onnx", INPUTS, OUTPUTS), source=source)


def holds(spec: Spec, states: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> np.ndarray:
    """Every invariant evaluated numerically (independently of the module's own replay)."""
    env = {**states, **outputs}
    ok = np.ones(len(states["speed"]), dtype=bool)
    for inv in spec.invariants:
        ok &= np.broadcast_to(np.asarray(inv.expr.evaluate(env), dtype=bool), ok.shape)
    return ok


def uniform_states(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"speed": rng.uniform(*SPEED, n), "gap": rng.uniform(*GAP, n)}


def reference(net: Any, states: dict[str, np.ndarray]) -> np.ndarray:
    """The network in float64 (its float32 weights are exact there): the real function to 1e-15."""
    x = torch.tensor(np.stack([states["speed"], states["gap"]], axis=1), dtype=torch.float64)
    with torch.no_grad():
        return copy.deepcopy(net).double()(x).numpy()[:, 0]


# --------------------------------------------------------------------------------------
# fixtures: the braking network through ONNX, the seeded bug through torch.export


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Spec:
    return braking_spec(str(tmp_path_factory.mktemp("braking") / "braking.yaml"))


@pytest.fixture(scope="module")
def controller() -> Any:
    return braking_controller(BUMP, width=1.0, depth=4.0, noise=1e-3)


@pytest.fixture(scope="module")
def network(spec: Spec, controller: Any) -> DecisionNetwork:
    path = Path(spec.source).parent / "braking.onnx"
    maker.export(controller, path)
    assert spec.model is not None
    return load_decision_model(spec.model, spec)


@pytest.fixture(scope="module")
def region(network: DecisionNetwork, spec: Spec) -> TrustedRegion:
    return trusted_region(network, spec, grid=4, max_depth=4)


@pytest.fixture(scope="module")
def bug_network() -> DecisionNetwork:
    net = braking_controller(BUG, width=0.005, depth=20.0, noise=0.0)
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return load_network(net, (torch.zeros(4, 2),), inputs=INPUTS, outputs=OUTPUTS, dynamic_shapes=({0: batch},))


# --------------------------------------------------------------------------------------
# the exact encoding and the rounding margin


def test_encoding_is_the_exact_real_function(network: DecisionNetwork, controller: Any) -> None:
    """Solving the equations at float32-representable states gives the float64 network's value."""
    enc = network.encoding
    states = {k: v.astype(np.float32).astype(np.float64) for k, v in uniform_states(12, seed=3).items()}
    expected = reference(controller, states)
    assert any(eq.branches for eq in enc.equations), "the ReLUs are encoded as If terms"
    for k in range(12):
        s = z3.SolverFor("QF_NRA")
        s.add(*enc.facts, *[eq.leaf == eq.rhs for eq in enc.equations])
        for leaf, name in zip(enc.inputs, INPUTS, strict=True):
            s.add(leaf == z3.RealVal(str(states[name][k])))
        assert s.check() == z3.sat
        value = s.model().eval(enc.outputs[0], model_completion=True)
        assert z3.is_rational_value(value)
        exact = value.numerator_as_long() / value.denominator_as_long()  # type: ignore[attr-defined]
        assert exact == pytest.approx(expected[k], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("box", [((0.0, 0.0), (4.5, 12.5)), ((13.5, 6.25), (15.75, 12.5)),
                                 ((16.0, 0.0), (18.0, 2.0))])
def test_rounding_margin_bounds_the_float32_error(network: DecisionNetwork, controller: Any,
                                                  box: tuple[tuple[float, float], tuple[float, float]]) -> None:
    lo, hi = np.array(box[0]), np.array(box[1])
    enc = network.enclosure(lo, hi)
    margin = float(np.max(enc.error(network.result)))
    assert 0 < margin < 1e-3, "the bound is sound and not vacuous"
    rng = np.random.default_rng(7)
    states = {"speed": rng.uniform(lo[0], hi[0], 4000), "gap": rng.uniform(lo[1], hi[1], 4000)}
    y32 = network.evaluate(states)["decel"]
    y64 = reference(controller, states)
    assert np.max(np.abs(y32 - y64)) <= margin
    out = enc.bounds.values[network.result]
    assert np.all((y32 >= out.lo.min()) & (y32 <= out.hi.max()))


# --------------------------------------------------------------------------------------
# the trusted region


def test_proved_cells_satisfy_the_invariants_on_samples(network: DecisionNetwork, spec: Spec,
                                                        region: TrustedRegion) -> None:
    proved = [c for c in region.cells if c.verdict == "proved"]
    assert proved and {c.method for c in proved} >= {"z3"}
    rng = np.random.default_rng(11)
    per = 400
    states = {name: np.concatenate([rng.uniform(c.lo[k], c.hi[k], per) for c in proved])
              for k, name in enumerate(INPUTS)}
    assert region.contains(states).all()
    outputs = network.evaluate(states)
    assert holds(spec, states, outputs).all()
    assert all(len(c.margin) == 1 and 0 < c.margin[0] < 1e-3 for c in proved)


def test_refuted_cells_carry_real_violating_states(network: DecisionNetwork, spec: Spec,
                                                   region: TrustedRegion) -> None:
    refuted = [c for c in region.cells if c.verdict == "refuted"]
    assert refuted, "the bump breaks the braking invariant"
    for c in refuted:
        assert c.counterexample is not None
        state = {k: np.array([v]) for k, v in c.counterexample.state.items()}
        assert all(c.lo[k] <= state[n][0] <= c.hi[k] for k, n in enumerate(INPUTS))
        outputs = network.evaluate(state)
        assert outputs["decel"][0] == pytest.approx(c.counterexample.outputs["decel"])
        assert not holds(spec, state, outputs)[0]
        assert not region.contains(state)[0]
    centre = {"speed": np.array([BUMP[0]]), "gap": np.array([BUMP[1]])}
    assert not holds(spec, centre, network.evaluate(centre))[0]
    assert not region.contains(centre)[0]


def test_cells_partition_the_box_and_the_region_covers_most_of_it(region: TrustedRegion) -> None:
    total = (SPEED[1] - SPEED[0]) * (GAP[1] - GAP[0])
    assert sum(c.volume for c in region.cells) == pytest.approx(total)
    states = uniform_states(20_000, seed=5)
    x = np.stack([states[n] for n in INPUTS], axis=1)
    inside = [(x >= np.array(c.lo)) & (x <= np.array(c.hi)) for c in region.cells]
    hits = np.sum([np.all(m, axis=1) for m in inside], axis=0)
    assert hits.min() >= 1
    assert np.mean(hits == 1) > 0.99  # more than one only on shared faces
    assert 0.9 <= region.coverage() < 1.0
    assert region.counts()["unknown"] == 0
    assert max(c.depth for c in region.cells) == 4, "undecided cells were bisected"
    assert any(c.phases[0] > 0 for c in region.cells if c.method == "z3"), "bounds fixed ReLU phases"


def test_switch_keeps_every_invariant_on_100k_states(network: DecisionNetwork, spec: Spec,
                                                     region: TrustedRegion) -> None:
    states = uniform_states(100_000, seed=1)
    alone = network.evaluate(states)
    assert (~holds(spec, states, alone)).sum() > 100, "without the switch the network breaks the invariant"
    switch = Switch(region, network, mode_fallback(spec, "emergency", OUTPUTS))
    choice = switch(states)
    assert choice.trusted.mean() > 0.9
    assert np.array_equal(choice.outputs["decel"][choice.trusted], alone["decel"][choice.trusted])
    assert np.all(choice.outputs["decel"][~choice.trusted] == 10.0)
    assert holds(spec, states, choice.outputs).all()
    assert np.array_equal(switch.outputs(states)["decel"], choice.outputs["decel"])


def test_seeded_bug_is_found_by_the_proof_not_by_sampling(bug_network: DecisionNetwork, spec: Spec) -> None:
    states = uniform_states(100_000, seed=2)
    assert holds(spec, states, bug_network.evaluate(states)).all(), "random sampling misses the bug"
    centre = {"speed": np.array([BUG[0]]), "gap": np.array([BUG[1]])}
    assert not holds(spec, centre, bug_network.evaluate(centre))[0], "the bug is real"
    bug_region = trusted_region(bug_network, spec, grid=4, max_depth=4)
    assert not bug_region.contains(centre)[0]
    cell = next(c for c in bug_region.cells if all(c.lo[k] <= BUG[k] <= c.hi[k] for k in range(2)))
    assert cell.verdict in ("refuted", "unknown")
    if cell.verdict == "refuted":
        assert cell.counterexample is not None
        state = {k: np.array([v]) for k, v in cell.counterexample.state.items()}
        assert not holds(spec, state, bug_network.evaluate(state))[0]
    assert bug_region.coverage() > 0.95
    assert bug_region.counts()["refuted"] + bug_region.counts()["unknown"] >= 1
    again = trusted_region(bug_network, spec, grid=4, max_depth=4)
    assert [replace(c, seconds=0.0) for c in again.cells] == [replace(c, seconds=0.0) for c in bug_region.cells]


def test_scenario_region_bounds_the_cells(bug_network: DecisionNetwork, spec: Spec) -> None:
    """While ``wet`` is active the speed stays at most 9: cells beyond are empty, never trusted; the
    cell from 9 to 13.5 holds states of the scenario (speed 9) and is proved for those."""
    wet = trusted_region(bug_network, spec, scenario={"wet"}, grid=(4, 2), max_depth=1)
    assert wet.label == "wet" and wet.faults == ("wet",)
    for c in wet.cells:
        assert (c.verdict == "empty") == (c.lo[0] > 9.0)
        assert c.verdict in ("proved", "empty")
    assert not wet.contains(np.array([[15.0, 10.0]]))[0]
    assert wet.contains(np.array([[4.0, 10.0]]))[0]
    assert wet.coverage() == pytest.approx(0.75)


def test_mode_parameters_decide_the_limit(network: DecisionNetwork) -> None:
    limit = (("limit", "decel <= max_decel"),)
    param_spec = braking_spec(invariants=limit, modes=(Mode("nominal", parameters=(Parameter("max_decel", 0, 12),)),))
    with pytest.raises(NetworkError, match="max_decel"):
        trusted_region(network, param_spec, grid=2, max_depth=0)
    roomy = trusted_region(network, param_spec, mode="nominal", parameters={"max_decel": 9.7}, grid=2, max_depth=1)
    assert roomy.counts()["proved"] == len(roomy.cells) and roomy.coverage() == 1.0
    tight = trusted_region(network, param_spec, mode="nominal", parameters={"max_decel": 9.0}, grid=2, max_depth=1)
    corner = np.array([[18.0, 0.0]])  # decel 9.5 there
    assert not tight.contains(corner)[0]
    bad = [c for c in tight.cells if c.verdict == "refuted"]
    assert bad and all(c.counterexample is not None and c.counterexample.outputs["decel"] > 9.0 for c in bad)
    assert tight.parameters == {"max_decel": 9.0} and tight.mode == "nominal"


def test_region_json_round_trip(region: TrustedRegion) -> None:
    data = json.loads(json.dumps(region.to_json()))
    assert data["format"] == "cuvil-failsafe-trusted-region/1"
    assert {c["verdict"] for c in data["cells"]} == {"proved", "refuted"}
    back = TrustedRegion.from_json(data)
    assert back.counts() == region.counts() and back.inputs == region.inputs
    states = uniform_states(5000, seed=9)
    assert np.array_equal(back.contains(states), region.contains(states))
    with pytest.raises(NetworkError, match="format"):
        TrustedRegion.from_json({**data, "format": "cuvil-failsafe-policy/1"})


# --------------------------------------------------------------------------------------
# hostile inputs


def test_states_outside_or_not_finite_are_not_trusted(region: TrustedRegion) -> None:
    x = np.array([[np.nan, 10.0], [5.0, np.inf], [-1.0, 10.0], [5.0, 51.0], [1.0, 40.0]])
    assert region.contains(x).tolist() == [False, False, False, False, True]
    assert region.contains(np.zeros((0, 2))).shape == (0,)


def test_network_that_does_not_fit_the_spec_is_refused(network: DecisionNetwork, spec: Spec) -> None:
    with pytest.raises(NetworkError, match="names 1 inputs"):
        DecisionNetwork(network.module, ("speed",), OUTPUTS)
    with pytest.raises(NetworkError, match="2 outputs"):
        DecisionNetwork(network.module, INPUTS, ("decel", "steer"))
    other = DecisionNetwork(network.module, ("speed", "distance"), OUTPUTS)
    with pytest.raises(NetworkError, match="distance"):
        trusted_region(other, spec, grid=1, max_depth=0)
    with pytest.raises(NetworkError, match="rain"):
        trusted_region(network, spec, scenario={"rain"}, grid=1, max_depth=0)
    with pytest.raises(NetworkError, match="grid"):
        trusted_region(network, spec, grid=(2, 2, 2), max_depth=0)
    with pytest.raises(NetworkError, match="does not define decel"):
        mode_fallback(spec, "nominal", OUTPUTS)
    with pytest.raises(NetworkError, match="no mode 'cruise'"):
        trusted_region(network, spec, mode="cruise", grid=1, max_depth=0)


def test_op_without_exact_piecewise_linear_meaning_is_refused_by_name() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    with pytest.raises(NetworkError, match="tanh") as info:
        load_network(net, (torch.zeros(1, 2),), inputs=INPUTS, outputs=OUTPUTS)
    assert info.value.code == "CUVIL-FAILSAFE-NETWORK"


def test_uninterpreted_encoding_is_refused(network: DecisionNetwork, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduction the encoder does not unroll is an uninterpreted function: not exact, refused."""
    monkeypatch.setattr(network_module, "UNROLL_LIMIT", 2)
    with pytest.raises(NetworkError, match="matmul is not piecewise linear"):
        DecisionNetwork(network.module, INPUTS, OUTPUTS)


def test_single_row_network_runs_row_by_row(controller: Any, spec: Spec) -> None:
    """A network exported for one row (no batch dim) is evaluated a row at a time."""
    single = load_network(controller, (torch.zeros(1, 2),), inputs=INPUTS, outputs=OUTPUTS)
    assert single.batched is None
    states = uniform_states(5, seed=4)
    x = torch.tensor(np.stack([states[n] for n in INPUTS], axis=1), dtype=torch.float32)
    with torch.no_grad():
        expected = controller(x).numpy()[:, 0]
    assert np.allclose(single.evaluate(states)["decel"], expected, rtol=1e-6, atol=1e-6)
    cells = trusted_region(single, spec, grid=4, max_depth=0).cells
    bump = next(c for c in cells if all(c.lo[k] <= BUMP[k] <= c.hi[k] for k in range(2)))
    assert bump.verdict == "refuted" and bump.counterexample is not None
    assert sum(c.verdict == "proved" for c in cells) >= 12


def test_other_piecewise_linear_ops_leaky_relu_and_clip(spec: Spec) -> None:
    """Leaky ReLU and a clamp (nested If terms) are encoded and proved like ReLU; where the net's
    output (about 8.9) falls short of the braking need near top speed, cells are not trusted."""
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(2, 6), torch.nn.LeakyReLU(0.1), torch.nn.Linear(6, 6),
                              torch.nn.Hardtanh(-2.0, 2.0), torch.nn.Linear(6, 1))
    with torch.no_grad():
        net[4].weight.mul_(0.1)
        net[4].bias.fill_(8.9)
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    other = load_network(net, (torch.zeros(4, 2),), inputs=INPUTS, outputs=OUTPUTS, dynamic_shapes=({0: batch},))
    assert {v.op for v in other.function.values()} >= {"leaky_relu", "clip"}
    found = trusted_region(other, spec, grid=3, max_depth=3)
    states = uniform_states(20_000, seed=6)
    outputs = other.evaluate(states)
    ok = holds(spec, states, outputs)
    assert not ok.all(), "the net brakes too little near top speed"
    inside = found.contains(states)
    assert ok[inside].all() and inside.mean() > 0.8
    assert found.counts()["refuted"] >= 1


def test_resource_limit_gives_unknown_never_proved(network: DecisionNetwork, spec: Spec) -> None:
    whole = trusted_region(network, spec, grid=1, max_depth=0, rlimit=20_000)
    assert [c.verdict for c in whole.cells] == ["unknown"]
    assert "resource" in whole.cells[0].reason
    assert not whole.contains(np.array([[1.0, 40.0]]))[0]


@pytest.mark.slow
def test_deep_refinement_covers_nearly_everything(network: DecisionNetwork, spec: Spec) -> None:
    deep = trusted_region(network, spec, grid=8, max_depth=6)
    assert deep.coverage() > 0.98
    states = uniform_states(100_000, seed=8)
    choice = Switch(deep, network, mode_fallback(spec, "emergency", OUTPUTS))(states)
    assert holds(spec, states, choice.outputs).all()
    assert choice.trusted.mean() > 0.97
