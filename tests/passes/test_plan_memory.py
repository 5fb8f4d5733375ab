"""plan-memory: buffers are shared only by values whose lifetimes do not overlap, reshapes
are views, symbolic sizes use constraint bounds or dynamic pools, and no value changes."""

import json

import numpy as np
import pytest
from pass_testing import assert_same_results

from cuvil.ir import Builder, DType
from cuvil.ir.symbolic import sym
from cuvil.ir.types import DimConstraint
from cuvil.passes.plan_memory import METADATA_KEY, PlanMemory, check_plan, plan_function


def _plan(m):
    return json.loads(m.metadata[METADATA_KEY])["functions"]["main"]


def _chain(length: int = 6):
    b = Builder()
    x = b.param("x", DType.f32, [4, 8])
    v = x
    for k in range(length):
        v = b.relu(v) if k % 2 else b.neg(v)
    return b.module(b.function("main", [x], [v]))


def test_chain_reuses_two_buffers():
    before = _chain(6)
    res = PlanMemory().run(before)
    assert res.changed
    plan = _plan(res.module)
    check_plan(plan)
    arena = [e for e in plan["values"] if e["storage"] == "arena"]
    assert len(arena) == 5  # the last op writes the output
    assert len({e["buffer"] for e in arena}) == 2  # ping-pong
    assert plan["arena_bytes"] == 2 * 128 and plan["naive_bytes"] == 5 * 128
    assert plan["values"][0]["storage"] == "input" and plan["values"][-1]["storage"] == "output"


def test_values_are_unchanged():
    before = _chain(4)
    after = PlanMemory().run(before).module
    assert after.functions == before.functions
    assert_same_results(before, after)


def test_overlapping_lifetimes_never_share():
    b = Builder()
    x = b.param("x", DType.f32, [16])
    a = b.neg(x)
    big = b.reshape(b.exp(b.concat(a, a, a, a, axis=0)), shape=[8, 8])  # 64 elements
    c = b.relu(a)  # a is still live here
    out = b.add(b.reduce_sum(big, axes=[0]), b.reshape(b.mul(c, a), shape=[2, 8]))
    before = b.module(b.function("main", [x], [out]))
    plan = plan_function(before.main)
    check_plan(plan)
    by_index = {e["index"]: e for e in plan["values"]}
    order = {v: k for k, v in enumerate(before.main.values())}
    assert by_index[order[a]]["buffer"] != by_index[order[c]]["buffer"]


def test_reshape_is_a_view_of_its_operand():
    b = Builder()
    x = b.param("x", DType.f32, [4, 6])
    e = b.exp(x)
    r = b.reshape(e, shape=[24])
    out = b.reduce_sum(b.neg(r), axes=[0])
    before = b.module(b.function("main", [x], [out]))
    plan = plan_function(before.main)
    check_plan(plan)
    order = {v: k for k, v in enumerate(before.main.values())}
    entry = next(e for e in plan["values"] if e["index"] == order[r])
    assert entry["alias_of"] == order[e]
    assert entry["buffer"] == next(e2 for e2 in plan["values"] if e2["index"] == order[e])["buffer"]
    # the view keeps its base alive: the base buffer is not reused by neg, which reads the view
    neg = next(e2 for e2 in plan["values"] if e2["op"] == "neg")
    assert neg["buffer"] != entry["buffer"]
    copied = plan_function(before.main, alias_reshapes=False)
    check_plan(copied)
    assert next(e2 for e2 in copied["values"] if e2["index"] == order[r])["alias_of"] is None


def test_symbolic_dims_bounded_by_constraints_plan_statically():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 8])
    out = b.relu(b.exp(b.neg(x)))
    fn = b.function("main", [x], [out], constraints=[DimConstraint("N", 1, 32)])
    plan = plan_function(fn)
    check_plan(plan)
    assert all(e["storage"] != "dynamic" for e in plan["values"])
    assert plan["arena_bytes"] == 2 * 32 * 8 * 4


def test_unbounded_symbols_use_dynamic_pools_shared_by_equal_sizes():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 8])
    out = b.relu(b.exp(b.neg(b.abs(x))))
    plan = plan_function(b.function("main", [x], [out]))
    check_plan(plan)
    dyn = [e for e in plan["values"] if e["storage"] == "dynamic"]
    assert len(dyn) == 3 and len({e["buffer"] for e in dyn}) == 2
    assert plan["arena_bytes"] == 0
    assert all(isinstance(buf["size"], str) and "N" in buf["size"] for buf in plan["buffers"])


def test_check_plan_catches_a_conflict():
    plan = plan_function(_chain(6).main)
    arena = [e for e in plan["values"] if e["storage"] == "arena"]
    arena[1]["buffer"] = arena[0]["buffer"]  # neighbours are live at the same time
    with pytest.raises(AssertionError):
        check_plan(plan)


@pytest.mark.parametrize("seed", range(5))
def test_random_dags_plan_soundly(seed):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [4, 4])
    pool = [x]
    for _ in range(25):
        a = pool[int(rng.integers(len(pool)))]
        c = pool[int(rng.integers(len(pool)))]
        pool.append(b.add(a, c) if rng.random() < 0.5 else b.tanh(a))
    fn = b.function("main", [x], [pool[-1], pool[-5]])
    plan = plan_function(fn)
    check_plan(plan)
    assert plan["arena_bytes"] <= plan["naive_bytes"]


def test_second_run_is_a_no_op():
    once = PlanMemory().run(_chain(4)).module
    assert PlanMemory().run(once).changed is False
