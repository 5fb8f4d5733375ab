"""Fixtures for tests in every folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CUVIL_CACHE_DIR for this test only (created on first use by the code under test), so a test
    that compiles neither reads nor fills the user's cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(root))
    return root
