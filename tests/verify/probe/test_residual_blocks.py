"""A residual block's own deviation bound (:meth:`verify.probe.centered.CenteredWindows._residual_deviation`):
``‖I + ½C₂C₁‖ + ½σ₂σ₁`` in place of the chain's ``1 + σ₂σ₁``. The block norm is the operator's norm (a dense
matrix of the operator checks it), the rule is used on every block of a residual CNN, it is smaller than the
chain there, and it bounds the distance it describes on inputs pushed to grow it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cnn_cases import cnn, strided_conv, window_distance
from sampling import pushed_points

from cuvil.interp import evaluate_values
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from verify.probe import spectra as S
from verify.probe import windows as W
from verify.probe.bounds import BoundsEngine
from verify.probe.centered import CenteredWindows
from verify.probe.program import reduced_program

pytest.importorskip("torch")


def _circular(w: np.ndarray, x: np.ndarray, pad: int) -> np.ndarray:
    """``y[o, i, j] = Σ w[o, c, a, b] x[c, i + a - pad, j + b - pad]`` with indices wrapping around the torus."""
    y = np.zeros((w.shape[0], *x.shape[1:]))
    for a in range(w.shape[2]):
        for b in range(w.shape[3]):
            y += np.einsum("oc,cij->oij", w[:, :, a, b], np.roll(x, (pad - a, pad - b), axis=(1, 2)))
    return y


@pytest.mark.parametrize("c0,c1,k,torus,pad", [(3, 5, 3, 6, 1), (4, 2, 3, 7, 1), (2, 3, 1, 5, 0), (5, 4, 3, 5, 1),
                                               (3, 3, 3, 6, 0), (2, 4, 3, 6, 2), (18, 6, 3, 4, 1)])
def test_the_block_norm_is_the_operators_norm(c0: int, c1: int, k: int, torus: int, pad: int) -> None:
    """Where the taps sit relative to the identity matters (``I + ½K̂₂K̂₁`` turns with the pads' phase), so
    kernels centered by their pads and kernels that are not are both checked."""
    rng = np.random.default_rng(c0 * 100 + c1 * 10 + k + pad)
    w1, w2 = rng.standard_normal((c1, c0, k, k)), rng.standard_normal((c0, c1, k, k))
    exact = _slopes_norm(w1, w2, torus, pad, np.full((c1, torus, torus), 0.5))  # every slope ½
    bound = W.residual_sigma(w1, w2, (torus, torus), (pad, pad), (pad, pad))
    assert exact <= bound <= exact * (1 + (1e-6 if c0 <= S.SMALL_SIDE else S.TOP_SLACK))  # (squared: certified)
    if pad:  # the same kernels read as if unpadded: another operator, another norm
        assert abs(W.residual_sigma(w1, w2, (torus, torus)) - exact) > 1e-6 * exact


@pytest.mark.parametrize("c0,c1,c2,torus", [(2, 3, 2, 3), (3, 2, 4, 4), (2, 2, 3, 5), (4, 5, 18, 3)])
def test_the_halving_block_norm_is_the_operators_norm(c0: int, c1: int, c2: int, torus: int) -> None:
    rng = np.random.default_rng(c0 + 10 * c1 + 100 * c2)
    w1, w2 = rng.standard_normal((c1, c0, 3, 3)), rng.standard_normal((c2, c1, 3, 3))
    wd = rng.standard_normal((c2, c0, 1, 1))
    n = c0 * (2 * torus) ** 2
    dense = np.zeros((c2 * torus * torus, n))
    for j in range(n):
        x = np.zeros(n)
        x[j] = 1.0
        x = x.reshape(c0, 2 * torus, 2 * torus)
        dense[:, j] = (strided_conv(wd, x, 2, 0) + 0.5 * strided_conv(w2, strided_conv(w1, x, 2, 1), 1, 1)).reshape(-1)
    exact = float(np.linalg.norm(dense, 2))
    tolerance = 1e-6 if c2 <= S.SMALL_SIDE else S.TOP_SLACK  # (on the squared norm where certified)
    assert exact <= W.projection_sigma(w1, w2, wd, (torus, torus), (1, 1), (1, 1)) <= exact * (1 + tolerance)


def test_the_block_norm_refuses_kernels_that_do_not_map_back() -> None:
    with pytest.raises(ValueError):
        W.residual_sigma(np.ones((4, 3, 3, 3)), np.ones((4, 4, 3, 3)), (6, 6))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_block_is_bounded_on_its_own_and_the_bound_holds(precision: str) -> None:
    r, center = 2.0, 0.0
    module = cnn(0)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    shape = tuple(int(d) for d in checked.main.params[0].shape)
    box = {"x": (np.full(shape, center - r), np.full(shape, center + r))}
    inputs = {p: engine.run(box).values[p] for p in checked.main.params}
    windows = CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs))
    plain = BoundsEngine(module.main, module.constants)
    plain_bounds = plain.run(box)
    points = pushed_points(module, plain, plain_bounds, r, 1, "conv", center=center, randoms=2)
    runs = [evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(checked.main.params[0].dtype.np)})
            for x in points]
    blocks = [v for v in checked.main.ops() if windows._block(v) is not None]
    assert len(blocks) == 3  # cnn's three residual blocks, and nothing else
    for v in blocks:
        for win in ((1, 1), (3, 3), tuple(int(d) for d in v.shape[2:])):
            own = windows._residual_deviation(v, win, inputs)
            terms = windows._sum_terms(v, win, inputs)
            assert own is not None and terms is not None
            assert own < sum(terms)  # the block's own bound is the smaller one
            c = windows.centers.get(v)
            assert c is not None
            seen = max(window_distance(np.asarray(run[v]), c, win) for run in runs)
            assert seen <= own


def test_a_block_whose_relu_passes_everything_reaches_the_bound() -> None:
    """``v = x + a·relu(x)`` (1x1 convolutions by the identity and by ``a``): where every input is positive
    the ReLU's slopes are all 1 and ``v`` moves by ``(1 + a)·‖x‖``, which the block's bound reaches. So the
    ``½σ₂σ₁`` term is needed: without it the bound would be ``(1 + a/2)·‖x‖``."""
    a, c, n, r = 3.0, 4, 5, 0.5
    b = Builder()
    x = b.param("x", DType.f32, [1, c, n, n])
    eye = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    y = b.conv(b.relu(b.conv(x, b.const(eye))), b.const(a * eye))
    module = b.module(b.function("main", [x], [b.add(y, x)]))
    engine = BoundsEngine(module.main, module.constants)
    box = {"x": (np.full((1, c, n, n), -r), np.full((1, c, n, n), r))}
    inputs = {p: engine.run(box).values[p] for p in module.main.params}
    windows = CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs))
    v = module.main.results[0]
    assert windows._block(v) is not None
    bound = windows._residual_deviation(v, (n, n), inputs)
    moved = (1 + a) * r * np.sqrt(c * n * n)  # every input at +r: each output (1 + a) r from the center's 0
    assert bound is not None and moved <= bound <= moved * 1.01


def _halving(seed: int, same_upper: bool = False) -> Any:
    """Two blocks as ResNet's stages begin: a 3x3 stride-2 convolution and a 3x3 one on the main path, a 1x1
    stride-2 projection on the skip, each with a bias; then a block of stride 1. ``same_upper``: the 3x3
    convolutions padded after the grid only (TensorFlow's SAME on an even grid), as an exporter may write."""
    rng = np.random.default_rng(seed)
    b = Builder()
    size = 10 if same_upper else 9
    x = b.param("x", DType.f32, [1, 3, size, size])

    def conv(v: Any, cin: int, cout: int, k: int, stride: int) -> Any:
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        pads = (k // 2,) * 4
        if same_upper and k == 3:
            pads = (0, 0, 1, 1) if stride == 2 else (0, 0, 2, 2)
        y = b.conv(v, b.const(w), strides=(stride, stride), pads=pads)
        return b.add(y, b.const((rng.standard_normal((1, cout, 1, 1)) * 0.3).astype(np.float32)))

    h = b.relu(conv(x, 3, 6, 3, 1))
    h = b.relu(b.add(conv(b.relu(conv(h, 6, 8, 3, 2)), 8, 8, 3, 1), conv(h, 6, 8, 1, 2)))
    h = b.relu(b.add(conv(b.relu(conv(h, 8, 8, 3, 1)), 8, 8, 3, 1), h))
    return b.module(b.function("main", [x], [h]))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("same_upper", [False, True])
def test_a_halving_block_is_bounded_on_its_own_and_the_bound_holds(precision: str, same_upper: bool) -> None:
    r = 2.0
    module = _halving(3, same_upper)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    shape = tuple(int(d) for d in checked.main.params[0].shape)
    box = {"x": (np.full(shape, -r), np.full(shape, r))}
    inputs = {p: engine.run(box).values[p] for p in checked.main.params}
    windows = CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs))
    plain = BoundsEngine(module.main, module.constants)
    points = pushed_points(module, plain, plain.run(box), r, 1, "conv", center=0.0, randoms=3)
    runs = [evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(checked.main.params[0].dtype.np)})
            for x in points]
    blocks = [v for v in checked.main.ops() if windows._block(v) is not None]
    assert [windows._block(v)[5] is not None for v in blocks] == [True, False]  # type: ignore[index]
    for v in blocks:
        for win in ((1, 1), (3, 3), tuple(int(d) for d in v.shape[2:])):
            own = windows._residual_deviation(v, win, inputs)
            terms = windows._sum_terms(v, win, inputs)
            assert own is not None and terms is not None and own < sum(terms)
            c = windows.centers.get(v)
            assert c is not None
            assert max(window_distance(np.asarray(run[v]), c, win) for run in runs) <= own


def test_a_convolution_after_a_relu_that_passes_everything_reaches_its_element_bound() -> None:
    """``y = a·relu(x)`` (1x1 convolutions, one channel): for a positive input ``y`` moves by ``a·|x|``, which
    the bound through the ReLU (``½‖W₁ᵀw₂‖ + ½σ₁‖w₂‖ = a``) reaches; its ``½σ₁‖w₂‖`` term is needed."""
    a, n, r = 3.0, 4, 0.5
    b = Builder()
    x = b.param("x", DType.f32, [1, 1, n, n])
    one = np.ones((1, 1, 1, 1), np.float32)
    y = b.conv(b.relu(b.conv(x, b.const(one))), b.const(a * one))
    module = b.module(b.function("main", [x], [y]))
    engine = BoundsEngine(module.main, module.constants)
    box = {"x": (np.full((1, 1, n, n), -r), np.full((1, 1, n, n), r))}
    inputs = {p: engine.run(box).values[p] for p in module.main.params}
    windows = CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs))
    v = module.main.results[0]
    found = windows._through_relu(v, (1, 1), np.array([a]), inputs)
    assert found is not None and a * r <= float(found[0]) <= a * r * 1.01


def _slopes_norm(w1: np.ndarray, w2: np.ndarray, torus: int, pad: int, d: np.ndarray) -> float:
    """``‖I + C₂DC₁‖`` as a dense matrix, ``D`` the diagonal of slopes ``d`` ([C1, torus, torus])."""
    c0 = w1.shape[1]
    n = c0 * torus * torus
    dense = np.zeros((n, n))
    for j in range(n):
        x = np.zeros(n)
        x[j] = 1.0
        x = x.reshape(c0, torus, torus)
        dense[:, j] = (x + _circular(w2, d * _circular(w1, x, pad), pad)).reshape(-1)
    return float(np.linalg.norm(dense, 2))


def _worst_slopes(w1: np.ndarray, w2: np.ndarray, torus: int, pad: int, rng: np.random.Generator) -> float:
    """A slope pattern pushed towards the largest ``‖I + C₂DC₁‖``: the top singular pair for the current
    pattern, then each slope 1 where it adds ``u·C₂e_j e_jᵀC₁x``, 0 where it takes away (a few rounds)."""
    c1 = w1.shape[0]
    d = (rng.uniform(0, 1, (c1, torus, torus)) < 0.5).astype(np.float64)
    for _ in range(6):
        x = rng.standard_normal((w1.shape[1], torus, torus))
        for _ in range(60):  # power iteration on MᵀM, M = I + C₂DC₁ (the transpose: kernels flipped)
            y = x + _circular(w2, d * _circular(w1, x, pad), pad)
            x = y + _adjoint(w1, d * _adjoint(w2, y, pad), pad)
            x /= np.linalg.norm(x)
        u = x + _circular(w2, d * _circular(w1, x, pad), pad)
        d = (_adjoint(w2, u, pad) * _circular(w1, x, pad) > 0).astype(np.float64)
    return _slopes_norm(w1, w2, torus, pad, d)


def _adjoint(w: np.ndarray, y: np.ndarray, pad: int) -> np.ndarray:
    """The transpose of :func:`_circular`'s map."""
    x = np.zeros((w.shape[1], *y.shape[1:]))
    for a in range(w.shape[2]):
        for b in range(w.shape[3]):
            x += np.roll(np.einsum("oc,oij->cij", w[:, :, a, b], y), (a - pad, b - pad), axis=(1, 2))
    return x


@pytest.mark.parametrize("c0,c1,torus,seed", [(3, 4, 5, 0), (4, 3, 5, 1), (2, 5, 6, 2), (4, 4, 4, 3), (9, 12, 4, 4),
                                              (12, 6, 3, 5)])
def test_the_relu_block_bound_holds_for_every_slope_pattern(c0: int, c1: int, torus: int, seed: int) -> None:
    """``max_D ‖I + C₂DC₁‖`` over slopes in [0, 1]: the bound covers every pattern tried (all passing, none,
    random ones and fractions, and one pushed to the worst), and is below ``‖I + ½C₂C₁‖ + ½σ₂σ₁``, what the two
    norms give apart. From 9 channels its matrices (``2C0`` wide) are certified, not solved."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((c1, c0, 3, 3)) * np.sqrt(2 / (9 * c0))
    w2 = rng.standard_normal((c0, c1, 3, 3)) * np.sqrt(2 / (9 * c1))
    t = (torus, torus)
    s1, s2 = W.conv_sigma(w1, t, (1, 1), 1), W.conv_sigma(w2, t, (1, 1), 1)
    bound = W.relu_block_sigma(w1, w2, t, (1, 1), (1, 1), s1, s2)
    shape = (c1, torus, torus)
    patterns = [np.ones(shape), np.zeros(shape), rng.uniform(0, 1, shape),
                *((rng.uniform(0, 1, shape) < 0.5).astype(np.float64) for _ in range(3))]
    seen = max([_slopes_norm(w1, w2, torus, 1, d) for d in patterns] + [_worst_slopes(w1, w2, torus, 1, rng)])
    assert seen <= bound < W.residual_sigma(w1, w2, t, (1, 1), (1, 1)) + 0.5 * s1 * s2


@pytest.mark.parametrize("c", [2, 9])
def test_the_relu_block_bound_meets_aligned_directions(c: int) -> None:
    """Where ``C₁`` and ``I + ½C₂C₁`` stretch the same direction most (scalar multiples of the identity), the
    bound is the two norms' sum: ``max_D ‖I + aD‖ = 1 + a`` is reached at ``D = 1``, within 0.1 % (solved, and
    certified)."""
    a = 3.0
    eye = np.eye(c).reshape(c, c, 1, 1)
    bound = W.relu_block_sigma(eye, a * eye, (4, 4), (0, 0), (0, 0), 1.0, a)
    assert 1 + a <= bound <= (1 + a) * 1.001


def _halving_dense(w1: np.ndarray, w2: np.ndarray, wd: np.ndarray, torus: int) -> tuple[np.ndarray, ...]:
    """The dense matrices of a halving block's stride-2 convolution (pad 1), stride-1 one (pad 1) and stride-2 1x1
    projection, on an input torus twice ``torus``."""
    def dense(f: Any, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        return np.stack([f(np.eye(n)[j].reshape(shape)).reshape(-1) for j in range(n)], axis=1)

    c0, c1 = w1.shape[1], w1.shape[0]
    big, small = (c0, 2 * torus, 2 * torus), (c1, torus, torus)
    return (dense(lambda x: strided_conv(w1, x, 2, 1), big), dense(lambda h: strided_conv(w2, h, 1, 1), small),
            dense(lambda x: strided_conv(wd, x, 2, 0), big))


@pytest.mark.parametrize("c0,c1,c2,torus,seed", [(2, 3, 3, 3, 0), (3, 4, 6, 3, 1), (4, 6, 8, 2, 2)])
def test_the_halving_block_bound_holds_for_every_slope_pattern(c0: int, c1: int, c2: int, torus: int,
                                                                seed: int) -> None:
    """``max_D ‖Wd + C₂DC₁‖`` for a block that halves the grid: the bound covers every pattern tried (all
    passing, none, random ones and fractions, one pushed to the worst by alternating the top singular pair and
    the slopes), and is below ``‖Wd + ½C₂C₁‖ + ½σ₂σ₁``. From ``C2 + 4·C0`` over 16 its matrices are certified."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((c1, c0, 3, 3)) * np.sqrt(2 / (9 * c0))
    w2 = rng.standard_normal((c2, c1, 3, 3)) * np.sqrt(2 / (9 * c1))
    wd = rng.standard_normal((c2, c0, 1, 1)) * np.sqrt(1 / c0)
    a1, a2, ad = _halving_dense(w1, w2, wd, torus)
    t = (torus, torus)
    s1, s2 = W.conv_sigma(w1, (2 * torus, 2 * torus), (1, 1), 1, (2, 2)), W.conv_sigma(w2, t, (1, 1), 1)
    bound = W.relu_halving_sigma(w1, w2, wd, t, (1, 1), (1, 1), s1, s2)
    hidden = a1.shape[0]
    patterns = [np.ones(hidden), np.zeros(hidden), rng.uniform(0, 1, hidden),
                *((rng.uniform(0, 1, hidden) < 0.5).astype(np.float64) for _ in range(3))]
    d = patterns[-1].copy()
    for _ in range(8):  # pushed: the slopes that add to the top singular pair's u·(Wd + C₂DC₁)x
        u, _, vt = np.linalg.svd(ad + a2 @ (d[:, None] * a1))
        d = ((a2.T @ u[:, 0]) * (a1 @ vt[0]) > 0).astype(np.float64)
        patterns.append(d.copy())
    seen = max(float(np.linalg.norm(ad + a2 @ (p[:, None] * a1), 2)) for p in patterns)
    assert seen <= bound < W.projection_sigma(w1, w2, wd, t, (1, 1), (1, 1)) + 0.5 * s1 * s2


@pytest.mark.parametrize("c", [2, 5])
def test_the_halving_block_bound_meets_aligned_directions(c: int) -> None:
    """``Wd = I`` and ``C₂C₁ = aI`` on the even phase (1x1 kernels): ``max_D ‖P₀ + aDP₀‖ = 1 + a``, reached at
    ``D = 1``, within 0.1 % (``C2 + 4·C0`` = 10: solved; 25: certified)."""
    a = 3.0
    eye = np.eye(c).reshape(c, c, 1, 1)
    bound = W.relu_halving_sigma(eye, a * eye, eye, (3, 3), (0, 0), (0, 0), 1.0, a)
    assert 1 + a <= bound <= (1 + a) * 1.001


def test_the_halving_block_bound_refuses_kernels_that_do_not_chain() -> None:
    with pytest.raises(ValueError):
        W.relu_halving_sigma(np.ones((4, 3, 3, 3)), np.ones((5, 3, 3, 3)), np.ones((5, 3, 1, 1)), (4, 4), (1, 1),
                             (1, 1), 1.0, 1.0)


def test_blocks_of_zero_weights_move_only_by_their_skip() -> None:
    """Only ``H``'s ``½P`` blocks are left (eigenvalues ±½; matrices over 16 wide, so certified): the bound is the
    skip's norm, 1, within the slack."""
    z1, z2 = np.zeros((12, 12, 3, 3)), np.zeros((12, 12, 3, 3))
    assert 1.0 <= W.relu_block_sigma(z1, z2, (6, 6), (1, 1), (1, 1), 1.0, 1.0) <= 1.0 + 2 * S.TOP_SLACK
    eye = np.eye(6).reshape(6, 6, 1, 1)
    bound = W.relu_halving_sigma(np.zeros((6, 6, 3, 3)), np.zeros((6, 6, 3, 3)), eye, (3, 3), (1, 1), (1, 1), 1.0, 1.0)
    assert 1.0 <= bound <= 1.0 + 2 * S.TOP_SLACK


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_operator_norms_are_charged_once_per_engine(precision: str) -> None:
    """The norms a pass computes (convolutions', blocks', two kernels' composed filters') depend on the weights
    alone: a second pass of the same engine, at another scale of the box, computes and charges none."""
    module = cnn(0)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    shape = tuple(int(d) for d in checked.main.params[0].shape)
    first = engine.run({"x": (np.full(shape, -2.0), np.full(shape, 2.0))})
    assert engine.take_norm_units() > 0
    assert any(ob.method == "windows" for ob in first.ops.values())  # the window norms did run
    engine.run({"x": (np.full(shape, -0.5), np.full(shape, 0.5))})
    assert engine.take_norm_units() == 0
