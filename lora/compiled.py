"""Adapters in ``cuvil.compile``: the model imported to CIR with the adapters attached, and the
passes that merge them (proved under the compile's gate like every other pass) when a merge is
asked for. Unmerged, each adapted op keeps its low-rank path as two small matrix products."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuvil.errors import InputError
from cuvil.ir.module import Module
from lora.adapter import Adapter
from lora.attach import WeightedAdapter, attach
from lora.base import BaseModel
from lora.merge import MERGE_PIPELINE, as_weighted, checked


def _adapters(lora: Any) -> list[WeightedAdapter]:
    """``lora``: a directory, an :class:`Adapter`, a ``(directory, weight)`` pair, or a list of them."""
    items = lora if isinstance(lora, list) else [lora]
    out: list[Adapter | WeightedAdapter] = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            adapter = item[0] if isinstance(item[0], Adapter) else Adapter(item[0])
            out.append(WeightedAdapter(adapter, float(item[1])))
        elif isinstance(item, (Adapter, WeightedAdapter)):
            out.append(item)
        elif isinstance(item, (str, Path)):
            out.append(Adapter(item))
        else:
            raise InputError(f"lora={item!r} is not an adapter", location="lora",
                             hint="give a PEFT adapter directory, (directory, weight), or a list of them")
    return as_weighted(out)


def with_adapters(model: Any, lora: Any, *, merge: bool, example_inputs: Any = None, base: Any = None,
                  dtype: str = "fp32", **import_options: Any) -> tuple[Module, list[str]]:
    """The model's CIR with the adapters attached, and the passes to run first (the merge's, or none).

    The adapters' module names are resolved against ``base`` (a :class:`BaseModel` or a Hugging Face
    directory), by default the model itself when it is a ``torch`` module; the weights are then found
    in the CIR by content. Every adapter is checked first and refused if a check fails."""
    from cuvil.frontend.dispatch import import_model
    from lora.hf_model import example_inputs as default_inputs
    from lora.hf_model import load_model

    if isinstance(model, (str, Path)) and Path(model).is_dir():
        model = load_model(model)
        example_inputs = example_inputs if example_inputs is not None else default_inputs(model, {})
    names = base if base is not None else model
    if isinstance(names, (str, Path)):
        names = BaseModel.from_directory(names)
    elif not isinstance(names, BaseModel):
        if not hasattr(names, "named_modules"):
            raise InputError("adapters name the base model's modules, which a model given as ONNX or CIR does "
                             "not keep", location="lora",
                             hint="pass lora_base= the Hugging Face directory (or torch module) it was exported "
                                  "from; its weights are matched to the model's by content")
        names = BaseModel.from_torch(names)
    module = model if isinstance(model, Module) else import_model(model, example_inputs=example_inputs,
                                                                     **import_options)
    adapters = _adapters(lora)
    checked(adapters, names, dtype)
    attached, _ = attach(module, names, adapters)
    return attached, list(MERGE_PIPELINE) if merge else []
