"""The ``loop`` op: one meaning (its body iterated), read by the interpreter, printed and parsed back,
and lowered to a real loop whose results equal the interpreter's at every trip count, zero included."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.errors import BudgetError, CuvilError, UnsupportedOpError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.ops.control import INDEX
from cuvil.ir.parser import parse_module
from cuvil.ir.region import Region, close_body
from cuvil.ir.specialize import specialize_dims
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.unroll import unroll_module
from cuvil.ir.values import Value, param, walk

ROW = TensorType(DType.f32, (4,))


def _loop(b: Builder, operands: list[Value], body: Region, results: int, **attrs: object) -> list[Value]:
    return [b.loop(*operands, body=body, output=k, **attrs) for k in range(results)]


def _swap_and_scan(trips: object = "T", reverse: bool = False) -> Module:
    """State (a, c) -> (c * w + x_t, a): the body yields its state in the other order, so a lowering
    that updates the state in place reads a value it has already overwritten. Scan output: relu(a)."""
    b = Builder()
    a0, c0 = b.param("a", DType.f32, [4]), b.param("c", DType.f32, [4])
    xs = b.param("xs", DType.f32, [trips, 4])
    w = b.const(np.linspace(-1.0, 1.5, 4).astype(np.float32))
    t, a, c, x = (param(f"%t.{n}", ty) for n, ty in (("t", INDEX), ("a", ROW), ("c", ROW), ("x", ROW)))
    body, captured = close_body([t, a, c, x], [b.add(b.mul(c, w), x), a, b.relu(a)])
    outs = _loop(b, [a0, c0, xs, *captured], body, 3, carried=2, scanned=1, trips=[trips], reverse=reverse)
    return b.module(b.function("main", [a0, c0, xs], outs, constraints=[DimConstraint("T", lo=0)]))


def _recurrence(a: np.ndarray, c: np.ndarray, xs: np.ndarray, reverse: bool) -> list[np.ndarray]:
    w = np.linspace(-1.0, 1.5, 4).astype(np.float32)
    ys = np.empty_like(xs)
    for t in (reversed(range(len(xs))) if reverse else range(len(xs))):
        ys[t] = np.maximum(a, 0)
        a, c = c * w + xs[t], a
    return [a, c, ys]


@pytest.mark.parametrize("reverse", [False, True])
def test_the_interpreter_iterates_the_body_like_the_recurrence_it_writes(reverse: bool) -> None:
    rng = np.random.default_rng(0)
    mod = _swap_and_scan(reverse=reverse)
    for trips in (0, 1, 2, 5):
        a, c = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        xs = rng.standard_normal((trips, 4)).astype(np.float32)
        got = run_reference(mod, [a, c, xs])
        for g, w in zip(got, _recurrence(a, c, xs, reverse), strict=True):
            np.testing.assert_array_equal(g, w)


def test_a_loop_prints_and_parses_back_to_the_same_module() -> None:
    mod = _swap_and_scan(reverse=True)
    text = str(mod)
    assert "yield" in text and "loop(" in text
    again = parse_module(text)
    assert again == mod and str(again) == text


def test_close_body_captures_what_the_body_reads_from_outside_as_invariants() -> None:
    mod = _swap_and_scan()
    loop = mod.main.results[0]
    body = loop.attr("body")
    assert not any(v.is_const for v in walk(body.results)), "a body never refers to constants"
    assert loop.operands[-1].is_const, "the weight entered as an invariant operand"
    assert len(body.params) == 1 + len(loop.operands)


@pytest.mark.parametrize("bad, message", [
    ({"carried": 3}, "3 carried and 1 scanned operands of 3"),
    ({"trips": [5]}, "trip count"),
    ({"output": 7}, "output"),
])
def test_a_malformed_loop_is_refused_with_the_reason(bad: dict, message: str) -> None:
    b = Builder()
    a0, c0 = b.param("a", DType.f32, [4]), b.param("c", DType.f32, [4])
    xs = b.param("xs", DType.f32, ["T", 4])
    t, a, c, x = (param(f"%m.{n}", ty) for n, ty in (("t", INDEX), ("a", ROW), ("c", ROW), ("x", ROW)))
    body, captured = close_body([t, a, c, x], [b.add(c, x), a])
    attrs = {"carried": 2, "scanned": 1, "trips": ["T"], "output": 0, **bad}
    with pytest.raises(CuvilError, match=message):
        b.loop(a0, c0, xs, *captured, body=body, **attrs)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_compiled_loop_equals_the_interpreter_bit_for_bit_at_every_trip_count(reverse: bool) -> None:
    rng = np.random.default_rng(1)
    compiled = cuvil.compile(_swap_and_scan(reverse=reverse), cache=False)
    mod = _swap_and_scan(reverse=reverse)
    for trips in (0, 1, 3, 8):
        a, c = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        xs = rng.standard_normal((trips, 4)).astype(np.float32)
        got = compiled(a, c, xs)
        for g, w in zip(got, run_reference(mod, [a, c, xs]), strict=True):
            np.testing.assert_array_equal(g, w)


def test_only_the_results_a_function_reads_are_written() -> None:
    """A function that returns only the scan output still runs the whole recurrence."""
    full = _swap_and_scan()
    fn = full.main
    mod = Module((Builder().function("main", list(fn.params), [fn.results[2]]),), full.constants)
    rng = np.random.default_rng(2)
    a, c = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    xs = rng.standard_normal((6, 4)).astype(np.float32)
    got = cuvil.compile(mod, cache=False)(a, c, xs)
    np.testing.assert_array_equal(got, _recurrence(a, c, xs, False)[2])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("trips", [0, 1, 4])
def test_unrolling_computes_what_the_loop_does_bit_for_bit(reverse: bool, trips: int) -> None:
    mod = specialize_module(_swap_and_scan(reverse=reverse), {"T": trips})
    flat = unroll_module(mod)
    assert not any(v.op == "loop" for v in flat.main.values())
    rng = np.random.default_rng(trips)
    a, c = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    xs = rng.standard_normal((trips, 4)).astype(np.float32)
    for g, w in zip(run_reference(flat, [a, c, xs]), run_reference(mod, [a, c, xs]), strict=True):
        np.testing.assert_array_equal(g, w)
    assert unroll_module(mod) == flat, "unrolling is deterministic: the same values every time"


def test_unrolling_refuses_a_symbolic_trip_count_and_a_blown_budget() -> None:
    with pytest.raises(UnsupportedOpError, match="T iterations"):
        unroll_module(_swap_and_scan())
    with pytest.raises(BudgetError, match="more than 10 ops"):
        unroll_module(specialize_module(_swap_and_scan(), {"T": 9}), budget=10)


def specialize_module(mod: Module, env: dict[str, int]) -> Module:
    return mod.replace(functions=[specialize_dims(mod.main, env)])


def _endless(trips: int) -> Module:
    """A loop of ``trips`` iterations over a small state, under two negations a pass may remove."""
    b = Builder()
    h0 = b.param("h0", DType.f32, [4])
    t, h = param("%e.t", INDEX), param("%e.h", ROW)
    body, captured = close_body([t, h], [b.add(b.mul(h, b.const(np.full(4, 0.5, np.float32))), b.relu(h))])
    y = b.loop(h0, *captured, body=body, carried=1, trips=[trips])
    return b.module(b.function("main", [h0], [b.neg(b.neg(y))]))


def test_a_loop_too_long_to_interpret_is_refused_and_the_verifier_still_decides() -> None:
    """10**10 iterations: the interpreter refuses (CUVIL-BUDGET) at once instead of running for hours,
    and checking a pass on the model does not wait for it."""
    import time

    from cuvil.passes.canonicalize import Canonicalize
    from verify import check_pass

    mod = _endless(10**10)
    with pytest.raises(BudgetError, match="10000000000 iterations"):
        run_reference(mod, [np.ones(4, np.float32)])
    start = time.perf_counter()
    summary = check_pass(Canonicalize(), mod).certificate()["summary"]
    assert time.perf_counter() - start < 60
    assert summary["refuted"] == 0 and summary["proved"] + summary["unknown"] == summary["obligations"]


def test_the_interpreter_does_not_answer_new_operand_values_from_its_last_run() -> None:
    """The results of one loop share a run; the same arrays refilled with other values are a new run."""
    from cuvil.interp import evaluate_op
    from cuvil.ir.opdef import get_op

    op = get_op("loop")
    arrays, attrs = op.examples(np.random.default_rng(0))[0]
    full = op.check_attrs(attrs)
    out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
    first = evaluate_op(op, arrays, full, out_type)
    arrays[1][:] = 3.0  # the scanned operand: the same object, other values
    second = evaluate_op(op, arrays, full, out_type)
    fresh = evaluate_op(op, [np.array(a, copy=True) for a in arrays], full, out_type)
    np.testing.assert_array_equal(second, fresh)
    assert not np.array_equal(first, second)
