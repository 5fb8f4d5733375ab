"""``max`` and ``min`` are defined once: a NaN in either operand propagates (the first's when both are), and a
tie gives the second operand, signed zeros included (``max(+0, -0)`` is -0). The interpreter's primitive and
reductions, the ops' numpy fast paths and the compiled library (its tuned kernels and the generic lowering) all
follow it, on every float type. numpy's own float16 loops break a tie the other way, so the interpreter does not
lean on them: before, a float16 max pool's interpreted result kept the first of two tied zeros where the
compiled one kept the second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import maximum, minimum, sequential_reduce
from tests.oracles import rule_reference

FLOATS = [DType.f16, DType.bf16, DType.f32, DType.f64]


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.view(f"u{x.dtype.itemsize}")


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_the_primitive_keeps_the_second_of_a_tie_and_the_first_nan(dt: DType) -> None:
    a = np.array([0.0, -0.0, np.nan, 1.0, np.nan, 2.0], np.float64).astype(dt.np)
    b = np.array([-0.0, 0.0, 1.0, np.nan, -np.nan, 2.0], np.float64).astype(dt.np)
    for fn in (maximum, minimum):
        got = fn(a, b)
        assert got.dtype == dt.np
        assert list(np.signbit(got[:2])) == [True, False], fn.__name__  # the second zero
        assert _bits(got[2:3]) == _bits(a[2:3]) and _bits(got[4:5]) == _bits(a[4:5])  # the first NaN
        assert np.isnan(got[3]) and got[5] == b[5]
    assert maximum(np.array([1.5], np.float16), 2).dtype == np.float16  # a Python scalar takes the array's type


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["max", "min"])
def test_the_reduction_is_the_left_fold_of_the_primitive(dt: DType, kind: str) -> None:
    """Rows of signed zeros, NaNs of two signs, infinities and numbers: the vectorized reduction gives the
    bits of the fold ``((x0 op x1) op x2) ...``."""
    rng = np.random.default_rng(5)
    pool = np.array([0.0, -0.0, 0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, -1.5], np.float64)
    rows = rng.choice(pool, size=(200, 7)).astype(dt.np)
    op = maximum if kind == "max" else minimum
    want = rows[:, 0]
    for j in range(1, rows.shape[1]):
        want = op(want, rows[:, j])
    got = sequential_reduce(kind, rows, 1)
    assert got.dtype == dt.np and np.array_equal(_bits(got), _bits(want))


def _hostile(dt: DType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    pool = np.array([0.0, -0.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -2.0], np.float64)
    return rng.choice(pool, size=shape).astype(dt.np)


OPS: dict[str, Callable[[Builder, DType], tuple[list[Any], Any]]] = {
    "max": lambda b, dt: _two(b, dt, "max"),
    "min": lambda b, dt: _two(b, dt, "min"),
    "relu": lambda b, dt: _one(b, dt, lambda x: b.relu(x)),
    "clip": lambda b, dt: _one(b, dt, lambda x: b.clip(x, min=0.0, max=0.0)),
    "max_pool": lambda b, dt: _one(b, dt, lambda x: b.max_pool(x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    "reduce_max": lambda b, dt: _one(b, dt, lambda x: b.reduce_max(x, axes=(2, 3))),
}


def _one(b: Builder, dt: DType, op: Callable[[Any], Any]) -> tuple[list[Any], Any]:
    x = b.param("x", dt, [1, 4, 9, 10])
    return [x], op(x)


def _two(b: Builder, dt: DType, name: str) -> tuple[list[Any], Any]:
    x, y = b.param("x", dt, [4, 33]), b.param("y", dt, [4, 33])
    return [x, y], getattr(b, name)(x, y)


@pytest.mark.parametrize("dt", [DType.f16, DType.bf16, DType.f32], ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_reader_breaks_ties_alike(name: str, dt: DType) -> None:
    """The op's rule, its numpy fast path, the compiled library and the generic lowering: the same bits."""
    b = Builder()
    params, y = OPS[name](b, dt)
    module = b.module(b.function("main", params, [y]))
    rng = np.random.default_rng(len(name))
    args = [_hostile(dt, tuple(int(d) for d in p.shape), rng) for p in params]
    (want,) = rule_reference(module, args)
    (fast,) = run_reference(module, args)
    got = np.asarray(compile(module, cache=False)(*args))
    with kernels.generic_only():
        slow = np.asarray(compile(module, cache=False)(*args))
    for other, who in ((fast, "fast path"), (got, "library"), (slow, "generic lowering")):
        assert other.dtype == want.dtype and np.array_equal(_bits(other), _bits(want)), who


def test_scatter_max_applies_its_updates_in_order_with_the_rules_max() -> None:
    """Repeated targets of a float16 scatter with ``max``: the updates fold in order, a tie keeping the later
    zero, as the rule and the compiled library do."""
    b = Builder()
    x = b.param("x", DType.f16, [2, 3])
    upd = b.param("u", DType.f16, [2, 3])
    ind = b.const(np.array([[1, 1, 0], [1, 1, 2]], np.int64))
    module = b.module(b.function("main", [x, upd], [b.scatter_elements(x, ind, upd, axis=1, reduction="max")]))
    xs = np.array([[0.0, -0.0, 0.0], [-0.0, 0.0, np.nan]], np.float16)
    us = np.array([[-0.0, 0.0, -0.0], [0.0, -0.0, 1.0]], np.float16)
    (want,) = rule_reference(module, [xs, us])
    (fast,) = run_reference(module, [xs, us])
    got = np.asarray(compile(module, cache=False)(xs, us))
    assert np.array_equal(_bits(fast), _bits(want)) and np.array_equal(_bits(got), _bits(want))
    assert np.signbit(want[0, 1]) == np.signbit(np.float16(0.0))  # -0 then max(-0, -0 -> +0): the later, +0
