"""The O3 pipeline on tiny Hugging Face models imported through torch.export, every application
checked: each obligation is proved. These are the exporters' own idioms (relative-position indices
computed from aranges, shifted windows re-strided, weight-normalized convolutions), which the zoo's
hand-built models do not write."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import cuvil
from tests.frontend.test_hf_models import MODELS, _build
from verify import check_pipeline

SLOW = {"timesformer"}
"""About a minute each (TimeSformer: its first pass over the blocks leaves about 120 cut-point guesses unproved)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(MODELS)])
def test_o3_on_a_tiny_hf_model_is_proved(name: str) -> None:
    model, inputs = _build(name)
    report = check_pipeline(cuvil.import_model(model, inputs), "O3", timeout=60.0)
    statuses = [o.status for o in report.obligations]
    assert statuses and set(statuses) == {"proved"}, report.summary()
