"""Linear relaxations: tighter bounds by back-substitution through affine and ReLU chains.

Intervals forget that two bounds come from the same input (``x - x`` is ``[-2r, 2r]``), and
through a chain of layers that loss compounds. Here a value is bounded by linear functions of
earlier values, substituted backwards (the DeepPoly/CROWN scheme): an affine op passes its
coefficients to its operands exactly, a ReLU-like clamp ``max(x, c)`` is replaced by a lower
and an upper line over its input's bounds, and any other value ends the substitution with its
interval. Which ops are affine is read from their compute rules: a rule whose loads of
non-constant operands enter only through sums, differences, constant factors, constant
selects and sum reductions is affine, and its Jacobian is built from the rule's index
expressions (a scatter over the evaluation grid). Rounding: every substituted op adds its
worst-case rounding error (relative to the magnitude its terms can reach), so the bound holds
for the float program too.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import Call, Expr, IndexValue, Ix, Lit, Load, Reduce
from cuvil.ir.rulewalk import ArrayWalker, RuleInfo, dyn_exprs, walk_exprs
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, reachable
from verify.probe import interval as I
from verify.probe.bounds import Bounds, BoundsEngine
from verify.probe.budget import LINEAR_FACTOR, UNIT, Budget
from verify.probe.interval import Interval

DENSE_BUDGET = 1 << 23
"""Largest dense coefficient matrix (target elements x value elements) back-substitution builds."""

FLOP_BUDGET = 6e8
"""Most multiply-adds one back-substitution may spend (it gives up, keeping the interval bound)."""


# --------------------------------------------------------------------------------------
# affine forms of rules


@dataclass(frozen=True)
class Term:
    """``scale * prod(factors) * operand[index]``, summed over the ``reduces`` it sits inside."""

    load: Load
    factors: tuple[Expr, ...]
    scale: float
    reduces: tuple[tuple[str, int], ...]


def _uses_operands(e: Expr, variable: frozenset[int]) -> bool:
    if isinstance(e, Load):
        return e.operand in variable or any(_uses_operands(d, variable) for i in e.index for d in dyn_exprs(i))
    if isinstance(e, Call):
        return any(_uses_operands(a, variable) for a in e.args)
    if isinstance(e, Reduce):
        return _uses_operands(e.body, variable)
    if isinstance(e, IndexValue):
        return any(_uses_operands(d, variable) for d in dyn_exprs(e.ix))
    return False


def affine_terms(e: Expr, variable: frozenset[int],
                 reduces: tuple[tuple[str, int], ...] = ()) -> list[Term] | None:
    """The terms of ``e`` in the non-constant operands ``variable``; None if ``e`` is not affine in them.
    (The constant part is not collected: it is the op's value at zero operands.)"""
    if not _uses_operands(e, variable):
        return []
    if isinstance(e, Load):
        if any(_uses_operands(d, variable) for i in e.index for d in dyn_exprs(i)):
            return None
        return [Term(e, (), 1.0, reduces)]
    if isinstance(e, Reduce):
        if e.kind != "sum":
            return None
        return affine_terms(e.body, variable, reduces + tuple((n, int(d)) for n, d in e.axes))
    if not isinstance(e, Call):
        return None
    fn, args = e.fn, e.args
    if fn == "add":
        parts = [affine_terms(a, variable, reduces) for a in args]
        return None if any(p is None for p in parts) else [t for p in parts for t in p]  # type: ignore[union-attr]
    if fn in ("sub", "neg"):
        parts = [affine_terms(a, variable, reduces) for a in args]
        if any(p is None for p in parts):
            return None
        out = list(parts[0]) if fn == "sub" else []  # type: ignore[arg-type]
        negated = parts[-1]
        assert negated is not None
        return out + [Term(t.load, t.factors, -t.scale, t.reduces) for t in negated]
    if fn == "mul":
        a, b = args
        if _uses_operands(a, variable) and _uses_operands(b, variable):
            return None
        lin, const = (a, b) if _uses_operands(a, variable) else (b, a)
        inner = affine_terms(lin, variable, reduces)
        return None if inner is None else [Term(t.load, (*t.factors, const), t.scale, t.reduces) for t in inner]
    if fn == "div":
        a, b = args
        if _uses_operands(b, variable):
            return None
        inner = affine_terms(a, variable, reduces)
        recip = R.lit(1.0, b.dtype) / b
        return None if inner is None else [Term(t.load, (*t.factors, recip), t.scale, t.reduces) for t in inner]
    if fn == "cast":
        to = dict(e.attrs)["to"]
        if not (to.is_float and args[0].dtype.is_float):
            return None
        return affine_terms(args[0], variable, reduces)
    if fn == "select":
        c, a, b = args
        if _uses_operands(c, variable):
            return None
        pa, pb = affine_terms(a, variable, reduces), affine_terms(b, variable, reduces)
        if pa is None or pb is None:
            return None
        one, zero = R.lit(1.0, a.dtype), R.lit(0.0, a.dtype)
        yes, no = R.select(c, one, zero), R.select(c, zero, one)
        return [Term(t.load, (*t.factors, yes), t.scale, t.reduces) for t in pa] + \
               [Term(t.load, (*t.factors, no), t.scale, t.reduces) for t in pb]
    return None


class _Concrete(ArrayWalker):
    """Evaluates constant parts of a rule (indices and factors) on a grid."""

    def bind(self, reduces: Sequence[tuple[str, int]]) -> None:
        """Enter the sum reductions a term sits inside (one grid axis each)."""
        for name, n in reduces:
            base = self.depth
            self.level += 1
            self.depth = base + 1
            self.level_depth = [*self.level_depth, self.depth]
            self.env[name] = self._axis(np.arange(n, dtype=np.int64), base, self.depth)
            self.var_level[name] = self.level

    def call(self, e: Call, args: list[np.ndarray]) -> np.ndarray:
        return self.lift_array(np.asarray(I.concrete(e.fn, args, e.dtype, dict(e.attrs), [a.dtype for a in e.args])))

    def reduce(self, e: Reduce, body: np.ndarray, axes: tuple[int, ...], extents: list[int]) -> np.ndarray:
        shape = list(np.broadcast_shapes(body.shape, (1,) * self.depth))
        for ax, n in zip(axes, extents, strict=True):
            shape[ax] = n
        full = np.broadcast_to(body, shape)
        f = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[e.kind]
        return f(full, axis=axes)


@dataclass
class AffineOp:
    """``out = sum_p J[p] @ operand_p + offset`` over flattened tensors, plus its rounding model."""

    jac: dict[int, np.ndarray]
    offset: np.ndarray
    rounding: float  # relative error bound per unit of |terms|
    depth: int


@dataclass
class ClampOp:
    """``max(x, c)`` or ``min(x, c)`` elementwise on operand ``operand``."""

    operand: int
    kind: str
    const: float


def affine_op(v: Value, info: RuleInfo, constants: Mapping[int, np.ndarray],
              budget: int = DENSE_BUDGET) -> AffineOp | None:
    """The affine form of ``v`` in its non-constant operands (None if its rule is not affine or too large)."""
    variable = frozenset(k for k in range(len(v.operands)) if k not in constants)
    if not variable:
        return None
    terms = affine_terms(info.rule, variable)
    if terms is None or not terms:
        return None
    out_shape = info.out_shape
    m = math.prod(out_shape)
    sizes = {k: math.prod(int(d) for d in v.operands[k].shape) for k in variable}
    if any(m * sizes[k] > budget for k in variable):
        return None
    grid = max(m * math.prod(n for _, n in t.reduces) for t in terms)
    if grid > budget:
        return None
    operands = [constants.get(k) for k in range(len(v.operands))]
    jac = {k: np.zeros(m * sizes[k]) for k in variable}
    out_index = np.arange(m).reshape(out_shape) if out_shape else np.zeros((), dtype=np.int64)
    for t in terms:
        w = _Concrete(info, operands)
        w.bind(t.reduces)
        shape = tuple(int(d) for d in v.operands[t.load.operand].shape)
        idx = [w.ix(i).lo for i in t.load.index]
        coef = np.asarray(t.scale, dtype=np.float64)
        for f in t.factors:
            coef = coef * np.asarray(w.expr(f), dtype=np.float64)
        grid_shape = np.broadcast_shapes(*(i.shape for i in idx), coef.shape, (1,) * w.depth,
                                         tuple(out_shape) + (1,) * (w.depth - len(out_shape)))
        grid_shape = tuple(grid_shape[:len(out_shape)]) + tuple(n for _, n in t.reduces)
        rows = np.broadcast_to(out_index.reshape(tuple(out_shape) + (1,) * (w.depth - len(out_shape))), grid_shape)
        inb = np.ones(grid_shape, dtype=bool)
        cols = np.zeros(grid_shape, dtype=np.int64)
        for k, i in enumerate(idx):
            ib = np.broadcast_to(i, grid_shape)
            inb = inb & (ib >= 0) & (ib < shape[k])
            cols = cols * shape[k] + np.clip(ib, 0, shape[k] - 1)
        vals = np.where(inb, np.broadcast_to(coef, grid_shape), 0.0)
        n = sizes[t.load.operand]
        jac[t.load.operand] += np.bincount((rows * n + cols).reshape(-1), weights=vals.reshape(-1),
                                           minlength=m * n)
    offset = _offset(v, constants)
    dense = {k: j.reshape(m, sizes[k]) for k, j in jac.items()}
    depth = max(len(t.factors) for t in terms) + 2
    n_sum = max(math.prod(n for _, n in t.reduces) for t in terms) * len(terms)
    dt = v.dtype
    rounding = depth * I.unit_roundoff(dt) + (n_sum + 1) * _sum_roundoff(info.rule, dt) if dt.is_float else 0.0
    return AffineOp(dense, offset, rounding, depth)


def _sum_roundoff(rule: Expr, dt: DType) -> float:
    """The unit roundoff of the least precise sum in ``rule``: each rule fixes the type its sums run in
    (half terms widened to f32 by matmul, conv, the mean-like reductions, avg_pool and cumsum; lp_pool and
    lrn still add halves in half), so the bound reads it rather than assuming f32."""
    sums = [e.dtype for e in walk_exprs(rule) if isinstance(e, Reduce) and e.kind == "sum" and e.dtype.is_float]
    return max((I.unit_roundoff(d) for d in sums), default=I.unit_roundoff(dt))


def _offset(v: Value, constants: Mapping[int, np.ndarray]) -> np.ndarray:
    """The op at zero non-constant operands (its constant part)."""
    arrays = []
    for k, o in enumerate(v.operands):
        shape = tuple(int(d) for d in o.shape)
        dt = np.float64 if o.dtype.is_float else o.dtype.np
        arrays.append(np.asarray(constants[k], dtype=dt) if k in constants else np.zeros(shape, dtype=dt))
    out_t = TensorType(DType.f64 if v.dtype.is_float else v.dtype, tuple(int(d) for d in v.shape))
    attrs = dict(v.attrs)
    with np.errstate(all="ignore"):
        return np.asarray(evaluate_op(get_op(v.op), arrays, attrs, out_t), dtype=np.float64).reshape(-1)


def clamp_op(v: Value, info: RuleInfo) -> ClampOp | None:
    """``max(x[i], c)`` / ``min(x[i], c)`` with ``x`` read at the output index (ReLU and friends)."""
    r = info.rule
    if not (isinstance(r, Call) and r.fn in ("max", "min")):
        return None
    x, c = r.args
    if isinstance(x, Lit):
        x, c = c, x
    if not (isinstance(x, Load) and isinstance(c, Lit) and x.oob is None):
        return None
    if tuple(x.index) != tuple(Ix.var(f"i{k}") for k in range(len(info.out_shape))):
        return None
    if tuple(int(d) for d in v.operands[x.operand].shape) != info.out_shape:
        return None
    return ClampOp(x.operand, r.fn, float(c.value))


def clamp_lines(op: ClampOp, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, ...]:
    """Lines ``aL x + bL <= clamp(x) <= aU x + bU`` over ``[lo, hi]``: (aL, bL, aU, bU)."""
    if op.kind == "min":  # min(x, c) = -max(-x, -c)
        aL, bL, aU, bU = clamp_lines(ClampOp(op.operand, "max", -op.const), -hi, -lo)
        return aU, -bU, aL, -bL
    c = op.const
    active = lo >= c
    dead = hi <= c
    mixed = ~(active | dead)
    width = np.where(mixed, hi - lo, 1.0)
    s = np.where(mixed, (hi - c) / width, 0.0)
    aU = np.where(active, 1.0, np.where(dead, 0.0, s))
    bU = np.where(active, 0.0, np.where(dead, c, c - s * lo))
    up = (hi - c) > (c - lo)
    aL = np.where(active, 1.0, np.where(dead, 0.0, np.where(up, 1.0, 0.0)))
    bL = np.where(active, 0.0, np.where(dead, c, np.where(up, 0.0, c)))
    return aL, bL, aU, bU


# --------------------------------------------------------------------------------------
# back-substitution


class LinearRefiner:
    """Tightens bounds of chosen values of ``fn`` by back-substitution (forms cached across runs)."""

    def __init__(self, fn: Function, engine: BoundsEngine, budget: int = DENSE_BUDGET) -> None:
        self.fn = fn
        self.engine = engine
        self.budget = budget
        self.order = {v: k for k, v in enumerate(fn.values())}
        self.forms: dict[Value, AffineOp | ClampOp | None] = {}

    def form(self, v: Value) -> AffineOp | ClampOp | None:
        if v in self.forms:
            return self.forms[v]
        out: AffineOp | ClampOp | None = None
        if not (v.is_param or v.is_const) and v in self.engine.live:
            info = self.engine.context(v).info
            out = clamp_op(v, info)
            if out is None:
                constants = {k: np.asarray(self.engine.constant_value(o), dtype=np.float64)
                             for k, o in enumerate(v.operands) if o not in self.engine.live}
                try:
                    out = affine_op(v, info, constants, self.budget)
                except (MemoryError, ValueError):
                    out = None
        self.forms[v] = out
        return out

    def refine(self, bounds: Bounds, targets: Sequence[Value], budget: Budget | None = None) -> dict[Value, Interval]:
        """Back-substituted bounds for ``targets`` (and the clamp inputs on their way), in program order,
        each back-substitution's dense products charged to ``budget``."""
        cur: dict[Value, tuple[np.ndarray, np.ndarray]] = {}

        def box(v: Value) -> tuple[np.ndarray, np.ndarray]:
            if v not in cur:
                iv = bounds.values[v]
                shape = tuple(int(d) for d in v.shape)
                cur[v] = (np.broadcast_to(iv.lo, shape).reshape(-1).astype(np.float64),
                          np.broadcast_to(iv.hi, shape).reshape(-1).astype(np.float64))
            return cur[v]

        wanted = self._worklist(targets)
        out: dict[Value, Interval] = {}
        for v in wanted:
            if budget is not None and budget.exhausted:
                break
            res = self._backsub(v, box, budget)
            if res is None:
                continue
            lo0, hi0 = box(v)
            lo, hi = np.maximum(lo0, res[0]), np.minimum(hi0, res[1])
            bad = lo > hi
            lo, hi = np.where(bad, lo0, lo), np.where(bad, hi0, hi)
            cur[v] = (lo, hi)
            shape = tuple(int(d) for d in v.shape)
            out[v] = Interval(lo.reshape(shape), hi.reshape(shape))
        return out

    def _region(self, target: Value) -> tuple[set[Value], bool]:
        """The values back-substitution from ``target`` expands, and whether it can beat intervals:
        only through a clamp, or where two substitution paths meet again at one value."""
        region: set[Value] = set()
        reached: Counter[Value] = Counter()

        def step(v: Value) -> list[Value]:
            f = self.form(v)
            if f is None:
                return []
            region.add(v)
            operands = [v.operands[f.operand]] if isinstance(f, ClampOp) else [v.operands[k] for k in f.jac]
            reached.update(operands)
            return operands

        reachable([target], step)
        useful = any(isinstance(self.forms.get(v), ClampOp) for v in region) or any(c > 1 for c in reached.values())
        return region, useful

    def _worklist(self, targets: Sequence[Value]) -> list[Value]:
        """The targets worth substituting, and the inputs of the clamps on their way, in program order."""
        wanted: set[Value] = set()
        for t in targets:
            if not isinstance(self.form(t), AffineOp):
                continue
            region, useful = self._region(t)
            if not useful:
                continue
            wanted.add(t)
            for v in region:
                f = self.forms.get(v)
                if isinstance(f, ClampOp) and isinstance(self.form(v.operands[f.operand]), AffineOp):
                    wanted.add(v.operands[f.operand])
        return sorted(wanted, key=self.order.__getitem__)

    def _backsub(self, target: Value, box, budget: Budget | None  # type: ignore[no-untyped-def]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        m = math.prod(int(d) for d in target.shape)
        lam_u: dict[Value, np.ndarray] = {target: np.eye(m)}
        lam_l: dict[Value, np.ndarray] = {target: np.eye(m)}
        cu = np.zeros(m)
        cl = np.zeros(m)
        work = 0.0
        err_u = np.zeros(m)
        err_l = np.zeros(m)
        pending = [target]
        while pending:
            v = max(pending, key=self.order.__getitem__)
            pending.remove(v)
            au, al = lam_u.pop(v), lam_l.pop(v)
            f = self.form(v)
            n_v = math.prod(int(d) for d in v.shape)
            expand = f is not None and m * n_v <= self.budget
            if expand and isinstance(f, AffineOp):
                step = 2.0 * m * sum(j.size for j in f.jac.values())
                work += step
                if work > FLOP_BUDGET or (budget is not None and LINEAR_FACTOR * step / UNIT > budget.left):
                    return None  # what it would spend is not left: keep the interval bound, spend nothing
                if budget is not None:
                    budget.charge(LINEAR_FACTOR * step / UNIT)
                mag_in = {k: np.maximum(np.abs(box(v.operands[k])[0]), np.abs(box(v.operands[k])[1]))
                          for k in f.jac}
                mags = sum((np.abs(j) @ mag_in[k] for k, j in f.jac.items()), np.abs(f.offset))
                err_v = f.rounding * mags + (I.smallest_subnormal(v.dtype) * f.depth if v.dtype.is_float else 0)
                if np.any(err_v):
                    err_u += np.abs(au) @ err_v
                    err_l += np.abs(al) @ err_v
                cu += au @ f.offset
                cl += al @ f.offset
                for k, j in f.jac.items():
                    o = v.operands[k]
                    self._add(lam_u, o, au @ j, pending)
                    self._add(lam_l, o, al @ j, pending)
                continue
            if budget is not None:  # clamp lines and interval ends: a few passes over the coefficients
                if LINEAR_FACTOR * 4.0 * m * n_v / UNIT > budget.left:
                    return None
                budget.charge(LINEAR_FACTOR * 4.0 * m * n_v / UNIT)
            if expand and isinstance(f, ClampOp):
                x = v.operands[f.operand]
                lo, hi = box(x)
                a_l, b_l, a_u, b_u = clamp_lines(f, lo, hi)
                pu, nu = np.maximum(au, 0), np.minimum(au, 0)
                pl, nl = np.maximum(al, 0), np.minimum(al, 0)
                cu += pu @ b_u + nu @ b_l
                cl += pl @ b_l + nl @ b_u
                self._add(lam_u, x, pu * a_u + nu * a_l, pending)
                self._add(lam_l, x, pl * a_l + nl * a_u, pending)
                continue
            lo, hi = box(v)
            if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
                return None
            cu += np.maximum(au, 0) @ hi + np.minimum(au, 0) @ lo
            cl += np.maximum(al, 0) @ lo + np.minimum(al, 0) @ hi
        slack = 1e-9 * (np.abs(cu) + np.abs(cl))
        return cl - slack - err_l, cu + slack + err_u

    @staticmethod
    def _add(lam: dict[Value, np.ndarray], v: Value, coef: np.ndarray, pending: list[Value]) -> None:
        if v in lam:
            lam[v] = lam[v] + coef
        else:
            lam[v] = coef
            if v not in pending:
                pending.append(v)
