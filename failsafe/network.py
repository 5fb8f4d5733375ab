"""A decision network in the loop: its exact meaning over the reals, the region of the state box
where it provably keeps the spec's invariants, and the switch that trusts it there only (the
Simplex architecture: outside the proved region a verified fallback mode acts instead).

* Encoding. The network is imported with :func:`cuvil.import_model` and each op is read from its
  compute rule by the verifier's ``real`` encoder (:class:`verify.cone_encoder.ConeEncoder`) at
  concrete indices, cut at its operands: one equation per element over z3 reals, float32 weights
  as exact rationals. A ReLU net comes out piecewise linear (``relu`` is ``max(x, 0)``, an
  ``If``); an op whose exact meaning needs more (a transcendental, an uninterpreted reduction)
  is refused by name.
* Rounding. The network runs in its float type (float32 weights and activations). A forward
  error analysis reads every rule once more (the prober's interval walker, each element also
  carrying a bound on its distance to the exact real value) and bounds ``|float output - real
  output|`` per cell, rounding the state to the input type included, for any order of summation
  (the interpreter's and the compiled library's alike). Proofs hold for every output within that
  margin of the exact one, so they hold for the float network.
* Cells. The box of the network's inputs is cut into a grid and refined by bisection. A cell is
  decided first by the prober's interval bounds (:class:`verify.probe.bounds.BoundsEngine`), then
  by z3 under a resource limit with every ReLU phase the bounds decide fixed. A z3 counterexample
  is replayed on Cuvil's interpreter before a cell is called refuted.
"""

from __future__ import annotations

import itertools
import math
import time
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import reduce
from pathlib import Path
from typing import Any, cast

import numpy as np
import z3

from cuvil.errors import CuvilError
from cuvil.frontend.dispatch import import_model
from cuvil.interp import run_function
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.rules import Call, IndexValue, Lit, Load, Reduce
from cuvil.ir.rulewalk import IxVal, RuleInfo, read_masked, walk_exprs
from cuvil.ir.specialize import specialize_dims
from cuvil.ir.types import bind_symbols
from cuvil.ir.values import Value
from failsafe.expr import Expr
from failsafe.spec import DecisionModel, Mode, Spec, scenario_label
from verify.cone_encoder import ConeEncoder, IndexSpace, Leaf
from verify.probe import interval as I
from verify.probe.bounds import GRID_BUDGET, Bounds, BoundsEngine, IntervalWalker
from verify.probe.interval import Interval
from verify.scalar_semantics import EncodingError
from verify.z3_terms import arith, boolean, fraction, ite, real_value

REGION_FORMAT = "cuvil-failsafe-trusted-region/1"

RLIMIT = 4_000_000
"""z3 resource units one cell query may spend (deterministic, unlike a wall-clock limit)."""

TIMEOUT_MS = 60_000
"""A wall-clock guard well above what :data:`RLIMIT` allows, for a solver that stops counting."""

UNROLL_LIMIT = 1 << 16
"""Reductions up to this many terms are unrolled into exact sums (a named reduction is uninterpreted)."""

BATCH_ROWS = 1 << 16
"""Rows per interpreter call when the network takes a batch."""

VERDICTS = ("proved", "refuted", "unknown", "empty")
"""A cell's verdict: ``empty`` when no state of the scenario lies in it (the network is never asked there)."""


class NetworkError(CuvilError):
    """A decision network that cannot be analysed exactly (shape, dtype, an op without exact meaning)."""

    code = "CUVIL-FAILSAFE-NETWORK"
    default_hint = ("a decision network is a small piecewise-linear (ReLU) float network: one input [n] or "
                    "[batch, n] of state variables, one output [m] or [batch, m]")


# --------------------------------------------------------------------------------------
# the network


class DecisionNetwork:
    """An imported network with named inputs (state variables, in order) and outputs, its exact
    encoding, and the bounds engine its cells are analysed with."""

    _tags = itertools.count()

    def __init__(self, module: Module, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.module = module
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        main = module.main
        if len(main.params) != 1 or len(main.results) != 1:
            raise NetworkError(f"@{main.name} takes {len(main.params)} inputs and returns {len(main.results)} values; "
                               "a decision network has one input tensor and one output tensor", location=main.name)
        self.batched = main if _takes_batch(main) else None
        self.function = _single_row(main, len(self.inputs), len(self.outputs))
        self.param = self.function.params[0]
        self.result = self.function.results[0]
        self.dtype = self.param.dtype
        self.engine = BoundsEngine(self.function, module.constants)
        self.encoding = _Encoding(self.function, self.engine, f"n{next(self._tags)}_")

    def run(self, states: Any) -> np.ndarray:
        """The float network on Cuvil's interpreter: ``states`` is ``[N, len(inputs)]`` (cast to the
        input's dtype), the result ``[N, len(outputs)]`` in float64."""
        x = np.asarray(states, dtype=np.float64).reshape(-1, len(self.inputs))
        if len(x) == 0:
            return np.zeros((0, len(self.outputs)))
        if self.batched is not None:
            parts = [run_function(self.batched, self.module.constants, [x[s:s + BATCH_ROWS].astype(self.dtype.np)])[0]
                     for s in range(0, len(x), BATCH_ROWS)]
            return np.concatenate(parts).reshape(len(x), -1).astype(np.float64)
        shape = tuple(int(d) for d in self.param.shape)
        rows = [run_function(self.function, self.module.constants, [r.astype(self.dtype.np).reshape(shape)])[0]
                for r in x]
        return np.stack([np.asarray(r).reshape(-1) for r in rows]).astype(np.float64)

    def evaluate(self, states: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The outputs by name for states by name (arrays of samples)."""
        x = np.stack([np.asarray(states[n], dtype=np.float64).reshape(-1) for n in self.inputs], axis=1)
        y = self.run(x)
        return {name: y[:, k] for k, name in enumerate(self.outputs)}

    def enclosure(self, lo: np.ndarray, hi: np.ndarray) -> _Enclosure:
        """Bounds of every value for inputs in the box ``[lo, hi]``: the float values, and how far
        each exact real value can be from its float one."""
        shape = tuple(int(d) for d in self.param.shape)
        u, eta = I.unit_roundoff(self.dtype), I.smallest_subnormal(self.dtype)
        # the float input is the state rounded to the input's dtype
        mag = np.maximum(np.abs(lo), np.abs(hi))
        box_lo, box_hi = lo - 2 * u * np.abs(lo) - eta, hi + 2 * u * np.abs(hi) + eta
        bounds = self.engine.run({self.param.name: (box_lo.reshape(shape), box_hi.reshape(shape))})
        errors: dict[Value, np.ndarray] = {self.param: (u * mag + eta).reshape(shape)}
        for v in self.function.values():
            if v in bounds.ops:
                errors[v] = _op_error(self.engine, v, bounds.values, errors)
        overflow = any(not (np.all(np.isfinite(ob.value.lo)) and np.all(np.isfinite(ob.value.hi)))
                       for ob in bounds.ops.values())
        return _Enclosure(bounds, errors, lo.reshape(shape), hi.reshape(shape), overflow)


@dataclass
class _Enclosure:
    bounds: Bounds
    errors: dict[Value, np.ndarray]
    lo: np.ndarray
    hi: np.ndarray
    overflow: bool

    def error(self, v: Value) -> np.ndarray:
        """How far each element's exact real value can be from its float one."""
        return np.broadcast_to(self.errors.get(v, np.zeros(())), tuple(int(d) for d in v.shape))

    def real_range(self, v: Value, param: Value) -> tuple[np.ndarray, np.ndarray]:
        """Where the exact real value of each element of ``v`` lies."""
        if v is param:
            return self.lo, self.hi
        iv, err = self.bounds.values[v], self.error(v)
        return np.broadcast_to(iv.lo - err, err.shape), np.broadcast_to(iv.hi + err, err.shape)


def load_network(model: Any, example_inputs: Any = None, *, inputs: Sequence[str], outputs: Sequence[str],
                 **options: Any) -> DecisionNetwork:
    """Import ``model`` (an ONNX path or proto, a torch module with ``example_inputs``, a .pt2 or
    .cir path: anything :func:`cuvil.import_model` reads) as a decision network."""
    return DecisionNetwork(import_model(model, example_inputs, **options), inputs, outputs)


def load_decision_model(model: DecisionModel, spec: Spec | None = None) -> DecisionNetwork:
    """The network a spec names (a relative path is read next to the spec file)."""
    path = Path(model.path)
    if not path.is_absolute() and spec is not None and spec.source:
        path = Path(spec.source).parent / path
    return load_network(str(path), inputs=model.inputs, outputs=model.outputs)


def _takes_batch(fn: Function) -> bool:
    """Whether the input is ``[batch, n]`` with a symbolic batch (rows then run in one call)."""
    shape = fn.params[0].type.shape
    return len(shape) == 2 and not isinstance(shape[0], int)


def _single_row(fn: Function, n_in: int, n_out: int) -> Function:
    """``fn`` at one row, with its input and output checked against the named inputs and outputs."""
    p, r = fn.params[0], fn.results[0]
    rank = len(p.type.shape)
    if rank not in (1, 2) or not isinstance(p.type.shape[-1], int) or int(p.type.shape[-1]) != n_in:
        raise NetworkError(f"the network's input is {p.type}; the spec names {n_in} inputs, so it must be "
                           f"[{n_in}], [1, {n_in}] or [batch, {n_in}]", location=fn.name)
    try:
        env = bind_symbols([p.type], [(n_in,) if rank == 1 else (1, n_in)])
    except ValueError as e:
        raise NetworkError(f"the network's input {p.type} cannot be read one row at a time: {e}",
                           location=fn.name) from None
    single = specialize_dims(fn, env) if env else fn
    out = single.results[0]
    if not out.type.is_static or math.prod(int(d) for d in out.shape) != n_out:
        raise NetworkError(f"the network's output is {r.type}; the spec names {n_out} outputs", location=fn.name)
    for v in (single.params[0], out):
        if not v.dtype.is_float:
            raise NetworkError(f"the network's {'input' if v.is_param else 'output'} is {v.dtype}, not a float type",
                               location=fn.name)
    if any(not v.type.is_static for v in single.values()):
        raise NetworkError("the network has dims other than the batch that are not static", location=fn.name)
    return single


# --------------------------------------------------------------------------------------
# the exact encoding


@dataclass(frozen=True)
class _Equation:
    """``leaf == rhs``: one element of one op, its rule read over its operands' leaves."""

    leaf: z3.ExprRef
    rhs: z3.ExprRef
    branches: bool


class _Encoding:
    """Every element of every op as an equation over z3 leaves: one constant per element of the
    input and of each op, constants' elements as exact rationals."""

    def __init__(self, fn: Function, engine: BoundsEngine, tag: str) -> None:
        self.engine = engine
        self.prefix = f"t_{tag}"
        self.keys = {v: f"{tag}v{k}" for k, v in enumerate(fn.values())}
        self.equations: list[_Equation] = []
        self.facts: list[z3.BoolRef] = []
        self.elements: dict[int, tuple[z3.ExprRef, Value, tuple[int, ...]]] = {}
        self._leaves = ConeEncoder("real", self._leaf, ctx=z3.main_ctx())
        for v in fn.values():
            if v in engine.live and not v.is_param:
                _check_rule(v, engine)
                self._encode(v)
        self.inputs = list(self.terms(fn.params[0]))
        self.outputs = list(self.terms(fn.results[0]))
        self._to_constants()

    def _to_constants(self) -> None:
        """Each leaf application becomes a plain z3 constant: the arithmetic solvers then see a
        problem without uninterpreted functions (nlsat decides these fastest)."""
        pairs = [(t, z3.Const(f"{self.prefix}e{k}", t.sort())) for k, (t, _, _) in enumerate(self.elements.values())]
        if not pairs:
            return

        def swap(t: z3.ExprRef) -> z3.ExprRef:
            return z3.substitute(t, *pairs)

        self.equations = [_Equation(swap(e.leaf), swap(e.rhs), e.branches) for e in self.equations]
        self.facts = [boolean(swap(f)) for f in self.facts]
        self.inputs = [swap(t) for t in self.inputs]
        self.outputs = [swap(t) for t in self.outputs]
        self.elements = {c.get_id(): (c, v, idx) for (_, c), (_, v, idx) in zip(pairs, self.elements.values(),
                                                                                strict=True)}

    def _leaf(self, u: Value) -> Leaf:
        if u.is_param or u in self.engine.live:
            return Leaf(self.keys[u], u.op, u.type, "param")
        return Leaf(self.keys[u], u.op, u.type, "constant", data=self.engine.constant_value(u), concrete=True)

    def term(self, v: Value, idx: tuple[int, ...]) -> z3.ExprRef:
        """Element ``idx`` of ``v``: its leaf (a constant's exact value)."""
        t = self._leaves.term(self._leaves.value_at(v, tuple(IndexSpace.const(i) for i in idx)), v.dtype)
        if v.is_param or v in self.engine.live:
            self.elements.setdefault(t.get_id(), (t, v, idx))
        return t

    def terms(self, v: Value) -> Iterator[z3.ExprRef]:
        for idx in np.ndindex(*(int(d) for d in v.shape)):
            yield self.term(v, tuple(int(i) for i in idx))

    def _encode(self, v: Value) -> None:
        enc = ConeEncoder("real", lambda u: None if u is v else self._leaf(u), unroll_limit=UNROLL_LIMIT,
                          ctx=z3.main_ctx())
        try:
            for idx in np.ndindex(*(int(d) for d in v.shape)):
                rhs = enc.term(enc.value_at(v, tuple(IndexSpace.const(int(i)) for i in idx)), v.dtype)
                self._check_exact(v, rhs)
                leaf = self.term(v, tuple(int(i) for i in idx))
                self.equations.append(_Equation(leaf, rhs, _has_branch(rhs)))
        except EncodingError as e:
            raise NetworkError(f"op {v.op} has no exact real encoding: {e}", location=v.op) from None
        self.facts.extend(enc.facts())

    def _check_exact(self, v: Value, rhs: z3.ExprRef) -> None:
        for t in _subterms(rhs):
            if t.decl().kind() == z3.Z3_OP_UNINTERPRETED and not t.decl().name().startswith(self.prefix):
                raise NetworkError(f"op {v.op} is not piecewise linear: its exact meaning needs "
                                   f"{t.decl().name()}, which z3 cannot evaluate", location=v.op,
                                   hint="decision networks may use affine ops, ReLU, max/min, abs, clamps")


def _subterms(t: z3.ExprRef) -> Iterator[z3.ExprRef]:
    seen: set[int] = set()
    stack = [t]
    while stack:
        e = stack.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_app(e):
            yield e
            stack.extend(e.children())


def _has_branch(t: z3.ExprRef) -> bool:
    return any(z3.is_app_of(e, z3.Z3_OP_ITE) for e in _subterms(t))


# --------------------------------------------------------------------------------------
# ReLU phases decided by bounds


_COMPARE_KINDS = {z3.Z3_OP_LT: "lt", z3.Z3_OP_LE: "le", z3.Z3_OP_GT: "gt", z3.Z3_OP_GE: "ge"}

Range = tuple[Fraction, Fraction]

_HULL = -1
"""Not a z3 operator: an undecided ``If``, whose range is the hull of its branches'."""


class _PhaseFixer:
    """Rewrites terms with every ``If`` whose condition the element ranges decide replaced by its branch."""

    def __init__(self, ranges: Mapping[int, Range]) -> None:
        self.ranges = ranges
        self.memo: dict[int, z3.ExprRef] = {}
        self.fixed = 0
        self.total = 0

    def term(self, t: z3.ExprRef) -> z3.ExprRef:
        hit = self.memo.get(t.get_id())
        if hit is not None:
            return hit
        if z3.is_app_of(t, z3.Z3_OP_ITE):
            self.total += 1
            c = self.decide(t.arg(0))
            if c is None:
                out = ite(boolean(t.arg(0)), self.term(t.arg(1)), self.term(t.arg(2)))
            else:
                self.fixed += 1
                out = self.term(t.arg(1) if c else t.arg(2))
        elif z3.is_app(t) and t.num_args() and t.decl().kind() != z3.Z3_OP_UNINTERPRETED:
            out = cast(z3.ExprRef, t.decl()(*[self.term(a) for a in t.children()]))
        else:
            out = t
        self.memo[t.get_id()] = out
        return out

    def decide(self, c: z3.ExprRef) -> bool | None:
        """The value of a comparison the ranges decide (None: both are possible)."""
        kind = c.decl().kind()
        if kind == z3.Z3_OP_NOT:
            inner = self.decide(c.arg(0))
            return None if inner is None else not inner
        op = _COMPARE_KINDS.get(kind)
        a, b = (self.range(c.arg(0)), self.range(c.arg(1))) if op is not None else (None, None)
        if a is None or b is None or op is None:
            return None
        lo, hi = a[0] - b[1], a[1] - b[0]  # of arg0 - arg1
        yes = {"lt": hi < 0, "le": hi <= 0, "gt": lo > 0, "ge": lo >= 0}[op]
        no = {"lt": lo >= 0, "le": lo > 0, "gt": hi <= 0, "ge": hi < 0}[op]
        return True if yes else (False if no else None)

    def range(self, t: z3.ExprRef) -> Range | None:
        """Exact bounds of a term built from leaves with known ranges (None: not known)."""
        if z3.is_rational_value(t):
            q = fraction(t)
            return q, q
        known = self.ranges.get(t.get_id())
        if known is not None:
            return known
        if z3.is_app_of(t, z3.Z3_OP_ITE):
            c = self.decide(t.arg(0))
            if c is not None:
                return self.range(t.arg(1) if c else t.arg(2))
            kind, children = _HULL, [t.arg(1), t.arg(2)]
        elif z3.is_app(t) and t.num_args():
            kind, children = t.decl().kind(), t.children()
        else:
            return None
        parts = [self.range(a) for a in children]
        known = [p for p in parts if p is not None]
        return _combine(kind, known) if len(known) == len(parts) else None


def _combine(kind: int, parts: list[Range]) -> Range | None:
    """The range of an arithmetic node from its arguments' ranges."""
    if kind == _HULL:
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if kind == z3.Z3_OP_ADD:
        return sum((p[0] for p in parts), Fraction(0)), sum((p[1] for p in parts), Fraction(0))
    if kind == z3.Z3_OP_SUB:
        first, rest = parts[0], parts[1:]
        return first[0] - sum((p[1] for p in rest), Fraction(0)), first[1] - sum((p[0] for p in rest), Fraction(0))
    if kind == z3.Z3_OP_UMINUS:
        return -parts[0][1], -parts[0][0]
    if kind == z3.Z3_OP_MUL:
        return reduce(_times, parts)
    return None


def _times(a: Range, b: Range) -> Range:
    c = [x * y for x in a for y in b]
    return min(c), max(c)


# --------------------------------------------------------------------------------------
# float rounding: a forward error bound read from the rules


_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_LOGIC = frozenset({"and", "or", "xor", "not"})
ERROR_PRIMITIVES = frozenset({"add", "sub", "mul", "div", "neg", "abs", "max", "min", "select", "cast"}) \
    | _COMPARISONS | _LOGIC
"""The rule primitives the rounding bound covers (with the sum, max and min reductions)."""


class _Tracked(Interval):
    """The float value of each element lies in ``[lo, hi]`` and its exact real value within ``err``
    of it (for a bool: ``err`` is 0 where both readings surely agree, 1 where they may not)."""

    __slots__ = ("err",)

    def __init__(self, iv: Interval, err: Any) -> None:
        super().__init__(iv.lo, iv.hi, iv.nan)
        self.err = np.asarray(err, dtype=np.float64)


def _tracked(v: Interval) -> _Tracked:
    assert isinstance(v, _Tracked), "every value of the error walker carries its error"
    return v


def _rounding(dtype: DType, out: Interval) -> np.ndarray:
    """How far rounding a result into ``dtype`` moves it (relative unit roundoff plus underflow)."""
    return I.unit_roundoff(dtype) * out.magnitude() + I.smallest_subnormal(dtype)


class _ErrorWalker(IntervalWalker):
    """The prober's interval reading of a rule, every element also carrying its error bound."""

    def __init__(self, info: RuleInfo, operands: list[_Tracked], in_dtypes: list[DType], op: str) -> None:
        super().__init__(info, list(operands), in_dtypes, {})
        self.tracked = operands
        self.op = op

    def refuse(self, what: str) -> NetworkError:
        return NetworkError(f"op {self.op}: the float rounding bound does not cover {what}", location=self.op,
                            hint="decision networks may use affine ops, ReLU, max/min, abs, clamps")

    def lift(self, v: Interval) -> Interval:
        err = _tracked(v).err
        if err.ndim not in (0, self.depth):
            err = err.reshape(err.shape + (1,) * (self.depth - err.ndim))
        return _Tracked(super().lift(v), err)

    def literal(self, e: Lit) -> Interval:
        return _Tracked(super().literal(e), 0.0)

    def index_value(self, e: IndexValue, ix: IxVal) -> Interval:
        out = super().index_value(e, ix)
        return _Tracked(out, _rounding(e.dtype, out) if e.dtype.is_float else 0.0)

    def load(self, e: Load, idx: list[IxVal]) -> Interval:
        out = super().load(e, idx)
        src = self.tracked[e.operand]
        full = np.broadcast_to(src.err, np.broadcast_shapes(src.err.shape, src.lo.shape, src.hi.shape))
        if not idx:
            err = full
        elif all(i.concrete for i in idx):
            err = self.lift_array(read_masked(full, [i.lo for i in idx], 0.0 if e.oob is not None else None))
        else:
            err = np.asarray(np.max(full, initial=0.0))
        return _Tracked(out, err)

    def call(self, e: Call, args: list[Interval]) -> Interval:
        out = super().call(e, args)
        return _Tracked(out, self._call_error(e, [_tracked(a) for a in args], out))

    def _call_error(self, e: Call, args: list[_Tracked], out: Interval) -> np.ndarray:
        fn = e.fn
        if fn not in ERROR_PRIMITIVES:
            raise self.refuse(f"the primitive {fn}")
        if fn in _COMPARISONS:
            return self._agreement(e, args)
        if fn in _LOGIC:
            return reduce(np.maximum, [a.err for a in args])
        if fn == "select":
            both = np.maximum(args[1].err, args[2].err)
            return np.where(args[0].err == 0, both, (out.hi - out.lo) + both)
        if fn == "cast":
            return self._cast_error(e, args[0], out)
        if not e.dtype.is_float:
            if any(np.any(a.err) for a in args):
                raise self.refuse(f"integer {fn} of values that carry float rounding")
            return np.zeros(())
        err = _float_error(fn, args)
        return err + _rounding(e.dtype, out) if fn in I.ROUNDING else err

    def _agreement(self, e: Call, args: list[_Tracked]) -> np.ndarray:
        """A comparison both readings surely agree on: decided on the ranges of both values."""
        wide = [Interval(a.lo - a.err, a.hi + a.err, a.nan) for a in args]
        res = I.apply(e.fn, wide, e.dtype, dict(e.attrs), [a.dtype for a in e.args])
        return np.where((res.lo == res.hi) & ~res.nan, 0.0, 1.0)

    def _cast_error(self, e: Call, x: _Tracked, out: Interval) -> np.ndarray:
        src, dst = e.args[0].dtype, e.dtype
        if dst.is_float:
            return x.err if src is dst else x.err + _rounding(dst, out)
        if np.any(x.err):
            raise self.refuse(f"a cast of a rounded {src} value to {dst}")
        return np.zeros(())

    def reduce(self, e: Reduce, body: Interval, axes: tuple[int, ...], extents: list[int]) -> Interval:
        out = super().reduce(e, body, axes, extents)
        return _Tracked(out, self._reduce_error(e, _tracked(body), axes, extents, out))

    def reduce_dot(self, e: Reduce, x: Interval, y: Interval, axes: tuple[int, ...], extents: list[int]) -> Interval:
        raise self.refuse(f"a {e.kind} reduction")

    def _reduce_error(self, e: Reduce, body: _Tracked, axes: tuple[int, ...], extents: list[int],
                      out: Interval) -> np.ndarray:
        n = math.prod(extents)
        if n == 0:
            return np.zeros(())
        target = list(np.broadcast_shapes(body.lo.shape, body.hi.shape, body.err.shape, (1,) * self.depth))
        for ax, m in zip(axes, extents, strict=True):
            target[ax] = m
        shape = tuple(target)
        err = np.broadcast_to(body.err, shape)
        if e.kind in ("max", "min"):
            return np.max(err, axis=axes)
        if e.kind != "sum":
            raise self.refuse(f"a {e.kind} reduction")
        total = np.sum(err, axis=axes)
        if not e.dtype.is_float:
            if np.any(total):
                raise self.refuse("an integer sum of values that carry float rounding")
            return total
        acc = e.dtype  # a rule's sum runs in its own type (half terms are widened before, where a rule does)
        mag = np.sum(np.broadcast_to(body.magnitude(), shape), axis=axes)
        # any summation order: |fl(sum) - sum| <= (n - 1) u sum|terms| (1 + O(nu)), bounded with (n + 1) u
        return total + (n + 1) * I.unit_roundoff(acc) * mag + n * I.smallest_subnormal(acc) + _rounding(e.dtype, out)


def _float_error(fn: str, args: list[_Tracked]) -> np.ndarray:
    """The error of an exact float operation on operands with errors (before rounding its result)."""
    a = args[0]
    if fn in ("neg", "abs"):
        return a.err
    b = args[1]
    if fn in ("add", "sub"):
        return a.err + b.err
    if fn in ("max", "min"):  # 1-Lipschitz in each argument
        return np.maximum(a.err, b.err)
    if fn == "mul":  # a_f b_f - a_r b_r = a_f (b_f - b_r) + b_r (a_f - a_r)
        return a.magnitude() * b.err + (b.magnitude() + b.err) * a.err
    # div: a_f / b_f - a_r / b_r = ((a_f - a_r) + (a_r / b_r) (b_r - b_f)) / b_f
    low = np.where(I.contains_zero(b), 0.0, np.minimum(np.abs(b.lo), np.abs(b.hi)))
    real_low = low - b.err
    with np.errstate(all="ignore"):
        quotient = (a.magnitude() + a.err) / real_low
        err = (a.err + quotient * b.err) / low
    return np.where((low > 0) & (real_low > 0), err, np.inf)


def _check_rule(v: Value, engine: BoundsEngine) -> None:
    """Refuse an op whose rule the rounding bound does not cover, before any cell is analysed."""
    info = engine.context(v).info
    if info.grid > GRID_BUDGET:
        raise NetworkError(f"op {v.op} is too large for the decision-network analysis ({info.grid} terms)",
                           location=v.op)
    for node in walk_exprs(info.rule):
        if isinstance(node, Call) and node.fn not in ERROR_PRIMITIVES:
            raise NetworkError(f"op {v.op} uses the primitive {node.fn}, which has no exact piecewise-linear "
                               "meaning with a float rounding bound", location=v.op,
                               hint="decision networks may use affine ops, ReLU, max/min, abs, clamps")
        if isinstance(node, Reduce) and node.kind not in ("sum", "max", "min"):
            raise NetworkError(f"op {v.op} uses a {node.kind} reduction, which the rounding bound does not cover",
                               location=v.op)


def _op_error(engine: BoundsEngine, v: Value, values: Mapping[Value, Interval],
              errors: Mapping[Value, np.ndarray]) -> np.ndarray:
    """The error bound of every element of one op, from its operands' bounds and errors."""
    ctx = engine.context(v)
    operands = [_Tracked(values[o], errors.get(o, 0.0)) for o in v.operands]
    walker = _ErrorWalker(ctx.info, operands, ctx.in_dtypes, v.op)
    with np.errstate(all="ignore"):
        res = _tracked(walker.expr(ctx.info.rule))
    return np.array(np.broadcast_to(res.err, ctx.info.out_shape))


# --------------------------------------------------------------------------------------
# what a cell must satisfy


def _exact(x: float) -> z3.ArithRef:
    q = Fraction(float(x))
    return z3.RealVal(f"{q.numerator}/{q.denominator}")


class _Claim:
    """The scenario's region (and the mode's assumptions) implies every invariant, the network's
    outputs read as names; in z3 for proofs and with numpy for replaying states."""

    def __init__(self, spec: Spec, network: DecisionNetwork, scenario: frozenset[str], mode: Mode | None,
                 parameters: Mapping[str, float]) -> None:
        self.spec, self.network, self.scenario, self.mode = spec, network, scenario, mode
        self.parameters = dict(parameters)
        unknown = sorted(set(scenario) - {f.name for f in spec.faults})
        if unknown:
            raise NetworkError(f"scenario names faults the spec does not declare: {', '.join(unknown)}")
        for name in network.inputs:
            if name not in {v.name for v in spec.state}:
                raise NetworkError(f"network input {name!r} is not a state variable of spec {spec.name!r}")
        self.conditions = [e for f in spec.faults for e in ((f.active,) if f.name in scenario else (f.nominal,))
                           if e is not None] + list(mode.assume if mode is not None else ())
        self.definitions = [*spec.define.items(), *(mode.define.items() if mode is not None else ())]
        self._check_names()
        self.state = {v.name: z3.Real(v.name) for v in spec.state}
        self.outs = {o: z3.Real(f"{o}!network") for o in network.outputs}
        env = self._values(self.state, self.outs, exact=True)
        self.assumed = boolean(z3.And(*[c.z3(env) for c in self.conditions]))
        self.goal = boolean(z3.And(*[inv.expr.z3(env) for inv in spec.invariants]))

    def _check_names(self) -> None:
        known = {v.name for v in self.spec.state} | set(self.spec.constants) | {f.name for f in self.spec.faults}
        known |= set(self.parameters) | set(self.network.outputs)
        for name, e in self.definitions:
            self._need(e, known, f"definition {name}")
            known.add(name)
        for e in self.conditions:
            self._need(e, known, "a fault condition or mode assumption")
        for inv in self.spec.invariants:
            self._need(inv.expr, known, f"invariant {inv.name}")

    def _need(self, e: Expr, known: set[str], where: str) -> None:
        missing = sorted(e.names - known)
        if missing:
            raise NetworkError(f"{where} reads {', '.join(missing)}, which the network check does not know",
                               hint="pass mode= and parameters= for the mode whose parameters the invariants read")

    def _values(self, state: Mapping[str, Any], outs: Mapping[str, Any], *, exact: bool) -> dict[str, Any]:
        """Names to values (z3 terms when ``exact``, else numpy), definitions substituted in order."""
        env: dict[str, Any] = dict(state)
        number: Callable[[float], Any] = _exact if exact else float
        env.update({k: number(v) for k, v in self.spec.constants.items()})
        env.update({f.name: z3.BoolVal(f.name in self.scenario) if exact else f.name in self.scenario
                    for f in self.spec.faults})
        env.update({k: number(v) for k, v in self.parameters.items()})
        env.update(outs)
        for name, e in self.definitions:
            env[name] = e.z3(env) if exact else e.evaluate(env)
        return env

    def region(self, lo: Sequence[float], hi: Sequence[float]) -> z3.BoolRef:
        """The scenario's states whose network inputs lie in the cell ``[lo, hi]``."""
        parts: list[z3.BoolRef] = [self.assumed]
        cell = {n: (a, b) for n, a, b in zip(self.network.inputs, lo, hi, strict=True)}
        for v in self.spec.state:
            a, b = cell.get(v.name, (v.lo, v.hi))
            x = self.state[v.name]
            parts += [x >= _exact(max(a, v.lo)), x <= _exact(min(b, v.hi))]
        return boolean(z3.And(*parts))

    def violations(self, states: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Which samples lie in the scenario's region and break an invariant (numpy semantics)."""
        n = len(next(iter(states.values())))
        env = self._values(states, outputs, exact=False)
        inside = np.ones(n, dtype=bool)
        for v in self.spec.state:
            inside &= (states[v.name] >= v.lo) & (states[v.name] <= v.hi)
        for c in self.conditions:
            inside &= np.broadcast_to(np.asarray(c.evaluate(env), dtype=bool), (n,))
        ok = np.ones(n, dtype=bool)
        for inv in self.spec.invariants:
            ok &= np.broadcast_to(np.asarray(inv.expr.evaluate(env), dtype=bool), (n,))
        return inside & ~ok


# --------------------------------------------------------------------------------------
# cells


@dataclass(frozen=True)
class Counterexample:
    """A state (every state variable) where the float network breaks an invariant, as replayed on the
    interpreter, with the network's outputs there."""

    state: Mapping[str, float]
    outputs: Mapping[str, float]


@dataclass(frozen=True)
class Cell:
    """A box of the network's inputs and its verdict. ``method``: what decided it (``interval``: the
    prober's bounds; ``z3``: the exact encoding; ``replay``: a z3 counterexample confirmed on the
    interpreter). ``margin``: the bound on the float rounding of each output the proof allowed for;
    ``phases``: the ReLU phases the interval bounds fixed, of all."""

    lo: tuple[float, ...]
    hi: tuple[float, ...]
    verdict: str
    method: str = ""
    depth: int = 0
    margin: tuple[float, ...] = ()
    phases: tuple[int, int] = (0, 0)
    counterexample: Counterexample | None = None
    reason: str = ""
    seconds: float = 0.0

    @property
    def volume(self) -> float:
        return math.prod(b - a for a, b in zip(self.lo, self.hi, strict=True))

    def to_json(self) -> dict[str, Any]:
        cex = self.counterexample
        return {"lo": list(self.lo), "hi": list(self.hi), "verdict": self.verdict, "method": self.method,
                "depth": self.depth, "margin": list(self.margin), "phases": list(self.phases),
                "counterexample": None if cex is None else {"state": dict(cex.state), "outputs": dict(cex.outputs)},
                "reason": self.reason, "seconds": round(self.seconds, 4)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Cell:
        cex = data.get("counterexample")
        return Cell(tuple(float(x) for x in data["lo"]), tuple(float(x) for x in data["hi"]), str(data["verdict"]),
                    str(data.get("method", "")), int(data.get("depth", 0)),
                    tuple(float(x) for x in data.get("margin", ())), _pair(data.get("phases", (0, 0))),
                    None if cex is None else Counterexample(dict(cex["state"]), dict(cex["outputs"])),
                    str(data.get("reason", "")), float(data.get("seconds", 0.0)))


def _pair(x: Sequence[Any]) -> tuple[int, int]:
    return int(x[0]), int(x[1])


@dataclass(frozen=True)
class TrustedRegion:
    """The cells of one scenario (and mode); the trusted region is the union of the proved ones."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cells: tuple[Cell, ...]
    faults: tuple[str, ...] = ()
    label: str = "none"
    mode: str | None = None
    parameters: Mapping[str, float] = field(default_factory=dict)

    def boxes(self, verdict: str = "proved") -> tuple[np.ndarray, np.ndarray]:
        cells = [c for c in self.cells if c.verdict == verdict]
        d = len(self.inputs)
        return (np.array([c.lo for c in cells], dtype=np.float64).reshape(-1, d),
                np.array([c.hi for c in cells], dtype=np.float64).reshape(-1, d))

    def contains(self, states: Any) -> np.ndarray:
        """For each state (``[N, len(inputs)]`` in input order, or arrays by input name): whether it
        lies in a proved cell. A proof covers the states of the region's scenario (and mode) in the
        cell: the guard trusts the network only while that scenario is the one its monitors report."""
        if isinstance(states, Mapping):
            x = np.stack([np.asarray(states[n], dtype=np.float64).reshape(-1) for n in self.inputs], axis=1)
        else:
            x = np.asarray(states, dtype=np.float64).reshape(-1, len(self.inputs))
        lo, hi = self.boxes()
        out = np.zeros(len(x), dtype=bool)
        step = max(1, (1 << 22) // max(1, len(lo) * len(self.inputs)))
        for s in range(0, len(x), step):
            part = x[s:s + step, None, :]
            out[s:s + step] = np.any(np.all((part >= lo) & (part <= hi), axis=2), axis=1)
        return out

    def coverage(self) -> float:
        """The fraction of the input box (by volume) the proved cells cover."""
        total = sum(c.volume for c in self.cells)
        return sum(c.volume for c in self.cells if c.verdict == "proved") / total if total else 0.0

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.cells) for v in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return {"format": REGION_FORMAT, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "scenario": self.label, "faults": list(self.faults), "mode": self.mode,
                "parameters": dict(self.parameters),
                "margin": "each proof holds for every output within the cell's margin of the exact real-number "
                          "network, a bound on the float rounding of the interpreter's evaluation (input "
                          "rounding included)",
                "counts": self.counts(), "coverage": self.coverage(),
                "cells": [c.to_json() for c in self.cells]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> TrustedRegion:
        if data.get("format") != REGION_FORMAT:
            raise NetworkError(f"not a trusted region: format {data.get('format')!r}, expected {REGION_FORMAT!r}")
        return TrustedRegion(tuple(data["inputs"]), tuple(data["outputs"]),
                             tuple(Cell.from_json(c) for c in data["cells"]), tuple(data.get("faults", ())),
                             str(data.get("scenario", "none")), data.get("mode"), dict(data.get("parameters", {})))


@dataclass
class _Check:
    """Decides one cell."""

    network: DecisionNetwork
    claim: _Claim
    rlimit: int
    seed: int

    def __call__(self, lo: tuple[float, ...], hi: tuple[float, ...], depth: int) -> Cell:
        start = time.perf_counter()
        cell = self._decide(lo, hi, depth)
        return replace(cell, seconds=time.perf_counter() - start)

    def _solve(self, assertions: Sequence[z3.BoolRef]) -> tuple[z3.CheckSatResult, z3.Solver]:
        """nlsat first (the fastest here on piecewise-linear queries, nonlinear invariants included);
        z3's general solver when a query is outside nlsat's logic (integers, functions)."""
        s = self._solver(z3.SolverFor("QF_NRA"), assertions)
        res = s.check()
        if res == z3.unknown and not any(w in s.reason_unknown() for w in ("resource", "timeout", "canceled")):
            s = self._solver(z3.Solver(), assertions)
            res = s.check()
        return res, s

    def _solver(self, s: z3.Solver, assertions: Sequence[z3.BoolRef]) -> z3.Solver:
        s.set("rlimit", self.rlimit)
        s.set("timeout", TIMEOUT_MS)
        s.set("random_seed", self.seed)
        s.add(*assertions)
        return s

    def _decide(self, lo: tuple[float, ...], hi: tuple[float, ...], depth: int) -> Cell:
        region = self.claim.region(lo, hi)
        if self._solve([region])[0] == z3.unsat:
            return Cell(lo, hi, "empty", "z3", depth, reason="no state of the scenario lies in this cell")
        enc = self.network.enclosure(np.array(lo), np.array(hi))
        if enc.overflow:
            return Cell(lo, hi, "unknown", "interval", depth, reason="the float network may overflow on this cell")
        result = self.network.result
        margin = tuple(float(x) for x in enc.error(result).reshape(-1))
        out = enc.bounds.values[result]
        box = [c for var, a, b in zip(self.claim.outs.values(), out.lo.reshape(-1), out.hi.reshape(-1), strict=True)
               for c in (var >= _exact(a), var <= _exact(b))]
        if self._solve([region, *box, boolean(z3.Not(self.claim.goal))])[0] == z3.unsat:
            return Cell(lo, hi, "proved", "interval", depth, margin)
        return self._exact_check(lo, hi, depth, region, enc, margin)

    def _exact_check(self, lo: tuple[float, ...], hi: tuple[float, ...], depth: int, region: z3.BoolRef,
                     enc: _Enclosure, margin: tuple[float, ...]) -> Cell:
        """z3 on the exact network, every output within its margin, ReLU phases the bounds decide fixed."""
        ranges = self._ranges(enc)
        fixer = _PhaseFixer(ranges)
        network = self._network(region, ranges, fixer)
        res, s = self._solve([*network, *self._within(margin), boolean(z3.Not(self.claim.goal))])
        phases = (fixer.fixed, fixer.total)
        if res == z3.unsat:
            return Cell(lo, hi, "proved", "z3", depth, margin, phases)
        if res == z3.unknown:
            return Cell(lo, hi, "unknown", "z3", depth, margin, phases, reason=f"z3: {s.reason_unknown()}")
        cex = self._replay(s.model(), lo, hi)
        if cex is None:
            deep, s = self._solve([*network, *self._robust_violation(margin)])
            cex = self._replay(s.model(), lo, hi) if deep == z3.sat else None
        if cex is None:
            return Cell(lo, hi, "unknown", "z3", depth, margin, phases,
                        reason="z3 found a violation within the rounding margin of the exact network that the "
                               "float network did not reproduce near it")
        return Cell(lo, hi, "refuted", "replay", depth, margin, phases, cex)

    def _network(self, region: z3.BoolRef, ranges: Mapping[int, Range], fixer: _PhaseFixer) -> list[z3.BoolRef]:
        """The region's states, the network's equations at them and every element's range."""
        encoding = self.network.encoding
        out: list[z3.BoolRef] = [region, *encoding.facts]
        out += [boolean(leaf == self.claim.state[name])
                for leaf, name in zip(encoding.inputs, self.network.inputs, strict=True)]
        out += [boolean(eq.leaf == (fixer.term(eq.rhs) if eq.branches else eq.rhs)) for eq in encoding.equations]
        for tid, (a, b) in ranges.items():
            t = arith(encoding.elements[tid][0])
            out += [t >= z3.RealVal(a), t <= z3.RealVal(b)]
        return out

    def _within(self, margin: Sequence[float]) -> list[z3.BoolRef]:
        """Each output the invariants read is within its rounding margin of the exact one."""
        out: list[z3.BoolRef] = []
        for leaf, name, eps in zip(self.network.encoding.outputs, self.network.outputs, margin, strict=True):
            gap = arith(self.claim.outs[name] - leaf)
            out += [gap <= _exact(eps), gap >= _exact(-eps)]
        return out

    def _robust_violation(self, margin: Sequence[float]) -> list[z3.BoolRef]:
        """The invariants fail for the exact outputs and for outputs moved by twice their margin (each
        corner of that box, up to three outputs): a state that deep in the violation is one the float
        network reproduces."""
        leaves = self.network.encoding.outputs
        names = self.network.outputs
        steps = list(itertools.product((-2.0, 2.0), repeat=len(names))) if len(names) <= 3 else \
            [(-2.0,) * len(names), (2.0,) * len(names)]
        out: list[z3.BoolRef] = []
        for step in [(0.0,) * len(names), *steps]:
            moved = [(self.claim.outs[n], arith(leaf + _exact(k * eps)))
                     for n, leaf, k, eps in zip(names, leaves, step, margin, strict=True)]
            out.append(boolean(z3.Not(z3.substitute(self.claim.goal, *moved))))
        return out

    def _ranges(self, enc: _Enclosure) -> dict[int, Range]:
        """Exact ranges of every float element's real value (leaf AST id to bounds)."""
        out: dict[int, Range] = {}
        param = self.network.param
        for tid, (_, v, idx) in self.network.encoding.elements.items():
            if not v.dtype.is_float or (v not in enc.bounds.ops and v is not param):
                continue
            lo, hi = enc.real_range(v, param)
            a, b = float(lo[idx]), float(hi[idx])
            if math.isfinite(a) and math.isfinite(b):
                out[tid] = (Fraction(a), Fraction(b))
        return out

    def _replay(self, model: z3.ModelRef, lo: tuple[float, ...], hi: tuple[float, ...]) -> Counterexample | None:
        """A state near the model's where the float network on the interpreter breaks an invariant."""
        x0 = {name: _model_value(model, var) for name, var in self.claim.state.items()}
        states = _candidates(x0, self.network.inputs, lo, hi, self._rng(lo, hi))
        x = np.stack([states[n] for n in self.network.inputs], axis=1)
        y = self.network.run(x)
        outputs = {name: y[:, k] for k, name in enumerate(self.network.outputs)}
        bad = np.flatnonzero(self.claim.violations(states, outputs))
        if not len(bad):
            return None
        k = int(bad[0])
        return Counterexample({n: float(a[k]) for n, a in states.items()},
                              {n: float(a[k]) for n, a in outputs.items()})

    def _rng(self, lo: tuple[float, ...], hi: tuple[float, ...]) -> np.random.Generator:
        key = zlib.crc32(np.array([*lo, *hi], dtype=np.float64).tobytes())
        return np.random.default_rng([self.seed, key])


def _model_value(model: z3.ModelRef, var: z3.ArithRef) -> float:
    value = real_value(model.eval(var, model_completion=True))
    return 0.0 if value is None else value


def _candidates(x0: Mapping[str, float], inputs: Sequence[str], lo: Sequence[float], hi: Sequence[float],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The model's state, points around it at shrinking radii, and points spread over the cell."""
    radii = [10.0 ** -k for k in range(1, 8) for _ in range(16)]
    n = 1 + len(radii) + 64
    out = {name: np.full(n, value) for name, value in x0.items()}
    for name, a, b in zip(inputs, lo, hi, strict=True):
        centre = min(max(x0[name], a), b)
        near = centre + np.array(radii) * (b - a) * rng.uniform(-1.0, 1.0, len(radii))
        spread = rng.uniform(a, b, 64)
        out[name] = np.clip(np.concatenate([[centre], near, spread]), a, b)
    return out


# --------------------------------------------------------------------------------------
# the trusted region


def trusted_region(network: DecisionNetwork, spec: Spec, *, scenario: Collection[str] = frozenset(),
                   mode: str | None = None, parameters: Mapping[str, float] | None = None,
                   grid: int | Sequence[int] = 4, max_depth: int = 6, max_cells: int = 2000, rlimit: int = RLIMIT,
                   seed: int = 0) -> TrustedRegion:
    """Cut the box of the network's inputs into ``grid`` parts per input and decide each cell; a
    cell not proved is bisected (along its widest input, relative to the box) until ``max_depth``
    bisections or ``max_cells`` checks. ``mode`` and ``parameters``: the mode whose assumptions
    and definitions (and parameter values) the invariants are read with, if any."""
    active = frozenset(scenario)
    chosen = _mode(spec, mode) if mode is not None else None
    claim = _Claim(spec, network, active, chosen, parameters or {})
    check = _Check(network, claim, rlimit, seed)
    box = [(spec.state_var(n).lo, spec.state_var(n).hi) for n in network.inputs]
    queue = deque((lo, hi, 0) for lo, hi in _grid(box, grid))
    scale = [b - a if b > a else 1.0 for a, b in box]
    leaves: list[Cell] = []
    checked = 0
    while queue:
        lo, hi, depth = queue.popleft()
        if checked >= max_cells:
            leaves.append(Cell(lo, hi, "unknown", "", depth, reason="cell budget spent before this cell was checked"))
            continue
        cell = check(lo, hi, depth)
        checked += 1
        if cell.verdict in ("proved", "empty") or depth >= max_depth or checked + len(queue) + 2 > max_cells:
            leaves.append(cell)
            continue
        queue.extend((a, b, depth + 1) for a, b in _bisect(lo, hi, scale))
    leaves.sort(key=lambda c: (c.lo, c.hi))
    order = [f.name for f in spec.faults]
    return TrustedRegion(network.inputs, network.outputs, tuple(leaves), tuple(f for f in order if f in active),
                         scenario_label(active, order), mode, dict(parameters or {}))


def recheck_cells(network: DecisionNetwork, spec: Spec, region: TrustedRegion, verdicts: Collection[str] = ("proved",),
                  *, rlimit: int = RLIMIT, seed: int = 0) -> list[Cell]:
    """Decide again, as :func:`trusted_region` decides them, the cells of ``region`` with one of ``verdicts``
    (its scenario, mode and parameters): how a region read from a file is checked rather than trusted."""
    if tuple(region.inputs) != network.inputs or tuple(region.outputs) != network.outputs:
        raise NetworkError(f"the region is over inputs {list(region.inputs)} and outputs {list(region.outputs)}; "
                           f"the network's are {list(network.inputs)} and {list(network.outputs)}")
    chosen = _mode(spec, region.mode) if region.mode is not None else None
    check = _Check(network, _Claim(spec, network, frozenset(region.faults), chosen, region.parameters), rlimit, seed)
    return [check(c.lo, c.hi, c.depth) for c in region.cells if c.verdict in verdicts]


def _grid(box: Sequence[tuple[float, float]], grid: int | Sequence[int]) -> list[tuple[tuple[float, ...],
                                                                                        tuple[float, ...]]]:
    parts = [grid] * len(box) if isinstance(grid, int) else list(grid)
    if len(parts) != len(box) or any(p < 1 for p in parts):
        raise NetworkError(f"grid {grid!r} must give a positive number of parts for each of the {len(box)} inputs")
    edges = [[a + (b - a) * k / p for k in range(p)] + [b] for (a, b), p in zip(box, parts, strict=True)]
    cells = []
    for combo in itertools.product(*[range(p) for p in parts]):
        cells.append((tuple(e[k] for e, k in zip(edges, combo, strict=True)),
                      tuple(e[k + 1] for e, k in zip(edges, combo, strict=True))))
    return cells


def _bisect(lo: tuple[float, ...], hi: tuple[float, ...], scale: Sequence[float]) -> list[tuple[tuple[float, ...],
                                                                                                tuple[float, ...]]]:
    k = max(range(len(lo)), key=lambda i: (hi[i] - lo[i]) / scale[i])
    mid = lo[k] + (hi[k] - lo[k]) / 2
    return [(lo, (*hi[:k], mid, *hi[k + 1:])), ((*lo[:k], mid, *lo[k + 1:]), hi)]


# --------------------------------------------------------------------------------------
# the switch


Fallback = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]
"""A fallback mode's behaviour: states by name (arrays) to outputs by name."""


@dataclass(frozen=True)
class Choice:
    """Per state: the outputs used, and whether they are the network's (inside the trusted region)."""

    outputs: dict[str, np.ndarray]
    trusted: np.ndarray


@dataclass(frozen=True)
class Switch:
    """Simplex: the network's outputs where the region trusts it, the fallback's everywhere else."""

    region: TrustedRegion
    network: DecisionNetwork
    fallback: Fallback

    def outputs(self, states: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The outputs alone (the shape :func:`failsafe.simulate.simulate` takes for a decision model)."""
        return self(states).outputs

    def __call__(self, states: Mapping[str, Any]) -> Choice:
        arrays = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in states.items()}
        n = len(arrays[self.network.inputs[0]])
        trusted = self.region.contains(arrays)
        out = {name: np.full(n, np.nan) for name in self.network.outputs}
        if trusted.any():
            for name, y in self.network.evaluate({k: v[trusted] for k, v in arrays.items()}).items():
                out[name][trusted] = y
        rest = ~trusted
        if rest.any():
            fb = self.fallback({k: v[rest] for k, v in arrays.items()})
            for name in self.network.outputs:
                out[name][rest] = np.broadcast_to(np.asarray(fb[name], dtype=np.float64), (int(rest.sum()),))
        return Choice(out, trusted)


def mode_fallback(spec: Spec, mode: str, outputs: Sequence[str], parameters: Mapping[str, float] | None = None,
                  scenario: frozenset[str] = frozenset()) -> Fallback:
    """The behaviour of ``mode`` as a fallback: its definitions of the network's output names (after
    the spec's definitions, those that do not read the outputs), evaluated on the states."""
    chosen = _mode(spec, mode)
    missing = [o for o in outputs if o not in chosen.define]
    if missing:
        raise NetworkError(f"mode {mode!r} does not define {', '.join(missing)}, so it cannot stand in for the "
                           "network", hint="define each network output in the fallback mode's `define`")
    definitions = [*spec.define.items(), *chosen.define.items()]
    values: dict[str, Any] = {k: float(v) for k, v in [*spec.constants.items(), *(parameters or {}).items()]}
    values.update({f.name: f.name in scenario for f in spec.faults})

    def fallback(states: Mapping[str, np.ndarray]) -> dict[str, Any]:
        env: dict[str, Any] = {**values, **states}
        for name, e in definitions:
            if e.names <= env.keys():
                env[name] = e.evaluate(env)
        return {o: env[o] for o in outputs}

    return fallback


def _mode(spec: Spec, name: str) -> Mode:
    for m in spec.modes:
        if m.name == name:
            return m
    raise NetworkError(f"spec {spec.name!r} has no mode {name!r}",
                       hint="modes: " + ", ".join(m.name for m in spec.modes))
