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

from lora import Adapter, BaseModel, BaseModule, check_adapter, merged, screen_kernels
from lora.checks import AdapterCheck
from lora.merged import FastScreen, MergedWeight
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


# (block elements, tile elements): one block and tile for the whole merge, or 16-row blocks of 8-row tiles so
# that candidates for the maximum, rows that may overflow and small elements fall in many of each
TILINGS = {"one-tile": (merged.BLOCK_ELEMENTS, merged.TILE_ELEMENTS), "many-tiles": (16 * IN, 8 * IN)}


@pytest.mark.parametrize("tiling", list(TILINGS))
@pytest.mark.parametrize("fan_in_fan_out", [False, True], ids=["out-in", "in-out"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("seed", range(6))
def test_the_screen_decides_what_float64_decides(tmp_path, monkeypatch, seed, dtype, fan_in_fan_out, tiling):
    monkeypatch.setattr(merged, "BLOCK_ELEMENTS", TILINGS[tiling][0])
    monkeypatch.setattr(merged, "TILE_ELEMENTS", TILINGS[tiling][1])
    adapter, base = _pair(tmp_path, seed, dtype, fan_in_fan_out)
    screened = check_adapter(adapter, base, dtype=dtype)
    monkeypatch.setattr(FastScreen, "run", lambda self, high, low: None)  # the float64 path only
    exact = check_adapter(adapter, base, dtype=dtype)
    assert _summary(screened) == _summary(exact)
    rules = {f.rule for f in exact.findings}
    assert "lora-merge-overflow" in rules and "lora-merge-precision" in rules  # the thresholds were reached
    report = screened.modules[0]
    assert report.bound_max is not None and report.merged_max is not None
    assert report.bound_max >= report.merged_max


def test_a_merge_whose_float32_sums_overflow_is_left_to_float64(tmp_path, monkeypatch):
    """Products past float32's range make an element inf (or NaN) in float32 where its exact value is 0:
    the error bound no longer holds there, so the screen must not name the largest element (it would
    miss W's 1.0) nor clear any row."""
    a = np.zeros((2, IN), np.float32)
    b = np.zeros((OUT, 2), np.float32)
    a[:, 0], b[0] = [2e19, -2e19], [2e19, 2e19]  # s·B[0]·A[:, 0] = 4e38 - 4e38 = 0, each product overflows float32
    w = np.zeros((OUT, IN), np.float32)
    w[1, 1] = 1.0
    adapter, base = _write_adapter(tmp_path, a, b, 2), BaseModel({"layer.proj": BaseModule("layer.proj", "linear", w)})
    merge = MergedWeight(base.modules["layer.proj"], a, b, 1.0)
    assert FastScreen(merge).run(*_thresholds("fp16")) is None
    screened = check_adapter(adapter, base, dtype="fp16")
    monkeypatch.setattr(FastScreen, "run", lambda self, high, low: None)
    exact = check_adapter(adapter, base, dtype="fp16")
    assert _summary(screened) == _summary(exact)
    assert screened.modules[0].merged_max == 1.0


@pytest.mark.parametrize("x", [1.0, 1.0 + 2.0 ** -30, 1.0 - 2.0 ** -30, 2.0 ** -126 * (1 + 2.0 ** -40), 1e-45, 0.0,
                               -1.0 - 2.0 ** -30, 3.3e38, 3.5e38])
def test_thresholds_are_compared_exactly_in_float32(x):
    """numpy rounds a float to float32 before comparing it with a float32 array, which can put the one
    float32 value next to a threshold on the wrong side: the screen compares with the least float32 at
    or above it instead."""
    t = merged._float32_above(x)
    assert float(t) >= x
    assert float(np.nextafter(t, np.float32(-np.inf))) < x
    near = np.array([np.nextafter(t, np.float32(-np.inf)), t], np.float32)
    assert list(near < t) == [float(v) < x for v in near]
    assert list(near >= t) == [float(v) >= x for v in near]


def test_blas_runs_on_one_thread_inside_the_block_and_is_restored_after():
    counts = screen_kernels._thread_counts()
    before = [c.get() for c in counts]
    with screen_kernels.single_threaded_blas():
        with screen_kernels.single_threaded_blas():
            assert all(c.get() == 1 for c in counts)
        assert all(c.get() == 1 for c in counts)
    assert [c.get() for c in counts] == before


def _write_adapter(directory: Path, a: np.ndarray, b: np.ndarray, alpha: float) -> Adapter:
    write_safetensors(directory / "adapter_model.safetensors", {"base_model.model.layer.proj.lora_A.weight": a,
                                                                "base_model.model.layer.proj.lora_B.weight": b})
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": a.shape[0], "lora_alpha": alpha, "target_modules": ["proj"]}))
    return Adapter(directory)


@pytest.mark.parametrize("tiling", list(TILINGS))
def test_an_element_float32_rounds_up_to_the_smallest_normal_is_still_checked(tmp_path, monkeypatch, tiling):
    """W = -768 plus updates 768, e + d and -d (units of u = 2^-24: e = 307.5 - 2^-10, d = 358): the exact
    merge is e, subnormal in fp16 and rounded by more than its precision, but float32 sums 768 + e + d up to
    768 + 2^-14 (a step there is 1024 u) and keeps it there, so the float32 merge is exactly fp16's smallest
    normal: only the screen's error margin sends it to the exact computation."""
    monkeypatch.setattr(merged, "BLOCK_ELEMENTS", TILINGS[tiling][0])
    monkeypatch.setattr(merged, "TILE_ELEMENTS", TILINGS[tiling][1])
    u = 2.0 ** -24
    e, d = (307.5 - 2.0 ** -10) * u, 358 * u
    a = np.zeros((3, IN), np.float32)
    b = np.zeros((OUT, 3), np.float32)
    a[:, 7], b[50] = 1.0, [768.0, e + d, -d]
    rng = np.random.default_rng(0)
    w = (rng.uniform(0.01, 0.1, (OUT, IN)) * rng.choice([-1, 1], (OUT, IN))).astype(np.float32)  # all normal
    w[50, 7] = -768.0
    adapter = _write_adapter(tmp_path, a, b, 3)
    base = BaseModel({"layer.proj": BaseModule("layer.proj", "linear", w)})
    screened = check_adapter(adapter, base, dtype="fp16")
    monkeypatch.setattr(FastScreen, "run", lambda self, high, low: None)
    exact = check_adapter(adapter, base, dtype="fp16")
    assert _summary(screened) == _summary(exact)
    assert [(f.rule, [e["index"] for e in f.elements]) for f in exact.findings] == [("lora-merge-precision",
                                                                                     [[50, 7]])]
