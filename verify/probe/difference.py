"""Sound bounds on how far two nearly identical float programs may drift apart.

``P`` is a CIR function; ``P'`` is the same function except that at each *source* value ``v`` its
result may be replaced by any value within ``sources[v]`` (elementwise) of what ``v``'s op computes
on ``P'``'s operands (a merged LoRA weight at a matmul, for instance). Parameters and constants are
shared. For every input in a declared box and every value ``v``, :func:`difference_bounds` gives

* ``hulls[v]``: an interval containing both ``v`` (in ``P``) and ``v'`` (in ``P'``);
* ``values[v]``: an elementwise upper bound on ``|v' - v|``,

each program rounding in its own types, for inputs on which neither program produces a non-finite
value (the interval reader's assumption: each value's consumers see its finite range). This is
differential verification in the manner of ReluDiff / NeuroDiff: an interval of the value travels
with a bound on the difference.

Why it is sound, op by op (operands first):

* Hulls. ``P`` and ``P'`` apply the same op to operands that lie in the operands' hulls, so the
  interval reader (:func:`verify.probe.bounds.op_bounds`) on those hulls contains both results; a
  source widens it by its own bound. ``v`` lies in ``P``'s interval (:class:`BoundsEngine`) and
  ``|v' - v| <= delta``, so ``P``'s interval widened by ``delta`` holds ``v'`` too: the hull is the
  intersection of both.
* Differences. Each node of the op's rule is read by :class:`DiffWalker`, the interval reader with a
  difference bound carried next to every node interval. A node's bound is the mean-value bound of its
  primitive over the operand hulls (every segment from ``x`` to ``x'`` lies in the hull, which is
  convex), plus the rounding error of *both* programs where the node rounds (as many units of
  roundoff as the interval reader widens by). Two more facts keep it finite: a node whose operands
  have difference 0 computes the same thing in both programs (difference exactly 0), and both values
  of a node lie in its hull, so its width bounds the difference of any node (an unbounded or
  possibly-NaN hull gives infinity). Sums of products (matmul, conv, einsum) with large grids use the
  op's own fast path: ``sum_k |a_k| d(b_k) + |b_k| d(a_k)`` as two contractions (``|b_k|`` from the hull,
  which holds ``b'_k`` too, so no ``d(a) d(b)`` term), plus both programs' rounding.

The rules (:func:`transfer`): add and sub add the differences; mul ``|a| d(b) + |b| d(a)``; div
``d(a)/min|b| + max|a| d(b)/min|b|^2`` where the divisor hull excludes 0; smooth unary primitives their
largest slope over the hull (:data:`SLOPES`; sqrt also ``sqrt(d)``, pow by cases of its exponent); abs,
neg, min and max keep the largest difference; floor, ceil and rounding add one; select takes the branch
the condition hull decides, else (a moved condition) the hull width; casts keep the difference (a float
to an integer adds one); loads read the operand's differences (the largest over a data-dependent index
range, the hull width where the index itself moved); sums add the differences, max and min take the
largest. Comparisons, logic, bit operations, modulo, integer division, products of a reduction and
integer results that may wrap have no rule: their hull width bounds them. The bounds are computed in
float64 and widened by ``MARGIN`` per op for the rounding of the bound itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import ml_dtypes
import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import DOT_FTZ_BELOW, Call, Expr, IndexValue, Lit, Load, Reduce
from cuvil.ir.rulewalk import IxVal, RuleInfo, chunks, dyn_exprs
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from verify.probe import interval as I
from verify.probe.bounds import (
    FAST_PATH_MIN,
    GRID_BUDGET,
    BoundsEngine,
    IntervalWalker,
    OpContext,
    op_bounds,
    summed_products,
    value_facts,
)
from verify.probe.interval import Interval

MARGIN = 1.0 + 2.0 ** -40
"""Relative widening of each op's bound for the float64 rounding of the bound's own arithmetic."""

SourceBound = Callable[..., np.ndarray]
"""A source's bound from the hulls of its operands (one Interval each), broadcastable to the value."""

ZERO = np.zeros(())
ZERO.flags.writeable = False


# --------------------------------------------------------------------------------------
# a node's hull with its difference bound


class Spread(Interval):
    """An interval holding a node's value in both programs, with ``delta`` bounding their difference."""

    __slots__ = ("delta",)

    def __init__(self, hull: Interval, delta: np.ndarray) -> None:
        super().__init__(hull.lo, hull.hi, hull.nan)
        self.delta = np.asarray(delta, dtype=np.float64)


def delta_of(x: Interval) -> np.ndarray:
    """The difference bound a reader carries with ``x`` (0 for a plain interval: a shared value)."""
    return x.delta if isinstance(x, Spread) else ZERO


def settle(d: np.ndarray, hull: Interval) -> np.ndarray:
    """A difference bound checked against the hull holding both values: at most its width, infinite
    where it is unbounded or may be NaN; 0 stays 0 (both programs computed the same thing)."""
    with np.errstate(invalid="ignore"):
        width = hull.hi - hull.lo
    bad = hull.nan | ~np.isfinite(hull.lo) | ~np.isfinite(hull.hi)
    capped = np.where(bad, np.inf, np.minimum(np.where(np.isnan(d), np.inf, d), width))
    return np.where(d == 0, 0.0, capped)


def _gain(slope: Any, d: np.ndarray) -> np.ndarray:
    """``slope * d`` where an operand with difference 0 contributes 0 even at an infinite slope."""
    with np.errstate(all="ignore"):
        return np.where(d > 0, np.asarray(slope, dtype=np.float64) * d, 0.0)


def _mig(a: Interval) -> np.ndarray:
    """The smallest magnitude in each interval."""
    return np.where(I.contains_zero(a), 0.0, np.minimum(np.abs(a.lo), np.abs(a.hi)))


# --------------------------------------------------------------------------------------
# transfer rules: a bound on |f(x') - f(x)| from the operand hulls and differences (before rounding)


def _inverse_root(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.where(x > 0, 1.0 / np.sqrt(x), np.inf)


SLOPES: dict[str, Callable[[Interval, Interval], Any]] = {
    "neg": lambda a, out: 1.0, "abs": lambda a, out: 1.0, "sin": lambda a, out: 1.0, "cos": lambda a, out: 1.0,
    "exp": lambda a, out: np.exp(a.hi),
    "log": lambda a, out: np.where(a.lo > 0, 1.0 / np.where(a.lo > 0, a.lo, 1.0), np.inf),
    "tanh": lambda a, out: 1.0 / np.cosh(_mig(a)) ** 2,
    "erf": lambda a, out: 2.0 / math.sqrt(math.pi) * np.exp(-_mig(a) ** 2),
    "atan": lambda a, out: 1.0 / (1.0 + _mig(a) ** 2),
    "asinh": lambda a, out: _inverse_root(1.0 + _mig(a) ** 2),
    "sinh": lambda a, out: np.cosh(a.magnitude()),
    "cosh": lambda a, out: np.sinh(a.magnitude()),
    "asin": lambda a, out: _inverse_root(1.0 - a.magnitude() ** 2),
    "acos": lambda a, out: _inverse_root(1.0 - a.magnitude() ** 2),
    "atanh": lambda a, out: np.where(a.magnitude() < 1, 1.0 / (1.0 - a.magnitude() ** 2), np.inf),
    "acosh": lambda a, out: _inverse_root(np.where(a.lo > 1, a.lo ** 2 - 1.0, 0.0)),
    "tan": lambda a, out: 1.0 + out.magnitude() ** 2,
}
"""Smooth unary primitives: the largest ``|f'|`` over the operand hull ``a`` (``out``: the node's own hull)."""


def _quotient(a: Interval, b: Interval, da: np.ndarray, db: np.ndarray) -> np.ndarray:
    """``a/b - a'/b' = (a - a')/b + a'(b' - b)/(b b')``: finite only where the divisor hull excludes 0."""
    m = _mig(b)
    with np.errstate(all="ignore"):
        inv = np.where(m > 0, 1.0 / m, np.inf)
    return _gain(inv, da) + _gain(a.magnitude() * inv * inv, db)


def _root(a: Interval, d: np.ndarray) -> np.ndarray:
    """sqrt: ``d / (2 sqrt(lo))`` away from 0 and ``sqrt(d)`` (Hoelder) on nonnegative hulls."""
    with np.errstate(all="ignore"):
        holder = np.where(a.lo >= 0, np.sqrt(d), np.inf)
        return np.minimum(holder, _gain(0.5 * _inverse_root(a.lo), d))


def _power(a: Interval, b: Interval, da: np.ndarray, db: np.ndarray) -> np.ndarray:
    """``a ** b``: a constant exponent by cases (integer powers of any base, Hoelder for ``0 < p < 1``),
    else the partial derivatives ``b a^(b-1)`` and ``a^b log a`` over a positive base."""
    with np.errstate(all="ignore"):
        general = np.where(a.lo > 0, _gain(I.ipow(a, I.sub(b, Interval(1.0))).magnitude() * b.magnitude(), da)
                           + _gain(I.ipow(a, b).magnitude() * I.log(a).magnitude(), db), np.inf)
        if not (b.lo is b.hi and not np.any(db > 0)):
            return general
        p = b.lo
        whole = p == np.round(p)
        mag, mig = a.magnitude(), _mig(a)
        rising = _gain(np.abs(p) * mag ** (p - 1.0), da)
        holder = np.where(a.lo >= 0, da ** np.clip(p, 0.0, 1.0), np.inf)
        falling = np.where(mig > 0, _gain(np.abs(p) * mig ** (p - 1.0), da), np.inf)
        const = np.where(p >= 1, rising, np.where(p > 0, holder, falling))
        const = np.where(whole | (a.lo >= 0), const, np.inf)
        return np.where(p == 0, 0.0, np.minimum(const, general))


def _select(c: Interval, dc: np.ndarray, da: np.ndarray, db: np.ndarray) -> np.ndarray:
    """Where the condition hull decides the branch both programs take one branch; where it does not and
    the condition may differ, the branches may differ (the node's hull width bounds that)."""
    either = np.where(dc > 0, np.inf, np.maximum(da, db))
    return np.where(c.lo >= 1, da, np.where(c.hi <= 0, db, either))


def _cast(e: Call, d: np.ndarray) -> np.ndarray:
    """To a float type: the difference (its rounding comes on top); float to integer truncates, which
    moves by at most one more; integer to integer keeps it (wrap-around is checked on the hull)."""
    to, src = e.dtype, e.args[0].dtype
    if to is DType.bool:
        return np.full(np.shape(d), np.inf)
    if src.is_float and not to.is_float:
        return np.floor(d) + 1.0
    return d


def transfer(e: Call, args: list[Interval], ds: list[np.ndarray], out: Interval) -> np.ndarray:
    """A bound on the difference of one primitive's real result from its operands' hulls and
    differences; infinity where there is no rule (comparisons, logic, bits, modulo: the hull width
    then bounds it)."""
    fn = e.fn
    with np.errstate(all="ignore"):
        if fn in SLOPES:
            return _gain(SLOPES[fn](args[0], out), ds[0])
        if fn in ("add", "sub"):
            return ds[0] + ds[1]
        if fn in ("min", "max"):
            return np.maximum(ds[0], ds[1])
        if fn == "mul":
            return _gain(args[0].magnitude(), ds[1]) + _gain(args[1].magnitude(), ds[0])
        if fn == "div" and e.dtype.is_float:
            return _quotient(args[0], args[1], ds[0], ds[1])
        if fn == "sqrt":
            return _root(args[0], ds[0])
        if fn == "pow":
            return _power(args[0], args[1], ds[0], ds[1])
        if fn in ("floor", "ceil", "round_even"):
            return np.floor(ds[0]) + 1.0
        if fn == "select":
            return _select(args[0], ds[0], ds[1], ds[2])
        if fn == "cast":
            return _cast(e, ds[0])
    return np.full(np.broadcast_shapes(*(np.shape(d) for d in ds)), np.inf)


def _cast_rounds(src: DType, to: DType, a: Interval) -> bool:
    """Whether converting values of ``a`` from ``src`` to the float type ``to`` may round."""
    if src is to or src is DType.bool:
        return False
    t = ml_dtypes.finfo(to.np)
    if not src.is_float:
        return not bool(np.all(a.magnitude() < 2.0 ** (int(t.nmant) + 1)))
    s = ml_dtypes.finfo(src.np)
    return not (t.nmant >= s.nmant and t.maxexp >= s.maxexp and t.minexp - t.nmant <= s.minexp - s.nmant)


def both_roundings(dtype: DType, magnitude: Any, units: float, absolute: float = 1.0) -> np.ndarray:
    """What rounding to ``dtype`` adds to a difference: each program's result moves by at most ``units``
    roundoffs of the magnitude plus ``absolute`` smallest subnormals."""
    u, tiny = I.unit_roundoff(dtype), I.smallest_subnormal(dtype)
    return 2.0 * (units * u * np.asarray(magnitude, dtype=np.float64) + absolute * tiny)


# --------------------------------------------------------------------------------------
# the difference reader of a rule


class DiffWalker(IntervalWalker):
    """The interval reader of a rule whose every node also carries a difference bound (a
    :class:`Spread`): operands are read with their hulls and differences, each node's hull is the
    interval reader's and its difference follows :func:`transfer` plus both programs' rounding."""

    def __init__(self, info: RuleInfo, hulls: list[Interval], deltas: list[np.ndarray], in_dtypes: list[DType],
                 chunk: tuple[int, int, int] | None = None, tighten: bool = True) -> None:
        super().__init__(info, hulls, in_dtypes, {}, chunk, tighten)
        self.deltas = [Interval(d) for d in deltas]
        self.moved = [bool(np.any(d > 0)) for d in deltas]

    def lift(self, v: Interval) -> Interval:
        return Spread(super().lift(v), self.lift_array(delta_of(v)))

    def literal(self, e: Lit) -> Interval:
        return Spread(super().literal(e), ZERO)

    def index_value(self, e: IndexValue, ix: IxVal) -> Interval:
        hull = super().index_value(e, ix)
        return Spread(hull, self._reindexed(dyn_exprs(e.ix), hull, ZERO))

    def load(self, e: Load, idx: list[IxVal]) -> Interval:
        hull = super().load(e, idx)
        d = self._load_delta(e, idx) if self.moved[e.operand] else ZERO
        return Spread(hull, self._reindexed([x for i in e.index for x in dyn_exprs(i)], hull, d))

    def _load_delta(self, e: Load, idx: list[IxVal]) -> np.ndarray:
        """The operand's differences where the load reads (over a range of data-dependent indices: the
        largest); out of range both programs read the same padding value. The interval reader's own load
        reads the differences as point intervals."""
        hulls = self.operands
        self.operands = self.deltas
        try:
            return IntervalWalker.load(self, replace(e, oob=None if e.oob is None else 0), idx).hi
        finally:
            self.operands = hulls

    def _reindexed(self, index_exprs: list[Expr], hull: Interval, d: np.ndarray) -> np.ndarray:
        """Where an index read from data may differ between the programs, the value read may be any in the
        hull (its width bounds the difference)."""
        moved: Any = False
        for x in index_exprs:
            moved = moved | (delta_of(self.expr(x)) > 0)
        if not np.any(moved):
            return d
        return np.where(moved, settle(np.full(np.shape(moved), np.inf), hull), d)

    def call(self, e: Call, args: list[Interval]) -> Interval:
        out = super().call(e, args)
        ds = [delta_of(a) for a in args]
        moved: Any = False
        for d in ds:
            moved = moved | (d > 0)
        if not np.any(moved):
            return Spread(out, ZERO)
        with np.errstate(all="ignore"):
            d = transfer(e, args, ds, out) + self._rounding(e, args, out)
        if e.dtype.is_int:  # a result that may wrap around is anywhere in the type's range
            lo, hi = I.type_range(e.dtype)
            d = np.where((out.lo <= lo) | (out.hi >= hi), np.inf, d)
        return Spread(out, settle(np.where(moved, d, 0.0), out))

    def _rounding(self, e: Call, args: list[Interval], out: Interval) -> Any:
        """Both programs' rounding of a node, as the interval reader widens it."""
        if not e.dtype.is_float:
            return 0.0
        if e.fn == "cast":
            return both_roundings(e.dtype, out.magnitude(), 1.0) if _cast_rounds(e.args[0].dtype, e.dtype,
                                                                                  args[0]) else 0.0
        if e.fn not in I.ROUNDING or self._exact_integer(e, out):
            return 0.0
        return both_roundings(e.dtype, out.magnitude(), 8.0 if e.fn in I.TRANSCENDENTAL else 2.0)

    def reduce(self, e: Reduce, body: Interval, axes: tuple[int, ...], extents: list[int]) -> Interval:
        out = super().reduce(e, body, axes, extents)
        db = delta_of(body)
        n = math.prod(extents)
        if n == 0 or not np.any(db > 0):
            return Spread(out, ZERO)
        target = list(np.broadcast_shapes(body.lo.shape, body.hi.shape, db.shape, (1,) * self.depth))
        for ax, m in zip(axes, extents, strict=True):
            target[ax] = m
        full = np.broadcast_to(db, tuple(target))
        moved = np.any(full > 0, axis=axes)
        with np.errstate(all="ignore"):
            if e.kind in ("max", "min"):
                d = np.max(full, axis=axes)
            elif e.kind == "sum":
                d = np.sum(full, axis=axes)
                if e.dtype.is_float:  # every step rounds in the sum's type (halves are widened first)
                    terms = np.sum(np.broadcast_to(body.magnitude(), tuple(target)), axis=axes)
                    d = d + 2.0 * I.gamma(n + 1, I.unit_roundoff(e.dtype)) * terms + both_roundings(
                        e.dtype, out.magnitude(), 1.0)
                elif e.dtype.is_int:
                    lo, hi = I.type_range(e.dtype)
                    d = np.where((out.lo <= lo) | (out.hi >= hi), np.inf, d)
            else:  # products: no rule
                d = np.full(moved.shape, np.inf)
        return Spread(out, settle(np.where(moved, d, 0.0), out))

    def reduce_dot(self, e: Reduce, x: Interval, y: Interval, axes: tuple[int, ...], extents: list[int]) -> Interval:
        """Each term moves by ``|x| d(y) + |y| d(x)`` (the hulls hold both programs' factors; a flushed factor
        moves by less than the smallest normal more); both programs' sums round each step once and
        ``dot_ftz`` flushes each running sum, by less than the smallest normal."""
        out = super().reduce_dot(e, x, y, axes, extents)
        dx, dy = delta_of(x), delta_of(y)
        n = math.prod(extents)
        if n == 0 or not (np.any(dx > 0) or np.any(dy > 0)):
            return Spread(out, ZERO)
        tiny = DOT_FTZ_BELOW if e.kind == "dot_ftz" else 0.0
        with np.errstate(all="ignore"):
            mx, my = x.magnitude() + tiny, y.magnitude() + tiny
            term = mx * (dy + tiny) + my * (dx + tiny)
            moved_terms = (dx > 0) | (dy > 0)
            target = list(np.broadcast_shapes(np.shape(term), np.shape(moved_terms), (1,) * self.depth))
            for ax, m in zip(axes, extents, strict=True):
                target[ax] = m
            moved = np.any(np.broadcast_to(moved_terms, tuple(target)), axis=axes)
            d = np.sum(np.broadcast_to(term, tuple(target)), axis=axes)
            mags = np.sum(np.broadcast_to(mx * my, tuple(target)), axis=axes)
            d = d + 2.0 * (I.gamma(n + 1, I.unit_roundoff(e.dtype)) * mags + n * tiny) + both_roundings(
                e.dtype, out.magnitude(), 1.0)
        return Spread(out, settle(np.where(moved, d, 0.0), out))


# --------------------------------------------------------------------------------------
# one op


def _walk_difference(ctx: OpContext, hulls: list[Interval], deltas: list[np.ndarray], budget: int,
                     tighten: bool) -> np.ndarray:
    """The difference bound of an op's result, its rule read block by block."""
    parts: list[np.ndarray] = []
    axis = 0
    for ch in chunks(ctx.info, budget):
        w = DiffWalker(ctx.info, hulls, deltas, ctx.in_dtypes, ch, tighten)
        with np.errstate(all="ignore"):
            res = w.expr(ctx.info.rule)
        parts.append(np.broadcast_to(delta_of(res), w.block_shape))
        if ch is not None:
            axis = ch[0]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _contract(ctx: OpContext, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The op's own fast path on two nonnegative float64 operands (in the rule's operand order)."""
    assert ctx.pair is not None
    args: list[Any] = [None, None]
    args[ctx.pair[0].operand], args[ctx.pair[1].operand] = x, y
    with np.errstate(all="ignore"):
        return np.asarray(evaluate_op(get_op(ctx.op), args, ctx.attrs, TensorType(DType.f64, ctx.info.out_shape)),
                          dtype=np.float64)


def _bilinear_difference(ctx: OpContext, hulls: list[Interval], deltas: list[np.ndarray],
                         out: Interval) -> np.ndarray | None:
    """``|sum_k a_k b_k - a'_k b'_k| <= sum_k |a_k| d(b_k) + |b'_k| d(a_k)`` through the op's fast path, plus
    both programs' rounding: of the products and the sum in the accumulator's type, then of the result."""
    pair = ctx.pair
    dt = ctx.out_type.dtype
    if pair is None or pair[0].operand == pair[1].operand or len(hulls) != 2 or not dt.is_float:
        return None
    ia, ib = pair[0].operand, pair[1].operand
    shapes = [tuple(int(d) for d in s) for s in vars(ctx.info)["operand_shapes"]]
    mags = [np.broadcast_to(h.magnitude(), s) for h, s in zip(hulls, shapes, strict=True)]
    ds = [np.broadcast_to(d, s) for d, s in zip(deltas, shapes, strict=True)]
    d = np.zeros(ctx.info.out_shape)
    if np.any(ds[ib] > 0):
        d = d + _contract(ctx, mags[ia], ds[ib])
    if np.any(ds[ia] > 0):
        d = d + _contract(ctx, ds[ia], mags[ib])
    rule = summed_products(ctx.info)
    n = math.prod(int(x) for _, x in rule.axes)
    acc = rule.dtype if rule.dtype.is_float else dt
    summed = I.gamma(n + 1, I.unit_roundoff(acc)) * _contract(ctx, mags[ia], mags[ib]) + n * I.smallest_subnormal(acc)
    return np.where(d > 0, d + 2.0 * summed + both_roundings(dt, out.magnitude(), 2.0), 0.0)


def op_difference(ctx: OpContext, hulls: list[Interval], deltas: list[np.ndarray], out: Interval, *,
                  budget: int = GRID_BUDGET, tighten: bool = True, fast_path_min: int = FAST_PATH_MIN) -> np.ndarray:
    """The difference bound of one op's result from its operands' hulls and differences (``out``: the op's
    hull; the bound is not yet checked against it: see :func:`settle`)."""
    if ctx.pair is not None and ctx.info.grid >= fast_path_min:
        fast = _bilinear_difference(ctx, hulls, deltas, out)
        if fast is not None:
            return fast
    return _walk_difference(ctx, hulls, deltas, budget, tighten)


# --------------------------------------------------------------------------------------
# a whole function


@dataclass
class DifferenceBounds:
    """Per value: a bound on ``|v' - v|`` per element (broadcastable to the value) and an interval
    holding both ``v`` and ``v'``, for inputs in the box on which both programs stay finite."""

    values: dict[Value, np.ndarray]
    hulls: dict[Value, Interval]
    results: tuple[Value, ...]

    def output(self, k: int = 0) -> np.ndarray:
        """The bound at the ``k``-th result of the function, at the result's shape."""
        v = self.results[k]
        return np.broadcast_to(self.values[v], tuple(int(d) for d in v.shape))


def difference_bounds(fn: Function, constants: Mapping[str, np.ndarray], ranges: Mapping[str, tuple[Any, Any]],
                      sources: Mapping[Value, SourceBound], *, tighten: bool = True, budget: int = GRID_BUDGET,
                      fast_path_min: int = FAST_PATH_MIN) -> DifferenceBounds:
    """Bounds on ``|P'(x) - P(x)|`` at every value of ``fn`` (``P``) for inputs with ``lo <= x <= hi``
    (``ranges[name] = (lo, hi)``, broadcast to the input), where ``P'`` may move each value ``v`` in
    ``sources`` by up to ``sources[v](*operand_hulls)`` from what its op computes on ``P'``'s operands."""
    engine = BoundsEngine(fn, constants, tighten=tighten)
    program = engine.run(ranges).values
    run = _Run(engine, program, sources, tighten, budget, fast_path_min)
    for v in engine.values:
        run.visit(v)
    return DifferenceBounds(run.deltas, run.hulls, fn.results)


@dataclass
class _Run:
    """One pass over a function's values, operands first: the hull and difference of each value so far."""

    engine: BoundsEngine
    program: Mapping[Value, Interval]
    sources: Mapping[Value, SourceBound]
    tighten: bool
    budget: int
    fast_path_min: int
    deltas: dict[Value, np.ndarray] = field(default_factory=dict)
    hulls: dict[Value, Interval] = field(default_factory=dict)
    moved: set[Value] = field(default_factory=set)

    def visit(self, v: Value) -> None:
        source = self.sources.get(v)
        moved = [o for o in v.operands if o in self.moved]
        if source is None and not moved:
            self.hulls[v], self.deltas[v] = self.program[v], ZERO
            return
        shape = tuple(int(d) for d in v.shape)
        operands = [self.hulls[o] for o in v.operands]
        hull, d = self._op(v, operands) if moved else (self.program[v], np.zeros(shape))
        if source is not None:
            hull, d = _moved_by(v, hull, d, np.broadcast_to(np.asarray(source(*operands), dtype=np.float64), shape))
        p = self.program[v]
        with np.errstate(invalid="ignore"):
            hull = hull.intersect(p.lo - d, p.hi + d)
        self.hulls[v], self.deltas[v] = hull, np.array(np.broadcast_to(d, shape))
        if np.any(d > 0):
            self.moved.add(v)

    def _op(self, v: Value, operands: list[Interval]) -> tuple[Interval, np.ndarray]:
        """An op with a moved operand: its hull over the operand hulls and its difference bound."""
        ctx = OpContext.of(v)
        vars(ctx.info)["operand_integral"] = [self.engine.integral(o) if o not in self.moved else not o.dtype.is_float
                                              for o in v.operands]
        constant = [o not in self.engine.live and o not in self.moved for o in v.operands]
        ob = op_bounds(ctx, operands, constant, budget=self.budget, tighten=self.tighten,
                       fast_path_min=self.fast_path_min)
        if self.tighten and not any(o in self.sources for o in v.operands):
            ob = value_facts(v, ob, self.hulls)
        deltas = [np.broadcast_to(self.deltas[o], tuple(int(d) for d in o.shape)) for o in v.operands]
        d = op_difference(ctx, operands, deltas, ob.value, budget=self.budget, tighten=self.tighten,
                          fast_path_min=self.fast_path_min)
        return ob.value.clamp_finite(v.dtype), settle(d * MARGIN, ob.value)


def _moved_by(v: Value, hull: Interval, d: np.ndarray, s: np.ndarray) -> tuple[Interval, np.ndarray]:
    """A source's hull and difference: ``P'`` may take any value within ``s`` of what its op computes."""
    if not np.all(s >= 0):
        raise ValueError(f"the bound of source {v!r} is negative or NaN")
    return Interval(hull.lo - s, hull.hi + s, hull.nan).clamp_finite(v.dtype), d + s
