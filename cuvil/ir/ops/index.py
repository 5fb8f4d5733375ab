"""Data-dependent indexing: gather, scatter, embedding, one-hot, iota, fill, trilu, shape.

Gathers read ``x`` at an index loaded from another operand (``Ix.dyn``); negative
indices count from the end, and an index out of range is an evaluation error, never a
wild read. Scatters are written from the output's side: an output element looks for
the updates that target it (the last one wins, or they are combined by a reduction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import RuntimeEvalError
from cuvil.ir import numpy_prims
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import REQUIRED, define
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _static_mismatch(a: Dim, b: Dim) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _require_int(t: TensorType, what: str) -> None:
    if not t.dtype.is_int:
        raise TypeError(f"{what} must be integers, got {t.dtype}")


def _dim_scalar(d: Dim) -> R.Expr:
    return R.IndexValue(DType.i64, R.Ix.lit(d))


def _ix_scalar(i: R.Ix) -> R.Expr:
    return R.IndexValue(DType.i64, i)


def wrap_index(idx: R.Expr, dim: Dim) -> R.Expr:
    """An index loaded from a tensor, as i64, with negative values counted from the end."""
    i = R.cast(idx, DType.i64)
    return R.select(i < 0, i + _dim_scalar(dim), i)


def in_range(x: R.TensorRef, axis: int, index: R.Expr) -> R.Expr:
    """True, read through ``x[0, .., index, .., 0]``: an index ``x`` does not have along ``axis``
    is an index error in every reading of the rule (the interpreter raises, compiled code returns
    ERR_INDEX), as :func:`_checked` is for the numpy fast path. For ops whose rules are read from
    the output side (scatter), where an out-of-range index would otherwise just never match."""
    at = [R.Ix.dyn(index) if j == axis else R.Ix.lit(0) for j in range(x.rank)]
    probe = x.at(*at)
    return R.call("or", R.call("eq", probe, probe), R.lit(True, DType.bool))


def _checked(indices: np.ndarray, dim: int, op: str) -> np.ndarray:
    """numpy indices wrapped once, or a RuntimeEvalError when one is out of range."""
    ind = np.asarray(indices).astype(np.int64)
    bad = (ind < -dim) | (ind >= dim)
    if bad.any():
        first = int(ind[bad].flat[0])
        raise RuntimeEvalError(f"{op}: index {first} out of range for a dim of size {dim}",
                               hint="indices must lie in [-dim, dim)")
    return np.where(ind < 0, ind + dim, ind)


# --------------------------------------------------------------------------------------
# gather


def _gather_type(types: list[TensorType], axis: int) -> TensorType:
    x, ind = types
    _require_int(ind, "gather indices")
    ax = _axis(axis, x.rank)
    return x.with_shape([*x.shape[:ax], *ind.shape, *x.shape[ax + 1:]])


def _gather_rule(c: R.RuleCtx) -> R.Expr:
    x, ind = c.inputs
    ax = _axis(c.attrs["axis"], x.rank)
    q = ind.rank
    pick = wrap_index(ind.at(*c.out[ax:ax + q]), x.shape[ax])
    return x.at(*c.out[:ax], R.Ix.dyn(pick), *c.out[ax + q:])


def _gather_numpy(xs: list[np.ndarray], out: TensorType, axis: int) -> np.ndarray:
    x, ind = xs
    ax = _axis(axis, x.ndim)
    return np.take(x, _checked(ind, x.shape[ax], "gather"), axis=ax)


define("gather", ("x", "indices"), attrs={"axis": ("int", 0)}, shape=_gather_type, rule=_gather_rule,
       numpy=_gather_numpy, family="index",
       doc="out[a, i, b] = x[a, indices[i], b] along `axis`; negative indices count from the end",
       examples=lambda rng: [
           ([rng.standard_normal((3, 4, 2)).astype(np.float32), np.array([[2, -1], [0, 1], [-3, 3]])], {"axis": 1}),
           ([rng.standard_normal((5, 3)).astype(np.float32), np.array(-2, dtype=np.int32)], {"axis": 0}),
           ([np.arange(12, dtype=np.int64).reshape(4, 3), np.array([2, 0, 2, 1])], {"axis": -1})])


# --------------------------------------------------------------------------------------
# gather_elements


def _gather_elements_type(types: list[TensorType], axis: int) -> TensorType:
    x, ind = types
    _require_int(ind, "gather_elements indices")
    ax = _axis(axis, x.rank)
    if ind.rank != x.rank:
        raise ValueError(f"indices {ind} must have the rank of x {x}")
    for k, (a, b) in enumerate(zip(ind.shape, x.shape, strict=True)):
        if k != ax and isinstance(a, int) and isinstance(b, int) and a > b:
            raise ValueError(f"indices dim {k} ({a}) exceeds x's ({b})")
    return x.with_shape(ind.shape)


def _gather_elements_rule(c: R.RuleCtx) -> R.Expr:
    x, ind = c.inputs
    ax = _axis(c.attrs["axis"], x.rank)
    pick = R.Ix.dyn(wrap_index(ind.at(*c.out), x.shape[ax]))
    return x.at(*[pick if k == ax else o for k, o in enumerate(c.out)])


def _gather_elements_numpy(xs: list[np.ndarray], out: TensorType, axis: int) -> np.ndarray:
    x, ind = xs
    ax = _axis(axis, x.ndim)
    sub = x[tuple(slice(None) if k == ax else slice(0, n) for k, n in enumerate(ind.shape))]
    return np.take_along_axis(sub, _checked(ind, x.shape[ax], "gather_elements"), axis=ax)


define("gather_elements", ("x", "indices"), attrs={"axis": ("int", 0)}, shape=_gather_elements_type,
       rule=_gather_elements_rule, numpy=_gather_elements_numpy, family="index",
       doc="out[i] = x[i with position `axis` replaced by indices[i]] (torch.gather)",
       examples=lambda rng: [
           ([rng.standard_normal((3, 4)).astype(np.float32), np.array([[3, -1], [0, 2]])], {"axis": 1}),
           ([rng.standard_normal((4, 2, 3)).astype(np.float32), rng.integers(-4, 4, (2, 2, 3)).astype(np.int32)],
            {"axis": 0})])


# --------------------------------------------------------------------------------------
# gather_nd


def _gather_nd_type(types: list[TensorType], batch_dims: int) -> TensorType:
    x, ind = types
    _require_int(ind, "gather_nd indices")
    b = batch_dims
    if ind.rank < 1 or not 0 <= b < ind.rank or b > x.rank:
        raise ValueError(f"batch_dims {b} does not fit indices {ind} and x {x}")
    k = ind.shape[-1]
    if not isinstance(k, int) or b + k > x.rank:
        raise ValueError(f"the last dim of indices {ind} must be static and at most {x.rank - b}")
    for j in range(b):
        if _static_mismatch(x.shape[j], ind.shape[j]):
            raise ValueError(f"batch dim {j} differs: {x} vs {ind}")
    return x.with_shape([*ind.shape[:-1], *x.shape[b + k:]])


def _gather_nd_rule(c: R.RuleCtx) -> R.Expr:
    x, ind = c.inputs
    b = c.attrs["batch_dims"]
    k = ind.shape[-1]
    nq = ind.rank - 1
    lead = c.out[:nq]
    picks = [R.Ix.dyn(wrap_index(ind.at(*lead, R.Ix.lit(j)), x.shape[b + j])) for j in range(k)]
    return x.at(*c.out[:b], *picks, *c.out[nq:])


def _gather_nd_numpy(xs: list[np.ndarray], out: TensorType, batch_dims: int) -> np.ndarray:
    x, ind = xs
    b = batch_dims
    k = ind.shape[-1]
    ind = np.stack([_checked(ind[..., j], x.shape[b + j], "gather_nd") for j in range(k)], axis=-1) \
        if k else ind.astype(np.int64)
    batch = x.shape[:b]
    nb = int(np.prod(batch, dtype=np.int64))
    xf = x.reshape((nb, *x.shape[b:]))
    inf = ind.reshape((nb, -1, k))
    pieces = [xf[n][tuple(inf[n, :, j] for j in range(k))] for n in range(nb)]
    return np.stack(pieces).reshape(out.shape) if pieces else np.zeros(out.shape, x.dtype)


define("gather_nd", ("x", "indices"), attrs={"batch_dims": ("int", 0)}, shape=_gather_nd_type,
       rule=_gather_nd_rule, numpy=_gather_nd_numpy, family="index",
       doc="out[b, q, r] = x[b, indices[b, q, 0], ..., indices[b, q, k-1], r] (ONNX GatherND)",
       examples=lambda rng: [
           ([rng.standard_normal((3, 4, 2)).astype(np.float32), np.array([[[2, -1]], [[0, 3]]])], {}),
           ([rng.standard_normal((2, 3, 4)).astype(np.float32), np.array([[[1], [0], [2]], [[2], [2], [-1]]])],
            {"batch_dims": 1}),
           ([np.arange(24, dtype=np.int64).reshape(2, 3, 4), np.array([[1, 2, 3], [0, 0, -1]])], {})])


# --------------------------------------------------------------------------------------
# embedding


def _embedding_type(types: list[TensorType]) -> TensorType:
    table, ids = types
    _require_int(ids, "embedding ids")
    if table.rank < 1:
        raise ValueError("the embedding table needs rank >= 1")
    return table.with_shape([*ids.shape, *table.shape[1:]])


def _embedding_rule(c: R.RuleCtx) -> R.Expr:
    table, ids = c.inputs
    q = ids.rank
    return table.at(R.Ix.dyn(R.cast(ids.at(*c.out[:q]), DType.i64)), *c.out[q:])


def _embedding_numpy(xs: list[np.ndarray], out: TensorType) -> np.ndarray:
    table, ids = xs
    ind = ids.astype(np.int64)
    bad = (ind < 0) | (ind >= table.shape[0])
    if bad.any():
        raise RuntimeEvalError(f"embedding: id {int(ind[bad].flat[0])} out of range for {table.shape[0]} rows",
                               hint="ids must lie in [0, rows)")
    return table[ind]


define("embedding", ("table", "ids"), shape=_embedding_type, rule=_embedding_rule, numpy=_embedding_numpy,
       family="index", doc="out[i, ...] = table[ids[i], ...]; ids must lie in [0, rows)",
       examples=lambda rng: [([rng.standard_normal((5, 3)).astype(np.float32), np.array([[4, 0, 2], [1, 1, 3]])], {})])


# --------------------------------------------------------------------------------------
# scatter_elements / scatter_nd


def _row_major(extents: Sequence[Dim]) -> tuple[list[Dim], Dim]:
    """The row-major strides of a grid of ``extents`` and its number of elements."""
    strides: list[Dim] = []
    total: Dim = 1
    for d in reversed(list(extents)):
        strides.insert(0, total)
        total = total * d
    return strides, total


def _combine(kind: str, x: R.Expr, extents: Sequence[Dim], match: Any, update: Any, position: Any) -> R.Expr:
    """x combined with the updates whose index matches this output element.
    ``match(ks)``: does update ks target it; ``position(ks)``: ks flattened (i64);
    ``update(ks, None)`` / ``update(None, flat)``: the update at ks or at a flattened position.
    A combining reduction folds x first, then the updates in row-major order (``((x + u0) + u1)``,
    as applying them one after the other does); an update elsewhere contributes a term that
    changes nothing bit for bit (-0.0 to a float sum, 1 to a product, the extreme to max/min)."""
    dt = x.dtype
    if kind == "none":
        last = R.reduce("max", extents, lambda *ks: R.select(match(ks), position(ks), R.lit(-1, DType.i64)))
        return R.select(last >= 0, update(None, last), x)
    red = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}[kind]
    neutral = {"add": -0.0 if dt.is_float else 0, "mul": 1, "max": R.lowest(dt), "min": R.highest(dt)}[kind]
    strides, total = _row_major(extents)

    def term(f: R.Ix) -> R.Expr:
        g = f - 1  # term 0 is x itself; term g + 1 is update g
        ks = tuple((g // s) % d for s, d in zip(strides, extents, strict=True))
        first = R.call("eq", R.IndexValue(DType.i64, f), R.lit(0, DType.i64))
        return R.select(first, x, R.select(match(ks), update(ks, None), R.lit(neutral, dt)))

    return R.reduce(red, [total + 1], term)


def _scatter_operands(types: list[TensorType], what: str,
                      reduction: str) -> tuple[TensorType, TensorType, TensorType]:
    """x, indices, updates of a scatter, checked: integer indices, a known reduction, updates of x's dtype."""
    x, ind, upd = types
    _require_int(ind, what)
    if reduction not in SCATTER_REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r} (expected one of {', '.join(SCATTER_REDUCTIONS)})")
    if upd.dtype is not x.dtype:
        raise TypeError(f"updates dtype {upd.dtype} differs from x's {x.dtype}")
    return x, ind, upd


def _scatter_elements_type(types: list[TensorType], axis: int, reduction: str) -> TensorType:
    x, ind, upd = _scatter_operands(types, "scatter indices", reduction)
    _axis(axis, x.rank)
    if not ind.rank == upd.rank == x.rank:
        raise ValueError(f"x {x}, indices {ind} and updates {upd} must have one rank")
    for k, (a, b) in enumerate(zip(ind.shape, upd.shape, strict=True)):
        if _static_mismatch(a, b):
            raise ValueError(f"indices {ind} and updates {upd} differ in dim {k}")
    return x


def _scatter_elements_rule(c: R.RuleCtx) -> R.Expr:
    x, ind, upd = c.inputs
    ax = _axis(c.attrs["axis"], x.rank)
    here = list(c.out)
    # output elements beyond the indices' extent in a non-scatter dim receive nothing
    inb: R.Expr | None = None
    for k in range(x.rank):
        if k != ax and ind.shape[k] != x.shape[k]:
            term = _ix_scalar(c.out[k]) < _dim_scalar(ind.shape[k])
            inb = term if inb is None else R.call("and", inb, term)

    def at(k: R.Ix) -> list[R.Ix]:
        return [k if j == ax else o for j, o in enumerate(here)]

    def match(ks: tuple[R.Ix, ...]) -> R.Expr:
        target = wrap_index(ind.at(*at(ks[0]), oob=0), x.shape[ax])
        hit = R.call("and", in_range(x, ax, target), R.call("eq", target, _ix_scalar(c.out[ax])))
        return hit if inb is None else R.call("and", inb, hit)

    def update(ks: tuple[R.Ix, ...] | None, flat: R.Expr | None) -> R.Expr:
        if ks is None:
            assert flat is not None  # _combine passes one of the two
            ks = (R.Ix.dyn(flat),)
        return upd.at(*at(ks[0]), oob=0)

    return _combine(c.attrs["reduction"], x.at(*c.out), [ind.shape[ax]], match, update,
                    lambda ks: _ix_scalar(ks[0]))


_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(out: np.ndarray, where: tuple[np.ndarray, ...], upd: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "none":
        out[where] = upd  # repeated targets: the last update wins
    elif reduction in ("max", "min") and DType.from_numpy(out.dtype).is_float:
        # one update at a time, in order, with the rules' max / min (numpy's float16 loop breaks ties otherwise)
        fold = numpy_prims.maximum if reduction == "max" else numpy_prims.minimum
        targets = np.broadcast_arrays(*where)  # the updated places (slices of ``out`` for scatter_nd)
        for k in np.ndindex(targets[0].shape):
            at = tuple(int(t[k]) for t in targets)
            out[at] = fold(out[at], upd[k])
    else:
        _UFUNCS[reduction].at(out, where, upd)
    return out


def _scatter_elements_numpy(xs: list[np.ndarray], out: TensorType, axis: int, reduction: str) -> np.ndarray:
    x, ind, upd = xs
    ax = _axis(axis, x.ndim)
    grid: list[np.ndarray] = list(np.indices(ind.shape, sparse=True))
    grid[ax] = _checked(ind, x.shape[ax], "scatter_elements")
    return _scatter_into(x.copy(), tuple(grid), upd, reduction)


def _scatter_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ind = np.array([[1, -1, 1], [0, 3, 3]])
    upd = rng.standard_normal((2, 3)).astype(np.float32)
    xi = np.arange(12, dtype=np.int32).reshape(4, 3)
    ind_i = np.array([[1, 0, 2], [3, 0, 0]], dtype=np.int32)
    upd_i = np.array([[7, -8, 9], [10, 11, -12]], dtype=np.int32)
    return [([x, ind, upd], {"axis": 1, "reduction": r}) for r in SCATTER_REDUCTIONS] + \
        [([xi, ind_i, upd_i], {"axis": 0, "reduction": r}) for r in SCATTER_REDUCTIONS]


define("scatter_elements", ("x", "indices", "updates"), attrs={"axis": ("int", 0), "reduction": ("str", "none")},
       shape=_scatter_elements_type, rule=_scatter_elements_rule, numpy=_scatter_elements_numpy, family="index",
       doc="copy of x where x[p with `axis` replaced by indices[p]] receives updates[p]; repeated targets: "
           "the last update wins (none) or they combine by add/mul/max/min with x; indices must lie in "
           "[-dim, dim) (others are an index error in every reading of the op)",
       examples=_scatter_examples)


def _scatter_nd_type(types: list[TensorType], reduction: str) -> TensorType:
    x, ind, upd = _scatter_operands(types, "scatter_nd indices", reduction)
    if ind.rank < 1 or not isinstance(ind.shape[-1], int) or ind.shape[-1] > x.rank:
        raise ValueError(f"the last dim of indices {ind} must be static and at most {x.rank}")
    k = ind.shape[-1]
    want = [*ind.shape[:-1], *x.shape[k:]]
    if upd.rank != len(want) or any(_static_mismatch(a, b) for a, b in zip(upd.shape, want, strict=True)):
        raise ValueError(f"updates must have shape {want}, got {upd}")
    return x


def _scatter_nd_rule(c: R.RuleCtx) -> R.Expr:
    x, ind, upd = c.inputs
    k = ind.shape[-1]
    qext = list(ind.shape[:-1])
    strides, _ = _row_major(qext)

    def match(ks: tuple[R.Ix, ...]) -> R.Expr:
        hit: R.Expr | None = None
        for j in range(k):
            target = wrap_index(ind.at(*ks, R.Ix.lit(j)), x.shape[j])
            term = R.call("and", in_range(x, j, target), R.call("eq", target, _ix_scalar(c.out[j])))
            hit = term if hit is None else R.call("and", hit, term)
        return hit if hit is not None else R.lit(True, DType.bool)

    def position(ks: tuple[R.Ix, ...]) -> R.Expr:
        flat: R.Ix = R.Ix.lit(0)
        for q, s in zip(ks, strides, strict=True):
            flat = flat + q * s
        return _ix_scalar(flat)

    def update(ks: tuple[R.Ix, ...] | None, flat: R.Expr | None) -> R.Expr:
        if ks is None:
            assert flat is not None  # _combine passes one of the two
            f = R.ix_max(R.Ix.dyn(flat), 0)
            ks = tuple((f // s) % d for s, d in zip(strides, qext, strict=True))
        return upd.at(*ks, *c.out[k:], oob=0)

    return _combine(c.attrs["reduction"], x.at(*c.out), qext, match, update, position)


def _scatter_nd_numpy(xs: list[np.ndarray], out: TensorType, reduction: str) -> np.ndarray:
    x, ind, upd = xs
    k = ind.shape[-1]
    flat = ind.reshape(-1, k)
    where = tuple(_checked(flat[:, j], x.shape[j], "scatter_nd") for j in range(k))
    return _scatter_into(x.copy(), where, upd.reshape((-1, *x.shape[k:])), reduction)


def _scatter_nd_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    ind = np.array([[[1, 2], [-1, 0]], [[1, 2], [3, 1]]])
    upd = rng.standard_normal((2, 2, 2)).astype(np.float32)
    xi = np.arange(20, dtype=np.int64).reshape(5, 4)
    ind_i = np.array([[3], [0], [3]])
    upd_i = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [-9, 10, -11, 12]], dtype=np.int64)
    return [([x, ind, upd], {"reduction": r}) for r in SCATTER_REDUCTIONS] + \
        [([xi, ind_i, upd_i], {"reduction": r}) for r in ("none", "add", "max")]


define("scatter_nd", ("x", "indices", "updates"), attrs={"reduction": ("str", "none")},
       shape=_scatter_nd_type, rule=_scatter_nd_rule, numpy=_scatter_nd_numpy, family="index",
       doc="copy of x where the slice x[indices[q]] receives updates[q]; repeated targets: the last update "
           "wins (none) or they combine by add/mul/max/min with x; indices must lie in [-dim, dim) "
           "(others are an index error in every reading of the op)",
       examples=_scatter_nd_examples)


# --------------------------------------------------------------------------------------
# one_hot


def _one_hot_type(types: list[TensorType], depth: int, axis: int) -> TensorType:
    ind, values = types
    _require_int(ind, "one_hot indices")
    if values.rank != 1 or _static_mismatch(values.shape[0], 2):
        raise ValueError(f"values must be [off, on], got {values}")
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    ax = _axis(axis, ind.rank + 1)
    shape = list(ind.shape)
    shape.insert(ax, depth)
    return values.with_shape(shape)


def _one_hot_rule(c: R.RuleCtx) -> R.Expr:
    ind, values = c.inputs
    ax = _axis(c.attrs["axis"], c.out_type.rank)
    pos = [o for k, o in enumerate(c.out) if k != ax]
    hot = R.call("eq", wrap_index(ind.at(*pos), c.attrs["depth"]), _ix_scalar(c.out[ax]))
    return R.select(hot, values.at(R.Ix.lit(1)), values.at(R.Ix.lit(0)))


def _one_hot_numpy(xs: list[np.ndarray], out: TensorType, depth: int, axis: int) -> np.ndarray:
    ind, values = xs
    ax = _axis(axis, ind.ndim + 1)
    i = ind.astype(np.int64)
    i = np.where(i < 0, i + depth, i)
    hot = np.expand_dims(i, ax) == np.arange(depth).reshape([depth if k == ax else 1 for k in range(ind.ndim + 1)])
    return np.where(hot, values[1], values[0])


define("one_hot", ("indices", "values"), attrs={"depth": ("int", REQUIRED), "axis": ("int", -1)},
       shape=_one_hot_type, rule=_one_hot_rule, numpy=_one_hot_numpy, family="index",
       doc="values[1] where the new `axis` position equals the index (negative: from depth), else values[0]; "
           "indices outside [-depth, depth) give a row of values[0]",
       examples=lambda rng: [
           ([np.array([[1, -1, 5], [0, 2, -4]]), np.array([0.0, 3.0], dtype=np.float32)], {"depth": 4, "axis": 1}),
           ([np.array([2, 0, -1], dtype=np.int32), np.array([-1, 7], dtype=np.int64)], {"depth": 3})])


# --------------------------------------------------------------------------------------
# shape, iota, fill


def _shape_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    if x.rank == 0:
        return R.lit(0, DType.i64)
    pos = _ix_scalar(c.out[0])
    expr = _dim_scalar(x.shape[-1])
    for k in reversed(range(x.rank - 1)):
        expr = R.select(R.call("eq", pos, R.lit(k, DType.i64)), _dim_scalar(x.shape[k]), expr)
    return expr


define("shape", ("x",), shape=lambda types: TensorType(DType.i64, (types[0].rank,)), rule=_shape_rule,
       numpy=lambda xs, out: np.array(xs[0].shape, dtype=np.int64), family="index",
       doc="the dims of x as an i64 vector (symbolic dims evaluate at run time)",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {}),
                             ([np.zeros((5, 0), dtype=np.int8)], {})])


def _number(v: Any, what: str) -> None:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {v!r}")


def _iota_type(types: list[TensorType], shape: tuple[Dim, ...], start: Any, step: Any, dtype: DType) -> TensorType:
    _number(start, "start")
    _number(step, "step")
    if dtype is DType.bool:
        raise TypeError("iota needs a numeric dtype")
    return TensorType(dtype, shape)


def _flat_index(out: Sequence[R.Ix], shape: Sequence[Dim]) -> R.Ix:
    flat: R.Ix = R.Ix.lit(0)
    for i, d in zip(out, shape, strict=True):
        flat = flat * d + i
    return flat


def _iota_rule(c: R.RuleCtx) -> R.Expr:
    dt = c.attrs["dtype"]
    pos = R.cast(_ix_scalar(_flat_index(c.out, c.out_type.shape)), dt)
    return pos * R.lit(c.attrs["step"], dt) + R.lit(c.attrs["start"], dt)


def _iota_numpy(xs: list[np.ndarray], out: TensorType, shape: tuple, start: Any, step: Any,
                dtype: DType) -> np.ndarray:
    shape = tuple(int(d) for d in out.shape)  # a fast path runs on concrete types
    n = int(np.prod(shape, dtype=np.int64))
    pos = np.arange(n, dtype=np.int64).reshape(shape).astype(dtype.np)
    return pos * _scalar(step, dtype) + _scalar(start, dtype)


def _scalar(v: Any, dtype: DType) -> np.ndarray:
    """A numpy scalar coerced the way R.lit coerces rule literals, so fast path and rule agree."""
    return numpy_prims.literal(R.lit(v, dtype).value, dtype)  # as the rule reads it: -1 is 255 in uint8


define("iota", (), attrs={"shape": ("dims", REQUIRED), "start": ("any", 0), "step": ("any", 1),
                          "dtype": ("dtype", DType.i64)},
       shape=_iota_type, rule=_iota_rule, numpy=_iota_numpy, family="index",
       doc="start + step * (row-major position), computed in `dtype` (ONNX Range when 1-D)",
       examples=lambda rng: [([], {"shape": (5,), "start": 3, "step": -2}),
                             ([], {"shape": (2, 3), "start": 0.5, "step": 0.25, "dtype": DType.f32})])


def _fill_type(types: list[TensorType], shape: tuple[Dim, ...], value: Any, dtype: DType) -> TensorType:
    if not isinstance(value, (bool, np.bool_)):
        _number(value, "fill value")
    return TensorType(dtype, shape)


define("fill", (), attrs={"shape": ("dims", REQUIRED), "value": ("any", 0), "dtype": ("dtype", DType.f32)},
       shape=_fill_type, rule=lambda c: R.lit(c.attrs["value"], c.attrs["dtype"]),
       numpy=lambda xs, out, shape, value, dtype: np.full(out.shape, _scalar(value, dtype), dtype=dtype.np),
       family="index", doc="a tensor of `shape` holding `value` (ONNX ConstantOfShape)",
       examples=lambda rng: [([], {"shape": (2, 3), "value": 1.5}),
                             ([], {"shape": (3, 2), "value": -7, "dtype": DType.i32}),
                             ([], {"shape": (2,), "value": True, "dtype": DType.bool})])


# --------------------------------------------------------------------------------------
# trilu


def _trilu_type(types: list[TensorType], upper: bool, k: int) -> TensorType:
    if types[0].rank < 2:
        raise ValueError(f"trilu needs rank >= 2, got {types[0]}")
    return types[0]


def _trilu_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    diag = _ix_scalar(c.out[-1] - c.out[-2])
    k = R.lit(c.attrs["k"], DType.i64)
    keep = diag >= k if c.attrs["upper"] else diag <= k
    return R.select(keep, x.at(*c.out), R.lit(0, x.dtype))


define("trilu", ("x",), attrs={"upper": ("bool", True), "k": ("int", 0)}, shape=_trilu_type, rule=_trilu_rule,
       numpy=lambda xs, out, upper, k: (np.triu if upper else np.tril)(xs[0], k), family="index",
       doc="keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two axes, zero the rest",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"k": 1}),
                             ([rng.standard_normal((4, 3)).astype(np.float32)], {"upper": False, "k": -1}),
                             ([np.arange(12, dtype=np.int64).reshape(3, 4)], {"upper": True, "k": -2})])
