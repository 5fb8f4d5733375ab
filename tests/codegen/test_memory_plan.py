"""The code generator's memory plan: an arena value never shares bytes with a value live at the
same time, a result never shares memory with its operands (the kernels' ``noalias``), results
go straight to the caller's buffers, and the arena is reused by liveness."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen.abi import ARENA_ALIGN
from cuvil.codegen.plan import MemoryPlan, nbytes, plan_memory
from cuvil.ir import Builder, DType
from cuvil.ir.module import Function


def _chain(length: int) -> Function:
    b = Builder()
    x = b.param("x", DType.f32, [4, 8])
    v = x
    for k in range(length):
        v = b.relu(v) if k % 2 else b.neg(v)
    return b.function("main", [x], [v])


def _random_dag(seed: int) -> Function:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [4, 4])
    pool = [x]
    for _ in range(25):
        a, c = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
        step = int(rng.integers(3))
        pool.append(b.add(a, c) if step == 0 else b.tanh(a) if step == 1 else b.mul(a, b.exp(c)))
    return b.function("main", [x], [pool[-1], pool[-5]])


def check_plan(fn: Function, plan: MemoryPlan) -> None:
    """The invariants every plan must keep, checked from the plan alone."""
    pos = {v: k for k, v in enumerate(plan.steps)}
    last = {v: pos[v] for v in plan.steps}
    for k, v in enumerate(plan.steps):
        for o in v.operands:
            last[o] = max(last.get(o, k), k)
    arena = [v for v in plan.steps if plan.slots[v].kind == "arena"]
    for v in arena:
        off = plan.slots[v].index
        assert off % ARENA_ALIGN == 0 and off + nbytes(v.type) <= plan.arena_bytes
    for i, a in enumerate(arena):
        for b in arena[i + 1:]:
            live_together = pos[a] <= last[b] and pos[b] <= last[a]
            oa, ob = plan.slots[a].index, plan.slots[b].index
            overlap = oa < ob + nbytes(b.type) and ob < oa + nbytes(a.type)
            assert not (live_together and overlap), f"{a} and {b} are live together in overlapping bytes"
    for v in plan.steps:
        for o in v.operands:
            assert plan.slots[o] != plan.slots[v] or plan.slots[v].kind == "const", f"{v} overwrites its operand"
    written = {plan.slots[v].index for v in plan.steps if plan.slots[v].kind == "output"}
    copied = {r for _, r in plan.copies}
    assert written | copied == set(range(len(fn.results))) and not written & copied


def test_a_chain_ping_pongs_between_two_buffers():
    fn = _chain(6)
    plan = plan_memory(fn)
    check_plan(fn, plan)
    arena = [v for v in plan.steps if plan.slots[v].kind == "arena"]
    assert len(arena) == 5  # the last op writes the caller's output
    assert len({plan.slots[v].index for v in arena}) == 2
    assert plan.arena_bytes == 2 * 4 * 8 * 4
    assert plan.slots[plan.steps[-1]].kind == "output"


def test_a_value_live_across_others_keeps_its_bytes():
    b = Builder()
    x = b.param("x", DType.f32, [16])
    a = b.neg(x)
    big = b.exp(b.concat(a, a, a, a, axis=0))
    c = b.relu(a)  # a is still live here
    out = b.add(b.reduce_sum(b.reshape(big, shape=[4, 16]), axes=[0]), b.mul(c, a))
    fn = b.function("main", [x], [out])
    plan = plan_memory(fn)
    check_plan(fn, plan)
    assert plan.slots[a].index != plan.slots[c].index


def test_results_that_are_inputs_or_repeated_are_copied():
    b = Builder()
    x = b.param("x", DType.f32, [3])
    y = b.neg(x)
    fn = b.function("main", [x], [y, x, y])
    plan = plan_memory(fn)
    check_plan(fn, plan)
    assert plan.slots[y].kind == "output" and plan.slots[y].index == 0
    assert sorted(r for _, r in plan.copies) == [1, 2]


@pytest.mark.parametrize("seed", range(6))
def test_random_dags_plan_soundly(seed):
    fn = _random_dag(seed)
    plan = plan_memory(fn)
    check_plan(fn, plan)
    naive = sum(-(-nbytes(v.type) // ARENA_ALIGN) * ARENA_ALIGN for v in plan.steps
                if plan.slots[v].kind == "arena")
    assert plan.arena_bytes <= naive


def test_check_plan_catches_a_conflict():
    fn = _chain(6)
    plan = plan_memory(fn)
    arena = [v for v in plan.steps if plan.slots[v].kind == "arena"]
    plan.slots[arena[1]] = plan.slots[arena[0]]  # neighbours are live at the same time
    with pytest.raises(AssertionError):
        check_plan(fn, plan)
