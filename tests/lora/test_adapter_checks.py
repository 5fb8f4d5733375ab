"""``check_adapter`` and ``merged_weights`` against PEFT itself: every correct adapter PEFT saves passes and
merges to PEFT's own merged weights, across architectures and LoRA variants; every damaged adapter (keys,
missing or misshapen factors, non-finite values, overflowing merges, config and base mismatches) is refused
or warned about with the rule, the module or tensor, and the expected and found values."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lora_models import (
    ARCHS,
    SavedAdapter,
    build_adapter,
    drop_keys,
    edit_config,
    lora_options,
    read_tensors,
    rename_keys,
    save_adapter,
    scale_tensors,
    set_tensor,
    tiny_bert_classifier,
    tiny_gpt2,
    tiny_llama,
    tiny_t5,
    tiny_vit,
    variants,
)

from lora.adapter import PEFT_PREFIX, WEIGHTS_FILE
from lora.base import BaseModel, BaseModelError
from lora.checks import MAX_LISTED, AdapterCheck, Finding, check_adapter, merged_weights, summarize

LLAMA = ARCHS["llama"]
Q0, V0 = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14


def found(check: AdapterCheck, rule: str) -> list[Finding]:
    return [f for f in check.findings if f.rule == rule]


def _one_each(findings: list[Finding], names: list[str | None]) -> dict[str, Finding]:
    """Findings by name, each naming one thing once (a finding without a name, or a second one, fails)."""
    assert None not in names and len(set(names)) == len(names), findings
    return {str(name): f for name, f in zip(names, findings, strict=True)}


def by_module(check: AdapterCheck, rule: str) -> dict[str, Finding]:
    return _one_each(found(check, rule), [f.module for f in found(check, rule)])


def by_tensor(check: AdapterCheck, rule: str) -> dict[str, Finding]:
    return _one_each(found(check, rule), [f.tensor for f in found(check, rule)])


def messages(check: AdapterCheck) -> str:
    return "\n".join(summarize(check))


def assert_merged_like_peft(ours: np.ndarray, peft_weight: np.ndarray, module: str) -> None:
    """Equal within float32 rounding: PEFT merges in float32, the checker exactly."""
    assert ours.shape == peft_weight.shape, module
    error = float(np.max(np.abs(ours - peft_weight))) / float(np.max(np.abs(peft_weight)))
    assert error <= 1e-5, f"{module}: merged weight differs from PEFT's by {error:.3g} (relative to its largest)"


def assert_bound_sound(check: AdapterCheck) -> None:
    for report in check.modules:
        assert report.merged_max is not None and report.bound_max is not None, report
        assert report.bound_max >= report.merged_max, report


# -- correct adapters ---------------------------------------------------------------------------------------------

def _cases() -> Iterator[Any]:
    for name, arch in ARCHS.items():
        for variant, changes in variants(arch).items():
            yield pytest.param(arch.build, lora_options(arch, **changes), id=f"{name}-{variant}")
    embedding = lora_options(LLAMA, target_modules=["q_proj", "v_proj", "embed_tokens"])
    conv = lora_options(ARCHS["vit"], target_modules=["q_proj", "projection"])
    t5 = {"r": 4, "lora_alpha": 8, "target_modules": ["q", "v"]}
    bert = lora_options(ARCHS["bert"])
    yield pytest.param(tiny_llama, embedding, id="llama-embedding")
    yield pytest.param(tiny_llama, {**embedding, "use_rslora": True, "r": 16}, id="llama-embedding-rslora")
    yield pytest.param(tiny_vit, conv, id="vit-conv")
    yield pytest.param(tiny_vit, {**conv, "use_rslora": True, "r": 16}, id="vit-conv-rslora")
    yield pytest.param(tiny_t5, t5, id="t5-lora")
    yield pytest.param(tiny_bert_classifier, bert, id="bert-classifier-lora")
    yield pytest.param(tiny_llama, {**embedding, "use_dora": True}, id="llama-embedding-dora")
    yield pytest.param(tiny_vit, {**conv, "use_dora": True}, id="vit-conv-dora")
    yield pytest.param(tiny_llama, lora_options(LLAMA, rank_pattern={"q_proj|v_proj": 2}),
                       id="llama-pattern-alternation")
    yield pytest.param(tiny_t5, {**t5, "layers_to_transform": [0]}, id="t5-layers")
    yield pytest.param(tiny_bert_classifier, {**bert, "task_type": "SEQ_CLS"}, id="bert-classifier-seq-cls")


@pytest.mark.parametrize(("build", "options"), list(_cases()))
def test_a_correct_adapter_passes_and_merges_like_peft(tmp_path: Path, build: Callable[[], Any],
                                                       options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    saved = save_adapter(build(), tmp_path / "adapter", **options)
    adapter = saved.load()
    check = check_adapter(adapter, saved.base)
    assert check.passed and not check.errors, messages(check)
    merged = merged_weights(adapter, saved.base)
    assert set(merged) == saved.adapted
    for module, weight in merged.items():
        assert_merged_like_peft(weight, saved.merged[module], module)
    reports = {r.module: r for r in check.modules}
    assert set(reports) == saved.adapted
    for module, report in reports.items():
        assert report.rank == saved.ranks[module]
        assert report.scale == pytest.approx(saved.scales[module], rel=1e-12)
        assert report.merged_max == float(np.max(np.abs(merged[module])))
        if not report.dora:  # the update is what PEFT's merge added to the base weight
            base = saved.base.modules[module].weight.astype(np.float64)
            ratio = np.linalg.norm(saved.merged[module] - base) / np.linalg.norm(base)
            assert report.update_norm_ratio == pytest.approx(ratio, rel=1e-4)
    assert_bound_sound(check)
    for dtype in ("fp16", "bf16"):
        other = check_adapter(adapter, saved.base, dtype=dtype)
        assert other.passed, messages(other)
        assert_bound_sound(other)


def test_the_variants_differ_where_they_claim_to(tmp_path: Path) -> None:
    """rsLoRA at r=16 scales by alpha/4 where LoRA scales by alpha/16, and a rank pattern gives some modules
    another rank and alpha: the matrix above compares against PEFT on adapters that do differ."""
    plain = build_adapter(LLAMA, tmp_path / "plain", r=16)
    rs = build_adapter(LLAMA, tmp_path / "rs", r=16, use_rslora=True)
    assert set(rs.scales.values()) == {2.0} and set(plain.scales.values()) == {0.5}
    check = check_adapter(rs.load(), rs.base)
    assert {r.scale for r in check.modules} == {2.0}
    patterned = build_adapter(LLAMA, tmp_path / "patterned", **variants(LLAMA)["patterns"])
    ranks = {r.module: (r.rank, r.scale) for r in check_adapter(patterned.load(), patterned.base).modules}
    assert ranks[Q0] == (4, 2.0) and ranks[V0] == (2, 1.5)


@pytest.mark.parametrize("name", list(ARCHS))
def test_all_linear_in_the_config_selects_what_peft_resolved_it_to(tmp_path: Path, name: str) -> None:
    saved = build_adapter(ARCHS[name], tmp_path / "adapter", target_modules="all-linear")
    config = json.loads((saved.directory / "adapter_config.json").read_text())
    assert isinstance(config["target_modules"], list)  # PEFT saves the module names it resolved
    edit_config(saved.directory, target_modules="all-linear")
    check = check_adapter(saved.load(), saved.base)
    assert check.passed, messages(check)
    assert {r.module for r in check.modules} == saved.adapted


def test_the_base_lists_its_adaptable_modules_by_kind() -> None:
    torch.manual_seed(0)
    gpt2 = BaseModel.from_torch(tiny_gpt2())
    c_attn = gpt2.modules["transformer.h.0.attn.c_attn"]
    assert (c_attn.kind, c_attn.fan_in_fan_out, c_attn.in_features, c_attn.out_features) == ("linear", True, 16, 48)
    assert gpt2.modules["lm_head"].output_layer and not c_attn.output_layer
    assert gpt2.modules["transformer.wte"].kind == "embedding"
    vit = BaseModel.from_torch(tiny_vit())
    assert vit.modules["embeddings.patch_embeddings.projection"].kind == "conv"
    assert "layers.0.layernorm_before" not in vit.modules


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2-tied-head"])
def test_a_base_read_from_a_directory_equals_the_model_saved_there(tmp_path: Path, build: Callable[[], Any]) -> None:
    torch.manual_seed(0)
    model = build().eval()
    model.save_pretrained(tmp_path / "base", safe_serialization=True)
    expected = BaseModel.from_torch(model)
    base = BaseModel.from_directory(tmp_path / "base")
    assert base.name_or_path == str(tmp_path / "base")
    assert set(base.modules) == set(expected.modules)
    for name, module in base.modules.items():
        want = expected.modules[name]
        assert (module.kind, module.fan_in_fan_out, module.output_layer) == (want.kind, want.fan_in_fan_out,
                                                                             want.output_layer)
        np.testing.assert_array_equal(module.weight, want.weight)
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text((tmp_path / "base" / "config.json").read_text())
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(BaseModelError, match="no safetensors weights"):
        BaseModel.from_directory(tmp_path / "pickled")


@pytest.mark.parametrize("quantization, named", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bitsandbytes nf4 4-bit"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "bitsandbytes 8-bit"),
    ({"quant_method": "gptq", "bits": 4}, "gptq")])
def test_a_quantized_base_is_refused_until_dequantized(tmp_path: Path, quantization: dict, named: str) -> None:
    """QLoRA: the adapter adds to the dequantized weights it was trained with; a quantized checkpoint
    holds packed integers, so checking or merging against it is refused by name, before any weight is read."""
    torch.manual_seed(0)
    tiny_llama().save_pretrained(tmp_path / "base", safe_serialization=True)
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    (tmp_path / "base" / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    with pytest.raises(BaseModelError, match=f"quantized \\({named}, per config.json\\).*dequantized weights"):
        BaseModel.from_directory(tmp_path / "base")


# -- incidents on one Llama adapter -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> SavedAdapter:
    return build_adapter(LLAMA, tmp_path_factory.mktemp("llama") / "adapter")


@pytest.fixture
def damaged(llama: SavedAdapter, tmp_path: Path) -> SavedAdapter:
    """A copy of the Llama adapter (q_proj and v_proj of two layers, rank 4) to damage."""
    return llama.copy_to(tmp_path / "adapter")


def _check(saved: SavedAdapter, **options: Any) -> AdapterCheck:
    return check_adapter(saved.load(), saved.base, **options)


def _double_prefix(key: str) -> str:
    return PEFT_PREFIX + key


def _compiled(key: str) -> str:
    return key.replace(PEFT_PREFIX, PEFT_PREFIX + "_orig_mod.", 1)


def _unprefixed(key: str) -> str:
    return key.removeprefix(PEFT_PREFIX)


@pytest.mark.parametrize(("rename", "words"), [(_double_prefix, "prefix 'base_model.model.' twice"),
                                               (_compiled, "torch.compile wrapper ('_orig_mod.')"),
                                               (_unprefixed, "does not start with 'base_model.model.'")],
                         ids=["doubled-prefix", "orig-mod", "no-prefix"])
def test_keys_peft_would_skip_are_named(damaged: SavedAdapter, rename: Callable[[str], str], words: str) -> None:
    keys = {rename(k) for k in read_tensors(damaged.directory)}
    rename_keys(damaged.directory, rename)
    check = _check(damaged)
    assert not check.passed
    flagged = by_tensor(check, "lora-key")
    assert set(flagged) == keys
    for key, finding in flagged.items():
        assert finding.severity == "error" and repr(key) in finding.message and words in finding.message
    assert set(by_module(check, "lora-missing")) == damaged.adapted  # nothing PEFT would load is left
    assert not check.modules


def test_a_missing_lora_b_is_named(damaged: SavedAdapter) -> None:
    drop_keys(damaged.directory, damaged.key(Q0, "lora_B.weight"))
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-missing")
    assert (finding.module, finding.expected, finding.found) == (Q0, "lora_B", "nothing")
    assert "has lora_A but no lora_B" in finding.message
    assert {r.module for r in check.modules} == damaged.adapted - {Q0}


def test_a_targeted_module_without_factors_is_named(damaged: SavedAdapter) -> None:
    drop_keys(damaged.directory, damaged.key(Q0, "lora_A.weight"), damaged.key(Q0, "lora_B.weight"))
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-missing")
    assert finding.module == Q0
    assert "targeted by the config" in finding.message and "no lora_A/lora_B" in finding.message


def test_a_rank_the_tensors_do_not_have_is_a_shape_error_per_dimension(damaged: SavedAdapter) -> None:
    edit_config(damaged.directory, r=8)
    check = _check(damaged)
    assert not check.passed and not check.modules
    shapes = by_tensor(check, "lora-shape")
    assert len(shapes) == 2 * len(damaged.adapted)
    a, b = shapes[damaged.key(Q0, "lora_A.weight")], shapes[damaged.key(Q0, "lora_B.weight")]
    assert (a.expected, a.found, a.module) == ([8, 16], [4, 16], Q0)
    assert "dim 0: expected 8, found 4" in a.message and "rank 8 from the config" in a.message
    assert (b.expected, b.found) == ([16, 8], [16, 4]) and "dim 1: expected 8, found 4" in b.message


def test_an_adapter_for_another_hidden_size_is_a_shape_error(llama: SavedAdapter, tmp_path: Path) -> None:
    torch.manual_seed(0)
    wider = save_adapter(tiny_llama(hidden=32), tmp_path / "wide", **lora_options(LLAMA))
    check = check_adapter(wider.load(), llama.base)
    assert not check.passed
    shapes = by_tensor(check, "lora-shape")
    a, b = shapes[wider.key(Q0, "lora_A.weight")], shapes[wider.key(Q0, "lora_B.weight")]
    assert (a.expected, a.found) == ([4, 16], [4, 32]) and "dim 1: expected 16, found 32" in a.message
    assert (b.expected, b.found) == ([16, 4], [32, 4]) and "dim 0: expected 16, found 32" in b.message
    assert "the base weight of 'model.layers.0.self_attn.q_proj' is [16, 16]" in a.message
    edit_config(wider.directory, r=8)
    a = by_tensor(check_adapter(wider.load(), llama.base), "lora-shape")[wider.key(Q0, "lora_A.weight")]
    assert (a.expected, a.found) == ([8, 16], [4, 32])
    assert "dim 0: expected 8, found 4, dim 1: expected 16, found 32" in a.message


def test_an_empty_factor_is_a_shape_error(damaged: SavedAdapter) -> None:
    key = damaged.key(Q0, "lora_A.weight")
    set_tensor(damaged.directory, key, np.zeros((0, 16), np.float32))
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-shape")
    assert (finding.tensor, finding.module, finding.found) == (key, Q0, [0, 16]) and "is empty" in finding.message


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.bool_])
def test_a_non_float_factor_is_a_dtype_error(damaged: SavedAdapter, dtype: type) -> None:
    key = damaged.key(Q0, "lora_B.weight")
    set_tensor(damaged.directory, key, np.ones((16, 4), dtype))
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-dtype")
    assert (finding.tensor, finding.expected, finding.found) == (key, "float", str(np.dtype(dtype)))
    assert "not a float type" in finding.message
    assert Q0 not in {r.module for r in check.modules}


@pytest.mark.parametrize("slot", ["lora_A.weight", "lora_B.weight"])
@pytest.mark.parametrize("count", [3, MAX_LISTED + 5])
def test_non_finite_factor_values_are_counted_and_located(damaged: SavedAdapter, slot: str, count: int) -> None:
    key = damaged.key(Q0, slot)
    value = read_tensors(damaged.directory)[key]
    rng = np.random.default_rng(count)
    flat = np.sort(rng.choice(value.size, size=count, replace=False))
    value.flat[flat] = rng.choice([np.nan, np.inf, -np.inf], size=count)
    set_tensor(damaged.directory, key, value)
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-finite")
    assert (finding.tensor, finding.module, finding.found) == (key, Q0, count)
    assert f"has {count} non-finite values" in finding.message
    positions = [list(np.unravel_index(i, value.shape)) for i in flat[:MAX_LISTED]]
    assert [e["index"] for e in finding.elements] == positions
    assert all(not np.isfinite(e["value"]) for e in finding.elements)


def test_a_non_finite_base_weight_is_named(llama: SavedAdapter) -> None:
    torch.manual_seed(0)
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[2, 3] = float("inf")
    check = check_adapter(llama.load(), BaseModel.from_torch(model))
    assert not check.passed
    (finding,) = found(check, "lora-finite")
    assert (finding.module, finding.tensor, finding.found) == (Q0, f"{Q0}.weight (base)", 1)
    assert [e["index"] for e in finding.elements] == [[2, 3]]


def test_an_fp16_overflowing_merge_is_refused_in_fp16_only(damaged: SavedAdapter) -> None:
    scale_tensors(damaged.directory, ".lora_B.", 1e6)
    adapter = damaged.load()
    for dtype in ("fp32", "bf16"):
        check = check_adapter(adapter, damaged.base, dtype=dtype)
        assert check.passed and not found(check, "lora-merge-overflow"), messages(check)
        assert_bound_sound(check)
    check = check_adapter(adapter, damaged.base, dtype="fp16")
    assert not check.passed and {f.rule for f in check.errors} == {"lora-merge-overflow"}
    merged = {m: torch.from_numpy(w) for m, w in merged_weights(adapter, damaged.base).items()}
    overflowing = {m: int(w.to(torch.float16).isinf().sum()) for m, w in merged.items()}
    overflows = by_module(check, "lora-merge-overflow")
    assert set(overflows) == {m for m, n in overflowing.items() if n} and overflows
    for module, finding in overflows.items():
        assert f"in fp16 overflows {overflowing[module]} elements" in finding.message
        assert finding.tensor == f"{module}.weight"
        assert len(finding.elements) == min(overflowing[module], MAX_LISTED)
        for element in finding.elements:
            assert abs(element["value"]) > FP16_MAX
            assert element["value"] == float(merged[module][tuple(element["index"])])
    assert_bound_sound(check)


def test_a_merge_subnormal_in_fp16_is_a_precision_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_llama()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(1e-5)
    saved = save_adapter(model, tmp_path / "adapter", **lora_options(LLAMA, target_modules=["q_proj"]))
    scale_tensors(saved.directory, ".lora_B.", 1e-5)
    adapter = saved.load()
    for dtype in ("fp32", "bf16"):
        assert not _check(saved, dtype=dtype).findings
    check = check_adapter(adapter, saved.base, dtype="fp16")
    assert check.passed, messages(check)
    warnings = by_module(check, "lora-merge-precision")
    assert set(warnings) == saved.adapted
    for module, weight in merged_weights(adapter, saved.base).items():
        w = torch.from_numpy(weight)
        lossy = int(((w != 0) & ((w.half().double() - w).abs() / w.abs() > 2.0 ** -10)).sum())
        finding = warnings[module]
        assert finding.severity == "warning" and lossy > 0
        assert f"on {lossy} elements (they are subnormal in fp16)" in finding.message
        assert all(0 < abs(e["value"]) < FP16_MIN_NORMAL for e in finding.elements)


def test_tensors_for_modules_the_config_does_not_select(damaged: SavedAdapter) -> None:
    edit_config(damaged.directory, target_modules=["q_proj"])
    check = _check(damaged)
    assert not check.passed
    unselected = by_module(check, "lora-module")
    assert set(unselected) == {m for m in damaged.adapted if m.endswith("v_proj")}
    assert all("do not select" in f.message and "PEFT would drop them" in f.message for f in unselected.values())
    assert {r.module for r in check.modules} == {m for m in damaged.adapted if m.endswith("q_proj")}


def test_an_adapter_for_a_module_the_base_lacks(damaged: SavedAdapter) -> None:
    rename_keys(damaged.directory, lambda k: k.replace(".q_proj.", ".qq_proj."))
    check = _check(damaged)
    assert not check.passed
    unknown = by_module(check, "lora-module")
    assert set(unknown) == {m.replace("q_proj", "qq_proj") for m in damaged.adapted if m.endswith("q_proj")}
    for module, finding in unknown.items():
        assert f"{module!r} is no adaptable module of the base model" in finding.message
        assert finding.tensor == damaged.key(module)
    assert set(by_module(check, "lora-missing")) == {m for m in damaged.adapted if m.endswith("q_proj")}


def test_a_module_path_with_a_prefix_missing_suggests_the_base_module(damaged: SavedAdapter) -> None:
    rename_keys(damaged.directory, lambda k: k.replace(PEFT_PREFIX + "model.", PEFT_PREFIX))
    check = _check(damaged)
    finding = by_module(check, "lora-module")["layers.0.self_attn.q_proj"]
    assert f"did you mean {Q0!r}?" in finding.message


@pytest.fixture(scope="module")
def llama_dora(tmp_path_factory: pytest.TempPathFactory) -> SavedAdapter:
    return build_adapter(LLAMA, tmp_path_factory.mktemp("dora") / "adapter", use_dora=True)


def test_a_dora_magnitude_without_use_dora_is_a_config_error(llama_dora: SavedAdapter, tmp_path: Path) -> None:
    damaged = llama_dora.copy_to(tmp_path / "adapter")
    edit_config(damaged.directory, use_dora=False)
    check = _check(damaged)
    assert not check.passed
    configs = by_module(check, "lora-config")
    assert set(configs) == damaged.adapted
    finding = configs[Q0]
    assert finding.tensor == damaged.key(Q0, "lora_magnitude_vector")
    assert "DoRA magnitude vector" in finding.message and "does not set use_dora" in finding.message


def test_use_dora_without_magnitudes_is_missing(llama_dora: SavedAdapter, tmp_path: Path) -> None:
    damaged = llama_dora.copy_to(tmp_path / "adapter")
    magnitudes = [k for k in read_tensors(damaged.directory) if "lora_magnitude_vector" in k]
    assert len(magnitudes) == len(damaged.adapted)
    drop_keys(damaged.directory, *magnitudes)
    check = _check(damaged)
    assert not check.passed
    missing = by_module(check, "lora-missing")
    assert set(missing) == damaged.adapted
    assert "use_dora is set" in missing[Q0].message and "no lora_magnitude_vector" in missing[Q0].message


@pytest.mark.parametrize(("identity", "severity"), [("warn", "warning"), ("error", "error")])
def test_another_base_name_is_reported_by_policy(damaged: SavedAdapter, identity: str, severity: str) -> None:
    edit_config(damaged.directory, base_model_name_or_path="org/tiny-llama")
    base = BaseModel(damaged.base.modules, name_or_path="org/tiny-mistral")
    check = check_adapter(damaged.load(), base, identity=identity)
    (finding,) = found(check, "lora-base-identity")
    assert finding.severity == severity and check.passed == (identity == "warn")
    assert (finding.expected, finding.found) == ("org/tiny-llama", "org/tiny-mistral")
    assert "'org/tiny-llama'" in finding.message and "'org/tiny-mistral'" in finding.message


def test_a_local_copy_of_the_named_base_is_that_base(damaged: SavedAdapter) -> None:
    edit_config(damaged.directory, base_model_name_or_path="org/tiny-llama")
    check = check_adapter(damaged.load(), BaseModel(damaged.base.modules, name_or_path="/models/tiny-llama/"),
                          identity="error")
    assert check.passed and not check.findings, messages(check)


def test_a_base_from_another_organisation_is_another_base(damaged: SavedAdapter) -> None:
    edit_config(damaged.directory, base_model_name_or_path="alice/tiny-llama")
    check = check_adapter(damaged.load(), BaseModel(damaged.base.modules, name_or_path="bob/tiny-llama"),
                          identity="error")
    assert [f.rule for f in check.errors] == ["lora-base-identity"]


@pytest.mark.parametrize(("revision", "words"), [("v2", "is revision 'v2'"), (None, "records no revision")])
def test_another_base_revision_is_reported(damaged: SavedAdapter, revision: str | None, words: str) -> None:
    edit_config(damaged.directory, base_model_name_or_path="org/tiny-llama", revision="v1")
    base = BaseModel(damaged.base.modules, name_or_path="org/tiny-llama", revision=revision)
    (finding,) = found(check_adapter(damaged.load(), base), "lora-base-identity")
    assert (finding.expected, finding.found) == ("v1", revision)
    assert "revision 'v1'" in finding.message and words in finding.message


@pytest.fixture(scope="module")
def llama_embedding(tmp_path_factory: pytest.TempPathFactory) -> SavedAdapter:
    return build_adapter(LLAMA, tmp_path_factory.mktemp("embedding") / "adapter",
                         target_modules=["q_proj", "embed_tokens"])


EMBED_COPY = f"{PEFT_PREFIX}model.embed_tokens.base_layer.weight"


def test_an_embedding_copy_of_another_base_is_an_identity_error(llama_embedding: SavedAdapter,
                                                                tmp_path: Path) -> None:
    damaged = llama_embedding.copy_to(tmp_path / "adapter")
    copy = read_tensors(damaged.directory)[EMBED_COPY]
    copy[7, 3] += 0.25
    set_tensor(damaged.directory, EMBED_COPY, copy)
    check = _check(damaged)
    assert not check.passed
    (finding,) = found(check, "lora-base-identity")
    assert (finding.module, finding.tensor, finding.severity) == ("model.embed_tokens", EMBED_COPY, "error")
    assert "differs from the base's" in finding.message


@pytest.mark.parametrize("narrow", [torch.float16, torch.bfloat16])
def test_a_base_loaded_in_a_narrower_precision_is_the_same_base_only_where_the_copy_rounds_to_it(
        llama_embedding: SavedAdapter, tmp_path: Path, narrow: torch.dtype) -> None:
    """PEFT users load a float32-trained adapter onto a float16/bfloat16 base: the float32 copy of the
    embedding rounds to the narrow base exactly, so it is that base; a copy with one element moved by many
    narrow steps is not."""
    model = ARCHS["llama"].build().eval()
    table = np.asarray(read_tensors(llama_embedding.directory)[EMBED_COPY])
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(torch.from_numpy(table))
    base = BaseModel.from_torch(model.to(narrow))
    assert not found(check_adapter(llama_embedding.load(), base), "lora-base-identity")
    damaged = llama_embedding.copy_to(tmp_path / "adapter")
    copy = table.copy()
    copy[7, 3] += abs(float(copy[7, 3])) * 0.05 + 0.05  # many narrow steps away
    set_tensor(damaged.directory, EMBED_COPY, copy)
    (finding,) = found(check_adapter(damaged.load(), base), "lora-base-identity")
    assert "differs from the base's" in finding.message


def test_an_embedding_copy_of_a_resized_vocabulary_is_an_identity_error(llama_embedding: SavedAdapter,
                                                                        tmp_path: Path) -> None:
    damaged = llama_embedding.copy_to(tmp_path / "adapter")
    copy = read_tensors(damaged.directory)[EMBED_COPY]
    set_tensor(damaged.directory, EMBED_COPY, np.concatenate([copy, copy[:8]]))
    (finding,) = found(_check(damaged), "lora-base-identity")
    assert (finding.expected, finding.found) == ([64, 16], [72, 16]) and "resized vocabulary" in finding.message


def test_the_check_names_the_dtypes_it_knows(llama: SavedAdapter) -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        check_adapter(llama.load(), llama.base, dtype="fp8")


def test_the_summary_has_a_line_per_finding_and_per_module(damaged: SavedAdapter) -> None:
    drop_keys(damaged.directory, damaged.key(Q0, "lora_B.weight"))
    check = _check(damaged)
    lines = list(summarize(check))
    assert len(lines) == len(check.findings) + len(check.modules) == 1 + 3
    assert lines[0].startswith("ERROR") and "lora-missing" in lines[0]
    assert all(line.startswith("module  ") for line in lines[1:])


def test_the_adapter_file_is_what_the_checks_read(damaged: SavedAdapter) -> None:
    """A guard for the tampering above: a rewritten file is read back as written."""
    scale_tensors(damaged.directory, ".lora_A.", 2.0)
    adapter = damaged.load()
    assert adapter.file.path == damaged.directory / WEIGHTS_FILE
    merged = merged_weights(adapter, damaged.base)
    base = damaged.base.modules[Q0].weight.astype(np.float64)
    np.testing.assert_allclose(merged[Q0] - base, 2 * (damaged.merged[Q0] - base), rtol=1e-4, atol=1e-6)
