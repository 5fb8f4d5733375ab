"""Window norms: bounds through convolutional networks that per-element intervals lose with depth.

An interval bounds a convolution's output by ``Σ|w|·max|x|``, as if every input of the receptive field
could take its extreme sign at once; through a ResNet that grows about 6.5x per convolution, while the
values themselves stay near 10. The ℓ2 norm of a value over a spatial window (all channels of one
sample) travels much better (:class:`WindowNorms`):

* a convolution maps its input's norm over the window it reads to its output's norm over the window by
  at most its operator norm ``σ(W)``: a zero-padded, strided, dilated convolution is a restriction of
  the stride-1 circular convolution on a torus that holds the padded input, whose norm is the largest
  singular value of its symbol ``K̂(ω)`` over the torus' frequencies (:func:`conv_sigma`); the float
  program's accumulation adds ``γ_{n+1}·σ(|W|)``;
* an output element of a convolution is at most ``‖w_o‖₂`` times its receptive field's norm
  (Cauchy–Schwarz), which is what proves a site;
* a ReLU, a clip around zero and a cast never grow a norm beyond their rounding; a sum (or a max/min
  with a constant) adds its operands' norms; a product or quotient by a constant scales by its largest
  magnitude, an unfolded batch norm by its largest per-channel scale plus its shift's norm; a max pool
  multiplies by at most ``√(windows per input)``, an average pool by that over its smallest divisor; a
  global average pool's means are at most the image's norm over ``√(positions)``;
* anything else, and always as a second bound: the norm of its interval magnitudes over the window.

Only a site's receptive field matters, so the input enters with ``√(elements in the window)`` times its
box, not the whole image's. Every factor accounts for the float program's own rounding, and the bound
arithmetic rounds up, so the facts hold for the values the program computes.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.ops.nn import window_params
from cuvil.ir.values import Value
from verify.probe import interval as I
from verify.probe.interval import Interval
from verify.probe.spectra import EPS64, hermitian_top

SLACK = 1.0 + 2.0 ** -40
"""The float64 rounding of one step of the bounds' own arithmetic."""

NORM_FACTOR = 0.45
"""Work units per million multiply-adds of an operator norm (the Gram sums and the certifying factorization's
n³ per frequency): charged once per convolution and engine, whether or not the process computed it before
(0.7 while every Gram matrix was solved by an eigensolver: the same ResNet-18 norms took 1.7x as long)."""

CACHE_SIZE = 512
"""Operator norms kept per process before the cache starts over."""

Window = tuple[int, ...]

T = TypeVar("T")

Pool = tuple[list[int], list[int], list[int], list[int]]
"""A pool's kernel, strides, leading pads and dilations."""

norm_cache: dict[Any, Any] = {}
"""Operator norms (and what else is computed from weights alone) by a tag, the weights' content and the
geometry: a probe and an FP16 plan build many engines over the same weights."""


def unit(dtype: DType) -> float:
    """The unit roundoff of a float type (0 for integers, which do not round)."""
    return I.unit_roundoff(dtype) if dtype.is_float else 0.0


def acc_type(dtype: DType) -> DType:
    """The type a convolution of ``dtype`` operands accumulates in (halves in float32)."""
    return DType.f32 if dtype in (DType.f16, DType.bf16) else dtype


def shape_of(v: Value) -> tuple[int, ...]:
    """A value's static shape as ints."""
    return tuple(int(d) for d in v.shape)


# --------------------------------------------------------------------------------------
# operator norms


def conv_sigma(w: np.ndarray, torus: tuple[int, ...], dilations: tuple[int, ...], groups: int,
               strides: tuple[int, ...] | None = None) -> float:
    """An upper bound on the ℓ2 operator norm of the circular convolution by ``w`` ([O, C/groups, *k]) on
    a torus of extents ``torus``, keeping every ``strides``-th output (the torus must be a multiple of the
    strides): the square root of the largest eigenvalue of its symbol's Gram matrix ``G(ω) = Σ_δ A_δ e^{iω·δ}``
    over the torus' frequencies (per group), where ``A_δ`` sums the products of the taps ``δ`` apart. Keeping
    every ``s``-th output keeps the output-side ``A_δ`` with ``s | δ``, on the torus ``s`` times smaller. The
    float64 error of forming ``G`` and of finding its largest eigenvalue (:func:`hermitian_top`) is added."""
    w = np.asarray(w, dtype=np.float64)
    co, cg = int(w.shape[0]), int(w.shape[1])
    ks = [int(k) for k in w.shape[2:]]
    strides = tuple(strides or (1,) * len(ks))
    if len(ks) == 1:  # one spatial axis: a second of extent 1
        w, ks, torus, dilations, strides = w[..., None], [ks[0], 1], (torus[0], 1), (dilations[0], 1), \
            (strides[0], 1)
    if len(ks) != 2 or co % groups or any(t % s for t, s in zip(torus, strides, strict=True)):
        raise ValueError("conv_sigma takes 1-d and 2-d convolutions on a torus that is a multiple of the strides")
    cog = co // groups
    g = w.reshape(groups, cog, cg, ks[0], ks[1])
    strided = strides != (1, 1)
    left = cg <= cog and not strided  # the Gram on the smaller side: SᴴS (C×C) or SSᴴ (O×O)
    taps = [((a * dilations[0], b * dilations[1]), g[..., a, b]) for a in range(ks[0]) for b in range(ks[1])]
    corr: dict[tuple[int, int], np.ndarray] = {}
    for p, mp in taps:
        for q, mq in taps:
            delta = (p[0] - q[0], p[1] - q[1]) if left else (q[0] - p[0], q[1] - p[1])
            if delta[0] % strides[0] or delta[1] % strides[1]:
                continue
            prod = np.swapaxes(mp, 1, 2) @ mq if left else mp @ np.swapaxes(mq, 1, 2)
            corr[delta] = corr[delta] + prod if delta in corr else prod
    deltas = sorted(corr)
    stack = np.stack([corr[d] for d in deltas])  # [δ, g, n, n]
    side = stack.shape[-1]
    t1, t2 = (torus[0] // strides[0], torus[1] // strides[1]) if deltas != [(0, 0)] else (1, 1)  # 1x1: one G
    omega = half_frequencies((t1, t2))  # G(-ω) is G(ω) conjugated
    steps = np.asarray(deltas, dtype=np.float64) / np.asarray(strides, dtype=np.float64)
    phase = np.exp(1j * (omega @ steps.T))  # [ω, δ]
    def grams(rows: np.ndarray) -> np.ndarray:
        return np.tensordot(phase[rows], stack, axes=([1], [0])).reshape(-1, side, side)  # [ω·g, n, n]

    # forming G: each entry within 2γ_m of BᵀB or BBᵀ (B = Σ_k|w_k|; m terms: the tap pairs times the side
    # the products contract over); finding its largest eigenvalue: :func:`hermitian_top`
    b = np.sum(np.abs(g), axis=(3, 4))
    m = len(taps) * (cog if left else cg) + len(deltas) + 8
    err = 2 * I.gamma(m, EPS64) * float(np.max(np.sum(b * b, axis=(1, 2))))
    size = float(np.max(np.sqrt(np.sum(np.sum(np.abs(stack), axis=0) ** 2, axis=(1, 2)))))
    lam = hermitian_top(grams, len(omega), groups * side * side, size * (1 + 1e-9))
    return math.sqrt(max(lam, 0.0) + err) * (1 + 1e-12)


def half_frequencies(torus: tuple[int, int]) -> np.ndarray:
    """The frequencies ``ω`` ([F, 2]) of a 2-d torus with the second's non-negative half: a real kernel's
    symbol at ``-ω`` is the conjugate of its symbol at ``ω``, with the same singular values."""
    t1, t2 = torus
    f1, f2 = np.meshgrid(np.arange(t1), np.arange(t2 // 2 + 1), indexing="ij")
    return np.stack([2 * np.pi * f1.reshape(-1) / t1, 2 * np.pi * f2.reshape(-1) / t2], axis=1)


def _product_error(w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, float]:
    """``B₂B₁`` (``B = Σ_t |w_t|``, which bounds every symbol entrywise, and so every product of two symbols)
    and the float64 error of forming ``½K̂₂K̂₁`` relative to it: each symbol entry's taps times phases (each
    within a few ulps) summed, then the product's sum over the middle channels."""
    b1, b2 = np.sum(np.abs(w1), axis=(2, 3)), np.sum(np.abs(w2), axis=(2, 3))
    taps = max(w1.shape[2] * w1.shape[3], w2.shape[2] * w2.shape[3])
    e_sym = I.gamma(2 * taps + 8, EPS64)
    return b2 @ b1, 0.5 * (I.gamma(2 * int(w1.shape[0]) + 8, EPS64) + 2 * e_sym + e_sym * e_sym)


Taps = list[tuple[tuple[int, int], np.ndarray]]
"""A kernel's taps as (offset of the input it reads, matrix), its symbol ``Σ m·e^{-iω·offset}``."""


def kernel_taps(w: np.ndarray, pads: tuple[int, int]) -> Taps:
    """The taps of a 2-d kernel ``[O, C, kh, kw]``: tap ``t`` reads the input ``t - pads`` from the output."""
    return [((a - pads[0], b - pads[1]), w[:, :, a, b]) for a in range(w.shape[2]) for b in range(w.shape[3])]


def offset_products(left: Taps, right: Taps) -> tuple[list[tuple[int, int]], np.ndarray, int]:
    """The symbol of a product of two kernels as a kernel: ``(offsets, [D, m, n] matrices, terms)``, each
    matrix the sum of the tap products whose offsets add to it (``terms``: the most products one entry sums)."""
    acc: dict[tuple[int, int], np.ndarray] = {}
    count: dict[tuple[int, int], int] = {}
    for p, mp in left:
        for q, mq in right:
            d = (p[0] + q[0], p[1] + q[1])
            prod = mp @ mq
            acc[d] = acc[d] + prod if d in acc else prod
            count[d] = count.get(d, 0) + 1
    offsets = sorted(acc)
    terms = max(count.values()) * int(left[0][1].shape[1])
    return offsets, np.stack([acc[d] for d in offsets]), terms


def _real_symbol(omega: np.ndarray, offsets: list[tuple[int, int]], mats: np.ndarray, out: np.ndarray,
                 scale: float) -> None:
    """``out = scale·Σ_δ m_δ e^{-iω·δ}`` at each frequency (``[F, m, n]``) for real ``m_δ``, as two real products
    written into ``out``'s real and imaginary parts (a complex product would first copy every ``m_δ`` into
    complex numbers)."""
    angle = omega @ np.asarray(offsets, dtype=np.float64).T  # [F, D]
    flat = mats.reshape(len(offsets), -1)
    shape = (len(omega), *mats.shape[1:])
    out.real = (np.cos(angle) @ flat).reshape(shape) * scale
    out.imag = (np.sin(angle) @ flat).reshape(shape) * -scale


def _phase_taps(w: np.ndarray, pads: tuple[int, int], stride: int) -> list[Taps]:
    """A strided kernel's taps split by the phase of the input they read (``x_p[j] = x[s·j + p]``, phases in
    row-major order): tap ``t`` reads ``x[s·i + t - pads]``, phase ``(t - pads) mod s``, offset
    ``(t - pads) // s`` on the output's grid. Stride 1: one phase, every tap."""
    phases: list[Taps] = [[] for _ in range(stride * stride)]
    for (u, v), m in kernel_taps(w, pads):
        phases[(u % stride) * stride + v % stride].append((((u - u % stride) // stride, (v - v % stride) // stride), m))
    return phases


def _adjoint(taps: Taps) -> Taps:
    """The taps of the adjoint: each matrix transposed, its offset negated."""
    return [((-o[0], -o[1]), m.T) for o, m in taps]


def _symbol(taps: Taps, omega: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``Σ m·e^{-iω·offset}`` over ``taps`` at each frequency ``[F, 2]``: ``[F, *shape]`` (zero without taps)."""
    out = np.zeros((len(omega), *shape), dtype=np.complex128)
    if taps:
        _real_symbol(omega, [o for o, _ in taps], np.stack([m for _, m in taps]), out, 1.0)
    return out


def _symbols(w: np.ndarray, omega: np.ndarray, pads: tuple[int, int]) -> np.ndarray:
    """``K̂(ω) = Σ_t w[:, :, t] e^{-iω·(t - pads)}`` of a 2-d kernel ``[O, C, kh, kw]`` at each frequency
    ``[F, 2]``: ``[F, O, C]`` (tap ``t`` of output ``i`` reads input ``i + t - pads``)."""
    return _symbol(kernel_taps(w, pads), omega, (int(w.shape[0]), int(w.shape[1])))


def _block_kernels(w1: np.ndarray, w2: np.ndarray, wd: np.ndarray | None, name: str) -> Any:
    """A residual block's kernels in float64, checked: 2-d ``w1`` [C1, C0, kh, kw] and ``w2`` [C2, C1, kh, kw],
    ``C2 = C0`` without a projection, else ``wd`` its 1x1 [C2, C0, 1, 1]."""
    w1, w2 = np.asarray(w1, dtype=np.float64), np.asarray(w2, dtype=np.float64)
    c1, c0 = int(w1.shape[0]), int(w1.shape[1])
    c2 = int(w2.shape[0])
    if wd is None:
        if w1.ndim != 4 or w2.ndim != 4 or (c2, int(w2.shape[1])) != (c0, c1):
            raise ValueError(f"{name} takes two 2-d kernels that map C0 -> C1 -> C0 channels")
        return w1, w2
    wd = np.asarray(wd, dtype=np.float64)
    if w1.ndim != 4 or w2.ndim != 4 or int(w2.shape[1]) != c1 or tuple(wd.shape) != (c2, c0, 1, 1):
        raise ValueError(f"{name} takes kernels mapping C0 -> C1 -> C2 and a 1x1 C0 -> C2 skip")
    return w1, w2, wd


def residual_sigma(w1: np.ndarray, w2: np.ndarray, torus: tuple[int, int], pads1: tuple[int, int] = (0, 0),
                   pads2: tuple[int, int] = (0, 0)) -> float:
    """An upper bound on ``‖I + ½ C₂ C₁‖``, ``C₁``, ``C₂`` the circular stride-1 convolutions by ``w1`` ([C1, C0,
    kh, kw]) and ``w2`` ([C0, C1, kh, kw]) on ``torus`` whose taps read ``pads`` before the output's place:
    the largest singular value of ``I + ½ K̂₂(ω) K̂₁(ω)`` over the torus' frequencies (a real kernel's ``ω``
    and ``-ω`` have conjugate symbols, so half of them), plus the float64 error of forming the symbols,
    their product and the Gram matrix (each bounded entrywise through ``B = Σ_t |w_t|``), and of finding its
    largest eigenvalue (:func:`hermitian_top`)."""
    w1, w2 = _block_kernels(w1, w2, None, "residual_sigma")
    c1, c0 = int(w1.shape[0]), int(w1.shape[1])
    omega = half_frequencies(torus)
    eye = np.eye(c0)

    def grams(rows: np.ndarray) -> np.ndarray:
        m = eye + 0.5 * (_symbols(w2, omega[rows], pads2) @ _symbols(w1, omega[rows], pads1))  # [F, C0, C0]
        return np.conj(np.swapaxes(m, 1, 2)) @ m

    bb, rel = _product_error(w1, w2)
    d_m = rel * float(np.linalg.norm(bb)) * (1 + 1e-9)
    a = eye + 0.5 * bb  # |M| entrywise
    gram = float(np.linalg.norm(a.T @ a)) * (1 + 1e-9)
    d_g = I.gamma(2 * c0 + 8, EPS64) * gram
    lam = hermitian_top(grams, len(omega), 4 * c0 * max(c0, c1), gram)
    return (math.sqrt(max(lam, 0.0) + d_g) + d_m) * (1 + 1e-12)


class TapForm:
    """A Hermitian matrix at any frequency of a torus, ``Ĥ(ω) = Σ scale·L̂(ω)R̂(ω) + Σ K``, summed block by block from
    products of two kernels' taps (``L``, ``R``: :data:`Taps`; their products grouped by offset once, so per
    frequency a part costs its offsets times its entries, not a product of symbols) and constant matrices ``K``,
    each at ``(row, column)`` of the upper triangle of blocks (a diagonal block's parts Hermitian themselves) and
    mirrored below; with bounds on ``‖Ĥ(ω)‖`` at every frequency and on the float64 error of forming it
    (entrywise, through the sums ``B = Σ_t |w_t|``)."""

    def __init__(self, width: int, parts: list[tuple[int, int, float, Taps, Taps]],
                 constants: list[tuple[int, int, np.ndarray]]):
        self.width = width
        self.parts = [(r, c, scale, offset_products(left, right)) for r, c, scale, left, right in parts]
        self.constants = constants
        self.blocks: dict[tuple[int, int], tuple[int, int]] = {}
        magnitude, error = np.zeros((width, width)), np.zeros((width, width))
        for (r, c, scale, (offsets, mats, terms)), (*_, left, right) in zip(self.parts, parts, strict=True):
            mag = abs(scale) * (_tap_sum(left) @ _tap_sum(right))
            magnitude[r:r + mag.shape[0], c:c + mag.shape[1]] += mag
            # each entry within 2γ(terms + offsets + 8) of the |w| product: the tap products' sums, then the
            # phases' sum over the offsets, each phase within a few ulps
            error[r:r + mag.shape[0], c:c + mag.shape[1]] += 2 * I.gamma(terms + len(offsets) + 8, EPS64) * mag
            self.blocks[(r, c)] = mats.shape[1:]
        for r, c, k in constants:
            magnitude[r:r + k.shape[0], c:c + k.shape[1]] += np.abs(k)
            error[r:r + k.shape[0], c:c + k.shape[1]] += 2 * EPS64 * np.abs(k)  # (its sum into the parts')
            self.blocks[(r, c)] = k.shape
        upper = np.triu(np.ones((width, width), dtype=bool))
        magnitude, error = np.where(upper, magnitude, magnitude.T), np.where(upper, error, error.T)
        self.norm = float(np.linalg.norm(magnitude)) * (1 + 1e-9)  # >= ‖Ĥ(ω)‖ at every frequency
        self.error = (float(np.linalg.norm(error)) + 4 * EPS64 * self.norm) * (1 + 1e-9)  # (and the scalings)

    def __call__(self, omega: np.ndarray) -> np.ndarray:
        h = np.zeros((len(omega), self.width, self.width), dtype=np.complex128)
        for r, c, scale, (offsets, mats, _) in self.parts:
            out = np.empty((len(omega), *mats.shape[1:]), dtype=np.complex128)
            _real_symbol(omega, offsets, mats, out, scale)
            h[:, r:r + mats.shape[1], c:c + mats.shape[2]] += out
        for r, c, k in self.constants:
            h[:, r:r + k.shape[0], c:c + k.shape[1]] += k
        for (r, c), (m, n) in self.blocks.items():
            if r != c:
                h[:, c:c + n, r:r + m] = np.conj(np.swapaxes(h[:, r:r + m, c:c + n], 1, 2))
        return h


def _tap_sum(taps: Taps) -> np.ndarray:
    """``Σ_t |m_t|`` over a kernel's taps: entrywise at least ``|K̂(ω)|`` at every frequency."""
    return sum((np.abs(m) for _, m in taps), np.zeros(taps[0][1].shape))


def _block_form(w1: np.ndarray, w2: np.ndarray, pads1: tuple[int, int], pads2: tuple[int, int], stride: int,
                skip: np.ndarray, beta: float) -> TapForm:
    """``Ĥ(ω) = [[¼βK̂₂K̂₂ᴴ, ½M̂], [½M̂ᴴ, ¼β⁻¹K̂₁ᴴK̂₁]]``, ``M̂ = [Pₚ + ½K̂₂K̂₁ₚ]ₚ`` over the phases of the input (one
    for a stride-1 block, ``P₀ = I``; four for a halving block, ``P₀`` its 1x1 projection)."""
    t2 = kernel_taps(w2, pads2)
    phases = _phase_taps(w1, pads1, stride)
    c2, c0 = int(w2.shape[0]), int(w1.shape[1])
    at = [c2 + p * c0 for p in range(len(phases))]  # where each phase's columns start
    parts = [(0, 0, 0.25 * beta, t2, _adjoint(t2))]
    parts += [(0, at[p], 0.25, t2, ph) for p, ph in enumerate(phases) if ph]
    parts += [(at[p], at[q], 0.25 / beta, _adjoint(phases[p]), phases[q])
              for p in range(len(phases)) for q in range(p, len(phases)) if phases[p] and phases[q]]
    return TapForm(c2 + len(phases) * c0, parts, [(0, c2, 0.5 * skip)])  # ½M̂ = ½P + ¼K̂₂K̂₁


def relu_block_sigma(w1: np.ndarray, w2: np.ndarray, torus: tuple[int, int], pads1: tuple[int, int],
                     pads2: tuple[int, int], sigma1: float, sigma2: float) -> float:
    """An upper bound on ``‖I + C₂DC₁‖`` over every diagonal ``D`` with entries in [0, 1] (a block's ReLU slopes),
    ``C₁``, ``C₂`` as in :func:`residual_sigma` and ``σ₁``, ``σ₂`` bounds on their norms (which choose ``β``).

    For unit ``x``, ``y`` and ``D = ½ + E`` (``|E| <= ½``): ``yᵀ(I + C₂DC₁)x <= yᵀMx + ½‖C₂ᵀy‖‖C₁x‖`` (``M = I +
    ½C₂C₁``, Cauchy–Schwarz over the slopes) ``<= yᵀMx + ¼(β‖C₂ᵀy‖² + β⁻¹‖C₁x‖²)``, the quadratic form of
    ``H = [[¼βC₂C₂ᵀ, ½M], [½Mᵀ, ¼β⁻¹C₁ᵀC₁]]`` at ``(y, x)``, whose norm is √2: so the norm is at most ``2λ_max(H)``.
    Unlike bounding ``‖Mx‖`` and ``½σ₂‖C₁x‖`` apart, the second term pays ``‖C₂ᵀy‖`` for the direction ``y`` the
    first one uses, not ``σ₂`` (ResNet-18's stride-1 blocks: 1.76-1.85 against 1.92-2.06). ``H`` is
    block-circulant: its eigenvalues are those of ``Ĥ(ω)`` (:class:`TapForm`, which also bounds the float64
    error of forming them) over the frequencies, whose largest :func:`hermitian_top` bounds."""
    w1, w2 = _block_kernels(w1, w2, None, "relu_block_sigma")
    c0 = int(w1.shape[1])
    if not (math.isfinite(sigma1) and math.isfinite(sigma2) and sigma1 > 0 and sigma2 > 0):
        return residual_sigma(w1, w2, torus, pads1, pads2) + 0.5 * sigma1 * sigma2
    return _relu_block_bound(_block_form(w1, w2, pads1, pads2, 1, np.eye(c0), sigma1 / sigma2), torus)


def _relu_block_bound(blocks: TapForm, torus: tuple[int, int]) -> float:
    """``2λ_max(H)`` over the frequencies of ``torus``, the float64 errors included."""
    omega = half_frequencies(torus)
    top = hermitian_top(lambda rows: blocks(omega[rows]), len(omega), blocks.width ** 2, blocks.norm)
    return 2 * (top + blocks.error) * (1 + 1e-12)


def _phase_symbols(w: np.ndarray, omega: np.ndarray, pads: tuple[int, int]) -> list[np.ndarray]:
    """A stride-2 convolution as four stride-1 ones on the half-size torus, one per phase of its input
    (:func:`_phase_taps`): their symbols ``K̂_p(ω)``, ``[F, O, C]`` each, phases in row-major order."""
    return [_symbol(ph, omega, (int(w.shape[0]), int(w.shape[1]))) for ph in _phase_taps(w, pads, 2)]


def projection_sigma(w1: np.ndarray, w2: np.ndarray, wd: np.ndarray, torus: tuple[int, int], pads1: tuple[int, int],
                     pads2: tuple[int, int]) -> float:
    """An upper bound on ``‖Wd + ½ C₂ C₁‖`` for a block that halves the grid: ``C₁`` the stride-2 convolution by
    ``w1`` ([C1, C0, kh, kw]), ``C₂`` the stride-1 one by ``w2`` ([C2, C1, kh, kw]) and ``Wd`` the stride-2 1x1
    one by ``wd`` ([C2, C0, 1, 1]), circular, ``torus`` the output's (the input's is twice it). Split into
    its input's four phases the block is ``[Wd·[p = 0] + ½K̂₂(ω)K̂₁ₚ(ω)]ₚ`` at each frequency of the output
    torus; its norm the largest over them of the largest singular value, plus the float64 errors (bounded
    entrywise through ``B = Σ_t |w_t|``, as :func:`residual_sigma` does)."""
    w1, w2, wd = _block_kernels(w1, w2, wd, "projection_sigma")
    c1, c0, c2 = int(w1.shape[0]), int(w1.shape[1]), int(w2.shape[0])
    omega = half_frequencies(torus)
    skip = wd[:, :, 0, 0]

    def grams(rows: np.ndarray) -> np.ndarray:
        part = omega[rows]
        k2 = _symbols(w2, part, pads2)
        gram = np.zeros((len(part), c2, c2), dtype=np.complex128)
        for p, k1 in enumerate(_phase_symbols(w1, part, pads1)):
            m = 0.5 * (k2 @ k1) + (skip if p == 0 else 0.0)  # [F, C2, C0]
            gram += m @ np.conj(np.swapaxes(m, 1, 2))
        return gram

    bb, rel = _product_error(w1, w2)  # bb bounds every phase's |K̂₂K̂₁ₚ| entrywise
    d_m = rel * 2 * float(np.linalg.norm(bb)) * (1 + 1e-9)
    a = np.abs(skip) + 0.5 * bb
    gram_bound = 4 * float(np.linalg.norm(a @ a.T)) * (1 + 1e-9)
    d_g = I.gamma(8 * c0 + 8, EPS64) * gram_bound
    lam = hermitian_top(grams, len(omega), 4 * c2 * max(c0, c1, c2), gram_bound)
    return (math.sqrt(max(lam, 0.0) + d_g) + d_m) * (1 + 1e-12)


def relu_halving_sigma(w1: np.ndarray, w2: np.ndarray, wd: np.ndarray, torus: tuple[int, int],
                       pads1: tuple[int, int], pads2: tuple[int, int], sigma1: float, sigma2: float) -> float:
    """An upper bound on ``‖Wd + C₂DC₁‖`` over every ReLU slope pattern ``D`` of a block that halves the grid
    (kernels and ``torus`` as in :func:`projection_sigma`; ``σ₁``, ``σ₂`` bounds on the convolutions' norms):
    :func:`relu_block_sigma`'s ``2λ_max(H)`` with ``M = Wd + ½C₂C₁`` split into the input's four phases, so
    ``Ĥ(ω)`` is ``C2 + 4·C0`` wide."""
    w1, w2, wd = _block_kernels(w1, w2, wd, "relu_halving_sigma")
    if not (math.isfinite(sigma1) and math.isfinite(sigma2) and sigma1 > 0 and sigma2 > 0):
        return projection_sigma(w1, w2, wd, torus, pads1, pads2) + 0.5 * sigma1 * sigma2
    return _relu_block_bound(_block_form(w1, w2, pads1, pads2, 2, wd[:, :, 0, 0], sigma1 / sigma2), torus)


def block_units(width: int, torus: tuple[int, int]) -> float:
    """Work units of :func:`relu_block_sigma` and :func:`relu_halving_sigma`, read from the shapes alone: per
    frequency, forming a ``width``-wide Hermitian matrix from its offset sums and a Cholesky factorization
    (``width³/3`` complex), with Lanczos estimates where one is not covered (ResNet-18's blocks, widths 128 to
    1,536: within 20 % of ``width²·(width + 1760)`` at 0.09 units per million)."""
    freqs = torus[0] * (torus[1] // 2 + 1)
    return NORM_FACTOR * freqs * width * width * (width + 1760) / 5e6


def sigma_units(shape: tuple[int, ...], torus: tuple[int, ...], groups: int, strides: tuple[int, ...]) -> float:
    """Work units of :func:`conv_sigma` for a weight of ``shape`` on ``torus``, read from the shapes alone."""
    co, cg = int(shape[0]), int(shape[1])
    taps = math.prod(int(k) for k in shape[2:])
    strided = any(st > 1 for st in strides)
    side, other = (co // groups, cg) if strided else (min(co // groups, cg), max(co // groups, cg))
    coarse = [int(t) // st for t, st in zip(torus, strides, strict=True)]
    freqs = 1 if taps == 1 else math.prod(coarse[:-1]) * (coarse[-1] // 2 + 1)
    work = groups * (taps * taps * side * side * other + freqs * side ** 3)
    return NORM_FACTOR * work / 1e6


def abs_sigma(w: np.ndarray, groups: int) -> float:
    """An upper bound on the operator norm of the convolution by ``|w|``: the largest singular value of
    ``Σ_k |w|`` per group (the symbol of a nonnegative kernel is largest, entrywise, at frequency 0)."""
    a = np.sum(np.abs(np.asarray(w, dtype=np.float64)).reshape(w.shape[0], w.shape[1], -1), axis=2)
    co = a.shape[0]
    blocks = a.reshape(groups, co // groups, a.shape[1])
    return max(float(np.linalg.norm(b, 2)) for b in blocks) * (1 + 1e-9)


# --------------------------------------------------------------------------------------
# windows of one pass


class WindowNorms:
    """Window-norm bounds of one interval pass over NC* values (``values``: the intervals so far)."""

    def __init__(self, constant_value: Callable[[Value], np.ndarray], live: set[Value],
                 sigmas: dict[Any, tuple[float, float]]) -> None:
        self.constant_value = constant_value
        self.live = live
        self.sigmas = sigmas  # per (weight, torus, dilations, groups): (σ(W), σ(|W|)), shared across passes
        self.memo: dict[tuple[Value, Window], float | None] = {}
        self.squares: dict[Value, np.ndarray | None] = {}  # per value: Σ over channels of its magnitudes²
        self.constant_squares: dict[tuple[Value, tuple[int, ...]], np.ndarray] = {}  # per constant and shape
        self.parts: dict[Value, tuple[Value, np.ndarray, list[int], list[int], list[int], int] | None] = {}
        self.weight_keys: dict[Value, str] = {}
        self.units = 0.0
        """Work units of the operator norms this pass needed first (see :data:`NORM_FACTOR`)."""

    # -- the norm of a value over a window ---------------------------------------------------------------
    def window(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """A bound on the ℓ2 norm of ``v`` over any ``win`` spatial window (all channels of one sample)."""
        clamped = clamp_window(v, win)
        if clamped is None:
            return None
        win = clamped
        key = (v, win)
        if key not in self.memo:
            self.memo[key] = None  # SSA has no cycles; keep recursion honest anyway
            ruled = self._rule(v, win, values) if v in self.live and not v.is_param else None
            plain = self._interval_window(v, win, values)
            found = [b for b in (ruled, plain) if b is not None and math.isfinite(b)]
            self.memo[key] = min(found) if found else None
        return self.memo[key]

    def _rule(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        op = v.op
        if op == "conv":
            return self._conv(v, win, values)
        if op == "relu":
            return self.window(v.operands[0], win, values)
        if op == "cast" and v.dtype.is_float and v.operands[0].dtype.is_float:
            inner = self.window(v.operands[0], win, values)
            return None if inner is None else (inner * (1 + unit(v.dtype)) + underflow(v, win)) * SLACK
        if op in ("add", "sub"):
            total = 0.0
            for o in v.operands:
                part = self._operand(o, v, win, values)
                if part is None:
                    return None
                total += part
            return total * (1 + unit(v.dtype)) * SLACK
        if op in ("mul", "div"):
            return self._scaled(v, win, values)
        if op == "max_pool":
            return self._max_pool(v, win, values)
        if op == "avg_pool":
            return self._avg_pool(v, win, values)
        if op == "clip":
            lo, hi = v.attr("min"), v.attr("max")
            if (lo is None or float(lo) <= 0) and (hi is None or float(hi) >= 0):  # |clip(x)| <= |x|
                return self.window(v.operands[0], win, values)
            return None
        if op in ("max", "min") and len(v.operands) == 2:  # |max(x, c)| <= |x| + |c|
            live = [o for o in v.operands if o in self.live]
            if len(live) != 1 or shape_of(live[0]) != shape_of(v):
                return None
            parts = [self._operand(o, v, win, values) for o in v.operands]
            return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)
        if op == "batch_norm":
            return self._batch_norm(v, win, values)
        return None

    def _operand(self, o: Value, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """An operand's norm over ``v``'s window: the value itself, or a constant broadcast to ``v``."""
        if o not in self.live:
            key = (o, shape_of(v))
            if key not in self.constant_squares:
                data = np.broadcast_to(np.abs(np.asarray(self.constant_value(o), dtype=np.float64)), shape_of(v))
                self.constant_squares[key] = channel_squares(data)
            return max_window(self.constant_squares[key], win)
        if shape_of(o) != shape_of(v):
            return None
        return self.window(o, win, values)

    def scaling(self, v: Value) -> tuple[Value, float] | None:
        """A product by a constant (either side), or a quotient by one: the live operand and the largest
        factor it is multiplied by (None: not such a product, or no finite factor)."""
        a, c = v.operands
        if c in self.live and v.op == "mul":
            a, c = c, a
        if c in self.live or a not in self.live or shape_of(a) != shape_of(v):
            return None
        data = np.abs(np.asarray(self.constant_value(c), dtype=np.float64))
        if v.op == "div":
            if data.size == 0 or float(np.min(data)) == 0:
                return None
            data = 1.0 / data
        factor = float(np.max(data, initial=0.0))
        return (a, factor) if math.isfinite(factor) else None

    def _scaled(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """A product by a constant (either side), or a quotient by one: by its largest factor."""
        scaled = self.scaling(v)
        if scaled is None:
            return None
        a, factor = scaled
        inner = self.window(a, win, values)
        if inner is None:
            return None
        return (inner * factor * (1 + unit(v.dtype)) + underflow(v, win)) * SLACK

    def _pool_geometry(self, v: Value, win: Window) -> tuple[Window, int, *Pool] | None:
        """For a pool without ceil mode and with no window of padding alone: the window of the input that
        ``win`` reads, the most windows one input lies in (``min(k, ceil(((k-1)d+1)/s))`` per axis), and the
        kernel, strides, leading pads and dilations."""
        if v.attr("ceil_mode"):
            return None  # (a ceil-mode window may hang past the padding: -inf alone, or an odd count)
        x = v.operands[0]
        ks = [int(k) for k in v.attr("kernel")]
        s, pb, pe, d = window_params(len(shape_of(x)) - 2, v.attr("strides") or (), v.attr("pads") or (),
                                     v.attr("dilations") or ())
        span = [(k - 1) * dj + 1 for k, dj in zip(ks, d, strict=True)]
        if any(p < 0 or p >= sp for p, sp in zip([*pb, *pe], span + span, strict=True)):
            return None
        inner = tuple((a - 1) * sj + sp for a, sj, sp in zip(win, s, span, strict=True))
        overlap = math.prod(min(k, -(-sp // sj)) for k, sp, sj in zip(ks, span, s, strict=True))
        return inner, overlap, ks, s, pb, d

    def _pooled(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> tuple[float, int, *Pool] | None:
        """:meth:`_pool_geometry` with the input's norm over the window it gives in place of the window."""
        geometry = self._pool_geometry(v, win)
        if geometry is None:
            return None
        inw, overlap, ks, s, pb, d = geometry
        inner = self.window(v.operands[0], inw, values)
        return None if inner is None else (inner, overlap, ks, s, pb, d)

    def _max_pool(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """Each output is one element of its window, so its square is at most the window's sum of squares."""
        pooled = None if v.attr("output") not in (None, "values") else self._pooled(v, win, values)
        if pooled is None:
            return None
        inner, overlap, *_ = pooled
        return inner * math.sqrt(overlap) * SLACK * SLACK

    def _interval_window(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """The norm of ``v``'s interval magnitudes over the worst window (None where not finite)."""
        if v not in self.squares:
            iv = values.get(v)
            if iv is None:
                return None  # (not yet bounded: v's own pass)
            mag = np.broadcast_to(iv.magnitude(), shape_of(v))
            ok = not bool(np.any(iv.nan)) and bool(np.all(np.isfinite(mag)))
            self.squares[v] = channel_squares(mag) if ok else None
        sq = self.squares[v]
        return None if sq is None else max_window(sq, win)

    def _avg_pool(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """Each output is at most ``(1 + γ)·Σ|x|/count`` over its window (``γ``: the sum's rounding, in the
        output's type at worst), so by Cauchy–Schwarz its square is at most ``(1 + γ)²·Σx²/divisor``
        (:meth:`avg_factor`)."""
        pooled = self._pooled(v, win, values)
        if pooled is None:
            return None
        inner, overlap, ks, s, pb, d = pooled
        factor = self.avg_factor(v, overlap, ks, s, pb, d)
        if factor is None:
            return None
        grow = 1 + I.gamma(math.prod(ks) + 2, unit(v.dtype))
        return (inner * factor * grow * SLACK + underflow(v, win)) * SLACK

    def avg_factor(self, v: Value, overlap: int, ks: list[int], s: list[int], pb: list[int],
                   d: list[int]) -> float | None:
        """``√(overlap / divisor)``: the divisor is the kernel's size when padding counts, else the fewest
        taps any window has inside the input (None: a window with none)."""
        if v.attr("count_include_pad"):
            divisor = math.prod(ks)
        else:  # the fewest taps inside the input, per axis, over the outputs
            divisor = 1
            for j, (n, o) in enumerate(zip(shape_of(v.operands[0])[2:], shape_of(v)[2:], strict=True)):
                pos = np.arange(o)[:, None] * s[j] - pb[j] + np.arange(ks[j])[None, :] * d[j]
                divisor *= int(np.min(((pos >= 0) & (pos < n)).sum(axis=1)))
            if divisor < 1:
                return None
        return math.sqrt(overlap / divisor) * SLACK

    def _batch_norm(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``(x - m)/sqrt(var + ε)·s + b`` per channel: at most ``(1 + 8u)·(|a|·|x| + |a·m| + |b|)`` with
        ``a = s/sqrt(var + ε)`` (four roundings and a square root's), so its norm is ``max|a|`` times x's plus
        the norm of the constant part."""
        x, *consts = v.operands
        if any(c in self.live for c in consts) or shape_of(x) != shape_of(v):
            return None
        scale, bias, mean, var = (np.asarray(self.constant_value(c), dtype=np.float64).reshape(-1) for c in consts)
        eps = float(np.asarray(float(v.attr("epsilon")), dtype=v.dtype.np))
        with np.errstate(all="ignore"):
            a = np.abs(scale) / np.sqrt(var + eps)
        shift = a * np.abs(mean) + np.abs(bias)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(shift))):
            return None
        inner = self.window(x, win, values)
        if inner is None:
            return None
        shape = shape_of(v)
        part = max_window(channel_squares(np.broadcast_to(shift.reshape((1, -1) + (1,) * (len(shape) - 2)),
                                                            shape)), win)
        tiny = 4 * I.smallest_subnormal(v.dtype) * math.sqrt(cells(v, win))
        return ((float(np.max(a, initial=0.0)) * inner + part) * (1 + 8 * unit(v.dtype)) + tiny) * SLACK

    # -- convolutions --------------------------------------------------------------------------------------
    def _conv_parts(self, v: Value) -> tuple[Value, np.ndarray, list[int], list[int], list[int], int] | None:
        """x, the weight in float64, strides, leading pads, dilations and groups (None: not a window op)."""
        if v not in self.parts:
            self.parts[v] = self._read_conv(v)
        return self.parts[v]

    def _read_conv(self, v: Value) -> tuple[Value, np.ndarray, list[int], list[int], list[int], int] | None:
        x, w = v.operands
        if w in self.live or x not in self.live or len(shape_of(x)) not in (3, 4):
            return None
        nsp = len(shape_of(x)) - 2
        s, pb, _, d = window_params(nsp, v.attr("strides") or (), v.attr("pads") or (), v.attr("dilations") or ())
        if any(p < 0 for p in pb):
            return None
        data = np.asarray(self.constant_value(w), dtype=np.float64)
        if data.size == 0 or not np.all(np.isfinite(data)):
            return None  # no norm to take: the intervals alone bound it
        return x, data, s, pb, d, int(v.attr("groups") or 1)

    def torus(self, v: Value) -> tuple[int, ...]:
        """The torus convolution ``v`` is bounded on: it holds the padded input and every window the outputs
        read, so nothing wraps; a multiple of the strides, so the outputs kept are a subsampled torus."""
        x, w, s, pb, d, _ = self._conv_parts(v)  # type: ignore[misc]
        return tuple(-(-max(p + n, (o - 1) * sj + (k - 1) * dj + 1) // sj) * sj
                     for p, n, o, sj, k, dj in zip(pb, shape_of(x)[2:], shape_of(v)[2:], s, w.shape[2:], d,
                                                   strict=True))

    def weight_key(self, v: Value) -> str:
        """Convolution ``v``'s weights by their values: a constant's hash, or for weights computed from one
        (an FP16 program rounds them with a cast) a digest of the values, so the engines of a probe and of
        every round of an FP16 plan share the norms of the same weights."""
        w_const = v.operands[1]
        if w_const.is_const and w_const.const_hash:
            return w_const.const_hash
        if v not in self.weight_keys:
            w = self._conv_parts(v)[1]  # type: ignore[index]
            digest = hashlib.sha1(np.ascontiguousarray(w).tobytes()).hexdigest()
            self.weight_keys[v] = f"values:{digest}:{'x'.join(str(n) for n in w.shape)}"
        return self.weight_keys[v]

    def _sigma(self, v: Value) -> tuple[float, float] | None:
        parts = self._conv_parts(v)
        if parts is None:
            return None
        _, w, s, _, d, groups = parts
        torus = self.torus(v)
        key = (self.weight_key(v), torus, tuple(d), groups, tuple(s))
        hit = self.sigmas.get(key)
        if hit is None:  # (charged once per engine, whether or not another engine computed it)
            def compute() -> tuple[float, float]:
                with np.errstate(all="ignore"):
                    try:
                        return conv_sigma(w, torus, tuple(d), groups, tuple(s)), abs_sigma(w, groups)
                    except np.linalg.LinAlgError:  # weights so large their Gram matrix overflows
                        return math.inf, math.inf

            hit = self.sigmas[key] = cached(("sigma", *key), compute)
            self.units += sigma_units(w.shape, torus, groups, tuple(s))
        return hit

    def _conv(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        parts = self._conv_parts(v)
        sig = self._sigma(v)
        if parts is None or sig is None:
            return None
        x, w, s, _, d, _ = parts
        inner = self.window(x, conv_input_window(w, s, d, win), values)
        if inner is None:
            return None
        n = math.prod(int(k) for k in w.shape[1:])
        acc = acc_type(x.dtype)
        sigma, sigma_abs = sig
        tiny = n * I.smallest_subnormal(acc) * math.sqrt(cells(v, win))
        return ((inner * (sigma + I.gamma(n + 1, unit(acc)) * sigma_abs) + tiny) * (1 + unit(v.dtype))
                + underflow(v, win)) * SLACK

    # -- facts per element -----------------------------------------------------------------------------------
    def element_bound(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        """A bound on ``|v|`` per element before its rounding into ``v``'s type, and after."""
        shape = shape_of(v)
        if v not in self.live or v.is_param or not v.dtype.is_float:
            return None
        if v.op == "reduce_mean":
            return self._spatial_mean(v, values)
        if len(shape) < 3:
            return None
        if v.op == "conv":
            return self._conv_elements(v, values)
        if v.op in ("add", "sub", "relu", "max_pool", "avg_pool", "cast", "mul", "div", "clip", "max", "min",
                    "batch_norm"):
            bound = self.window(v, (1,) * (len(shape) - 2), values)
            if bound is None:
                return None
            arr = np.full((1,) * len(shape), bound)
            return arr, arr
        return None

    def element_span(self, v: Value, values: Mapping[Value, Interval]) -> tuple[Interval, Interval] | None:
        """An interval of ``v`` per element before and after its rounding beyond what magnitudes give (none
        here: see :class:`verify.probe.centered.CenteredWindows`)."""
        return None

    def _spatial_mean(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        """A global average pool (a mean over every spatial axis): the channels' means have an ℓ2 norm of at
        most the input's over the whole image over ``√(positions)`` (Cauchy–Schwarz), so does each one."""
        x = v.operands[0]
        rank = len(shape_of(x))
        axes = sorted(int(a) % rank for a in (v.attr("axes") or ()))
        if rank < 3 or axes != list(range(2, rank)) or not v.dtype.is_float:
            return None
        cells = math.prod(shape_of(x)[2:])
        inner = self.window(x, shape_of(x)[2:], values)
        if inner is None:
            return None
        acc = acc_type(x.dtype)
        before = inner / math.sqrt(cells) * (1 + I.gamma(cells + 2, unit(acc))) * SLACK
        after = before * (1 + unit(v.dtype)) * SLACK
        return np.full((1,) * len(shape_of(v)), before), np.full((1,) * len(shape_of(v)), after)

    def _conv_elements(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        """``|y_o| <= ‖w_o‖₂·‖x over the receptive field‖₂`` (Cauchy–Schwarz, for the exact products and for
        the rounding's ``Σ|w||x|`` alike)."""
        parts = self._conv_parts(v)
        if parts is None:
            return None
        x, w, _, _, d, _ = parts
        span = tuple((int(k) - 1) * dj + 1 for k, dj in zip(w.shape[2:], d, strict=True))
        field = self.window(x, span, values)
        if field is None:
            return None
        n = math.prod(int(k) for k in w.shape[1:])
        acc = acc_type(x.dtype)
        rows = np.sqrt(np.sum(w.reshape(w.shape[0], -1) ** 2, axis=1)) * SLACK
        before = (rows * field * (1 + I.gamma(n + 1, unit(acc))) + n * I.smallest_subnormal(acc)) * SLACK
        after = (before * (1 + unit(v.dtype)) + I.smallest_subnormal(v.dtype)) * SLACK
        shape = (1, w.shape[0]) + (1,) * (len(shape_of(v)) - 2)
        return before.reshape(shape), after.reshape(shape)


def cached(key: tuple[Any, ...], compute: Callable[[], T]) -> T:
    """What ``compute`` gives, from :data:`norm_cache`, computed and kept there on a miss (``key`` starts with a
    tag naming what is kept)."""
    hit = norm_cache.get(key)
    if hit is None:
        hit = compute()
        if len(norm_cache) >= CACHE_SIZE:
            norm_cache.clear()
        norm_cache[key] = hit
    return hit


def pool_levels(ks: list[int], strides: list[int], dilations: list[int]) -> list[list[int]] | None:
    """How often a pool repeats each input, as level sets: per axis, for ``j = 1, 2, ...``, the positions in
    at least ``j`` windows, written as the factor by which they thin the axis: 1 where every position is
    (or several residues but not all, kept whole: a superset), ``s`` where one residue modulo the stride
    ``s`` is. An input ``i`` lies in ``#{t < k : t ≡ i + pad (mod s)}`` windows along an axis (fewer at the
    edges), so the count at a position is at most the product over the axes of how many levels hold it.
    None for a dilated pool."""
    if any(d != 1 for d in dilations):
        return None
    out = []
    for k, s in zip(ks, strides, strict=True):
        counts = [len(range(r, k, s)) for r in range(s)]  # windows per residue of i + pad
        out.append([1 if sum(c >= j for c in counts) != 1 else s for j in range(1, max(counts) + 1)])
    return out


def pool_weights(ks: list[int], strides: list[int], pads: list[int],
                 dilations: list[int]) -> tuple[tuple[int, ...], ...]:
    """How many windows of a pool each input place lies in, per axis and residue ``r`` of the place modulo
    the stride: ``#{t < k : t·d ≡ r + pad (mod s)}`` (each tap meets the place in at most one window; fewer
    at the edges). The count at a place is at most the product over the axes."""
    return tuple(tuple(sum((t * d - r - p) % s == 0 for t in range(k)) for r in range(s))
                 for k, s, p, d in zip(ks, strides, pads, dilations, strict=True))


def weighted_kernel(w: np.ndarray, strides: list[int], dilations: list[int],
                    weights: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The convolution by ``w`` with its output ``p`` scaled by ``√(Π weights[axis][p mod period])``, as one
    undilated convolution of stride ``stride·period``: an output block per residue (its weights' root times
    ``w``'s taps, placed ``stride·r`` further along), whose operator norm bounds the weighted outputs' norm."""
    w = np.asarray(w, dtype=np.float64)
    o, c = int(w.shape[0]), int(w.shape[1])
    ks = [int(k) for k in w.shape[2:]]
    period = [len(p) for p in weights]
    extent = [(k - 1) * d + 1 + s * (n - 1) for k, d, s, n in zip(ks, dilations, strides, period, strict=True)]
    residues = list(itertools.product(*(range(n) for n in period)))
    big = np.zeros((len(residues) * o, c, *extent))
    for b, res in enumerate(residues):
        scale = math.sqrt(math.prod(weights[a][r] for a, r in enumerate(res)))
        at = [slice(s * r, s * r + (k - 1) * d + 1, d) for s, r, k, d in zip(strides, res, ks, dilations, strict=True)]
        big[(slice(b * o, (b + 1) * o), slice(None), *at)] = scale * w
    return big


def phase_stacked(w: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """An undilated convolution of ``strides`` as the stride-1 one on the torus ``strides`` times coarser that
    reads every phase of the input as channels of its own (``[O, Π strides · C, *ceil(k / s)]``, phases
    major): the same operator up to the order of the input's coordinates, so the same norm, whose Gram
    matrix (:func:`conv_sigma`) can be taken on the input side when it is the smaller."""
    w = np.asarray(w, dtype=np.float64)
    o, c = int(w.shape[0]), int(w.shape[1])
    ks = [int(k) for k in w.shape[2:]]
    coarse = [-(-k // s) for k, s in zip(ks, strides, strict=True)]
    phases = list(itertools.product(*(range(s) for s in strides)))
    out = np.zeros((o, len(phases) * c, *coarse))
    for p, ph in enumerate(phases):
        taps = tuple(slice(a, k, s) for a, k, s in zip(ph, ks, strides, strict=True))
        part = w[(slice(None), slice(None), *taps)]
        out[(slice(None), slice(p * c, (p + 1) * c), *(slice(0, n) for n in part.shape[2:]))] = part
    return out


@dataclass(frozen=True)
class Thinned:
    """One place in ``period`` per axis kept (any residue class), the others dropped."""

    period: tuple[int, ...]
    tag = "thinned"
    weights = None
    largest = 1.0

    @property
    def trivial(self) -> bool:
        return all(t == 1 for t in self.period)


@dataclass(frozen=True)
class Weighted:
    """Every place's square weighted by ``Π weights[axis][place mod period]`` (:func:`pool_weights`)."""

    weights: tuple[tuple[int, ...], ...]
    tag = "weighted"

    @property
    def period(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.weights)

    @property
    def largest(self) -> float:
        """The root of the largest weight: what a term bounded over the whole window becomes."""
        return math.sqrt(math.prod(max(p) for p in self.weights))

    @property
    def trivial(self) -> bool:
        return all(x == 1 for p in self.weights for x in p)


def clamp_window(v: Value, win: Window) -> Window | None:
    """``win`` within ``v``'s spatial extents (None: ``v`` is not an NC* value of that rank)."""
    shape = shape_of(v)
    if len(shape) < 3 or len(win) != len(shape) - 2:
        return None
    return tuple(max(1, min(int(a), n)) for a, n in zip(win, shape[2:], strict=True))


def conv_input_window(w: np.ndarray, strides: list[int], dilations: list[int], win: Window) -> Window:
    """The window of a convolution's input that ``win`` outputs read."""
    span = [(int(k) - 1) * dj + 1 for k, dj in zip(w.shape[2:], dilations, strict=True)]
    return tuple((a - 1) * sj + sp for a, sj, sp in zip(win, strides, span, strict=True))


def underflow(v: Value, win: Window) -> float:
    """What rounding into ``v``'s type can add beyond its relative error, over a window: half a subnormal
    step per element (a result below the smallest normal rounds to the nearest subnormal)."""
    return I.smallest_subnormal(v.dtype) * math.sqrt(cells(v, win))


def cells(v: Value, win: Window) -> int:
    """Elements of ``v`` in one window of one sample (all channels)."""
    shape = shape_of(v)
    return shape[1] * math.prod(min(a, n) for a, n in zip(win, shape[2:], strict=True))


def channel_squares(mag: np.ndarray) -> np.ndarray:
    """``Σ_c mag²`` per sample and position, rounded up (``[N, *spatial]``)."""
    sq = np.sum(np.asarray(mag, dtype=np.float64) ** 2, axis=1)
    return sq * (1 + I.gamma(mag.shape[1] + 2, EPS64))


def max_window(sq: np.ndarray, win: Window) -> float:
    """``max`` over samples and windows of ``sqrt`` of the window's sum of ``sq``, rounded up.

    Window sums come from prefix sums: each prefix of nonnegative terms is within ``γ_n`` of its exact
    value, so the difference of two plus ``γ_n`` times their sum bounds the window's exact sum."""
    for j, a in enumerate(win):
        ax = 1 + j
        n = sq.shape[ax]
        pre = np.cumsum(sq, axis=ax)
        pre = np.concatenate([np.zeros_like(np.take(pre, [0], axis=ax)), pre], axis=ax)
        hi, lo = np.take(pre, np.arange(a, n + 1), axis=ax), np.take(pre, np.arange(0, n - a + 1), axis=ax)
        sq = (hi - lo + I.gamma(n + 2, EPS64) * (hi + lo)) * (1 + 4 * EPS64)
    return math.sqrt(float(np.max(sq, initial=0.0))) * SLACK
