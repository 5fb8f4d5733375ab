"""Reductions over a set of axes, with or without keeping them; arg-reductions, scans and top-k."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.errors import ShapeError
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import cast, div, reduce_axes
from cuvil.ir.opdef import REQUIRED, define, norm_axis
from cuvil.ir.rules import reduction_identity
from cuvil.ir.types import TensorType


def _axes(axes: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return tuple(sorted({norm_axis(a, rank) for a in axes})) if axes else tuple(range(rank))


def _reduce_type(types: list[TensorType], axes: tuple[int, ...], keepdims: bool) -> TensorType:
    x = types[0]
    red = _axes(axes, x.rank)
    shape = [1 if k in red else d for k, d in enumerate(x.shape)] if keepdims else \
        [d for k, d in enumerate(x.shape) if k not in red]
    return x.with_shape(shape)


def _reduced_index(c: R.RuleCtx, red: tuple[int, ...], ks: tuple[R.Ix, ...]) -> list[R.Ix]:
    """The input index for output index ``c.out`` with the reduced positions taken from ``ks``."""
    (x,) = c.inputs
    keep = c.attrs["keepdims"]
    idx: list[R.Ix] = []
    it = iter(ks)
    o = 0
    for k in range(x.rank):
        if k in red:
            idx.append(next(it))
            o += 1 if keep else 0
        else:
            idx.append(c.out[o])
            o += 1
    return idx


def reduction_rule(kind: str):
    """out[i] = kind over the reduced axes of x[i with reduced positions as fresh variables]."""

    def rule(c: R.RuleCtx) -> R.Expr:
        (x,) = c.inputs
        red = _axes(c.attrs["axes"], x.rank)
        return R.reduce(kind, [x.shape[k] for k in red], lambda *ks: x.at(*_reduced_index(c, red, ks)))

    return rule


def _sum_rule(c: R.RuleCtx) -> R.Expr:
    """Halves accumulate in f32 and are rounded once (:func:`cuvil.ir.rules.wide_sum`)."""
    (x,) = c.inputs
    red = _axes(c.attrs["axes"], x.rank)
    total = R.wide_sum([x.shape[k] for k in red], lambda *ks: x.at(*_reduced_index(c, red, ks)))
    return R.cast(total, x.dtype)


def _mean_rule(c: R.RuleCtx) -> R.Expr:
    """The f32 sum of halves divided in f32 and rounded once (:func:`cuvil.ir.rules.wide_mean`)."""
    (x,) = c.inputs
    red = _axes(c.attrs["axes"], x.rank)
    return R.wide_mean([x.shape[k] for k in red], lambda *ks: x.at(*_reduced_index(c, red, ks)), x.dtype)


def wide_array(x: np.ndarray) -> np.ndarray:
    """``x`` in the type its sums accumulate in: halves as f32 (exact), the rest unchanged."""
    return x.astype(np.float32) if DType.from_numpy(x.dtype) in R.HALF_DTYPES else x


def round_once(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A wide accumulation rounded to the operand's type, as the rule's final cast does."""
    return v if v.dtype == dtype else cast(v, DType.from_numpy(dtype))


def _np_reduce(kind: str) -> Callable[..., np.ndarray]:
    def run(xs: list[np.ndarray], out: TensorType, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        x = xs[0]
        return reduce_axes(kind, x, _axes(axes, x.ndim), keepdims)

    return run


def _sum_numpy(xs: list[np.ndarray], out: TensorType, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    x = xs[0]
    return round_once(reduce_axes("sum", wide_array(x), _axes(axes, x.ndim), keepdims), x.dtype)


def mean_numpy(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """The mean over ``axes`` (sorted, non-negative) as :func:`cuvil.ir.rules.wide_mean` defines it:
    the left-fold sum in the accumulator's type, divided there, rounded once."""
    total = reduce_axes("sum", wide_array(x), axes, keepdims)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return round_once(div(total, np.asarray(n).astype(total.dtype)), x.dtype)


def _mean_numpy(xs: list[np.ndarray], out: TensorType, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    x = xs[0]
    return mean_numpy(x, _axes(axes, x.ndim), keepdims)


def _reduce_examples(rng: np.random.Generator) -> list:
    f = lambda *sh: rng.standard_normal(sh).astype(np.float32)
    return [([f(2, 3, 4)], {"axes": (0, 2)}),
            ([f(2, 3, 4)], {"axes": (-1,), "keepdims": True}),
            ([f(3, 2)], {}),
            ([f(2, 0, 3)], {"axes": (1,), "keepdims": True}),
            ([rng.integers(-9, 9, (3, 4)).astype(np.int32)], {"axes": (1,)})]


_REDUCE_ATTRS = {"axes": ("ints", ()), "keepdims": ("bool", False)}

define("reduce_sum", ("x",), attrs=_REDUCE_ATTRS,
       shape=_reduce_type, rule=_sum_rule, numpy=_sum_numpy,
       family="reduce", doc="sum over `axes` (all axes when empty)", examples=_reduce_examples,
       precision_policy="keep-fp32")

define("reduce_mean", ("x",), attrs=_REDUCE_ATTRS, shape=_reduce_type, rule=_mean_rule, numpy=_mean_numpy,
       family="reduce", examples=lambda rng: _reduce_examples(rng)[:3] + _reduce_examples(rng)[4:],
       precision_policy="keep-fp32",
       doc="sum over `axes` (all when empty) divided by the number of reduced elements (ints truncate)")

define("reduce_max", ("x",), attrs=_REDUCE_ATTRS, shape=_reduce_type, rule=reduction_rule("max"),
       numpy=_np_reduce("max"), family="reduce",
       examples=lambda rng: [*_reduce_examples(rng), ([rng.standard_normal((3, 4)) > 0], {"axes": (1,)})],
       doc="max over `axes` (all when empty), NaN-propagating; an empty reduction gives -inf (the lowest value)")

define("reduce_min", ("x",), attrs=_REDUCE_ATTRS, shape=_reduce_type, rule=reduction_rule("min"),
       numpy=_np_reduce("min"), family="reduce",
       examples=lambda rng: [*_reduce_examples(rng), ([rng.standard_normal((3, 4)) > 0], {"axes": (0,)})],
       doc="min over `axes` (all when empty), NaN-propagating; an empty reduction gives +inf (the highest value)")

define("reduce_prod", ("x",), attrs=_REDUCE_ATTRS, shape=_reduce_type, rule=reduction_rule("prod"),
       numpy=_np_reduce("prod"), family="reduce", examples=_reduce_examples, precision_policy="keep-fp32",
       doc="product over `axes` (all when empty); an empty reduction gives 1")


# --------------------------------------------------------------------------------------
# argmax / argmin


def _arg_type(types: list[TensorType], axis: int, keepdims: bool, select_last_index: bool) -> TensorType:
    x = types[0]
    ax = norm_axis(axis, x.rank)
    shape = [1 if k == ax else d for k, d in enumerate(x.shape)] if keepdims else \
        [d for k, d in enumerate(x.shape) if k != ax]
    if x.rank and x.shape[ax] == 0 and 0 not in shape:
        raise ShapeError(f"argmax/argmin along axis {ax} of {x}: the axis is empty, so no position holds the "
                         "extreme", location="argmax", hint="an empty axis has no maximum or minimum to point at")
    return TensorType(DType.i64, tuple(shape))


def _arg_rule(kind: str) -> Callable[[R.RuleCtx], R.Expr]:
    """The first (or last) position along the axis holding the max (min); NaN counts as the extreme."""

    def rule(c: R.RuleCtx) -> R.Expr:
        (x,) = c.inputs
        if x.rank == 0:  # one element, at position 0 (as numpy and torch answer)
            return R.lit(0, DType.i64)
        ax = norm_axis(c.attrs["axis"], x.rank)
        red = (ax,)
        n = x.shape[ax]
        at = lambda k: x.at(*_reduced_index(c, red, (k,)))
        best = R.reduce(kind, [n], at)

        def hit(k: R.Ix) -> R.Expr:
            v = at(k)
            eq = R.call("eq", v, best)
            return R.call("or", eq, R.call("isnan", v)) if x.dtype.is_float else eq

        pos = lambda k: R.IndexValue(DType.i64, k)
        if c.attrs["select_last_index"]:
            return R.reduce("max", [n], lambda k: R.select(hit(k), pos(k), R.lit(-1, DType.i64)))
        last = R.cast(R.IndexValue(DType.i64, R.Ix.lit(n)), DType.i64) if not isinstance(n, int) \
            else R.lit(n, DType.i64)
        return R.reduce("min", [n], lambda k: R.select(hit(k), pos(k), last))

    return rule


def _arg_numpy(kind: str) -> Callable[..., np.ndarray]:
    fn = np.argmax if kind == "max" else np.argmin

    def run(xs: list[np.ndarray], out: TensorType, axis: int, keepdims: bool, select_last_index: bool
            ) -> np.ndarray:
        x = xs[0]
        ax = norm_axis(axis, x.ndim)
        if x.ndim and x.shape[ax] == 0:  # a symbolic axis that is empty at run time: the rule's empty reduction
            fill = reduction_identity("max" if select_last_index else "min", DType.i64)
            shape = [1 if k == ax else d for k, d in enumerate(x.shape)]
            idx = np.full(shape, fill, dtype=np.int64)
            return idx if keepdims else np.squeeze(idx, axis=ax)
        if select_last_index:
            idx = x.shape[ax] - 1 - fn(np.flip(x, axis=ax), axis=ax, keepdims=True)
        else:
            idx = fn(x, axis=ax, keepdims=True)
        idx = idx.astype(np.int64)
        return idx if keepdims else np.squeeze(idx, axis=ax)

    return run


def _arg_examples(rng: np.random.Generator) -> list:
    ties = rng.integers(0, 3, (3, 4, 2)).astype(np.float32)
    with_nan = rng.standard_normal((2, 5)).astype(np.float32)
    with_nan[0, 1] = with_nan[0, 3] = np.nan
    return [([ties], {"axis": 1}),
            ([ties], {"axis": -1, "keepdims": False, "select_last_index": True}),
            ([ties], {"axis": 0, "select_last_index": True}),
            ([with_nan], {"axis": 1, "keepdims": False}),
            ([rng.integers(-5, 5, (4, 3)).astype(np.int32)], {"axis": 0, "keepdims": False})]


_ARG_ATTRS = {"axis": ("int", 0), "keepdims": ("bool", True), "select_last_index": ("bool", False)}

define("argmax", ("x",), attrs=_ARG_ATTRS, shape=_arg_type, rule=_arg_rule("max"), numpy=_arg_numpy("max"),
       family="reduce", examples=_arg_examples,
       doc="i64 position of the max along `axis` (first, or last with select_last_index; NaN wins)")

define("argmin", ("x",), attrs=_ARG_ATTRS, shape=_arg_type, rule=_arg_rule("min"), numpy=_arg_numpy("min"),
       family="reduce", examples=_arg_examples,
       doc="i64 position of the min along `axis` (first, or last with select_last_index; NaN wins)")


# --------------------------------------------------------------------------------------
# running sums and products


def _scan_type(types: list[TensorType], axis: int, exclusive: bool, reverse: bool) -> TensorType:
    norm_axis(axis, types[0].rank)
    return types[0]


def _scan_rule(kind: str) -> Callable[[R.RuleCtx], R.Expr]:
    """out[i] = kind of x[k] along the axis over k <= i (k < i exclusive), in ascending k; reversed,
    over k >= i (k > i) in descending k; a sum of halves runs in f32 and is rounded once. The other
    positions contribute a term that changes nothing, bit for bit: -0.0 for a float sum (x + -0.0 is
    x, signed zeros included), 0 for an integer sum, 1 for a product. An exclusive sum over nothing
    is +0."""

    def rule(c: R.RuleCtx) -> R.Expr:
        (x,) = c.inputs
        ax = norm_axis(c.attrs["axis"], x.rank)
        n = x.shape[ax]
        reverse, exclusive = c.attrs["reverse"], c.attrs["exclusive"]
        i = c.out[ax]
        neutral = R.lit(-0.0 if kind == "sum" and x.dtype.is_float else (0 if kind == "sum" else 1), x.dtype)
        wide = kind == "sum" and x.dtype in R.HALF_DTYPES  # half running sums accumulate in f32, rounded once

        def body(k: R.Ix) -> R.Expr:
            pos = R.Ix.lit(n) - R.Ix.lit(1) - k if reverse else k  # the position the k-th term reads
            idx = list(c.out)
            idx[ax] = pos
            cmp = ("gt" if exclusive else "ge") if reverse else ("lt" if exclusive else "le")
            keep = R.call(cmp, R.IndexValue(DType.i64, pos), R.IndexValue(DType.i64, i))
            term = R.select(keep, x.at(*idx), neutral)
            return R.widen(term) if wide else term

        out = R.reduce(kind, [n], body)
        if wide:
            out = R.cast(out, x.dtype)
        if not (exclusive and kind == "sum"):
            return out
        first = R.Ix.lit(n) - R.Ix.lit(1) if reverse else R.Ix.lit(0)
        empty = R.call("eq", R.IndexValue(DType.i64, i), R.IndexValue(DType.i64, first))
        return R.select(empty, R.lit(0, x.dtype), out)

    return rule


def _scan_numpy(kind: str) -> Callable[..., np.ndarray]:
    fn, fill = (np.cumsum, np.zeros_like) if kind == "sum" else (np.cumprod, np.ones_like)

    def run(xs: list[np.ndarray], out: TensorType, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
        x = xs[0]
        ax = norm_axis(axis, x.ndim)
        if reverse:
            x = np.flip(x, axis=ax)
        if kind == "sum" and DType.from_numpy(x.dtype) in R.HALF_DTYPES:  # the f32 running sum, rounded once
            wide = wide_array(x)
            y = round_once(np.cumsum(wide, axis=ax, dtype=wide.dtype), x.dtype)
        else:
            y = fn(x, axis=ax, dtype=x.dtype)  # a running fold: each element is the rule's sequential sum
        if exclusive and y.shape[ax]:
            head = fill(np.take(y, [0], axis=ax))
            y = np.concatenate([head, np.take(y, range(y.shape[ax] - 1), axis=ax)], axis=ax)
        return np.flip(y, axis=ax) if reverse else y

    return run


def _scan_examples(rng: np.random.Generator) -> list:
    return [([rng.standard_normal((3, 4)).astype(np.float32)], {"axis": 1}),
            ([rng.standard_normal((3, 4, 2)).astype(np.float32)], {"axis": 0, "exclusive": True}),
            ([rng.integers(-4, 5, (4, 3)).astype(np.int32)], {"axis": -1, "reverse": True}),
            ([rng.standard_normal((2, 5)).astype(np.float64)], {"axis": 1, "reverse": True, "exclusive": True})]


_SCAN_ATTRS = {"axis": ("int", REQUIRED), "exclusive": ("bool", False), "reverse": ("bool", False)}

define("cumsum", ("x",), attrs=_SCAN_ATTRS, shape=_scan_type, rule=_scan_rule("sum"), numpy=_scan_numpy("sum"),
       family="reduce", examples=_scan_examples, precision_policy="keep-fp32",
       doc="running sum along `axis`; exclusive leaves out the element itself, reverse runs from the end")

define("cumprod", ("x",), attrs=_SCAN_ATTRS, shape=_scan_type, rule=_scan_rule("prod"), numpy=_scan_numpy("prod"),
       family="reduce", examples=_scan_examples,
       doc="running product along `axis`; exclusive leaves out the element itself, reverse runs from the end")


# --------------------------------------------------------------------------------------
# topk


def _topk_type(types: list[TensorType], k: int, axis: int, largest: bool, sorted: bool, output: str) -> TensorType:
    x = types[0]
    ax = norm_axis(axis, x.rank)
    n = x.shape[ax]
    if k < 0 or (isinstance(n, int) and k > n):
        raise ValueError(f"k={k} is out of range for an axis of {n}")
    if output not in ("values", "indices"):
        raise ValueError(f"output must be 'values' or 'indices', got {output!r}")
    shape = tuple(k if j == ax else d for j, d in enumerate(x.shape))
    return TensorType(x.dtype if output == "values" else DType.i64, shape)


def _topk_rule(c: R.RuleCtx) -> R.Expr:
    """The element of rank j along the axis, where rank(e) counts the elements that beat x[e]
    (greater for largest, smaller otherwise) plus the equal ones at lower positions."""
    (x,) = c.inputs
    ax = norm_axis(c.attrs["axis"], x.rank)
    n = x.shape[ax]
    beats = "gt" if c.attrs["largest"] else "lt"

    def at(k: R.Ix) -> R.Expr:
        idx = list(c.out)
        idx[ax] = k
        return x.at(*idx)

    def beat(a: R.Expr, b: R.Expr) -> R.Expr:  # NaN ranks after every number, as a stable sort puts it
        if not x.dtype.is_float:
            return R.call(beats, a, b)
        return R.call("or", R.call(beats, a, b), R.call("and", R.call("isnan", b), R.call("not", R.call("isnan", a))))

    def same(a: R.Expr, b: R.Expr) -> R.Expr:
        if not x.dtype.is_float:
            return R.call("eq", a, b)
        return R.call("or", R.call("eq", a, b), R.call("and", R.call("isnan", a), R.call("isnan", b)))

    def rank(e: R.Ix) -> R.Expr:
        def counted(k: R.Ix) -> R.Expr:
            ahead = R.call("and", same(at(k), at(e)),
                           R.call("lt", R.IndexValue(DType.i64, k), R.IndexValue(DType.i64, e)))
            return R.cast(R.call("or", beat(at(k), at(e)), ahead), DType.i64)

        return R.reduce("sum", [n], counted)

    j = R.IndexValue(DType.i64, c.out[ax])
    index = R.reduce("sum", [n], lambda e: R.select(R.call("eq", rank(e), j), R.IndexValue(DType.i64, e),
                                                     R.lit(0, DType.i64)))
    if c.attrs["output"] == "indices":
        return index
    return at(R.Ix.dyn(index))


def _topk_numpy(xs: list[np.ndarray], out: TensorType, k: int, axis: int, largest: bool, sorted: bool,
                output: str) -> np.ndarray:
    x = xs[0]
    ax = norm_axis(axis, x.ndim)
    key = x
    if largest:
        key = ~x if x.dtype.kind in "iub" else -x
    order = np.argsort(key, axis=ax, kind="stable")
    idx = np.take(order, np.arange(k), axis=ax)
    if output == "indices":
        return idx.astype(np.int64)
    return np.take_along_axis(x, idx, axis=ax)


def _topk_examples(rng: np.random.Generator) -> list:
    ties = rng.integers(0, 4, (2, 5, 3)).astype(np.float32)
    ints = rng.integers(-50, 50, (3, 4)).astype(np.int64)
    out: list = []
    for output in ("values", "indices"):
        out += [([ties], {"k": 3, "axis": 1, "output": output}),
                ([ties], {"k": 2, "axis": -1, "largest": False, "output": output}),
                ([ints], {"k": 4, "axis": 1, "output": output})]
    return out


define("topk", ("x",), attrs={"k": ("int", REQUIRED), "axis": ("int", -1), "largest": ("bool", True),
                              "sorted": ("bool", True), "output": ("str", "values")},
       shape=_topk_type, rule=_topk_rule, numpy=_topk_numpy, family="reduce", examples=_topk_examples,
       doc="the k largest (smallest) elements along `axis`, best first, ties by lower index, NaN last; "
           "`output` picks the values or their i64 indices")
