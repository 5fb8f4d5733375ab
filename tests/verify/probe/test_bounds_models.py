"""Bounds of whole programs are sound: on the zoo models (small profile) and the linear refiner's
chains, random inputs, box corners and gradient-ascent inputs never leave a value's bound."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from bench.models import ZOO_SMALL
from cuvil.frontend.dispatch import import_model
from cuvil.interp import evaluate_values
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from verify.probe.bounds import BoundsEngine, NodeRecord
from verify.probe.budget import Budget
from verify.probe.linear import LinearRefiner
from verify.probe.program import SiteSpec, reduced_program
from verify.probe.witness import Searcher, Target


@functools.cache
def zoo_module(name: str) -> Module:
    return import_model(ZOO_SMALL[name].to_onnx())


def _boxes(module: Module, vocab: int = 128) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for p in module.main.params:
        shape = tuple(int(d) for d in p.shape)
        lo, hi = (-1.0, 1.0) if p.dtype.is_float else (0.0, float(vocab - 1))
        out[p.name] = (np.full(shape, lo), np.full(shape, hi))
    return out


def _draw(module: Module, boxes: dict, rng: np.random.Generator, corner: bool) -> dict[str, np.ndarray]:
    out = {}
    for p in module.main.params:
        lo, hi = boxes[p.name]
        if not p.dtype.is_float:
            out[p.name] = rng.integers(lo.astype(np.int64), hi.astype(np.int64) + 1).astype(p.dtype.np)
        elif corner:
            out[p.name] = np.where(rng.random(lo.shape) < 0.5, lo, hi).astype(p.dtype.np)
        else:
            out[p.name] = (lo + (hi - lo) * rng.random(lo.shape)).astype(p.dtype.np)
    return out


def _adversarial(module: Module, engine: BoundsEngine, bounds, boxes: dict, units: float) -> list:  # type: ignore[no-untyped-def]
    """Inputs found by gradient ascent on the values with the widest bounds (each pushed both ways)."""
    program = reduced_program(module, "fp16", keep_ops=tuple({v.op for v in module.main.ops()}))
    wide = sorted((v for v in bounds.ops if v.dtype.is_float),
                  key=lambda v: -float(np.max(bounds.values[v].hi - bounds.values[v].lo)))[:4]
    points = []
    budget = Budget(units, guard=time.monotonic() + 600)
    for k, v in enumerate(wide):
        iv = bounds.values[v]
        spec = SiteSpec("probe", float(np.min(iv.lo)), float(np.max(iv.hi)), v.dtype)
        for side in (1, -1):
            t = Target(v, 0, spec, side)
            searcher = Searcher(program, engine, boxes, seed=k)
            res = searcher.search([t], budget.share(0.25, "adversarial"), restarts=1, steps=15, samples=1)
            points += res.points
    return points


def _check(module: Module, engine: BoundsEngine, bounds, inputs: dict) -> None:  # type: ignore[no-untyped-def]
    values = evaluate_values(module.main, module.constants, inputs)
    for v, iv in bounds.values.items():
        if v.is_param or v.is_const:
            continue
        y = np.asarray(values[v], dtype=np.float64)
        lo, hi = np.broadcast_to(iv.lo, y.shape), np.broadcast_to(iv.hi, y.shape)
        bad = np.isnan(y) | (y < lo) | (y > hi)
        assert not bad.any(), f"{v.op} {v.type}: {y[bad][:3]} outside [{lo[bad][:3]}, {hi[bad][:3]}]"


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v1", "bert", "mlp_int8"])
def test_zoo_values_stay_inside_their_bounds(name: str) -> None:
    module = zoo_module(name)
    engine = BoundsEngine(module.main, module.constants)
    boxes = _boxes(module)
    bounds = engine.run(boxes)
    rng = np.random.default_rng(0)
    for k in range(12):
        _check(module, engine, bounds, _draw(module, boxes, rng, corner=k % 2 == 0))
    if any(p.dtype.is_float for p in module.main.params):
        for x in _adversarial(module, engine, bounds, boxes, units=500.0):
            _check(module, engine, bounds, x)


@pytest.mark.parametrize("name", ["mlp", "bert"])
def test_zoo_fp16_program_values_stay_inside_their_bounds(name: str) -> None:
    """The same for the all-FP16 program, on inputs where no site overflows (bounds assume that)."""
    module = zoo_module(name)
    program = reduced_program(module, "fp16")
    engine = BoundsEngine(program.function, program.module.constants)
    boxes = _boxes(module)
    bounds = engine.run(boxes)
    rng = np.random.default_rng(1)
    for k in range(8):
        inputs = _draw(module, boxes, rng, corner=k % 2 == 0)
        values = evaluate_values(program.function, program.module.constants, inputs)
        if not all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in values.values()):
            continue
        _check(program.module, engine, bounds, inputs)


def _relu_chain(seed: int) -> Module:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 12])
    h = x
    for width in (24, 24, 8):
        w = (rng.standard_normal((int(h.shape[1]), width)) * 0.6).astype(np.float32)
        h = b.relu(b.add(b.matmul(h, b.const(w)), b.const(rng.normal(0, 0.3, width).astype(np.float32))))
    out = b.sub(b.matmul(h, b.const(np.ones((8, 3), np.float32))), b.matmul(x, b.const(np.ones((12, 3), np.float32))))
    return b.module(b.function("main", [x], [out]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_refinement_is_tighter_and_sound(seed: int) -> None:
    module = _relu_chain(seed)
    engine = BoundsEngine(module.main, module.constants)
    boxes = {"x": (np.full((1, 12), -1.0), np.full((1, 12), 1.0))}
    plain = engine.run(boxes)
    refiner = LinearRefiner(module.main, engine)
    out = module.main.results[0]
    pins = refiner.refine(plain, [out])
    assert out in pins
    refined = engine.run(boxes, pinned=pins)
    width_plain = float(np.sum(plain.values[out].hi - plain.values[out].lo))
    width_refined = float(np.sum(refined.values[out].hi - refined.values[out].lo))
    assert width_refined < 0.9 * width_plain
    rng = np.random.default_rng(seed)
    xs = np.concatenate([rng.uniform(-1, 1, (300, 1, 12)), np.sign(rng.uniform(-1, 1, (300, 1, 12)))])
    for x in xs.astype(np.float32):
        _check(module, engine, refined, {"x": x})
    # adversarial: push each output element to both ends of its refined bound
    rec_spec = SiteSpec("probe", float(np.min(refined.values[out].lo)), float(np.max(refined.values[out].hi)),
                        DType.f32)
    program = reduced_program(module, "fp16", keep_ops=("matmul", "add", "relu", "sub", "cast"))
    for side in (1, -1):
        t = Target.of(out, NodeRecord(0, "result", rec_spec, -1e9 if side < 0 else 0, 1e9 if side > 0 else 0))
        res = Searcher(program, engine, boxes, seed=seed).search([t], Budget(10_000.0), restarts=2, steps=30,
                                                                 samples=2)
        for p in res.points:
            _check(module, engine, refined, p)
