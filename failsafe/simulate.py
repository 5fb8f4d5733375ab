"""A simulation harness for a synthesized policy: random fault sequences (each fault switching on and
off as a Markov chain), and at every step a state drawn at random from what the active scenario
allows under the mode the policy chose; every invariant is evaluated numerically on it. A proved
policy must show zero violations; the harness is the independent, sampling-based confirmation.

Steps whose scenario the policy leaves without a mode (unrealizable or undecided) are counted apart,
never as safe. A decision model's outputs come from ``outputs(states)`` (by default the network's).
In an entry whose mode relies on the network (Simplex), states inside the entry's trusted region get
the network's outputs (run by Cuvil) under that mode; every other state is handed to the fallback
mode, which acts there with its own definitions and parameters (a state its assumptions exclude is
replaced by one drawn under them: the fallback enforces them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failsafe.network import DecisionNetwork
from failsafe.policy import Entry, NetworkUse, Policy
from failsafe.spec import Mode, Spec, scenario_label

Outputs = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]
BATCH = 4096
MAX_DRAWS = 200


@dataclass
class Simulation:
    steps: int
    violations: int = 0
    uncovered: int = 0  # steps in a scenario the policy has no mode for
    unsampled: int = 0  # steps whose scenario and mode allow states too rare to draw (none drawn)
    per_scenario: dict[str, dict[str, int]] = field(default_factory=dict)
    per_invariant: dict[str, int] = field(default_factory=dict)
    first_violation: dict[str, Any] | None = None
    fault_changes: int = 0
    network_steps: int = 0  # steps where the decision network acted inside its trusted region
    fallback_steps: int = 0  # steps of a network entry handed to its fallback mode

    @property
    def passed(self) -> bool:
        return self.violations == 0


def fault_sequence(faults: tuple[str, ...], steps: int, rng: np.random.Generator, *, p_on: float = 0.02,
                   p_off: float = 0.2) -> np.ndarray:
    """``[steps, len(faults)]`` booleans: each fault turns on with ``p_on`` and off with ``p_off`` per step."""
    out = np.zeros((steps, len(faults)), dtype=bool)
    state = np.zeros(len(faults), dtype=bool)
    draws = rng.random((steps, len(faults)))
    for t in range(steps):
        state = np.where(state, draws[t] >= p_off, draws[t] < p_on)
        out[t] = state
    return out


def simulate(spec: Spec, policy: Policy, *, steps: int = 100_000, seed: int = 0, outputs: Outputs | None = None,
             network: DecisionNetwork | None = None, p_on: float = 0.02, p_off: float = 0.2) -> Simulation:
    """Run ``steps`` steps; ``network`` is the decision network a Simplex entry runs (and, by default, what
    gives a decision model's outputs)."""
    if outputs is None and network is not None:
        outputs = network.evaluate
    rng = np.random.default_rng(seed)
    names = tuple(f.name for f in spec.faults)
    seq = fault_sequence(names, steps, rng, p_on=p_on, p_off=p_off)
    sim = Simulation(steps, fault_changes=int(np.count_nonzero(np.diff(seq, axis=0))))
    keys = seq.astype(np.int64) @ (1 << np.arange(len(names), dtype=np.int64)) if names else np.zeros(steps, np.int64)
    for key in np.unique(keys):
        count = int(np.count_nonzero(keys == key))
        active = frozenset(n for k, n in enumerate(names) if key >> k & 1)
        label = scenario_label(active, names)
        entry = policy.entry(active)
        stats = sim.per_scenario.setdefault(label, {"steps": count, "violations": 0})
        if entry is None or entry.mode is None:
            sim.uncovered += count
            stats["uncovered"] = count
            continue
        parts = _parts(spec, entry, active, count, rng, outputs, network)
        if parts is None:
            sim.unsampled += count
            stats["unsampled"] = count
            continue
        if entry.network is not None:
            stats["network"], stats["fallback"] = len(_first(parts[0][1])), count - len(_first(parts[0][1]))
            sim.network_steps += stats["network"]
            sim.fallback_steps += stats["fallback"]
        stats["violations"] = sum(_violations(sim, spec, label, mode, states) for mode, states in parts)
        sim.violations += stats["violations"]
    return sim


def _first(states: Mapping[str, np.ndarray]) -> np.ndarray:
    return next(iter(states.values()))


def _violations(sim: Simulation, spec: Spec, label: str, mode: str, states: dict[str, np.ndarray]) -> int:
    """The states (under ``mode``) that break an invariant; the first one found is recorded."""
    count = len(states[spec.state[0].name])
    bad = np.zeros(count, dtype=bool)
    for inv in spec.invariants:
        broken = ~np.broadcast_to(np.asarray(inv.expr.evaluate(states), dtype=bool), (count,))
        n = int(np.count_nonzero(broken))
        if n:
            sim.per_invariant[inv.name] = sim.per_invariant.get(inv.name, 0) + n
            if sim.first_violation is None:
                k = int(np.argmax(broken))
                sim.first_violation = {"scenario": label, "mode": mode, "invariant": inv.name,
                                       "state": {v.name: float(states[v.name][k]) for v in spec.state}}
        bad |= broken
    return int(np.count_nonzero(bad))


def _parts(spec: Spec, entry: Entry, active: frozenset[str], count: int, rng: np.random.Generator,
           outputs: Outputs | None, network: DecisionNetwork | None) -> list[tuple[str, dict[str, np.ndarray]]] | None:
    """``count`` states of the scenario by the mode that acts on them: the entry's mode, and for a Simplex entry
    its fallback on the states outside the trusted region (first the network's part, then the fallback's)."""
    assert entry.mode is not None
    mode = spec.mode(entry.mode)
    if entry.network is not None and network is None:
        raise ValueError(f"the policy's entry for {entry.scenario!r} runs the decision network: simulate it with "
                         "network=")
    states = _draw(spec, mode, active, entry.parameters, count, rng, outputs)
    if states is None or entry.network is None or entry.network.fallback is None:
        return None if states is None else [(mode.name, states)]
    trusted = entry.network.region.contains(states)
    inside = {k: v[trusted] for k, v in states.items()}
    rest = {v.name: states[v.name][~trusted] for v in spec.state}
    handed = _fallback(spec, entry.network, active, rest, rng, outputs) if not trusted.all() else None
    return [(mode.name, inside)] + ([(str(entry.network.fallback), handed)] if handed is not None else [])


def _fallback(spec: Spec, use: NetworkUse, active: frozenset[str], states: dict[str, np.ndarray],
              rng: np.random.Generator, outputs: Outputs | None) -> dict[str, np.ndarray]:
    """The fallback acting on ``states``: they keep their values where its assumptions hold; the others are
    drawn again under its assumptions (its scenario region is never empty: it was proved not vacuous)."""
    assert use.fallback is not None
    mode = spec.mode(use.fallback)
    n = len(_first(states))
    env = _fill(spec, mode, use.fallback_parameters, dict(states), outputs)
    ok = _admitted(spec, mode, active, env, n)
    kept = {k: np.broadcast_to(np.asarray(v), (n,))[ok] for k, v in env.items() if np.ndim(v) <= 1}
    missing = n - int(np.count_nonzero(ok))
    if not missing:
        return kept
    fresh = _draw(spec, mode, active, use.fallback_parameters, missing, rng, outputs)
    if fresh is None:
        raise ValueError(f"no state of scenario {sorted(active)} meets the assumptions of fallback {mode.name!r}")
    return {k: np.concatenate([kept[k], fresh[k]]) for k in kept}


def _draw(spec: Spec, mode: Mode, active: frozenset[str], parameters: Mapping[str, float], count: int,
          rng: np.random.Generator, outputs: Outputs | None) -> dict[str, np.ndarray] | None:
    """``count`` states from the scenario's region under ``mode`` (rejection sampling over the state box),
    with constants, parameters, definitions and model outputs filled in; None when none is drawn."""
    kept: list[dict[str, np.ndarray]] = []
    have = 0
    for _ in range(MAX_DRAWS):
        env = _environment(spec, mode, parameters, rng, BATCH, outputs)
        ok = _admitted(spec, mode, active, env, BATCH)
        if ok.any():
            kept.append({k: np.broadcast_to(np.asarray(v), (BATCH,))[ok] for k, v in env.items()
                         if np.ndim(v) <= 1})
            have += int(np.count_nonzero(ok))
        if have >= count:
            break
    if not have:
        return None
    merged = {k: np.concatenate([part[k] for part in kept]) for k in kept[0]}
    idx = np.resize(np.arange(have), count)  # enough drawn: the first ``count``; else reuse (rare regions)
    return {k: v[idx] for k, v in merged.items()}


def _admitted(spec: Spec, mode: Mode, active: frozenset[str], env: Mapping[str, Any], n: int) -> np.ndarray:
    """Which of ``n`` states meet the scenario's fault conditions and the mode's assumptions."""
    ok = np.ones(n, dtype=bool)
    for f in spec.faults:
        cond = f.active if f.name in active else f.nominal
        if cond is not None:
            ok &= np.broadcast_to(np.asarray(cond.evaluate(env), dtype=bool), (n,))
    for a in mode.assume:
        ok &= np.broadcast_to(np.asarray(a.evaluate(env), dtype=bool), (n,))
    return ok


def _environment(spec: Spec, mode: Mode, parameters: Mapping[str, float], rng: np.random.Generator, n: int,
                 outputs: Outputs | None) -> dict[str, Any]:
    env: dict[str, Any] = {v.name: rng.uniform(v.lo, v.hi, n) for v in spec.state}
    for v in spec.state:  # the ends of each range too: where invariants are tightest
        ends = rng.random(n) < 0.05
        env[v.name] = np.where(ends, np.where(rng.random(n) < 0.5, v.lo, v.hi), env[v.name])
    return _fill(spec, mode, parameters, env, outputs)


def _fill(spec: Spec, mode: Mode, parameters: Mapping[str, float], env: dict[str, Any],
          outputs: Outputs | None) -> dict[str, Any]:
    """Constants, parameters, the model's outputs and the definitions, added to states by name."""
    env.update({k: float(c) for k, c in spec.constants.items()})
    env.update({k: float(p) for k, p in parameters.items()})
    if spec.model is not None:
        if outputs is not None:
            env.update({k: np.asarray(v, dtype=np.float64) for k, v in outputs(env).items()})
        else:
            raise ValueError("a spec with a decision model is simulated with its outputs(states) function")
    for name, expr in [*spec.define.items(), *mode.define.items()]:
        env[name] = expr.evaluate(env)
    return env
