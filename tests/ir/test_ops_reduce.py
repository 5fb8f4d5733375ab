"""Reductions, arg-reductions, cumsum/cumprod and topk against PyTorch (and plain numpy formulas where torch
has no counterpart). Each case runs through the fast path and through the compute rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from cuvil.errors import ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from tests.ir.op_testing import run_op, t


def check(name: str, arrays: list[np.ndarray], expected: np.ndarray, exact: bool = False, **attrs: Any) -> None:
    fast, rule = run_op(name, arrays, **attrs)
    for what, got in (("fast path", fast), ("rule", rule)):
        assert got.shape == expected.shape, f"{name} {what} {attrs}: shape {got.shape} != {expected.shape}"
        assert got.dtype == expected.dtype, f"{name} {what} {attrs}: dtype {got.dtype} != {expected.dtype}"
        if exact:
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} {what} {attrs}")
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=f"{name} {what} {attrs}")


RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)

_TORCH_REDUCE = {
    "reduce_sum": lambda x, dims, keep: torch.sum(x, dims, keepdim=keep),
    "reduce_mean": lambda x, dims, keep: torch.mean(x, dims, keepdim=keep),
    "reduce_max": lambda x, dims, keep: torch.amax(x, dims, keepdim=keep),
    "reduce_min": lambda x, dims, keep: torch.amin(x, dims, keepdim=keep),
    "reduce_prod": lambda x, dims, keep: _torch_prod(x, dims, keep),
}


def _torch_prod(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x = torch.prod(x, d, keepdim=keep)
    return x


@pytest.mark.parametrize("op", sorted(_TORCH_REDUCE))
@pytest.mark.parametrize("axes, keepdims", [((1,), False), ((0, 2), True), ((-1,), False), ((), False),
                                            ((), True), ((2, 0, 1), False)])
def test_reductions_match_torch(op, axes, keepdims):
    dims = axes or (0, 1, 2)
    expected = _TORCH_REDUCE[op](t(X), dims, keepdims).numpy()
    check(op, [X], expected, axes=axes, keepdims=keepdims)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_reductions(dtype):
    x = RNG.integers(-20, 20, (4, 6)).astype(dtype)
    check("reduce_sum", [x], x.sum(axis=1, dtype=dtype), exact=True, axes=[1])
    check("reduce_max", [x], x.max(axis=0), exact=True, axes=[0])
    check("reduce_min", [x], x.min(axis=1, keepdims=True), exact=True, axes=[1], keepdims=True)
    # integer mean truncates toward zero, like integer division
    expected = torch.div(t(x).sum(1), 6, rounding_mode="trunc").numpy().astype(dtype)
    check("reduce_mean", [x], expected, exact=True, axes=[1])


def test_empty_reductions_give_identities():
    x = np.zeros((2, 0, 3), dtype=np.float32)
    check("reduce_sum", [x], np.zeros((2, 3), np.float32), exact=True, axes=[1])
    check("reduce_prod", [x], np.ones((2, 1, 3), np.float32), exact=True, axes=[1], keepdims=True)
    check("reduce_max", [x], np.full((2, 3), -np.inf, np.float32), exact=True, axes=[1])
    check("reduce_min", [x], np.full((2, 3), np.inf, np.float32), exact=True, axes=[1])


def test_bool_max_min_are_any_all():
    x = RNG.standard_normal((3, 5)) > 0.8
    check("reduce_max", [x], np.asarray(x.any(axis=1)), exact=True, axes=[1])
    check("reduce_min", [x], np.asarray(x.all(axis=0)), exact=True, axes=[0])


def test_max_propagates_nan():
    x = X.copy()
    x[1, 2, 3] = np.nan
    fast, rule = run_op("reduce_max", [x], axes=[2])
    assert np.isnan(fast[1, 2]) and np.isnan(rule[1, 2])
    assert np.isfinite(np.delete(fast.reshape(-1), 1 * 4 + 2)).all()


def test_symbolic_reduce_mean():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [2, n])
    m = b.module(b.function("main", [x], [b.reduce_mean(x, axes=[1])]))
    for cols in (1, 7):
        xv = RNG.standard_normal((2, cols)).astype(np.float32)
        (out,) = run_reference(m, [xv])
        np.testing.assert_allclose(out, t(xv).mean(1).numpy(), rtol=1e-6)


# --------------------------------------------------------------------------------------
# argmax / argmin


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("axis, keepdims", [(0, True), (1, False), (-1, True)])
def test_arg_reductions_match_torch(op, axis, keepdims):
    fn = torch.argmax if op == "argmax" else torch.argmin
    check(op, [X], fn(t(X), axis, keepdim=keepdims).numpy(), exact=True, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reductions_break_ties_first_or_last(op):
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 0]], dtype=np.float32)
    pick = np.max if op == "argmax" else np.min
    hits = x == pick(x, axis=1, keepdims=True)
    first = np.array([np.flatnonzero(r)[0] for r in hits], dtype=np.int64)
    last = np.array([np.flatnonzero(r)[-1] for r in hits], dtype=np.int64)
    check(op, [x], first, exact=True, axis=1, keepdims=False)
    check(op, [x], last, exact=True, axis=1, keepdims=False, select_last_index=True)


def test_argmax_picks_nan_like_torch():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [0.0, 1.0, 2.0, 1.0]], dtype=np.float32)
    check("argmax", [x], torch.argmax(t(x), 1).numpy(), exact=True, axis=1, keepdims=False)


# --------------------------------------------------------------------------------------
# cumsum


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_matches_torch(axis):
    check("cumsum", [X], torch.cumsum(t(X), axis).numpy(), axis=axis)


def _scan(x: np.ndarray, reduce: Callable[..., np.ndarray], exclusive: bool, reverse: bool) -> np.ndarray:
    """A cumulative op along axis 1 spelled out: each output reduces the columns before it (after it when
    reversed), itself included unless exclusive."""
    n = x.shape[1]
    expected = np.zeros_like(x)
    for i in range(n):
        cols = [k for k in range(n) if (k > i if reverse else k < i) or (k == i and not exclusive)]
        expected[:, i] = reduce(x[:, cols], axis=1)
    return expected


@pytest.mark.parametrize("exclusive, reverse", [(True, False), (False, True), (True, True)])
def test_cumsum_exclusive_and_reverse(exclusive, reverse):
    x = RNG.integers(-9, 9, (3, 5)).astype(np.int64)
    check("cumsum", [x], _scan(x, np.sum, exclusive, reverse), exact=True, axis=1, exclusive=exclusive,
          reverse=reverse)


@pytest.mark.parametrize("axis", [0, -1])
def test_cumprod_matches_torch(axis):
    x = RNG.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    check("cumprod", [x], torch.cumprod(t(x), axis).numpy(), axis=axis)


@pytest.mark.parametrize("exclusive, reverse", [(True, False), (False, True), (True, True)])
def test_cumprod_exclusive_and_reverse(exclusive, reverse):
    x = RNG.integers(-3, 4, (3, 5)).astype(np.int64)
    check("cumprod", [x], _scan(x, np.prod, exclusive, reverse), exact=True, axis=1, exclusive=exclusive,
          reverse=reverse)


# --------------------------------------------------------------------------------------
# topk


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis, k", [(1, 2), (-1, 5), (0, 1)])
def test_topk_matches_torch_on_distinct_values(largest, axis, k):
    x = RNG.permutation(60).reshape(3, 4, 5).astype(np.float32)  # distinct: torch's order is defined
    values, indices = torch.topk(t(x), k, axis, largest=largest, sorted=True)
    check("topk", [x], values.numpy(), exact=True, k=k, axis=axis, largest=largest)
    check("topk", [x], indices.numpy(), exact=True, k=k, axis=axis, largest=largest, output="indices")


@pytest.mark.parametrize("largest", [True, False])
def test_topk_ties_take_the_lower_index(largest):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], dtype=np.int32)
    order = [sorted(range(6), key=lambda i, r=r: ((-r[i] if largest else r[i]), i)) for r in x.tolist()]
    indices = np.array([o[:4] for o in order], dtype=np.int64)
    check("topk", [x], indices, exact=True, k=4, axis=1, largest=largest, output="indices")
    check("topk", [x], np.take_along_axis(x, indices, 1), exact=True, k=4, axis=1, largest=largest)


def test_topk_handles_extreme_integers():
    x = np.array([[np.iinfo(np.int64).min, 5, np.iinfo(np.int64).max, -1]], dtype=np.int64)
    check("topk", [x], np.array([[np.iinfo(np.int64).max, 5]]), exact=True, k=2, axis=1)
    check("topk", [x], np.array([[np.iinfo(np.int64).min, -1]]), exact=True, k=2, axis=1, largest=False)


@pytest.mark.parametrize("name, attrs", [("topk", {"k": 6, "axis": 1}), ("cumsum", {"axis": 3}),
                                         ("argmax", {"axis": -4}), ("reduce_sum", {"axes": [5]})])
def test_out_of_range_attributes_are_shape_errors(name, attrs):
    b = Builder()
    with pytest.raises(ShapeError):
        b.op(name, b.param("x", DType.f32, [2, 5, 3]), **attrs)
