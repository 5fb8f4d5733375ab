"""The packages type-check clean under basedpyright's basic mode (the configuration is in
pyproject.toml), so `make lint` and the test suite agree on what clean means."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _checker() -> str | None:
    beside = Path(sys.executable).with_name("basedpyright")
    return str(beside) if beside.exists() else shutil.which("basedpyright")


@pytest.mark.skipif(_checker() is None, reason="basedpyright is not installed (it comes with the dev extra)")
def test_packages_type_check_clean():
    # the project's own configuration, named: a pyrightconfig.json in a folder above must not take over
    run = subprocess.run([_checker(), "--outputjson", "--project", str(ROOT / "pyproject.toml"),
                          "--pythonpath", sys.executable], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout)
    errors = [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
              for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert report["summary"]["filesAnalyzed"] > 100
    assert not errors, "\n".join(errors[:40])
