"""A Hugging Face model directory as a runnable ``torch`` model with its weights (offline, safetensors
only, eager attention, no KV cache in the outputs) and the example inputs ``torch.export`` needs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lora.base import BaseModelError, import_transformers

DEFAULT_TOKENS = (1, 8)


def load_model(directory: str | Path) -> Any:
    path = Path(directory)
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise BaseModelError(f"{path} is not a Hugging Face model directory with safetensors weights",
                             location=str(path))
    transformers = import_transformers(path)
    architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        config.use_cache = False  # a cache object in the outputs cannot be exported
        loader = model_class if model_class is not None else transformers.AutoModel
        model = loader.from_pretrained(str(path), config=config, local_files_only=True, use_safetensors=True,
                                       attn_implementation="eager")
    except Exception as e:  # transformers raises many types for a bad directory
        raise BaseModelError(f"transformers cannot load the model of {path}: {e}", location=str(path)) from None
    return model.eval()


def example_inputs(model: Any, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """One example input per ``--shape`` entry (token ids for integer names, else normal floats), or
    the model's main input at a small default shape: ``input_ids`` ``1x8``, or an image at the
    config's size."""
    import torch

    g = torch.Generator().manual_seed(0)
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    if not shapes:
        name = getattr(model, "main_input_name", "input_ids")
        if name == "pixel_values":
            size = int(getattr(config, "image_size", 224))
            shapes = {name: (1, int(getattr(config, "num_channels", 3)), size, size)}
        else:
            shapes = {name: DEFAULT_TOKENS}
    return {name: torch.randint(0, vocab, shape, generator=g) if "ids" in name
            else torch.randn(shape, generator=g) for name, shape in shapes.items()}
