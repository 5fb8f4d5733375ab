"""The hostile-input campaign: every case runs ``cuvil`` in its own process with a time limit and
must end in a result or a coded error with the documented exit code: no traceback, no signal,
no hang, no file written outside the case's folder."""

from __future__ import annotations

import collections

import pytest

from tests.hostile.campaign import all_cases
from tests.hostile.runner import run_case

CASES = all_cases()


def test_the_campaign_covers_every_group():
    groups = collections.Counter(c.name.split("/")[0] for c in CASES)
    assert len(CASES) >= 300
    assert set(groups) == {"malformed", "names", "shapes", "artifact", "cli"}
    assert min(groups.values()) >= 30, groups
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(case, tmp_path):
    folder = tmp_path / "case"
    folder.mkdir()
    argv = case.setup(folder)
    outcome = run_case(argv, folder, limit=case.limit, close_stdout=case.close_stdout, watch=tmp_path)
    assert outcome.category in case.expect, f"{outcome.category}: {outcome.stderr[-3000:]}"
    assert not outcome.stray_files, outcome.stray_files
    if outcome.category == "coded error":
        first = outcome.stderr.strip().splitlines()[0] if outcome.stderr.strip() else ""
        assert first.startswith("error[CUVIL-") and "CUVIL-000" not in first, outcome.stderr
        assert "hint:" in outcome.stderr, outcome.stderr
    if case.check is not None:
        case.check(folder, outcome)
