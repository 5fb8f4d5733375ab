"""Merges in the precision that ships (float16, bfloat16): for every architecture and LoRA kind, each
adapted op of the merged model stays within the certificate's per-op bound of the unmerged op on the very
input that op sees inside the model, the end-to-end bound (where stated) holds between the merged and
unmerged models, and both stay close to PEFT's own unmerged forward pass in the same precision."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_models import peft, peft_wrapped

import cuvil
from cuvil.interp import evaluate_values, run_reference
from lora import Adapter, BaseModel
from lora.attach import WeightedAdapter
from lora.merge import LoraMerge, merge_adapters, site_programs

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CASES = {
    "bert lora": ("bert", {}),
    "gpt2 lora (fan_in_fan_out)": ("gpt2", {}),
    "llama dora": ("llama", {"use_dora": True}),
    "llama embedding": ("llama", {"target_modules": ["embed_tokens", "q_proj"]}),
    "vit rslora": ("vit", {"use_rslora": True, "r": 16}),
}
PEFT_CLOSE = {"fp16": 1e-2, "bf16": 5e-2}
"""Largest relative distance to PEFT's unmerged forward pass in that precision: PyTorch rounds in
different places (it is an oracle here, not a bound)."""


def _inputs(name: str, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return (torch.randn(2, 3, 8, 8, generator=g).clamp(-1, 1).to(dtype),)
    return (torch.randint(0, 64, (2, 5), generator=g),)


def _feed(t: torch.Tensor) -> np.ndarray:
    from cuvil.arrays import from_torch

    return np.array(from_torch(t))


def _case(name: str, variant: dict, precision: str, directory: Path):
    """The base in ``precision``, the adapter (saved in float32, as trained) and PEFT's unmerged outputs with
    the adapted model in ``precision``."""
    base, pm = peft_wrapped(name, variant, directory)
    pm = pm.to(DTYPES[precision])
    with torch.no_grad():
        wants = [pm(*_inputs(name, DTYPES[precision], seed))[0].float().numpy() for seed in (0, 1)]
    return base.to(DTYPES[precision]), Adapter(directory), wants


def _per_op_within_bound(result: LoraMerge, base: BaseModel, adapter: Adapter, feed: list[np.ndarray]) -> int:
    """Every adapted op, merged and unmerged on the input it sees in the unmerged model: the difference
    within the per-op bound. Returns how many ops were checked."""
    values = evaluate_values(result.unmerged.main, result.unmerged.constants,
                             {p.name: x for p, x in zip(result.unmerged.main.params, feed, strict=True)})
    bounds = {(b.module, b.site): b for b in result.bounds}
    checked = 0
    for att in result.attachments:
        for k, site in enumerate(att.attached):
            x = np.asarray(values[site.operands[0 if site.op == "matmul" else 1]])
            unmerged, merged = site_programs(site, att, base, WeightedAdapter(adapter), result.unmerged.constants)
            got = np.asarray(run_reference(merged, [x])[0], dtype=np.float64)
            want = np.asarray(run_reference(unmerged, [x])[0], dtype=np.float64)
            bound = bounds[(att.module, k)]
            scale = 1.0 if bound.kind == "embedding" else np.max(np.abs(x.astype(np.float64)), axis=-1,
                                                                    keepdims=True)
            assert np.all(np.abs(got - want) <= bound.per_unit * scale), (att.module, k)
            checked += 1
    return checked


@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_half_precision_merge_keeps_its_bounds(case: str, precision: str, tmp_path: Path) -> None:
    name, variant = CASES[case]
    base, adapter, wants = _case(name, variant, precision, tmp_path / "adapter")
    module = cuvil.import_model(base, example_inputs=_inputs(name, DTYPES[precision], 0))
    box = {module.main.params[0].name: (-1.0, 1.0) if name == "vit" else (0.0, 63.0)}
    base_model = BaseModel.from_torch(base)
    result = merge_adapters(module, base_model, adapter, dtype=precision, ranges=box)
    assert result.verification.proved, result.verification.summary()
    assert result.model_bound is not None and result.certificate()["lora"]["error_bound"]["model"] is not None
    checked = 0
    for seed, want in enumerate(wants):
        feed = [_feed(t) for t in _inputs(name, DTYPES[precision], seed)]
        checked += _per_op_within_bound(result, base_model, adapter, feed)
        merged = np.asarray(run_reference(result.merged, feed)[0], dtype=np.float64)
        unmerged = np.asarray(run_reference(result.unmerged, feed)[0], dtype=np.float64)
        assert np.all(np.abs(merged - unmerged) <= result.model_bound.outputs[0])
        for got in (merged, unmerged):
            assert np.max(np.abs(got - want)) <= PEFT_CLOSE[precision] * np.max(np.abs(want))
    assert checked == 2 * sum(len(a.attached) for a in result.attachments) > 0


def test_the_end_to_end_bound_is_tight_enough_to_use_without_a_normalization_after_the_adapter(tmp_path):
    """A float16 MLP adapted in its first layer: the end-to-end bound is finite, holds on 1,000 inputs in the
    box, and is within a few orders of magnitude of what is seen (nothing in between needs an interval width)."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(init_lora_weights=False, r=4, lora_alpha=8,
                                                                        target_modules=["0"]))
        pm.save_pretrained(tmp_path / "adapter")
    half = model.half()
    module = cuvil.import_model(half, example_inputs=(torch.zeros(8, 32, dtype=torch.float16),))
    box = {module.main.params[0].name: (-2.0, 2.0)}
    result = merge_adapters(module, BaseModel.from_torch(half), Adapter(tmp_path / "adapter"), dtype="fp16",
                            ranges=box)
    assert result.model_bound is not None
    bound = result.model_bound.outputs[0]
    assert np.all(np.isfinite(bound))
    x = np.random.default_rng(0).uniform(-2, 2, (1000, 8, 32)).astype(np.float16)
    seen = 0.0
    for row in x[:125]:  # the reference interpreter, 125 batches of 8
        d = np.abs(np.asarray(run_reference(result.merged, [row])[0], np.float64)
                   - np.asarray(run_reference(result.unmerged, [row])[0], np.float64))
        assert np.all(d <= bound)
        seen = max(seen, float(d.max()))
    assert 0 < seen and result.model_bound.max_abs < 1e4 * seen
