"""Centered window norms (:mod:`verify.probe.centered`).

Every deviation rule bounds how far each value of a residual CNN and an exporter-style CNN (float32 and
their FP16 program) moves from its value at the box's center, on random, corner and gradient-pushed inputs,
for boxes around zero and around another point, with intervals only at the input so that no rule hides
behind an interval; each linear rule's factor is reached within 2%; and on a narrow box around a point a
deep biased CNN's last convolution is bounded by its value there plus the program's rounding, a hundredth
of what the magnitude chain alone gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cnn_cases import TIGHT, classifier, cnn, mobile, one_op
from sampling import pushed_points

from cuvil.interp import evaluate_values
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from verify.probe import windows as W
from verify.probe.bounds import BoundsEngine
from verify.probe.centered import CenteredWindows
from verify.probe.interval import Interval
from verify.probe.program import reduced_program

pytest.importorskip("torch")


def _inputs(engine: BoundsEngine, module: Module, lo: Any, hi: Any) -> dict:
    shape = tuple(int(d) for d in module.main.params[0].shape)
    box = {"x": (np.broadcast_to(lo, shape).copy(), np.broadcast_to(hi, shape).copy())}
    return {p: engine.run(box).values[p] for p in module.main.params}


def _centered(engine: BoundsEngine, inputs: dict[Any, Interval]) -> CenteredWindows:
    return CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs))


def _distance(a: np.ndarray, c: np.ndarray, win: tuple[int, ...]) -> float:
    d = np.asarray(a, dtype=np.float64) - c
    return W.max_window(np.sum(d * d, axis=1), win)


@pytest.mark.parametrize("center", [0.0, 0.75])
@pytest.mark.parametrize("build", [cnn, mobile, classifier])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_deviation_rule_bounds_the_distance_it_describes(build: Any, precision: str, center: float) -> None:
    r = 2.0
    module = build(0)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    inputs = _inputs(engine, checked, center - r, center + r)
    windows = _centered(engine, inputs)
    plain = BoundsEngine(module.main, module.constants)
    plain_bounds = plain.run({"x": (inputs[checked.main.params[0]].lo, inputs[checked.main.params[0]].hi)})
    points = [p for op in ("conv", "matmul")
              for p in pushed_points(module, plain, plain_bounds, r, 1, op, center=center, randoms=2)]
    runs = [evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(checked.main.params[0].dtype.np)})
            for x in points]
    ruled = elements = 0
    for v in (v for v in checked.main.ops() if v in engine.live):
        c = windows.centers.get(v)
        found = windows.element_bound(v, inputs)
        if found is not None and c is not None:
            seen = np.max([np.abs(np.asarray(run[v], dtype=np.float64)) for run in runs], axis=0)
            assert np.all(seen <= found[1]), v.op
            elements += 1
        span = windows.element_span(v, inputs)
        if span is not None:
            for run in runs:
                y = np.asarray(run[v], dtype=np.float64)
                assert np.all((span[1].lo <= y) & (y <= span[1].hi)), v.op
        if len(v.shape) != 4 or c is None:
            continue
        for win in ((1, 1), (3, 3), (5, 5), tuple(int(d) for d in v.shape[2:])):
            bound = windows.deviation(v, win, inputs)
            if bound is None:
                continue
            ruled += 1
            seen = max(_distance(run[v], c, win) for run in runs)
            assert seen <= bound, (v.op, win, seen, bound)
    assert ruled >= 20 and elements >= 10


@pytest.mark.parametrize("op", sorted(TIGHT))
def test_each_deviation_rule_meets_its_worst_case(op: str) -> None:
    """Around a positive center (so max, clip and the pools keep their input's sign), an input that fills
    one channel with ones more than the center reaches each linear rule's factor: the bound covers the
    distance and is within 2% of it."""
    module = one_op(TIGHT[op])
    rng = np.random.default_rng(0)
    x0 = (3 + rng.uniform(0, 1, (1, 4, 6, 6))).astype(np.float32)
    step = np.zeros_like(x0)
    step[0, 1] = 1.0
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, x0 - step, x0 + step)
    windows = _centered(engine, inputs)
    v = module.main.results[0]
    got = np.asarray(evaluate_values(module.main, module.constants, {"x": x0 + step})[v], dtype=np.float64)
    c = windows.centers.get(v)
    assert c is not None
    if op == "reduce_mean":
        found = windows.element_bound(v, inputs)
        assert found is not None
        bound, seen = float(np.max(found[1] - np.abs(c))), float(np.max(np.abs(got - c)))
    else:
        whole = tuple(int(d) for d in v.shape[2:])
        bound, seen = windows.deviation(v, whole, inputs), _distance(got, c, whole)
        assert bound is not None
    assert seen <= bound <= 1.02 * seen


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_shifts_stay_at_the_center(precision: str) -> None:
    """On a box 2e-6 wide around a point, what is left of the last convolution's bound beyond its value
    there is the program's worst-case rounding carried through the operator norms: under 1/100 of the
    magnitude chain's bound, which carries every bias through every later operator norm."""
    module = cnn(3, blocks=6, size=16)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    x0 = np.random.default_rng(3).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    engine = BoundsEngine(checked.main, checked.constants)
    inputs = _inputs(engine, checked, x0 - 1e-6, x0 + 1e-6)
    last = [v for v in checked.main.ops() if v.op == "conv"][-2]
    there = evaluate_values(checked.main, checked.constants, {"x": x0.astype(checked.main.params[0].dtype.np)})
    centered = _centered(engine, inputs).element_bound(last, inputs)
    plain = W.WindowNorms(engine.constant_value, engine.live, {}).element_bound(last, inputs)
    assert centered is not None and plain is not None
    assert np.all(np.abs(np.asarray(there[last], dtype=np.float64)) <= centered[1])
    assert float(np.max(centered[1])) * 100 < float(np.max(plain[1]))


def test_a_max_pool_moves_by_each_input_once_per_window_it_lies_in() -> None:
    """A 3x3 max pool of stride 2 repeats the input at (1, 1) in four outputs: raising it alone above a flat
    center moves the output's norm by twice its own move, which is what the rule allows."""
    module = one_op(lambda b, x: b.max_pool(x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)))
    x0 = np.full((1, 4, 6, 6), 3.0, np.float32)
    step = np.zeros_like(x0)
    step[0, 1, 1, 1] = 1.0
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, x0 - step, x0 + step)
    windows = _centered(engine, inputs)
    v = module.main.results[0]
    got = evaluate_values(module.main, module.constants, {"x": x0 + step})[v]
    c = windows.centers.get(v)
    whole = tuple(int(d) for d in v.shape[2:])
    bound = windows.deviation(v, whole, inputs)
    assert c is not None and bound is not None
    seen = _distance(got, c, whole)
    assert seen == pytest.approx(2.0) and seen <= bound <= 1.02 * seen


def test_a_classifier_reads_its_input_rows_norm() -> None:
    """A classifier's product by a constant, after a global mean, is bounded by its columns' norms times the
    means' deviation (Cauchy–Schwarz): several times narrower than the interval product of the same means."""
    module = classifier(2, classes=5, width=64, gain=0.5)
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, -0.01, 0.01)
    v = next(v for v in module.main.ops() if v.op == "matmul")
    span = _centered(engine, inputs).element_span(v, inputs)
    assert span is not None
    bounds = engine.run({"x": (inputs[module.main.params[0]].lo, inputs[module.main.params[0]].hi)})
    mean = next(v for v in module.main.ops() if v.op == "reshape")
    w = np.asarray(engine.constant_value(v.operands[1]), dtype=np.float64)
    interval_radius = (bounds.values[mean].hi - bounds.values[mean].lo) / 2 @ np.abs(w).T
    assert float(np.max(span[0].hi - span[0].lo)) / 2 * 3 < float(np.max(interval_radius))


def test_a_classifiers_bound_meets_its_worst_case() -> None:
    """With weights of equal magnitude, the input that moves every channel by its weight's sign reaches
    Cauchy–Schwarz: the product's deviation bound covers what that input gives and is within 2% of it."""
    w = np.array([[1.0, -1.0, -1.0, 1.0], [0.5, 0.5, -0.5, 0.5]], np.float32)
    module = one_op(lambda b, x: b.matmul(b.reshape(b.reduce_mean(x, axes=(2, 3), keepdims=True), shape=(1, 4)),
                                          b.const(w), transpose_b=True))
    x0 = np.random.default_rng(1).uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32)
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, x0 - 1, x0 + 1)
    windows = _centered(engine, inputs)
    v = module.main.results[0]
    span, c = windows.element_span(v, inputs), windows.centers.get(v)
    assert span is not None and c is not None
    x = x0 + np.sign(w[0]).reshape(1, 4, 1, 1).astype(np.float32)
    seen = abs(float(np.asarray(evaluate_values(module.main, module.constants, {"x": x})[v])[0, 0]) - float(c[0, 0]))
    bound = float(span[0].hi[0, 0] - c[0, 0])
    assert seen == pytest.approx(4.0) and seen <= bound <= 1.02 * seen


def _pooled_conv(w: np.ndarray, size: int, between: str = "relu") -> Module:
    """conv (stride 1, same padding), an element-wise chain, and a 3x3 max pool of stride 2. ``between``:
    ``relu``; ``bias-relu6`` (a bias, then a clip to [0, 6]); ``sum`` (a second convolution of the same input
    added, then a ReLU)."""
    b = Builder()
    x = b.param("x", DType.f32, [1, int(w.shape[1]), size, size])
    k = int(w.shape[2])
    y = b.conv(x, b.const(w.astype(np.float32)), pads=(k // 2,) * 4)
    if between == "bias-relu6":
        bias = np.linspace(-0.5, 0.5, int(w.shape[0]), dtype=np.float32).reshape(1, -1, 1, 1)
        y = b.clip(b.add(y, b.const(bias)), min=0.0, max=6.0)
    elif between == "sum":
        y = b.relu(b.add(y, b.conv(x, b.const(np.flip(w, axis=(2, 3)).astype(np.float32)), pads=(k // 2,) * 4)))
    else:
        y = b.relu(y)
    return b.module(b.function("main", [x], [b.max_pool(y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))]))


def test_a_max_pool_after_a_convolution_counts_each_input_per_window() -> None:
    """Behind a convolution by the identity the thinned norms are all 1, so the pool's bound stays twice the
    input's move, which raising the one input that four windows share reaches: a rule that left out a level
    (the inputs in two windows along both axes) would give √3 and fail here."""
    c, n = 2, 8
    w = np.zeros((c, c, 3, 3))
    w[:, :, 1, 1] = np.eye(c)
    module = _pooled_conv(w, n)
    x0 = np.full((1, c, n, n), 3.0, np.float32)
    step = np.zeros_like(x0)
    step[0, 1, 3, 3] = 1.0  # odd row and column: in two windows along each axis (pads of 1)
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, x0 - step, x0 + step)
    windows = _centered(engine, inputs)
    v = module.main.results[0]
    whole = tuple(int(d) for d in v.shape[2:])
    bound = windows.deviation(v, whole, inputs)
    c_out = windows.centers.get(v)
    assert bound is not None and c_out is not None
    seen = _distance(evaluate_values(module.main, module.constants, {"x": x0 + step})[v], c_out, whole)
    assert seen == pytest.approx(2.0) and seen <= bound <= 1.02 * seen


@pytest.mark.parametrize("between", ["relu", "bias-relu6", "sum"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp16-wide-conv"])
def test_a_max_pool_after_a_random_convolution_is_tighter_than_its_overlap(between: str, precision: str) -> None:
    """A random 5x5 convolution's outputs thinned along one or both axes have smaller norms than all of them,
    and a restriction passes through element-wise ops (a bias, ReLU, ReLU6, a sum, the cast an FP16 program
    puts after a convolution it keeps in float32), so the pool's bound is below ``√(overlap)`` times the
    input's, and still covers inputs pushed to grow it."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 3, 5, 5)) / 8
    module = _pooled_conv(w, 16, between)
    wide = {v for v in module.main.ops() if v.op == "conv"} if precision == "fp16-wide-conv" else set()
    checked = module if precision == "fp32" else reduced_program(module, "fp16", keep_values=wide).module
    engine = BoundsEngine(checked.main, checked.constants)
    inputs = _inputs(engine, checked, -1.0, 1.0)
    windows = _centered(engine, inputs)
    v = checked.main.results[0]
    while v.op != "max_pool":  # (the FP16 program casts its result back)
        v = v.operands[0]
    whole = tuple(int(d) for d in v.shape[2:])
    geometry = windows._pool_geometry(v, whole)
    assert geometry is not None
    inner = windows.deviation(v.operands[0], geometry[0], inputs)
    bound = windows.deviation(v, whole, inputs)
    assert inner is not None and bound is not None and bound < 0.95 * 2 * inner
    plain = BoundsEngine(module.main, module.constants)
    box = {"x": (np.full((1, 3, 16, 16), -1.0), np.full((1, 3, 16, 16), 1.0))}
    points = pushed_points(module, plain, plain.run(box), 1.0, 1, "conv", center=0.0, randoms=4)
    c_out = windows.centers.get(v)
    assert c_out is not None
    for x in points:
        run = evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(np.float32)})
        assert _distance(run[v], c_out, whole) <= bound


def _stem(seed: int, precision: str) -> Module:
    """ResNet's stem in small: a 7x7 convolution of stride 2, a bias, ReLU, and a 3x3 max pool of stride 2."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 3, 32, 32])
    w = (rng.uniform(-1, 1, (16, 3, 7, 7)) / np.sqrt(147)).astype(np.float32)
    bias = rng.uniform(-0.1, 0.1, (1, 16, 1, 1)).astype(np.float32)
    y = b.relu(b.add(b.conv(x, b.const(w), strides=(2, 2), pads=(3, 3, 3, 3)), b.const(bias)))
    module = b.module(b.function("main", [x], [b.max_pool(y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))]))
    return module if precision == "fp32" else reduced_program(module, "fp16").module


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_max_pool_after_a_strided_stem_weighs_each_input_by_its_windows(seed: int, precision: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The stem's outputs weighted by how many pool windows each lies in have one norm, below the root of the
    level sets' sum (ResNet-18's stem: 1.56x its norm against 1.65x), and the pool's bound still covers inputs
    pushed to grow it."""
    module = _stem(seed, precision)
    engine = BoundsEngine(module.main, module.constants)
    inputs = _inputs(engine, module, -1.0, 1.0)
    v = module.main.results[0]
    while v.op != "max_pool":  # (the FP16 program casts its result back)
        v = v.operands[0]
    whole = tuple(int(d) for d in v.shape[2:])
    bound = _centered(engine, inputs).deviation(v, whole, inputs)
    real = CenteredWindows._restricted_sigma
    monkeypatch.setattr(CenteredWindows, "_restricted_sigma",
                        lambda self, u, how: None if isinstance(how, W.Weighted) else real(self, u, how))
    levels = _centered(engine, inputs).deviation(v, whole, inputs)
    monkeypatch.undo()
    assert bound is not None and levels is not None and bound < 0.97 * levels
    float32 = _stem(seed, "fp32")
    points = pushed_points(float32, BoundsEngine(float32.main, float32.constants),
                           BoundsEngine(float32.main, float32.constants).run(
                               {"x": (np.full((1, 3, 32, 32), -1.0), np.full((1, 3, 32, 32), 1.0))}),
                           1.0, seed, "conv", randoms=4)
    c_out = _centered(engine, inputs).centers.get(v)
    assert c_out is not None
    for x in points:
        run = evaluate_values(module.main, module.constants, {"x": x["x"].astype(np.float32)})
        assert _distance(run[v], c_out, whole) <= bound
