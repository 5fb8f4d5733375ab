"""Every runtime test gets its own private cache directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def private_cache(private_cache: Path) -> Path:
    """tests/conftest.py's ``private_cache``, for every test here (each one compiles or loads a library)."""
    return private_cache


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)
