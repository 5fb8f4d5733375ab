"""The code generator's memory plan: an arena value never shares bytes with a value live at the
same time, a result never shares memory with its operands (the kernels' ``noalias``), results
go straight to the caller's buffers, and the arena is reused by liveness."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen.abi import ARENA_ALIGN
from cuvil.codegen.plan import MemoryPlan, nbytes, plan_memory
from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module


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
    """The invariants every plan must keep, checked from the plan alone. A view (a reshape that runs
    no kernel) is its owner's memory: the owner stays live until the view's last reader."""
    def owner(v):
        return plan.views.get(v, v)

    pos = {v: k for k, v in enumerate(plan.steps)}
    last = {v: pos[v] for v in plan.steps}
    for k, v in enumerate(plan.steps):
        for o in v.operands:
            last[owner(o)] = max(last.get(owner(o), k), k)
    for v, root in plan.views.items():
        assert v.op == "reshape" and plan.slots[v] == plan.slots[root], f"{v} is not its owner's memory"
        assert plan.slots[root].kind in ("arena", "input") and root not in plan.views
    arena = [v for v in plan.steps if plan.slots[v].kind == "arena" and v not in plan.views]
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
        if v in plan.views:
            continue
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


def _dag_with_reshapes(seed: int) -> Module:
    """Elementwise ops over [4, 4] values and reshapes between them (chains of them too, of the input,
    and as results), read long after their operand's last direct reader."""
    rng = np.random.default_rng(100 + seed)
    b = Builder()
    x = b.param("x", DType.f32, [4, 4])
    pool = [x, b.reshape(b.reshape(x, shape=[16]), shape=[4, 4])]
    for _ in range(30):
        a, c = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
        step = int(rng.integers(4))
        if step == 3:
            pool.append(b.reshape(b.reshape(a, shape=[2, 8]), shape=[4, 4]))
        else:
            pool.append(b.add(a, c) if step == 0 else b.tanh(a) if step == 1 else b.mul(a, b.exp(c)))
    return b.module(b.function("main", [x], [pool[-1], b.reshape(pool[-3], shape=[16]), pool[5]]))


@pytest.mark.parametrize("seed", range(8))
def test_views_share_memory_and_keep_it_live(seed):
    fn = _dag_with_reshapes(seed).main
    plan = plan_memory(fn, views=True)
    check_plan(fn, plan)
    assert plan.views, "no reshape became a view"
    assert all(plan.slots[r].kind != "arena" or r not in plan.views for r in fn.results)
    plain = plan_memory(fn)
    check_plan(fn, plain)
    assert not plain.views and plan.arena_bytes <= plain.arena_bytes


@pytest.mark.parametrize("seed", range(3))
def test_views_compile_to_the_interpreters_values(seed):
    from cuvil.compiler import compile
    from cuvil.interp import run_reference

    module = _dag_with_reshapes(seed)
    x = np.random.default_rng(seed).standard_normal((4, 4)).astype(np.float32) * 0.5
    model = compile(module, cache=False, passes="O0")
    assert "view" in model.manifest["kernels"]
    for got, want in zip(model.run([x]), run_reference(module, [x]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_check_plan_catches_a_view_released_early():
    b = Builder()
    x = b.param("x", DType.f32, [8])
    a = b.neg(x)
    view = b.reshape(a, shape=[2, 4])
    c = b.exp(x)  # allocated while the view is live: must not take a's bytes
    out = b.add(b.reshape(c, shape=[2, 4]), view)
    fn = b.function("main", [x], [out])
    plan = plan_memory(fn, views=True)
    check_plan(fn, plan)
    assert plan.views[view] is a and plan.slots[c] != plan.slots[a]
    plan.slots[c] = plan.slots[a]
    with pytest.raises(AssertionError):
        check_plan(fn, plan)
