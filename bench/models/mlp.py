"""MLP 784-512-512-10 (ReLU): the smallest zoo model, at batch 1 and batch 64."""

from __future__ import annotations

from typing import Any

from bench.models import ZooModel, seeded_generator


def _sizes(small: bool) -> tuple[int, ...]:
    return (64, 48, 32, 10) if small else (784, 512, 512, 10)


def build_mlp(small: bool) -> Any:
    import torch.nn as nn

    d = _sizes(small)
    return nn.Sequential(nn.Linear(d[0], d[1]), nn.ReLU(), nn.Linear(d[1], d[2]), nn.ReLU(), nn.Linear(d[2], d[3]))


def mlp_inputs(small: bool, batch: int) -> tuple[Any, ...]:
    import torch

    return (torch.randn(batch, _sizes(small)[0], generator=seeded_generator("mlp")),)


MLP = ZooModel("mlp", "MLP 784-512-512-10, batch 1", build_mlp, mlp_inputs, ("x",), ("logits",), batch=1)
MLP_B64 = ZooModel("mlp_b64", "MLP 784-512-512-10, batch 64", build_mlp, mlp_inputs, ("x",), ("logits",), batch=64)
