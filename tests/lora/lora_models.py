"""Tiny transformers models and the PEFT LoRA adapters saved from them, built offline from fixed seeds,
with what PEFT itself did (modules adapted, rank and scale per module, merged weights) as the oracle;
and the edits incident tests make to a saved adapter (tensors renamed, dropped or rewritten, config changed)."""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

peft = pytest.importorskip("peft", reason="peft comes with the dev extra")
transformers = pytest.importorskip("transformers", reason="transformers comes with the dev extra")

from lora.adapter import PEFT_PREFIX, WEIGHTS_FILE, Adapter  # noqa: E402
from lora.base import BaseModel  # noqa: E402
from lora.config import CONFIG_FILE  # noqa: E402
from lora.safetensors_file import SafetensorsFile, write_safetensors  # noqa: E402

Tensors = dict[str, np.ndarray]


# -- models ---------------------------------------------------------------------------------------------------


def tiny_llama(hidden: int = 16) -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, attn_implementation="eager"))


def tiny_gpt2() -> Any:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager"))


def _bert_config() -> Any:
    return transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32, attn_implementation="eager")


def tiny_bert() -> Any:
    return transformers.BertModel(_bert_config())


def tiny_bert_classifier() -> Any:
    return transformers.BertForSequenceClassification(_bert_config())


def tiny_vit() -> Any:
    return transformers.ViTModel(transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, attn_implementation="eager"))


def tiny_t5() -> Any:
    return transformers.T5Model(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, attn_implementation="eager"))


@dataclass(frozen=True)
class Arch:
    """A model family as an adapter sees it: its builder, the modules a LoRA usually targets, a
    ``rank_pattern`` key that selects only some of them, and the LoRA options the family needs."""

    build: Callable[[], Any]
    targets: tuple[str, ...]
    pattern_key: str
    options: Mapping[str, Any] = field(default_factory=dict)


ARCHS: dict[str, Arch] = {
    "bert": Arch(tiny_bert, ("query", "value"), "value"),
    "gpt2": Arch(tiny_gpt2, ("c_attn",), "h.1.attn.c_attn", {"fan_in_fan_out": True}),
    "llama": Arch(tiny_llama, ("q_proj", "v_proj"), "v_proj"),
    # transformers 5 names ViT's attention projections q_proj/v_proj under a top-level "layers" list, which
    # PEFT's default layer pattern (a name *after* a dot) does not find: layers_to_transform needs the pattern
    "vit": Arch(tiny_vit, ("q_proj", "v_proj"), "v_proj", {"layers_pattern": "layers"}),
}


def variants(arch: Arch) -> dict[str, dict[str, Any]]:
    """LoRA options by variant name, each a PEFT config that differs in what it adapts or how it scales."""
    targets = "|".join(arch.targets)
    layers = {"layers_pattern": arch.options["layers_pattern"]} if "layers_pattern" in arch.options else {}
    return {
        "lora": {},
        "rslora": {"use_rslora": True, "r": 16},  # alpha/sqrt(16) is 4x alpha/16
        "dora": {"use_dora": True},
        "patterns": {"rank_pattern": {arch.pattern_key: 2}, "alpha_pattern": {arch.pattern_key: 3}},
        "all-linear": {"target_modules": "all-linear"},
        "regex": {"target_modules": rf".*\.({targets})"},
        "layers": {"layers_to_transform": [1], **layers},
        "exclude": {"exclude_modules": r".*\.0\..*"},
    }


def lora_options(arch: Arch, **changes: Any) -> dict[str, Any]:
    """The LoRA config of ``arch`` (rank 4, alpha 8, its usual targets) with ``changes``."""
    options: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": list(arch.targets)}
    if "fan_in_fan_out" in arch.options:
        options["fan_in_fan_out"] = arch.options["fan_in_fan_out"]
    return {**options, **changes}


# -- adapters -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedAdapter:
    """An adapter directory and what PEFT made of it, to hold the checker's answers against."""

    directory: Path
    base: BaseModel
    adapted: frozenset[str]  # modules PEFT put a LoRA layer on
    ranks: Mapping[str, int]
    scales: Mapping[str, float]
    merged: Mapping[str, np.ndarray]  # each adapted module's weight after PEFT's merge_and_unload, float64

    def load(self) -> Adapter:
        return Adapter(self.directory)

    def copy_to(self, directory: Path) -> SavedAdapter:
        """The same adapter in ``directory``, to tamper with without touching the original."""
        shutil.copytree(self.directory, directory)
        return replace(self, directory=directory)

    def key(self, module: str, tensor: str = "lora_A.weight") -> str:
        return f"{PEFT_PREFIX}{module}.{tensor}"


def save_adapter(model: Any, directory: Path, *, name_or_path: str | None = None, **options: Any) -> SavedAdapter:
    """Wrap ``model`` with a LoRA of ``options`` (B not zero), save it to ``directory`` and record PEFT's
    own view of it. The base is taken from a copy, so PEFT's in-place changes never reach it."""
    model = model.eval()
    base = BaseModel.from_torch(copy.deepcopy(model), name_or_path=name_or_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT warns about fan_in_fan_out and saved embeddings
        peft_model = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **options))
        _train_magnitudes(peft_model)
        layers = {name.removeprefix(PEFT_PREFIX): m for name, m in peft_model.named_modules()
                  if isinstance(m, peft.tuners.lora.LoraLayer)}
        peft_model.save_pretrained(directory)
        merged_model = copy.deepcopy(peft_model).merge_and_unload()
    modules = dict(merged_model.named_modules())
    return SavedAdapter(
        directory, base, frozenset(layers),
        ranks={n: int(m.r["default"]) for n, m in layers.items()},
        scales={n: float(m.scaling["default"]) for n, m in layers.items()},
        merged={n: modules[n].weight.detach().to(torch.float64).numpy() for n in layers})


def _train_magnitudes(peft_model: Any) -> None:
    """Move DoRA magnitudes off their initial value (the norm of each merged row, which makes DoRA's
    rescaling the identity) as training would, so a merge that skips the rescaling is seen."""
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_magnitude_vector" in name:
                parameter.mul_(0.5 + torch.rand_like(parameter))


def peft_wrapped(name: str, variant: Mapping[str, Any], directory: Path) -> tuple[Any, Any]:
    """A fresh ``name`` model (seed 0) and PEFT's LoRA of ``variant`` on a copy of it (B not zero, DoRA
    magnitudes moved), saved to ``directory``: the untouched base and the PEFT model."""
    arch = ARCHS[name]
    torch.manual_seed(0)
    model = arch.build().eval()
    model.config.use_cache = False
    base = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **lora_options(arch, **variant)))
        _train_magnitudes(pm)
        pm.save_pretrained(directory)
    return base, pm


def build_adapter(arch: Arch, directory: Path, *, seed: int = 0, **changes: Any) -> SavedAdapter:
    """An adapter for a fresh ``arch`` model built from ``seed``."""
    torch.manual_seed(seed)
    return save_adapter(arch.build(), directory, **lora_options(arch, **changes))


# -- tampering ------------------------------------------------------------------------------------------------


def read_tensors(directory: Path) -> Tensors:
    f = SafetensorsFile(directory / WEIGHTS_FILE)
    return {k: np.array(f.array(k)) for k in f}


def rewrite_tensors(directory: Path, edit: Callable[[Tensors], Tensors]) -> None:
    """Replace the adapter's tensors by ``edit`` of them (renamed, dropped, reshaped or changed values)."""
    write_safetensors(directory / WEIGHTS_FILE, edit(read_tensors(directory)))


def rename_keys(directory: Path, rename: Callable[[str], str]) -> None:
    rewrite_tensors(directory, lambda t: {rename(k): v for k, v in t.items()})


def drop_keys(directory: Path, *keys: str) -> None:
    missing = [k for k in keys if k not in read_tensors(directory)]
    assert not missing, f"the adapter has no {missing}"
    rewrite_tensors(directory, lambda t: {k: v for k, v in t.items() if k not in keys})


def set_tensor(directory: Path, key: str, value: np.ndarray) -> None:
    assert key in read_tensors(directory), f"the adapter has no {key!r}"
    rewrite_tensors(directory, lambda t: {**t, key: value})


def scale_tensors(directory: Path, marker: str, factor: float) -> None:
    """Multiply every tensor whose key contains ``marker`` (".lora_B.") by ``factor``."""
    rewrite_tensors(directory, lambda t: {k: (v * factor).astype(v.dtype) if marker in k else v
                                          for k, v in t.items()})


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
