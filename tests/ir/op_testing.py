"""Shared checks for op tests: run an op through the fast path and through its compute rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cuvil.interp import evaluate_rule, run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType


def run_fast(name: str, arrays: list[np.ndarray], **attrs: Any) -> tuple[np.ndarray, TensorType]:
    """The op through a built module (the numpy fast path), with its result type."""
    b = Builder()
    params = [b.param(f"x{k}", DType.from_numpy(a.dtype), a.shape) for k, a in enumerate(arrays)]
    out = b.op(name, *params, **attrs)
    [fast] = run_reference(b.module(b.function("main", params, [out])), arrays)
    return fast, out.type


def run_rule(name: str, arrays: list[np.ndarray], out_type: TensorType, **attrs: Any) -> np.ndarray:
    """The op through its compute rule."""
    op = get_op(name)
    return evaluate_rule(op, arrays, op.check_attrs(attrs), out_type)


def run_op(name: str, arrays: list[np.ndarray], **attrs: Any) -> tuple[np.ndarray, np.ndarray]:
    """The op's result through the fast path and through its compute rule."""
    fast, out_type = run_fast(name, arrays, **attrs)
    return fast, run_rule(name, arrays, out_type, **attrs)


def check(name: str, arrays: list[np.ndarray], expected: np.ndarray, tol: float = 0.0, **attrs: Any) -> None:
    expected = np.asarray(expected)
    fast, rule = run_op(name, arrays, **attrs)
    for what, got in (("fast path", fast), ("rule", rule)):
        assert got.shape == expected.shape, f"{name} {what} {attrs}: shape {got.shape} != {expected.shape}"
        assert got.dtype == expected.dtype, f"{name} {what} {attrs}: dtype {got.dtype} != {expected.dtype}"
        if tol:
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=f"{name} {what} {attrs}")
        else:
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} {what} {attrs}")


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))
