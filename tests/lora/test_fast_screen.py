"""The float32 screen of a merge decides exactly what the float64 computation decides: the same
elements overflow, the same lose precision, the same largest element, on merges built to sit
within a few float32 roundings of the fp16 and bf16 thresholds (where a screen that trusted
float32 arithmetic would err)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lora import Adapter, BaseModel, BaseModule, check_adapter
from lora.checks import AdapterCheck
from lora.merged import FastScreen
from lora.safetensors_file import write_safetensors

OUT, IN, RANK = 96, 64, 8
NEAR = 160  # elements placed near the smallest normal


def _thresholds(dtype: str) -> tuple[float, float]:
    info = ml_dtypes.finfo(np.float16 if dtype == "fp16" else ml_dtypes.bfloat16)
    return float(info.max) + 2.0 ** (info.maxexp - 1 - info.nmant) / 2, float(info.smallest_normal)


def _pair(tmp_path: Path, seed: int, dtype: str, fan_in_fan_out: bool) -> tuple[Adapter, BaseModel]:
    """A merge whose column 0 comes within the float32 product's error of the overflow threshold in
    every row (so float32 arithmetic alone would decide some rows wrongly); the last two columns have
    a zero update and hold subnormal-range values; ordinary values elsewhere."""
    rng = np.random.default_rng(seed)
    over, tiny = _thresholds(dtype)
    scale = 16 / RANK
    a = (rng.standard_normal((RANK, IN)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((OUT, RANK)) * 0.3).astype(np.float32)
    a[:, -2:] = 0.0
    column = scale * (b.astype(np.float64) @ a[:, 0].astype(np.float64))
    # the update carries a multiple of the threshold and the base weight cancels most of it, so the
    # float32 product's error spans many float32 steps at the threshold (bf16's stays below float32's max)
    carried = 10.0 if dtype == "fp16" else 0.9
    a[:, 0] = (a[:, 0] * (carried * over / np.max(np.abs(column)))).astype(np.float32)
    delta = scale * (b.astype(np.float64) @ a.astype(np.float64))
    targets = rng.standard_normal((OUT, IN)) * 0.05
    width = 1e-6 if dtype == "fp16" else 1e-7
    targets[:, 0] = over * (1 + rng.uniform(-width, width, OUT)) * np.sign(delta[:, 0])
    inner = targets[:, 1:-2].reshape(-1)
    inner[rng.permutation(inner.size)[:NEAR]] = tiny * (1 + rng.uniform(-1e-3, 1e-3, NEAR))
    targets[:, 1:-2] = inner.reshape(OUT, IN - 3)
    small = np.concatenate([tiny * 2.0 ** -rng.integers(1, 12, 20) * (1 + rng.random(20)), np.zeros(4),
                            rng.standard_normal(2 * OUT - 24) * 0.05])
    targets[:, -2:] = rng.permutation(small).reshape(OUT, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = (targets - delta).astype(np.float32)
    if fan_in_fan_out:
        w = np.ascontiguousarray(w.T)
    prefix = "base_model.model.layer.proj"
    write_safetensors(tmp_path / "adapter_model.safetensors", {f"{prefix}.lora_A.weight": a,
                                                               f"{prefix}.lora_B.weight": b})
    (tmp_path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": ["proj"],
        "fan_in_fan_out": fan_in_fan_out}))
    base = BaseModel({"layer.proj": BaseModule("layer.proj", "linear", w, fan_in_fan_out)})
    return Adapter(tmp_path), base


def _summary(check: AdapterCheck) -> list[object]:
    return [[(f.rule, f.severity, f.found, [tuple(e["index"]) for e in f.elements]) for f in check.findings],
            [(m.merged_max, m.rank) for m in check.modules]]


@pytest.mark.parametrize("fan_in_fan_out", [False, True], ids=["out-in", "in-out"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("seed", range(6))
def test_the_screen_decides_what_float64_decides(tmp_path, monkeypatch, seed, dtype, fan_in_fan_out):
    adapter, base = _pair(tmp_path, seed, dtype, fan_in_fan_out)
    screened = check_adapter(adapter, base, dtype=dtype)
    monkeypatch.setattr(FastScreen, "run", lambda self, high, low: None)  # the float64 path only
    exact = check_adapter(adapter, base, dtype=dtype)
    assert _summary(screened) == _summary(exact)
    rules = {f.rule for f in exact.findings}
    assert "lora-merge-overflow" in rules and "lora-merge-precision" in rules  # the thresholds were reached
    assert screened.modules[0].bound_max >= screened.modules[0].merged_max
