"""``python -m bench.transformers``: each model family exports, compiles and runs against ONNX Runtime."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import bench.transformers as bt


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's models at a size a test affords (the families and the export are the bench's own)."""
    monkeypatch.setattr(bt, "HIDDEN", 32)
    monkeypatch.setattr(bt, "TOKENS", 8)
    monkeypatch.setattr(bt, "VOCAB", 64)
    monkeypatch.setattr(bt, "PIXELS", 64)
    monkeypatch.setattr(bt, "AUDIO", 4000)


@pytest.mark.parametrize("name", [*bt.TEXT, "convnextv2-atto", "wav2vec2"])
def test_models_export_compile_and_agree(name: str, tiny: None, tmp_path) -> None:
    """Every text family, and a vision and an audio one (the others are the same export at full size, which
    a test cannot afford)."""
    path = bt.export(name, tmp_path)
    assert path.exists() and bt.export(name, tmp_path) == path  # the second call reads the cache
    row = bt.bench_model(name, path, threads=1, repeat=2, warmup=1)
    assert "error" not in row, row
    assert row["max_diff"] < 1e-3 and row["ratio"] == row["cuvil_ms"] / row["ort_ms"]


def test_an_unknown_model_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        bt.main(["--models", "gpt3"])
    assert "unknown models ['gpt3']" in capsys.readouterr().err
