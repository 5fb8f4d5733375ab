"""Witness candidates from z3 for sites whose cone back to the inputs is small.

Sign-gradient ascent cannot leave a region where the gradient is zero (a ReLU that is dead
everywhere but in a thin slab of the box) and random points rarely land in a thin slab. For a
site whose value at its worst output index depends on few input elements through polynomial
ops, z3 can search the box exactly: the value is read from the op compute rules by the
verifier's ``real`` cone encoder (:class:`verify.cone_encoder.ConeEncoder`, floats as reals, every
rounding ignored), each input element is a real constrained to its box, and z3 is asked for
a point where the value passes the limit by a relative margin (the margin leaves room for the
rounding the real encoding ignores). A model is only a candidate: the caller confirms it on
the reduced-precision program like every other candidate.

What is attempted:

* root targets (the op's result; inner rule nodes are left to the gradient search) of cones
  made of float (and boolean) values only, over float inputs;
* primitives with a polynomial or piecewise meaning (affine ops, ``mul`` of two variables,
  ``relu``/``clip``/``max``/``min``/``select`` as if-then-else, ``abs``, ``div``); a cone reading
  ``exp``/``tanh``/``log``/``sqrt``/... is skipped, as is any term the encoder keeps opaque;
* cones of at most :data:`MAX_INPUTS` input elements whose unrolled expression is estimated at
  no more than :data:`TERM_BUDGET` scalar terms.

Every query runs under a z3 resource limit (:data:`QUERY_RLIMIT`, deterministic, charged to the probe's
work budget); ``unknown`` means "no witness from z3". An
``unsat`` answer is not a safety proof (real arithmetic, rounding ignored): the site stays open.

The query is satisfiability of ``value >= limit * (1 + margin)``, not ``Optimize.maximize``: on
ReLU cones the satisfiability query answered as fast or faster (a thin-slab ReLU: 5-27 ms
against 4-25 ms; its square, a product of two variables: 19 ms against 161 ms; an 8-8-8 ReLU
net: unsat in 1.3 s against the optimum in 2.4 s, and sat in 0.35 s where maximize ran out
of 5 s), and any point past the limit is as good a candidate as the maximum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import z3
from z3 import z3core as Z3C

from cuvil.ir.dtypes import DType
from cuvil.ir.rules import Call
from cuvil.ir.values import Value, reachable
from verify.cone_encoder import ConeEncoder, EncodingError, IndexSpace, Leaf
from verify.probe.bounds import BoundsEngine
from verify.probe.budget import Z3_RLIMIT_PER_UNIT, Budget
from verify.probe.program import Program
from verify.z3_terms import arith, int_value, real_value

Box = tuple[np.ndarray, np.ndarray]

QUERY_RLIMIT = 300_000
"""z3 resource limit of one query (2-3 s on one core for the nonlinear cones); the probe's budget may cut it shorter."""

MAX_INPUTS = 2048
"""Input elements a site's value may depend on for a z3 attempt."""

TERM_BUDGET = 4000
"""Estimated scalar terms of the unrolled cone (elements read times terms per element) for a z3
attempt; the encoder itself gives up past twice this many value encodings."""

ENCODE_UNITS_PER_TERM = 0.05
"""Work units charged per estimated scalar term of an encoding (about a millisecond each): an attempt
whose estimate does not fit in the budget left is not started (the encoder cannot be interrupted)."""

MAX_NODES = 200_000
"""Distinct z3 term nodes of an encoded cone beyond which the query is not sent."""

MARGINS = (2.0 ** -6, 2.0 ** -3, 0.5)
"""Relative margins past the limit asked of z3, tried in turn while candidates fail confirmation
(real arithmetic ignores the rounding of every narrow-float step)."""

POLYNOMIAL = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "min", "max", "select", "cast", "floor", "ceil",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "isnan", "isinf",
})
"""Primitives the real encoder gives a meaning z3 can reason about exactly (arithmetic,
piecewise selection); anything else (exp, tanh, sqrt, ...) leaves the site to the gradient search."""

LEAF_PREFIX = "t_in"


@dataclass
class Outcome:
    """What the z3 attempt on one target did: ``skipped`` (with the reason), ``sat`` (candidates
    produced), ``unsat`` (no real solution past the limit plus ``margin``) or ``unknown``."""

    status: str
    detail: str = ""
    seconds: float = 0.0
    margin: float | None = None
    inputs: int = 0
    queries: int = 0


@dataclass
class Estimate:
    inputs: int
    terms: int
    blocker: str | None = None


class ConeSolver:
    """z3 queries over the small cones of one program's sites, for one input box."""

    def __init__(self, program: Program, engine: BoundsEngine, boxes: Mapping[str, Box], *,
                 query_rlimit: int = QUERY_RLIMIT) -> None:
        self.program = program
        self.engine = engine
        self.fn = program.function
        self.boxes = boxes
        self.query_rlimit = query_rlimit
        self.params = list(self.fn.params)
        self.param_index = {p: k for k, p in enumerate(self.params)}
        self._prims: dict[Value, str | None] = {}
        self._order = {v: k for k, v in enumerate(self.fn.values())}

    # what is worth trying ---------------------------------------------------------------
    def _blocking_primitive(self, v: Value) -> str | None:
        if v not in self._prims:
            found = None
            for e in self.engine.context(v).info.nodes:
                if isinstance(e, Call) and e.fn not in POLYNOMIAL:
                    found = e.fn
                    break
            self._prims[v] = found
        return self._prims[v]

    def estimate(self, v: Value) -> Estimate:
        """Input elements and scalar terms one element of ``v`` needs: each op's terms per output
        element (its evaluation grid over its size) times the elements of it that are read, capped
        by its size (an estimate of the encoder's work, not of z3's)."""
        need: dict[Value, int] = {v: 1}
        terms = 0
        cone = reachable([v], lambda u: [o for o in u.operands if o in self.engine.live])
        for u in sorted(cone, key=self._order.__getitem__, reverse=True):
            n = need.get(u, 0)
            if u.is_param:
                if not u.dtype.is_float:
                    return Estimate(0, terms, f"integer input {u.name}")
                continue
            if not (u.dtype.is_float or u.dtype is DType.bool):
                return Estimate(0, terms, f"integer arithmetic ({u.op})")
            blocker = self._blocking_primitive(u)
            if blocker is not None:
                return Estimate(0, terms, f"non-polynomial primitive {blocker} ({u.op})")
            info = self.engine.context(u).info
            fanin = max(1, info.grid // max(1, math.prod(info.out_shape)))
            terms += n * fanin
            if terms > TERM_BUDGET:
                return Estimate(0, terms, f"cone larger than {TERM_BUDGET} terms")
            for o in u.operands:
                if o in self.engine.live:
                    size = max(1, math.prod(int(d) for d in o.shape))
                    need[o] = min(size, need.get(o, 0) + n * fanin)
        inputs = sum(need.get(p, 0) for p in self.params)
        if inputs > MAX_INPUTS:
            return Estimate(inputs, terms, f"cone reads more than {MAX_INPUTS} input elements")
        return Estimate(inputs, terms)

    # encoding ----------------------------------------------------------------------------
    def _leaf(self, v: Value) -> Leaf | None:
        if v.is_param:
            return Leaf(f"in{self.param_index[v]}", v.name, v.type, "param")
        if v not in self.engine.live:
            data = np.asarray(self.engine.constant_value(v))
            return Leaf(f"c{self._order[v]}", "constant", v.type, "constant", data=data, concrete=True)
        return None

    def encode(self, v: Value, index: tuple[int, ...]) -> tuple[z3.Context, z3.ArithRef, list[z3.BoolRef],
                                                                dict[str, list[tuple[tuple[int, ...], z3.ArithRef]]]]:
        """``v[index]`` as a real term over input elements, the encoder's side facts, and the input
        elements it reads (per input: index and z3 constant)."""
        enc = ConeEncoder("real", self._leaf, unroll_limit=TERM_BUDGET, budget=2 * TERM_BUDGET)
        value = enc.value_at(v, tuple(IndexSpace.const(int(i)) for i in index))
        term = arith(enc.term(value, v.dtype))
        return enc.ctx, term, enc.facts(), self._inputs_of(term)

    def _inputs_of(self, term: z3.ExprRef) -> dict[str, list[tuple[tuple[int, ...], z3.ArithRef]]]:
        """The input elements a term reads; raises EncodingError on any other opaque function (walks
        raw ASTs: the term is a DAG that can be large)."""
        ctx = term.ctx
        c = ctx.ref()
        found: dict[str, list[tuple[tuple[int, ...], z3.ArithRef]]] = {}
        seen: set[int] = set()
        stack = [term.as_ast()]
        while stack:
            a = stack.pop()
            aid = Z3C.Z3_get_ast_id(c, a)
            if aid in seen:
                continue
            seen.add(aid)
            if len(seen) > MAX_NODES:
                raise EncodingError(f"the encoded cone has more than {MAX_NODES} term nodes")
            if Z3C.Z3_get_ast_kind(c, a) != z3.Z3_APP_AST:
                continue
            app = Z3C.Z3_to_app(c, a)
            n = Z3C.Z3_get_app_num_args(c, app)
            decl = Z3C.Z3_get_app_decl(c, app)
            if Z3C.Z3_get_decl_kind(c, decl) == z3.Z3_OP_UNINTERPRETED:
                name = Z3C.Z3_get_symbol_string(c, Z3C.Z3_get_decl_name(c, decl))
                if not (name.startswith(LEAF_PREFIX) and n):
                    raise EncodingError(f"opaque term {name} (no polynomial meaning)")
                k = int(name[len(LEAF_PREFIX):])
                t = z3.ArithRef(a, ctx)
                args = [t.arg(j) for j in range(n)]
                if not all(z3.is_int_value(x) for x in args):
                    raise EncodingError(f"input {self.params[k].name} is read at a computed index")
                found.setdefault(self.params[k].name, []).append((tuple(int_value(x) for x in args), t))
                continue
            stack.extend(Z3C.Z3_get_app_arg(c, app, j) for j in range(n))
        return found

    # queries -----------------------------------------------------------------------------
    def candidates(self, v: Value, index: tuple[int, ...], side: int, limit: float, budget: Budget,
                   outcome: Outcome) -> Iterator[dict[str, np.ndarray]]:
        """Input points where z3 finds ``side * v[index] >= |limit| * (1 + margin)``, one per margin of
        :data:`MARGINS` while the caller keeps asking; ``outcome`` records what happened."""
        start = time.monotonic()
        try:
            est = self.estimate(v)
            if est.blocker is not None:
                outcome.status, outcome.detail = "skipped", est.blocker
                return
            if est.terms * ENCODE_UNITS_PER_TERM > budget.left:
                outcome.status, outcome.detail = "skipped", "not enough work budget left to encode the cone"
                return
            budget.charge(est.terms * ENCODE_UNITS_PER_TERM)
            try:
                ctx, term, facts, inputs = self.encode(v, index)
            except (EncodingError, RecursionError, MemoryError) as e:
                outcome.status, outcome.detail = "skipped", f"encoding: {e}"
                return
            outcome.inputs = sum(len(x) for x in inputs.values())
            box = self._box_facts(ctx, inputs)
            goal = term if side > 0 else arith(-term)
            outcome.status = "pending"
            counted = [0]
            for margin in MARGINS:
                rlimit = int(min(self.query_rlimit, budget.left * Z3_RLIMIT_PER_UNIT))
                if budget.exhausted or rlimit < 1000:
                    if outcome.status == "pending":
                        outcome.status, outcome.detail = "unknown", "out of work budget"
                    return
                outcome.queries += 1
                model, status = self._query(ctx, goal, _rational(abs(limit) * (1 + margin)), [*facts, *box],
                                            rlimit, budget, counted)
                outcome.margin = margin
                if model is None:
                    if outcome.status != "sat":  # after a sat answer: its candidates failed confirmation
                        outcome.status = status.split(":")[0]
                    outcome.detail = f"{status} at margin {margin:g}"
                    return
                outcome.status = "sat"
                yield self._point(model, inputs)
        finally:
            outcome.seconds += time.monotonic() - start

    def _box_facts(self, ctx: z3.Context, inputs: Mapping[str, list[tuple[tuple[int, ...], z3.ArithRef]]]
                   ) -> list[z3.BoolRef]:
        out = []
        for p in self.params:
            if p.name not in inputs:
                continue
            shape = tuple(int(d) for d in p.shape)
            lo, hi = (np.broadcast_to(b, shape) for b in self.boxes[p.name])
            for idx, t in inputs[p.name]:
                out.append(t >= z3.RealVal(_rational(float(lo[idx])), ctx))
                out.append(t <= z3.RealVal(_rational(float(hi[idx])), ctx))
        return out

    def _query(self, ctx: z3.Context, goal: z3.ArithRef, bound: Fraction, facts: list[z3.BoolRef],
               rlimit: int, budget: Budget, counted: list[int]) -> tuple[z3.ModelRef | None, str]:
        """One query under ``rlimit``; what it used is charged to ``budget`` (``counted``: the context's
        resource count before it, as z3 counts per context, cumulatively)."""
        target = z3.RealVal(bound, ctx)
        s = z3.Solver(ctx=ctx)
        s.set("rlimit", rlimit)
        s.add(*facts)
        s.add(goal >= target)
        try:
            res = s.check()
        except z3.Z3Exception as e:  # resource limits inside z3: no answer
            return None, f"unknown: {e}"
        finally:
            stats = s.statistics()
            total = int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else counted[0]
            budget.charge(max(0, total - counted[0]) / Z3_RLIMIT_PER_UNIT)
            counted[0] = total
        if res == z3.unknown:
            return None, f"unknown: {s.reason_unknown()}"
        return (s.model(), "sat") if res == z3.sat else (None, str(res))

    def _point(self, model: z3.ModelRef, inputs: Mapping[str, list[tuple[tuple[int, ...], z3.ArithRef]]]
               ) -> dict[str, np.ndarray]:
        """The model's input elements; elements outside the cone at the box center."""
        out: dict[str, np.ndarray] = {}
        for p in self.params:
            shape = tuple(int(d) for d in p.shape)
            lo, hi = (np.broadcast_to(np.asarray(b, dtype=np.float64), shape) for b in self.boxes[p.name])
            x = ((lo + hi) / 2).copy()
            for idx, t in inputs.get(p.name, []):
                x[idx] = _float(model.eval(t, model_completion=True))
            out[p.name] = np.clip(x, lo, hi)
        return out


def _rational(x: float) -> Fraction:
    return Fraction(x) if math.isfinite(x) else Fraction(0)


def _float(v: z3.ExprRef) -> float:
    x = real_value(v)
    if x is None:
        raise EncodingError(f"the z3 model gives a non-numeric input value {v}")
    return x
