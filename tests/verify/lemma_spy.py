"""Which lemmas a step of the sweep returns, for tests that assert what it tried."""

from __future__ import annotations

from typing import Any

import pytest

from verify import obligations
from verify.obligations import Lemma


def record_lemmas(monkeypatch: pytest.MonkeyPatch, step: str) -> list[Lemma]:
    """Every lemma ``obligations.<step>`` returns (``_sweep``, ``_view_lemmas``), in the order it returns them."""
    found: list[Lemma] = []
    real = getattr(obligations, step)

    def spy(*args: Any, **kwargs: Any) -> list[Lemma]:
        out = real(*args, **kwargs)
        found.extend(out)
        return out

    monkeypatch.setattr(obligations, step, spy)
    return found
