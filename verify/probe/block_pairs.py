"""Two residual blocks at once: a bound on ``‖B₂·D·B₁‖`` over every ReLU slope pattern that is well below the
product of each block's own bound.

``B₁ = P + W₁₂D₁W₁₁`` (``P`` the identity, or a halving block's stride-2 1x1 projection), ``D`` the ReLU after
the first block's sum (its slopes, and the zero padding the second block reads, each in [0, 1]) and ``B₂ = I +
W₂₂D₂W₂₁``, circular convolutions on a torus where no read wraps onto the grid. Per block, every slope
pattern may send its output along the next block's worst direction, so composing the blocks' bounds pays
that at every block (ResNet-18: 1.63-1.85 per block where an adversary's input is amplified about 0.75x).

The bound is a certificate in the manner of LipSDP. For unit ``x`` and ``y``, with ``u₁ = W₁₁x``, ``z₁ = D₁u₁``,
``u = Px + W₁₂z₁``, ``z = Du``, ``u₂ = W₂₁z``, ``z₂ = D₂u₂``: ``yᵀB₂DB₁x = yᵀz + yᵀW₂₂z₂``, and every slope in
[0, 1] gives ``zᵢ(uᵢ - zᵢ) >= 0``. So for any ``λ₁, λ, λ₂ > 0``

    yᵀB₂DB₁x <= yᵀz + yᵀW₂₂z₂ + λ₁z₁ᵀ(u₁ - z₁) + λzᵀ(u - z) + λ₂z₂ᵀ(u₂ - z₂),

and the largest the right side can be over free ``z₁`` and ``z₂`` is

    yᵀz + λzᵀPx - λ‖z‖² + ‖W₂₂ᵀy + λ₂W₂₁z‖²/(4λ₂) + ‖λ₁W₁₁x + λW₁₂ᵀz‖²/(4λ₁),

a quadratic form in ``(y, x, z)`` of a block-circulant ``Q``. Where ``Q - ½t·diag(I, I, 0) ≼ 0`` the form is at
most ``½t(‖y‖² + ‖x‖²) = t``: the pair moves by at most ``t``. Per frequency of the torus that is
``λ_max(Q̂(ω) + ½t·diag(0, 0, I)) <= ½t``, certified by Cholesky a chunk of frequencies at a time with the
float64 errors of forming and factoring included (:func:`_certify`); the left side grows by at most half of
what ``t`` grows, so a chunk certified at one ``t`` stays certified at any larger one, and ``t`` only rises.
With one multiplier per ReLU the bound for one block is :func:`relu_block_sigma`'s (``λ = β⁻¹``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verify.probe import interval as I
from verify.probe.spectra import CERTIFY_ROWS, CHUNK, EPS64, LANCZOS_STEPS, TOP_SAMPLES, cholesky_top, lanczos_top
from verify.probe.windows import NORM_FACTOR, TapForm, _adjoint, _phase_taps, half_frequencies, kernel_taps

EXPONENTS = ((0.58, 0.36, 0.5), (0.8, 0.6, 1.0), (1.0, 1.0, 1.0))
"""The multipliers tried, in order, as exponents ``(p, q, r)``: with ``a = σ(W₁₁)σ(W₁₂)`` and ``b = σ(W₂₁)σ(W₂₂)`` the
branches' gains, ``λ = ((1 + b)/(1 + a))^r``, ``λ₁ = λ(1 + a)^p·σ(W₁₂)/σ(W₁₁)`` and ``λ₂ = λ(1 + b)^-q·σ(W₂₂)/σ(W₂₁)``
(a kernel scaled up and the next one down, which changes nothing a ReLU passes, changes nothing here). Any
positive values give a sound bound; a choice is skipped where ``Q̂``'s last block is not surely negative (its
norm bound ``¼λ₂σ(W₂₁)² + λ²σ(W₁₂)²/(4λ₁) >= λ``) and where its bound is not below ``start``. The first are within
1 % of the best a search found on ResNet-18's first two pairs (gains about 1.5: 2.568 and 2.252 against 2.555
and 2.245; the blocks' products 3.250 and 3.033); the second the best of a grid on random kernels of gains 5 to 8,
where the first are infeasible; the third the best where every kernel is
a scalar multiple of the identity (the bound is then ``(1 + a)(1 + b)``, reached)."""

FIXED_POINT_STEPS = 8
"""Fixed-point steps of the estimate of ``t`` (on ResNet-18 each leaves about half of the distance)."""

TOLERANCE = 1e-3
"""Relative change of ``t`` at which the fixed-point steps stop: well inside :data:`CERTIFY_SLACK`."""

KEPT_ENTRIES = 1 << 23
"""Largest sample (complex entries, 128 MiB) of frequencies the estimate takes: fewer than :data:`TOP_SAMPLES` for
matrices over 724 wide (8 at ResNet-18's widest pair, where 16 took 4.2 s of its 12)."""

GUESS = 0.35
"""Where the estimate starts, as a share of ``start`` (the blocks' chains): ResNet-18's pairs end at 0.30-0.39 of
theirs. The fixed point is the same from any start; a close one takes fewer steps."""

CHUNK_STEPS = 32
"""Lanczos steps of the estimate on a chunk whose certificate failed."""

PAIR_UNITS_MAX = 80_000.0
"""Work units (:func:`pair_units`) the pairs of one analysis may take, in program order; later pairs are left to
their blocks' own bounds. ResNet-18's three take 72,100 (about 20 s here); a deeper network's would otherwise
grow with its depth (ResNet-34 at 64x64, 8 pairs within the width limit: 537 s with another job on the machine)."""

CERTIFY_SLACK = 2.0 ** -7
"""How far above its estimate ``t`` is certified: the estimate comes from below and from a sample of the
frequencies, and the bound certified there is ``t*`` plus about half the excess (ResNet-18: 0.4 %)."""

CERTIFY_ATTEMPTS = 3
"""Raises of ``t`` a chunk whose certificate fails may ask for, each slack 4x the one before."""


def relu_pair_sigma(first: tuple[np.ndarray, np.ndarray, np.ndarray | None], pads_first: tuple[tuple[int, int], ...],
                    second: tuple[np.ndarray, np.ndarray], pads_second: tuple[tuple[int, int], ...],
                    torus: tuple[int, int], sigmas: tuple[float, float, float, float], start: float) -> float | None:
    """An upper bound on ``‖B₂DB₁‖`` over every slope pattern (see the module), or None where the certificate
    fails. ``first``: ``(w₁₁, w₁₂, w_d)`` ([C1, C0, kh, kw], [C2, C1, kh, kw], the halving block's 1x1 [C2, C0, 1,
    1] or None for a stride-1 block with ``C2 = C0``); ``second``: ``(w₂₁, w₂₂)`` mapping C2 -> C3 -> C2, stride 1;
    each block's pads; ``torus`` the output's (a halving block's input on twice it); ``sigmas`` the four
    convolutions' norms (they choose the multipliers); ``start`` a bound the pair's must beat to be returned
    (the blocks' chains' or own bounds' product; the estimates start at :data:`GUESS` of it)."""
    (w11, w12, wd), (w21, w22) = first, second
    w11, w12, w21, w22 = (np.asarray(w, dtype=np.float64) for w in (w11, w12, w21, w22))
    c2, c0 = int(w12.shape[0]), int(w11.shape[1])
    stride = 1 if wd is None else 2
    if (wd is None and c2 != c0) or (int(w21.shape[1]), int(w22.shape[0]), int(w12.shape[1])) != (c2, c2,
                                                                                              int(w11.shape[0])):
        raise ValueError("relu_pair_sigma takes two blocks that chain: C0 -> C1 -> C2, then C2 -> C3 -> C2")
    _, s12, s21, _ = sigmas
    if not all(math.isfinite(s) and s > 0 for s in (*sigmas, start)):
        return None
    skip = np.eye(c0) if wd is None else np.asarray(wd, dtype=np.float64)[:, :, 0, 0]
    omega = half_frequencies(torus)
    for exponents in EXPONENTS:
        try:
            lams = _multipliers(sigmas, exponents)
            lam1, lam, lam2 = lams
            negative = 0.25 * lam2 * s21 * s21 + lam * lam * s12 * s12 / (4 * lam1) < lam
        except ArithmeticError:  # (weights so large or small the multipliers leave the float range)
            continue
        if not (negative and all(math.isfinite(x) and x > 0 for x in lams)):
            continue
        form = _pair_form(w11, w12, skip, w21, w22, pads_first, pads_second, stride, lams)
        found = _bound(form, omega, c2, start)
        if found is not None and found < start:
            return found
    return None


def _multipliers(sigmas: tuple[float, float, float, float], exponents: tuple[float, float, float]
                 ) -> tuple[float, float, float]:
    """``(λ₁, λ, λ₂)`` for the convolutions' norms (see :data:`EXPONENTS`)."""
    s11, s12, s21, s22 = sigmas
    p, q, r = exponents
    a, b = s11 * s12, s21 * s22
    lam = ((1 + b) / (1 + a)) ** r
    return lam * (1 + a) ** p * s12 / s11, lam, lam * (1 + b) ** -q * s22 / s21


def _bound(form: TapForm, omega: np.ndarray, c2: int, start: float) -> float | None:
    """The certified ``t`` for one choice of multipliers (None: the estimate or the certificate failed)."""
    z = slice(form.width - c2, form.width)

    def shifted(rows: np.ndarray, t: float) -> np.ndarray:
        h = form(omega[rows])
        idx = np.arange(z.start, z.stop)
        h[:, idx, idx] += 0.5 * t
        return h

    t = _estimate(shifted, len(omega), form.width, c2, GUESS * start)
    return _certify(shifted, len(omega), form.width, c2, t, lambda t: form.norm + 0.5 * t,
                    lambda t: form.error + 2 * EPS64 * (t + form.norm) * math.sqrt(c2))  # (and the shift's)


def _pair_form(w11: np.ndarray, w12: np.ndarray, skip: np.ndarray, w21: np.ndarray, w22: np.ndarray,
               pads_first: tuple[tuple[int, int], ...], pads_second: tuple[tuple[int, int], ...], stride: int,
               lams: tuple[float, float, float]) -> TapForm:
    """``Q̂(ω)`` over ``(y, x, z)``, ``x`` split into the phases of the first block's input (one for stride 1)."""
    lam1, lam, lam2 = lams
    t12, t21, t22 = kernel_taps(w12, pads_first[1]), kernel_taps(w21, pads_second[0]), kernel_taps(w22, pads_second[1])
    phases = _phase_taps(w11, pads_first[0], stride)
    c2, c0 = int(w12.shape[0]), int(w11.shape[1])
    at = [c2 + p * c0 for p in range(len(phases))]
    zc = c2 + len(phases) * c0
    parts = [(0, 0, 0.25 / lam2, t22, _adjoint(t22)), (0, zc, 0.25, t22, t21),
             (zc, zc, 0.25 * lam2, _adjoint(t21), t21), (zc, zc, 0.25 * lam * lam / lam1, t12, _adjoint(t12))]
    parts += [(at[p], at[q], 0.25 * lam1, _adjoint(phases[p]), phases[q])
              for p in range(len(phases)) for q in range(p, len(phases)) if phases[p] and phases[q]]
    parts += [(at[p], zc, 0.25 * lam, _adjoint(ph), _adjoint(t12)) for p, ph in enumerate(phases) if ph]
    constants = [(0, zc, 0.5 * np.eye(c2)), (at[0], zc, 0.5 * lam * skip.T), (zc, zc, -lam * np.eye(c2))]
    return TapForm(zc + c2, parts, constants)


def _certify(build: Callable[[np.ndarray, float], np.ndarray], count: int, width: int, shifted_width: int, t: float,
             norm_bound: Callable[[float], float], error: Callable[[float], float]) -> float | None:
    """The smallest ``t`` this finds with ``λ_max(Q̂(ω) + ½t·Z) <= ½t`` certified at every frequency, or None.

    The frequencies are certified a chunk at a time (:func:`cholesky_top` at ``½t`` less the error of forming
    the matrices), ``t`` only ever rising: a chunk certified at one ``t`` stays certified at any larger one
    (``λ_max`` grows by at most half what ``t`` grows). Where a chunk fails, its own fixed point is estimated
    (:func:`_fixed_point`, more Lanczos steps) and ``t`` raised above it, by a larger slack each time."""
    per = max(1, min(CERTIFY_ROWS, CHUNK // (width * width)))
    for start in range(0, count, per):
        rows = np.arange(start, min(count, start + per))
        for attempt in range(CERTIFY_ATTEMPTS + 1):
            h = build(rows, t)
            if not np.all(np.isfinite(h)):
                return None
            below = 0.5 * t - error(t)
            # (factored that far below: Cholesky's backward error is at most γ‖R‖_F² <= γ·width·(½t + ‖Q̂‖))
            margin = 2 * (I.gamma(4 * width + 16, EPS64) * width + EPS64) * (below + norm_bound(t))
            top = cholesky_top(h, below - margin, norm_bound(t))
            if top is not None and top <= below:
                break
            if attempt == CERTIFY_ATTEMPTS:
                return None
            own = _fixed_point(lambda t, rows=rows: build(rows, t), shifted_width, t, CHUNK_STEPS)
            t = max(t, own) * (1 + CERTIFY_SLACK * 4 ** attempt)
    return t * (1 + 1e-12)


def _fixed_point(build: Callable[[float], np.ndarray], shifted_width: int, t: float, steps: int) -> float:
    """``t = 2·max λ_max(Q̂ + ½t·Z)`` over the matrices ``build`` forms, estimated from below by fixed-point steps
    from ``t`` (formed once, then shifted in place), each largest eigenvalue by ``steps`` Lanczos steps: the
    largest eigenvalue grows with ``t`` by at most ``½``, so the steps approach the fixed point from either side
    (on ResNet-18 each leaves about half of the distance)."""
    h = build(t)
    width = int(h.shape[-1])
    idx = np.arange(width - shifted_width, width)
    at, seen = t, [t]
    for _ in range(FIXED_POINT_STEPS):
        h[:, idx, idx] += 0.5 * (t - at)
        at = t
        new = 2 * float(np.max(lanczos_top(h, steps)))
        if not math.isfinite(new):
            return t
        done, t = abs(new - t) <= TOLERANCE * t, new
        if done:
            break
        seen.append(t)
        if len(seen) == 3:  # a geometric approach: jump to its limit (Aitken), and take steps from there
            a, b, c = seen
            if 0 < (c - b) / (b - a) < 0.9 if b != a else False:
                t = c - (c - b) ** 2 / ((c - b) - (b - a))
            seen = [t]
    return t


def _estimate(build: Callable[[np.ndarray, float], np.ndarray], count: int, width: int, shifted_width: int,
              start: float) -> float:
    """Where the certificate starts: the fixed point (:func:`_fixed_point`) on :data:`TOP_SAMPLES` frequencies
    spread over the torus (fewer where they would hold more than :data:`KEPT_ENTRIES`), from ``start``; the
    certificate raises it where a chunk of frequencies needs more."""
    samples = max(1, min(TOP_SAMPLES, KEPT_ENTRIES // (width * width)))
    rows = np.arange(0, count, max(1, count // samples))[:samples]
    return _fixed_point(lambda t: build(rows, t), shifted_width, start, LANCZOS_STEPS)


@dataclass
class PairAllowance:
    """What is left of :data:`PAIR_UNITS_MAX` for one analysis (shared by its passes)."""

    left: float = PAIR_UNITS_MAX

    def take(self, units: float) -> bool:
        """Whether ``units`` more fit (then they are taken)."""
        if units > self.left:
            return False
        self.left -= units
        return True


def pair_units(width: int, torus: tuple[int, int]) -> float:
    """Work units of :func:`relu_pair_sigma`, read from the shapes alone: the certificate costs what a block's
    does at this width (:func:`verify.probe.windows.block_units`), the estimates' Lanczos steps about as much
    again on the samples."""
    freqs = torus[0] * (torus[1] // 2 + 1)
    samples = min(freqs, TOP_SAMPLES)
    estimate = samples * FIXED_POINT_STEPS * LANCZOS_STEPS * width * width * 8
    return NORM_FACTOR * (freqs * width * width * (width + 1760) + estimate) / 5e6
