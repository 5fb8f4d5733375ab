"""SARIF 2.1.0: one run, one result per report result (kind pass/fail/open), the model file
as the physical location and the node/IR value as the logical location; evidence files are
attachments, metrics are result properties."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from reports.model import Report, Result
from reports.render_json import _write

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"fail": "error", "pass": "none", "open": "none"}


def _uri(path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        return p.as_uri()
    return quote(str(PurePosixPath(*p.parts)))


def _message(text: str) -> dict[str, str]:
    return {"text": text or "-"}


def _result(r: Result, rule_index: dict[str, int], artifact_index: dict[str, int]) -> dict[str, Any]:
    loc: dict[str, Any] = {}
    art = r.location.artifact
    if art:
        loc["physicalLocation"] = {"artifactLocation": {"uri": _uri(art), "index": artifact_index[art]}}
    logical = []
    if r.location.node or r.location.value:
        entry: dict[str, Any] = {"name": r.location.node or r.location.value, "kind": "function"}
        if r.location.value:
            entry["fullyQualifiedName"] = f"{r.location.node or r.location.op or ''}::{r.location.value}".lstrip(":")
        logical.append(entry)
    if logical:
        loc["logicalLocations"] = logical
    out: dict[str, Any] = {
        "ruleId": r.rule,
        "kind": r.kind,
        "level": LEVELS[r.kind],
        "message": _message(r.message),
    }
    if r.rule in rule_index:
        out["ruleIndex"] = rule_index[r.rule]
    if loc:
        out["locations"] = [loc]
    attachments = [{"artifactLocation": {"uri": _uri(path)}, "description": _message(f"{e.description}: {name}")}
                   for e in r.evidence for name, path in e.files.items()]
    if attachments:
        out["attachments"] = attachments
    props: dict[str, Any] = {"id": r.id}
    props.update(_props(r.metrics))
    if r.location.op:
        props["op"] = r.location.op
    if r.location.component:
        props["component"] = r.location.component
    if r.location.index is not None:
        props["index"] = list(r.location.index)
    if r.evidence:
        props["evidence"] = [{"kind": e.kind, "description": e.description, "values": _props(e.values)}
                             for e in r.evidence]
    out["properties"] = props
    return out


def _props(d: dict[str, Any]) -> dict[str, Any]:
    from reports.model import _metric

    return {k: _metric(v) for k, v in d.items()}


def to_sarif(report: Report) -> dict[str, Any]:
    rule_index = {r.id: k for k, r in enumerate(report.rules)}
    artifacts = sorted({r.location.artifact for r in report.results if r.location.artifact}
                       | ({str(report.subject["model"])} if report.subject.get("model") else set()))
    artifact_index = {a: k for k, a in enumerate(artifacts)}
    driver: dict[str, Any] = {
        "name": str(report.tool.get("name", "cuvil")),
        "version": str(report.tool.get("version", "0")),
        "rules": [{"id": r.id, "name": r.name, "shortDescription": _message(r.name),
                   "fullDescription": _message(r.description), **({"help": _message(r.help)} if r.help else {})}
                  for r in report.rules],
    }
    run: dict[str, Any] = {
        "tool": {"driver": driver},
        "invocations": [{"executionSuccessful": True, "endTimeUtc": report.created,
                         **({"commandLine": str(report.settings["command_line"])}
                            if report.settings.get("command_line") else {})}],
        "results": [_result(r, rule_index, artifact_index) for r in report.results],
        "properties": {"command": report.command, "summary": report.summary,
                       "schemaVersion": report.schema_version,
                       "subject": _props(dict(report.subject)),
                       "sections": json.loads(json.dumps(report.to_dict()["sections"]))},
    }
    if artifacts:
        run["artifacts"] = [{"location": {"uri": _uri(a)}} for a in artifacts]
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def write_sarif(report: Report, path: str | os.PathLike) -> Path:
    return _write(Path(path), json.dumps(to_sarif(report), indent=2, allow_nan=False) + "\n")
