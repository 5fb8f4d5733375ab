"""ONNX's node conformance cases compiled with the LLVM backend (``cuvil.compile``) and run natively.

Each case must match ONNX's expected outputs with the case's own tolerances, and agree with the
interpreter on the same module (integers and bools exactly, floats within the dtype's relative
tolerance). The default suite runs one case per ONNX op type; the whole suite is slow.

The slow suite runs every case again compiled for aarch64 (under qemu-aarch64) and for wasm32-wasi
(by wasmtime).

Expected failures are the interpreter's list (``expected_failures.txt``) plus the cases that fail
only when compiled (``expected_failures_compiled.txt``, with reasons; regenerate with
``python -m bench.onnx_conformance --mode compiled --write-expected-failures``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from case_params import case_params

from bench.onnx_conformance import (
    DEFAULT_COMPILE_OPTIONS,
    EXPECTED_COMPILED_FAILURES,
    EXPECTED_FAILURES,
    expected_failures_for,
    load_cases,
    read_expected_failures,
    run_case,
)
from tests.cross_targets import AARCH64, WASM32, needs_aarch64, needs_wasm

# a compile plus two runs; the largest cases (recurrent attention, 3-d grid sampling) take a few seconds
CASE_TIME_LIMIT_S = 60.0

_CASES = {c.name: c for c in load_cases()}
_EXPECTED = expected_failures_for("compiled")


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compile into a cache of this run's own (the user's cache is left alone)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def op_types(case: Any) -> set[str]:
    """The ONNX op types a case's graph uses (``domain::Op`` outside the default domain)."""
    return {f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
            for n in case.model.graph.node}


def representative_cases() -> list[str]:
    """One case per op type: for each op type (sorted), the smallest graph (fewest nodes, then name)
    that uses it among the cases expected to pass; a case covering several op types counts for all."""
    runnable = sorted((c for n, c in _CASES.items() if n not in _EXPECTED),
                      key=lambda c: (len(c.model.graph.node), c.name))
    covered: set[str] = set()
    chosen: list[str] = []
    for op in sorted(set().union(*(op_types(c) for c in _CASES.values()))):
        if op in covered:
            continue
        found = next((c for c in runnable if op in op_types(c)), None)
        if found is not None:
            chosen.append(found.name)
            covered |= op_types(found)
    return sorted(chosen)


def _check(name: str, target: str | None = None) -> None:
    options = {**DEFAULT_COMPILE_OPTIONS, **({"target": target} if target else {})}
    outcome = run_case(_CASES[name], timeout=CASE_TIME_LIMIT_S, mode="compiled", compile_options=options)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status == "passed", f"{name}: {outcome.reason}"
    assert not outcome.mismatch, f"{name}: compiled outputs differ from the interpreter's: {outcome.mismatch}"


@pytest.mark.parametrize("name", case_params(representative_cases(), _EXPECTED))
def test_compiled_case_per_op_type(name: str) -> None:
    _check(name)


# every case compiled (about 1880 compiles): several minutes on two cores
@pytest.mark.slow
@pytest.mark.parametrize("name", case_params(sorted(_CASES), _EXPECTED))
def test_compiled_case(name: str) -> None:
    _check(name)


# every case compiled for aarch64 (run under qemu-aarch64) and for wasm32-wasi (run by wasmtime), against
# the same expected failures: the same per-case outcomes as on x86-64 (1799 passed, 85 failed, no
# interpreter mismatch, when last measured)
@pytest.mark.slow
@pytest.mark.parametrize("target", [pytest.param(AARCH64, id="aarch64", marks=needs_aarch64),
                                    pytest.param(WASM32, id="wasm32", marks=needs_wasm)])
@pytest.mark.parametrize("name", case_params(sorted(_CASES), _EXPECTED))
def test_compiled_case_on_another_target(name: str, target: str) -> None:
    _check(name, target)


def test_representative_cases_cover_every_op_type_that_can_pass() -> None:
    chosen = set().union(*(op_types(_CASES[n]) for n in representative_cases()))
    passable = set().union(*(op_types(c) for n, c in _CASES.items() if n not in _EXPECTED))
    assert passable <= chosen


def test_compiled_expected_failures_name_real_cases_and_give_reasons() -> None:
    compiled = read_expected_failures(EXPECTED_COMPILED_FAILURES)
    unknown = sorted(set(compiled) - set(_CASES))
    assert not unknown, f"{EXPECTED_COMPILED_FAILURES.name} lists cases ONNX no longer has: {unknown[:10]}"
    assert all(compiled.values()), "every compiled-only expected failure needs a reason"
    both = sorted(set(compiled) & set(read_expected_failures(EXPECTED_FAILURES)))
    assert not both, f"cases in both lists (the compiled list holds compiled-only failures): {both[:10]}"
