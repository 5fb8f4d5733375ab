"""Policy synthesis (counterexample-guided, with objectives bracketed by bisection), the policy file,
its re-check against the spec, and its report: closed-form optima, fallback to a lower mode,
unrealizable scenarios with the state that defeats every mode, vacuous modes, edited and malformed
policies, determinism and the time limit."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import z3

from failsafe.expr import ExprError, parse_expr
from failsafe.policy import (
    FORMAT,
    Policy,
    PolicyError,
    check_policy,
    digest_of,
    from_json,
)
from failsafe.report import check_report, to_report
from failsafe.spec import DecisionModel, Fault, Invariant, Mode, Parameter, Spec, StateVar
from failsafe.synth import synthesize
from reports import to_json as report_json
from reports import to_sarif

ParamSpec = tuple[float, float, str | None]


def make_spec(name: str, state: Mapping[str, tuple[float, float]], modes: Sequence[Mapping[str, Any]],
              invariants: Mapping[str, str], *, faults: Mapping[str, Mapping[str, Any]] | None = None,
              constants: Mapping[str, float] | None = None, define: Mapping[str, str] | None = None,
              model: DecisionModel | None = None) -> Spec:
    """A spec from text: every state variable, constant, parameter, definition and model output is a
    real name, every fault a flag."""
    faults, constants, define = faults or {}, constants or {}, define or {}
    kinds = {n: "real" for n in [*state, *constants, *define, *(model.outputs if model else ())]}
    kinds |= {n: "bool" for n in faults}
    for m in modes:
        kinds |= {n: "real" for n in [*m.get("parameters", {}), *m.get("define", {})]}
    e = lambda text, expect="bool": parse_expr(text, kinds, expect=expect)
    return Spec(
        name,
        tuple(StateVar(n, lo, hi) for n, (lo, hi) in state.items()),
        tuple(Fault(n, f.get("kind", "other"), nominal=e(f["nominal"]) if "nominal" in f else None,
                    active=e(f["active"]) if "active" in f else None) for n, f in faults.items()),
        tuple(Mode(m["name"], requires=e(m["requires"]) if "requires" in m else None,
                   parameters=tuple(Parameter(p, lo, hi, obj) for p, (lo, hi, obj) in m.get("parameters", {}).items()),
                   assume=tuple(e(a) for a in m.get("assume", ())),
                   define={k: e(v, "real") for k, v in m.get("define", {}).items()}) for m in modes),
        tuple(Invariant(n, e(text)) for n, text in invariants.items()),
        dict(constants), {k: e(v, "real") for k, v in define.items()}, model, source=f"{name}.yaml",
        digest="ab" * 32)


def cap_spec(latency: float, decel: float, distance: float) -> Spec:
    """The highest speed cap with cap*L + cap^2/(2a) <= D."""
    return make_spec("stop", {"speed": (0, 40)},
                     [{"name": "cruise", "parameters": {"cap": (0, 40, "maximize")}, "assume": ["speed <= cap"]}],
                     {"stops": "speed * L + speed**2 / (2 * a) <= D"},
                     constants={"L": latency, "a": decel, "D": distance})


def fallback_spec() -> Spec:
    """Nominal (fixed 20 m/s) holds while the speed error is small; with the sensor lost (error up to 3)
    it fails and a capped mode takes over; with weak brakes only stopping is left."""
    return make_spec(
        "fallback", {"speed": (0, 40), "err": (0, 5)},
        [{"name": "nominal", "assume": ["speed <= 20"]},
         {"name": "degraded", "requires": "not brake_weak", "parameters": {"cap": (0, 40, "maximize")},
          "assume": ["speed <= cap"]},
         {"name": "stop", "assume": ["speed <= 0"]}],
        {"gap": "speed * (1 + err) <= 30 or (brake_weak and speed <= 5)"},
        faults={"sensor_lost": {"kind": "sensor", "nominal": "err <= 0.5", "active": "err <= 3"},
                "brake_weak": {}})


def holds(spec: Spec, mode_name: str, state: Mapping[str, float], params: Mapping[str, float],
          faults: frozenset[str] = frozenset()) -> tuple[bool, bool]:
    """(state in the scenario's region and the mode's assumptions hold, every invariant holds), in floats."""
    mode = spec.mode(mode_name)
    env: dict[str, Any] = {**spec.constants, **{f.name: f.name in faults for f in spec.faults}, **state, **params}
    for k, expr in (*spec.define.items(), *mode.define.items()):
        env[k] = expr.evaluate(env)
    region = all(v.lo <= state[v.name] <= v.hi for v in spec.state) and all(
        bool(expr.evaluate(env)) for f in spec.faults
        for expr in [f.active if f.name in faults else f.nominal] if expr is not None)
    assume = all(bool(a.evaluate(env)) for a in mode.assume)
    return region and assume, all(bool(i.expr.evaluate(env)) for i in spec.invariants)


def strip_timings(policy: Policy) -> str:
    data = policy.to_dict()
    data.pop("digest")
    for row in [*data["table"], *data["unrealizable"]]:
        row.pop("seconds")
    return json.dumps(data, sort_keys=True)


# --- closed forms ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("latency,decel,distance", [(0.5, 3.0, 50.0), (0.1, 6.0, 120.0), (1.2, 2.5, 30.0)])
def test_highest_cap_matches_the_closed_form(latency, decel, distance):
    spec = cap_spec(latency, decel, distance)
    policy = synthesize(spec)
    (entry,) = policy.table
    analytic = decel * (-latency + math.sqrt(latency**2 + 2 * distance / decel))
    assert entry.verdict == "proved" and entry.mode == "cruise"
    cap = entry.parameters["cap"]
    assert abs(cap - analytic) < 1e-6
    # the safe end is kept: the cap is below the true optimum, the bracket's other end above it
    exact_cap = Fraction(cap)
    L, a, D = (Fraction(repr(x)) for x in (latency, decel, distance))
    assert exact_cap * L + exact_cap**2 / (2 * a) <= D
    (opt,) = entry.optimum
    assert opt.parameter == "cap" and opt.objective == "maximize" and opt.value == cap
    assert opt.bound is not None and opt.bound > analytic and opt.width <= 1e-9 * 40 and opt.monotone
    assert not opt.exact
    assert all(v.status == "proved" for v in check_policy(spec, policy))


def test_zero_tolerance_brackets_the_optimum_between_adjacent_floats():
    (entry,) = synthesize(cap_spec(0.5, 3.0, 50.0), tolerance=0.0).table
    (opt,) = entry.optimum
    assert opt.exact and opt.monotone and opt.bound == math.nextafter(opt.value, math.inf)
    assert opt.value == entry.parameters["cap"]


@pytest.mark.parametrize("limit,expected", [("speed <= 30", 30.0), ("3 * speed <= 1", 1 / 3), ("speed <= 0.1", None)])
def test_round_optima_are_found_exactly(limit, expected):
    """The roundest number left in the bracket is tried last: 30 is found as 30, not 29.99999999..."""
    spec = make_spec("round", {"speed": (0, 40)},
                     [{"name": "m", "parameters": {"cap": (0, 40, "maximize")}, "assume": ["speed <= cap"]}],
                     {"limit": limit})
    (entry,) = synthesize(spec).table
    cap = entry.parameters["cap"]
    if expected == 30.0:
        assert cap == 30.0
    elif expected is None:  # the float 0.1 is above one tenth: the cap stays below it
        assert cap < 0.1 and Fraction(cap) <= Fraction(1, 10) and 0.1 - cap < 1e-7
    else:
        assert Fraction(cap) * 3 <= 1 and expected - cap < 1e-7


def test_smallest_radius_matches_the_closed_form():
    """Minimize r with x^2 + y^2 <= r^2 over the square [-1, 1]^2: r = sqrt(2)."""
    spec = make_spec("fence", {"x": (-1, 1), "y": (-1, 1)},
                     [{"name": "fence", "parameters": {"r": (0, 5, "minimize")}}], {"inside": "x*x + y*y <= r*r"})
    (entry,) = synthesize(spec).table
    r = entry.parameters["r"]
    assert abs(r - math.sqrt(2)) < 1e-6 and Fraction(r) ** 2 >= 2
    assert entry.optimum[0].objective == "minimize" and entry.optimum[0].bound is not None
    assert entry.optimum[0].bound < math.sqrt(2)


def test_objectives_are_lexicographic_in_declared_order():
    """The cap is pushed first (cap^2/(2a) <= D: sqrt(2aD)); the buffer is then the least for that cap."""
    spec = make_spec("lex", {"speed": (0, 40)},
                     [{"name": "m", "parameters": {"cap": (0, 40, "maximize"), "buffer": (0, 200, "minimize")},
                       "assume": ["speed <= cap"]}],
                     {"stops": "speed**2 / (2 * a) <= D", "buffered": "2 * speed <= buffer"},
                     constants={"a": 3.0, "D": 50.0})
    (entry,) = synthesize(spec).table
    cap, buffer = entry.parameters["cap"], entry.parameters["buffer"]
    assert abs(cap - math.sqrt(300)) < 1e-6
    assert buffer >= 2 * cap and abs(buffer - 2 * cap) < 1e-6
    assert [o.parameter for o in entry.optimum] == ["cap", "buffer"]


def test_parameter_without_objective_is_found_by_counterexamples():
    """Only k in [2, 3] is safe (x*k <= 3 and x*(6 - k) <= 4 at x = 1): the search must learn both sides."""
    spec = make_spec("window", {"x": (0, 1)}, [{"name": "m", "parameters": {"k": (0, 10, None)}}],
                     {"upper": "x * k <= 3", "lower": "x * (6 - k) <= 4"})
    (entry,) = synthesize(spec).table
    assert entry.verdict == "proved" and 2 <= entry.parameters["k"] <= 3 and entry.optimum == ()
    for c in entry.counterexamples:  # each rejected candidate really fails at its state
        inside, safe = holds(spec, "m", c.state, c.parameters)
        assert c.mode == "m" and inside and not safe and c.check == "numeric"
    assert entry.candidates_rejected == len(entry.counterexamples)


# --- modes, fallbacks, unrealizable scenarios ------------------------------------------------------------------

def test_nominal_fails_in_one_scenario_and_the_next_mode_takes_over():
    spec = fallback_spec()
    said: list[str] = []
    policy = synthesize(spec, progress=said.append)
    assert said[:3] == ["none: nominal proved", "sensor_lost: nominal refuted", "sensor_lost: degraded proved"]
    rows = {e.scenario: e for e in policy.table}
    assert set(rows) == {"none", "sensor_lost", "brake_weak", "sensor_lost+brake_weak"}
    assert rows["none"].mode == "nominal" and rows["brake_weak"].mode == "nominal"
    lost = rows["sensor_lost"]
    assert lost.mode == "degraded" and lost.parameters["cap"] == 7.5  # 30 / (1 + 3), found exactly
    assert "nominal refuted" in lost.reason
    nominal_cex = [c for c in lost.counterexamples if c.mode == "nominal"]
    assert nominal_cex
    for c in lost.counterexamples:
        inside, safe = holds(spec, c.mode, c.state, c.parameters, frozenset({"sensor_lost"}))
        assert inside and not safe
    both = rows["sensor_lost+brake_weak"]
    assert both.mode == "stop" and "degraded unavailable" in both.reason
    assert policy.unrealizable == ()


def test_unrealizable_scenario_reports_a_state_that_defeats_every_mode():
    spec = make_spec("unreal", {"x": (0, 10)},
                     [{"name": "gain", "parameters": {"g": (1, 2, "minimize")}, "define": {"y": "x * g"}},
                      {"name": "plain", "define": {"y": "x"}}],
                     {"limit": "y <= 6"}, faults={"f": {"nominal": "x <= 5"}})
    policy = synthesize(spec)
    assert [e.scenario for e in policy.table] == ["none"]
    (u,) = policy.unrealizable
    assert u.scenario == "f" and u.state is not None and u.found_by
    assert [(m.mode, m.verdict) for m in u.per_mode] == [("gain", "refuted"), ("plain", "refuted")]
    faults = frozenset({"f"})
    inside, safe = holds(spec, "plain", u.state, {}, faults)
    assert inside and not safe
    for g in np.linspace(1, 2, 41):  # the state defeats "gain" at every parameter value
        inside, safe = holds(spec, "gain", u.state, {"g": float(g)}, faults)
        assert inside and not safe
    verdicts = check_policy(spec, policy)
    assert [(v.scenario, v.claim, v.status) for v in verdicts] == [("none", "mode", "proved"),
                                                                   ("f", "unrealizable", "proved")]


def test_unrealizable_without_a_common_state_reports_each_mode():
    """Mode A fails at high x, mode B at low x: no single state defeats both."""
    spec = make_spec("split", {"x": (0, 10)},
                     [{"name": "A", "define": {"risk": "x"}}, {"name": "B", "define": {"risk": "10 - x"}}],
                     {"risk": "risk <= 8"}, faults={"f": {"nominal": "x >= 4 and x <= 6"}})
    (u,) = synthesize(spec).unrealizable
    assert u.state is None and u.found_by is None
    for m in u.per_mode:
        assert m.verdict == "refuted" and m.state is not None
        inside, safe = holds(spec, m.mode, m.state, m.parameters, frozenset({"f"}))
        assert inside and not safe


def test_unrealizable_when_no_mode_is_available():
    spec = make_spec("none-left", {"x": (0, 1)}, [{"name": "only", "requires": "not f"}], {"ok": "x <= 1"},
                     faults={"f": {}})
    policy = synthesize(spec)
    (u,) = policy.unrealizable
    assert u.state is None and [(m.mode, m.verdict) for m in u.per_mode] == [("only", "unavailable")]


def test_vacuous_modes_are_not_accepted_as_safe():
    spec = make_spec("vacuous", {"speed": (0, 40)},
                     [{"name": "fast", "assume": ["speed >= 50"]},
                      {"name": "faster", "parameters": {"c": (45, 60, "maximize")}, "assume": ["speed >= c"]},
                      {"name": "slow", "assume": ["speed <= 10"]}],
                     {"limit": "speed <= 20"})
    policy = synthesize(spec)
    (entry,) = policy.table
    assert entry.mode == "slow"
    assert "fast vacuous" in entry.reason and "faster vacuous" in entry.reason
    only_vacuous = make_spec("vacuous", {"speed": (0, 40)}, [{"name": "fast", "assume": ["speed >= 50"]}],
                             {"limit": "speed <= 20"})
    (u,) = synthesize(only_vacuous).unrealizable
    assert u.per_mode[0].verdict == "vacuous" and u.state is None


def test_counterexamples_are_confirmed_and_say_how():
    """A float check, an exact check of the floats (2^53 + 1 rounds back to 2^53) and the model's exact
    value (sqrt 2 is no float)."""
    spec = make_spec("checks", {"x": (0, 1e16)},
                     [{"name": "floaty", "assume": ["x == 9007199254740992"], "define": {"t": "1"}},
                      {"name": "root", "assume": ["x * x == 2"], "define": {"t": "2"}},
                      {"name": "plain", "assume": ["x >= 100"], "define": {"t": "3"}},
                      {"name": "safe", "assume": ["x <= 0"], "define": {"t": "0"}}],
                     {"a": "t != 1 or x + 1 <= x + 0.5 or x < 1", "b": "t != 2 or x * x != 2",
                      "c": "t != 3 or x <= 50"})
    (entry,) = synthesize(spec).table
    assert entry.mode == "safe"
    checks = {c.mode: c for c in entry.counterexamples}
    assert checks["floaty"].check == "exact" and checks["floaty"].violated == ("a",)
    assert checks["root"].check == "model" and checks["root"].state["x"] == math.sqrt(2)
    assert checks["plain"].check == "numeric" and checks["plain"].violated == ("c",)


def test_requires_reading_the_state_is_an_error():
    spec = make_spec("bad", {"x": (0, 1)}, [{"name": "m", "requires": "x > 0.5"}], {"ok": "x <= 1"})
    with pytest.raises(ExprError, match="reads 'x'") as info:
        synthesize(spec)
    assert info.value.location == "mode m requires"
    constant = make_spec("bad", {"x": (0, 1)}, [{"name": "m", "requires": "k > 0.5"}], {"ok": "x <= 1"},
                         constants={"k": 1.0})
    assert synthesize(constant).table[0].mode == "m"


# --- determinism, time limit -----------------------------------------------------------------------------------

def test_same_spec_same_policy():
    spec = fallback_spec()
    first = strip_timings(synthesize(spec))
    noise = [z3.Real(f"noise{k}") for k in range(200)]  # terms made in between must not matter
    z3.Solver().check(*[t > k for k, t in enumerate(noise)])
    assert strip_timings(synthesize(spec)) == first


def test_time_limit_gives_unknown_never_proved():
    spec = fallback_spec()
    policy = synthesize(spec, time_limit=0.0)
    assert policy.unrealizable == ()
    assert all(e.verdict == "unknown" and e.mode is None and "time limit" in e.reason for e in policy.table)
    assert len(policy.table) == 4
    partial = synthesize(spec, time_limit=0.05)
    assert all(e.verdict in ("proved", "unknown") for e in partial.table)
    for v in check_policy(spec, partial):  # what it does claim proves again
        assert v.status == ("proved" if v.claim == "mode" else "unknown")


# --- re-checking a policy --------------------------------------------------------------------------------------

def edited(policy: Policy, scenario: str, **changes: Any) -> Policy:
    data = policy.to_dict()
    row = next(r for r in data["table"] if r["scenario"] == scenario)
    row.update(changes)
    return from_json(json.dumps(data), check_digest=False)


def test_edited_parameter_is_refuted_with_a_real_counterexample():
    spec = cap_spec(0.5, 3.0, 50.0)
    policy = synthesize(spec)
    cap = policy.table[0].parameters["cap"]
    (v,) = check_policy(spec, edited(policy, "none", parameters={"cap": cap * 1.01}))
    assert v.status == "refuted" and v.counterexample is not None
    c = v.counterexample
    assert c.parameters == {"cap": cap * 1.01} and c.violated == ("stops",)
    inside, safe = holds(spec, "cruise", c.state, c.parameters)
    assert inside and not safe
    (ok,) = check_policy(spec, policy)
    assert ok.status == "proved" and ok.counterexample is None


def test_policy_entries_that_do_not_fit_the_spec_are_errors():
    spec = fallback_spec()
    policy = synthesize(spec)
    with pytest.raises(PolicyError) as info:  # a row's mode must be one the file itself declares
        edited(policy, "none", mode="warp")
    assert info.value.message.startswith("$.table[0].mode: 'warp' is not one of the policy's modes")
    declared = dataclasses.replace(policy, modes=(*policy.modes, "warp"))  # a policy for another spec
    cases = [
        ("none", {"mode": "warp"}, "not a mode of the spec"),
        ("sensor_lost+brake_weak", {"mode": "degraded", "parameters": {"cap": 1.0}}, "not available"),
        ("sensor_lost", {"parameters": {"cap": 1.0, "gain": 2.0}}, "unknown parameter(s) gain"),
        ("none", {"mode": "degraded", "parameters": {}}, "missing parameter(s) cap"),
        ("sensor_lost", {"parameters": {"cap": 41.0}}, "outside its range"),
    ]
    for scenario, change, message in cases:
        verdicts = {v.scenario: v for v in check_policy(spec, edited(declared, scenario, **change))}
        assert verdicts[scenario].status == "error" and message in verdicts[scenario].reason, scenario
        assert all(v.status == "proved" for k, v in verdicts.items() if k != scenario)
    data = policy.to_dict()
    data["table"] = [r for r in data["table"] if r["scenario"] != "brake_weak"]
    data["faults"].append({"name": "ghost", "kind": "other"})  # a fault the policy declares, the spec lacks
    data["table"].append({**data["table"][0], "scenario": "ghost", "faults": ["ghost"]})
    read = from_json(json.dumps(data), check_digest=False)
    data["table"].append(dict(data["table"][0]))
    with pytest.raises(PolicyError) as info:  # the file cannot give a scenario twice ...
        from_json(json.dumps(data), check_digest=False)
    assert info.value.message.startswith(f"$.table[{len(data['table']) - 1}].scenario: 'none' has two rows")
    verdicts = check_policy(spec, dataclasses.replace(read, table=(*read.table, read.table[0])))  # ... a Policy can
    by_status = sorted((v.scenario, v.status, v.reason.split(":")[0]) for v in verdicts if v.status == "error")
    assert by_status == [("brake_weak", "error", "the policy has no entry for this scenario"),
                         ("ghost", "error", "names faults the spec does not have"),
                         ("none", "error", "a second entry for this scenario")]


def test_wrong_unrealizable_claim_is_refuted():
    spec = fallback_spec()
    policy = synthesize(spec)
    data = policy.to_dict()
    row = data["table"].pop(1)
    data["unrealizable"].append({"scenario": row["scenario"], "faults": row["faults"], "state": None,
                                 "per_mode": []})
    verdicts = {v.scenario: v for v in check_policy(spec, from_json(json.dumps(data), check_digest=False))}
    assert verdicts["sensor_lost"].status == "refuted" and "degraded is safe" in verdicts["sensor_lost"].reason


# --- the file --------------------------------------------------------------------------------------------------

def test_json_round_trip_and_guard_section():
    spec = make_spec(
        "guarded", {"speed": (0, 40), "gap": (0, 100)},
        [{"name": "nominal", "assume": ["speed <= 10", "accel <= 0"]}, {"name": "stop", "assume": ["speed <= 0"]}],
        {"stops": "speed**2 / 6 <= gap + 20"},
        faults={"off_box": {"kind": "input-box"}, "nan_out": {"kind": "non-finite"}},
        model=DecisionModel("policy.onnx", ("speed", "gap"), ("accel",)))
    policy = synthesize(spec)
    assert policy.guard.inputs == {"speed": (0.0, 40.0), "gap": (0.0, 100.0)}
    assert (policy.guard.input_fault, policy.guard.output_fault) == ("off_box", "nan_out")
    text = policy.to_json()
    data = json.loads(text)
    assert data["format"] == FORMAT and data["digest"] == digest_of(data)
    assert data["spec"] == {"name": "guarded", "digest": "ab" * 32, "source": "guarded.yaml"}
    assert data["guard"] == {"inputs": {"speed": [0.0, 40.0], "gap": [0.0, 100.0]}, "input_fault": "off_box",
                             "output_fault": "nan_out"}
    assert set(data) == {"format", "spec", "state", "faults", "modes", "table", "unrealizable", "guard", "digest"}
    back = Policy.from_json(text)
    assert back == policy and back.to_json() == text
    no_model = synthesize(cap_spec(0.5, 3.0, 50.0))
    assert no_model.guard.inputs == {} and no_model.guard.input_fault is None


def broken(text: str, change) -> str:
    data = json.loads(text)
    change(data)
    data["digest"] = digest_of(data)
    return json.dumps(data)


def test_malformed_policy_files_give_clear_errors():
    text = synthesize(cap_spec(0.5, 3.0, 50.0)).to_json()
    cases = [
        ("{not json", "$", "not JSON"),
        ("[1, 2]", "$", "expected an object"),
        ('{"format": NaN}', "$", "NaN is not a JSON number"),
        ('{"format": "a", "format": "b"}', "$", "given twice"),
        (broken(text, lambda d: d.update(format="cuvil-failsafe-policy/2")), "$.format", "not a policy format"),
        (broken(text, lambda d: d.pop("table")), "$", "missing field 'table'"),
        (broken(text, lambda d: d["table"][0]["parameters"].update(cap="fast")), "$.table[0].parameters.cap",
         "expected a number"),
        (broken(text, lambda d: d["table"][0].update(verdict="maybe")), "$.table[0].verdict", "not one of"),
        (broken(text, lambda d: d["table"][0].update(mode=None)), "$.table[0].mode", "names its mode"),
        (broken(text, lambda d: d["table"][0]["counterexamples"][0].update(state=[1])),
         "$.table[0].counterexamples[0].state", "expected an object"),
        (broken(text, lambda d: d["guard"]["inputs"].update(x=[2, 1])), "$.guard.inputs.x", "lo <= hi"),
        (broken(text, lambda d: d["table"][0].update(candidates_rejected=-1)), "$.table[0].candidates_rejected",
         "count"),
        (text.replace('"verdict": "proved"', '"verdict": "unknown"'), "$.digest", "changed after it was written"),
    ]
    for bad, path, message in cases:
        with pytest.raises(PolicyError) as info:
            from_json(bad, source="p.json")
        assert info.value.code == "CUVIL-FAILSAFE-POLICY"
        assert info.value.message.startswith(f"{path}:") and message in info.value.message, (path, info.value)
        assert info.value.location == f"p.json {path}"


# --- the report ------------------------------------------------------------------------------------------------

def test_report_has_one_result_per_scenario():
    spec = make_spec("mixed", {"x": (0, 10)},
                     [{"name": "gain", "parameters": {"g": (1, 2, "minimize")}, "define": {"y": "x * g"}},
                      {"name": "plain", "define": {"y": "x"}}],
                     {"limit": "y <= 6"}, faults={"f": {"nominal": "x <= 5"}, "g_late": {}})
    policy = synthesize(spec)
    report = to_report(policy, version="test")
    assert [r.location.node for r in report.results] == ["scenario none", "scenario f", "scenario g_late",
                                                         "scenario f+g_late"]
    assert [r.kind for r in report.results] == ["pass", "fail", "pass", "fail"]
    failed = report.results[1]
    assert failed.evidence[0].values == policy.unrealizable[0].state
    assert report.summary == {"pass": 2, "fail": 2, "open": 0, "total": 4}
    json.loads(report_json(report))
    assert to_sarif(report)["runs"][0]["results"]
    undecided = to_report(synthesize(spec, time_limit=0.0))
    assert {r.kind for r in undecided.results} == {"open"}
    checked = check_report(policy, check_policy(spec, policy))
    assert [r.kind for r in checked.results] == ["pass"] * 4
