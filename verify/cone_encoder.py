"""The z3 encoder: a value's meaning at a symbolic output index, read from compute rules.

A value is encoded as a term at an index expression. Leaves (function parameters, values
common to both sides of a rewrite, constants) are n-ary uninterpreted functions of their
indices, or, for small constants a rewrite depends on, their concrete elements. Elementwise
ops map terms; index remaps rewrite index expressions, which are kept as linear forms with
interval bounds so that div/mod of a reshape round trip and the bounds checks of padding
simplify away; an out-of-bounds mask is put on the input atom (``ite(inb, x(..), 0)``).
A reduction over a small static range is unrolled; otherwise it becomes one named
reduction term (see ``Semantics.named_reduction``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import get_op
from cuvil.ir.rulewalk import FreeVars, fold_ix
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value
from verify.scalar_semantics import ENCODERS, AbstractFPSemantics, EncodingError, Semantics
from verify.z3_terms import arith, boolean, int_value, ite

UNROLL_LIMIT = 16
"""Reductions over at most this many (static) elements are unrolled."""

ENCODING_BUDGET = 200_000
"""Value-at-index encodings one obligation may create before it is given up as too large."""

DEADLINE_STRIDE = 64
"""Encodings between two looks at the clock when an attempt's time limit covers its encoding too."""

DIM_LIMIT = 1 << 40
"""The largest value of a symbolic dim without an upper constraint: no tensor has 2^40 elements
along one axis (it would not fit in memory). Certificates state this assumption; integer
arithmetic on indices is exact below it and wraps as the interpreter does above its type."""


@dataclass
class Leaf:
    """A tensor the encoder does not look into: a parameter, a value common to both sides,
    a constant, or a pair of values proved equal earlier."""

    key: str
    label: str
    type: TensorType
    kind: str  # param | shared | constant | folded | cut
    data: np.ndarray | None = None
    concrete: bool = False
    value_range: tuple[float, float] | None = None
    before: Value | None = None
    after: Value | None = None


def is_unit(d: Dim) -> bool:
    """An extent known to be 1 (a symbolic extent never is)."""
    return isinstance(d, int) and d == 1


def non_unit_extents(shape: tuple[Dim, ...]) -> list[Dim]:
    """A shape's extents other than the unit ones, in order."""
    return [d for d in shape if not is_unit(d)]


def unit_view(shape: tuple[Dim, ...], base: tuple[Dim, ...]) -> bool:
    """Whether a tensor of ``shape`` is one of ``base`` with axes of extent 1 inserted or dropped: the same
    extents otherwise, in the same order."""
    return tuple(shape) != tuple(base) and non_unit_extents(shape) == non_unit_extents(base)


def view_index(idx: tuple[Lin, ...], shape: tuple[Dim, ...], base: tuple[Dim, ...]) -> tuple[Lin, ...] | None:
    """Element ``idx`` of a tensor of ``shape`` that is a :func:`unit_view` of ``base``, as an index of ``base``
    (the other axes' indices in order, 0 on its unit axes); None when it is not such a view. A cut pairs
    two values this way when a pass squeezed or unsqueezed them, so both sides read one leaf."""
    if not unit_view(shape, base) or len(idx) != len(shape):
        return None
    kept = iter([ix for ix, d in zip(idx, shape, strict=True) if not is_unit(d)])
    return tuple(IndexSpace.const(0) if is_unit(d) else next(kept) for d in base)


def read_index(idx: tuple[Lin, ...], shape: tuple[Dim, ...], base: tuple[Dim, ...]) -> tuple[Lin, ...] | None:
    """``idx`` of a tensor of ``shape`` as an index of one of ``base``: itself where the shapes are the same,
    else through :func:`view_index`."""
    return idx if tuple(shape) == tuple(base) else view_index(idx, shape, base)


# --------------------------------------------------------------------------------------
# index expressions: linear forms over atoms with interval bounds


Bound = tuple[int | None, int | None]


@dataclass(frozen=True)
class Lin:
    """``const + sum(coef * atom)``; atoms are z3 integer terms known by AST id."""

    terms: tuple[tuple[int, int], ...]
    const: int

    @property
    def is_const(self) -> bool:
        return not self.terms


class IndexSpace:
    """Builds and simplifies index expressions; knows each atom's bounds."""

    def __init__(self, ctx: z3.Context) -> None:
        self.ctx = ctx
        self.atoms: dict[int, z3.ArithRef] = {}
        self.bounds: dict[int, Bound] = {}
        self.below: dict[int, Lin] = {}  # an index variable's extent: ``0 <= atom < below[atom]``
        self._terms: dict[Lin, z3.ArithRef] = {}

    def index_var(self, t: z3.ArithRef, extent: Lin) -> Lin:
        """The atom of an index variable ranging over ``[0, extent)``: its numeric bounds, and the
        symbolic one, so ``i % extent`` and ``i // extent`` simplify where the extent is a dim."""
        _, hi = self.interval(extent)
        out = self.atom(t, 0, None if hi is None else hi - 1)
        if out.terms:
            self.below[out.terms[0][0]] = extent
        return out

    def _under(self, a: Lin, b: Lin) -> bool:
        """Whether ``0 <= a < b`` holds by construction: ``a`` is an index variable over ``[0, b)``."""
        return a.const == 0 and len(a.terms) == 1 and a.terms[0][1] == 1 and self.below.get(a.terms[0][0]) == b

    @staticmethod
    def const(c: int) -> Lin:
        return Lin((), int(c))

    def atom(self, t: z3.ArithRef, lo: int | None = None, hi: int | None = None) -> Lin:
        if z3.is_int_value(t):
            return self.const(int_value(t))
        if lo is not None and lo == hi:
            return self.const(lo)
        tid = t.get_id()
        self.atoms.setdefault(tid, t)
        old = self.bounds.get(tid, (None, None))
        self.bounds[tid] = (lo if old[0] is None else (old[0] if lo is None else max(lo, old[0])),
                            hi if old[1] is None else (old[1] if hi is None else min(hi, old[1])))
        return Lin(((tid, 1),), 0)

    def add(self, a: Lin, b: Lin, sign: int = 1) -> Lin:
        acc = dict(a.terms)
        for t, c in b.terms:
            acc[t] = acc.get(t, 0) + sign * c
        return Lin(tuple(sorted((t, c) for t, c in acc.items() if c)), a.const + sign * b.const)

    def scale(self, a: Lin, k: int) -> Lin:
        if k == 0:
            return self.const(0)
        return Lin(tuple((t, c * k) for t, c in a.terms), a.const * k)

    def interval(self, a: Lin) -> Bound:
        lo: int | None = a.const
        hi: int | None = a.const
        for t, c in a.terms:
            blo, bhi = self.bounds.get(t, (None, None))
            if c < 0:
                blo, bhi = (None if bhi is None else -bhi), (None if blo is None else -blo)
                c = -c
            lo = None if lo is None or blo is None else lo + c * blo
            hi = None if hi is None or bhi is None else hi + c * bhi
        return lo, hi

    def term(self, a: Lin) -> z3.ArithRef:
        found = self._terms.get(a)
        if found is not None:
            return found
        out: z3.ArithRef | None = None
        for t, c in a.terms:
            part = self.atoms[t] if c == 1 else arith(c * self.atoms[t])
            out = part if out is None else arith(out + part)
        if out is None:
            out = z3.IntVal(a.const, self.ctx)
        elif a.const:
            out = arith(out + a.const)
        self._terms[a] = out
        return out

    def mul(self, a: Lin, b: Lin) -> Lin:
        if a.is_const:
            return self.scale(b, a.const)
        if b.is_const:
            return self.scale(a, b.const)
        (alo, ahi), (blo, bhi) = self.interval(a), self.interval(b)
        lo = hi = None
        if alo is not None and ahi is not None and blo is not None and bhi is not None:
            prods = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
            lo, hi = min(prods), max(prods)
        return self.atom(arith(self.term(a) * self.term(b)), lo, hi)

    def _split(self, a: Lin, d: int) -> tuple[Lin, Lin]:
        """``a = d * q + r`` with every coefficient of ``r`` not a multiple of ``d``."""
        q0, r0 = divmod(a.const, d)
        q = tuple((t, c // d) for t, c in a.terms if c % d == 0)
        r = tuple((t, c) for t, c in a.terms if c % d != 0)
        return Lin(q, q0), Lin(r, r0)

    def floordiv(self, a: Lin, b: Lin) -> Lin:
        if b.is_const and b.const < 0:
            return self.floordiv(self.scale(a, -1), self.scale(b, -1))
        if b.is_const and b.const > 0:
            d = b.const
            if d == 1:
                return a
            q, r = self._split(a, d)
            lo, hi = self.interval(r)
            if lo is not None and hi is not None and lo // d == hi // d:
                return self.add(q, self.const(lo // d))
            return self.add(q, self.atom(arith(self.term(r) / d), None if lo is None else lo // d,
                                         None if hi is None else hi // d))
        if self._under(a, b):
            return self.const(0)
        lo, _ = self.interval(a)
        blo, _ = self.interval(b)
        nonneg = lo is not None and lo >= 0 and blo is not None and blo >= 1
        return self.atom(arith(self.term(a) / self.term(b)), 0 if nonneg else None,
                         self.interval(a)[1] if nonneg else None)

    def mod(self, a: Lin, b: Lin) -> Lin:
        if b.is_const and b.const < 0:
            return self.scale(self.mod(self.scale(a, -1), self.scale(b, -1)), -1)
        if b.is_const and b.const > 0:
            d = b.const
            if d == 1:
                return self.const(0)
            _, r = self._split(a, d)
            lo, hi = self.interval(r)
            if lo is not None and hi is not None and lo // d == hi // d:
                return self.add(r, self.const(-(lo // d) * d))
            return self.atom(self.term(r) % d, 0, d - 1)
        if self._under(a, b):
            return a
        blo, bhi = self.interval(b)
        return self.atom(self.term(a) % self.term(b), 0 if blo is not None and blo >= 1 else None,
                         None if bhi is None else bhi - 1)

    def minmax(self, a: Lin, b: Lin, kind: str) -> Lin:
        (alo, ahi), (blo, bhi) = self.interval(a), self.interval(b)
        if ahi is not None and blo is not None and ahi <= blo:
            return a if kind == "min" else b
        if bhi is not None and alo is not None and bhi <= alo:
            return b if kind == "min" else a
        ta, tb = self.term(a), self.term(b)
        t = ite(ta <= tb, ta, tb) if kind == "min" else ite(ta <= tb, tb, ta)
        pick = min if kind == "min" else max
        lo = None if alo is None or blo is None else pick(alo, blo)
        hi = None if ahi is None or bhi is None else pick(ahi, bhi)
        return self.atom(t, lo, hi)

    def compare(self, fn: str, a: Lin, b: Lin) -> bool | z3.BoolRef:
        """``a fn b``: a Python bool when the bounds decide it, else a z3 formula."""
        lo, hi = self.interval(self.add(a, b, -1))
        decided = {"lt": (hi is not None and hi < 0, lo is not None and lo >= 0),
                   "le": (hi is not None and hi <= 0, lo is not None and lo > 0),
                   "gt": (lo is not None and lo > 0, hi is not None and hi <= 0),
                   "ge": (lo is not None and lo >= 0, hi is not None and hi < 0),
                   "eq": (lo == 0 and hi == 0, (lo is not None and lo > 0) or (hi is not None and hi < 0)),
                   "ne": ((lo is not None and lo > 0) or (hi is not None and hi < 0), lo == 0 and hi == 0)}[fn]
        if decided[0]:
            return True
        if decided[1]:
            return False
        ta, tb = self.term(a), self.term(b)
        return {"lt": ta < tb, "le": ta <= tb, "gt": ta > tb, "ge": ta >= tb, "eq": ta == tb, "ne": ta != tb}[fn]


@dataclass(frozen=True)
class _Bound:
    """One bounds check of a guarded read, ``cond``: ``diff >= 0``, or with ``below`` ``diff < 0``."""

    cond: z3.BoolRef
    diff: Lin
    below: bool


@dataclass(frozen=True)
class _Guarded:
    """A guarded read as encoded (``term``, held so its AST id is not reused): its bounds checks, the
    value read where they hold, and the fill read where they do not."""

    term: z3.ExprRef
    bounds: tuple[_Bound, ...]
    value: z3.ExprRef
    fill: z3.ExprRef


@dataclass(frozen=True)
class IndexInt:
    """An integer scalar computed from indices (iota, masks, offsets): kept as a linear form in
    unbounded integers only while its bounds prove it inside its dtype's range (where unbounded
    and wrapping arithmetic agree); anything that may leave the range becomes a bit-vector."""

    lin: Lin


class _Env:
    __slots__ = ("key", "vars")

    def __init__(self, vars: dict[str, Lin]) -> None:
        self.vars = vars
        self.key = tuple(sorted(vars.items()))

    def bind(self, extra: Mapping[str, Lin]) -> _Env:
        return _Env({**self.vars, **extra})


_KIND_OP = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}
_INDEX_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


class ConeEncoder:
    """Encodes values of one obligation (both sides share the leaves and the memo)."""

    def __init__(self, encoder: str, leaf_of: Callable[[Value], Leaf | None],
                 constraints: Sequence[DimConstraint] = (), *, unroll_limit: int = UNROLL_LIMIT,
                 budget: int = ENCODING_BUDGET, ctx: z3.Context | None = None,
                 deadline: float | None = None) -> None:
        self.ctx = ctx if ctx is not None else z3.Context()
        self.deadline = deadline
        self.sem: Semantics = ENCODERS[encoder](self.ctx)
        self.space = IndexSpace(self.ctx)
        self.leaf_of = leaf_of
        self.constraints = {c.symbol: c for c in constraints}
        self.unroll_limit = unroll_limit
        self.budget = budget
        self.count = 0
        self.float_seen = False
        self.bound_facts: list[z3.BoolRef] = []
        self._dims: dict[str, Lin] = {}
        self._dim_cache: dict[Dim, Lin] = {}
        self._sites: dict[tuple[int, int], int] = {}
        self._uses_memo: dict[int, tuple[str, ...]] = {}
        self._free = FreeVars()
        self._memo: dict[tuple[int, tuple[Lin, ...]], Any] = {}
        self._expr_memo: dict[tuple[int, tuple], Any] = {}
        self._guarded: dict[int, _Guarded] = {}
        self._rules: dict[int, tuple[Value, R.Expr]] = {}
        self._leaf_terms: dict[int, z3.ExprRef] = {}
        self._true, self._false = z3.BoolVal(True, self.ctx), z3.BoolVal(False, self.ctx)

    # dims and the output index ----------------------------------------------------------
    def dim(self, d: Dim) -> Lin:
        if isinstance(d, int):
            return IndexSpace.const(d)
        found = self._dim_cache.get(d)
        if found is not None:
            return found
        out = IndexSpace.const(0)
        for mono, coef in d.terms:
            term = IndexSpace.const(coef)
            for f in mono:
                term = self.space.mul(term, self._dim_factor(f))
            out = self.space.add(out, term)
        self._dim_cache[d] = out
        return out

    def _dim_factor(self, f: Any) -> Lin:
        """A factor of a symbolic dim: a symbol, or an opaque floordiv / mod / max / min of dims."""
        if isinstance(f, str):
            found = self._dims.get(f)
            if found is None:
                c = self.constraints.get(f, DimConstraint(f))
                v = z3.Int(f"__d_{f}", self.ctx)
                hi = c.hi if c.hi is not None else DIM_LIMIT
                self.bound_facts.append(v >= c.lo)
                self.bound_facts.append(v <= hi)
                if c.multiple_of != 1:
                    self.bound_facts.append(boolean(v % c.multiple_of == 0))
                found = self.space.atom(v, c.lo, hi)
                self._dims[f] = found
            return found
        args = [self.dim(a) for a in f.args]
        if f.kind == "floordiv":
            return self.space.floordiv(args[0], args[1])
        if f.kind == "mod":
            return self.space.mod(args[0], args[1])
        return self.space.minmax(args[0], args[1], f.kind)

    def output_index(self, t: TensorType) -> tuple[Lin, ...]:
        """Fresh index variables ``0 <= i_k < S_k`` for an output of type ``t``."""
        idx: list[Lin] = []
        for k, d in enumerate(t.shape):
            ext = self.dim(d)
            v = z3.Int(f"__i{k}", self.ctx)
            self.bound_facts.append(v >= 0)
            self.bound_facts.append(v < self.space.term(ext))
            idx.append(self.space.index_var(v, ext))
        return tuple(idx)

    def facts(self) -> list[z3.BoolRef]:
        out = [*self.bound_facts, *self.sem.facts]
        if isinstance(self.sem, AbstractFPSemantics):
            out.extend(self.sem.literal_facts())
        return out

    # values -------------------------------------------------------------------------------
    def value_at(self, v: Value, idx: tuple[Lin, ...]) -> Any:
        """The scalar value of ``v`` at index ``idx``: a semantic value (see ``term``)."""
        key = (id(v), idx)
        found = self._memo.get(key)
        if found is not None:
            return found
        self.count += 1
        if self.count > self.budget:
            raise EncodingError(f"the cone needs more than {self.budget} value encodings")
        if self.deadline is not None and self.count % DEADLINE_STRIDE == 0 and time.perf_counter() > self.deadline:
            raise EncodingError(f"encoding the cone ran past the attempt's time limit ({self.count} value encodings)")
        if v.dtype.is_float:
            self.float_seen = True
        leaf = self.leaf_of(v)
        if leaf is not None:
            at = read_index(idx, v.type.shape, leaf.type.shape)
            if at is None:
                raise EncodingError(f"a {v.type} read as leaf {leaf.label} of type {leaf.type}, not a view of it")
            out = self._leaf_at(leaf, at)
        else:
            owner, rule = self._rule(v)
            env = _Env({f"i{k}": ix for k, ix in enumerate(idx)})
            out = self._scalar(self.expr(rule, env, owner), rule.dtype)
        self._memo[key] = out
        return out

    def term(self, v: Any, dtype: DType) -> z3.ExprRef:
        return self.sem.term(self._scalar(v, dtype), dtype)

    def _rule(self, v: Value) -> tuple[Value, R.Expr]:
        found = self._rules.get(id(v))
        if found is None:
            if get_op(v.op).structured:
                raise EncodingError(f"a {v.op} is encoded only as a cut point: paired with a {v.op} of the "
                                    "other side that has the same body and equal operands")
            rule = get_op(v.op).make_rule([o.type for o in v.operands], v.attr_dict, v.type)
            found = (v, rule)
            self._rules[id(v)] = found
        return found

    def _leaf_at(self, leaf: Leaf, idx: tuple[Lin, ...]) -> Any:
        dt = leaf.type.dtype
        if leaf.concrete and leaf.data is not None:
            return self._concrete_at(leaf.data, dt, idx)
        f = self.sem.uf(f"t_{leaf.key}", [self.sem.int_sort] * len(idx), self.sem.sort(dt))
        t = f(*[self.space.term(i) for i in idx])
        if leaf.value_range is not None and t.get_id() not in self._leaf_terms:
            self._leaf_terms[t.get_id()] = t
            self.sem.range_facts(t, dt, *leaf.value_range)
        return self.sem.from_term(t, dt)

    def _concrete_at(self, data: np.ndarray, dt: DType, idx: tuple[Lin, ...]) -> Any:
        flat_data = np.asarray(data).reshape(-1)
        if flat_data.size and bool(np.all(_same_elements(flat_data, flat_data[0]))):
            return self._lit(flat_data[0].item(), dt)
        flat = IndexSpace.const(0)
        for ix, d in zip(idx, data.shape, strict=True):
            flat = self.space.add(self.space.scale(flat, int(d)), ix)
        if flat.is_const:
            return self._lit(flat_data[flat.const].item(), dt)
        lo, hi = self.space.interval(flat)
        lo = 0 if lo is None else max(lo, 0)
        hi = flat_data.size - 1 if hi is None else min(hi, flat_data.size - 1)
        t = self.space.term(flat)
        # integer literals are index forms; a select needs them as bit-vectors
        out = self._scalar(self._lit(flat_data[hi].item(), dt), dt)
        for p in range(hi - 1, lo - 1, -1):
            out = self.sem.select(boolean(t == p), self._scalar(self._lit(flat_data[p].item(), dt), dt), out, dt)
        return out

    def _lit(self, value: Any, dt: DType) -> Any:
        if dt.is_int:
            return IndexInt(IndexSpace.const(int(value)))
        return self.sem.lit(value, dt)

    def _index_int(self, lin: Lin, dtype: DType) -> IndexInt | None:
        """``lin`` as an integer of ``dtype`` when its bounds keep it in range, else None."""
        if not dtype.is_int:
            return None
        lo, hi = self.space.interval(lin)
        if lo is None or hi is None or lo < int(dtype.min_value) or hi > int(dtype.max_value):
            return None
        return IndexInt(lin)

    # index expressions ------------------------------------------------------------------
    def ix(self, e: R.Ix, env: _Env, owner: Value) -> Lin:
        def dyn(x: R.Expr) -> Lin:
            val = self.expr(x, env, owner)
            if isinstance(val, IndexInt):
                return val.lin
            return self.space.atom(z3.BV2Int(val, is_signed=x.dtype.is_signed))

        return fold_ix(e, var=lambda n: env.vars[n], lit=self.dim, dyn=dyn, op=self._ix_op)

    def _ix_op(self, kind: str, a: Lin, b: Lin) -> Lin:
        """Index arithmetic over linear terms (floored division and modulo, as the rules mean them)."""
        if kind == "add":
            return self.space.add(a, b)
        if kind == "sub":
            return self.space.add(a, b, -1)
        if kind == "mul":
            return self.space.mul(a, b)
        if kind == "floordiv":
            return self.space.floordiv(a, b)
        if kind == "mod":
            return self.space.mod(a, b)
        return self.space.minmax(a, b, kind)

    # scalar expressions -------------------------------------------------------------------
    def _scalar(self, v: Any, dtype: DType) -> Any:
        """Integers computed as index arithmetic become bit-vectors once they meet other ops."""
        if isinstance(v, IndexInt):
            if dtype is DType.bool:
                return self._bool(self.space.compare("ne", v.lin, IndexSpace.const(0)))
            if v.lin.is_const:
                return z3.BitVecVal(v.lin.const % (1 << dtype.bits), dtype.bits, self.ctx)
            return z3.Int2BV(self.space.term(v.lin), dtype.bits)
        return v

    def _bool(self, c: bool | z3.BoolRef) -> z3.BoolRef:
        if c is True or c is False:
            return self._true if c else self._false
        return c

    def _as_index(self, v: Any, dtype: DType) -> Lin | None:
        if isinstance(v, IndexInt):
            return v.lin
        if isinstance(v, z3.BitVecNumRef):
            return IndexSpace.const(v.as_signed_long() if dtype.is_signed else v.as_long())
        return None

    def expr(self, e: R.Expr, env: _Env, owner: Value) -> Any:
        if isinstance(e, R.Load):
            return self._load(e, env, owner)
        if isinstance(e, R.Lit):
            return self._lit(e.value, e.dtype)
        if isinstance(e, R.IndexValue):
            lin = self.ix(e.ix, env, owner)
            if e.dtype.is_float:
                return self.sem.index_to_float(self.space.term(lin), e.dtype)
            exact = self._index_int(lin, e.dtype)
            if exact is not None or e.dtype is DType.bool:
                return exact if exact is not None else self._bool(self.space.compare("ne", lin, IndexSpace.const(0)))
            return z3.Int2BV(self.space.term(lin), e.dtype.bits)  # wraps, as the interpreter's astype does
        key = (id(e), tuple(env.vars[n] for n in self._uses(e)))
        found = self._expr_memo.get(key)
        if found is not None:
            return found
        if isinstance(e, R.Call):
            out = self._call(e, env, owner)
        elif isinstance(e, R.Reduce):
            out = self._reduce(e, env, owner)
        else:
            raise EncodingError(f"unknown rule node {type(e).__name__}")
        self._expr_memo[key] = out
        return out

    def _uses(self, e: R.Expr) -> tuple[str, ...]:
        """The index variables an expression reads (its memo key depends on these only)."""
        found = self._uses_memo.get(id(e))
        if found is None:
            found = tuple(sorted(self._free(e)))
            self._uses_memo[id(e)] = found
        return found

    def _load(self, e: R.Load, env: _Env, owner: Value) -> Any:
        operand = owner.operands[e.operand]
        idx = tuple(self.ix(i, env, owner) for i in e.index)
        if e.oob is None:
            return self.value_at(operand, idx)
        bounds: list[_Bound] = []
        for i, d in zip(idx, operand.type.shape, strict=True):
            zero, extent = IndexSpace.const(0), self.dim(d)
            for c, diff, below in ((self.space.compare("ge", i, zero), i, False),
                                   (self.space.compare("lt", i, extent), self.space.add(i, extent, -1), True)):
                if c is False:
                    return self._lit(e.oob, e.dtype)
                if c is not True:
                    bounds.append(_Bound(c, diff, below))
        inner = self.value_at(operand, idx)
        if not bounds:
            return inner
        dt = e.dtype
        value, fill = self._scalar(inner, dt), self._scalar(self._lit(e.oob, dt), dt)
        nested = self._guarded.get(value.get_id()) if isinstance(value, z3.ExprRef) else None
        if nested is not None and isinstance(fill, z3.ExprRef) and z3.eq(nested.fill, fill):
            # a guarded read of a guarded read with the same fill (a pad's zeros read by a convolution's
            # window): one guard, without the bounds the other's imply, so the same read reached through
            # one bounds check or two is the same term (the sum's commuted operands are ordered by terms)
            kept = [o for o in bounds if not any(self._implies(n, o) for n in nested.bounds)]
            bounds = kept + [n for n in nested.bounds if not any(self._implies(o, n) for o in kept)]
            value = nested.value
        inb = bounds[0].cond if len(bounds) == 1 else boolean(z3.And(*(b.cond for b in bounds)))
        out = self.sem.select(inb, value, fill, dt)
        if isinstance(out, z3.ExprRef) and isinstance(fill, z3.ExprRef):
            self._guarded[out.get_id()] = _Guarded(out, tuple(bounds), value, fill)
        return out

    def _implies(self, a: _Bound, b: _Bound) -> bool:
        """Whether bound ``a`` holding makes ``b`` hold, decided from their linear forms alone."""
        if a.below != b.below:
            return False
        lo, hi = self.space.interval(self.space.add(b.diff, a.diff, -1))
        # ``diff >= 0`` bounds: b's diff at least a's; ``diff < 0`` ones: at most
        return (hi is not None and hi <= 0) if a.below else (lo is not None and lo >= 0)

    def _call(self, e: R.Call, env: _Env, owner: Value) -> Any:
        if e.fn == "bitcast":
            source = self._bits_source(e.args[0], env, owner)
            if source is not None:  # bits read as one type, then as another: read as the last at once
                self.sem.axioms.add("bitcast-round-trip")
                value, dtype = source
                return self.sem.bitcast(self._scalar(value, dtype), dtype, e.dtype)
        args = [self.expr(a, env, owner) for a in e.args]
        dtypes = [a.dtype for a in e.args]
        attrs = dict(e.attrs)
        fn = e.fn
        indexed = self._index_call(fn, args, dtypes, e.dtype)
        if indexed is not None:
            return indexed
        if fn == "select":
            cond = self._scalar(args[0], DType.bool)
            return self.sem.select(cond, self._scalar(args[1], e.dtype), self._scalar(args[2], e.dtype), e.dtype)
        scal = [self._scalar(a, d) for a, d in zip(args, dtypes, strict=True)]
        return self.sem.call(fn, scal, dtypes, e.dtype, attrs)

    def _bits_source(self, e: R.Expr, env: _Env, owner: Value) -> tuple[Any, DType] | None:
        """When ``e`` is itself a bit reinterpretation (a bitcast in the rule, or an in-bounds load of a
        bitcast op the encoder looks into), the value whose bits it reads and that value's type. A
        float's bits are lost in the sort only at NaN (``AbstractFPSemantics.float_bits``); reading
        them through the chain keeps them exactly, as the interpreter's views do."""
        if isinstance(e, R.Call) and e.fn == "bitcast":
            inner = e.args[0]
            return self._bits_source(inner, env, owner) or (self.expr(inner, env, owner), inner.dtype)
        if not isinstance(e, R.Load) or e.oob is not None:
            return None
        operand = owner.operands[e.operand]
        if operand.op != "bitcast" or self.leaf_of(operand) is not None:
            return None
        return self._value_bits_source(operand, tuple(self.ix(i, env, owner) for i in e.index))

    def _value_bits_source(self, v: Value, idx: tuple[Lin, ...]) -> tuple[Any, DType]:
        """The value a bitcast op ``v`` reads at ``idx`` (its operand has its shape), through a chain."""
        src = v.operands[0]
        if src.op == "bitcast" and self.leaf_of(src) is None:
            return self._value_bits_source(src, idx)
        return self.value_at(src, idx), src.dtype

    def _index_call(self, fn: str, args: list[Any], dtypes: list[DType], out: DType) -> Any:
        """Integer arithmetic on index-derived values stays in linear forms."""
        if not dtypes or not dtypes[-1].is_int:
            if fn == "select" and out.is_int:
                a, b = self._as_index(args[1], out), self._as_index(args[2], out)
                if a is not None and b is not None and (isinstance(args[1], IndexInt) or isinstance(args[2], IndexInt)):
                    c = self._scalar(args[0], DType.bool)
                    if z3.is_true(c):
                        return IndexInt(a)
                    if z3.is_false(c):
                        return IndexInt(b)
                    (alo, ahi), (blo, bhi) = self.space.interval(a), self.space.interval(b)
                    lo = None if alo is None or blo is None else min(alo, blo)
                    hi = None if ahi is None or bhi is None else max(ahi, bhi)
                    return IndexInt(self.space.atom(ite(c, self.space.term(a), self.space.term(b)), lo, hi))
            return None
        lins = [self._as_index(a, d) for a, d in zip(args, dtypes, strict=True)]
        ls = [x for x in lins if x is not None]
        if len(ls) < len(lins) or not any(isinstance(a, IndexInt) for a in args):
            return None
        if fn == "cast":
            if out.is_float:
                return self.sem.index_to_float(self.space.term(ls[0]), out)
            if out is DType.bool:
                return self._bool(self.space.compare("ne", ls[0], IndexSpace.const(0)))
            return self._index_int(ls[0], out)
        if fn in _INDEX_CMP:
            return self._bool(self.space.compare(fn, ls[0], ls[1]))
        # the result stays an index form only while it provably fits ``out`` (else: bit-vectors)
        if fn == "add":
            return self._index_int(self.space.add(ls[0], ls[1]), out)
        if fn == "sub":
            return self._index_int(self.space.add(ls[0], ls[1], -1), out)
        if fn == "mul":
            return self._index_int(self.space.mul(ls[0], ls[1]), out)
        if fn == "neg":
            return self._index_int(self.space.scale(ls[0], -1), out)
        if fn in ("min", "max"):
            return self._index_int(self.space.minmax(ls[0], ls[1], fn), out)
        if fn in ("div", "mod") and ls[1].is_const and ls[1].const > 0:
            lo, _ = self.space.interval(ls[0])
            if fn == "mod" or (lo is not None and lo >= 0):  # floored modulo / truncation of non-negatives
                lin = self.space.mod(ls[0], ls[1]) if fn == "mod" else self.space.floordiv(ls[0], ls[1])
                return self._index_int(lin, out)
        return None

    def _dot_body(self, e: R.Reduce, env: _Env, owner: Value) -> tuple[Any, Any]:
        """A dot reduction's two factors (its body's product is never read: the step rounds once)."""
        return tuple(self._scalar(self.expr(f, env, owner), e.dtype) for f in R.dot_factors(e))  # type: ignore[return-value]

    def _reduce(self, e: R.Reduce, env: _Env, owner: Value) -> Any:
        extents = [self.dim(d) for _, d in e.axes]
        dt = e.dtype
        dot = e.kind in R.DOT_KINDS
        if all(x.is_const for x in extents):
            n = int(np.prod([x.const for x in extents], dtype=np.int64))
            if n == 0:
                return self.sem.reduce_identity(e.kind, dt)
            if n <= self.unroll_limit:
                acc: Any = self.sem.lit(-0.0, dt) if dot else None  # a dot folds from -0.0, each term an fma
                names = [name for name, _ in e.axes]
                for combo in itertools.product(*[range(x.const) for x in extents]):
                    inner = env.bind({nm: IndexSpace.const(k) for nm, k in zip(names, combo, strict=True)})
                    if dot:
                        acc = self.sem.dot_step(e.kind, acc, *self._dot_body(e, inner, owner), dt)
                        continue
                    val = self._scalar(self.expr(e.body, inner, owner), dt)
                    acc = val if acc is None else self.sem.call(_KIND_OP[e.kind], [acc, val], [dt, dt], dt, {})
                return acc
        # one binder per reduction of a rule: the same reduction met in several contexts (a mean
        # inside a variance, a value read at several indices) encodes its body with the same
        # variables, so identical bodies are encoded once; named reductions rename binders anyway
        site = self._sites.setdefault((id(owner), id(e)), len(self._sites))
        binders: list[z3.ArithRef] = []
        bind: dict[str, Lin] = {}
        ext_values: list[int | z3.ArithRef] = []
        for j, ((name, _), ext) in enumerate(zip(e.axes, extents, strict=True)):
            b = z3.Int(f"__k{site}_{j}", self.ctx)
            binders.append(b)
            bind[name] = self.space.index_var(b, ext)
            ext_values.append(ext.const if ext.is_const else self.space.term(ext))
        if dot:
            body = self.sem.dot_term(e.kind, *self._dot_body(e, env.bind(bind), owner), dt)
        else:
            body = self._scalar(self.expr(e.body, env.bind(bind), owner), dt)
        return self._empty_extent_guard(e.kind, dt, extents, self.sem.reduce_symbolic(e.kind, body, dt, binders,
                                                                                        ext_values))

    def _empty_extent_guard(self, kind: str, dt: DType, extents: Sequence[Lin], out: Any) -> Any:
        """A reduction over an extent the constraints let be 0 is its identity there."""
        maybe_empty = [x for x in extents if (self.space.interval(x)[0] or 0) < 1]
        if not maybe_empty:
            return out
        empty = boolean(z3.Or(*[self.space.term(x) <= 0 for x in maybe_empty]))
        return self.sem.select(empty, self._scalar(self.sem.reduce_identity(kind, dt), dt), out, dt)


def _same_elements(flat: np.ndarray, first: Any) -> np.ndarray:
    if flat.dtype.kind == "f":
        return (flat == first) & (np.signbit(flat) == np.signbit(first)) | (np.isnan(flat) & np.isnan(first))
    return flat == first


def inequality(enc: ConeEncoder, a: Any, b: Any, dtype: DType) -> z3.BoolRef | None:
    """``a != b`` as a z3 formula, or None when the two are the same term (trivially equal)."""
    ta, tb = enc.term(a, dtype), enc.term(b, dtype)
    if z3.eq(ta, tb):
        return None
    if dtype is DType.bool:
        return z3.Xor(ta, tb)
    return boolean(ta != tb)


SUPPORTED_REDUCTIONS: dict[str, frozenset[str]] = {
    "float": frozenset({"sum", "prod", "max", "min", *R.DOT_KINDS}), "int": frozenset({"sum", "prod", "max", "min"}),
    "bool": frozenset({"max", "min"})}
"""The reduction kinds :class:`ConeEncoder` encodes, by element kind. A sum or product of bools is not:
unrolled, its steps would add (multiply) booleans, which no encoder defines. ``cuvil ops`` checks
each op's rule against this table."""

__all__ = ["ENCODING_BUDGET", "SUPPORTED_REDUCTIONS", "UNROLL_LIMIT", "ConeEncoder", "EncodingError", "IndexSpace",
           "Leaf", "Lin", "inequality"]
