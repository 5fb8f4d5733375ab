"""``adapter_config.json`` as PEFT writes it, validated, and what it decides per module: which
modules are targeted, their rank, and the scale of their update (``alpha / r``, or
``alpha / sqrt(r)`` under rsLoRA)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora.errors import AdapterError

CONFIG_FILE = "adapter_config.json"
ALL_LINEAR = "all-linear"


def _pattern_match(pattern: str, module: str) -> bool:
    """PEFT's rule for ``rank_pattern``/``alpha_pattern`` keys: the key matches the end of the module path."""
    return re.match(rf"(.*\.)?({pattern})$", module) is not None


@dataclass(frozen=True)
class AdapterConfig:
    """The fields of a PEFT LoRA config that decide what an adapter computes."""

    r: int
    lora_alpha: float
    target_modules: tuple[str, ...] | str | None
    use_rslora: bool = False
    use_dora: bool = False
    fan_in_fan_out: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    layers_to_transform: tuple[int, ...] | None = None
    layers_pattern: tuple[str, ...] | None = None
    modules_to_save: tuple[str, ...] = ()
    exclude_modules: tuple[str, ...] | str | None = None
    base_model_name_or_path: str | None = None
    revision: str | None = None
    source: str = CONFIG_FILE

    # -- what the config decides per module ------------------------------------------------
    def rank(self, module: str) -> int:
        for key, r in self.rank_pattern.items():
            if _pattern_match(key, module):
                return int(r)
        return self.r

    def alpha(self, module: str) -> float:
        for key, a in self.alpha_pattern.items():
            if _pattern_match(key, module):
                return float(a)
        return self.lora_alpha

    def scale(self, module: str) -> float:
        """The factor of the update ``B @ A`` (PEFT's ``scaling``)."""
        r = self.rank(module)
        return self.alpha(module) / (math.sqrt(r) if self.use_rslora else r)

    def targets(self, module: str, *, is_linear: bool, is_output_layer: bool = False) -> bool:
        """Whether PEFT would put a LoRA layer on ``module``, by PEFT's own rules: never on an excluded
        module or a module to save; a string is a regular expression matching the whole name; a list
        matches the exact name, or a dotted suffix restricted to ``layers_to_transform``;
        ``all-linear`` is every linear layer but the output layer."""
        if self.exclude_modules is not None and _names_match(self.exclude_modules, module):
            return False
        if any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in self.modules_to_save):
            return False
        t = self.target_modules
        if t is None:
            return False
        if t == ALL_LINEAR or t == (ALL_LINEAR,):
            return is_linear and not is_output_layer
        if isinstance(t, str):
            return re.fullmatch(t, module) is not None
        if module in t:
            return True
        return any(module.endswith("." + n) for n in t) and self._in_layers(module)

    def _in_layers(self, module: str) -> bool:
        """The layer index PEFT reads from a module name: the first numbered segment (after one of
        ``layers_pattern`` when given) must be in ``layers_to_transform``."""
        if self.layers_to_transform is None or len(self.layers_to_transform) == 0:
            return True
        if not self.layers_pattern:
            m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
        else:
            m = None
            for p in self.layers_pattern:
                m = re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", module)
                if m is not None:
                    break
        return m is not None and int(m.group("idx")) in self.layers_to_transform

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = CONFIG_FILE) -> AdapterConfig:
        def fail(msg: str, hint: str | None = None) -> AdapterError:
            return AdapterError(msg, location=source, hint=hint)

        peft_type = data.get("peft_type", "LORA")
        if peft_type != "LORA":
            raise fail(f"peft_type is {peft_type!r}; only LoRA adapters (peft_type LORA) are supported")
        r = data.get("r")
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            raise fail(f"r must be a positive integer, found {r!r}")
        alpha = data.get("lora_alpha", r)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise fail(f"lora_alpha must be a finite number, found {alpha!r}")
        targets = data.get("target_modules")
        if isinstance(targets, list):
            targets = tuple(str(t) for t in targets)
        elif targets is not None and not isinstance(targets, str):
            raise fail(f"target_modules must be a list of names, a regular expression or null, found {targets!r}")
        if isinstance(targets, str) and targets != ALL_LINEAR:
            try:
                re.compile(targets)
            except re.error as e:
                raise fail(f"target_modules is not a valid regular expression: {e}") from None
        rank_pattern = _mapping(data.get("rank_pattern"), "rank_pattern", source)
        for key, v in rank_pattern.items():
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise fail(f"rank_pattern[{key!r}] must be a positive integer, found {v!r}")
        alpha_pattern = _mapping(data.get("alpha_pattern"), "alpha_pattern", source)
        for key, v in alpha_pattern.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise fail(f"alpha_pattern[{key!r}] must be a finite number, found {v!r}")
        layers = data.get("layers_to_transform")
        if isinstance(layers, int) and not isinstance(layers, bool):
            layers = (layers,)
        elif isinstance(layers, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            layers = tuple(layers)
        elif layers is not None:
            raise fail(f"layers_to_transform must be an integer or a list of integers, found {layers!r}")
        pattern = data.get("layers_pattern")
        pattern = (pattern,) if isinstance(pattern, str) else tuple(pattern) if isinstance(pattern, list) else None
        exclude = data.get("exclude_modules")
        exclude = tuple(exclude) if isinstance(exclude, list) else exclude if isinstance(exclude, str) else None
        return cls(r=r, lora_alpha=float(alpha), target_modules=targets,
                   use_rslora=bool(data.get("use_rslora", False)), use_dora=bool(data.get("use_dora", False)),
                   fan_in_fan_out=bool(data.get("fan_in_fan_out", False)),
                   rank_pattern={str(k): int(v) for k, v in rank_pattern.items()},
                   alpha_pattern={str(k): float(v) for k, v in alpha_pattern.items()},
                   layers_to_transform=layers, layers_pattern=pattern,
                   modules_to_save=tuple(data.get("modules_to_save") or ()), exclude_modules=exclude,
                   base_model_name_or_path=data.get("base_model_name_or_path"), revision=data.get("revision"),
                   source=source)

    @classmethod
    def read(cls, directory: Path) -> AdapterConfig:
        path = directory / CONFIG_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise AdapterError(f"{directory} has no {CONFIG_FILE}", location=str(directory)) from None
        except OSError as e:
            raise AdapterError(f"cannot read {path}: {e.strerror}", location=str(path)) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise AdapterError(f"{CONFIG_FILE} is not JSON: {e.msg} at line {e.lineno} column {e.colno}",
                               location=str(path)) from None
        if not isinstance(data, dict):
            raise AdapterError(f"{CONFIG_FILE} must hold a JSON object", location=str(path))
        return cls.from_dict(data, str(path))


def _names_match(names: Sequence[str] | str, module: str) -> bool:
    if isinstance(names, str):
        return re.fullmatch(names, module) is not None
    return any(module == n or module.endswith("." + n) for n in names)


def _mapping(value: Any, name: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AdapterError(f"{name} must be a JSON object, found {value!r}", location=source)
    return value
