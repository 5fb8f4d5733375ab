"""The report model: one structure for every command that judges a model.

A report is a list of *results*, each the verdict on one thing that was checked (a probe
site, a proof obligation), with a kind — ``pass`` (proved), ``fail`` (refuted, with
evidence such as a witness input or a counterexample) or ``open`` (neither) — a location
in the model, free-form metrics, and evidence files. Renderers (JSON, SARIF, HTML, terminal)
read only this model. The JSON form is versioned (:data:`SCHEMA_VERSION`); see SCHEMA.md.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = "1.0"
KINDS = ("pass", "fail", "open")

Metric = float | int | str | bool | None


class ReportFormatError(ValueError):
    """A report file that does not follow the schema (or a newer major version of it)."""


@dataclass
class Location:
    """Where a result is: the model file, the source node, the IR value and the op."""

    artifact: str | None = None
    node: str | None = None
    value: str | None = None
    op: str | None = None
    component: str | None = None
    index: list[int] | None = None

    @property
    def label(self) -> str:
        parts = [p for p in (self.node, self.value) if p]
        return " / ".join(parts) if parts else (self.op or "?")


@dataclass
class Evidence:
    """A file (or inline values) backing a result: a witness input, a counterexample tensor."""

    kind: str
    description: str
    files: dict[str, str] = field(default_factory=dict)
    values: dict[str, Metric] = field(default_factory=dict)


@dataclass
class Result:
    id: str
    rule: str
    kind: str
    message: str
    location: Location = field(default_factory=Location)
    metrics: dict[str, Metric] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"result kind must be one of {KINDS}, got {self.kind!r}")


@dataclass
class Rule:
    """A kind of check (``fp16-overflow``, ``equivalence``, ...) with its explanation."""

    id: str
    name: str
    description: str
    help: str = ""


@dataclass
class Report:
    command: str
    subject: dict[str, Metric]
    results: list[Result]
    rules: list[Rule] = field(default_factory=list)
    tool: dict[str, Metric] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    schema_version: str = SCHEMA_VERSION

    @property
    def summary(self) -> dict[str, int]:
        counts = {k: 0 for k in KINDS}
        for r in self.results:
            counts[r.kind] += 1
        counts["total"] = len(self.results)
        return counts

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "schema_version": self.schema_version,
            "command": self.command,
            "created": self.created,
            "tool": dict(self.tool),
            "subject": dict(self.subject),
            "settings": _jsonable(self.settings),
            "summary": self.summary,
            "rules": [asdict(r) for r in self.rules],
            "results": [_result_dict(r) for r in self.results],
            "sections": _jsonable(self.sections),
            "timings": {k: float(v) for k, v in self.timings.items()},
        }
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Report:
        version = str(data.get("schema_version", ""))
        if not version or version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ReportFormatError(f"report schema version {version!r} is not readable by this version "
                                    f"(reads {SCHEMA_VERSION.split('.')[0]}.x)")
        try:
            results = [Result(r["id"], r["rule"], r["kind"], r["message"], Location(**r.get("location", {})),
                              dict(r.get("metrics", {})), [Evidence(**e) for e in r.get("evidence", [])])
                       for r in data["results"]]
            rules = [Rule(**r) for r in data.get("rules", [])]
            return Report(data["command"], dict(data["subject"]), results, rules, dict(data.get("tool", {})),
                          dict(data.get("settings", {})), dict(data.get("sections", {})),
                          dict(data.get("timings", {})), str(data.get("created", "")), version)
        except (KeyError, TypeError, ValueError) as e:
            raise ReportFormatError(f"malformed report: {e}") from None


def _result_dict(r: Result) -> dict[str, Any]:
    d = asdict(r)
    d["metrics"] = {k: _metric(v) for k, v in r.metrics.items()}
    for e in d["evidence"]:
        e["values"] = {k: _metric(v) for k, v in e["values"].items()}
    return d


def _metric(v: Any) -> Metric:
    """JSON has no infinities or NaN: they are written as strings ("inf", "-inf", "nan")."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def metric_number(v: Metric) -> float | None:
    """A metric as a number (reading back the strings infinities are written as)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except ValueError:
        return None


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return _metric(x)
    if hasattr(x, "item") and callable(x.item):
        return _jsonable(x.item())
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)
