"""Witness inputs for sites the bounds do not prove safe: search, then confirmation.

Search: box corners and random points, then projected sign-gradient ascent (torch autograd on
the program read from its rules, in float64) on the watched node's value, jointly over all
open sites (the objective is the largest normalized excess, so the gradient follows whichever
site is closest to its limit), then z3 on the small cones of the sites still open
(:mod:`.z3_witness`). Confirmation: the candidate input is run through the
reduced-precision program on the reference interpreter; a site is confirmed when, with
finite operands, a watched node of its rule computes inf/NaN (narrow floats), leaves the
integer range before its clamp (saturation) or leaves its integer type (wrap-around).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.interp import evaluate_values
from cuvil.ir.values import Value
from verify.probe import torch_eval
from verify.probe.bounds import BoundsEngine, NodeRecord
from verify.probe.budget import CONFIRM_FACTOR, GRADIENT_FACTOR, UNIT, WATCH_FACTOR, Budget, engine_work, op_work
from verify.probe.concrete import Observed, WatchingWalker
from verify.probe.interval import overflow_at
from verify.probe.program import Program, SiteSpec
from verify.probe.z3_witness import QUERY_RLIMIT, ConeSolver, Outcome

Box = tuple[np.ndarray, np.ndarray]

NEAR = 0.5
"""Targets whose best value came within this fraction of their limit are pushed together."""

PAST = 0.02
"""A target's score counts as past its limit (an ascent stops) once it reaches this."""

FOCUSED_STEP = 0.1
"""First step of a focused ascent, in box half-widths: it starts near the limit and should stay near."""

RULE_GRID_MAX = 1 << 24
"""Largest evaluation grid confirmation reads an op's rule on to observe its inner nodes."""


@dataclass(frozen=True)
class Target:
    """One watched node to push past its limit, on one side."""

    value: Value
    node: int
    spec: SiteSpec
    side: int
    index: tuple[int, ...] | None = field(default=None, compare=False)
    """The output element whose bound is worst (where a z3 attempt looks)."""

    @property
    def key(self) -> tuple[Value, int]:
        return self.value, self.node

    @property
    def limit(self) -> float:
        """The value the node has to reach (in real arithmetic) for the site to fail."""
        if self.spec.rule.endswith("overflow") and self.spec.dtype.is_float:
            return self.side * overflow_at(self.spec.dtype)
        return self.spec.hi + 1 if self.side > 0 else self.spec.lo - 1

    def score(self, x: float) -> float:
        """>= 0 once the node is past its limit; normalized so sites compare."""
        return (self.side * x - self.side * self.limit) / max(abs(self.limit), 1.0)

    @staticmethod
    def of(value: Value, rec: NodeRecord) -> Target:
        side = 1 if rec.hi - rec.spec.hi >= rec.spec.lo - rec.lo else -1
        return Target(value, rec.node, rec.spec, side, rec.worst)


@dataclass
class Observation:
    """What the reduced-precision program computed at a watched node on a witness."""

    confirmed: bool
    extreme: float
    inherited: bool = False


@dataclass
class Witness:
    inputs: dict[str, np.ndarray]
    scale: float
    observations: dict[tuple[Value, int], Observation] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    method: str = ""
    """How the input was found: center, corner, random, gradient or z3."""

    @property
    def confirmed(self) -> list[tuple[Value, int]]:
        return [k for k, o in self.observations.items() if o.confirmed]

    def save(self, folder: Path) -> dict[str, str]:
        """One .npy per model input, shaped like the input."""
        folder.mkdir(parents=True, exist_ok=True)
        self.files = {}
        for name, arr in self.inputs.items():
            path = folder / f"{_safe(name)}.npy"
            np.save(path, arr, allow_pickle=False)
            self.files[name] = str(path)
        return self.files


def _safe(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "input"


# --------------------------------------------------------------------------------------
# confirmation


class Confirmer:
    """Runs candidate inputs through the reduced-precision program and checks the targets."""

    def __init__(self, program: Program, engine: BoundsEngine) -> None:
        self.program = program
        self.engine = engine
        self.fn = program.function

    def observe(self, inputs: Mapping[str, np.ndarray],
                targets: Sequence[Target]) -> dict[tuple[Value, int], Observation]:
        with np.errstate(all="ignore"):  # overflowing is what a witness is for
            values = evaluate_values(self.fn, self.program.module.constants, dict(inputs))
        by_value: dict[Value, list[Target]] = {}
        for t in targets:
            by_value.setdefault(t.value, []).append(t)
        out: dict[tuple[Value, int], Observation] = {}
        for v, ts in by_value.items():
            operands = [values[o] for o in v.operands]
            inherited = any(o.dtype.is_float and not np.all(np.isfinite(a)) for o, a in zip(v.operands, operands,
                                                                                               strict=True))
            seen = self._nodes(v, operands, ts, values[v])
            for t in ts:
                obs = seen[t.node]
                out[t.key] = self._judge(t, obs, inherited)
        return out

    def watch_units(self, targets: Sequence[Target]) -> float:
        """Work units of reading again the rules of the ops whose inner (or integer) nodes are watched."""
        reread = {t.value for t in targets if t.node != 0 or t.spec.rule == "int-overflow"}
        return sum(WATCH_FACTOR * op_work(v, self.engine.context(v).info) / UNIT for v in reread
                   if self.engine.context(v).info.grid <= RULE_GRID_MAX)

    def _nodes(self, v: Value, operands: list[np.ndarray], ts: list[Target], result: np.ndarray) -> dict[int, Observed]:
        """Each target node's observed values: the interpreter's result for a float root, the rule read
        in the program's types for inner float nodes, and in exact (wide) arithmetic for integers."""
        info = self.engine.context(v).info
        seen: dict[int, Observed] = {}
        float_nodes = {t.node for t in ts if t.spec.rule != "int-overflow" and t.node != 0}
        int_nodes = {t.node for t in ts if t.spec.rule == "int-overflow"}
        if info.grid > RULE_GRID_MAX:  # too large to read term by term: only the result is observed
            float_nodes = set()
            int_nodes = {k for k in int_nodes if k == 0}
        if float_nodes:
            w = WatchingWalker(info, operands, dict.fromkeys(float_nodes, True))
            with np.errstate(all="ignore"):
                w.expr(info.rule)
            seen.update(w.observed)
        if int_nodes and torch_eval.available():
            import torch

            tw = torch_eval.TorchWalker(info, [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in operands],
                                        capture=sorted(int_nodes))
            with torch.no_grad():
                tw.expr(info.rule)
            for k in int_nodes:
                acc = Observed()
                for val in tw.captured.get(k, []):
                    acc.add(val.detach().numpy())
                seen[k] = acc
        if any(t.node == 0 and t.spec.rule != "int-overflow" for t in ts):
            root = Observed()
            root.add(result)
            seen[0] = root
        for t in ts:
            seen.setdefault(t.node, Observed())
        return seen

    @staticmethod
    def _judge(t: Target, obs: Observed, inherited: bool) -> Observation:
        extreme = obs.hi if t.side > 0 else obs.lo
        if inherited:
            return Observation(False, extreme, inherited=True)
        if t.spec.rule.endswith("overflow") and t.spec.dtype.is_float:
            return Observation(obs.nonfinite, math.inf * t.side if obs.nonfinite else extreme)
        crossed = obs.hi > t.spec.hi or obs.lo < t.spec.lo
        return Observation(bool(crossed), extreme)


# --------------------------------------------------------------------------------------
# search


@dataclass
class SearchResult:
    witnesses: list[Witness]
    best: dict[tuple[Value, int], float]  # the most extreme value reached per target (real arithmetic)
    evaluations: int = 0
    points: list[dict[str, np.ndarray]] = field(default_factory=list)  # every input tried
    z3: dict[tuple[Value, int], Outcome] = field(default_factory=dict)  # the z3 attempt per target


class Searcher:
    """Finds inputs in a box that push targets past their limits."""

    def __init__(self, program: Program, engine: BoundsEngine, boxes: Mapping[str, Box], *, seed: int = 0,
                 z3_witness: bool = False, z3_rlimit: int = QUERY_RLIMIT) -> None:
        self.program = program
        self.engine = engine
        self.fn = program.function
        self.boxes = {k: (np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))
                      for k, (lo, hi) in boxes.items()}
        self.rng = np.random.default_rng(seed)
        self.confirmer = Confirmer(program, engine)
        self.work = engine_work(engine)
        self.params = list(self.fn.params)
        self.torch_program = torch_eval.TorchProgram(self.fn, engine.constant_value, engine.live,
                                                     lambda v: engine.context(v).info) \
            if torch_eval.available() else None
        self.z3 = ConeSolver(program, engine, self.boxes, query_rlimit=z3_rlimit) \
            if z3_witness else None

    # inputs -------------------------------------------------------------------------
    def _shape(self, p: Value) -> tuple[int, ...]:
        return tuple(int(d) for d in p.shape)

    def _draw(self, kind: str) -> dict[str, np.ndarray]:
        out = {}
        for p in self.params:
            lo, hi = (np.broadcast_to(b, self._shape(p)) for b in self.boxes[p.name])
            if not p.dtype.is_float:
                out[p.name] = self.rng.integers(np.ceil(lo).astype(np.int64), np.floor(hi).astype(np.int64) + 1)
                continue
            if kind == "center":
                x = (lo + hi) / 2
            elif kind == "corner":
                x = np.where(self.rng.random(lo.shape) < 0.5, lo, hi)
            else:
                x = lo + (hi - lo) * self.rng.random(lo.shape)
            out[p.name] = x
        return out

    def _typed(self, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs in the parameters' own types, inside the box."""
        out = {}
        for p in self.params:
            lo, hi = self.boxes[p.name]
            a = np.clip(np.asarray(x[p.name], dtype=np.float64), lo, hi)
            if p.dtype.is_float:
                t = a.astype(p.dtype.np)
                back = t.astype(np.float64)
                t = np.where((back < lo) | (back > hi), (lo + hi) / 2, back).astype(p.dtype.np)
            else:
                t = np.round(a).astype(p.dtype.np)
            out[p.name] = np.ascontiguousarray(t.reshape(self._shape(p)))
        return out

    # the objective --------------------------------------------------------------------
    def _scores(self, x: Mapping[str, Any], targets: Sequence[Target],
                combine: str = "max") -> tuple[Any, dict[tuple[Value, int], float]]:
        """The objective: the largest target score (``max``), or the sum of the scores each capped at
        :data:`PAST` (``sum``: every target is pushed until it is past its limit)."""
        import torch

        assert self.torch_program is not None
        want: dict[Value, list[int]] = {}
        for t in targets:
            want.setdefault(t.value, []).append(t.node)
        got = self.torch_program.run(x, want)
        scores = []
        extremes: dict[tuple[Value, int], float] = {}
        for t in targets:
            vals = got.get(t.value, {}).get(t.node, [])
            if not vals:
                continue
            top = torch.stack([(t.side * v).max() for v in vals]).max()
            top = torch.nan_to_num(top, nan=-1e300, posinf=1e300, neginf=-1e300)
            extremes[t.key] = float(t.side * top.detach())
            scores.append((top - t.side * t.limit) / max(abs(t.limit), 1.0))
        if not scores:
            return None, extremes
        if combine == "sum":
            return torch.clamp(torch.stack(scores), max=PAST).sum(), extremes
        return torch.stack(scores).max(), extremes

    def search(self, targets: Sequence[Target], budget: Budget, *, restarts: int = 3, steps: int = 40,
               samples: int = 8, scale: float = 1.0) -> SearchResult:
        """Random and corner samples, sign-gradient ascent, then z3 on the small cones of the targets
        still open; every promising input is confirmed. Each evaluation is charged to ``budget``."""
        best: dict[tuple[Value, int], float] = {}
        witnesses: list[Witness] = []
        confirmed: set[tuple[Value, int]] = set()
        points: list[dict[str, np.ndarray]] = []
        best_at: dict[tuple[Value, int], dict[str, np.ndarray]] = {}  # the input where each target got closest
        evals = 0
        outcomes: dict[tuple[Value, int], Outcome] = {}

        def try_input(x: Mapping[str, np.ndarray], method: str) -> None:
            nonlocal evals
            open_targets = [t for t in targets if t.key not in confirmed]
            budget.charge(CONFIRM_FACTOR * self.work + self.confirmer.watch_units(open_targets))
            inputs = self._typed(x)
            points.append(inputs)
            obs = self.confirmer.observe(inputs, open_targets)
            evals += 1
            for key, o in obs.items():
                if math.isfinite(o.extreme) or o.confirmed:
                    side = next(t.side for t in targets if t.key == key)
                    prev = best.get(key)
                    if prev is None or side * o.extreme > side * prev:
                        best[key] = o.extreme
                        best_at[key] = inputs
            new = [k for k, o in obs.items() if o.confirmed and k not in confirmed]
            if new:
                confirmed.update(new)
                witnesses.append(Witness(inputs, scale, {k: o for k, o in obs.items() if o.confirmed},
                                         method=method))

        def done() -> SearchResult:
            if self.z3 is not None:
                self._z3_stage(targets, budget, confirmed, outcomes, try_input)
            return SearchResult(witnesses, best, evals, points, outcomes)

        kinds = ["center"] + ["corner", "random"] * max(1, samples // 2)
        for kind in kinds[:max(1, samples)]:
            if budget.exhausted or len(confirmed) == len(targets):
                break
            try_input(self._draw(kind), kind)
        if self.torch_program is None:
            return done()
        for r in range(restarts):
            if budget.exhausted or len(confirmed) == len(targets):
                break
            if r and self._hopeless(targets, best, confirmed):
                break
            open_targets = [t for t in targets if t.key not in confirmed]
            near = self._near(open_targets, best)
            if near:  # push every target already close to its limit at once, from the closest one's best input
                start = best_at.get(near[0].key) or self._draw("center")
                x = self._ascend(start, near, steps, budget, best, first_step=FOCUSED_STEP, combine="sum")
            else:
                start = self._draw(("center", "random", "corner")[r % 3])
                x = self._ascend(start, open_targets, steps, budget, best)
            if x is not None:
                try_input(x, "gradient")
                if not budget.exhausted and len(confirmed) < len(targets):
                    try_input(self._cornered(x), "gradient")
        return done()

    @staticmethod
    def _near(targets: Sequence[Target], best: Mapping[tuple[Value, int], float]) -> list[Target]:
        """Open targets an ascent brought within ``NEAR`` of their limits, closest first: the largest-score
        objective follows one site at a time, so these are pushed together by the sum of their scores."""
        near = [t for t in targets if t.key in best and math.isfinite(best[t.key]) and t.score(best[t.key]) > -NEAR]
        return sorted(near, key=lambda t: (-t.score(best[t.key]), t.node))

    def _cornered(self, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``x`` pushed to the box's faces, each float element to the end it leans towards: a ReLU or
        quantized network's extremes lie at corners, where a shrinking ascent step rarely arrives."""
        out = {}
        for p in self.params:
            a = np.asarray(x[p.name], dtype=np.float64)
            if not p.dtype.is_float:
                out[p.name] = a
                continue
            lo, hi = (np.broadcast_to(b, self._shape(p)) for b in self.boxes[p.name])
            mid = (lo + hi) / 2
            out[p.name] = np.where(a > mid, hi, np.where(a < mid, lo, a))
        return out

    def _z3_stage(self, targets: Sequence[Target], budget: Budget, confirmed: set[tuple[Value, int]],
                  outcomes: dict[tuple[Value, int], Outcome],
                  try_input: Callable[[Mapping[str, np.ndarray], str], None]) -> None:
        """z3 on each root target still open whose cone is small (see :mod:`.z3_witness`); its
        candidates go through the same confirmation as the others."""
        assert self.z3 is not None
        for t in targets:
            if budget.exhausted:
                break
            if t.key in confirmed or t.key in outcomes:
                continue
            out = outcomes[t.key] = Outcome("skipped")
            if t.node != 0 or t.index is None:
                out.detail = "inner rule node" if t.node != 0 else "no worst index"
                continue
            for x in self.z3.candidates(t.value, t.index, t.side, t.limit, budget, out):
                try_input(x, "z3")
                if t.key in confirmed:
                    break
            if out.status == "sat":
                out.detail = "confirmed" if t.key in confirmed else "no candidate confirmed"

    @staticmethod
    def _hopeless(targets: Sequence[Target], best: Mapping[tuple[Value, int], float],
                  confirmed: set[tuple[Value, int]]) -> bool:
        """After a full ascent, no open target got within a factor 10 of its limit: more restarts rarely
        close such a gap, and the time is better spent on the boundary."""
        scores = [t.score(best[t.key]) for t in targets if t.key not in confirmed and t.key in best
                  and math.isfinite(best[t.key])]
        return bool(scores) and max(scores) < -0.9

    def _ascend(self, start: Mapping[str, np.ndarray], targets: Sequence[Target], steps: int, budget: Budget,
                best: dict[tuple[Value, int], float], *, first_step: float = 0.5,
                combine: str = "max") -> dict[str, np.ndarray] | None:
        """Projected sign-gradient ascent of the targets' joint score; steps shrink linearly from
        ``first_step`` of the box's half-width. Returns the best input seen."""
        import torch

        xs = {}
        leaves = []
        for p in self.params:
            a = torch.from_numpy(np.ascontiguousarray(np.asarray(start[p.name], dtype=np.float64)))
            if p.dtype.is_float:
                a = a.clone().requires_grad_(True)
                leaves.append(p)
            xs[p.name] = a
        if not leaves:
            return None
        top_x: dict[str, np.ndarray] | None = None
        top = -math.inf
        for step in range(steps):
            if budget.exhausted:
                break
            budget.charge(GRADIENT_FACTOR * self.work)
            for p in leaves:
                xs[p.name].grad = None
            try:
                j, extremes = self._scores(xs, targets, combine)
            except (RuntimeError, NotImplementedError, MemoryError):
                return top_x
            if j is None:
                return top_x
            for key, val in extremes.items():
                side = next(t.side for t in targets if t.key == key)
                if key not in best or side * val > side * best[key]:
                    best[key] = val
            jv = float(j.detach()) / (len(targets) if combine == "sum" else 1)
            if step >= 8 and max(jv, top) < -0.95:
                break  # every target is below 5% of its limit after 8 steps: give the time to the rest
            if jv > top:
                top = jv
                top_x = {k: v.detach().numpy().copy() for k, v in xs.items()}
            if jv >= PAST:
                break
            j.backward()
            frac = first_step * (1 - step / steps) + 0.02
            with torch.no_grad():
                for p in leaves:
                    g = xs[p.name].grad
                    if g is None:
                        continue
                    lo, hi = (torch.from_numpy(np.broadcast_to(b, self._shape(p)).copy()) for b in self.boxes[p.name])
                    half = (hi - lo) / 2
                    xs[p.name] += frac * half * torch.sign(g)
                    xs[p.name].copy_(torch.maximum(torch.minimum(xs[p.name], hi), lo))
        return top_x
