"""ONNX's node conformance cases, each run through ``cuvil.onnx_backend`` with the case's own tolerances.

Cases listed in ``expected_failures.txt`` (regenerate with
``python -m bench.onnx_conformance --write-expected-failures``) are expected failures;
every other case must pass.
"""

from __future__ import annotations

import pytest
from case_params import case_params

from bench.onnx_conformance import load_cases, read_expected_failures, run_case

# generous for the interpreter, but no case may stall the suite
CASE_TIME_LIMIT_S = 20.0

_CASES = {c.name: c for c in load_cases()}
_EXPECTED = read_expected_failures()


@pytest.mark.parametrize("name", case_params(_CASES, _EXPECTED))
def test_onnx_node_case(name: str) -> None:
    outcome = run_case(_CASES[name], timeout=CASE_TIME_LIMIT_S)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status == "passed", f"{name}: {outcome.reason}"


def test_expected_failures_name_real_cases() -> None:
    unknown = sorted(set(_EXPECTED) - set(_CASES))
    assert not unknown, f"expected_failures.txt lists cases ONNX no longer has: {unknown[:10]}"
