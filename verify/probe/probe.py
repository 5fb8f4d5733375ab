"""The probe: per site of a reduced-precision program, proved safe, confirmed overflow, or open.

1. Bounds: interval propagation over every op's rule (:mod:`.bounds`), then linear
   back-substitution (:mod:`.linear`) for sites the intervals leave unsafe.
2. Witnesses: for every site still unsafe, a search over the input box (corners, random
   points, gradient ascent, then z3 on small cones); a witness counts only when the
   reduced-precision program run on it shows inf/NaN/saturation/wrap-around at that site
   (:mod:`.witness`, :mod:`.z3_witness`).
3. Boundary: the largest scale ``s`` of the input box at which every site is proved safe
   (bisection on the sound bounds), and the smallest scale at which a witness is confirmed.

A site's verdict assumes its operands are finite: a site downstream of an overflow is judged
on its own, so "every site proved safe" is a proof for the whole program.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import InputError
from cuvil.ir.module import Module
from cuvil.ir.values import Value, reachable
from verify.probe.bounds import Bounds, BoundsEngine, NodeRecord, OpBounds
from verify.probe.budget import DEFAULT_EFFORT, INTERVAL_FACTOR, Budget, engine_work
from verify.probe.interval import Interval
from verify.probe.linear import LinearRefiner
from verify.probe.names import describe_origin, ssa_names
from verify.probe.program import Program, SiteWatch, max_finite, reduced_program
from verify.probe.witness import Searcher, Target, Witness
from verify.probe.z3_witness import QUERY_RLIMIT, Outcome

SAFE, OVERFLOW, OPEN = "safe", "overflow", "open"

EXIT_SAFE, EXIT_OVERFLOW, EXIT_OPEN = 0, 1, 3


@dataclass(frozen=True)
class ProbeOptions:
    """How hard to look. ``effort`` is the work the probe may do, in work units (:mod:`.budget`): the same
    effort gives the same report on any machine; ``time_limit`` (seconds) is an outer guard whose cuts the
    report names. ``z3_witness`` asks z3 for witnesses of the sites with small cones the gradient search
    leaves open."""

    precision: str = "fp16"
    keep_ops: str | tuple[str, ...] = "none"
    refine: bool = True
    search: bool = True
    boundary: bool = True
    effort: float = DEFAULT_EFFORT
    time_limit: float = 600.0
    seed: int = 0
    restarts: int = 3
    steps: int = 40
    samples: int = 8
    max_scale: float = 2.0 ** 20
    z3_witness: bool = True
    z3_rlimit: int = QUERY_RLIMIT


@dataclass
class SiteResult:
    """One site: where it is, its verdict, its bound and its witness."""

    value: Value
    name: str
    op: str
    dtype: str
    origin: str | None
    verdict: str
    rule: str
    component: str
    bound_lo: float
    bound_hi: float
    allowed_lo: float
    allowed_hi: float
    may_nan: bool
    method: str
    index: tuple[int, ...] | None = None
    witness: int | None = None
    witness_value: float | None = None
    unsafe_components: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    """Confirmed overflow sites upstream of this one (an open site there is usually their consequence)."""
    witness_method: str | None = None
    """How the confirmed witness was found: center, corner, random, gradient or z3."""
    z3: Outcome | None = None
    """The z3 attempt on the site's worst node, when one was made or considered."""
    safe_scale: float | None = None
    """The largest box scale tried at which the site was proved safe (None: at none)."""
    witness_scale: float | None = None
    """The smallest box scale tried at which an overflow of the site was confirmed (None: at none)."""

    @property
    def magnitude(self) -> float:
        return max(abs(self.bound_lo), abs(self.bound_hi))

    @property
    def margin(self) -> float:
        """How far inside the allowed range the bound is, as a ratio (> 1: safe with room)."""
        limit = max(abs(self.allowed_lo), abs(self.allowed_hi))
        if self.may_nan or not math.isfinite(self.magnitude):
            return 0.0
        if self.magnitude == 0:
            return math.inf
        return limit / self.magnitude


@dataclass
class Boundary:
    """``safe_scale``: every site proved for inputs in ``s x`` the box; ``witness_scale``: smallest
    scale tried at which a witness was confirmed (None: none found within the limits)."""

    safe_scale: float | None = None
    witness_scale: float | None = None
    unproved_scale: float | None = None
    unconfirmed_scale: float | None = None
    bisection_steps: int = 0
    note: str = ""


@dataclass
class ProbeReport:
    precision: str
    ranges: dict[str, tuple[float, float]]
    sites: list[SiteResult]
    witnesses: list[Witness]
    boundary: Boundary
    timings: dict[str, float]
    threshold: str
    program: Program
    budget: Budget | None = None

    def count(self, verdict: str) -> int:
        return sum(s.verdict == verdict for s in self.sites)

    @property
    def exit_code(self) -> int:
        if self.count(OVERFLOW):
            return EXIT_OVERFLOW
        if self.count(OPEN):
            return EXIT_OPEN
        return EXIT_SAFE


# --------------------------------------------------------------------------------------
# analysis


def _boxes(program: Program, ranges: Mapping[str, tuple[Any, Any]], scale: float = 1.0) -> dict[str, tuple[Any, Any]]:
    out = {}
    for p in program.function.params:
        if p.name not in ranges:
            raise InputError(f"no range for input {p.name!r}", location=p.name,
                             hint=f"pass --range {p.name}=LO:HI (or --calibrate DIR)")
        lo, hi = (np.asarray(x, dtype=np.float64) for x in ranges[p.name])
        if np.any(lo > hi):
            raise InputError(f"the range of {p.name!r} is empty (low > high)", location=p.name)
        if p.dtype.is_float and scale != 1.0:
            lo, hi = lo * scale, hi * scale
        out[p.name] = (lo, hi)
    return out


class Analysis:
    """Bounds for a program at any box scale, with linear refinement where intervals fail."""

    def __init__(self, program: Program, ranges: Mapping[str, tuple[Any, Any]], options: ProbeOptions) -> None:
        self.program = program
        self.ranges = ranges
        self.options = options
        self.engine = BoundsEngine(program.function, program.module.constants, SiteWatch(program))
        self.refiner = LinearRefiner(program.function, self.engine) if options.refine else None
        self.pass_units = INTERVAL_FACTOR * engine_work(self.engine)
        self.proved_at: dict[Value, set[float]] = {}
        """Per site, the box scales at which one of the passes proved it."""
        self.witnessed_at: dict[Value, set[float]] = {}
        """Per site, the box scales at which a witness search confirmed its overflow."""
        self.excess: float | None = None
        """How far the first failing site of the last :meth:`proved` was past its limit (None: none failed,
        or no finite measure)."""
        self.plain: tuple[float, Bounds] | None = None
        """The last whole pass without pins (its scale and bounds): :meth:`bounds` and :meth:`proved` at that
        scale start from it instead of running the same pass again."""

    def run(self, boxes: Mapping[str, tuple[Any, Any]], budget: Budget, scale: float = 1.0, **kw: Any) -> Bounds:
        """One interval pass at box ``scale``, charged to ``budget``; every site it evaluates is noted."""
        budget.charge(self.pass_units)
        b = self.engine.run(boxes, **kw)
        budget.charge(self.engine.take_norm_units())
        for v, ob in b.ops.items():
            if ob.records and ob.safe:
                self.proved_at.setdefault(v, set()).add(scale)
        return b

    def failing_at(self, scale: float, budget: Budget) -> list[Value]:
        """The sites one whole pass at ``scale`` does not prove."""
        return _unsafe(self.run(_boxes(self.program, self.ranges, scale), budget, scale))

    def site_safe_scale(self, v: Value) -> float | None:
        return max(self.proved_at.get(v, ()), default=None)

    def bounds(self, scale: float, budget: Budget, *, refine: bool = True) -> tuple[Bounds, set[Value]]:
        """Bounds at ``scale`` and the values whose bound came from linear refinement."""
        boxes = _boxes(self.program, self.ranges, scale)
        if self.plain is None or self.plain[0] != scale:
            self.plain = (scale, self.run(boxes, budget, scale))
        b = self.plain[1]
        unsafe = _unsafe(b)
        if not unsafe or self.refiner is None or not refine:
            return b, set()
        pins = self.refiner.refine(b, unsafe, budget)
        if not pins:
            return b, set()
        refined = self.run(boxes, budget, scale, pinned=pins)
        return refined, set(pins)

    def proved(self, scale: float, budget: Budget, rounds: int = 4) -> bool:
        """Whether every site is proved at ``scale``: intervals up to the first failing site, which
        linear refinement then gets a chance to prove (repeated for the next failing site)."""
        boxes = _boxes(self.program, self.ranges, scale)
        pins: dict[Value, Interval] = {}
        last: Value | None = None
        for _ in range(rounds):
            failing: list[Value] = []

            def stop(v: Value, ob: OpBounds, failing: list[Value] = failing) -> bool:
                if ob.records and not ob.safe:
                    failing.append(v)
                    return True
                return False

            if not pins and self.plain is not None and self.plain[0] == scale:
                b = self.plain[1]  # the same pass, run whole: its first failing site is where ``stop`` ends
                failing.extend(_unsafe(b))
            else:
                b = self.run(boxes, budget, scale, pinned=pins, stop=stop)
            if not failing:
                self.excess = None
                return True
            v = failing[0]
            self.excess = site_excess(b.ops[v])
            if self.refiner is None or v is last or budget.exhausted:
                return False
            new = self.refiner.refine(b, [v], budget)
            if v not in new:
                return False
            pins.update(new)
            last = v
        return False


def _unsafe(b: Bounds) -> list[Value]:
    """The sites a pass did not prove, in program order."""
    return [v for v, ob in b.ops.items() if ob.records and not ob.safe]


def _worst(ob: OpBounds) -> NodeRecord:
    return max(ob.records.values(), key=lambda r: (not r.safe, r.excess if math.isfinite(r.excess) else 1e308))


def probe(module: Module, ranges: Mapping[str, tuple[Any, Any]], options: ProbeOptions | None = None, *,
          names: Mapping[Value, str] | None = None) -> ProbeReport:
    """Probe ``module`` for inputs in ``ranges`` (``name -> (lo, hi)``, scalars or arrays)."""
    options = options or ProbeOptions()
    start = time.monotonic()
    budget = Budget(options.effort, start + options.time_limit)
    timings: dict[str, float] = {}
    program = reduced_program(module, options.precision, keep_ops=options.keep_ops)
    analysis = Analysis(program, ranges, options)
    t = time.monotonic()
    bounds, refined = analysis.bounds(1.0, budget.until(0.35, "bounds"))
    timings["bounds"] = time.monotonic() - t
    sites = {v: ob for v, ob in bounds.ops.items() if ob.records}
    targets = [Target.of(v, r) for v, ob in sites.items() for r in ob.records.values() if not r.safe]
    witnesses: list[Witness] = []
    best: dict[tuple[Value, int], float] = {}
    confirmed: dict[tuple[Value, int], int] = {}
    outcomes: dict[tuple[Value, int], Outcome] = {}
    t = time.monotonic()
    if targets and options.search:
        boxes = _boxes(program, ranges)
        searcher = Searcher(program, analysis.engine, boxes, seed=options.seed, z3_witness=options.z3_witness,
                            z3_rlimit=options.z3_rlimit)
        result = searcher.search(targets, budget.until(0.6 if options.boundary else 1.0, "witnesses"),
                                 restarts=options.restarts, steps=options.steps, samples=options.samples)
        witnesses = result.witnesses
        best = result.best
        outcomes = result.z3
        for k, w in enumerate(witnesses):
            for key in w.confirmed:
                confirmed.setdefault(key, k)
    timings["witnesses"] = time.monotonic() - t
    ssa = ssa_names(program.function)
    source_ssa = ssa_names(module.main)
    results = [_site_result(v, ob, program, ssa, source_ssa, names or {}, refined, confirmed, best, witnesses,
                            outcomes) for v, ob in sites.items()]
    _mark_downstream(results)
    t = time.monotonic()
    boundary = Boundary(note="not computed")
    if options.boundary:
        boundary = _boundary(analysis, options, budget.share(0.6, "boundary proofs"), budget, bool(confirmed),
                             _excess_ratio(bounds))
    for v, _ in confirmed:
        analysis.witnessed_at.setdefault(v, set()).add(1.0)
    for r in results:
        r.safe_scale = analysis.site_safe_scale(r.value)
        r.witness_scale = min(analysis.witnessed_at.get(r.value, ()), default=None)
    timings["boundary"] = time.monotonic() - t
    timings["total"] = time.monotonic() - start
    threshold = _threshold_text(program)
    return ProbeReport(options.precision, {k: (_num(v[0]), _num(v[1])) for k, v in ranges.items()}, results,
                       witnesses, boundary, timings, threshold, program, budget)


def _num(x: Any) -> float:
    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else float(a.min() if a.size else 0.0)


def _threshold_text(program: Program) -> str:
    if program.narrow is not None:
        m = max_finite(program.narrow)
        from verify.probe.interval import overflow_at

        return (f"{program.narrow} sites are proved safe when every value is within +-{m:g} (the largest finite "
                f"value); a value rounds to infinity only at |v| >= {overflow_at(program.narrow):g}")
    return ("integer sites are proved safe when every requantized value stays inside its type's range before the "
            "saturating clamp and every accumulator inside its integer type; where the zero point is the type's "
            "minimum, clamping below it is the ReLU the quantizer folded in, not saturation")


def _site_result(v: Value, ob: OpBounds, program: Program, ssa: Mapping[Value, str], source_ssa: Mapping[Value, str],
                 names: Mapping[Value, str], refined: set[Value], confirmed: Mapping[tuple[Value, int], int],
                 best: Mapping[tuple[Value, int], float], witnesses: list[Witness] | None = None,
                 outcomes: Mapping[tuple[Value, int], Outcome] | None = None) -> SiteResult:
    worst = _worst(ob)
    hits = [k for (val, k) in confirmed if val is v]
    if hits:
        verdict = OVERFLOW
        node = max(hits)  # the innermost confirmed node: where the overflow starts
        rec = ob.records[node]
        witness = confirmed[(v, node)]
    else:
        verdict = SAFE if ob.safe else OPEN
        rec = worst
        witness = None
    origin_value = program.origin.get(v)
    origin = describe_origin(origin_value, names, source_ssa)
    unsafe = [r.label if r.node else "result" for r in ob.records.values() if not r.safe]
    return SiteResult(
        value=v, name=ssa.get(v, "?"), op=v.op, dtype=str(v.dtype), origin=origin, verdict=verdict,
        rule=rec.spec.rule, component="result" if rec.node == 0 else rec.label,
        bound_lo=rec.lo, bound_hi=rec.hi, allowed_lo=rec.spec.lo, allowed_hi=rec.spec.hi, may_nan=rec.nan,
        method="linear" if v in refined else (ob.method if ob.method in ("bilinear", "windows") else "interval"),
        index=rec.worst, witness=witness, witness_value=best.get((v, rec.node)), unsafe_components=unsafe,
        witness_method=witnesses[witness].method if witness is not None and witnesses else None,
        z3=(outcomes or {}).get((v, rec.node)))


def _mark_downstream(results: list[SiteResult]) -> None:
    """For each site not proved safe: the confirmed overflows among the sites it depends on."""
    by_value = {r.value: r for r in results}
    upstream: dict[Value, set[str]] = {}
    for r in results:
        found = _overflows_upstream(r.value, by_value, upstream)
        upstream[r.value] = found
        if r.verdict != SAFE:
            r.after = sorted(found)


def _overflows_upstream(value: Value, sites: Mapping[Value, SiteResult], upstream: Mapping[Value, set[str]]
                        ) -> set[str]:
    """The confirmed overflows at the nearest sites ``value`` depends on, and upstream of those
    (``upstream`` holds them for every site met before ``value``)."""
    found: set[str] = set()

    def step(u: Value) -> tuple[Value, ...]:
        site = sites.get(u)
        if site is None:
            return u.operands
        if site.verdict == OVERFLOW:
            found.add(site.name)
        found.update(upstream.get(u, set()))
        return ()

    reachable(value.operands, step)
    return found


def _excess_ratio(bounds: Bounds) -> float | None:
    """How far (as a factor) the worst site's bound is past its limit at scale 1 (None: no finite measure)."""
    worst = 1.0
    for ob in bounds.ops.values():
        excess = site_excess(ob)
        if excess is None:
            return None
        worst = max(worst, excess)
    return worst


def site_excess(ob: OpBounds) -> float | None:
    """How far (as a factor, at least 1) one site's bound is past its limit (None: no finite measure)."""
    worst = 1.0
    for r in ob.records.values():
        if r.safe:
            continue
        if r.nan or not (math.isfinite(r.lo) and math.isfinite(r.hi)):
            return None
        limit = max(abs(r.spec.lo), abs(r.spec.hi))
        if math.isfinite(limit) and limit > 0:
            worst = max(worst, max(abs(r.lo), abs(r.hi)) / limit)
    return worst


def _boundary(analysis: Analysis, options: ProbeOptions, proofs: Budget, rest: Budget,
              confirmed_at_one: bool, excess: float | None = None) -> Boundary:
    """Bisection on the proofs (log scale) within ``proofs``, then a witness search above the proved
    scale with what ``rest`` has left."""
    out = Boundary()
    if not any(p.dtype.is_float for p in analysis.program.function.params):
        out.note = "every input is an integer (ids, indices): the boundary scale applies to float inputs only"
        return out
    lo_s: float | None = None  # proved
    hi_s: float | None = None  # not proved
    s = 1.0
    steps = 0
    try:
        if analysis.proved(1.0, proofs):
            lo_s = 1.0
            s = _first_step_up(analysis)
            while s <= options.max_scale and not proofs.exhausted:
                steps += 1
                if analysis.proved(s, proofs):
                    lo_s = s
                    s *= 4
                else:
                    hi_s = s
                    break
        else:
            hi_s = 1.0
            # bounds shrink at most in proportion to the scale (the centers and their rounding stay), so
            # start well under the excess factor: a first step that fails can leave no budget for a second
            s = min(0.5, FIRST_STEP / excess) if excess else 0.5
            while s >= 2.0 ** -40 and not proofs.exhausted:
                steps += 1
                if analysis.proved(s, proofs):
                    lo_s = s
                    break
                hi_s = s
                if steps == 1 and _holds_zero(analysis) and not proofs.exhausted:
                    failing = analysis.failing_at(0.0, proofs)
                    if failing:  # a box that holds that point has bounds no tighter: the rest goes to witnesses
                        hi_s = 0.0
                        out.note = (f"{len(failing)} site(s) not proved at scale 0 (the box shrunk to the point "
                                    "0, which every scaled box holds): smaller boxes are not tried")
                        break
                s *= _next_factor(analysis.excess)
        while lo_s is not None and hi_s is not None and hi_s / lo_s > 1.05 and not proofs.exhausted:
            mid = math.sqrt(lo_s * hi_s)
            steps += 1
            if analysis.proved(mid, proofs):
                lo_s = mid
            else:
                hi_s = mid
    except MemoryError:
        out.note = "bisection stopped: out of memory"
    out.safe_scale, out.unproved_scale, out.bisection_steps = lo_s, hi_s, steps
    if not options.search or hi_s is None:
        if hi_s is None:
            out.note = f"every site is proved safe up to {lo_s:g} x the box (the largest scale tried)"
        return out
    _witness_scale(analysis, options, rest.share(1.0, "boundary witnesses"), out, confirmed_at_one)
    return out


def _holds_zero(analysis: Analysis) -> bool:
    """Whether every float input's box holds 0, so that scale 0's box (that one point) lies in every scaled box."""
    for p in analysis.program.function.params:
        if p.dtype.is_float:
            lo, hi = (np.asarray(x, dtype=np.float64) for x in analysis.ranges[p.name])
            if not (bool(np.all(lo <= 0)) and bool(np.all(hi >= 0))):
                return False
    return True


FIRST_STEP = 0.5
"""The first scale the bisection tries below 1, over the worst site's excess factor at 1. A step that fails
costs a pass and a linear refinement, and a budget may leave the boundary one or two steps (ResNet-18's
default: two, 0.33 then 0.57); with older bounds a first step at 0.9 and at 0.6 failed on ResNet-18 (by 4 %
at 0.6, on one residual sum), leaving no proved scale."""


def _first_step_up(analysis: Analysis) -> float:
    """The first scale the bisection tries above 1, where every site is proved there: just under where the
    closest site's bound would meet its limit if bounds grew in proportion to the scale (a deviation from the
    center does and the center stays; a nonlinear op may grow faster, and then the step fails), at least 1.05
    and at most 2 (2 without a finite measure). ResNet-18, its last residual sum at 0.7 of its limit: about
    1.35, where a step to 2 failed and left no budget for another."""
    if analysis.plain is None or analysis.plain[0] != 1.0:
        return 2.0
    room = math.inf
    for ob in analysis.plain[1].ops.values():
        for r in ob.records.values():
            limit = max(abs(r.spec.lo), abs(r.spec.hi))
            reach = max(abs(r.lo), abs(r.hi))
            if not math.isfinite(limit):
                continue
            if not math.isfinite(reach):
                return 2.0
            if reach > 0:
                room = min(room, limit / reach)
    return min(2.0, max(1.05, STEP_UP * room))


STEP_UP = 0.95
""":func:`_first_step_up`'s share of the closest site's room."""


def _next_factor(excess: float | None) -> float:
    """The next scale down after one that failed, as a factor of it: just under where the first failing
    site's bound would meet its limit if bounds grew in proportion to the scale, between 1/64 and 1/1.5
    (1/4 without a finite measure)."""
    if excess is None or not math.isfinite(excess):
        return 0.25
    return min(1 / 1.5, max(1 / 64, 0.9 / excess))


def _witness_scale(analysis: Analysis, options: ProbeOptions, budget: Budget, out: Boundary,
                   confirmed_at_one: bool) -> None:
    """The smallest scale (found) with a confirmed witness: doubling from the proved scale, then bisection."""
    def witness_at(s: float) -> bool:
        b, _ = analysis.bounds(s, budget, refine=False)
        targets = [Target.of(v, r) for v, ob in b.ops.items() if ob.records for r in ob.records.values()
                   if not r.safe]
        if not targets:
            return False
        boxes = _boxes(analysis.program, analysis.ranges, s)
        searcher = Searcher(analysis.program, analysis.engine, boxes, seed=options.seed + 1)
        res = searcher.search(targets, budget.share(0.25, "boundary witnesses"), restarts=1,
                              steps=max(10, options.steps // 2), samples=4, scale=s)
        for w in res.witnesses:
            for v, _ in w.confirmed:
                analysis.witnessed_at.setdefault(v, set()).add(s)
        return bool(res.witnesses)

    if out.unproved_scale == 0.0:  # the bounds fail at one point: is that point a witness?
        if witness_at(0.0):
            out.witness_scale = 0.0
            out.note += "; a witness at that point is confirmed"
            return
    low = out.safe_scale or 0.0
    high: float | None = 1.0 if confirmed_at_one else None
    s = max(out.unproved_scale or 1.0, 1e-30)
    if high is None:
        while s <= options.max_scale * 4 and not budget.exhausted:
            if witness_at(s):
                high = s
                break
            low = s
            s *= 4
    if high is None:
        out.note = "no witness confirmed within the scales and work budget tried"
        out.unconfirmed_scale = low or None
        return
    for _ in range(6):
        if budget.exhausted or (low and high / low < 1.05):
            break
        mid = math.sqrt(max(low, high / 64) * high)
        if witness_at(mid):
            high = mid
        else:
            low = mid
    out.witness_scale = high
    out.unconfirmed_scale = low or None


def save_witnesses(report: ProbeReport, folder: str | Path) -> list[dict[str, str]]:
    """Each witness in ``folder/wN/<input>.npy``."""
    root = Path(folder)
    return [w.save(root / f"w{k + 1}") for k, w in enumerate(report.witnesses)]
