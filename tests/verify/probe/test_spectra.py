"""Certified largest eigenvalues (:func:`verify.probe.spectra.hermitian_top`): the bound is never below the
largest eigenvalue an eigensolver finds and at most the slack above it, whatever the estimates that choose
where Cholesky is tried; non-finite matrices give ``inf``."""

from __future__ import annotations

import numpy as np
import pytest

from verify.probe import spectra as S


def _batch(rng: np.random.Generator, count: int, n: int, kind: str) -> np.ndarray:
    """``count`` Hermitian ``n x n`` matrices: positive semidefinite, indefinite, with a cluster of nearly equal
    largest eigenvalues, or alike but for one whose largest eigenvalue stands out."""
    a = rng.standard_normal((count, n, n)) + 1j * rng.standard_normal((count, n, n))
    if kind == "psd":
        return a @ np.conj(np.swapaxes(a, 1, 2)) / n
    if kind == "indefinite":
        return (a + np.conj(np.swapaxes(a, 1, 2))) / 2
    q, _ = np.linalg.qr(a)
    spectrum = rng.uniform(-1.0, 1.0, (count, n))
    spectrum[:, :4] = 2.0 + 1e-7 * rng.standard_normal((count, 4))  # the top four within 1e-7
    if kind == "spike":
        spectrum[count // 3, 0] = 2.001
    return (q * spectrum[:, None, :]) @ np.conj(np.swapaxes(q, 1, 2))


def _top(h: np.ndarray, norm: float | None = None) -> float:
    norm = float(np.max(np.linalg.norm(h, axis=(1, 2)))) if norm is None else norm
    return S.hermitian_top(lambda rows: h[rows], len(h), h.shape[1] * h.shape[2], norm)


@pytest.mark.parametrize("kind", ["psd", "indefinite", "clustered", "spike"])
@pytest.mark.parametrize("n,count", [(8, 50), (17, 150), (48, 70), (96, 9)])
def test_the_bound_covers_the_largest_eigenvalue(kind: str, n: int, count: int) -> None:
    """Sides below and above :data:`SMALL_SIDE` (solved, certified), more matrices than one Cholesky call
    takes."""
    h = _batch(np.random.default_rng(n + count), count, n, kind)
    exact = float(np.max(np.linalg.eigvalsh(h)))
    bound = _top(h)
    assert exact <= bound <= exact * (1 + 2 * S.TOP_SLACK)


def test_estimates_that_miss_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every estimate far too low: each chunk's factorization fails, its halves are tried down to pairs that are
    solved, and the bound is still the largest eigenvalue."""
    monkeypatch.setattr(S, "lanczos_top", lambda h: np.full(len(h), -5.0))
    for kind in ("psd", "spike"):
        h = _batch(np.random.default_rng(7), 90, 24, kind)
        exact = float(np.max(np.linalg.eigvalsh(h)))
        assert exact <= _top(h) <= exact * (1 + 2 * S.TOP_SLACK)


def test_an_estimate_just_below_the_top_is_not_taken_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates a hair under the true largest eigenvalue, less than the slack: Cholesky at ``t`` above it passes,
    and the bound stays above the eigenvalue (never the estimate)."""
    h = _batch(np.random.default_rng(3), 20, 32, "spike")
    exact = np.max(np.linalg.eigvalsh(h), axis=1)
    monkeypatch.setattr(S, "lanczos_top", lambda m: np.max(np.linalg.eigvalsh(m), axis=1) * (1 - S.TOP_SLACK / 2))
    assert float(np.max(exact)) <= _top(h)


def test_the_lanczos_estimate_is_from_below_and_close() -> None:
    rng = np.random.default_rng(11)
    for kind in ("psd", "indefinite", "spike"):
        h = _batch(rng, 12, 64, kind)
        exact = np.max(np.linalg.eigvalsh(h), axis=1)
        est = S.lanczos_top(h)
        scale = np.max(np.abs(np.linalg.eigvalsh(h)), axis=1)
        assert np.all(est <= exact + 1e-10 * scale)
        assert np.all(est >= exact - 1e-2 * scale)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_matrix_gives_no_bound(bad: float) -> None:
    h = _batch(np.random.default_rng(5), 10, 20, "psd")
    h[6, 2, 2] = bad
    assert _top(h, norm=100.0) == np.inf
