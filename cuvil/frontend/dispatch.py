"""``import_model``: one entry point that picks the frontend from what it is given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cuvil.errors import ModelLoadError
from cuvil.ir.module import Module


def import_model(obj: Any, example_inputs: Any = None, **options: Any) -> Module:
    """Import an ONNX path/bytes/ModelProto, an ``nn.Module`` (with ``example_inputs``),
    a ``torch.export.ExportedProgram``, a ``.pt2`` path, or a ``.cir`` path into CIR."""
    if isinstance(obj, Module):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        suffix = path.suffix.lower()
        if path.is_dir():
            raise ModelLoadError(f"{path} is a folder, not a model file", location=str(path),
                                 hint="give a .onnx, .pt2 or .cir file")
        if suffix == ".pt2":
            from cuvil.frontend.torch_import import import_pt2

            return import_pt2(path, **options)
        if suffix == ".cir":
            from cuvil.ir.parser import parse_module

            if not path.is_file():
                raise ModelLoadError(f"file {path} does not exist", location=str(path))
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ModelLoadError(f"{path} is not a .cir text file (not UTF-8 at byte {e.start})",
                                     location=str(path), hint="a .cir file is the text `cuvil ir` writes") from None
            return parse_module(text, filename=str(path))
        from cuvil.frontend.onnx_import import import_onnx

        return import_onnx(path, **options)
    if isinstance(obj, bytes):
        from cuvil.frontend.onnx_import import import_onnx

        return import_onnx(obj, **options)
    mod = type(obj).__module__
    if mod.startswith("onnx"):
        from cuvil.frontend.onnx_import import import_onnx

        return import_onnx(obj, **options)
    if mod.startswith("torch") or _is_torch_module(obj):
        from cuvil.frontend.torch_import import import_torch

        return import_torch(obj, example_inputs, **options)
    raise ModelLoadError(f"cannot import a {type(obj).__name__}",
                         hint="pass an ONNX file/ModelProto, a torch nn.Module with example_inputs, "
                              "an ExportedProgram, or a .pt2/.cir path")


def _is_torch_module(obj: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram))


__all__ = ["import_model"]
