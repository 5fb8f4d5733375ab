"""Window norms through convolutional networks (:mod:`verify.probe.windows`).

The operator-norm bound equals the circular convolution's norm on its torus (the frequency formula is
exact there) and is never below the norm of the zero-padded, strided, dilated or grouped convolution it
stands for; on residual CNNs in float32 and in their FP16 program every value stays inside its bound on
random, corner and gradient-pushed inputs; the windows tighten a deep CNN's last convolutions by orders
of magnitude over intervals; and a norm made too small is caught by the same sampling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cnn_cases import TIGHT, cnn, mobile, one_op
from sampling import pushed_points, values_outside

from cuvil.interp import evaluate_values
from cuvil.ir.module import Module
from verify.probe import bounds as B
from verify.probe import spectra as S
from verify.probe import windows as W
from verify.probe.bounds import BoundsEngine
from verify.probe.program import reduced_program

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _dense(w: np.ndarray, size: tuple[int, ...], *, stride: int = 1, pad: int = 0, dilation: int = 1,
           groups: int = 1, circular: bool = False) -> np.ndarray:
    """The matrix of a 2-d convolution on ``size`` images (torch as the oracle), columns = input basis."""
    c = w.shape[1] * groups
    n = c * size[0] * size[1]
    basis = torch.eye(n, dtype=torch.float64).reshape(n, c, *size)
    wt = torch.from_numpy(w)
    if circular:
        k1, k2 = w.shape[2:]
        basis = F.pad(basis, (0, (k2 - 1) * dilation, 0, (k1 - 1) * dilation), mode="circular")
        out = F.conv2d(basis, wt, stride=stride, dilation=dilation, groups=groups)
    else:
        out = F.conv2d(basis, wt, stride=stride, padding=pad, dilation=dilation, groups=groups)
    return out.reshape(n, -1).numpy().T


CASES = [  # (out, in/groups, k, groups, dilation); the last two: Gram matrices larger than SMALL_SIDE, certified
    (6, 4, 3, 1, 1), (4, 6, 3, 1, 1), (5, 3, 1, 1, 1), (6, 2, 3, 3, 1), (4, 1, 3, 4, 1), (3, 3, 2, 1, 2),
    (4, 2, 5, 1, 1), (20, 18, 3, 1, 1), (34, 17, 1, 2, 1),
]


def _tolerance(o: int, cg: int, groups: int, stride: int) -> float:
    """How far above the exact norm the bound may be: float64 rounding where the Gram matrices are solved, the
    certifying slack (on the squared norm) where they are larger than :data:`SMALL_SIDE`."""
    side = o // groups if stride > 1 else min(o // groups, cg)
    return 1e-7 if side <= S.SMALL_SIDE else S.TOP_SLACK


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_operator_norm_is_the_circular_convolutions_norm(case: int, stride: int) -> None:
    o, cg, k, groups, d = CASES[case]
    rng = np.random.default_rng(case)
    w = rng.standard_normal((o, cg, k, k))
    torus = (6 * stride, 3 * stride) if stride > 1 else (7, 6)
    exact = float(np.linalg.norm(_dense(w, torus, stride=stride, dilation=d, groups=groups, circular=True), 2))
    bound = W.conv_sigma(w, torus, (d, d), groups, (stride, stride))
    assert exact <= bound <= exact * (1 + _tolerance(o, cg, groups, stride))


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_bound_covers_the_zero_padded_convolution(case: int, stride: int) -> None:
    o, cg, k, groups, d = CASES[case]
    rng = np.random.default_rng(10 + case)
    w = rng.standard_normal((o, cg, k, k))
    size, pad = (8, 7), (k - 1) * d // 2 + (case % 2)
    matrix = _dense(w, size, stride=stride, pad=pad, dilation=d, groups=groups)
    out = [(n + 2 * pad - (k - 1) * d - 1) // stride + 1 for n in size]
    torus = tuple(-(-max(pad + n, (m - 1) * stride + (k - 1) * d + 1) // stride) * stride
                  for n, m in zip(size, out, strict=True))
    assert float(np.linalg.norm(matrix, 2)) <= W.conv_sigma(w, torus, (d, d), groups, (stride, stride))
    assert float(np.linalg.norm(np.abs(matrix), 2)) <= W.abs_sigma(w, groups)


def test_a_one_dimensional_convolution() -> None:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3, 3))
    x = torch.eye(3 * 9, dtype=torch.float64).reshape(27, 3, 9)
    matrix = F.conv1d(x, torch.from_numpy(w), padding=1).reshape(27, -1).numpy().T
    assert float(np.linalg.norm(matrix, 2)) <= W.conv_sigma(w, (11,), (1,), 1)


# --------------------------------------------------------------------------------------
# whole networks


def _boxes(r: float, size: int = 12, batch: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {"x": (np.full((batch, 3, size, size), -r), np.full((batch, 3, size, size), r))}


def _points(module: Module, r: float, seed: int) -> list[dict]:
    """Random and corner inputs, and gradient ascent pushing every convolution to both ends of its bound."""
    engine = BoundsEngine(module.main, module.constants)
    shape = module.main.params[0].shape
    box = _boxes(r, int(shape[2]), int(shape[0]))
    return pushed_points(module, engine, engine.run(box), r, seed, "conv", randoms=4, share=0.1, steps=20)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cnn_values_stay_inside_their_bounds(seed: int, precision: str) -> None:
    batch = 1 + 2 * seed  # windows are per sample
    module = cnn(seed, batch=batch)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    bounds = BoundsEngine(checked.main, checked.constants).run(_boxes(2.0, batch=batch))
    assert any(ob.method == "windows" for ob in bounds.ops.values())  # the windows are what is under test
    for x in _points(module, 2.0, seed):
        feed = {"x": x["x"].astype(checked.main.params[0].dtype.np)}
        assert not values_outside(checked, bounds, feed)


def test_windows_tighten_a_deep_cnn(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cnn(3, blocks=6, size=16)
    box = _boxes(1.0, 16)
    with_windows = BoundsEngine(module.main, module.constants).run(box)
    monkeypatch.setattr(B, "window_facts", lambda v, ob, values, windows: ob)
    plain = BoundsEngine(module.main, module.constants).run(box)
    last = [v for v in module.main.ops() if v.op == "conv"][-2]
    tight, loose = (float(np.max(b.values[last].magnitude())) for b in (with_windows, plain))
    assert tight * 100 < loose


def test_a_norm_made_too_small_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operator norms 30x too small make the deeper bounds unsound, and the same inputs show it."""
    real = W.conv_sigma
    monkeypatch.setattr(W, "norm_cache", {})  # neither read nor poison the norms other tests share
    monkeypatch.setattr(W, "conv_sigma", lambda *a: real(*a) / 30)
    module = cnn(0)
    bounds = BoundsEngine(module.main, module.constants).run(_boxes(2.0))
    found = set()
    for x in _points(module, 2.0, 0):
        found.update(values_outside(module, bounds, x))
    assert found


@pytest.mark.parametrize("build", [cnn, mobile])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_window_rule_bounds_the_norms_it_describes(build: Any, precision: str) -> None:
    """Each value's norm over 1x1, 3x3, 5x5 and whole-image windows on sampled and pushed inputs stays within
    what the rules alone give (intervals only at the input, so no rule hides behind an interval's bound)."""
    module = build(0)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    inputs = {p: engine.run(_boxes(2.0)).values[p] for p in checked.main.params}
    norms = W.WindowNorms(engine.constant_value, engine.live, {})
    points = _points(module, 2.0, 1)
    runs = [evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(checked.main.params[0].dtype.np)})
            for x in points]
    ruled = 0
    for v in (v for v in checked.main.ops() if v in engine.live):
        if v.op == "reduce_mean":
            found = norms.element_bound(v, inputs)
            assert found is not None
            assert max(float(np.max(np.abs(r[v]))) for r in runs) <= float(np.max(found[1]))
            ruled += 1
        if len(v.shape) != 4 or v.op == "reduce_mean":
            continue
        for win in ((1, 1), (3, 3), (5, 5), tuple(int(d) for d in v.shape[2:])):
            bound = norms.window(v, win, inputs)
            if bound is None:
                continue
            ruled += 1
            seen = max(W.max_window(np.sum(np.asarray(r[v], dtype=np.float64) ** 2, axis=1), win) for r in runs)
            assert seen <= bound, (v.op, win, seen, bound)
    assert ruled >= 20


@pytest.mark.parametrize("op", sorted(TIGHT))
def test_each_rule_meets_its_worst_case(op: str) -> None:
    """With the operand's norm known exactly (a point box), a rule's bound covers the result and is within
    2% of it on the input that reaches the rule's factor, so a factor made smaller fails here."""
    module = one_op(TIGHT[op])
    x = np.zeros((1, 4, 6, 6), np.float32)
    x[0, 1] = 1.0
    engine = BoundsEngine(module.main, module.constants)
    values = {p: engine.run({"x": (x, x)}).values[p] for p in module.main.params}
    v = module.main.results[0]
    got = np.asarray(evaluate_values(module.main, module.constants, {"x": x})[v], dtype=np.float64)
    norms = W.WindowNorms(engine.constant_value, engine.live, {})
    if op == "reduce_mean":
        found = norms.element_bound(v, values)
        assert found is not None
        bound, seen = float(np.max(found[1])), float(np.max(np.abs(got)))
    else:
        whole = tuple(int(d) for d in v.shape[2:])
        bound = norms.window(v, whole, values)
        assert bound is not None
        seen = W.max_window(np.sum(got ** 2, axis=1), whole)
    assert seen <= bound <= 1.02 * seen


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("s", [1, 2, 3])
def test_a_pools_levels_hold_every_input_as_often_as_its_windows(k: int, s: int) -> None:
    """For every leading pad and grid length, an input lies in at most as many windows as levels hold it,
    where a level thinned by ``s`` holds one residue class modulo ``s`` (whichever) and a level of 1 every
    place: counted window by window."""
    levels = W.pool_levels([k], [s], [1])
    assert levels is not None
    for pad in range(k):
        for n in range(max(1, k - pad), 3 * k + 2 * s + 1):
            outputs = (n + pad - k) // s + 1  # no ceil mode, every window starting inside the grid or its pad
            counts = np.zeros(n, dtype=int)
            for o in range(outputs):
                lo = o * s - pad
                counts[max(lo, 0):min(lo + k, n)] += 1
            for j in range(1, int(counts.max(initial=0)) + 1):
                assert j <= len(levels[0])
                if levels[0][j - 1] == s:  # the places in at least j windows share one residue
                    assert len({i % s for i in np.flatnonzero(counts >= j)}) <= 1, (k, s, pad, n, j)


def test_a_dilated_pool_has_no_levels() -> None:
    assert W.pool_levels([3, 3], [2, 2], [2, 1]) is None


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("d", [1, 2])
def test_a_pools_weights_count_the_windows_of_every_input(k: int, s: int, d: int) -> None:
    """For every leading pad and grid length, counted window by window: an input lies in at most as many
    windows as its residue's weight, and in exactly as many away from the edges."""
    span = (k - 1) * d + 1
    for pad in range(span):
        (weights,) = W.pool_weights([k], [s], [pad], [d])
        assert len(weights) == s
        for n in range(max(1, span - pad), 3 * span + 2 * s + 1):
            outputs = (n + pad - span) // s + 1
            counts = np.zeros(n, dtype=int)
            for o in range(outputs):
                for t in range(k):
                    i = o * s - pad + t * d
                    if 0 <= i < n:
                        counts[i] += 1
            for i in range(n):
                assert counts[i] <= weights[i % s], (k, s, d, pad, n, i)
            if n >= 3 * span + s:  # a middle place of each residue: every window about it exists
                for i in range(n // 2, n // 2 + s):
                    assert counts[i] == weights[i % s], (k, s, d, pad, n, i)


def _conv(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], dilations: tuple[int, int] = (1, 1)) -> np.ndarray:
    import torch

    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=strides,
                                      dilation=dilations).numpy()


@pytest.mark.parametrize(("shape", "strides", "dilations", "weights"), [
    ((4, 3, 7, 7), (2, 2), (1, 1), ((1, 2), (1, 2))),
    ((5, 2, 3, 3), (1, 1), (2, 2), ((1, 3), (2, 1, 1))),
    ((3, 2, 3, 2), (2, 1), (1, 1), ((3, 1, 2), (1, 2))),
])
def test_a_weighted_kernel_scales_each_residue_of_the_outputs(shape: tuple[int, ...], strides: tuple[int, int],
                                                             dilations: tuple[int, int],
                                                             weights: tuple[tuple[int, ...], ...]) -> None:
    """The convolution by :func:`weighted_kernel` computes, in the output block of each residue, the original
    convolution's outputs of that residue times the root of its weight (checked against PyTorch's)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal(shape)
    x = rng.standard_normal((1, shape[1], 29, 31))
    plain = _conv(x, w, strides, dilations)
    big = W.weighted_kernel(w, list(strides), list(dilations), weights)
    period = [len(p) for p in weights]
    got = _conv(x, big, tuple(s * n for s, n in zip(strides, period, strict=True)))
    o = shape[0]
    for b, (r0, r1) in enumerate(np.ndindex(*period)):
        want = plain[:, :, r0::period[0], r1::period[1]] * np.sqrt(weights[0][r0] * weights[1][r1])
        part = got[:, b * o:(b + 1) * o]
        rows, cols = min(part.shape[2], want.shape[2]), min(part.shape[3], want.shape[3])
        assert rows > 0 and cols > 0
        np.testing.assert_allclose(part[:, :, :rows, :cols], want[:, :, :rows, :cols], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("shape", "strides", "torus"), [
    ((8, 3, 7, 7), (2, 2), (24, 24)), ((16, 4, 3, 3), (2, 2), (12, 12)), ((6, 5, 9, 9), (4, 4), (24, 24)),
    ((5, 3, 4, 4), (3, 3), (18, 18)), ((4, 6, 5, 3), (2, 1), (10, 9)),
])
def test_a_strided_convolution_read_by_phases_is_the_same_operator(shape: tuple[int, ...], strides: tuple[int, int],
                                                                  torus: tuple[int, int]) -> None:
    """:func:`phase_stacked` is the strided convolution on the input's phases as channels: the same outputs
    (against PyTorch's strided convolution), so the same operator norm on the coarse torus."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal(shape)
    x = rng.standard_normal((1, shape[1], 6 * strides[0] + 8, 5 * strides[1] + 9))
    stacked = W.phase_stacked(w, strides)
    rows, cols = x.shape[2] // strides[0], x.shape[3] // strides[1]
    phases = np.concatenate([x[:, :, a::strides[0], b::strides[1]][:, :, :rows, :cols]
                             for a in range(strides[0]) for b in range(strides[1])], axis=1)
    want, got = _conv(x, w, strides), _conv(phases, stacked, (1, 1))
    h, v = min(want.shape[2], got.shape[2]), min(want.shape[3], got.shape[3])
    np.testing.assert_allclose(got[:, :, :h, :v], want[:, :, :h, :v], rtol=1e-12, atol=1e-12)
    a = W.conv_sigma(w, torus, (1, 1), 1, strides)
    b = W.conv_sigma(stacked, (torus[0] // strides[0], torus[1] // strides[1]), (1, 1), 1, (1, 1))
    assert b == pytest.approx(a, rel=1e-9)
