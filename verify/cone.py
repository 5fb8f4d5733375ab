"""Diffing a rewrite: which values both sides share, which constants a rewrite derived, and
the cones between an output and that cut, as runnable functions.

Values with the same structural hash in the graph before and after a pass are the same
computation; the verifier cuts both graphs there and treats them as shared free tensors.
A constant that only the new graph has (``fold-constants`` output) is matched with a
constant expression of the old graph when the reference interpreter evaluates that
expression to the very same bytes: the two become one leaf, validated by re-evaluation.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.hashing import structural_hash
from cuvil.ir.module import Function, content_hash
from cuvil.ir.opdef import get_op
from cuvil.ir.region import Region
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, param, reachable, walk
from verify.cone_encoder import Leaf

CONCRETE_LIMIT = 16
"""Constants only one side has are read element by element up to this size (splats at any size)."""

FOLD_MATCH_LIMIT = 1 << 22
"""Constant expressions larger than this are not re-evaluated to match folded constants."""

FOLD_MATCH_TOTAL = 1 << 25
"""Elements of constant expressions one side re-evaluates in all (a bound on the table's own work)."""

# leaf kinds that become inputs of cone functions (one-sided constants stay constants)
INPUT_KINDS = ("param", "shared", "constant", "folded", "cut")


def _ident(text: str) -> str:
    clean = re.sub(r"\W", "_", text)[:24]
    return f"{clean}_{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def _finite_range(data: np.ndarray) -> tuple[float, float] | None:
    arr = np.asarray(data)
    if arr.size == 0 or arr.dtype.kind not in "fiu":
        return None
    a64 = arr.astype(np.float64)
    if not np.all(np.isfinite(a64)):
        return None
    return float(a64.min()), float(a64.max())


def _is_splat(data: np.ndarray) -> bool:
    flat = np.asarray(data).reshape(-1)
    if flat.size == 0:
        return False
    first = flat[0]
    if flat.dtype.kind == "f":
        return bool(np.all((flat == first) & (np.signbit(flat) == np.signbit(first)))) or bool(np.all(np.isnan(flat)))
    return bool(np.all(flat == first))


def param_dependent(values: Iterable[Value]) -> set[Value]:
    """Values that depend on a function parameter (the rest are constant expressions)."""
    out: set[Value] = set()
    for v in values:
        if v.is_param or any(o in out for o in v.operands):
            out.add(v)
    return out


@dataclass
class LeafTable:
    """The cut between one function before and after a pass."""

    before: Function
    after: Function
    constants: Mapping[str, np.ndarray]
    leaves: dict[Value, Leaf] = field(default_factory=dict)
    common: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    _cuts: int = 0
    congruences: list[dict[str, Any]] = field(default_factory=list)
    """Pairs cut without a query of their own (same op, attributes and operand leaves; loops whose
    bodies were proved equal), with what justified each: the certificate lists them for audit."""

    @staticmethod
    def build(before: Function, after: Function, constants_before: Mapping[str, np.ndarray],
              constants_after: Mapping[str, np.ndarray]) -> LeafTable:
        consts = {**constants_before, **constants_after}
        table = LeafTable(before, after, consts)
        vb, va = before.values(), after.values()
        hb = {structural_hash(v) for v in vb}
        ha = {structural_hash(v) for v in va}
        table.common = hb & ha
        for v in (*vb, *va):
            if v in table.leaves:
                continue
            h = structural_hash(v)
            if v.is_param:
                table.leaves[v] = Leaf(f"p_{_ident(v.name)}", f"%{v.name}", v.type, "param", before=v, after=v)
            elif v.is_const:
                data = consts[v.const_hash]
                shared = h in table.common
                # a splat is its value on both sides (one literal: a rewrite of x * 1 is proved by it, where an
                # opaque constant left every obligation downstream to a proof of the whole network)
                concrete = _is_splat(data) or (not shared and np.asarray(data).size <= CONCRETE_LIMIT)
                table.leaves[v] = Leaf(f"c_{v.const_hash}", f"@{v.const_hash[:9]}", v.type,
                                       "constant" if shared else "local-constant", data=data, concrete=concrete,
                                       value_range=_finite_range(data), before=v, after=v)
            elif h in table.common:
                table.leaves[v] = Leaf(f"s_{h}", f"%{v.op}#{h[:6]}", v.type, "shared", before=v, after=v)
        memo_b, memo_a = table._constant_values(vb), table._constant_values(va)
        table._match_folded(vb, memo_b, va, exprs_before=True)
        table._match_folded(va, memo_a, vb, exprs_before=False)
        table._match_expressions(vb, memo_b, va, memo_a)
        return table

    def _constant_values(self, values: list[Value]) -> dict[Value, np.ndarray]:
        """Every constant expression of one side that the reference interpreter evaluates (static
        shapes, at most :data:`FOLD_MATCH_LIMIT` elements each and :data:`FOLD_MATCH_TOTAL` in all),
        the constants themselves included."""
        dependent = param_dependent(values)
        memo: dict[Value, np.ndarray] = {}
        total = 0
        for v in values:
            if v in dependent or v.is_param:
                continue
            if v.is_const:
                memo[v] = self.constants[v.const_hash]
                continue
            if not v.type.is_static or any(o not in memo for o in v.operands):
                continue
            size = int(np.prod([int(d) for d in v.type.shape], dtype=np.int64))
            if size > FOLD_MATCH_LIMIT or total + size > FOLD_MATCH_TOTAL:
                continue
            try:
                memo[v] = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], v.attr_dict, v.type)
            except CuvilError:
                continue
            total += size
        return memo

    def _fresh_expressions(self, values: list[Value], memo: Mapping[Value, np.ndarray]) -> list[Value]:
        """The evaluated constant expressions of one side that are neither shared nor already a leaf."""
        return [v for v in values if v in memo and not v.is_const and v not in self.leaves
                and structural_hash(v) not in self.common]

    def _match_expressions(self, before: list[Value], memo_b: Mapping[Value, np.ndarray], after: list[Value],
                           memo_a: Mapping[Value, np.ndarray]) -> None:
        """Pair a constant expression of one side with one of the other that evaluates to the same bytes
        (a pass rewrote an index computation both sides gather with: a relative-position table's indices
        with their reshapes removed). A constant expression is its value, so the pair is one folded leaf
        and the ops that read it meet the same tensor on both sides, where otherwise the proof had to
        relate two index computations through a gather."""
        by_content: dict[tuple[str, object], list[Value]] = {}
        for v in self._fresh_expressions(before, memo_b):
            by_content.setdefault((content_hash(memo_b[v]), v.type), []).append(v)
        paired: dict[tuple[str, object], Leaf] = {}
        for va in self._fresh_expressions(after, memo_a):
            key = (content_hash(memo_a[va]), va.type)
            if key not in by_content:
                continue
            leaf = paired.get(key)
            if leaf is None:
                data = memo_a[va]
                leaf = Leaf(f"f_{key[0]}", f"@{key[0][:9]}", va.type, "folded", data=data,
                            value_range=_finite_range(data), before=by_content[key][0], after=va)
                paired[key] = leaf
                for vb in by_content[key]:
                    self.leaves[vb] = leaf
            self.leaves[va] = leaf
        if paired:
            ops = ", ".join(sorted({leaf.before.op for leaf in paired.values() if leaf.before is not None}))
            self.notes.append(f"{len(paired)} pairs of constant expressions equal bit for bit, re-evaluated ({ops})")

    def _match_folded(self, exprs_side: list[Value], memo: Mapping[Value, np.ndarray], consts_side: list[Value], *,
                      exprs_before: bool) -> None:
        """Pair constant expressions of one side with constants of the other holding the same bytes
        (a folded result may coincide with a constant both sides read: a bias quantized to the
        very integers it was dequantized from)."""
        targets = {v.const_hash: v for v in consts_side if v.is_const}
        if not targets:
            return
        for v in exprs_side:
            if v not in memo or v.is_const or structural_hash(v) in self.common or v in self.leaves:
                continue
            key = content_hash(memo[v])
            const = targets.get(key)
            if const is None or const.type != v.type:
                continue
            data = self.constants[key]
            leaf = Leaf(f"f_{key}", f"@{key[:9]}", v.type, "folded", data=data, value_range=_finite_range(data))
            existing = self.leaves.get(const)
            if existing is not None and existing.kind == "folded":
                # the other side's expression was paired with this constant first: the leaf now pairs the two
                # expressions (each reads as the constant's bytes), and the constant stays one of its values
                leaf = existing
                if exprs_before:
                    leaf.before = v
                else:
                    leaf.after = v
            else:
                leaf.before, leaf.after = (v, const) if exprs_before else (const, v)
            self.leaves[v] = leaf
            self.leaves[const] = leaf
            self.notes.append(f"@{key[:9]} equals its constant expression {v.op}(...) bit for bit (re-evaluated)")

    def add_cut(self, vb: Value, va: Value, why: str = "") -> Leaf:
        """Make a pair proved equal one shared leaf for later obligations; ``why``: the justification of
        a pair cut without a query of its own (recorded in :attr:`congruences`)."""
        if why:
            operands = [self.leaves[o].key if o in self.leaves else "?" for o in va.operands]
            self.congruences.append({"op": va.op, "before": structural_hash(vb), "after": structural_hash(va),
                                     "operand_leaves": operands, "why": why})
        existing = self.leaves.get(vb)
        if existing is not None and existing.kind == "cut":
            self.leaves[va] = existing
            return existing
        self._cuts += 1
        leaf = Leaf(f"cut{self._cuts}_{structural_hash(va)[:8]}", f"%{va.op}~{structural_hash(va)[:6]}", va.type,
                    "cut", before=vb, after=va)
        self.leaves[vb] = leaf
        self.leaves[va] = leaf
        return leaf

    def copy(self) -> LeafTable:
        """An independent table (cut points added to the copy stay there)."""
        return LeafTable(self.before, self.after, self.constants, dict(self.leaves), set(self.common),
                         list(self.notes), self._cuts, list(self.congruences))

    def leaf_of(self, v: Value) -> Leaf | None:
        return self.leaves.get(v)

    def opened(self, before: Value, after: Value, rounds: int = 4, eager: int = 0) -> Callable[[Value], Leaf | None]:
        """A leaf lookup that looks through the shared values and cut points only one side reads.
        Cutting at every shared value loses how they relate: one side may read a shared ``x``
        where the other reads a shared ``reshape(x)``; opening the latter exposes ``x`` to both.
        ``eager`` then opens every remaining shared leaf that many levels deep (``relu(s)`` against
        ``s`` where ``s = relu(x)`` is shared)."""
        opened: set[Value] = set()

        def lookup(v: Value) -> Leaf | None:
            return None if v in opened else self.leaves.get(v)

        for _ in range(rounds):
            lb, la = self.leaf_values(before, lookup), self.leaf_values(after, lookup)
            useful: list[Value] = []
            for mine, theirs in ((lb, la), (la, lb)):
                for key, vs in mine.items():
                    if key in theirs:
                        continue
                    for v in vs:
                        # open only what exposes a leaf the other side reads
                        if self._openable(v) and any(k in theirs for k in self._exposed(v, lookup)):
                            useful.append(v)
            if not useful:
                break
            opened.update(useful)
        for _ in range(eager):  # open everything one more level on both sides
            layer = [v for vs in (*self.leaf_values(before, lookup).values(),
                                  *self.leaf_values(after, lookup).values()) for v in vs if self._openable(v)]
            if not layer:
                break
            opened.update(layer)
        return lookup

    def _exposed(self, v: Value, lookup: Callable[[Value], Leaf | None]) -> set[str]:
        out: set[str] = set()
        for o in v.operands:
            out.update(self.leaf_values(o, lookup))
        return out

    def leaf_values(self, root: Value, lookup: Callable[[Value], Leaf | None]) -> dict[str, list[Value]]:
        """The leaves ``root``'s cone reads (down to them, through ``lookup``), by key, with the values read."""
        out: dict[str, list[Value]] = {}

        def step(v: Value) -> tuple[Value, ...]:
            leaf = lookup(v)
            if leaf is None:
                return v.operands
            out.setdefault(leaf.key, []).append(v)
            return ()

        reachable([root], step)
        return out

    def _openable(self, v: Value) -> bool:
        leaf = self.leaves.get(v)
        return leaf is not None and leaf.kind in ("shared", "cut")

    def cone(self, root: Value, leaf_of: Callable[[Value], Leaf | None] | None = None
             ) -> tuple[list[Value], list[Leaf]]:
        """Non-leaf values from ``root`` down to the cut (operands first) and the leaves reached."""
        lookup = leaf_of or self.leaf_of
        seen: set[Value] = set()
        order: list[Value] = []
        leaves: dict[str, Leaf] = {}
        stack: list[tuple[Value, bool]] = [(root, False)]
        while stack:
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            if v in seen:
                continue
            seen.add(v)
            leaf = lookup(v)
            if leaf is not None:
                leaves.setdefault(leaf.key, leaf)
                continue
            stack.append((v, True))
            for o in reversed(v.operands):
                if o not in seen:
                    stack.append((o, False))
        return order, list(leaves.values())


# --------------------------------------------------------------------------------------
# cones as runnable functions


@dataclass
class ConeFunctions:
    """Both cones of an obligation as functions of the same inputs (the cut leaves)."""

    inputs: list[Leaf]
    before: Function
    after: Function


def cone_function(name: str, root: Value, inputs: list[Leaf], leaf_of: Callable[[Value], Leaf | None],
                  constraints: tuple = ()) -> Function:
    """``root`` as a function of ``inputs``: each leaf value becomes a parameter."""
    params = [param(f"in{k}", leaf.type) for k, leaf in enumerate(inputs)]
    by_key = {leaf.key: p for leaf, p in zip(inputs, params, strict=True)}
    mapping: dict[Value, Value] = {}

    def rebuild(v: Value) -> Value:
        stack: list[tuple[Value, bool]] = [(v, False)]
        while stack:
            cur, done = stack.pop()
            if cur in mapping:
                continue
            leaf = leaf_of(cur)
            if leaf is not None and leaf.key in by_key:
                p = by_key[leaf.key]  # a value that is the leaf with unit axes squeezed or added: its reshape
                mapping[cur] = p if tuple(cur.type.shape) == tuple(leaf.type.shape) else \
                    Value("reshape", (p,), {"shape": tuple(cur.type.shape)}, cur.type)
                continue
            if cur.is_const or cur.is_param:
                mapping[cur] = cur
                continue
            if done:
                mapping[cur] = Value(cur.op, tuple(mapping[o] for o in cur.operands), cur.attr_dict, cur.type)
                continue
            stack.append((cur, True))
            stack.extend((o, False) for o in cur.operands if o not in mapping)
        return mapping[v]

    return Function(name, tuple(params), (rebuild(root),), ("out",), constraints)


# --------------------------------------------------------------------------------------
# float64 versions of a function (rounding-free search for counterexamples)


def _f64(dt: DType) -> DType:
    return DType.f64 if dt.is_float else dt


def to_float64(fn: Function, constants: Mapping[str, np.ndarray]) -> tuple[Function, dict[str, np.ndarray]] | None:
    """``fn`` with every float computed in f64 (constants and casts included), or None when an
    op does not admit the change."""
    conv = float64_values(fn, constants)
    if conv is None:
        return None
    mapping, consts = conv
    params = tuple(mapping[p] for p in fn.params)
    results = tuple(mapping[r] for r in fn.results)
    return Function(fn.name, params, results, fn.result_names, fn.constraints), consts


def float64_values(fn: Function, constants: Mapping[str, np.ndarray]
                   ) -> tuple[dict[Value, Value], dict[str, np.ndarray]] | None:
    """The f64 counterpart of every value of ``fn``, and the constants they use."""
    b = Builder(constants)
    try:
        mapping = _convert_values([*fn.params, *fn.values()], b, {})
    except (CuvilError, ValueError, TypeError, KeyError):
        return None
    return mapping, b.constants


def _convert_values(values: list[Value], b: Builder, mapping: dict[Value, Value]) -> dict[Value, Value]:
    for v in values:
        if v in mapping:
            continue
        if v.is_param:
            mapping[v] = param(v.name, TensorType(_f64(v.dtype), v.shape))
        elif v.is_const:
            data = b.data(v)
            mapping[v] = b.const(np.asarray(data).astype(np.float64)) if v.dtype.is_float else v
        else:
            attrs = {k: _convert_attr(a, b) for k, a in v.attrs}
            mapping[v] = b.op(v.op, *(mapping[o] for o in v.operands), **attrs)
    return mapping


def _convert_attr(a: object, b: Builder) -> object:
    if isinstance(a, DType):
        return _f64(a)
    if isinstance(a, Region):
        inner: dict[Value, Value] = {}
        params = tuple(Region.arg(k, TensorType(_f64(p.dtype), p.shape)) for k, p in enumerate(a.params))
        inner.update(zip(a.params, params, strict=True))
        _convert_values([v for v in walk(a.results) if v not in inner], b, inner)
        return Region(params, inner[a.result], tuple(inner[r] for r in a.more))
    return a
