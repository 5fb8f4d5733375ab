"""The JSON form of a report (the format SCHEMA.md documents and report.schema.json checks)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from reports.model import Report, ReportFormatError


def to_json(report: Report, *, indent: int | None = 2) -> str:
    return json.dumps(report.to_dict(), indent=indent, allow_nan=False) + "\n"


def write_json(report: Report, path: str | os.PathLike) -> Path:
    return _write(Path(path), to_json(report))


def read_json(path: str | os.PathLike) -> Report:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ReportFormatError(f"cannot read report {path}: {e}") from None
    return Report.from_dict(data)


def _write(path: Path, text: str) -> Path:
    """Atomically: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
