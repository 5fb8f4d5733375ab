"""A fail-safe policy, or its re-check, as a :class:`reports.Report`: one result per scenario, so the
terminal, JSON, SARIF and HTML renderers show it like every other check. The report model has no
notes, so each candidate the synthesis rejected rides on its scenario's result as evidence."""

from __future__ import annotations

from typing import Any

from failsafe.policy import Counterexample, Entry, Policy, Unrealizable, Verdict
from reports.model import Evidence, Location, Metric, Report, Result, Rule

RULES = {
    "failsafe-scenario": Rule(
        "failsafe-scenario", "A safe mode in every scenario",
        "Every scenario (set of active faults) has an available mode whose parameters are proved safe: every "
        "invariant holds in every state the scenario allows under the mode's assumptions, and some state meets them.",
        "Add a less capable mode (a minimal-risk manoeuvre), or narrow what an active fault still allows."),
    "failsafe-recheck": Rule(
        "failsafe-recheck", "The policy proves again",
        "Each entry of a policy file is proved again against the spec: the mode is available in its scenario, its "
        "parameters are the mode's, in range, and safe; an unrealizable scenario has no safe mode.",
        "Synthesize the policy again from the spec rather than editing it."),
}
_KINDS = {"proved": "pass", "refuted": "fail", "error": "fail", "unknown": "open"}


def _params_text(parameters: dict[str, float]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in parameters.items())


def _counterexample_evidence(c: Counterexample, rejected: bool = True) -> Evidence:
    what = f"{c.mode}" + (f" with {_params_text(c.parameters)}" if c.parameters else "")
    verb = "rejected" if rejected else "refuted"
    values: dict[str, Metric] = dict(c.state)
    return Evidence("counterexample", f"{what} {verb}: violates {', '.join(c.violated) or '?'} ({c.check} check)",
                    values=values)


def _location(policy: Policy, scenario: str, mode: str | None) -> Location:
    return Location(artifact=policy.spec_source or None, node=f"scenario {scenario}", value=mode)


def _entry_result(k: int, policy: Policy, e: Entry) -> Result:
    metrics: dict[str, Metric] = {"mode": e.mode, "seconds": round(e.seconds, 4),
                                  "candidates_rejected": e.candidates_rejected}
    metrics |= {f"parameter {name}": v for name, v in e.parameters.items()}
    for o in e.optimum:
        metrics[f"{o.parameter} exact"] = o.exact
        metrics[f"{o.parameter} bracket"] = o.width
    evidence = [_counterexample_evidence(c) for c in e.counterexamples]
    if e.verdict == "proved":
        message = f"{e.scenario}: {e.mode}" + (f" with {_params_text(e.parameters)}" if e.parameters else "")
        return Result(f"S{k + 1}", "failsafe-scenario", "pass", message, _location(policy, e.scenario, e.mode),
                      metrics, evidence)
    return Result(f"S{k + 1}", "failsafe-scenario", "open", f"{e.scenario}: undecided ({e.reason})",
                  _location(policy, e.scenario, None), metrics, evidence)


def _unrealizable_result(k: int, policy: Policy, u: Unrealizable) -> Result:
    evidence = []
    if u.state is not None:
        evidence.append(Evidence("counterexample", f"a state no mode survives ({u.found_by})", values=dict(u.state)))
    for m in u.per_mode:
        described = f"{m.mode} {m.verdict}" + (f": {m.reason}" if m.reason else "")
        if m.parameters:
            described += f" (last candidate {_params_text(m.parameters)})"
        evidence.append(Evidence("counterexample" if m.state is not None else "mode", described,
                                 values=dict(m.state or {})))
    how = "one state defeats every mode" if u.state is not None else "each mode fails in its own states"
    return Result(f"S{k + 1}", "failsafe-scenario", "fail", f"{u.scenario}: no mode is safe ({how})",
                  _location(policy, u.scenario, None), {"seconds": round(u.seconds, 4)}, evidence)


def _subject(policy: Policy) -> dict[str, Metric]:
    return {"name": policy.spec_name, "spec": policy.spec_source, "sha256": policy.spec_digest}


def to_report(policy: Policy, *, version: str = "", settings: dict[str, Any] | None = None) -> Report:
    """The synthesized policy: pass per scenario with a proved mode, fail per unrealizable one, open per
    undecided one (in the spec's scenario order)."""
    index = {name: k for k, (name, _) in enumerate(policy.faults)}
    claims: list[Entry | Unrealizable] = sorted(  # as the spec enumerates scenarios: fewest faults first
        [*policy.table, *policy.unrealizable],
        key=lambda c: (len(c.faults), sorted(index.get(f, len(index)) for f in c.faults)))
    results = [_entry_result(k, policy, c) if isinstance(c, Entry) else _unrealizable_result(k, policy, c)
               for k, c in enumerate(claims)]
    sections = {"policy": {"modes": ", ".join(policy.modes), "scenarios": len(claims),
                           "unrealizable": len(policy.unrealizable)},
                "guard": {"inputs": {k: list(v) for k, v in policy.guard.inputs.items()},
                          "input_fault": policy.guard.input_fault, "output_fault": policy.guard.output_fault}}
    seconds = policy.synthesis.get("seconds")
    return Report("failsafe synth", _subject(policy), results, [RULES["failsafe-scenario"]],
                  tool={"name": "cuvil", "version": version},
                  settings={**{k: v for k, v in policy.synthesis.items() if k != "seconds"}, **(settings or {})},
                  sections=sections, timings={"synthesis_s": float(seconds)} if isinstance(seconds, float) else {})


def check_report(policy: Policy, verdicts: list[Verdict], *, version: str = "") -> Report:
    """A re-check (:func:`failsafe.policy.check_policy`): one result per verdict."""
    results = []
    for k, v in enumerate(verdicts):
        claim = {"mode": f"mode {v.mode}", "unrealizable": "unrealizable", "unknown": "undecided"}[v.claim]
        message = f"{v.scenario}: {claim} {v.status}" + (f" ({v.reason})" if v.reason else "")
        evidence = [_counterexample_evidence(v.counterexample, rejected=False)] if v.counterexample else []
        results.append(Result(f"C{k + 1}", "failsafe-recheck", _KINDS[v.status], message,
                              _location(policy, v.scenario, v.mode), {"seconds": round(v.seconds, 4)}, evidence))
    return Report("failsafe check", _subject(policy), results, [RULES["failsafe-recheck"]],
                  tool={"name": "cuvil", "version": version})
