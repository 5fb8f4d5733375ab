"""``adapter_config.json`` as the checker reads it: the modules it selects, and the rank and alpha it gives
each, agree with PEFT's own rules on every adaptable module of the tiny models; and a config or adapter
directory PEFT could not have written is refused with ``AdapterError`` naming what is wrong."""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_models import ARCHS, Arch, peft, tiny_t5

from lora.adapter import WEIGHTS_FILE, Adapter
from lora.base import BaseModel
from lora.config import CONFIG_FILE, AdapterConfig
from lora.errors import AdapterError

check_target_module_exists = peft.tuners.tuners_utils.check_target_module_exists
get_pattern_key = peft.utils.other.get_pattern_key


@functools.cache
def base_of(name: str) -> BaseModel:
    torch.manual_seed(0)
    build = tiny_t5 if name == "t5" else ARCHS[name].build
    return BaseModel.from_torch(build())


def as_saved(lora_config: Any) -> AdapterConfig:
    """The config as ``save_pretrained`` writes it (sets as lists), read back by the checker."""
    return AdapterConfig.from_dict(json.loads(json.dumps(lora_config.to_dict(), default=sorted)))


def _selections(arch: Arch) -> dict[str, dict[str, Any]]:
    targets = list(arch.targets)
    layers = {k: v for k, v in arch.options.items() if k == "layers_pattern"}
    return {
        "names": {"target_modules": targets},
        "suffixes": {"target_modules": ["dense", "fc1", "c_fc", "attn.c_proj", "mlp.gate_proj", "absent"]},
        "regex": {"target_modules": rf".*\.({'|'.join(targets)})"},
        "regex-layer-0": {"target_modules": r".*\.0\..*"},
        "regex-prefix-only": {"target_modules": r"\w+\.0"},
        "exclude-names": {"target_modules": targets, "exclude_modules": [targets[0]]},
        "exclude-regex": {"target_modules": targets, "exclude_modules": r".*\.1\..*"},
        "layers": {"target_modules": targets, "layers_to_transform": [0], **layers},
        "layer-int": {"target_modules": targets, "layers_to_transform": 1, **layers},
        "layers-pattern": {"target_modules": targets, "layers_to_transform": [1],
                           "layers_pattern": ["blocks", "layers", "h", "layer"]},
    }


def _selection_cases() -> Iterator[Any]:
    for name, arch in ARCHS.items():
        for selection, options in _selections(arch).items():
            yield pytest.param(name, options, id=f"{name}-{selection}")
    yield pytest.param("t5", {"target_modules": ["q", "v"], "layers_to_transform": [1], "layers_pattern": "block"},
                       id="t5-layers-pattern")
    yield pytest.param("t5", {"target_modules": ["q", "v"], "layers_to_transform": [1]}, id="t5-layers")


@pytest.mark.parametrize(("name", "options"), list(_selection_cases()))
def test_the_config_selects_the_modules_peft_selects(name: str, options: dict[str, Any]) -> None:
    lora_config = peft.LoraConfig(r=4, **options)
    config = as_saved(lora_config)
    selected = {m.name for m in base_of(name) if config.targets(m.name, is_linear=m.is_linear,
                                                                  is_output_layer=m.output_layer)}
    expected = {m.name for m in base_of(name) if check_target_module_exists(lora_config, m.name)}
    assert selected == expected


SYNTHETIC = ["model.layers.1.proj", "model.sublayers.0.layers.1.proj", "encoder.h.1.proj", "encoder.th.0.h.1.proj",
             "top.layer.1.proj", "top.mylayer.0.layer.1.proj", "net.blocks.1.proj", "net.blocks.0.inner.1.proj",
             "layers.1.proj", "model.layers.10.proj", "model.layers.x.proj", "model.layers.1"]


@pytest.mark.parametrize("options", [{"layers_to_transform": [1], "layers_pattern": "layers"},
                                     {"layers_to_transform": 1, "layers_pattern": ["layer", "h", "blocks"]},
                                     {"layers_to_transform": [0, 10], "layers_pattern": ["layers", "layer"]}],
                         ids=["one-pattern", "patterns", "two-layers"])
def test_the_layer_index_is_read_where_peft_reads_it(options: dict[str, Any]) -> None:
    """Near misses for a layer pattern: the name inside a longer one, a later numbered segment, no index."""
    lora_config = peft.LoraConfig(r=4, target_modules=["proj"], **options)
    config = as_saved(lora_config)
    selected = {name for name in SYNTHETIC if config.targets(name, is_linear=True)}
    assert selected == {name for name in SYNTHETIC if check_target_module_exists(lora_config, name)}
    assert selected and selected != {n for n in SYNTHETIC if n.endswith(".proj")}


@pytest.mark.parametrize("patterns", [{"v_proj": 2}, {"layers.1.self_attn.q_proj": 8, "q_proj": 2},
                                      {"self_attn.v_proj": 6}, {r"layers\.0\..*": 3},
                                      {"q_proj|v_proj": 2}],
                         ids=["suffix", "path-before-suffix", "two-names", "regex", "alternation"])
def test_rank_and_alpha_patterns_pick_what_peft_picks(patterns: dict[str, int]) -> None:
    lora_config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], rank_pattern=patterns,
                                  alpha_pattern={k: 10 * v for k, v in patterns.items()})
    config = as_saved(lora_config)
    for module in base_of("llama").modules:  # as LoraModel._create_and_replace resolves them
        rank_key = get_pattern_key(list(lora_config.rank_pattern), module)
        alpha_key = get_pattern_key(list(lora_config.alpha_pattern), module)
        assert config.rank(module) == lora_config.rank_pattern.get(rank_key, lora_config.r), module
        assert config.alpha(module) == lora_config.alpha_pattern.get(alpha_key, lora_config.lora_alpha), module


def test_a_minimal_config_takes_peft_defaults() -> None:
    config = AdapterConfig.from_dict({"r": 8, "target_modules": ["q_proj"]})
    assert (config.lora_alpha, config.scale("model.layers.0.self_attn.q_proj")) == (8.0, 1.0)
    rs = AdapterConfig.from_dict({"r": 16, "lora_alpha": 8, "use_rslora": True, "target_modules": "q_proj"})
    assert rs.scale("q_proj") == 2.0
    assert not config.targets("model.layers.0.self_attn.k_proj", is_linear=True)


def test_modules_to_save_are_not_lora_targets() -> None:
    lora_config = peft.LoraConfig(r=4, target_modules=["dense"], modules_to_save=["classifier"])
    config = as_saved(lora_config)
    for module in ("roberta.encoder.layer.0.output.dense", "classifier.dense"):
        assert config.targets(module, is_linear=True) == bool(check_target_module_exists(lora_config, module))


# -- refused configs and directories -----------------------------------------------------------------------------

VALID = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _directory(tmp_path: Path, config_text: str | None) -> Path:
    directory = tmp_path / "adapter"
    directory.mkdir()
    if config_text is not None:
        (directory / CONFIG_FILE).write_text(config_text)
    return directory


def refused(directory: Path) -> AdapterError:
    with pytest.raises(AdapterError) as info:
        Adapter(directory)
    assert info.value.code == "CUVIL-LORA"
    return info.value


@pytest.mark.parametrize(("changes", "words"), [
    ({"r": 0}, "r must be a positive integer, found 0"),
    ({"r": -4}, "r must be a positive integer, found -4"),
    ({"r": 4.0}, "r must be a positive integer, found 4.0"),
    ({"r": "4"}, "r must be a positive integer, found '4'"),
    ({"r": True}, "r must be a positive integer, found True"),
    ({"r": None}, "r must be a positive integer, found None"),
    ({"lora_alpha": float("nan")}, "lora_alpha must be a finite number, found nan"),
    ({"lora_alpha": float("inf")}, "lora_alpha must be a finite number, found inf"),
    ({"lora_alpha": "8"}, "lora_alpha must be a finite number, found '8'"),
    ({"target_modules": "(q_proj|v_proj"}, "target_modules is not a valid regular expression: missing ), "),
    ({"target_modules": 7}, "target_modules must be a list of names, a regular expression or null, found 7"),
    ({"peft_type": "PREFIX_TUNING"}, "peft_type is 'PREFIX_TUNING'; only LoRA adapters"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] must be a positive integer, found 0"),
    ({"rank_pattern": ["q_proj"]}, "rank_pattern must be a JSON object, found ['q_proj']"),
    ({"alpha_pattern": {"q_proj": "x"}}, "alpha_pattern['q_proj'] must be a finite number, found 'x'"),
    ({"layers_to_transform": "1"}, "layers_to_transform must be an integer or a list of integers, found '1'"),
    ({"layers_to_transform": [0, 1.5]}, "layers_to_transform must be an integer or a list of integers"),
])
def test_a_config_peft_could_not_have_written_is_refused(tmp_path: Path, changes: dict[str, Any], words: str) -> None:
    directory = _directory(tmp_path, json.dumps({**VALID, **changes}))  # NaN and inf as Python's json writes them
    error = refused(directory)
    assert words in error.message
    assert error.location == str(directory / CONFIG_FILE)


@pytest.mark.parametrize(("text", "words"), [
    ('{"r": 4,\n  "lora_alpha": }', f"{CONFIG_FILE} is not JSON: Expecting value at line 2 column 17"),
    ("", f"{CONFIG_FILE} is not JSON: Expecting value at line 1 column 1"),
    ("[4, 8]", f"{CONFIG_FILE} must hold a JSON object"),
    ('"r"', f"{CONFIG_FILE} must hold a JSON object"),
    (None, f"has no {CONFIG_FILE}"),
])
def test_an_unreadable_config_is_refused(tmp_path: Path, text: str | None, words: str) -> None:
    assert words in refused(_directory(tmp_path, text)).message


def test_a_path_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("{}")
    assert "is not a directory" in refused(tmp_path / "file").message
    assert "is not a directory" in refused(tmp_path / "absent").message


def test_a_config_without_weights_is_refused(tmp_path: Path) -> None:
    error = refused(_directory(tmp_path, json.dumps(VALID)))
    assert f"{WEIGHTS_FILE} is missing" in error.message


UNPICKLED: list[str] = []


def _record_unpickling(name: str) -> None:
    UNPICKLED.append(name)


class _Tripwire:
    """Unpickling this records it: the adapter's pickle must never be opened."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _record_unpickling, ("adapter_model.bin",)


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("a pickle was loaded")


def test_pickled_weights_are_refused_unopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _directory(tmp_path, json.dumps(VALID))
    payload = pickle.dumps({"base_model.model.q_proj.lora_A.weight": _Tripwire()})
    (directory / "adapter_model.bin").write_bytes(payload)
    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(module, name, _never)
    error = refused(directory)
    assert "pickle" in error.message and "never loaded" in error.message
    assert "safe_serialization=True" in error.hint
    assert UNPICKLED == []
    monkeypatch.undo()
    pickle.loads(payload)  # the tripwire does fire when the file is unpickled
    assert UNPICKLED == ["adapter_model.bin"]
