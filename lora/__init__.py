"""LoRA adapters checked against the base model they claim to fit, before they are loaded or merged.

:class:`Adapter` reads PEFT's adapter directory (safetensors only), :class:`BaseModel` the base's
adaptable modules, :func:`check_adapter` runs every structural and numeric check and
:func:`merged_weights` gives the exact merged weights."""

from lora.adapter import Adapter
from lora.base import BaseModel, BaseModule
from lora.checks import AdapterCheck, Finding, ModuleReport, check_adapter, merged_weights
from lora.config import AdapterConfig
from lora.errors import AdapterError

__all__ = ["Adapter", "AdapterCheck", "AdapterConfig", "AdapterError", "BaseModel", "BaseModule", "Finding",
           "ModuleReport", "check_adapter", "merged_weights"]
