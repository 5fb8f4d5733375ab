"""Adapters attached to and merged into a compiled model: the unmerged CIR computes what PEFT's own
unmerged forward computes, the merge is proved (``merge-low-rank`` over the reals, ``fold-constants``
bit for bit) and matches PEFT, the merged and unmerged native libraries agree within the
certificate's bound on 1,000 inputs, and what cannot be attached or merged is refused by name."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_models import peft, peft_wrapped, save_adapter

import cuvil
from cuvil.interp import run_reference
from lora import Adapter, AdapterError, BaseModel
from lora.attach import WeightedAdapter, attach
from lora.merge import merge_adapters

CASES = {
    "bert lora": ("bert", {}),
    "bert patterns": ("bert", {"rank_pattern": {"value": 2}, "alpha_pattern": {"value": 3}}),
    "gpt2 lora (fan_in_fan_out)": ("gpt2", {}),
    "llama dora": ("llama", {"use_dora": True}),
    "llama embedding": ("llama", {"target_modules": ["embed_tokens", "q_proj"]}),
    "vit rslora": ("vit", {"use_rslora": True, "r": 16}),
    "vit patch convolution": ("vit", {"target_modules": ["projection", "q_proj"]}),
}


def _inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return (torch.randn(2, 3, 8, 8, generator=g),)
    return (torch.randint(0, 64, (2, 5), generator=g),)


def _peft_case(name: str, variant: dict, directory: Path):
    """The base model (untouched), the saved adapter and PEFT's unmerged outputs on two inputs."""
    base, pm = peft_wrapped(name, variant, directory)
    with torch.no_grad():
        wants = [pm(*_inputs(name, seed))[0].numpy() for seed in (0, 1)]
    return base, Adapter(directory), wants


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_attached_and_merged_models_match_peft_and_the_merge_is_proved(case, tmp_path):
    name, variant = CASES[case]
    base, adapter, wants = _peft_case(name, variant, tmp_path / "adapter")
    module = cuvil.import_model(base, example_inputs=_inputs(name))
    result = merge_adapters(module, BaseModel.from_torch(base), adapter)
    assert result.verification.proved and result.verification.count("proved") >= 2, result.verification.summary()
    assert [a.pass_name for a in result.verification.applications] == ["merge-low-rank", "fold-constants"]
    assert {a.module for a in result.attachments} == set(adapter.lora_modules and
                                                         (m.module for m in adapter.lora_modules))
    for seed, want in enumerate(wants):
        feed = [t.numpy() for t in _inputs(name, seed)]
        assert _rel(run_reference(result.unmerged, feed)[0], want) <= 1e-5
        assert _rel(run_reference(result.merged, feed)[0], want) <= 1e-5
    cert = result.certificate()
    assert cert["summary"]["proved"] == cert["summary"]["obligations"] >= 2
    assert len(cert["lora"]["error_bound"]["sites"]) == sum(len(a.attached) for a in result.attachments)


def test_the_bound_holds_between_merged_and_unmerged_libraries_on_1000_inputs(tmp_path):
    """A linear model whose output is the adapted op: both libraries compiled natively, 1,000 inputs,
    every output within the bound per unit of max|x| (and the box bound for inputs in the box)."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48)).eval()
    saved = save_adapter(copy.deepcopy(model), tmp_path / "adapter", r=8, lora_alpha=16, target_modules=["0"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(1000, 64),))
    result = merge_adapters(module, saved.base, saved.load(), ranges={module.main.params[0].name: (-4.0, 4.0)})
    (site,) = result.bounds
    x = np.random.default_rng(0).uniform(-4, 4, (1000, 64)).astype(np.float32)
    merged = cuvil.compile(result.merged, cache=False)(x)
    unmerged = cuvil.compile(result.unmerged, cache=False)(x)
    diff = np.abs(np.asarray(merged) - np.asarray(unmerged))
    allowed = site.per_unit[None, :] * np.max(np.abs(x), axis=1, keepdims=True)
    assert np.all(diff <= allowed), float(np.max(diff / allowed))
    assert site.absolute is not None and np.all(diff <= site.absolute[None, :])
    assert np.max(diff) > 0 or np.array_equal(merged, unmerged)  # the libraries really are two programs
    assert site.max_absolute is not None and site.max_absolute < 1e-3


def test_a_second_adapter_adds_its_weighted_update(tmp_path):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6)).eval()
    first = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=2, target_modules=["0"])
    torch.manual_seed(5)
    second = save_adapter(copy.deepcopy(model), tmp_path / "b", r=3, lora_alpha=6, target_modules=["0"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(4, 8),))
    result = merge_adapters(module, first.base, [WeightedAdapter(first.load(), 0.25), WeightedAdapter(second.load(),
                                                                                                        -1.5)])
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    w = model[0].weight.detach().double().numpy()
    want = x @ (w + 0.25 * (first.merged["0"] - w) - 1.5 * (second.merged["0"] - w)).T + model[0].bias.detach().numpy()
    assert _rel(run_reference(result.merged, [x])[0], want) <= 1e-5
    assert result.verification.proved


def test_a_weight_the_model_does_not_hold_is_named(tmp_path):
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6)).eval()
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=2, target_modules=["0"])
    with torch.no_grad():
        model[0].weight[0, 0] += 1.0  # the compiled model is not the base the adapter was checked against
    module = cuvil.import_model(model, example_inputs=(torch.zeros(4, 8),))
    with pytest.raises(AdapterError, match=r"the weight of '0' \(linear, shape \[6, 8\]\) is read by no matmul"):
        attach(module, saved.base, [saved.load()])


def test_dora_is_never_combined(tmp_path):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6)).eval()
    dora = save_adapter(copy.deepcopy(model), tmp_path / "d", r=2, lora_alpha=2, target_modules=["0"], use_dora=True)
    plain = save_adapter(copy.deepcopy(model), tmp_path / "p", r=2, lora_alpha=2, target_modules=["0"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(4, 8),))
    with pytest.raises(AdapterError, match="DoRA adapters cannot be combined"):
        attach(module, dora.base, [dora.load(), plain.load()])


def test_a_merge_the_checks_refuse_is_not_made(tmp_path):
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6)).eval()
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=2, target_modules=["0"])
    from lora_models import scale_tensors

    scale_tensors(saved.directory, "lora_B", 1e8)  # merged elements far past the float16 range
    module = cuvil.import_model(model, example_inputs=(torch.zeros(4, 8),))
    with pytest.raises(AdapterError, match=r"fails \d+ check"):
        merge_adapters(module, saved.base, saved.load(), dtype="fp16")
    assert merge_adapters(module, saved.base, saved.load(), dtype="fp32").verification.proved


def test_compile_with_an_adapter_merged_and_unmerged(tmp_path):
    """``cuvil.compile(model, lora=DIR, merge=...)``: both libraries compute PEFT's output; the merged
    one has the merge proved in its certificate, the unmerged one keeps the low-rank products."""
    from verify import make_gate

    base, adapter, wants = _peft_case("gpt2", {}, tmp_path / "adapter")
    ids = _inputs("gpt2")
    gate = make_gate("strict", 60)
    merged = cuvil.compile(base, example_inputs=ids, lora=str(adapter.directory), merge=True, gate=gate, cache=False)
    unmerged = cuvil.compile(base, example_inputs=ids, lora=str(adapter.directory), merge=False, cache=False)
    for lib in (merged, unmerged):
        out = lib(ids[0].numpy())
        assert _rel(np.asarray(out[0] if isinstance(out, (list, tuple)) else out), wants[0]) <= 1e-5
    report = gate.report()
    assert [a.pass_name for a in report.applications][:2] == ["merge-low-rank", "fold-constants"]
    assert report.proved and report.count("proved") >= 2
    factors = {h for m in adapter.lora_modules for h in _factor_hashes(adapter, m)}
    used = {}
    for label, lib in (("merged", merged), ("unmerged", unmerged)):
        used[label] = cuvil.import_model(str(lib.export_ir(tmp_path / f"{label}.cir"))).used_constants()
    assert factors & used["unmerged"] and not factors & used["merged"]


def _factor_hashes(adapter: Adapter, entry) -> set[str]:
    from cuvil.ir.module import content_hash

    return {content_hash(np.asarray(adapter.array(k), dtype=np.float32)) for k in (entry.a, entry.b) if k}


def test_compile_names_what_it_needs_for_a_model_without_module_names(tmp_path):
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6)).eval()
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=2, target_modules=["0"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(4, 8),))
    with pytest.raises(cuvil.CuvilError, match="lora_base"):
        cuvil.compile(module, lora=str(saved.directory), cache=False)
    lib = cuvil.compile(module, lora=str(saved.directory), lora_base=saved.base, cache=False)
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    want = x @ saved.merged["0"].T + model[0].bias.detach().numpy()
    assert _rel(np.asarray(lib(x)), want) <= 1e-5


def _conv_net(dilation: int = 1, groups: int = 1) -> torch.nn.Module:
    torch.manual_seed(8)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 4, 3, 2, dilation, dilation=dilation, groups=groups)).eval()


def test_convolution_adapters_merge_proved_and_within_the_bound_on_200_inputs(tmp_path):
    """LoRA on both convolutions of a small CNN (A on the base's kernel, strides and padding, B 1x1): the
    merge is proved, matches PEFT's unmerged forward, and the compiled merged and unmerged libraries agree
    within the certificate's end-to-end bound on 200 inputs in the box."""
    model = _conv_net()
    base = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    pm = _peft_saved(model, tmp_path / "adapter", r=2, lora_alpha=4, target_modules=["0", "2"])
    with torch.no_grad():
        want = pm(x).numpy()  # PEFT's unmerged forward
    module = cuvil.import_model(base, example_inputs=(x,))
    box = {module.main.params[0].name: (-3.0, 3.0)}
    result = merge_adapters(module, BaseModel.from_torch(base), Adapter(tmp_path / "adapter"), ranges=box)
    assert result.verification.proved and [a.kind for a in result.attachments] == ["conv", "conv"]
    assert _rel(run_reference(result.merged, [x.numpy()])[0], want) <= 1e-5
    assert _rel(run_reference(result.unmerged, [x.numpy()])[0], want) <= 1e-5
    assert result.model_bound is not None
    bound = result.model_bound.outputs[0]
    assert np.all(np.isfinite(bound))
    merged, unmerged = cuvil.compile(result.merged, cache=False), cuvil.compile(result.unmerged, cache=False)
    rng = np.random.default_rng(3)
    for _ in range(200):
        xs = rng.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
        assert np.all(np.abs(np.asarray(merged(xs), np.float64) - np.asarray(unmerged(xs), np.float64)) <= bound)


@pytest.mark.parametrize(("dilation", "groups", "words"), [
    (2, 1, "grouped or dilated convolution"),
    (1, 2, r"lora_A.weight' has shape \[2, 8, 3, 3\], expected \[2, 4, 3, 3\]")])
def test_a_dilated_or_grouped_convolution_is_refused(tmp_path, dilation: int, groups: int, words: str):
    """PEFT runs lora_A undilated (so its merged weight is not its unmerged output) and cannot merge grouped
    convolutions (its lora_A reads every input channel, the base weight a group's): such an adapter is refused,
    not merged wrongly."""
    model = _conv_net(dilation, groups)
    base = BaseModel.from_torch(copy.deepcopy(model))
    _peft_saved(copy.deepcopy(model), tmp_path / "adapter", r=2, lora_alpha=4, target_modules=["2"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(1, 3, 8, 8),))
    with pytest.raises(AdapterError, match=words):
        merge_adapters(module, base, Adapter(tmp_path / "adapter"))


def test_a_convolution_padding_other_than_zeros_is_refused(tmp_path):
    """A reflect-padded base convolution: PEFT's lora_A pads with zeros, so the unmerged model is not a
    convolution of one padded input; refused by name."""
    torch.manual_seed(10)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, 1, 1, padding_mode="reflect")).eval()
    base = BaseModel.from_torch(copy.deepcopy(model))
    _peft_saved(copy.deepcopy(model), tmp_path / "adapter", r=2, lora_alpha=4, target_modules=["0"])
    module = cuvil.import_model(model, example_inputs=(torch.zeros(1, 3, 8, 8),))
    with pytest.raises(AdapterError, match="pads with 'reflect'"):
        merge_adapters(module, base, Adapter(tmp_path / "adapter"))


def _peft_saved(model: torch.nn.Module, directory: Path, **options: object):  # type: ignore[no-untyped-def]
    """PEFT's LoRA of ``options`` on ``model`` (B not zero), saved to ``directory``: the PEFT model."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **options))
        pm.save_pretrained(directory)
    return pm
