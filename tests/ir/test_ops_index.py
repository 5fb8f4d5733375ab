"""Indexing ops (gathers, scatters, embedding, one_hot, shape, iota, fill, trilu) against PyTorch and plain
python loops. Each case runs through the fast path and through the compute rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cuvil.errors import RuntimeEvalError, ShapeError
from cuvil.interp import evaluate_rule, run_reference
from cuvil.ir import Builder, DType, sym
from cuvil.ir.opdef import get_op
from tests.ir.op_testing import check, randn, run_op, t


def wrapped(ind: np.ndarray, dim: int) -> np.ndarray:
    return np.where(ind < 0, ind + dim, ind)


# --------------------------------------------------------------------------------------
# gathers


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_matches_torch_index_select(axis):
    x = randn(3, 4, 5)
    ind = np.array([[2, -1], [0, 1], [1, -2]])
    d = x.shape[axis]
    flat = torch.index_select(t(x), axis, t(wrapped(ind, d).reshape(-1)))
    shape = [*x.shape[:axis % 3], *ind.shape, *x.shape[axis % 3 + 1:]]
    check("gather", [x, ind], flat.numpy().reshape(shape), axis=axis)


def test_gather_scalar_index_drops_the_axis():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    check("gather", [x, np.array(-1, np.int32)], x[:, 3], axis=1)


@pytest.mark.parametrize("bad", [4, -5])
def test_gather_out_of_range_is_an_evaluation_error(bad):
    x = randn(4, 2)
    ind = np.array([0, bad])
    b = Builder()
    px, pi = b.param("x", DType.f32, [4, 2]), b.param("i", DType.i64, [2])
    m = b.module(b.function("main", [px, pi], [b.gather(px, pi, axis=0)]))
    with pytest.raises(RuntimeEvalError):
        run_reference(m, [x, ind])
    op = get_op("gather")
    with pytest.raises(RuntimeEvalError):
        evaluate_rule(op, [x, ind], op.check_attrs({"axis": 0}), m.main.results[0].type)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements_matches_torch_gather(axis):
    x = randn(4, 5)
    ind = np.random.default_rng(1).integers(-4, 4, (3, 2))
    expected = torch.gather(t(x), axis, t(wrapped(ind, x.shape[axis])))
    check("gather_elements", [x, ind], expected.numpy(), axis=axis)


def gather_nd_loop(x: np.ndarray, ind: np.ndarray, batch_dims: int) -> np.ndarray:
    b = batch_dims
    k = ind.shape[-1]
    out = np.empty(ind.shape[:-1] + x.shape[b + k:], x.dtype)
    for pos in itertools.product(*map(range, ind.shape[:-1])):
        idx = tuple(int(v) for v in ind[pos])
        out[pos] = x[pos[:b] + tuple(i % x.shape[b + j] for j, i in enumerate(idx))]
    return out


@pytest.mark.parametrize(("xs", "ind", "batch_dims"), [
    ((3, 4, 2), np.array([[2, -1], [0, 3], [1, 1]]), 0),
    ((3, 4, 2), np.array([[[1], [-3]], [[0], [2]]]), 0),
    ((2, 3, 4), np.array([[[1, 3], [0, 0]], [[2, -1], [1, 2]]]), 1),
    ((2, 3, 4), np.array([[2], [0]]), 1),
])
def test_gather_nd_matches_loop(xs, ind, batch_dims):
    x = randn(*xs)
    check("gather_nd", [x, ind], gather_nd_loop(x, ind, batch_dims), batch_dims=batch_dims)


def test_embedding_matches_torch():
    table = randn(6, 3)
    ids = np.array([[5, 0, 2], [1, 1, 4]])
    check("embedding", [table, ids], F.embedding(t(ids), t(table)).numpy())
    with pytest.raises(RuntimeEvalError):
        run_op("embedding", [table, np.array([0, -1])])


# --------------------------------------------------------------------------------------
# scatters


def scatter_elements_loop(x: np.ndarray, ind: np.ndarray, upd: np.ndarray, axis: int, reduction: str) -> np.ndarray:
    out = x.copy()
    fn = {"none": lambda a, u: u, "add": lambda a, u: a + u, "mul": lambda a, u: a * u,
          "max": max, "min": min}[reduction]
    for pos in itertools.product(*map(range, ind.shape)):
        dst = list(pos)
        dst[axis] = int(ind[pos]) % x.shape[axis]
        out[tuple(dst)] = fn(out[tuple(dst)], upd[pos])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_matches_loop(reduction, axis):
    x = np.arange(20, dtype=np.int64).reshape(4, 5) - 7
    ind = np.array([[1, -1, 1], [3, 0, 3]])  # repeated targets within a row/column
    upd = np.array([[9, -4, 6], [2, 11, -8]], dtype=np.int64)
    check("scatter_elements", [x, ind, upd], scatter_elements_loop(x, ind, upd, axis, reduction),
          axis=axis, reduction=reduction)


@pytest.mark.parametrize(("reduction", "torch_reduce"), [("add", "sum"), ("mul", "prod"), ("max", "amax"),
                                                         ("min", "amin")])
def test_scatter_elements_reductions_match_torch(reduction, torch_reduce):
    x = randn(3, 5)
    ind = np.array([[0, 4, 4, 1], [2, 2, 2, 0]])
    upd = randn(2, 4, seed=1)
    expected = t(x).scatter_reduce(1, t(ind), t(upd), torch_reduce, include_self=True)
    check("scatter_elements", [x, ind, upd], expected.numpy(), tol=1e-6, axis=1, reduction=reduction)


def test_scatter_elements_without_repeats_matches_torch_scatter():
    x = randn(4, 3)
    ind = np.array([[3, 0, 1], [0, 2, 3]])
    upd = randn(2, 3, seed=2)
    check("scatter_elements", [x, ind, upd], t(x).scatter(0, t(ind), t(upd)).numpy(), axis=0)


def scatter_nd_loop(x: np.ndarray, ind: np.ndarray, upd: np.ndarray, reduction: str) -> np.ndarray:
    out = x.copy()
    k = ind.shape[-1]
    for pos in itertools.product(*map(range, ind.shape[:-1])):
        dst = tuple(int(v) % x.shape[j] for j, v in enumerate(ind[pos]))
        cur = out[dst]
        u = upd[pos]
        out[dst] = {"none": u, "add": cur + u, "mul": cur * u, "max": np.maximum(cur, u),
                    "min": np.minimum(cur, u)}[reduction]
    assert k <= x.ndim
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_loop(reduction):
    x = np.arange(24, dtype=np.int32).reshape(4, 3, 2)
    ind = np.array([[[1, 2], [-1, 0]], [[1, 2], [3, 1]]])  # (1, 2) twice
    upd = np.array([[[5, -6], [7, 8]], [[-9, 10], [11, 12]]], dtype=np.int32)
    check("scatter_nd", [x, ind, upd], scatter_nd_loop(x, ind, upd, reduction), reduction=reduction)


def test_scatter_nd_whole_slices_and_out_of_range():
    x = randn(5, 4)
    ind = np.array([[4], [0]])
    upd = randn(2, 4, seed=3)
    check("scatter_nd", [x, ind, upd], scatter_nd_loop(x, ind, upd, "none"))
    with pytest.raises(RuntimeEvalError):
        run_op("scatter_nd", [x, np.array([[5]]), upd[:1]])


# --------------------------------------------------------------------------------------
# one_hot, shape, iota, fill, trilu


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_torch(axis):
    ind = np.array([[1, -1, 3], [0, 2, -4]])
    depth = 4
    hot = F.one_hot(t(wrapped(ind, depth)), depth).numpy()  # torch puts the new axis last
    hot = np.moveaxis(hot, -1, axis)
    values = np.array([-2.0, 5.0], np.float32)
    check("one_hot", [ind, values], np.where(hot == 1, values[1], values[0]).astype(np.float32),
          depth=depth, axis=axis)


def test_one_hot_out_of_range_rows_are_off():
    ind = np.array([7, -5, 1], np.int32)
    expected = np.array([[0, 0, 0], [0, 0, 0], [0, 9, 0]], np.int64)
    check("one_hot", [ind, np.array([0, 9], np.int64)], expected, depth=3)


def test_shape_of_static_and_symbolic_tensors():
    check("shape", [randn(2, 3, 4)], np.array([2, 3, 4]))
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 3])
    m = b.module(b.function("main", [x], [b.shape(x)]))
    for rows in (1, 6):
        np.testing.assert_array_equal(run_reference(m, [np.zeros((rows, 3), np.float32)])[0], [rows, 3])


@pytest.mark.parametrize(("start", "step", "dtype"), [(3, -2, DType.i64), (0.5, 0.25, DType.f32),
                                                      (-4, 3, DType.i32), (1.0, -1.5, DType.f64)])
def test_iota_matches_arange(start, step, dtype):
    n = 6
    expected = np.arange(n, dtype=np.float64) * step + start
    check("iota", [], expected.astype(dtype.np), shape=(n,), start=start, step=step, dtype=dtype)


def test_iota_with_symbolic_length():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n])
    m = b.module(b.function("main", [x], [b.iota(shape=[n], start=2, step=3, dtype=DType.i64)]))
    np.testing.assert_array_equal(run_reference(m, [np.zeros(4, np.float32)])[0], np.arange(2, 14, 3))


def test_fill_holds_value_in_dtype():
    check("fill", [], np.full((2, 3), -1.25, np.float32), shape=(2, 3), value=-1.25)
    check("fill", [], np.full((3,), 2**40 + 1, np.int64), shape=(3,), value=2**40 + 1, dtype=DType.i64)
    check("fill", [], np.ones((2, 2), bool), shape=(2, 2), value=True, dtype=DType.bool)
    with pytest.raises(ShapeError):
        Builder().fill(shape=[2], value="x")


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [-2, 0, 1, 5])
def test_trilu_matches_torch(upper, k):
    x = randn(2, 3, 4)
    fn = torch.triu if upper else torch.tril
    check("trilu", [x], fn(t(x), k).numpy(), upper=upper, k=k)


def test_index_ops_reject_bad_operands():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    with pytest.raises(ShapeError):
        b.gather(x, b.param("f", DType.f32, [2]), axis=0)
    with pytest.raises(ShapeError):
        b.gather(x, b.param("i", DType.i64, [2]), axis=2)
    with pytest.raises(ShapeError):
        b.scatter_elements(x, b.param("i", DType.i64, [2, 2]), b.param("u", DType.f32, [2, 3]), axis=0)
    with pytest.raises(ShapeError):
        b.scatter_nd(x, b.param("i", DType.i64, [2, 1]), b.param("u", DType.f32, [2, 3]))
    with pytest.raises(ShapeError):
        b.scatter_elements(x, b.param("i", DType.i64, [3, 4]), b.param("u", DType.f32, [3, 4]), reduction="avg")
    with pytest.raises(ShapeError):
        b.trilu(b.param("v", DType.f32, [4]))
