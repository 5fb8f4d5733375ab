"""A PEFT LoRA adapter on disk: its config and its tensors grouped by the module they adapt.

PEFT saves ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` for linear and conv
layers, ``lora_embedding_A`` / ``lora_embedding_B`` for embeddings, ``lora_magnitude_vector``
for DoRA, and full copies for ``modules_to_save`` and resized embeddings. Keys are grouped here
without judging them; :mod:`lora.checks` decides what is wrong and says where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lora.config import AdapterConfig
from lora.errors import AdapterError
from lora.safetensors_file import SafetensorsFile, TensorInfo

WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."

_ROLES = (
    (re.compile(r"^(?P<m>.+)\.lora_A(\.weight)?$"), "a"),
    (re.compile(r"^(?P<m>.+)\.lora_B(\.weight)?$"), "b"),
    (re.compile(r"^(?P<m>.+)\.lora_embedding_A(\.weight)?$"), "embedding_a"),
    (re.compile(r"^(?P<m>.+)\.lora_embedding_B(\.weight)?$"), "embedding_b"),
    (re.compile(r"^(?P<m>.+)\.lora_magnitude_vector(\.weight)?$"), "magnitude"),
    (re.compile(r"^(?P<m>.+)\.base_layer\.(?P<p>weight|bias)$"), "base_copy"),
    (re.compile(r"^(?P<m>.+)\.modules_to_save\.(?P<p>[A-Za-z0-9_.]+)$"), "saved"),
)


@dataclass
class ModuleTensors:
    """The adapter's tensors for one module of the base model (keys into the file)."""

    module: str
    a: str | None = None
    b: str | None = None
    magnitude: str | None = None
    embedding: bool = False
    copies: dict[str, str] = field(default_factory=dict)  # parameter name -> key (base_layer / modules_to_save)


@dataclass
class StrayKey:
    """A key the adapter holds that no PEFT LoRA layer reads as it is named."""

    key: str
    reason: str


class Adapter:
    """``adapter_config.json`` + ``adapter_model.safetensors``, tensors memory-mapped."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise AdapterError(f"{self.directory} is not a directory", location=str(self.directory))
        self.config = AdapterConfig.read(self.directory)
        weights = self.directory / WEIGHTS_FILE
        if not weights.exists() and (self.directory / "adapter_model.bin").exists():
            raise AdapterError("the adapter's weights are a pickle (adapter_model.bin); pickles are never loaded",
                               location=str(self.directory),
                               hint="convert it with PEFT: model.save_pretrained(dir, safe_serialization=True)")
        self.file = SafetensorsFile(weights)
        self.modules: dict[str, ModuleTensors] = {}
        self.stray: list[StrayKey] = []
        for key in self.file:
            self._add(key)

    def _add(self, key: str) -> None:
        if not key.startswith(PEFT_PREFIX):
            self.stray.append(StrayKey(key, f"does not start with {PEFT_PREFIX!r}, so PEFT's loader never "
                                            "applies it"))
            return
        rest = key[len(PEFT_PREFIX):]
        if rest.startswith(PEFT_PREFIX):
            self.stray.append(StrayKey(key, f"carries the prefix {PEFT_PREFIX!r} twice (an adapter saved from a "
                                            "wrapped model), so PEFT's loader never applies it"))
            return
        if "_orig_mod." in rest:
            self.stray.append(StrayKey(key, "names a torch.compile wrapper ('_orig_mod.'), so PEFT's loader never "
                                            "applies it to the plain model"))
            return
        for pattern, role in _ROLES:
            m = pattern.match(rest)
            if m is None:
                continue
            entry = self.modules.setdefault(m.group("m"), ModuleTensors(m.group("m")))
            if role in ("a", "b", "embedding_a", "embedding_b"):
                slot = role[-1]
                if getattr(entry, slot) is not None:
                    self.stray.append(StrayKey(key, f"a second lora_{slot.upper()} for {entry.module!r}"))
                    return
                setattr(entry, slot, key)
                entry.embedding = entry.embedding or role.startswith("embedding")
            elif role == "magnitude":
                entry.magnitude = key
            else:
                entry.copies[m.group("p")] = key
            return
        module, _, param = rest.rpartition(".")
        if module and any(re.match(rf"(^|.*\.){m}$", module) for m in self.config.modules_to_save):
            self.modules.setdefault(module, ModuleTensors(module)).copies[param] = key  # a module saved whole
            return
        self.stray.append(StrayKey(key, "is not a LoRA tensor name (lora_A, lora_B, lora_embedding_A/B, "
                                        "lora_magnitude_vector, base_layer, modules_to_save)"))

    def info(self, key: str) -> TensorInfo:
        return self.file.tensors[key]

    def array(self, key: str) -> np.ndarray:
        return self.file.array(key)

    @property
    def lora_modules(self) -> list[ModuleTensors]:
        """Modules with low-rank factors (not only copies)."""
        return [m for m in self.modules.values() if m.a is not None or m.b is not None or m.magnitude is not None]
