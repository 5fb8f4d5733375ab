"""Certified largest eigenvalues of many Hermitian matrices: the operator norms of convolutions and residual
blocks are the largest eigenvalue of one matrix per frequency of a torus, hundreds to thousands of them.

An eigensolver gives every eigenvalue; a bound needs only that none exceeds ``t``, which a Cholesky
factorization of ``tI - H`` shows in about a third of the time, its backward error bounded. A few Lanczos
steps guess ``t``; the guess decides only where the factorization is tried, never what is claimed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from verify.probe import interval as I

EPS64 = 2.0 ** -53

CHUNK = 1 << 22
"""Complex entries of the matrices formed at once (64 MiB)."""

TOP_SLACK = 2.0 ** -12
"""How far above the largest eigenvalue estimated so far :func:`hermitian_top` asks Cholesky to certify."""

TOP_SAMPLES = 16
"""Matrices, spread over the rows, whose estimates set the first ``t``."""

CERTIFY_ROWS = 64
"""Matrices one Cholesky call certifies at once (a failing call is split in halves)."""

SMALL_SIDE = 16
"""Matrices up to this side are solved outright: an eigensolve costs little more than a factorization."""


def hermitian_top(build: Callable[[np.ndarray], np.ndarray], count: int, size: int, norm_bound: float) -> float:
    """An upper bound on the largest eigenvalue of Hermitian matrices: ``build(rows)`` gives those of an index
    array of ``rows`` in ``range(count)`` (``[F·g, n, n]``, ``size`` entries per row, built a chunk at a time
    into a fresh array, which is negated in place and restored; ``norm_bound`` bounds each one's norm), the
    float64 error of finding it included, not of forming them.

    Matrices up to :data:`SMALL_SIDE` are solved outright. Larger ones are certified below ``t`` by a Cholesky
    factorization of ``tI - H`` (about a third of an eigensolve): one that succeeds is exact for ``tI - H + Δ``
    with ``‖Δ‖ <= γ‖R‖_F²`` (the backward error of Cholesky, ``R`` its factor), so ``λ_max(H) <= t + γ‖R‖_F²``.
    ``t`` starts at the largest estimate (:func:`lanczos_top`, from below) on :data:`TOP_SAMPLES` of them plus
    :data:`TOP_SLACK`; a chunk it does not cover is estimated and ``t`` raised, and where one still fails, its
    halves are tried in turn, down to a pair that is solved, and ``t`` rises to what it holds. Non-finite
    matrices give ``inf``."""
    eig_err = 1e-10 * norm_bound
    rows = max(1, min(CERTIFY_ROWS, CHUNK // max(1, size)))
    top, t = -math.inf, eig_err

    def factors(h: np.ndarray) -> bool:
        """Whether ``tI - H`` factors for every matrix of ``h`` (then ``top`` covers them)."""
        nonlocal top
        found = cholesky_top(h, t, norm_bound)
        if found is not None:
            top = max(top, found)
        return found is not None

    def certify(h: np.ndarray) -> None:
        nonlocal top, t
        if factors(h):
            return
        if len(h) > 2:
            half = len(h) // 2
            certify(h[:half])
            certify(h[half:])
            return
        lam = float(np.max(np.linalg.eigvalsh(h))) + eig_err
        top, t = max(top, lam), max(t, lam * (1 + TOP_SLACK))

    sample = build(np.arange(0, count, max(1, count // TOP_SAMPLES)))
    if not np.all(np.isfinite(sample)):
        return math.inf
    small = sample.shape[-1] <= SMALL_SIDE
    if not small:
        t = max(t, float(np.max(lanczos_top(sample))) * (1 + TOP_SLACK))
    for start in range(0, count, rows):
        h = build(np.arange(start, min(count, start + rows)))
        if not np.all(np.isfinite(h)):
            return math.inf
        if small:
            top = max(top, float(np.max(np.linalg.eigvalsh(h))) + eig_err)
        elif not factors(h):  # estimated where the largest so far does not cover a chunk
            t = max(t, float(np.max(lanczos_top(h))) * (1 + TOP_SLACK))
            certify(h)
    return top


def cholesky_top(h: np.ndarray, t: float, norm_bound: float) -> float | None:
    """A certified upper bound, just above ``t``, on the largest eigenvalue of each Hermitian matrix of ``h``
    (``[F, n, n]``, each of norm at most ``norm_bound``) where a Cholesky factorization of ``tI - H`` succeeds for
    all of them, else None (``h`` restored exactly; after a success it holds ``tI - H``). The factorization is
    exact for ``tI - H + Δ``, ``‖Δ‖ <= γ‖R‖_F²`` (its backward error, ``R`` the factor)."""
    n = int(h.shape[-1])
    gamma, idx = I.gamma(4 * n + 16, EPS64), np.arange(n)
    diag = h[:, idx, idx].copy()
    np.negative(h, out=h)
    h[:, idx, idx] += t  # tI - H in place (undone exactly below)
    try:
        np.linalg.cholesky(h)
    except np.linalg.LinAlgError:
        np.negative(h, out=h)
        h[:, idx, idx] = diag
        return None
    # ‖R‖_F² = tr(RRᴴ) = tr(tI - H) + tr(Δ), |tr(Δ)| <= γ‖R‖_F²
    frob = float(np.max(np.sum(np.real(h[:, idx, idx]), axis=1))) / (1 - gamma) * (1 + 1e-9)
    return t + gamma * frob + EPS64 * (t + norm_bound)  # (and forming tI - H)


LANCZOS_STEPS = 32
"""Lanczos steps :func:`lanczos_top` takes: its largest Ritz value then lands within the slack of the largest
eigenvalue on the matrices measured, so Cholesky rarely fails at ``t``."""


def lanczos_top(h: np.ndarray, steps: int = LANCZOS_STEPS) -> np.ndarray:
    """An estimate (from below) of each Hermitian matrix's largest eigenvalue: the largest Ritz value of
    ``steps`` Lanczos steps from a fixed start (without reorthogonalization: lost orthogonality
    repeats eigenvalues, it does not move the largest), so the same matrices give the same estimate. It only
    chooses where Cholesky certifies; it bounds nothing."""
    f, n = int(h.shape[0]), int(h.shape[-1])
    k = min(n, steps)
    alpha, beta = np.zeros((f, k)), np.zeros((f, k))
    v = (np.ones(n) + np.linspace(0.0, 1.0, n)).astype(h.dtype)[None, :].repeat(f, axis=0)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    prev = np.zeros_like(v)
    for j in range(k):
        w = (h @ v[:, :, None])[:, :, 0]
        alpha[:, j] = np.real(np.sum(np.conj(v) * w, axis=1))
        w -= alpha[:, j, None] * v + (beta[:, j - 1, None] * prev if j else 0.0)
        norm = np.linalg.norm(w, axis=1)
        beta[:, j] = norm
        prev, v = v, w / np.where(norm > 0, norm, 1.0)[:, None]
    tri = np.zeros((f, k, k))
    idx = np.arange(k)
    tri[:, idx, idx] = alpha
    tri[:, idx[:-1], idx[1:]] = beta[:, :-1]
    tri[:, idx[1:], idx[:-1]] = beta[:, :-1]
    return np.max(np.linalg.eigvalsh(tri), axis=1)
