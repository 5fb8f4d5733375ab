"""A probe's findings as a :class:`reports.Report` (one result per site)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from reports.model import Evidence, Location, Report, Result, Rule
from verify.probe.probe import OPEN, OVERFLOW, SAFE, ProbeReport, SiteResult

KIND = {SAFE: "pass", OVERFLOW: "fail", OPEN: "open"}

RULES = {
    "fp16-overflow": Rule("fp16-overflow", "FP16 overflow",
                          "A float16 value (or a float16 step inside an op) can leave the finite range and become "
                          "inf or NaN.", "Keep the op in float32 (compile --enable-fp16 does this for every site "
                                         "not proved safe), rescale its weights, or narrow the input range."),
    "bf16-overflow": Rule("bf16-overflow", "BF16 overflow",
                          "A bfloat16 value (or a bfloat16 step inside an op) can leave the finite range.",
                          "Keep the op in float32 or narrow the input range."),
    "int8-saturation": Rule("int8-saturation", "INT8 saturation",
                            "A requantized value falls outside its integer type's range before the saturating "
                            "clamp: the clamp changes it.",
                            "Recalibrate the output scale on data covering the declared input range."),
    "int-overflow": Rule("int-overflow", "Integer overflow",
                         "An integer value or accumulator can leave its type and wrap around.",
                         "Accumulate in a wider type or split the reduction."),
}


def _f(x: float) -> float:
    return float(x)


def _allowed(s: SiteResult) -> str:
    """The range a site must stay in: ``+-m`` when symmetric, else its two ends."""
    if s.allowed_lo == -s.allowed_hi:
        return f"the limit {s.allowed_hi:g}"
    return f"the range [{s.allowed_lo:g}, {s.allowed_hi:g}]"


def site_message(s: SiteResult) -> str:
    limit = _allowed(s)
    bound = f"[{s.bound_lo:.6g}, {s.bound_hi:.6g}]"
    where = "" if s.component == "result" else f" ({s.component})"
    if s.verdict == SAFE:
        room = "" if not math.isfinite(s.margin) else f", margin {s.margin:.3g}x"
        return f"proved safe: bound {bound} within {limit}{room} [{s.method}]"
    if s.verdict == OVERFLOW:
        seen = "inf/NaN" if s.rule.endswith("overflow") else f"{s.witness_value:g}"
        found = f" (found by {s.witness_method})" if s.witness_method else ""
        return (f"overflow confirmed{where}: the reduced-precision program computes {seen} on witness "
                f"w{(s.witness or 0) + 1}{found}; bound {bound}")
    parts = [f"not proved{where}: bound {bound} exceeds {limit}" if not s.may_nan
             else f"not proved{where}: may be NaN or infinite (bound {bound})"]
    if s.witness_value is not None:
        parts.append(f"largest value a search reached: {s.witness_value:.6g}")
    if s.after:
        parts.append("downstream of confirmed overflow at " + ", ".join(s.after))
    return "; ".join(parts)


def to_report(rep: ProbeReport, *, model: str | None = None, model_hash: str | None = None,
              settings: Mapping[str, Any] | None = None, witness_files: list[dict[str, str]] | None = None,
              version: str = "") -> Report:
    results = []
    for s in rep.sites:
        metrics: dict[str, Any] = {
            "dtype": s.dtype, "bound_lo": _f(s.bound_lo), "bound_hi": _f(s.bound_hi),
            "limit_lo": _f(s.allowed_lo), "limit_hi": _f(s.allowed_hi), "margin": _f(s.margin),
            "may_nan": s.may_nan, "method": s.method,
        }
        if s.witness_value is not None:
            metrics["witness_value"] = _f(s.witness_value)
            if s.verdict == OPEN and s.witness_value not in (0.0,) and math.isfinite(s.witness_value):
                metrics["gap"] = _f(max(abs(s.bound_lo), abs(s.bound_hi)) / abs(s.witness_value))
        if s.safe_scale is not None:
            metrics["safe_scale"] = _f(s.safe_scale)
        if s.witness_scale is not None:
            metrics["witness_scale"] = _f(s.witness_scale)
        if s.after:
            metrics["after"] = ", ".join(s.after)
        if s.witness_method:
            metrics["witness_method"] = s.witness_method
        evidence = []
        if s.witness is not None:
            files = witness_files[s.witness] if witness_files and s.witness < len(witness_files) else {}
            evidence.append(Evidence("witness", f"witness w{s.witness + 1}", dict(files),
                                     {"observed": _f(s.witness_value) if s.witness_value is not None else None}))
        loc = Location(artifact=model, node=s.origin, value=s.name, op=s.op,
                       component=None if s.component == "result" else s.component,
                       index=list(s.index) if s.index is not None else None)
        results.append(Result(s.name, s.rule, KIND[s.verdict], site_message(s), loc, metrics, evidence))
    used = sorted({s.rule for s in rep.sites})
    b = rep.boundary
    sections: dict[str, Any] = {
        "boundary": {"safe_scale": b.safe_scale, "witness_scale": b.witness_scale,
                     "first_unproved_scale": b.unproved_scale, "largest_unconfirmed_scale": b.unconfirmed_scale,
                     "bisection_steps": b.bisection_steps, "note": b.note},
        "threshold": {"rule": rep.threshold},
        "program": {"precision": rep.precision, "sites": len(rep.sites),
                    "kept_wide": len(rep.program.kept), "witnesses": len(rep.witnesses)},
    }
    if rep.budget is not None:
        sections["budget"] = rep.budget.to_json()
    subject: dict[str, Any] = {"model": model, "function": rep.program.function.name}
    if model_hash:
        subject["sha256"] = model_hash
    subject["inputs"] = ", ".join(f"{p.name}: {p.type}" for p in rep.program.function.params)
    all_settings = {"precision": rep.precision,
                    "ranges": {k: f"{lo:g}:{hi:g}" for k, (lo, hi) in rep.ranges.items()}}
    all_settings.update(settings or {})
    return Report("probe", subject, results, [RULES[r] for r in used if r in RULES],
                  {"name": "cuvil", "version": version}, all_settings, sections, dict(rep.timings))
