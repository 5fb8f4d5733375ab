"""The interleaved benchmarks' order of calls (:func:`bench.harness.round_order`)."""

from __future__ import annotations

import itertools

import pytest

from bench.harness import round_order


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_no_engine_runs_twice_in_a_row(n: int) -> None:
    """Within a round and across rounds' boundaries: a second call in a row would find its own caches (and its
    pool's workers still spinning)."""
    engines = [f"e{i}" for i in range(n)]
    calls = [e for k in range(4 * n + 3) for e in round_order(engines, k)]
    assert all(a != b for a, b in itertools.pairwise(calls)), calls


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_round_calls_each_engine_once(n: int) -> None:
    engines = list(range(n))
    for k in range(3 * n):
        assert sorted(round_order(engines, k)) == engines


@pytest.mark.parametrize("n", [3, 4])
def test_three_or_more_take_turns_going_first(n: int) -> None:
    engines = list(range(n))
    firsts = [round_order(engines, k)[0] for k in range(2 * n)]
    assert all(firsts.count(e) == 2 for e in engines), firsts


def test_the_harness_and_the_tools_share_it() -> None:
    """bench_model, interleaved_medians and the step profiles all take their order from it: with two engines,
    strict alternation."""
    from bench.harness import interleaved_medians

    seen: list[str] = []
    interleaved_medians([("a", lambda: seen.append("a")), ("b", lambda: seen.append("b"))], 5)
    assert seen == ["a", "b"] * 5
