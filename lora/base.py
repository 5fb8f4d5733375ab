"""The base model an adapter claims to fit, as the adapter sees it: its adaptable modules
(linear, embedding, convolution, GPT-2's transposed ``Conv1D``) by name, with their weights.

A base is a ``torch.nn.Module`` (a ``transformers`` model built in-process, say) or a Hugging Face
model directory (``config.json`` + safetensors weights), loaded offline."""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from lora.safetensors_file import SafetensorsFile


class BaseModelError(CuvilError):
    """The base model given for an adapter check cannot be loaded."""

    code = "CUVIL-LORA-BASE"
    default_hint = "give a Hugging Face model directory (config.json + *.safetensors) or a torch.nn.Module"


@dataclass(frozen=True)
class BaseModule:
    """One module an adapter may target: ``weight`` is as stored (``fan_in_fan_out``: ``[in, out]``).

    ``source`` is the array or a function mapping it from its file on each use, so that the pages
    of a checked module are released once its check is done."""

    name: str
    kind: str  # "linear" | "embedding" | "conv"
    source: np.ndarray | Callable[[], np.ndarray]
    fan_in_fan_out: bool = False
    output_layer: bool = False
    padding_mode: str = "zeros"
    """A convolution's padding mode (PyTorch's ``padding_mode``); other kinds and unknown: zeros."""

    @property
    def weight(self) -> np.ndarray:
        return self.source() if callable(self.source) else self.source

    @property
    def out_features(self) -> int:
        if self.kind == "embedding":
            return int(self.weight.shape[1])
        return int(self.weight.shape[1] if self.fan_in_fan_out else self.weight.shape[0])

    @property
    def in_features(self) -> int:
        if self.kind == "embedding":
            return int(self.weight.shape[0])  # the vocabulary: lora_embedding_A is [r, num_embeddings]
        if self.kind == "conv":
            return int(np.prod(self.weight.shape[1:]))
        return int(self.weight.shape[0] if self.fan_in_fan_out else self.weight.shape[1])

    @property
    def is_linear(self) -> bool:
        return self.kind == "linear"


@dataclass
class BaseModel:
    """The adaptable modules of a base model by name, and what identifies it."""

    modules: dict[str, BaseModule]
    name_or_path: str | None = None
    revision: str | None = None

    def __iter__(self) -> Iterator[BaseModule]:
        return iter(self.modules.values())

    @classmethod
    def from_torch(cls, model: Any, name_or_path: str | None = None,
                   weights: Callable[[str, Any], np.ndarray] | None = None) -> BaseModel:
        """The adaptable modules of ``model``; ``weights(module_name, parameter)`` supplies a weight
        the module itself does not hold (a model built on the meta device)."""
        modules: dict[str, BaseModule] = {}
        output = _output_layer(model)
        for name, m in model.named_modules():
            kind = _kind(m) if name else None
            if kind is None:
                continue
            source = functools.partial(weights, name, m.weight) if weights is not None else _numpy(m.weight)
            modules[name] = BaseModule(name, kind[0], source, kind[1], output_layer=m is output,
                                       padding_mode=str(getattr(m, "padding_mode", "zeros")))
        config = getattr(model, "config", None)
        return cls(modules, name_or_path or getattr(config, "_name_or_path", None) or None)

    @classmethod
    def from_directory(cls, directory: str | Path) -> BaseModel:
        """A Hugging Face model directory, built with ``transformers`` from its ``config.json`` and
        safetensors weights, offline (nothing is downloaded, no pickle is read)."""
        path = Path(directory)
        config_path = path / "config.json"
        if not config_path.is_file():
            raise BaseModelError(f"{path} has no config.json", location=str(path))
        if not any(path.glob("*.safetensors")):
            raise BaseModelError(f"{path} has no safetensors weights (pickled weights are never loaded)",
                                 location=str(path))
        try:
            config_data = json.loads(config_path.read_text())
            architectures = config_data.get("architectures") or []
        except (json.JSONDecodeError, AttributeError) as e:
            raise BaseModelError(f"{config_path} is not a JSON object: {e}", location=str(config_path)) from None
        _refuse_quantized(config_data.get("quantization_config"), path)
        transformers = import_transformers(path)
        import torch

        model_class = getattr(transformers, architectures[0], None) if architectures else None
        try:
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            with torch.device("meta"):  # module types and names only: no weight is allocated
                model = model_class(config) if model_class is not None else \
                    transformers.AutoModel.from_config(config)
        except Exception as e:  # transformers raises many types for a bad directory
            raise BaseModelError(f"transformers cannot build the model of {path}: {e}", location=str(path)) from None
        files = [SafetensorsFile(f) for f in sorted(path.glob("*.safetensors"))]
        stored = {key: f for f in files for key in f}
        aliases: dict[int, list[str]] = {}
        for pname, param in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(pname)

        keys: dict[str, str] = {}
        for name, m in model.named_modules():
            if name and _kind(m) is not None:
                found = next((n for n in [f"{name}.weight", *aliases.get(id(m.weight), [])] if n in stored), None)
                if found is None:
                    raise BaseModelError(f"the weights of {path} have no {name}.weight", location=str(path),
                                         hint="the directory's weights do not match its config.json")
                keys[name] = found
        return cls.from_torch(model, str(path), weights=lambda module, _: stored[keys[module]].array(keys[module]))


def import_transformers(path: Path) -> Any:
    """The ``transformers`` module (with torch), imported by name: the calls into it are dynamic (the class
    config.json names), and a static import made the package type check bind its 3,000 files."""
    try:
        import torch  # noqa: F401  (transformers without torch builds no model)

        return importlib.import_module("transformers")
    except ImportError:
        raise BaseModelError("loading a Hugging Face directory needs torch and transformers", location=str(path),
                             hint="pip install torch transformers") from None


def _refuse_quantized(quantization: Any, path: Path) -> None:
    """A quantized checkpoint stores packed integers and scales, not the tensors an adapter adds to: a
    QLoRA adapter was trained against the *dequantized* weights, and merging it onto the packed
    tensors (or onto the original full-precision ones it was never trained with) computes another
    model. Such a base is refused by name until it is dequantized."""
    if not quantization:
        return
    method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else "unknown"
    detail = ""
    if isinstance(quantization, dict) and quantization.get("load_in_4bit"):
        detail = f" {quantization.get('bnb_4bit_quant_type', 'fp4')} 4-bit"
    elif isinstance(quantization, dict) and quantization.get("load_in_8bit"):
        detail = " 8-bit"
    raise BaseModelError(
        f"the base at {path} is quantized ({method}{detail}, per config.json): its weights are stored packed, "
        "so no adapter can be checked or merged against them as they are. A QLoRA adapter adds to the "
        "dequantized weights it was trained with, not to the packed tensors nor to the original full-precision "
        "ones", location=str(path / "config.json"),
        hint="dequantize the base first (transformers: model.dequantize(), then save_pretrained with "
             "safetensors) and give that directory")


def _kind(m: Any) -> tuple[str, bool] | None:
    """``(kind, fan_in_fan_out)`` of an adaptable module, or None."""
    import torch

    try:  # by name: see import_transformers
        Conv1D = importlib.import_module("transformers.pytorch_utils").Conv1D
    except ImportError:
        Conv1D = ()
    if not isinstance(getattr(m, "weight", None), torch.Tensor):
        return None
    if isinstance(m, torch.nn.Linear):
        return "linear", False
    if Conv1D and isinstance(m, Conv1D):
        return "linear", True
    if isinstance(m, torch.nn.Embedding):
        return "embedding", False
    if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        return "conv", False
    return None


def _output_layer(model: Any) -> Any:
    get_out = getattr(model, "get_output_embeddings", None)
    try:
        return get_out() if callable(get_out) else None
    except (NotImplementedError, AttributeError):
        return None


def _numpy(weight: Any) -> np.ndarray:
    from cuvil.arrays import from_torch

    # a copy: the model may be trained or merged in place after the check; bfloat16 kept by its bits
    arr = np.array(from_torch(weight.detach().cpu(), "weight"))
    arr.flags.writeable = False
    return arr
