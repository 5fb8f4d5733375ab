"""A sampled, adversarial check that no site a probe proved safe ever fails.

The model is rebuilt with a batch of N rows (same weights); rows are uniform points, box
corners and the inputs a gradient search reached when told to push each proved site as far as
it can. For every proved site and row whose operands are finite, every watched node of the
site's rule is evaluated (in the program's types; integers exactly) and must stay in range."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from cuvil.interp import evaluate_values
from cuvil.ir.module import Module
from verify.probe import torch_eval
from verify.probe.bounds import Bounds, BoundsEngine
from verify.probe.budget import Budget
from verify.probe.concrete import WatchingWalker
from verify.probe.probe import SAFE, ProbeReport
from verify.probe.program import SiteSpec, SiteWatch, reduced_program
from verify.probe.witness import Searcher, Target


class _Capture(WatchingWalker):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.arrays: dict[int, list[np.ndarray]] = {}

    def observe(self, e, value) -> None:  # type: ignore[no-untyped-def]
        k = self.info.index.get(id(e))
        if k is not None and k in self.watch:
            self.arrays.setdefault(k, []).append(np.asarray(value))


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    """Per-row flag from an array whose axis 0 is the batch (or 1: every row)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return np.full(n, bool(a))
    flat = np.asarray(a.reshape(a.shape[0], -1).any(axis=1))
    return np.broadcast_to(flat, (n,)) if flat.shape[0] == 1 else flat


def adversarial_points(rep: ProbeReport, boxes: dict, units: float = 200.0) -> list[dict[str, np.ndarray]]:
    """Inputs a gradient search reached pushing each proved site towards its limits."""
    program = rep.program
    engine = BoundsEngine(program.function, program.module.constants, SiteWatch(program))
    bounds = engine.run(boxes)
    targets = []
    for ob in bounds.ops.values():
        for rec in ob.records.values():
            if rec.safe:
                v = next(v for v, o in bounds.ops.items() if o is ob)
                targets += [Target(v, rec.node, rec.spec, 1), Target(v, rec.node, rec.spec, -1)]
    points: list[dict[str, np.ndarray]] = []
    budget = Budget(units, guard=time.monotonic() + 600)
    for k, t in enumerate(targets):
        if budget.exhausted:
            break
        searcher = Searcher(program, engine, boxes, seed=k)
        res = searcher.search([t], budget.share(0.25, "sampling"), restarts=2, steps=25, samples=2)
        points += res.points
    return points


def sampled_violations(incident, rep: ProbeReport, n: int = 10_000, seed: int = 0) -> list[str]:  # type: ignore[no-untyped-def]
    """Proved sites that failed on some of ``n`` sampled/adversarial inputs (empty when sound)."""
    rng = np.random.default_rng(seed)
    lo, hi = (np.asarray(b, dtype=np.float64) for b in incident.ranges["x"])
    small = rep.program
    big = reduced_program(incident.build(n), incident.precision)
    vals1, valsN = small.function.values(), big.function.values()
    assert [v.op for v in vals1] == [v.op for v in valsN], "the batched program has another structure"
    mapping = dict(zip(vals1, valsN, strict=True))
    shape = tuple(int(d) for d in big.function.params[0].shape)
    row = shape[1:]
    boxes = {"x": (np.broadcast_to(lo, (1, *row)).copy(), np.broadcast_to(hi, (1, *row)).copy())}
    adversarial = adversarial_points(rep, boxes)
    k_uniform, k_corner = int(0.3 * n), int(0.3 * n)
    x = np.empty(shape, dtype=np.float64)
    x[:k_uniform] = lo + (hi - lo) * rng.random((k_uniform, *row))
    x[k_uniform:k_uniform + k_corner] = np.where(rng.random((k_corner, *row)) < 0.5, lo, hi)
    rest = n - k_uniform - k_corner
    if adversarial:
        base = np.stack([p["x"].reshape(row) for p in adversarial])
        pick = base[rng.integers(0, len(base), rest)]
        jitter = (hi - lo) * 0.02 * rng.standard_normal((rest, *row)) * (rng.random((rest,) + (1,) * len(row)) < 0.7)
        x[k_uniform + k_corner:] = np.clip(pick + jitter, lo, hi)
    else:
        x[k_uniform + k_corner:] = lo + (hi - lo) * rng.random((rest, *row))
    inputs = {"x": x.astype(np.float32)}
    values = evaluate_values(big.function, big.module.constants, inputs)
    engine = BoundsEngine(big.function, big.module.constants, SiteWatch(big))
    bad: list[str] = []
    for site in rep.sites:
        if site.verdict != SAFE:
            continue
        v = mapping[site.value]
        ctx = engine.context(v)
        operands = [values[o] for o in v.operands]
        ok_rows = np.ones(n, dtype=bool)
        for o, a in zip(v.operands, operands, strict=True):
            if o.dtype.is_float and a.ndim and a.shape[0] == n:
                ok_rows &= ~_rows(~np.isfinite(a), n)
        float_watch = {k: s for k, s in ctx.watch.items() if s.rule != "int-overflow"}
        int_watch = {k: s for k, s in ctx.watch.items() if s.rule == "int-overflow"}
        arrays: dict[int, list[np.ndarray]] = {}
        if float_watch:
            w = _Capture(ctx.info, operands, float_watch)
            with np.errstate(all="ignore"):
                w.expr(ctx.info.rule)
            arrays.update(w.arrays)
        if int_watch and torch_eval.available():
            import torch

            tw = torch_eval.TorchWalker(ctx.info, [torch.from_numpy(np.asarray(a, dtype=np.float64))
                                                   for a in operands], capture=sorted(int_watch))
            with torch.no_grad():
                tw.expr(ctx.info.rule)
            for k, vals in tw.captured.items():
                arrays[k] = [t.numpy() for t in vals]
        if 0 in ctx.watch and 0 in float_watch:
            arrays.setdefault(0, []).append(values[v])
        for k, spec in ctx.watch.items():
            for a in arrays.get(k, []):
                a = np.asarray(a, dtype=np.float64)
                out = ~np.isfinite(a) | (a < spec.lo) | (a > spec.hi)
                if np.any(_rows(out, n) & ok_rows):
                    bad.append(f"{site.name} {site.op} node {k} ({spec.rule})")
    return bad


def values_outside(module: Module, bounds: Bounds, inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The values of ``module`` on ``inputs`` that leave their bound (where the program stays finite)."""
    values = evaluate_values(module.main, module.constants, inputs)
    bad = []
    for v, iv in bounds.values.items():
        if v.is_param or v.is_const or v not in values:
            continue
        y = np.asarray(values[v], dtype=np.float64)
        if not np.all(np.isfinite(y)):
            continue  # the bounds hold where the program stays finite
        lo, hi = np.broadcast_to(iv.lo, y.shape), np.broadcast_to(iv.hi, y.shape)
        if np.any((y < lo) | (y > hi)):
            bad.append(f"{v.op} {v.type}")
    return bad


def pushed_points(module: Module, engine: BoundsEngine, bounds: Bounds, r: float, seed: int, op: str, *,
                  randoms: int = 6, share: float = 0.2, steps: int = 25, center: float = 0.0
                  ) -> list[dict[str, np.ndarray]]:
    """Inputs for ``module``'s one input ``x`` in [center - r, center + r] (both exact in float32): uniform,
    corners, and gradient ascent pushing every ``op`` to both ends of its bound (``bounds`` from ``engine``, an
    engine over ``module`` itself)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in module.main.params[0].shape)
    box = {"x": (np.full(shape, center - r), np.full(shape, center + r))}
    points = [{"x": (center + rng.uniform(-r, r, shape)).astype(np.float32)} for _ in range(randoms)]
    points += [{"x": (center + np.sign(rng.standard_normal(shape)) * r).astype(np.float32)} for _ in range(randoms)]
    program = reduced_program(module, "fp16", keep_ops=tuple({v.op for v in module.main.ops()}))
    budget = Budget(400.0, guard=time.monotonic() + 120)
    for k, v in enumerate(v for v in module.main.ops() if v.op == op):
        iv = bounds.values[v]
        spec = SiteSpec("probe", float(np.min(iv.lo)), float(np.max(iv.hi)), v.dtype)
        for side in (1, -1):
            res = Searcher(program, engine, box, seed=k).search([Target(v, 0, spec, side)], budget.share(share, "push"),
                                                               restarts=2, steps=steps, samples=1)
            points += [{"x": np.asarray(p["x"], dtype=np.float32)} for p in res.points]
    return points
