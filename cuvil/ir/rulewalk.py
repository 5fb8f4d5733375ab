"""The one kit for reading compute rules (:mod:`cuvil.ir.rules`): every reader of the rule
language uses it for what is not specific to its domain.

* Analysis: a rule's nodes (:func:`children`, :func:`walk_exprs`), the index variables a node
  depends on (:class:`FreeVars`, :func:`free_vars`, :func:`mentioned_vars`), a short label.
* Index folding: :func:`fold_ix` walks an index expression once for any domain (numpy arrays,
  z3 linear terms, LLVM values, structural keys); :func:`numpy_ix` is the meaning of index
  arithmetic on concrete integers (floored division and modulo).
* A generic vectorized walker (:class:`RuleWalker`) over a value domain: a rule is evaluated for
  every output index at once, index variables laid out on their own axes, and a subexpression is
  evaluated at the shallowest reduction level its free index variables allow and reused
  (loop-invariant hoisting: a layer norm's mean is computed once per row instead of once per term
  of the variance sum). The reference interpreter (:mod:`cuvil.ir.evaluate`) is its numpy
  instance; the prober's concrete, interval and torch readers are instances too.

Reduction identities and combiners are a table next to the primitives
(:data:`cuvil.ir.rules.REDUCTIONS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from cuvil.errors import IRError, UnsupportedOpError
from cuvil.ir.numpy_prims import literal
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import DOT_KINDS, Call, Expr, IndexValue, Ix, Lit, Load, Reduce, dot_factors
from cuvil.ir.specialize import bind_attr
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

V = TypeVar("V")
T = TypeVar("T")


# --------------------------------------------------------------------------------------
# index expressions, folded once for every domain

IX_BINARY = ("add", "sub", "mul", "floordiv", "mod", "min", "max")
"""The binary index operators; ``floordiv`` and ``mod`` are floored (Python's ``//`` and ``%``)."""


def fold_ix(e: Ix, *, var: Callable[[str], T], lit: Callable[[Any], T], dyn: Callable[[Expr], T],
            op: Callable[[str, T, T], T]) -> T:
    """An index expression read in some domain: ``var(name)``, ``lit(dim)``, ``dyn(scalar expr)``
    for the leaves, ``op(kind, a, b)`` for each binary node (``kind`` in :data:`IX_BINARY`)."""
    k = e.kind
    if k == "var":
        return var(e.args[0])
    if k == "lit":
        return lit(e.args[0])
    if k == "dyn":
        return dyn(e.args[0])
    if k not in IX_BINARY:
        raise IRError(f"unknown index expression kind {k!r}")
    a = fold_ix(e.args[0], var=var, lit=lit, dyn=dyn, op=op)
    return op(k, a, fold_ix(e.args[1], var=var, lit=lit, dyn=dyn, op=op))


_NUMPY_IX: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "mod": np.mod,
    "min": np.minimum, "max": np.maximum}


def numpy_ix(kind: str, a: Any, b: Any) -> Any:
    """Index arithmetic on concrete integers (arrays or scalars), as the rule language means it."""
    with np.errstate(divide="ignore"):
        return _NUMPY_IX[kind](a, b)


# --------------------------------------------------------------------------------------
# free index variables


class FreeVars:
    """The index variables each node of a rule depends on (a reduction binds its own axes),
    computed once per node. Nodes are keyed by identity and kept alive with the table."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Expr, frozenset[str]]] = {}

    def __call__(self, e: Expr) -> frozenset[str]:
        hit = self._memo.get(id(e))
        if hit is not None:
            return hit[1]
        if isinstance(e, Load):
            out = frozenset().union(*(self.ix(i) for i in e.index)) if e.index else frozenset()
        elif isinstance(e, IndexValue):
            out = self.ix(e.ix)
        elif isinstance(e, Call):
            out = frozenset().union(*(self(a) for a in e.args))
        elif isinstance(e, Reduce):
            out = self(e.body) - {n for n, _ in e.axes}
        else:
            out = frozenset()
        self._memo[id(e)] = (e, out)
        return out

    def ix(self, i: Ix) -> frozenset[str]:
        return fold_ix(i, var=lambda n: frozenset((n,)), lit=lambda _: frozenset(), dyn=self,
                       op=lambda _, a, b: a | b)


def free_vars(e: Expr) -> frozenset[str]:
    """The index variables ``e`` depends on (one-off; readers that ask often keep a :class:`FreeVars`)."""
    return FreeVars()(e)


def mentioned_vars(e: Expr) -> frozenset[str]:
    """Every index variable ``e`` names, bound inside it or not."""
    out: set[str] = set()
    for node in walk_exprs(e):
        if isinstance(node, Load):
            for i in node.index:
                out |= _ix_names(i)
        elif isinstance(node, IndexValue):
            out |= _ix_names(node.ix)
    return frozenset(out)


def _ix_names(i: Ix) -> frozenset[str]:
    return fold_ix(i, var=lambda n: frozenset((n,)), lit=lambda _: frozenset(), dyn=lambda _: frozenset(),
                   op=lambda _, a, b: a | b)


# --------------------------------------------------------------------------------------
# one rule, analysed once


@dataclass
class RuleInfo:
    """A value's rule at concrete shapes with what every reader needs to know about it: its
    nodes in a stable preorder (shared nodes once), their free index variables, and how many
    grid elements the deepest reduction needs per output element (after hoisting)."""

    rule: Expr
    out_shape: tuple[int, ...]
    nodes: list[Expr] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)
    free: dict[int, frozenset[str]] = field(default_factory=dict)
    free_table: FreeVars = field(default_factory=FreeVars)
    grid: int = 1

    @staticmethod
    def of(v: Value) -> RuleInfo:
        """The rule of an op value (static shapes)."""
        opdef = get_op(v.op)
        in_types = [TensorType(o.dtype, tuple(int(d) for d in o.shape)) for o in v.operands]
        out_shape = tuple(int(d) for d in v.shape)
        out_type = TensorType(v.dtype, out_shape)
        attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
        return RuleInfo.build(opdef.make_rule(in_types, attrs, out_type), out_shape)

    @staticmethod
    def build(rule: Expr, out_shape: Sequence[int]) -> RuleInfo:
        info = RuleInfo(rule, tuple(int(d) for d in out_shape))
        info._collect(rule)
        info.grid = info._grid(rule)
        return info

    def _collect(self, root: Expr) -> None:
        stack: list[Expr] = [root]
        while stack:
            e = stack.pop()
            if id(e) in self.index:
                continue
            self.index[id(e)] = len(self.nodes)
            self.nodes.append(e)
            stack.extend(reversed(children(e)))
        for e in self.nodes:
            self.free[id(e)] = self.free_table(e)

    def ix_free(self, i: Ix) -> frozenset[str]:
        return self.free_table.ix(i)

    def _grid(self, root: Expr) -> int:
        """The most grid points any node is evaluated on (a node lives on the axes of its free
        index variables: output axes it uses and the reductions it is inside of)."""
        size = {f"i{k}": n for k, n in enumerate(self.out_shape)}
        best = math.prod(self.out_shape)
        for sub in walk_exprs(root):
            if isinstance(sub, Reduce):
                base = math.prod(size.get(n, 1) for n in self.free[id(sub)] if n in size)
                total = base * math.prod(int(evaluate_dim(n, {})) for _, n in sub.axes)
                for name, n in sub.axes:
                    size[name] = int(evaluate_dim(n, {}))
                best = max(best, total)
        return best

    def label(self, e: Expr) -> str:
        return describe(e)


def children(e: Expr) -> list[Expr]:
    if isinstance(e, Call):
        return list(e.args)
    if isinstance(e, Reduce):
        return [e.body]
    if isinstance(e, Load):
        return [x for i in e.index for x in dyn_exprs(i)]
    if isinstance(e, IndexValue):
        return dyn_exprs(e.ix)
    return []


def dyn_exprs(i: Ix) -> list[Expr]:
    """The scalar expressions used as indices inside an index expression."""
    if i.kind == "dyn":
        return [i.args[0]]
    if i.kind in ("var", "lit"):
        return []
    return dyn_exprs(i.args[0]) + dyn_exprs(i.args[1])


def walk_exprs(root: Expr) -> list[Expr]:
    """Every node of a rule once (by identity), parents before children."""
    seen: set[int] = set()
    out: list[Expr] = []
    stack = [root]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        stack.extend(reversed(children(e)))
    return out


def describe(e: Expr, depth: int = 2) -> str:
    """A short human-readable form of a rule node (for reports)."""
    if isinstance(e, Load):
        return f"in{e.operand}[..]"
    if isinstance(e, Lit):
        return repr(e.value)
    if isinstance(e, IndexValue):
        return "index"
    if isinstance(e, Reduce):
        n = math.prod(int(evaluate_dim(d, {})) for _, d in e.axes)
        inner = describe(e.body, depth - 1) if depth > 0 else ".."
        return f"{e.kind}[{n}]({inner})"
    if isinstance(e, Call):
        if depth <= 0:
            return f"{e.fn}(..)"
        if e.fn in ("cast", "bitcast"):
            return f"{e.fn}<{dict(e.attrs)['to']}>({describe(e.args[0], depth - 1)})"
        return f"{e.fn}(" + ", ".join(describe(a, depth - 1) for a in e.args) + ")"
    return type(e).__name__


# --------------------------------------------------------------------------------------
# index values


@dataclass(frozen=True)
class IxVal:
    """An index as an int array, or a range ``[lo, hi]`` per position when it depends on data."""

    lo: np.ndarray
    hi: np.ndarray

    @property
    def concrete(self) -> bool:
        return self.lo is self.hi

    @staticmethod
    def exact(a: np.ndarray) -> IxVal:
        return IxVal(a, a)


def ix_interval(kind: str, a: IxVal, b: IxVal) -> IxVal:
    """Index arithmetic on :class:`IxVal`: exact on concrete indices, a sound range otherwise."""
    if a.concrete and b.concrete:
        return IxVal.exact(numpy_ix(kind, a.lo, b.lo))
    if kind == "add":
        return IxVal(a.lo + b.lo, a.hi + b.hi)
    if kind == "sub":
        return IxVal(a.lo - b.hi, a.hi - b.lo)
    if kind in ("mul", "floordiv"):
        if kind == "floordiv" and np.any((b.lo <= 0) & (b.hi >= 0)):
            big = np.maximum(np.abs(a.lo), np.abs(a.hi))
            return IxVal(-big, big)
        f = np.multiply if kind == "mul" else np.floor_divide
        c = [f(p, q) for p in (a.lo, a.hi) for q in (b.lo, b.hi)]
        return IxVal(np.minimum.reduce(c), np.maximum.reduce(c))
    if kind == "mod":
        m = np.maximum(np.abs(b.lo), np.abs(b.hi))
        return IxVal(np.where(b.lo > 0, 0, -m + 1), np.where(b.hi < 0, 0, m - 1))
    if kind == "min":
        return IxVal(np.minimum(a.lo, b.lo), np.minimum(a.hi, b.hi))
    if kind == "max":
        return IxVal(np.maximum(a.lo, b.lo), np.maximum(a.hi, b.hi))
    raise IRError(f"unknown index expression kind {kind!r}")


# --------------------------------------------------------------------------------------
# the walker


class RuleWalker(Generic[V]):
    """Evaluates one rule over a block of output indices (``chunk = (axis, start, stop)``)."""

    def __init__(self, info: RuleInfo, chunk: tuple[int, int, int] | None = None) -> None:
        self.info = info
        shape = info.out_shape
        self.out_rank = len(shape)
        self.depth = self.out_rank
        self.level = 0
        self.level_depth = [self.out_rank]
        self.env: dict[str, np.ndarray] = {}
        self.var_level: dict[str, int] = {}
        self.chunk = chunk
        for k, n in enumerate(shape):
            a = np.arange(chunk[1], chunk[2]) if chunk is not None and chunk[0] == k else np.arange(n)
            self.env[f"i{k}"] = self._axis(a.astype(np.int64), k, self.out_rank)
            self.var_level[f"i{k}"] = 0
        self.memo: dict[int, tuple[int, Any]] = {}

    @property
    def block_shape(self) -> tuple[int, ...]:
        shape = list(self.info.out_shape)
        if self.chunk is not None:
            shape[self.chunk[0]] = self.chunk[2] - self.chunk[1]
        return tuple(shape)

    @staticmethod
    def _axis(a: np.ndarray, pos: int, depth: int) -> np.ndarray:
        shape = [1] * depth
        shape[pos] = a.size
        return a.reshape(shape)

    def lift_array(self, a: Any) -> Any:
        nd = a.ndim
        if nd == self.depth:
            return a
        return a.reshape(tuple(a.shape) + (1,) * (self.depth - nd))

    # domain hooks ---------------------------------------------------------------------
    def lift(self, v: V) -> V:
        return self.lift_array(v)  # type: ignore[arg-type]

    def load(self, e: Load, idx: list[IxVal]) -> V:
        raise NotImplementedError

    def literal(self, e: Lit) -> V:
        raise NotImplementedError

    def index_value(self, e: IndexValue, ix: IxVal) -> V:
        raise NotImplementedError

    def call(self, e: Call, args: list[V]) -> V:
        raise NotImplementedError

    def reduce(self, e: Reduce, body: V, axes: tuple[int, ...], extents: list[int]) -> V:
        raise NotImplementedError

    def reduce_dot(self, e: Reduce, x: V, y: V, axes: tuple[int, ...], extents: list[int]) -> V:
        """A ``dot`` kind (:data:`cuvil.ir.rules.DOT_KINDS`) of the factors ``x`` and ``y``; a reader
        that has no reading of it refuses the rule."""
        raise UnsupportedOpError(f"{type(self).__name__} has no reading of a {e.kind!r} reduction",
                                 hint="`cuvil ops` lists the readers each op's rule is supported by")

    def dyn_index(self, e: Expr) -> IxVal:
        raise NotImplementedError

    def observe(self, e: Expr, value: V) -> None:
        """Called once per evaluated node (sites record their values here)."""

    # evaluation -----------------------------------------------------------------------
    def level_of(self, e: Expr) -> int:
        free = self.info.free.get(id(e))
        if free is None:
            return self.level
        return max((self.var_level.get(n, 0) for n in free), default=0)

    def expr(self, e: Expr) -> V:
        lv = min(self.level_of(e), self.level)
        hit = self.memo.get(id(e))
        if hit is not None and hit[0] == lv:
            return self.lift(hit[1])
        if lv < self.level:
            saved = (self.level, self.depth)
            self.level, self.depth = lv, self.level_depth[lv]
            try:
                val = self._eval(e)
            finally:
                self.level, self.depth = saved
        else:
            val = self._eval(e)
        self.memo[id(e)] = (lv, val)
        return self.lift(val)

    def _eval(self, e: Expr) -> V:
        if isinstance(e, Load):
            out = self.load(e, [self.ix(i) for i in e.index])
        elif isinstance(e, Lit):
            out = self.literal(e)
        elif isinstance(e, IndexValue):
            out = self.index_value(e, self.ix(e.ix))
        elif isinstance(e, Call):
            out = self.call(e, [self.expr(a) for a in e.args])
        elif isinstance(e, Reduce):
            out = self._reduce(e)
        else:
            raise IRError(f"unknown rule node {type(e).__name__}")
        self.observe(e, out)
        return out

    def _reduce(self, e: Reduce) -> V:
        extents = [int(evaluate_dim(n, {})) for _, n in e.axes]
        base, level = self.depth, self.level
        saved_depths = self.level_depth
        self.level_depth = [*saved_depths[:level + 1], base + len(extents)]
        self.level, self.depth = level + 1, base + len(extents)
        for k, ((name, _), n) in enumerate(zip(e.axes, extents, strict=True)):
            self.env[name] = self._axis(np.arange(n, dtype=np.int64), base + k, self.depth)
            self.var_level[name] = level + 1
        try:
            axes = tuple(range(base, base + len(extents)))
            if e.kind in DOT_KINDS:  # the factors, not their rounded product
                x, y = dot_factors(e)
                out = self.reduce_dot(e, self.expr(x), self.expr(y), axes, extents)
            else:
                out = self.reduce(e, self.expr(e.body), axes, extents)
        finally:
            self.level, self.depth = level, base
            self.level_depth = saved_depths
            for name, _ in e.axes:
                self.env.pop(name, None)
            self.memo = {k: v for k, v in self.memo.items() if v[0] <= level}
        return out

    def ix(self, e: Ix) -> IxVal:
        return fold_ix(e, var=lambda n: IxVal.exact(self.lift_array(self.env[n])),
                       lit=lambda d: IxVal.exact(self.lift_array(np.array(int(d), dtype=np.int64))),
                       dyn=self._dyn, op=ix_interval)

    def _dyn(self, e: Expr) -> IxVal:
        r = self.dyn_index(e)
        return r if r.concrete else IxVal(self.lift_array(r.lo), self.lift_array(r.hi))


# --------------------------------------------------------------------------------------
# chunking


def chunks(info: RuleInfo, budget: int) -> list[tuple[int, int, int] | None]:
    """Blocks of output indices whose evaluation grids stay under ``budget`` elements."""
    shape = info.out_shape
    total = info.grid
    if total <= budget or not shape:
        return [None]
    axis = int(np.argmax(shape))
    n = shape[axis]
    per = max(1, int(n * budget // total))
    return [(axis, s, min(n, s + per)) for s in range(0, n, per)]


def read_masked(arr: np.ndarray, ix: Sequence[np.ndarray], oob: Any) -> np.ndarray:
    """``arr`` read at integer index grids ``ix``; out-of-bounds elements take ``oob`` (or an
    arbitrary in-bounds element when the load has no padding value, as the rule says)."""
    if not ix:
        return np.asarray(arr)
    inb = np.ones((1,) * ix[0].ndim, dtype=bool)
    for k, i in enumerate(ix):
        inb = inb & (i >= 0) & (i < arr.shape[k])
    clipped = tuple(np.clip(i, 0, max(arr.shape[k] - 1, 0)) for k, i in enumerate(ix))
    vals = arr[clipped] if arr.size else np.zeros(np.broadcast_shapes(*(i.shape for i in ix)), arr.dtype)
    if oob is not None:
        vals = np.where(inb, vals, np.array(oob, dtype=arr.dtype))
    return np.asarray(vals)


# --------------------------------------------------------------------------------------
# a walker over numpy arrays


class ArrayWalker(RuleWalker[np.ndarray]):
    """A walker whose values and operands are numpy arrays: literals are the rule language's
    (:func:`cuvil.ir.numpy_prims.literal`), a read outside an operand takes the load's padding
    value (an arbitrary in-bounds element when it has none), indices read from data are exact."""

    def __init__(self, info: RuleInfo, operands: Sequence[np.ndarray | None],
                 chunk: tuple[int, int, int] | None = None) -> None:
        super().__init__(info, chunk)
        self.operands = operands

    def operand(self, e: Load) -> np.ndarray:
        arr = self.operands[e.operand]
        if arr is None:
            raise IRError(f"the rule reads operand {e.operand}, which was not given")
        return arr

    def load(self, e: Load, idx: list[IxVal]) -> np.ndarray:
        return self.lift_array(read_masked(self.operand(e), [i.lo for i in idx], e.oob))

    def literal(self, e: Lit) -> np.ndarray:
        return self.lift_array(literal(e.value, e.dtype))

    def index_value(self, e: IndexValue, ix: IxVal) -> np.ndarray:
        return ix.lo

    def dyn_index(self, e: Expr) -> IxVal:
        return IxVal.exact(self.expr(e).astype(np.int64))
