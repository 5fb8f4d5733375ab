"""Synthesis of a degraded-mode policy: per scenario, the first available mode (most capable first)
that some parameter values make safe, with the best such values by its objectives.

A mode with fixed parameters is safe in a scenario when no state of the scenario's region satisfies
its assumptions and violates an invariant (one z3 query), and some state satisfies its assumptions
(a second: a mode whose assumptions exclude every state proves nothing). Parameters are found by
counterexample-guided synthesis: a quantifier-free query proposes values that survive every
counterexample state found so far (and have a witness state, so they are not vacuous), a second
query looks for a state defeating them, and that state joins the list. Objectives are bracketed
by bisection with that search as a feasibility oracle, one parameter at a time in declared order,
the roundest number left in the bracket tried last; the values written are floats, proved as such.

Every query runs in one z3 context per run (so term ids, and with them z3's choices, do not depend
on what the process did before), with a fixed seed and a deterministic resource limit; a global
time limit turns what is left into unknown verdicts, never proved ones. Counterexamples are
confirmed by float evaluation of the spec's expressions, else exactly, before they are reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, cast

import numpy as np
import z3

from failsafe.expr import Expr, ExprError
from failsafe.network import Cell, DecisionNetwork, TrustedRegion, load_decision_model, recheck_cells, trusted_region
from failsafe.policy import (
    Counterexample,
    Entry,
    ModeFailure,
    NetworkUse,
    Optimum,
    Policy,
    StateRange,
    Unrealizable,
    guard_for,
    relies_on_network,
)
from failsafe.spec import Mode, Parameter, Spec, scenario_label

SEED = 0
DEFAULT_RLIMIT = 5_000_000
"""z3 resource units per query: deterministic, unlike a wall-clock timeout (about 5 s of nonlinear solving)."""
MAX_CANDIDATES = 60
"""Candidates one counterexample-guided search may try before it gives up (unknown)."""
REGION_GRID = 4
REGION_DEPTH = 4
"""How a network mode's trusted region is cut: cells per input, then bisections of a cell not proved."""

Progress = Callable[[str], None]
NetworkSource = DecisionNetwork | Callable[[], DecisionNetwork] | None
"""The decision network, or how to load it when a mode first needs it (a spec's model file is then read
only when the network really acts in some scenario)."""


class _OutOfTime(Exception):
    """The run's time limit passed: what is left is unknown."""


def _decimal(value: float) -> Fraction:
    """The rational a spec number denotes: 0.1 is one tenth, as the expression language reads literals."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(int(value))


def _binary(value: float) -> Fraction:
    """The exact value of a float, for values the policy writes as floats (parameters, states)."""
    return Fraction(float(value))


def _real(q: Fraction) -> z3.ArithRef:
    return z3.RealVal(f"{q.numerator}/{q.denominator}")


def _float(q: Fraction) -> float:
    try:
        return float(q)
    except OverflowError:
        return math.copysign(float(np.finfo(np.float64).max), q)


def _bool(term: object) -> z3.BoolRef:
    """z3's combinators (And, Not, Implies, ForAll) are typed as returning wide unions."""
    return cast(z3.BoolRef, term)


def _and(terms: Iterable[z3.BoolRef]) -> z3.BoolRef:
    return _bool(z3.And(*terms)) if terms else z3.BoolVal(True)


# --- the solver ------------------------------------------------------------------------------------------------

@dataclass
class _Answer:
    status: str  # sat, unsat, unknown
    reason: str = ""
    model: z3.ModelRef | None = None
    ctx: z3.Context | None = None

    def value(self, term: z3.ExprRef) -> z3.ExprRef:
        """The model's value of ``term`` (a numeral of the main context, rational or algebraic)."""
        assert self.model is not None and self.ctx is not None
        value = self.model.eval(term.translate(self.ctx), model_completion=True)
        return cast(z3.ExprRef, value.translate(z3.main_ctx()))


class _Solver:
    """One z3 context for a run; every query gets the seed, the resource limit and what is left of the time."""

    def __init__(self, rlimit: int, time_limit: float) -> None:
        self.ctx = z3.Context()
        self.rlimit = rlimit
        self.deadline = time.perf_counter() + time_limit if math.isfinite(time_limit) else math.inf
        self.queries = 0

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def check(self, assertions: Sequence[z3.BoolRef]) -> _Answer:
        left = self.remaining()
        if left <= 0:
            raise _OutOfTime
        solver = z3.Solver(ctx=self.ctx)
        solver.set("random_seed", SEED)
        solver.set("rlimit", self.rlimit)
        if math.isfinite(left):
            solver.set("timeout", max(1, int(left * 1000)))
        solver.add(*[a.translate(self.ctx) for a in assertions])
        self.queries += 1
        result = solver.check()
        if result == z3.sat:
            return _Answer("sat", model=solver.model(), ctx=self.ctx)
        if result == z3.unsat:
            return _Answer("unsat")
        if self.remaining() <= 0:
            raise _OutOfTime
        why = solver.reason_unknown()
        limited = "resource" in why or "canceled" in why or "timeout" in why
        return _Answer("unknown", f"z3 reached its resource limit ({self.rlimit})" if limited else f"z3: {why}")

    def holds(self, term: z3.BoolRef) -> bool:
        """Whether a closed formula (no free names) is true; undefined terms (x/0) do not count as true."""
        simple = z3.simplify(term)
        if z3.is_true(simple) or z3.is_false(simple):
            return z3.is_true(simple)
        return self.check([_bool(z3.Not(term))]).status == "unsat"


# --- one scenario's view of the spec ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Terms:
    region: z3.BoolRef
    assume: z3.BoolRef
    invariants: tuple[tuple[str, z3.BoolRef], ...]

    @property
    def safe(self) -> z3.BoolRef:
        return _and(term for _, term in self.invariants)


@dataclass(frozen=True)
class _Point:
    """A state: exact values (main-context numerals, possibly algebraic) and the floats reported."""

    exact: dict[str, z3.ExprRef]
    floats: dict[str, float]


def _read(expr: Expr, env: Mapping[str, Any], where: str, z3_term: bool) -> Any:
    try:
        return expr.z3(env) if z3_term else expr.evaluate(env)
    except KeyError as e:
        raise ExprError(f"{expr.text!r} reads {e.args[0]!r}, which is not defined there", location=where) from None


class _View:
    """The spec in one scenario: constants and fault flags fixed, the region's bounds and fault conditions."""

    def __init__(self, spec: Spec, faults: frozenset[str]) -> None:
        self.spec, self.faults = spec, faults
        flags = {f.name: f.name in faults for f in spec.faults}
        self.base: dict[str, Any] = {k: _real(_decimal(v)) for k, v in spec.constants.items()}
        self.base |= {k: z3.BoolVal(v) for k, v in flags.items()}
        self.float_base: dict[str, Any] = {k: float(v) for k, v in spec.constants.items()} | flags
        self.universals = tuple(v.name for v in spec.state) + (spec.model.outputs if spec.model else ())
        self.label = scenario_label(faults, [f.name for f in spec.faults])

    def available(self, mode: Mode) -> bool:
        if mode.requires is None:
            return True
        value = z3.simplify(_read(mode.requires, self.base, f"mode {mode.name} requires", True))
        if not (z3.is_true(value) or z3.is_false(value)):
            raise ExprError(f"{mode.requires.text!r} does not depend on fault flags and constants alone",
                            location=f"mode {mode.name} requires")
        return z3.is_true(value)

    def _env(self, mode: Mode, env: dict[str, Any], z3_term: bool) -> dict[str, Any]:
        for name, expr in (*self.spec.define.items(), *mode.define.items()):
            env[name] = _read(expr, env, f"mode {mode.name}, define {name}", z3_term)
        return env

    def _conditions(self, mode: Mode, env: Mapping[str, Any], z3_term: bool) -> tuple[list[Any], list[Any]]:
        """The fault conditions of the region and the mode's assumptions, read as z3 terms or evaluated."""
        faults = [_read(e, env, f"fault {f.name}", z3_term)
                  for f in self.spec.faults for e in [f.active if f.name in self.faults else f.nominal]
                  if e is not None]
        assume = [_read(e, env, f"mode {mode.name}, assume", z3_term) for e in mode.assume]
        return faults, assume

    def terms(self, mode: Mode, point: Mapping[str, z3.ExprRef], params: Mapping[str, z3.ExprRef]) -> _Terms:
        env = self._env(mode, {**self.base, **point, **params}, True)
        faults, assume = self._conditions(mode, env, True)
        bounds = [_bool(z3.And(_real(_decimal(v.lo)) <= point[v.name], point[v.name] <= _real(_decimal(v.hi))))
                  for v in self.spec.state]
        invariants = tuple((i.name, _bool(_read(i.expr, env, f"invariant {i.name}", True)))
                           for i in self.spec.invariants)
        return _Terms(_and([*bounds, *faults]), _and(assume), invariants)

    def numeric(self, mode: Mode, state: Mapping[str, float], params: Mapping[str, float]) -> tuple[str, ...]:
        """The invariants a state violates by float evaluation, when it is in the region and meets the
        assumptions with every definition finite (else nothing)."""
        with np.errstate(all="ignore"):
            env = self._env(mode, {**self.float_base, **state, **params}, False)
            if not all(np.all(np.isfinite(np.asarray(env[k], dtype=np.float64)))
                       for k, e in (*self.spec.define.items(), *mode.define.items()) if e.kind == "real"):
                return ()
            faults, assume = self._conditions(mode, env, False)
            inside = all(float(v.lo) <= state[v.name] <= float(v.hi) for v in self.spec.state)
            if not (inside and all(bool(np.all(c)) for c in [*faults, *assume])):
                return ()
            return tuple(i.name for i in self.spec.invariants
                         if not bool(np.all(_read(i.expr, env, f"invariant {i.name}", False))))

    def exact(self, solver: _Solver, mode: Mode, values: Mapping[str, z3.ExprRef],
              params: Mapping[str, Fraction]) -> tuple[str, ...]:
        """The invariants a state violates by exact evaluation (z3 on the substituted terms), when it is in
        the region and meets the assumptions (else nothing)."""
        t = self.terms(mode, values, {k: _real(q) for k, q in params.items()})
        if not solver.holds(_bool(z3.And(t.region, t.assume))):
            return ()
        return tuple(name for name, term in t.invariants if solver.holds(_bool(z3.Not(term))))

    def confirm(self, solver: _Solver, mode: Mode, point: _Point,
                params: Mapping[str, Fraction]) -> Counterexample | None:
        """The counterexample as reported, once a check confirms it: floats, else their exact values, else
        the model's exact values (the floats written are then rounded); None when nothing confirms it."""
        floats = {k: float(q) for k, q in params.items()}
        violated = self.numeric(mode, point.floats, floats)
        if violated:
            return Counterexample(mode.name, point.floats, floats, "numeric", violated)
        for check, values in (("exact", _exact_floats(point.floats)), ("model", point.exact)):
            violated = self.exact(solver, mode, values, params)
            if violated:
                return Counterexample(mode.name, point.floats, floats, check, violated)
        return None


def _exact_floats(state: Mapping[str, float]) -> dict[str, z3.ExprRef]:
    return {k: _real(_binary(v)) for k, v in state.items()}


def _numeral(value: z3.ExprRef) -> tuple[z3.ExprRef, float]:
    """A model value, kept exact, and its nearest float (algebraic numbers through a close rational)."""
    if z3.is_rational_value(value):
        q = cast(z3.RatNumRef, value)
        return value, _float(Fraction(q.numerator_as_long(), q.denominator_as_long()))
    approx = cast(z3.AlgebraicNumRef, value).approx(40)
    return value, _float(Fraction(approx.numerator_as_long(), approx.denominator_as_long()))


def _box(p: Parameter, var: z3.ArithRef) -> z3.BoolRef:
    """A parameter's range, as the floats given (the values written are floats in it)."""
    return _bool(z3.And(_real(_binary(p.lo)) <= var, var <= _real(_binary(p.hi))))


# --- results ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Proof:
    """A mode with fixed parameters in one scenario: ``proved``, ``refuted`` (with a confirmed
    counterexample), ``vacuous`` (no state meets its assumptions) or ``unknown``."""

    status: str
    counterexample: Counterexample | None = None
    reason: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class ModeOutcome:
    """One mode in one scenario: ``proved`` with its parameters, ``refuted`` (no parameter values are
    safe), ``vacuous``, ``unavailable`` (its requires is false) or ``unknown``."""

    mode: str
    status: str
    parameters: dict[str, float] = field(default_factory=dict)
    optimum: tuple[Optimum, ...] = ()
    reason: str = ""
    counterexample: Counterexample | None = None
    network: NetworkUse | None = None


@dataclass(frozen=True)
class ScenarioOutcome:
    faults: tuple[str, ...]
    label: str
    modes: tuple[ModeOutcome, ...]
    counterexamples: tuple[Counterexample, ...]
    rejected: int
    seconds: float
    reason: str = ""
    defeating: dict[str, float] | None = None
    found_by: str | None = None

    @property
    def chosen(self) -> ModeOutcome | None:
        return next((m for m in self.modes if m.status == "proved"), None)

    @property
    def undecided(self) -> bool:
        """No mode proved, and not every mode is known to fail."""
        return self.chosen is None and (bool(self.reason) or any(m.status == "unknown" for m in self.modes))


@dataclass(frozen=True)
class _Found:
    """What a search for safe parameters found: ``safe`` values, ``none`` (none exist), or ``unknown``."""

    status: str
    params: dict[str, Fraction] = field(default_factory=dict)
    reason: str = ""
    vacuous: bool = False


@dataclass
class _Bracket:
    """A parameter's bisection: the safe end (with every parameter's value proved there) and the
    closest value beyond it found not safe."""

    safe: float
    params: dict[str, Fraction]
    unsafe: float | None = None
    monotone: bool = True
    probes: int = 0

    def next(self, end: float, width: float) -> float | None:
        """The next value to try: the range's end, then midpoints until the bracket is ``width`` wide."""
        if self.safe == end:
            return None
        if self.unsafe is None:
            return end
        mid = self.safe + (self.unsafe - self.safe) / 2
        return mid if abs(self.unsafe - self.safe) > width and mid not in (self.safe, self.unsafe) else None

    def record(self, t: float, found: _Found) -> None:
        self.probes += 1
        if found.status == "safe":
            self.safe, self.params = t, found.params
        else:
            self.unsafe, self.monotone = t, self.monotone and found.status == "none"

    def optimum(self, p: Parameter) -> Optimum:
        exact = self.unsafe is None or (self.monotone and math.nextafter(self.safe, self.unsafe) == self.unsafe)
        gap = 0.0 if self.unsafe is None else abs(self.unsafe - self.safe)
        return Optimum(p.name, cast(str, p.objective), self.safe, self.unsafe, exact, gap, self.monotone, self.probes)


def _roundest(a: float, b: float) -> float | None:
    """The float with the fewest significant digits strictly between ``a`` and ``b``: an optimum that is a
    round number (a cap of 30, not 29.99999999240041) is then found exactly."""
    lo, hi = sorted((Fraction(a), Fraction(b)))
    if lo < 0 < hi:
        return 0.0
    exponent = math.floor(math.log10(max(abs(lo), abs(hi))))
    for digits in range(1, 18):
        step = Fraction(10) ** (exponent - digits + 1)
        value = float((lo // step + 1) * step)
        if min(a, b) < value < max(a, b):
            return value
    return None


# --- the search in one scenario --------------------------------------------------------------------------------

class _Search:
    """One scenario's search. States that defeat a candidate stay useful against every mode and every
    parameter value of the scenario (each is a state of its region), so all searches share them."""

    def __init__(self, prover: Prover, faults: frozenset[str]) -> None:
        self.prover, self.solver = prover, prover.solver
        self.view = _View(prover.spec, faults)
        self.pool: list[_Point] = []
        self.trail: list[Counterexample] = []
        self.rejected = 0

    def variables(self, suffix: str = "") -> dict[str, z3.ExprRef]:
        return {n: z3.Real(n + suffix) for n in self.view.universals}

    def point(self, answer: _Answer) -> _Point:
        values = {n: _numeral(answer.value(z3.Real(n))) for n in self.view.universals}
        return _Point({k: v for k, (v, _) in values.items()}, {k: f for k, (_, f) in values.items()})

    def fixed(self, mode: Mode, params: Mapping[str, Fraction]) -> Proof:
        """Prove ``mode`` with ``params``: no violating state, and a state meeting its assumptions."""
        start = time.perf_counter()
        t = self.view.terms(mode, self.variables(), {k: _real(q) for k, q in params.items()})
        answer = self.solver.check([t.region, t.assume, _bool(z3.Not(t.safe))])
        seconds = lambda: time.perf_counter() - start
        if answer.status == "unknown":
            return Proof("unknown", reason=answer.reason, seconds=seconds())
        if answer.status == "sat":
            self.rejected += 1
            point = self.point(answer)
            self.pool.append(point)
            cex = self.view.confirm(self.solver, mode, point, params)
            if cex is None:
                return Proof("unknown", reason="z3 reports a violating state that neither float nor exact "
                                               "evaluation confirms", seconds=seconds())
            self.trail.append(cex)
            return Proof("refuted", cex, f"violates {', '.join(cex.violated)}", seconds())
        witness = self.solver.check([t.region, t.assume])
        if witness.status == "unsat":
            self.rejected += 1
            return Proof("vacuous", reason="no state of the scenario meets the mode's assumptions", seconds=seconds())
        if witness.status == "unknown":
            return Proof("unknown", reason=f"non-vacuity undecided: {witness.reason}", seconds=seconds())
        return Proof("proved", seconds=seconds())

    def candidates(self, mode: Mode, fixed: Mapping[str, Fraction], free: Sequence[Parameter],
                   tried: Iterable[tuple[Fraction, ...]]) -> list[z3.BoolRef]:
        """Parameter values in their ranges that survive every state found so far, with a witness state
        meeting the assumptions, other than the values already tried."""
        params: dict[str, z3.ExprRef] = {k: _real(q) for k, q in fixed.items()}
        params |= {p.name: z3.Real(p.name) for p in free}
        query = [_box(p, cast(z3.ArithRef, params[p.name])) for p in free]
        witness = self.view.terms(mode, self.variables("!witness"), params)
        query += [witness.region, witness.assume]
        for point in self.pool:
            t = self.view.terms(mode, point.exact, params)
            query.append(_bool(z3.Implies(z3.And(t.region, t.assume), t.safe)))
        for values in tried:
            query.append(_bool(z3.Or(*[params[p.name] != _real(v) for p, v in zip(free, values, strict=True)])))
        return query

    def propose(self, mode: Mode, fixed: Mapping[str, Fraction], free: Sequence[Parameter],
                tried: Sequence[tuple[Fraction, ...]]) -> _Answer:
        """The next candidate. The first puts each parameter with an objective at its cautious end (the
        end its objective moves away from) where the states found so far allow: the solver's own picks
        sit on the boundary its counterexamples draw, and creep towards the safe set by tiny steps."""
        query = self.candidates(mode, fixed, free, tried)
        cautious = [_bool(z3.Real(p.name) == _real(_binary(p.lo if p.objective == "maximize" else p.hi)))
                    for p in free if p.objective is not None]
        if cautious and not tried:
            answer = self.solver.check([*query, *cautious])
            if answer.status == "sat":
                return answer
        return self.solver.check(query)

    def cegis(self, mode: Mode, fixed: Mapping[str, Fraction]) -> _Found:
        """Safe values for the parameters not in ``fixed``: propose, refute, learn the state, repeat."""
        free = [p for p in mode.parameters if p.name not in fixed]
        if not free:
            proof = self.fixed(mode, fixed)
            status = {"proved": "safe", "unknown": "unknown"}.get(proof.status, "none")
            return _Found(status, dict(fixed), proof.reason, proof.status == "vacuous")
        tried: list[tuple[Fraction, ...]] = []
        for _ in range(MAX_CANDIDATES):
            answer = self.propose(mode, fixed, free, tried)
            if answer.status == "unsat":
                return self.no_candidate(mode, fixed, free)
            if answer.status == "unknown":
                return _Found("unknown", reason=f"candidate search undecided: {answer.reason}")
            values = tuple(_binary(_numeral(answer.value(z3.Real(p.name)))[1]) for p in free)
            if values in tried:
                return _Found("unknown", reason="candidates repeat at float precision (the boundary of the safe set)")
            tried.append(values)
            params = {**fixed, **dict(zip([p.name for p in free], values, strict=True))}
            proof = self.fixed(mode, params)
            if proof.status == "proved":
                return _Found("safe", params)
            if proof.status == "unknown":
                return _Found("unknown", reason=proof.reason)
        return _Found("unknown", reason=f"no safe candidate among the first {MAX_CANDIDATES}")

    def no_candidate(self, mode: Mode, fixed: Mapping[str, Fraction], free: Sequence[Parameter]) -> _Found:
        """No values survive: say whether the assumptions exclude every state for every value (vacuous)."""
        params: dict[str, z3.ExprRef] = {k: _real(q) for k, q in fixed.items()}
        params |= {p.name: z3.Real(p.name) for p in free}
        t = self.view.terms(mode, self.variables(), params)
        answer = self.solver.check([*[_box(p, cast(z3.ArithRef, params[p.name])) for p in free], t.region, t.assume])
        if answer.status == "unsat":
            return _Found("none", reason="no parameter value lets a state of the scenario meet the mode's "
                                         "assumptions", vacuous=True)
        n = len(self.pool)
        return _Found("none", reason=f"no parameter value survives the {n} counterexample state{'s' * (n != 1)} found")

    def bisect(self, mode: Mode, p: Parameter, params: dict[str, Fraction]) -> tuple[dict[str, Fraction], Optimum]:
        """Push ``p`` towards its objective, keeping the safe end, with the parameters optimized before it
        fixed (those without an objective stay free to serve it); last, the roundest number left in the
        bracket is tried."""
        before = {q.name: params[q.name] for q in mode.parameters[:mode.parameters.index(p)] if q.objective}
        lo, hi = float(p.lo), float(p.hi)
        end = hi if p.objective == "maximize" else lo
        bracket = _Bracket(float(params[p.name]), params)
        width = self.prover.tolerance * (hi - lo)
        while (t := bracket.next(end, width)) is not None:
            bracket.record(t, self.cegis(mode, {**before, p.name: _binary(t)}))
        if bracket.unsafe is not None and (t := _roundest(bracket.safe, bracket.unsafe)) is not None:
            bracket.record(t, self.cegis(mode, {**before, p.name: _binary(t)}))
        return bracket.params, bracket.optimum(p)

    def decide(self, mode: Mode) -> ModeOutcome:
        if not self.view.available(mode):
            return ModeOutcome(mode.name, "unavailable", reason="its requires is false in this scenario")
        first = len(self.trail)
        found = self.cegis(mode, {})
        if found.status != "safe":
            status = "unknown" if found.status == "unknown" else ("vacuous" if found.vacuous else "refuted")
            last = next((c for c in reversed(self.trail[first:]) if c.mode == mode.name), None)
            return ModeOutcome(mode.name, status, reason=found.reason, counterexample=last)
        params, optima = found.params, []
        for p in mode.parameters:
            if p.objective is not None:
                params, optimum = self.bisect(mode, p, params)
                optima.append(optimum)
        proof = self.fixed(mode, params)  # the floats written, proved as they are
        if proof.status != "proved":
            return ModeOutcome(mode.name, "unknown",
                               reason=f"the parameters written did not prove again: {proof.reason}")
        return ModeOutcome(mode.name, "proved", {p.name: float(params[p.name]) for p in mode.parameters}, tuple(optima))

    def defeats(self, modes: Sequence[Mode], values: Mapping[str, z3.ExprRef]) -> str:
        """Why the state does not defeat every mode for every parameter value ("" when it does)."""
        for k, mode in enumerate(modes):
            params: dict[str, z3.ExprRef] = {p.name: z3.Real(p.name) for p in mode.parameters}
            t = self.view.terms(mode, values, params)
            if k == 0 and not self.solver.holds(t.region):
                return "it is not in the scenario's region"
            if not mode.parameters:
                beaten = self.solver.holds(_bool(z3.And(t.assume, z3.Not(t.safe))))
            else:
                boxes = [_box(p, cast(z3.ArithRef, params[p.name])) for p in mode.parameters]
                beaten = self.solver.check([*boxes, _bool(z3.Implies(z3.And(t.region, t.assume), t.safe))]).status \
                    == "unsat"
            if not beaten:
                return f"mode {mode.name} has parameter values it does not defeat" if mode.parameters \
                    else f"it does not defeat mode {mode.name}"
        return ""

    def defeating(self, modes: Sequence[Mode]) -> tuple[dict[str, float], str] | None:
        """A state that defeats every available mode for every parameter value: among the states found,
        else by a query quantifying over each mode's parameters."""
        if not modes:
            return None
        for point in self.pool:
            found = self.confirm_defeat(modes, point, "a counterexample found while searching")
            if found is not None:
                return found
        xs = self.variables()
        parts: list[z3.BoolRef] = []
        for mode in modes:
            params = {p.name: z3.Real(p.name) for p in mode.parameters}
            t = self.view.terms(mode, xs, params)
            beaten = _bool(z3.And(t.assume, z3.Not(t.safe)))
            if mode.parameters:
                boxes = _and([_box(p, params[p.name]) for p in mode.parameters])
                beaten = _bool(z3.ForAll(list(params.values()), z3.Implies(boxes, beaten)))
            parts += [t.region, beaten]
        answer = self.solver.check(parts)
        return self.confirm_defeat(modes, self.point(answer), "a query over every mode") \
            if answer.status == "sat" else None

    def confirm_defeat(self, modes: Sequence[Mode], point: _Point, how: str) -> tuple[dict[str, float], str] | None:
        if not self.defeats(modes, _exact_floats(point.floats)):
            return point.floats, how
        if not self.defeats(modes, point.exact):
            return point.floats, f"{how} (checked with its exact values; the floats written are rounded)"
        return None


# --- the prover ------------------------------------------------------------------------------------------------

def network_parameters(mode: Mode) -> dict[str, float]:
    """A network mode's parameters: each at the end of its range its objective favours (the middle with no
    objective); the trusted region then says where the network is safe with them."""
    ends = {"maximize": lambda p: p.hi, "minimize": lambda p: p.lo, None: lambda p: p.lo + (p.hi - p.lo) / 2}
    return {p.name: float(ends[p.objective](p)) for p in mode.parameters}


class Prover:
    """Decides modes and scenarios of one spec under one z3 context, resource limit and time limit."""

    def __init__(self, spec: Spec, *, rlimit: int = DEFAULT_RLIMIT, time_limit: float = math.inf,
                 tolerance: float = 1e-9, progress: Progress | None = None, network: NetworkSource = None,
                 region_grid: int = REGION_GRID, region_depth: int = REGION_DEPTH) -> None:
        self.spec, self.tolerance, self.progress = spec, tolerance, progress
        self.solver = _Solver(rlimit, time_limit)
        self._network = network
        self.region_grid, self.region_depth = region_grid, region_depth

    def network(self) -> DecisionNetwork:
        """The decision network, loaded on first use."""
        if self._network is None:
            raise ValueError(f"spec {self.spec.name!r} has a mode that relies on a decision network, and none "
                             "is given")
        if not isinstance(self._network, DecisionNetwork):
            self._network = self._network()
        return self._network

    def recheck(self, region: TrustedRegion, verdicts: tuple[str, ...]) -> list[tuple[Cell, Cell]]:
        """The region's cells with one of ``verdicts``, each with its verdict when decided again."""
        old = [c for c in region.cells if c.verdict in verdicts]
        return list(zip(old, recheck_cells(self.network(), self.spec, region, verdicts), strict=True))

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def available(self, faults: frozenset[str], mode: Mode) -> bool:
        return _View(self.spec, faults).available(mode)

    def prove(self, faults: frozenset[str], mode: Mode, params: Mapping[str, float]) -> Proof:
        """Prove ``mode`` safe in the scenario with exactly these float parameters."""
        start = time.perf_counter()
        try:
            return _Search(self, faults).fixed(mode, {k: _binary(v) for k, v in params.items()})
        except _OutOfTime:
            return Proof("unknown", reason="time limit reached", seconds=time.perf_counter() - start)

    def defeats(self, faults: frozenset[str], state: Mapping[str, float]) -> str:
        """Why ``state`` does not defeat every available mode of the scenario ("" when it does)."""
        search = _Search(self, faults)
        missing = [n for n in search.view.universals if n not in state]
        if missing:
            return f"it gives no value for {', '.join(missing)}"
        modes = [m for m in self.spec.modes if search.view.available(m)]
        try:
            return search.defeats(modes, _exact_floats({n: state[n] for n in search.view.universals}))
        except _OutOfTime:
            return "the time limit was reached before it was checked"

    def simplex(self, search: _Search, mode: Mode, alone: ModeOutcome, later: Sequence[Mode],
                decided: dict[str, ModeOutcome]) -> ModeOutcome:
        """``mode`` relies on the network and is not safe for every output: proved when the network is proved
        on some cells (its trusted region) and the first later mode not relying on the network is safe (the
        fallback, acting everywhere else), or when the cells prove the whole scenario."""
        fallback = None
        for m in later:
            if not relies_on_network(self.spec, m):
                decided[m.name] = decided.get(m.name) or search.decide(m)
                if decided[m.name].status == "proved":
                    fallback = decided[m.name]
                    break
        params = network_parameters(mode)
        region = trusted_region(self.network(), self.spec, scenario=search.view.faults, mode=mode.name,
                                parameters=params, grid=self.region_grid, max_depth=self.region_depth)
        region = TrustedRegion.from_json(region.to_json())  # as the policy file holds it (seconds rounded)
        counts = region.counts()
        why = f"alone {alone.status}" + (f" ({alone.reason})" if alone.reason else "")
        share = f"the network is proved on {counts['proved']} of {len(region.cells)} cells ({region.coverage():.1%})"
        whole = counts["proved"] > 0 and counts["proved"] + counts["empty"] == len(region.cells)
        if counts["proved"] and (fallback is not None or whole):
            use = NetworkUse(fallback.mode if fallback else None, dict(fallback.parameters) if fallback else {}, region)
            by = f"{fallback.mode} elsewhere" if fallback else "on every cell of the scenario"
            return replace(alone, status="proved", parameters=params, optimum=(), network=use,
                           reason=f"{why}; Simplex: {share}, {by}")
        lacking = "no later mode that does not rely on the network is safe to fall back to" if fallback is None \
            else f"{fallback.mode} alone serves every state"
        return replace(alone, reason=f"{why}; {share}, so {lacking}")

    def scenario(self, faults: frozenset[str]) -> ScenarioOutcome:
        """The first mode with safe parameters, the best of them; or why none is safe."""
        start = time.perf_counter()
        search = _Search(self, faults)
        outcomes: list[ModeOutcome] = []
        reason, defeating = "", None
        decided: dict[str, ModeOutcome] = {}
        try:
            for k, mode in enumerate(self.spec.modes):
                outcome = decided.get(mode.name) or search.decide(mode)
                if outcome.status in ("refuted", "unknown") and self._network is not None \
                        and relies_on_network(self.spec, mode):
                    outcome = self.simplex(search, mode, outcome, self.spec.modes[k + 1:], decided)
                outcomes.append(outcome)
                self.say(f"{search.view.label}: {mode.name} {outcomes[-1].status}")
                if outcomes[-1].status == "proved":
                    break
        except _OutOfTime:
            reason = "time limit reached"
        if not reason and all(m.status in ("refuted", "vacuous", "unavailable") for m in outcomes):
            available = [self.spec.mode(m.mode) for m in outcomes if m.status != "unavailable"]
            try:
                defeating = search.defeating(available)
            except _OutOfTime:
                defeating = None
        order = [f.name for f in self.spec.faults]
        return ScenarioOutcome(tuple(f for f in order if f in faults), search.view.label, tuple(outcomes),
                               tuple(search.trail), search.rejected, time.perf_counter() - start, reason,
                               defeating[0] if defeating else None, defeating[1] if defeating else None)


# --- the policy ------------------------------------------------------------------------------------------------

def _entry(outcome: ScenarioOutcome) -> Entry:
    chosen = outcome.chosen
    passed = [f"{m.mode} {m.status}" + (f": {m.reason}" if m.reason else "") for m in outcome.modes if m is not chosen]
    if chosen is None:
        reason = "; ".join([*passed, outcome.reason] if outcome.reason else passed)
        return Entry(outcome.label, outcome.faults, None, {}, "unknown", outcome.seconds, outcome.rejected,
                     outcome.counterexamples, reason or "undecided")
    undecided = any(m.status == "unknown" for m in outcome.modes)
    reason = ("a more capable mode is undecided; " if undecided else "") + "; ".join(passed)
    if chosen.network is not None:
        reason = "; ".join(r for r in (reason, f"{chosen.mode} {chosen.reason}") if r)
    return Entry(outcome.label, outcome.faults, chosen.mode, dict(chosen.parameters), "proved", outcome.seconds,
                 outcome.rejected, outcome.counterexamples, reason, chosen.optimum, chosen.network)


def _unrealizable(outcome: ScenarioOutcome) -> Unrealizable:
    per_mode = tuple(ModeFailure(m.mode, m.status, m.counterexample.state if m.counterexample else None,
                                 dict(m.counterexample.parameters) if m.counterexample else {}, m.reason)
                     for m in outcome.modes)
    return Unrealizable(outcome.label, outcome.faults, outcome.defeating, per_mode, outcome.found_by, outcome.seconds)


def synthesize(spec: Spec, *, model: DecisionNetwork | None = None, time_limit: float = 60.0,
               rlimit: int = DEFAULT_RLIMIT, tolerance: float = 1e-9, progress: Progress | None = None,
               region_grid: int = REGION_GRID, region_depth: int = REGION_DEPTH) -> Policy:
    """Decide every scenario of ``spec`` (fewest faults first) and write the policy; scenarios left
    when ``time_limit`` seconds have passed are unknown (a trusted region being cut runs to its end).
    ``model``: the decision network a mode relies on (default: the spec's model, loaded when needed)."""
    start = time.perf_counter()
    source = spec.model
    network: NetworkSource = model if model is not None else (
        None if source is None else lambda: load_decision_model(source, spec))
    prover = Prover(spec, rlimit=rlimit, time_limit=time_limit, tolerance=tolerance, progress=progress,
                    network=network, region_grid=region_grid, region_depth=region_depth)
    table: list[Entry] = []
    unrealizable: list[Unrealizable] = []
    for faults in spec.scenarios():
        outcome = prover.scenario(faults)
        if outcome.chosen is None and not outcome.undecided:
            unrealizable.append(_unrealizable(outcome))
        else:
            table.append(_entry(outcome))
    settings = {"rlimit": rlimit, "tolerance": tolerance, "seed": SEED,
                "time_limit": time_limit if math.isfinite(time_limit) else None,
                "queries": prover.solver.queries, "seconds": time.perf_counter() - start}
    return Policy(spec.name, spec.digest, spec.source,
                  {v.name: StateRange(float(v.lo), float(v.hi), v.unit) for v in spec.state},
                  tuple((f.name, f.kind) for f in spec.faults), tuple(m.name for m in spec.modes),
                  tuple(table), tuple(unrealizable), guard_for(spec), settings)
