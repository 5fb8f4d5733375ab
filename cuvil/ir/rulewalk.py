"""A reader of compute rules over a value domain, shared by the interval, concrete and torch readers.

Like the reference interpreter it evaluates a rule for every output index at once, index
variables laid out on their own axes. Unlike it, a subexpression is evaluated at the shallowest
reduction level its free index variables allow and reused (loop-invariant hoisting): a
layer norm's mean is computed once per row instead of once per term of the variance sum,
which keeps ``out_size * extent`` grids instead of ``out_size * extent ** 2``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from cuvil.errors import IRError
from cuvil.interp import bind_attr
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import Call, Expr, IndexValue, Ix, Lit, Load, Reduce
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

V = TypeVar("V")


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
    grid: int = 1

    @staticmethod
    def of(v: Value) -> RuleInfo:
        """The rule of an op value (static shapes)."""
        opdef = get_op(v.op)
        in_types = [TensorType(o.dtype, tuple(int(d) for d in o.shape)) for o in v.operands]
        out_type = TensorType(v.dtype, tuple(int(d) for d in v.shape))
        attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
        return RuleInfo.build(opdef.make_rule(in_types, attrs, out_type), out_type.shape)

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
            self._free(e)

    def _free(self, e: Expr) -> frozenset[str]:
        hit = self.free.get(id(e))
        if hit is None:
            hit = self.free[id(e)] = self._free_of(e)
        return hit

    def _free_of(self, e: Expr) -> frozenset[str]:
        if isinstance(e, Load):
            return frozenset().union(*(self.ix_free(i) for i in e.index)) if e.index else frozenset()
        if isinstance(e, IndexValue):
            return self.ix_free(e.ix)
        if isinstance(e, Call):
            return frozenset().union(*(self._free(a) for a in e.args))
        if isinstance(e, Reduce):
            return self._free(e.body) - {n for n, _ in e.axes}
        return frozenset()

    def ix_free(self, i: Ix) -> frozenset[str]:
        if i.kind == "var":
            return frozenset((i.args[0],))
        if i.kind == "lit":
            return frozenset()
        if i.kind == "dyn":
            return self._free(i.args[0])
        return self.ix_free(i.args[0]) | self.ix_free(i.args[1])

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
        if e.fn == "cast":
            return f"cast<{dict(e.attrs)['to']}>({describe(e.args[0], depth - 1)})"
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


def _ix_combine(kind: str, a: IxVal, b: IxVal) -> IxVal:
    if a.concrete and b.concrete:
        x, y = a.lo, b.lo
        ops: dict[str, Callable[[], np.ndarray]] = {
            "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
            "floordiv": lambda: np.floor_divide(x, np.where(y == 0, 1, y)),
            "mod": lambda: np.mod(x, np.where(y == 0, 1, y)),
            "min": lambda: np.minimum(x, y), "max": lambda: np.maximum(x, y)}
        return IxVal.exact(ops[kind]())
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
            body = self.expr(e.body)
            out = self.reduce(e, body, tuple(range(base, base + len(extents))), extents)
        finally:
            self.level, self.depth = level, base
            self.level_depth = saved_depths
            for name, _ in e.axes:
                self.env.pop(name, None)
            self.memo = {k: v for k, v in self.memo.items() if v[0] <= level}
        return out

    def ix(self, e: Ix) -> IxVal:
        k = e.kind
        if k == "var":
            return IxVal.exact(self.lift_array(self.env[e.args[0]]))
        if k == "lit":
            return IxVal.exact(self.lift_array(np.array(int(e.args[0]), dtype=np.int64)))
        if k == "dyn":
            r = self.dyn_index(e.args[0])
            return r if r.concrete else IxVal(self.lift_array(r.lo), self.lift_array(r.hi))
        a, b = self.ix(e.args[0]), self.ix(e.args[1])
        return _ix_combine(k, a, b)


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


def run_chunked(info: RuleInfo, make: Callable[[tuple[int, int, int] | None], RuleWalker[V]],
                budget: int) -> list[tuple[tuple[int, int, int] | None, V, RuleWalker[V]]]:
    out = []
    for ch in chunks(info, budget):
        w = make(ch)
        out.append((ch, w.expr(info.rule), w))
    return out


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
