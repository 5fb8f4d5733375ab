"""A verification report as a :class:`reports.Report`: one result per proof obligation, so the
SARIF, HTML and JSON renderers show proofs the way they show probe sites."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from reports.model import Evidence, Location, Report, Result, Rule
from verify.certificate import TIERS, Verification
from verify.obligations import ObligationRecord
from verify.verdict import Counterexample, Proved, Refuted

KIND = {"proved": "pass", "refuted": "fail", "unknown": "open"}

RULES = {
    "equivalence-exact": Rule("equivalence-exact", "Bit-exact equivalence",
                              "The pass application leaves this result bit-identical (proved over opaque IEEE "
                              "operations: commutativity, never associativity).",
                              "A refuted obligation means the pass is wrong on this model: fix the pass, or "
                              "drop it from the pipeline."),
    "equivalence-real": Rule("equivalence-real", "Equivalence over the reals",
                             "The pass application computes the same result in ideal arithmetic; floats may "
                             "differ by rounding.",
                             "A refuted obligation means the rewrite is wrong even without rounding."),
    "equivalence-bounded": Rule("equivalence-bounded", "Bounded precision change",
                                "A precision change within a stated error bound (checked by the overflow prober).",
                                "Run `cuvil probe` on the model."),
}


def _rule_id(contract: str) -> str:
    rid = f"equivalence-{contract}"
    return rid if rid in RULES else "equivalence-exact"


def _fmt(x: Any) -> str:
    return str(x)


def _evidence(ce: Counterexample) -> Evidence:
    values: dict[str, Any] = {"output": ce.output, "index": ",".join(map(str, ce.index)), "dtype": ce.dtype,
                              "before": _fmt(ce.before), "after": _fmt(ce.after), "found_by": ce.found_by,
                              "replayed": ce.replayed}
    for t in ce.inputs:
        flat = np.asarray(t.value).reshape(-1)
        shown = ", ".join(str(v) for v in flat[:8].tolist())
        values[f"input {t.label}"] = f"{t.type}: [{shown}{', ...' if flat.size > 8 else ''}]"
    return Evidence("counterexample", f"{ce.output}{list(ce.index)}: before {ce.before}, after {ce.after}",
                    {}, values)


def obligation_message(o: ObligationRecord) -> str:
    v = o.verdict
    if isinstance(v, Proved):
        return f"proved ({v.encoder}, {', '.join(v.shapes) or 'static shapes'}, {o.seconds:.3f} s)"
    if isinstance(v, Refuted):
        ce = v.counterexample
        return f"refuted: {ce.output}{list(ce.index)} is {ce.before} before and {ce.after} after the pass"
    return f"unknown: {v.reason}"


def to_report(rep: Verification, *, model: str | None = None, settings: Mapping[str, Any] | None = None,
              version: str = "", timings: Mapping[str, float] | None = None) -> Report:
    results = []
    used: set[str] = set()
    for k, app in enumerate(rep.applications):
        rolled_back = rep.rolled_back_at(k)
        for j, o in enumerate(app.obligations):
            rid = _rule_id(o.contract)
            used.add(rid)
            metrics: dict[str, Any] = {"pass": o.pass_name, "application": k, "contract": o.contract,
                                       "encoder": o.encoder, "cone_before": o.cone[0], "cone_after": o.cone[1],
                                       "seconds": round(o.seconds, 4), "shapes": ", ".join(o.shapes),
                                       "rolled_back": rolled_back}
            evidence = []
            index = None
            if isinstance(o.verdict, Refuted):
                evidence.append(_evidence(o.verdict.counterexample))
                index = list(o.verdict.counterexample.index)
            loc = Location(artifact=model, node=f"@{o.function}", value=o.output, op=None, component=o.pass_name,
                           index=index)
            results.append(Result(f"a{k}.o{j}", rid, KIND[o.status], obligation_message(o), loc, metrics,
                                  evidence))
    subject: dict[str, Any] = {"model": model, "model_hash": rep.module, "pipeline": ", ".join(rep.pipeline)}
    cert = rep.certificate()
    sections: dict[str, Any] = {
        "verification": {"policy": rep.policy, "applications": len(rep.applications),
                         "vacuous_applications": len(rep.vacuous),
                         "obligations": len(rep.obligations), "rolled_back": len(rep.rollbacks),
                         "seconds": round(rep.seconds, 3)},
        "versions": cert["versions"],
        "tiers": dict(TIERS),
    }
    if rep.rollbacks:
        sections["rollbacks"] = {f"{r['pass']} (application {r['application']})": r["reason"]
                                 for r in rep.rollbacks}
    return Report("verify", subject, results, [RULES[r] for r in sorted(used)],
                  {"name": "cuvil", "version": version}, dict(settings or {}), sections, dict(timings or {}))
