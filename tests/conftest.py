"""Fixtures for tests in every folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CUVIL_CACHE_DIR for this test only (created on first use by the code under test), so a test
    that compiles neither reads nor fills the user's cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(root))
    return root


class _GarbageOutputs:
    """numpy as the library loader sees it, except that a fresh array is filled with 0xFF bytes (a NaN in
    every float type, -1 in every signed integer type): an element a kernel fails to store then shows, where
    the memory of a freed array (another build's output for the same inputs) would have held the right value."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> np.ndarray:
        a = np.empty(*args, **kwargs)
        a.reshape(-1).view(np.uint8).fill(0xFF)  # (a 0-d array viewed as bytes through a 1-d view)
        return a


@pytest.fixture(autouse=True)
def garbage_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every library output starts as garbage (:class:`_GarbageOutputs`), so a schedule compared bit for bit
    with another build cannot pass on what the other build left behind."""
    import cuvil.runtime.loader as loader

    monkeypatch.setattr(loader, "np", _GarbageOutputs())
