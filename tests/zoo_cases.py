"""Zoo models as test cases: each model through each frontend it has."""

import pytest

from cuvil.errors import UnsupportedOpError


def import_zoo(zm, frontend):
    """The model's CIR module through ``frontend`` ("onnx" or "torch")."""
    if frontend == "torch":
        from cuvil.frontend.torch_import import import_torch

        return import_torch(zm.build(), zm.example_inputs())
    from cuvil.frontend.onnx_import import import_onnx

    try:
        return import_onnx(zm.to_onnx())
    except UnsupportedOpError as e:  # the frontend's coverage is tested elsewhere
        pytest.skip(f"ONNX frontend: {e.message}")


def zoo_cases(table):
    """One pytest case per (model, frontend), ids like ``resnet18-torch``."""
    return [pytest.param(name, fe, id=f"{name}-{fe}") for name, zm in table.items()
            for fe in (("onnx", "torch") if zm.has_torch_reference else ("onnx",))]
