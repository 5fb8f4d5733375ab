"""The errors an adapter can cause: each names the file, module or tensor at fault."""

from __future__ import annotations

from cuvil.errors import CuvilError


class AdapterError(CuvilError):
    """An adapter directory that cannot be read as a PEFT LoRA adapter (missing or malformed files)."""

    code = "CUVIL-LORA"
    default_hint = "an adapter is a directory with adapter_config.json and adapter_model.safetensors (PEFT's format)"


class AdapterRefused(AdapterError):
    """An adapter that was read but fails a check, so it is not merged (the findings say why)."""

    code = "CUVIL-LORA-REFUSED"
    default_hint = "`cuvil lora check` lists every finding with the elements at fault"
