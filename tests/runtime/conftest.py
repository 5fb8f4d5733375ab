"""Every runtime test gets its own private cache directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CUVIL_CACHE_DIR for this test only (created on first use by the code under test)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(root))
    return root


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)
