"""Tiny models whose outputs have closed numpy formulas, shared by the runtime tests."""

from __future__ import annotations

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.types import DimConstraint

SCALE = np.linspace(-1.5, 2.0, 8, dtype=np.float32)
SHIFT = np.linspace(0.5, -0.25, 8, dtype=np.float32)


def scaled_softmax(x: np.ndarray, scale: np.ndarray = SCALE, shift: np.ndarray = SHIFT) -> np.ndarray:
    """numpy formula of the model built by :func:`softmax_module`."""
    h = np.maximum(x.astype(np.float64) * scale + shift, 0.0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def softmax_module(rows: int | str = 4, scale: np.ndarray = SCALE, *,
                   constraints: tuple[DimConstraint, ...] = ()) -> Module:
    """y = softmax(relu(x * scale + shift)) over x: f32[rows, 8] (rows may be a symbol)."""
    b = Builder()
    x = b.param("x", DType.f32, [rows, 8])
    y = b.softmax(b.relu(b.add(b.mul(x, b.const(scale)), b.const(SHIFT))), axis=-1)
    return b.module(b.function("main", [x], [y], ["y"], constraints=constraints))
