"""Sound bounds for every value of a CIR function over an input box.

The analysis reads each op's compute rule with interval semantics (:mod:`.interval`), so
every catalogue op is covered by one evaluator: loads read the operand's per-element bounds
(a data-dependent index reads the hull of the range it can take), primitive calls use the
interval rule of the primitive, reductions combine the body's bounds over the reduced axes.
Three relational facts of normalized patterns tighten what intervals alone lose, each sound
in floating point:

* ``x[i] - max_k x[k] <= 0`` when ``i`` ranges over the same axis (softmax's shift);
* ``sum_k exp(x[k] - max_j x[j]) >= 1`` (one term is ``exp(0) = 1``);
* ``|x[i] - m| / sqrt(sum_k (x[k] - m)^2 / n + eps) <= sqrt(n)`` for any ``m`` and ``eps > 0``
  (layer norm's normalized value; rounding adds a relative ``O(n u)``).

Reductions that are sums of products of two loads (matmul, conv, einsum pairs) are bilinear:
their bounds come from the op's own fast path in midpoint-radius form,
``F(c_a, c_b) +- (F(|c_a|, r_b) + F(r_a, |c_b|) + F(r_a, r_b))``, exact for a constant
operand. Each bound holds for the value the float program computes: every rounding result
is widened by its rounding error and magnitudes that round to infinity become infinite.

A value's bound as its consumers see it is clamped to its type's finite range: each site
is judged on its own, so a verdict holds on inputs for which no earlier site overflows,
and "every site proved safe" means the whole program stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.module import Function
from cuvil.ir.numpy_prims import float64_sums_in_any_order
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import DOT_FTZ_BELOW, Call, Expr, IndexValue, Ix, Lit, Load, Reduce, reduction_identity
from cuvil.ir.rulewalk import IxVal, RuleInfo, RuleWalker, chunks
from cuvil.ir.specialize import bind_attr
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from cuvil.passes.decompose import normalized_ratio
from verify.probe import interval as I
from verify.probe.block_pairs import PairAllowance
from verify.probe.centered import CenteredWindows, Centers
from verify.probe.interval import Interval
from verify.probe.normalized import guarded_ratio, ratio_bound
from verify.probe.norms import RowNorms
from verify.probe.program import SiteSpec
from verify.probe.windows import WindowNorms

GRID_BUDGET = 1 << 22
"""Largest evaluation grid (output elements x reduced terms) one block of a rule may use."""

RULE_FALLBACK_MAX = 1 << 22
"""Largest grid a bilinear op is re-read at, term by term, when its fast-path bound fails."""

FAST_PATH_MIN = 1 << 15
"""Grids at least this large use a bilinear op's fast path instead of the rule."""


# --------------------------------------------------------------------------------------
# records


@dataclass
class NodeRecord:
    """The extreme bounds one watched rule node took over all output elements."""

    node: int
    label: str
    spec: SiteSpec
    lo: float = math.inf
    hi: float = -math.inf
    nan: bool = False
    worst: tuple[int, ...] | None = None
    worst_score: float = -math.inf

    @property
    def safe(self) -> bool:
        return not self.nan and self.lo >= self.spec.lo and self.hi <= self.spec.hi

    @property
    def excess(self) -> float:
        """How far the bound leaves the allowed range (<= 0 when inside)."""
        return max(self.spec.lo - self.lo, self.hi - self.spec.hi)

    def merge(self, other: NodeRecord) -> None:
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)
        self.nan = self.nan or other.nan
        if other.worst_score > self.worst_score:
            self.worst, self.worst_score = other.worst, other.worst_score


@dataclass
class OpBounds:
    """One op's output bound (before clamping: may hold infinities) and its watched nodes."""

    value: Interval
    records: dict[int, NodeRecord] = field(default_factory=dict)
    method: str = "rule"

    @property
    def safe(self) -> bool:
        return all(r.safe for r in self.records.values())


# --------------------------------------------------------------------------------------
# the interval reader of a rule


class IntervalWalker(RuleWalker[Interval]):
    """Reads a rule with interval semantics; records the watched nodes."""

    def __init__(self, info: RuleInfo, operands: list[Interval], in_dtypes: list[DType],
                 watch: Mapping[int, SiteSpec], chunk: tuple[int, int, int] | None = None,
                 tighten: bool = True) -> None:
        super().__init__(info, chunk)
        self.operands = operands
        self.in_dtypes = in_dtypes
        self.watch = watch
        self.tighten = tighten
        self.records: dict[int, NodeRecord] = {}
        self.pre: dict[int, Interval] = {}

    def lift(self, v: Interval) -> Interval:
        return v.lift(self.depth)

    # leaves -------------------------------------------------------------------------
    def literal(self, e: Lit) -> Interval:
        return Interval.of(np.asarray(np.array(e.value, dtype=e.dtype.np), dtype=np.float64))

    def index_value(self, e: IndexValue, ix: IxVal) -> Interval:
        if ix.concrete:
            return Interval(ix.lo.astype(np.float64))
        return Interval(ix.lo.astype(np.float64), ix.hi.astype(np.float64))

    def dyn_index(self, e: Expr) -> IxVal:
        v = self.expr(e)
        lo = np.trunc(np.where(np.isfinite(v.lo), v.lo, -2.0 ** 62)).astype(np.int64)
        if v.lo is v.hi:
            return IxVal.exact(lo)
        hi = np.trunc(np.where(np.isfinite(v.hi), v.hi, 2.0 ** 62)).astype(np.int64)
        if np.array_equal(lo, hi):
            return IxVal.exact(lo)
        return IxVal(lo, hi)

    def load(self, e: Load, idx: list[IxVal]) -> Interval:
        src = self.operands[e.operand]
        lo, hi = src.lo, src.hi
        nan_src = np.broadcast_to(src.nan, lo.shape) if src.nan.any() else None
        if not idx:
            return Interval(lo, hi, src.nan) if lo is not hi or nan_src is not None else Interval(lo)
        oob_maybe = np.zeros((1,) * self.depth, dtype=bool)
        exact: list[np.ndarray] = []
        for k, i in enumerate(idx):
            n = lo.shape[k]
            if i.concrete:
                exact.append(i.lo)
                continue
            a, b = int(np.min(i.lo)), int(np.max(i.hi))
            oob_maybe = oob_maybe | (i.lo < 0) | (i.hi > n - 1)
            a, b = max(a, 0), min(b, n - 1)
            if a > b:
                a, b = 0, n - 1
            sl = [slice(None)] * lo.ndim
            sl[k] = slice(a, b + 1)
            lo = np.min(lo[tuple(sl)], axis=k, keepdims=True)
            hi = np.max(hi[tuple(sl)], axis=k, keepdims=True)
            if nan_src is not None:
                nan_src = np.any(nan_src[tuple(sl)], axis=k, keepdims=True)
            exact.append(np.zeros((1,) * self.depth, dtype=np.int64))
        inb = np.ones((1,) * self.depth, dtype=bool)
        for k, i in enumerate(exact):
            inb = inb & (i >= 0) & (i < lo.shape[k])
        clipped = tuple(np.clip(i, 0, max(lo.shape[k] - 1, 0)) for k, i in enumerate(exact))
        vlo = lo[clipped]
        vhi = vlo if src.lo is src.hi and lo is hi else hi[clipped]
        if e.oob is not None:
            fill = float(np.array(e.oob, dtype=e.dtype.np))
            out = ~inb
            if np.any(out):
                vlo, vhi = np.where(out, fill, vlo), np.where(out, fill, vhi)
            if np.any(oob_maybe):
                vlo, vhi = np.where(oob_maybe, np.minimum(vlo, fill), vlo), np.where(oob_maybe,
                                                                                      np.maximum(vhi, fill), vhi)
        nan = False
        if nan_src is not None:
            nan = nan_src[clipped]
            if e.oob is not None:
                nan = nan & inb
        if vlo is vhi and nan is False:
            return Interval(vlo)
        return Interval(vlo, vhi, nan)

    # calls and reductions -----------------------------------------------------------
    def call(self, e: Call, args: list[Interval]) -> Interval:
        attrs = dict(e.attrs)
        arg_dtypes = [a.dtype for a in e.args]
        if all(a.point for a in args) and e.fn != "bitcast":  # bitcast: a float64 point may have lost bits
            return Interval(I.concrete(e.fn, [a.lo for a in args], e.dtype, attrs, arg_dtypes))
        if e.fn == "mul" and e.args[0] is e.args[1]:
            out = I.square(args[0])
        else:
            out = I.apply(e.fn, args, e.dtype, attrs, arg_dtypes)
        if self.tighten:
            out = self._relational(e, out)
        if id(e) in self.watch_ids:  # a node is judged before its own rounding (or wrap-around)
            self.pre[id(e)] = args[0] if e.fn == "cast" and e.dtype.is_float else out
        if e.fn in I.ROUNDING and not self._exact_integer(e, out):
            out = I.round_to(out, e.dtype, 8.0 if e.fn in I.TRANSCENDENTAL else 2.0)
            if self.tighten:
                out = self._relational(e, out)
        elif not e.dtype.is_float and e.dtype is not DType.bool and e.fn in ("neg", "abs"):
            out = I.wrap(out, e.dtype)
        return out

    def reduce(self, e: Reduce, body: Interval, axes: tuple[int, ...], extents: list[int]) -> Interval:
        n = math.prod(extents)
        target = list(np.broadcast_shapes(body.lo.shape, body.hi.shape, (1,) * self.depth))
        for ax, m in zip(axes, extents, strict=True):
            target[ax] = m
        shape = tuple(target)
        lo = np.broadcast_to(body.lo, shape)
        hi = np.broadcast_to(body.hi, shape)
        if body.nan.ndim:
            nan = np.any(np.broadcast_to(body.nan, np.broadcast_shapes(body.nan.shape, shape)), axis=axes)
        else:
            nan = body.nan
        dt = e.dtype
        if n == 0:
            return Interval(np.full(lo.shape[:axes[0]], float(reduction_identity(e.kind, dt))))
        if e.kind in ("max", "min"):
            f = np.max if e.kind == "max" else np.min
            return Interval(f(lo, axis=axes), f(hi, axis=axes), nan)
        if e.kind == "sum":
            out = self._sum(e, lo, hi, nan, axes, n)
            if self.tighten and self._softmax_denominator(e):
                out = out.intersect(1.0, np.inf)
                if id(e) in self.pre:
                    self.pre[id(e)] = self.pre[id(e)].intersect(1.0, np.inf)
            return out
        return self._product(e, Interval(lo, hi, nan), axes, n)

    def _sum(self, e: Reduce, lo: np.ndarray, hi: np.ndarray, nan: np.ndarray, axes: tuple[int, ...], n: int,
             flushed: float = 0.0) -> Interval:
        """A sequential sum of terms in ``[lo, hi]`` (broadcast over the reduced ``axes``), each step rounded
        in ``e``'s dtype and moved by at most ``flushed`` more (a flush to zero)."""
        dt = e.dtype
        with np.errstate(invalid="ignore"):
            slo, shi = I._fix(np.sum(lo, axis=axes), np.sum(hi, axis=axes))
        pos_inf = np.any(hi == np.inf, axis=axes) & np.any(lo == -np.inf, axis=axes)
        out = Interval(slo, shi, nan | pos_inf)
        if dt.is_float:  # a float sum rounds every step in its own type (halves are widened first)
            mag = np.sum(np.maximum(np.abs(lo), np.abs(hi)), axis=axes)
            extra = (n + 1) * I.unit_roundoff(dt) * mag + n * flushed
            nonneg, nonpos = np.all(lo >= 0, axis=axes), np.all(hi <= 0, axis=axes)
            pre = Interval(np.where(nonneg, np.maximum(out.lo - extra, 0.0), out.lo - extra),
                           np.where(nonpos, np.minimum(out.hi + extra, 0.0), out.hi + extra), out.nan)
            if id(e) in self.watch_ids:
                self.pre[id(e)] = pre
            return I.round_to(pre, dt, 1.0)
        if id(e) in self.watch_ids:
            self.pre[id(e)] = out
        return I.wrap(out, dt)

    def reduce_dot(self, e: Reduce, x: Interval, y: Interval, axes: tuple[int, ...],
                   extents: list[int]) -> Interval:
        """Exact products summed with one rounding per step (fewer than a sum of rounded products, so
        the sum's bound holds); ``dot_ftz`` reads a factor near zero as possibly zero and moves each
        running sum by less than the smallest normal."""
        tiny = 0.0
        if e.kind == "dot_ftz":
            tiny = DOT_FTZ_BELOW
            x, y = (Interval(np.where((v.lo < tiny) & (v.hi > -tiny), np.minimum(v.lo, 0.0), v.lo),
                             np.where((v.lo < tiny) & (v.hi > -tiny), np.maximum(v.hi, 0.0), v.hi), v.nan)
                    for v in (x, y))
        p = I.round_to(I.mul(x, y), DType.f64, 1.0)  # (the bound's own float64 products, rounded outward)
        n = math.prod(extents)
        shape = list(np.broadcast_shapes(p.lo.shape, p.hi.shape, (1,) * self.depth))
        for ax, m in zip(axes, extents, strict=True):
            shape[ax] = m
        lo, hi = np.broadcast_to(p.lo, tuple(shape)), np.broadcast_to(p.hi, tuple(shape))
        nan = np.any(np.broadcast_to(p.nan, np.broadcast_shapes(np.shape(p.nan), tuple(shape))), axis=axes) \
            if np.ndim(p.nan) else p.nan
        if n == 0:
            return Interval(np.zeros(lo.shape[:axes[0]]))
        return self._sum(e, lo, hi, nan, axes, n, tiny)

    def _product(self, e: Reduce, body: Interval, axes: tuple[int, ...], n: int) -> Interval:
        lead = body.lo.shape[:axes[0]]
        lo = body.lo.reshape((*lead, n))
        hi = body.hi.reshape((*lead, n))
        acc = Interval(lo[..., 0], hi[..., 0])
        for k in range(1, n):
            acc = I.mul(acc, Interval(lo[..., k], hi[..., k]))
        acc = Interval(acc.lo, acc.hi, np.asarray(body.nan) if body.nan.ndim == 0 else body.nan)
        return I.round_to(acc, e.dtype, float(n + 1)) if e.dtype.is_float else I.wrap(acc, e.dtype)

    # relational facts ---------------------------------------------------------------
    def _exact_integer(self, e: Call, out: Interval) -> bool:
        """Sums, differences and products of integer-valued floats are exact while they stay below
        2^(mantissa bits + 1) (requantization adds zero points to rounded values this way)."""
        if e.fn not in ("add", "sub", "mul") or not e.dtype.is_float or not integral(e, self.info):
            return False
        limit = 2.0 ** (I.ml_dtypes.finfo(e.dtype.np).nmant + 1)
        return bool(np.all(np.abs(out.lo) < limit) and np.all(np.abs(out.hi) < limit))

    def _relational(self, e: Call, out: Interval) -> Interval:
        facts = self.info.__dict__.setdefault("facts", {})
        if id(e) not in facts:
            fact = None
            if e.fn == "sub" and max_shift(e, self.info) is not None:
                fact = (-np.inf, 0.0)
            elif e.fn == "div":
                bound = normalized_bound(e, self.info)
                fact = None if bound is None else (-bound, bound)
            facts[id(e)] = fact
        fact = facts[id(e)]
        return out if fact is None else out.intersect(*fact)

    def _softmax_denominator(self, e: Reduce) -> bool:
        if len(e.axes) != 1 or not isinstance(e.body, Call) or e.body.fn != "exp":
            return False
        inner = e.body.args[0]
        if not isinstance(inner, Call) or inner.fn != "sub":
            return False
        j = max_shift(inner, self.info)
        if j is None:
            return False
        a = _exact_load(inner.args[0])
        assert isinstance(a, Load)
        return a.index[j] == Ix.var(e.axes[0][0])

    # records ------------------------------------------------------------------------
    @property
    def watch_ids(self) -> set[int]:
        ids = getattr(self, "_watch_ids", None)
        if ids is None:
            ids = self._watch_ids = {id(self.info.nodes[k]) for k in self.watch}
        return ids

    def observe(self, e: Expr, value: Interval) -> None:
        spec = self.watch.get(self.info.index.get(id(e), -1))
        if spec is None:
            return
        k = self.info.index[id(e)]
        pre = self.pre.pop(id(e), None)
        if pre is not None:  # judged before its own rounding: a value below the limit stays finite
            value = Interval(pre.lo, pre.hi, value.nan)
        rec = NodeRecord(k, self.info.label(e), spec)
        lo, hi = value.lo, value.hi
        rec.lo = float(np.min(lo)) if lo.size else math.inf
        rec.hi = float(np.max(hi)) if hi.size else -math.inf
        rec.nan = bool(np.any(value.nan))
        shape = np.broadcast_shapes(lo.shape, hi.shape)
        if shape and math.prod(shape):
            score = np.maximum(spec.lo - np.broadcast_to(lo, shape), np.broadcast_to(hi, shape) - spec.hi)
            flat = int(np.argmax(score))
            rec.worst_score = float(score.reshape(-1)[flat])
            where = np.unravel_index(flat, shape)[:self.out_rank]
            worst = [int(x) for x in where] + [0] * (self.out_rank - len(where))
            if self.chunk is not None:
                worst[self.chunk[0]] += self.chunk[1]
            rec.worst = tuple(worst)
        old = self.records.get(k)
        if old is None:
            self.records[k] = rec
        else:
            old.merge(rec)


# --------------------------------------------------------------------------------------
# rule patterns


def integral(e: Expr, info: RuleInfo) -> bool:
    """Whether a node only takes integer values (rounded, cast from an integer, integer literals,
    and sums, differences, products, min/max and selects of those)."""
    cache = info.__dict__.setdefault("integral", {})
    hit = cache.get(id(e))
    if hit is None:
        if isinstance(e, Lit):
            hit = float(e.value) == int(e.value) if not isinstance(e.value, bool) else True
        elif isinstance(e, Load):
            known = getattr(info, "operand_integral", ())
            hit = not e.dtype.is_float or (e.operand < len(known) and known[e.operand])
        elif isinstance(e, Call) and e.fn in ("round_even", "floor", "ceil"):
            hit = True
        elif isinstance(e, Call) and e.fn == "cast":
            hit = not e.args[0].dtype.is_float or integral(e.args[0], info)
        elif isinstance(e, Call) and e.fn in ("add", "sub", "mul", "neg", "abs", "min", "max"):
            hit = all(integral(a, info) for a in e.args)
        elif isinstance(e, Call) and e.fn == "select":
            hit = integral(e.args[1], info) and integral(e.args[2], info)
        else:
            hit = not e.dtype.is_float
        cache[id(e)] = hit
    return hit


def _same_operand(a: Load, b: Load) -> bool:
    return a.operand == b.operand and a.oob == b.oob and len(a.index) == len(b.index)


def _exact_load(e: Expr) -> Expr:
    """``e`` with a widening cast of a half-precision load removed (exact: the facts about the
    load hold for its widened value)."""
    if isinstance(e, Call) and e.fn == "cast" and e.dtype is DType.f32 and e.args[0].dtype in (DType.f16, DType.bf16):
        return e.args[0]
    return e


def max_shift(e: Call, info: RuleInfo) -> int | None:
    """``x[.., i, ..] - max_k x[.., k, ..]`` over a whole axis: the axis position, else None."""
    if e.fn != "sub" or len(e.args) != 2:
        return None
    a, m = _exact_load(e.args[0]), e.args[1]
    if not isinstance(a, Load) or not isinstance(m, Reduce) or m.kind != "max" or len(m.axes) != 1:
        return None
    b = _exact_load(m.body)
    if not isinstance(b, Load) or not _same_operand(a, b) or a.oob is not None:
        return None
    r = Ix.var(m.axes[0][0])
    diff = [k for k, (x, y) in enumerate(zip(a.index, b.index, strict=True)) if x != y]
    if len(diff) != 1 or b.index[diff[0]] != r:
        return None
    j = diff[0]
    if any(m.axes[0][0] in info.ix_free(x) for k, x in enumerate(b.index) if k != j):
        return None
    shape = _operand_shape(info, a.operand)
    if shape is None or int(m.axes[0][1]) != shape[j]:
        return None
    return j


def normalized_bound(e: Call, info: RuleInfo) -> float | None:
    """``(x[i] - m) / sqrt(sum_k (x[k] - m)^2 / n + eps)``: the bound ``sqrt(n) (1 + delta)``, else None."""
    if e.fn != "div":
        return None
    num, den = e.args
    if not (isinstance(num, Call) and num.fn == "sub" and isinstance(den, Call) and den.fn == "sqrt"):
        return None
    a, mean = num.args
    a = _half_uncast(a)  # a half layer_norm normalizes its widened input
    inner = den.args[0]
    if not (isinstance(a, Load) and a.oob is None and isinstance(inner, Call) and inner.fn == "add"):
        return None
    var, eps = inner.args
    if not (isinstance(eps, Lit) and float(np.array(eps.value, dtype=eps.dtype.np)) > 0):
        return None
    var = _half_uncast(var)
    if not (isinstance(var, Call) and var.fn == "div"):
        return None
    total, count = var.args
    square = _half_uncast(total.body) if isinstance(total, Reduce) else None
    if not (isinstance(count, Lit) and isinstance(total, Reduce) and total.kind == "sum"
            and isinstance(square, Call) and square.fn == "mul" and square.args[0] is square.args[1]):
        return None
    dev = square.args[0]
    if not (isinstance(dev, Call) and dev.fn == "sub" and dev.args[1] is mean):
        return None
    b = _half_uncast(dev.args[0])
    if not isinstance(b, Load):
        return None
    if not _same_operand(a, b):
        return None
    shape = _operand_shape(info, a.operand)
    if shape is None:
        return None
    names = {name: int(n) for name, n in total.axes}
    used: set[str] = set()
    for k, (x, y) in enumerate(zip(a.index, b.index, strict=True)):
        if x == y and not (info.ix_free(y) & set(names)):
            continue
        if y.kind != "var" or y.args[0] not in names or names[y.args[0]] != shape[k] or y.args[0] in used:
            return None
        used.add(y.args[0])
    if used != set(names):
        return None
    n = math.prod(names.values())
    if float(count.value) != float(n):
        return None
    u = I.unit_roundoff(e.dtype)
    acc = I.unit_roundoff(total.dtype)
    return math.sqrt(n) * (1.0 + 8.0 * u + (n + 2) * acc + 1e-12)


_HALF_WIDENINGS = ({DType.f16, DType.f32}, {DType.bf16, DType.f32})


def _half_uncast(e: Expr) -> Expr:
    """``e`` without a cast between a half type and f32 on top (a mean of halves is summed and
    divided in f32, then rounded once): the facts about the f32 value hold within that rounding."""
    if isinstance(e, Call) and e.fn == "cast" and {e.dtype, e.args[0].dtype} in _HALF_WIDENINGS:
        return e.args[0]
    return e


def _operand_shape(info: RuleInfo, k: int) -> tuple[int, ...] | None:
    shapes = getattr(info, "operand_shapes", None)
    return None if shapes is None or k >= len(shapes) else shapes[k]


def _uncast(e: Expr) -> Expr:
    """``e`` without a cast on top (halves widened to f32, or the sum rounded back)."""
    return e.args[0] if isinstance(e, Call) and e.fn == "cast" else e


def summed_products(info: RuleInfo) -> Reduce:
    """The sum of a bilinear rule, under the cast that rounds an f32 accumulation of halves."""
    r = _uncast(info.rule)
    assert isinstance(r, Reduce)
    return r


def bilinear(info: RuleInfo) -> tuple[Load, Load] | None:
    """``sum_k a[g(i, k)] * b[h(i, k)]`` (zero padding allowed; halves may be widened to f32 and the
    sum rounded once): the two loads, else None."""
    r = _uncast(info.rule)
    if not (isinstance(r, Reduce) and r.kind == "sum" and isinstance(r.body, Call) and r.body.fn == "mul"):
        return None
    a, b = (_uncast(x) for x in r.body.args)
    if not (isinstance(a, Load) and isinstance(b, Load)):
        return None
    if any(x.oob not in (None, 0, 0.0) for x in (a, b)):
        return None
    if any(i.kind == "dyn" or _has_dyn(i) for x in (a, b) for i in x.index):
        return None
    return a, b


def _has_dyn(i: Ix) -> bool:
    if i.kind == "dyn":
        return True
    if i.kind in ("var", "lit"):
        return False
    return _has_dyn(i.args[0]) or _has_dyn(i.args[1])


# --------------------------------------------------------------------------------------
# one op


Watch = Mapping[int, SiteSpec]


@dataclass
class OpContext:
    """What the analysis keeps per op across runs: its rule and the fast-path constants."""

    op: str
    attrs: dict[str, Any]
    in_dtypes: list[DType]
    out_type: TensorType
    info: RuleInfo
    watch: Watch
    pair: tuple[Load, Load] | None = None
    abs_sums: dict[int, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def of(v: Value, watch: Callable[[Value, RuleInfo], Watch] | None = None) -> OpContext:
        in_types = [TensorType(o.dtype, tuple(int(d) for d in o.shape)) for o in v.operands]
        out_type = TensorType(v.dtype, tuple(int(d) for d in v.shape))
        attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
        ctx = OpContext.make(v.op, in_types, attrs, out_type)
        if watch is not None:
            ctx.watch = watch(v, ctx.info)
        return ctx

    @staticmethod
    def make(op: str, in_types: list[TensorType], attrs: Mapping[str, Any], out_type: TensorType,
             watch: Watch | None = None) -> OpContext:
        opdef = get_op(op)
        full = opdef.check_attrs(attrs)
        info = RuleInfo.build(opdef.make_rule(in_types, full, out_type), [int(d) for d in out_type.shape])
        info.operand_shapes = [tuple(int(d) for d in t.shape) for t in in_types]  # type: ignore[attr-defined]
        pair = bilinear(info) if opdef.numpy is not None else None
        return OpContext(op, full, [t.dtype for t in in_types], out_type, info, dict(watch or {}), pair)


def op_bounds(ctx: OpContext, operands: list[Interval], constant: list[bool], *, budget: int = GRID_BUDGET,
              tighten: bool = True, fast_path_min: int = FAST_PATH_MIN) -> OpBounds:
    """The bound of one op's result (and of its watched nodes) given its operands' bounds."""
    grid = ctx.info.grid
    if ctx.pair is not None and grid >= fast_path_min:
        fast = _bilinear_bounds(ctx, operands, constant)
        if fast is not None and (fast.safe or grid > RULE_FALLBACK_MAX):
            return fast
        if fast is None and grid > RULE_FALLBACK_MAX:
            return _unbounded(ctx)
    in_dtypes = ctx.in_dtypes
    out_shape = ctx.info.out_shape
    parts: list[tuple[tuple[int, int, int] | None, Interval]] = []
    records: dict[int, NodeRecord] = {}
    with np.errstate(all="ignore"):
        for ch in chunks(ctx.info, budget):
            w = IntervalWalker(ctx.info, operands, in_dtypes, ctx.watch, ch, tighten)
            res = w.expr(ctx.info.rule)
            shape = w.block_shape
            res = Interval(np.broadcast_to(res.lo, shape), np.broadcast_to(res.hi, shape),
                           np.broadcast_to(res.nan, shape))
            parts.append((ch, res))
            for k, rec in w.records.items():
                if k in records:
                    records[k].merge(rec)
                else:
                    records[k] = rec
    if len(parts) == 1:
        out = parts[0][1]
    else:
        axis = parts[0][0][0] if parts[0][0] is not None else 0
        out = Interval(np.concatenate([p.lo for _, p in parts], axis=axis),
                       np.concatenate([p.hi for _, p in parts], axis=axis),
                       np.concatenate([p.nan for _, p in parts], axis=axis))
    out = Interval(np.array(np.broadcast_to(out.lo, out_shape)),
                   np.array(np.broadcast_to(out.hi, out_shape)),
                   np.array(np.broadcast_to(out.nan, out_shape)))
    return OpBounds(out, records, "rule")


def _unbounded(ctx: OpContext) -> OpBounds:
    """No bound (a product may overflow and the op is too large to read term by term)."""
    shape = ctx.info.out_shape
    out = Interval(np.full(shape, -np.inf), np.full(shape, np.inf), np.ones(shape, dtype=bool))
    records = {}
    for node, spec in ctx.watch.items():
        rec = NodeRecord(node, ctx.info.label(ctx.info.nodes[node]), spec, -np.inf, np.inf, True)
        rec.worst_score = np.inf
        records[node] = rec
    return OpBounds(out, records, "bilinear")


def _bilinear_bounds(ctx: OpContext, operands: list[Interval], constant: list[bool]) -> OpBounds | None:
    """Midpoint-radius bounds through the op's fast path (a schedule of its rule)."""
    opdef = get_op(ctx.op)
    attrs = ctx.attrs
    out_t = TensorType(DType.f64, ctx.info.out_shape)
    a_load, b_load = ctx.pair  # type: ignore[misc]
    if a_load.operand == b_load.operand or len(operands) != 2:
        return None
    ia, ib = a_load.operand, b_load.operand

    def F(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        args: list[Any] = [None, None]
        args[ia], args[ib] = x, y
        with np.errstate(all="ignore"), float64_sums_in_any_order():  # (the error terms below hold for any order)
            return np.asarray(evaluate_op(opdef, args, attrs, out_t), dtype=np.float64)

    A, B = operands[ia], operands[ib]
    ca, ra = (A.lo + A.hi) / 2, (A.hi - A.lo) / 2
    cb, rb = (B.lo + B.hi) / 2, (B.hi - B.lo) / 2
    center = F(ca, cb)
    rad = np.zeros_like(center)
    if np.any(rb):
        rad += F(np.abs(ca), rb)
    if np.any(ra):
        rad += F(ra, np.abs(cb))
    if np.any(ra) and np.any(rb):
        rad += F(ra, rb)
    mag_a, mag_b = A.magnitude(), B.magnitude()
    if constant[ib]:
        if ib not in ctx.abs_sums:
            ctx.abs_sums[ib] = F(np.ones_like(ca), np.abs(cb))
        mag = float(np.max(mag_a)) * ctx.abs_sums[ib]
    elif constant[ia]:
        if ia not in ctx.abs_sums:
            ctx.abs_sums[ia] = F(np.abs(ca), np.ones_like(cb))
        mag = float(np.max(mag_b)) * ctx.abs_sums[ia]
    else:
        mag = F(mag_a, mag_b)
    dt = ctx.out_type.dtype
    rule = summed_products(ctx.info)
    n = math.prod(int(x) for _, x in rule.axes)
    out = Interval(center - rad, center + rad)
    prod_bound = float(np.max(mag_a)) * float(np.max(mag_b)) if mag_a.size and mag_b.size else 0.0
    if dt.is_float:
        if prod_bound >= I.overflow_at(dt):
            return None
        acc = rule.dtype if rule.dtype.is_float else dt  # the type the rule's sum runs in
        # the sum's roundings (γ_{n+1}: n products and sums, whatever the order), the float64 evaluation of
        # the four products above (γ_{n+1} each, of at most mag), and the output's rounding
        err = (I.unit_roundoff(dt) + I.gamma(n + 1, I.unit_roundoff(acc)) + 4 * I.gamma(n + 1, 2.0 ** -53)) * mag \
            + n * I.smallest_subnormal(dt)
        pre = Interval(out.lo - err, out.hi + err)
        out = I.round_to(pre, dt, 2.0)
    else:
        if prod_bound > I.type_range(dt)[1]:
            return None
        pre = out
        out = I.wrap(out, dt)
    records: dict[int, NodeRecord] = {}
    body = rule.body
    for node, spec in ctx.watch.items():
        e = ctx.info.nodes[node]
        rec = NodeRecord(node, ctx.info.label(e), spec)
        if e is rule or e is ctx.info.rule:
            rec.lo, rec.hi = float(np.min(pre.lo)), float(np.max(pre.hi))
            score = np.maximum(spec.lo - pre.lo, pre.hi - spec.hi)
            flat = int(np.argmax(score))
            rec.worst, rec.worst_score = tuple(int(x) for x in np.unravel_index(flat, score.shape)), \
                float(score.reshape(-1)[flat])
        elif e is body:
            p = prod_bound * (1 + 2 * I.unit_roundoff(dt)) if dt.is_float else prod_bound
            rec.lo, rec.hi = -p, p
            rec.worst_score = max(spec.lo + p, p - spec.hi)
        else:
            return None
        records[node] = rec
    return OpBounds(out, records, "bilinear")


# --------------------------------------------------------------------------------------
# a whole function


@dataclass
class Bounds:
    """Per value: the bound its consumers see; per op: its raw bound and watched nodes."""

    values: dict[Value, Interval]
    ops: dict[Value, OpBounds]

    def hi(self, v: Value) -> float:
        return float(np.max(self.values[v].hi))

    def lo(self, v: Value) -> float:
        return float(np.min(self.values[v].lo))


class BoundsEngine:
    """Bounds of every value of ``fn`` for input boxes; rules, constant values and fast-path
    sums are computed once and reused across runs (bisection on the box scale)."""

    def __init__(self, fn: Function, constants: Mapping[str, np.ndarray],
                 watch: Callable[[Value, RuleInfo], Watch] | None = None, *, tighten: bool = True) -> None:
        self.fn = fn
        self.constants = constants
        self.watch = watch
        self.tighten = tighten
        self.values = fn.values()
        self.users = fn.users()
        self.live: set[Value] = set()
        for v in self.values:
            if v.is_param or any(o in self.live for o in v.operands):
                self.live.add(v)
        self.fixed: dict[Value, np.ndarray] = {}
        self.contexts: dict[Value, OpContext] = {}
        self.sigmas: dict[str, tuple[float, float]] = {}  # spectral norms of constant matrices (row norms)
        self.conv_sigmas: dict[Any, tuple[float, float]] = {}  # operator norms of convolutions (window norms)
        self.block_norms: dict[Any, float] = {}  # and of residual blocks (centered window norms)
        self.composed: dict[Any, np.ndarray] = {}  # two kernels' composed filters' norms (centered window norms)
        self.pairs = PairAllowance()  # what pairs of residual blocks may still take (centered window norms)
        self.norm_units = 0.0
        """Work units of the operator norms computed and not yet charged (:meth:`take_norm_units`)."""
        self._centers: tuple[Any, Centers] | None = None

    def context(self, v: Value) -> OpContext:
        ctx = self.contexts.get(v)
        if ctx is None:
            ctx = self.contexts[v] = OpContext.of(v, self.watch)
            ctx.info.operand_integral = [self.integral(o) for o in v.operands]  # type: ignore[attr-defined]
        return ctx

    def integral(self, v: Value) -> bool:
        """Whether every element of ``v`` is an integer (an integer type, or rounded in its rule)."""
        cache = self.__dict__.setdefault("_integral", {})
        hit = cache.get(v)
        if hit is None:
            if not v.dtype.is_float:
                hit = True
            elif v.is_param:
                hit = False
            elif v.is_const or v not in self.live:
                data = np.asarray(self.constant_value(v), dtype=np.float64)
                hit = bool(np.all(np.isfinite(data)) and np.all(data == np.round(data)))
            else:
                hit = integral(self.context(v).info.rule, self.context(v).info)
            cache[v] = hit
        return hit

    def constant_value(self, v: Value) -> np.ndarray:
        """The exact value of a value that depends on no input."""
        hit = self.fixed.get(v)
        if hit is not None:
            return hit
        if v.is_const:
            out = np.asarray(self.constants[v.const_hash])
        else:
            attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
            out_t = TensorType(v.dtype, tuple(int(d) for d in v.shape))
            out = evaluate_op(get_op(v.op), [self.constant_value(o) for o in v.operands], attrs, out_t)
        self.fixed[v] = out
        return out

    def run(self, boxes: Mapping[str, tuple[Any, Any]], pinned: Mapping[Value, Interval] | None = None,
            stop: Callable[[Value, OpBounds], bool] | None = None) -> Bounds:
        """Bounds for inputs with ``lo <= x <= hi`` (``boxes[name] = (lo, hi)``, broadcast to the input).
        ``pinned`` intersects values with other sound bounds (linear relaxations)."""
        values: dict[Value, Interval] = {}
        ops: dict[Value, OpBounds] = {}
        norms = RowNorms(self.constant_value, self.live, self.sigmas)
        for p in self.fn.params:
            lo, hi = boxes[p.name]
            shape = tuple(int(d) for d in p.shape)
            iv = Interval(np.broadcast_to(np.asarray(lo, dtype=np.float64), shape).copy(),
                          np.broadcast_to(np.asarray(hi, dtype=np.float64), shape).copy())
            values[p] = _snap(iv, p.dtype)
        windows = CenteredWindows(self.constant_value, self.live, self.conv_sigmas, self.centers(values),
                                  self.block_norms, self.composed, self.users, self.pairs)
        for v in self.values:
            if v.is_param:
                continue
            if v not in self.live:
                data = np.asarray(self.constant_value(v), dtype=np.float64)
                values[v] = Interval(data)
                continue
            ctx = self.context(v)
            operands = [values[o] for o in v.operands]
            constant = [o not in self.live for o in v.operands]
            ob = op_bounds(ctx, operands, constant, tighten=self.tighten)
            if self.tighten:
                ob = norm_facts(v, value_facts(v, ob, values, self.constant_value), values, norms)
                ob = window_facts(v, ob, values, windows)
            ops[v] = ob
            seen = ob.value.clamp_finite(v.dtype)
            if pinned is not None and v in pinned:
                seen = seen.intersect(pinned[v].lo, pinned[v].hi)
            values[v] = seen
            if stop is not None and stop(v, ob):
                break
        self.norm_units += windows.units
        return Bounds(values, ops)

    def centers(self, inputs: Mapping[Value, Interval]) -> Centers:
        """Every value at the inputs' midpoints (float inputs; the last center's values are kept, so a
        bisection on the box's scale around one center computes them once)."""
        mids = {}
        for p, iv in inputs.items():
            if p.dtype.is_float and not bool(np.any(iv.nan)):
                with np.errstate(all="ignore"):
                    mid = iv.lo / 2 + iv.hi / 2  # (no overflow; any point of the box is a center)
                if bool(np.all(np.isfinite(mid))):
                    mids[p] = np.clip(mid, iv.lo, iv.hi)
        key = tuple((p.name, m.tobytes()) for p, m in mids.items())
        if self._centers is None or self._centers[0] != key:
            self._centers = (key, Centers(self.constant_value, self.live, mids))
        return self._centers[1]

    def take_norm_units(self) -> float:
        """The operator norms' work since the last call (charged by the caller that owns the budget)."""
        units, self.norm_units = self.norm_units, 0.0
        return units


def value_facts(v: Value, ob: OpBounds, values: Mapping[Value, Interval],
                constant_value: Callable[[Value], np.ndarray] | None = None) -> OpBounds:
    """Facts across ops: ``a / reduce_sum(a, keepdims)`` is in [0, 1] when ``a >= 0`` (one of the summands
    is ``a`` itself, and adding nonnegative terms never rounds below it); ``a * a`` of one float value is
    never negative (a rounded square neither); ``a`` over its row's ℓ2 norm is within ±1.25
    (:mod:`.normalized`)."""
    if v.op == "mul" and v.dtype.is_float and len(v.operands) == 2 and v.operands[0] is v.operands[1]:
        return _within(ob, 0.0, math.inf)
    if constant_value is not None:
        ratio = ratio_bound(v, values, constant_value)
        if ratio is not None:
            out = _within(ob, -ratio, ratio)
            return OpBounds(Interval(out.value.lo, out.value.hi, np.zeros_like(out.value.nan)), out.records,
                            out.method)
        guarded = guarded_ratio(v, values)
        if guarded is not None:
            value = ob.value.intersect(guarded.lo, guarded.hi)
            return OpBounds(Interval(value.lo, value.hi, value.nan & guarded.nan), ob.records, ob.method)
    a = normalized_ratio(v)
    if a is None or float(np.min(values[a].lo)) < 0:
        return ob
    return _within(ob, 0.0, 1.0)


def _within(ob: OpBounds, lo: float, hi: float) -> OpBounds:
    """``ob`` with its value and its result's record intersected with ``[lo, hi]``."""
    value = ob.value.intersect(lo, hi)
    for rec in ob.records.values():
        if rec.node == 0:
            rec.lo, rec.hi = max(rec.lo, lo), min(rec.hi, hi)
            rec.worst_score = max(rec.spec.lo - rec.lo, rec.hi - rec.spec.hi)
    return OpBounds(value, ob.records, ob.method)


def norm_facts(v: Value, ob: OpBounds, values: Mapping[Value, Interval], norms: RowNorms) -> OpBounds:
    """Cauchy–Schwarz and convex combinations at a product of two values (:mod:`.norms`)."""
    return _magnitude_fact(ob, norms.product_bound(v, values))


def window_facts(v: Value, ob: OpBounds, values: Mapping[Value, Interval], windows: WindowNorms) -> OpBounds:
    """Receptive-field norms through convolutions (:mod:`.windows`); the method says when they are tighter."""
    found = windows.element_bound(v, values)
    if found is None:
        return ob
    out = _magnitude_fact(ob, found)
    span = windows.element_span(v, values)
    if span is not None:  # the records: before rounding; the value: after
        before, after = span
        within = _within(out, float(np.min(before.lo)), float(np.max(before.hi)))
        out = OpBounds(out.value.intersect(after.lo, after.hi), within.records, out.method)
    tighter = float(np.max(out.value.magnitude(), initial=0.0)) < float(np.max(ob.value.magnitude(), initial=0.0))
    return OpBounds(out.value, out.records, "windows") if tighter else out


def _magnitude_fact(ob: OpBounds, found: tuple[np.ndarray, np.ndarray] | None) -> OpBounds:
    """``ob`` intersected with ``|v| <= before`` before its rounding (the record) and ``<= after`` after."""
    if found is None:
        return ob
    before, after = found
    top = float(np.max(before, initial=0.0))
    out = _within(ob, -top, top)  # the record: before rounding
    return OpBounds(ob.value.intersect(-after, after), out.records, ob.method)


def _snap(iv: Interval, dtype: DType) -> Interval:
    """An input box in the input's own type (integer boxes shrink to the integers inside)."""
    if dtype.is_float:
        return iv.clamp_finite(dtype)
    lo, hi = I.type_range(dtype)
    return Interval(np.clip(np.ceil(iv.lo), lo, hi), np.clip(np.floor(iv.hi), lo, hi))
