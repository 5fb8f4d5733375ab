"""Two residual blocks bounded at once (:func:`verify.probe.block_pairs.relu_pair_sigma`): ``‖B₂DB₁‖`` over every
slope pattern of both blocks' ReLUs and of the ReLU between them. Dense matrices of the operators check that the
bound covers every pattern tried (including ones pushed to the worst) and that it is below the product of the
two blocks' own bounds; the probe uses it for the second block's sum and the bound holds on inputs pushed to
grow that sum."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cnn_cases import cnn, strided_conv, window_distance
from sampling import pushed_points

from cuvil.interp import evaluate_values
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from verify.probe import block_pairs as P
from verify.probe import windows as W
from verify.probe.bounds import BoundsEngine
from verify.probe.centered import CenteredWindows
from verify.probe.program import reduced_program


def _dense(f: Any, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    return np.stack([f(np.eye(n)[j].reshape(shape)).reshape(-1) for j in range(n)], axis=1)


def _kernel(rng: np.random.Generator, cout: int, cin: int, k: int = 3) -> np.ndarray:
    return rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (k * k * cin))


class _Pair:
    """Dense ``x -> B₂·Da·B₁·x`` for slope vectors ``d1``, ``da``, ``d2`` (a halving first block when ``wd``)."""

    def __init__(self, w11: np.ndarray, w12: np.ndarray, wd: np.ndarray | None, w21: np.ndarray, w22: np.ndarray,
                 torus: int) -> None:
        c0, c2 = w11.shape[1], w12.shape[0]
        stride = 1 if wd is None else 2
        big, small = (c0, stride * torus, stride * torus), (c2, torus, torus)
        self.a11 = _dense(lambda x: strided_conv(w11, x, stride, 1), big)
        self.a12 = _dense(lambda h: strided_conv(w12, h, 1, 1), (w12.shape[1], torus, torus))
        self.p = np.eye(self.a11.shape[1]) if wd is None else _dense(lambda x: strided_conv(wd, x, 2, 0), big)
        self.a21 = _dense(lambda h: strided_conv(w21, h, 1, 1), small)
        self.a22 = _dense(lambda h: strided_conv(w22, h, 1, 1), (w21.shape[0], torus, torus))
        self.sizes = (self.a11.shape[0], self.a12.shape[0], self.a21.shape[0])

    def matrices(self, d1: np.ndarray, da: np.ndarray, d2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b1 = self.p + self.a12 @ (d1[:, None] * self.a11)
        b2 = np.eye(len(da)) + self.a22 @ (d2[:, None] * self.a21)
        return b1, b2

    def norm(self, slopes: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
        b1, b2 = self.matrices(*slopes)
        return float(np.linalg.norm(b2 @ (slopes[1][:, None] * b1), 2))

    def pushed(self, slopes: tuple[np.ndarray, np.ndarray, np.ndarray], rounds: int = 8) -> list[tuple]:
        """Patterns pushed towards the largest norm: the top singular pair ``(u, x)`` for the current slopes,
        then each slope 1 where it adds to ``uᵀB₂DaB₁x`` and 0 where it takes away (the form is linear in each)."""
        d1, da, d2 = (s.copy() for s in slopes)
        out = []
        for _ in range(rounds):
            b1, b2 = self.matrices(d1, da, d2)
            u, _, vt = np.linalg.svd(b2 @ (da[:, None] * b1))
            u, x = u[:, 0], vt[0]
            d1 = ((self.a12.T @ (da * (b2.T @ u))) * (self.a11 @ x) > 0).astype(np.float64)
            b1 = self.p + self.a12 @ (d1[:, None] * self.a11)
            da = ((b2.T @ u) * (b1 @ x) > 0).astype(np.float64)
            d2 = ((self.a22.T @ u) * (self.a21 @ (da * (b1 @ x))) > 0).astype(np.float64)
            out.append((d1, da, d2))
        return out


def _patterns(pair: _Pair, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    n1, na, n2 = pair.sizes
    fixed = [tuple(np.full(n, v) for n in (n1, na, n2)) for v in (1.0, 0.0, 0.5)]
    rand = [tuple(rng.uniform(0, 1, n) for n in (n1, na, n2)) for _ in range(2)]
    coins = [tuple((rng.uniform(0, 1, n) < 0.5).astype(np.float64) for n in (n1, na, n2)) for _ in range(3)]
    return fixed + rand + coins + [p for start in coins[:2] for p in pair.pushed(start)]


@pytest.mark.parametrize("c,hidden,torus,seed", [(3, 4, 5, 0), (4, 3, 4, 1), (6, 6, 4, 2)])
def test_the_pair_bound_holds_for_every_slope_pattern(c: int, hidden: int, torus: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w11, w12 = _kernel(rng, hidden, c), _kernel(rng, c, hidden)
    w21, w22 = _kernel(rng, hidden, c), _kernel(rng, c, hidden)
    t = (torus, torus)
    sig = [W.conv_sigma(w, t, (1, 1), 1) for w in (w11, w12, w21, w22)]
    own = (W.relu_block_sigma(w11, w12, t, (1, 1), (1, 1), sig[0], sig[1]),
           W.relu_block_sigma(w21, w22, t, (1, 1), (1, 1), sig[2], sig[3]))
    bound = P.relu_pair_sigma((w11, w12, None), ((1, 1), (1, 1)), (w21, w22), ((1, 1), (1, 1)), t, tuple(sig),
                              own[0] * own[1])
    pair = _Pair(w11, w12, None, w21, w22, torus)
    seen = max(pair.norm(p) for p in _patterns(pair, rng))
    assert bound is not None and seen <= bound < own[0] * own[1]


@pytest.mark.parametrize("c0,c2,torus,seed", [(2, 3, 3, 0), (3, 5, 3, 1), (4, 6, 2, 2)])
def test_the_pair_bound_after_a_halving_block_holds_for_every_slope_pattern(c0: int, c2: int, torus: int,
                                                                            seed: int) -> None:
    rng = np.random.default_rng(seed)
    w11, w12, w21, w22 = _kernel(rng, c2, c0), _kernel(rng, c2, c2), _kernel(rng, c2, c2), _kernel(rng, c2, c2)
    wd = _kernel(rng, c2, c0, 1)
    t = (torus, torus)
    sig = [W.conv_sigma(w11, (2 * torus, 2 * torus), (1, 1), 1, (2, 2))] + [W.conv_sigma(w, t, (1, 1), 1)
                                                                           for w in (w12, w21, w22)]
    own = (W.relu_halving_sigma(w11, w12, wd, t, (1, 1), (1, 1), sig[0], sig[1]),
           W.relu_block_sigma(w21, w22, t, (1, 1), (1, 1), sig[2], sig[3]))
    bound = P.relu_pair_sigma((w11, w12, wd), ((1, 1), (1, 1)), (w21, w22), ((1, 1), (1, 1)), t, tuple(sig),
                              own[0] * own[1])
    pair = _Pair(w11, w12, wd, w21, w22, torus)
    seen = max(pair.norm(p) for p in _patterns(pair, rng))
    assert bound is not None and seen <= bound < own[0] * own[1]


def test_aligned_blocks_reach_the_product() -> None:
    """``B = (1 + a·D₁)``, then ``(1 + b·D₂)`` (1x1 kernels, scalar multiples of the identity): every slope 1 gives
    ``(1 + a)(1 + b)``, which no pair bound may go under; the last multipliers tried reach it (within 5 %), where
    the others do not come within 5 % of it."""
    a, b, c = 3.0, 2.0, 3
    eye = np.eye(c).reshape(c, c, 1, 1)
    bound = P.relu_pair_sigma((eye, a * eye, None), ((0, 0), (0, 0)), (eye, b * eye), ((0, 0), (0, 0)), (3, 3),
                              (1.0, a, 1.0, b), (1 + a) * (1 + b) * 1.05)
    assert bound is not None and (1 + a) * (1 + b) <= bound <= (1 + a) * (1 + b) * 1.05


def test_the_pair_bound_refuses_blocks_that_do_not_chain() -> None:
    with pytest.raises(ValueError):
        P.relu_pair_sigma((np.ones((4, 3, 3, 3)), np.ones((3, 4, 3, 3)), None), ((1, 1), (1, 1)),
                          (np.ones((4, 5, 3, 3)), np.ones((5, 4, 3, 3))), ((1, 1), (1, 1)), (4, 4), (1, 1, 1, 1), 4.0)


def _two_pairs(seed: int, gain: float) -> Any:
    """A stem, two stride-1 blocks, then a halving block and a stride-1 one (each conv with a bias, each sum
    followed by a ReLU): two pairs of blocks, as in ResNet's stages; kernels ``gain`` times He's."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 3, 8, 8])

    def conv(v: Any, cin: int, cout: int, k: int, stride: int) -> Any:
        w = (gain * _kernel(rng, cout, cin, k)).astype(np.float32)
        y = b.conv(v, b.const(w), strides=(stride, stride), pads=(k // 2,) * 4)
        return b.add(y, b.const((rng.standard_normal((1, cout, 1, 1)) * 0.3).astype(np.float32)))

    h = b.relu(conv(x, 3, 4, 3, 1))
    for _ in range(2):
        h = b.relu(b.add(conv(b.relu(conv(h, 4, 4, 3, 1)), 4, 4, 3, 1), h))
    h = b.relu(b.add(conv(b.relu(conv(h, 4, 6, 3, 2)), 6, 6, 3, 1), conv(h, 4, 6, 1, 2)))
    h = b.relu(b.add(conv(b.relu(conv(h, 6, 6, 3, 1)), 6, 6, 3, 1), h))
    return b.module(b.function("main", [x], [h]))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("gain", [0.5, 1.0])
def test_the_second_block_of_a_pair_is_bounded_with_the_first_and_the_bound_holds(precision: str,
                                                                                   gain: float) -> None:
    """Each pair's second sum takes the pair's bound, below what the two blocks' own bounds give in a chain, and
    every sum's deviation over a window stays within its bound on inputs pushed to grow the convolutions. With the
    function's users known, a first block's sum takes the sum's rule (its own bound would cost as much as the
    pair's), which still holds; where the analysis has no units left for pairs, every block takes its own bound.
    Kernels at half and at He's scale (gains about 2, and 6 to 10 on 4 to 6
    channels)."""
    r = 2.0
    module = _two_pairs(5, gain)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    shape = tuple(int(d) for d in checked.main.params[0].shape)
    box = {"x": (np.full(shape, -r), np.full(shape, r))}
    inputs = {p: engine.run(box).values[p] for p in checked.main.params}

    def windows(users: Any = None, allowance: float = P.PAIR_UNITS_MAX) -> CenteredWindows:
        return CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs), users=users,
                               pairs=P.PairAllowance(allowance))

    paired, alone, leading = windows(), windows(), windows(checked.main.users())
    capped = windows(checked.main.users(), 0.0)  # no units left for pairs: every block takes its own bound
    alone._pair = lambda v: None  # type: ignore[method-assign]
    plain = BoundsEngine(module.main, module.constants)
    points = pushed_points(module, plain, plain.run(box), r, 1, "conv", center=0.0, randoms=3)
    runs = [evaluate_values(checked.main, checked.constants, {"x": x["x"].astype(checked.main.params[0].dtype.np)})
            for x in points]
    sums = [v for v in checked.main.ops() if paired._block(v) is not None]
    assert len(sums) == 4 and [v for v in sums if paired._pair(v) is not None] == [sums[1], sums[3]]
    seconds = [v for v in sums if paired._pair_deviation(v, (1, 1), inputs) is not None]
    assert seconds == [sums[1], sums[3]]
    for v in sums:
        for win in ((1, 1), (3, 3), tuple(int(d) for d in v.shape[2:])):
            c = paired.centers.get(v)
            assert c is not None
            seen = max(window_distance(np.asarray(run[v]), c, win) for run in runs)
            found = [w.deviation(v, win, inputs) for w in (paired, alone, leading)]
            assert all(f is not None and seen <= f for f in found)
            assert capped.deviation(v, win, inputs) == found[1]
            if v in seconds:
                assert found[0] < found[1]  # the pair's bound, not the chain of the blocks' own
            else:
                assert leading._residual_deviation(v, win, inputs) is None


def test_three_blocks_in_a_row_take_the_tighter_of_the_pair_and_the_block() -> None:
    """Blocks 1 and 2 form a pair that starts with the second block of the pair (0, 1): the first of them took
    the sum's rule (it leads a pair), so the third sum also tries its own block's bound after the pair (0, 1),
    and takes the smaller; both hold on inputs pushed to grow the convolutions."""
    r = 1.0
    module = cnn(2, blocks=3, width=6, size=10, gain=0.5)
    engine = BoundsEngine(module.main, module.constants)
    shape = tuple(int(d) for d in module.main.params[0].shape)
    box = {"x": (np.full(shape, -r), np.full(shape, r))}
    inputs = {p: engine.run(box).values[p] for p in module.main.params}
    windows = CenteredWindows(engine.constant_value, engine.live, {}, engine.centers(inputs),
                              users=module.main.users())
    sums = [v for v in module.main.ops() if windows._block(v) is not None]
    assert len(sums) == 3 and windows._overlaps(sums[2]) and not windows._overlaps(sums[1])
    plain = BoundsEngine(module.main, module.constants)
    points = pushed_points(module, plain, plain.run(box), r, 1, "conv", center=0.0, randoms=3)
    runs = [evaluate_values(module.main, module.constants, {"x": x["x"]}) for x in points]
    win = tuple(int(d) for d in sums[2].shape[2:])
    paired = windows._pair_deviation(sums[2], win, inputs)
    taken = windows._residual_deviation(sums[2], win, inputs)
    assert paired is not None and taken is not None and taken < paired  # the block after the pair (0, 1)
    c = windows.centers.get(sums[2])
    assert max(window_distance(np.asarray(run[sums[2]]), c, win) for run in runs) <= taken


@pytest.mark.parametrize("scale,sigma", [(1e150, 1e160), (1e-170, None)])
def test_weights_at_the_ends_of_the_float_range_give_a_bound_or_none(scale: float, sigma: float | None) -> None:
    """Kernels so large their gains' squares overflow (norms given as 1e160), or so small they underflow: no
    exception, and any bound is sound (at least the operator's norm with every slope on)."""
    w = np.ones((2, 2, 3, 3)) * scale
    sig = W.conv_sigma(w, (4, 4), (1, 1), 1) if sigma is None else sigma
    found = P.relu_pair_sigma((w, w, None), ((1, 1), (1, 1)), (w, w), ((1, 1), (1, 1)), (4, 4), (sig,) * 4, 1e300)
    pair = _Pair(w, w, None, w, w, 4)
    ones = tuple(np.ones(n) for n in pair.sizes)
    assert found is None or pair.norm(ones) <= found
