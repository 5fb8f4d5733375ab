"""quantize_linear / dequantize_linear against PyTorch's quantized tensors and the numpy formula
(round half to even, saturate). Each case runs through the fast path and through the compute rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from cuvil.errors import ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from tests.ir.op_testing import run_op


def check(name: str, arrays: list[np.ndarray], expected: np.ndarray, **attrs: Any) -> None:
    fast, rule = run_op(name, arrays, **attrs)
    for what, got in (("fast path", fast), ("rule", rule)):
        assert got.dtype == expected.dtype, f"{name} {what}: dtype {got.dtype} != {expected.dtype}"
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} {what} {attrs}")


def data(*shape: int, scale: float = 40.0, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation:UserWarning")

TORCH_Q = {np.int8: torch.qint8, np.uint8: torch.quint8}


@pytest.mark.parametrize("qdtype", [np.int8, np.uint8])
def test_quantize_per_tensor_matches_torch(qdtype):
    x = data(2, 3, 4)
    scale, zp = 0.37, (-5 if qdtype == np.int8 else 120)
    q = torch.quantize_per_tensor(torch.from_numpy(x), scale, zp, TORCH_Q[qdtype])
    check("quantize_linear", [x, np.array(scale, np.float32), np.array(zp, qdtype)], q.int_repr().numpy())


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis_matches_torch(axis):
    x = data(3, 4, 5)
    n = x.shape[axis]
    scales = np.linspace(0.2, 1.5, n).astype(np.float32)
    zps = np.arange(n).astype(np.int8) * 3 - 4
    q = torch.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(scales.astype(np.float64)),
                                   torch.from_numpy(zps.astype(np.int64)), axis % 3, torch.qint8)
    check("quantize_linear", [x, scales, zps], q.int_repr().numpy(), axis=axis)


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e9, -1e9, np.inf, -np.inf, 126.5, -128.5], np.float32)
    expected = np.clip(np.rint(x) + 1, -128, 127).astype(np.int8)
    assert expected[:6].tolist() == [1, 3, 3, 1, -1, -1]  # ties went to even before the zero point
    check("quantize_linear", [x, np.array(1.0, np.float32), np.array(1, np.int8)], expected)


@pytest.mark.parametrize("qdtype", [np.int16, np.uint16])
def test_quantize_16_bit(qdtype):
    x = data(4, 6, scale=30000.0)
    zp = 1000 if qdtype == np.int16 else 30000
    expected = np.clip(np.rint(x / np.float32(0.5)) + zp, np.iinfo(qdtype).min, np.iinfo(qdtype).max)
    check("quantize_linear", [x, np.array(0.5, np.float32), np.array(zp, qdtype)], expected.astype(qdtype))


def test_quantize_blocked():
    x = data(2, 5)
    scales = np.array([[0.5, 2.0], [0.25, 1.0]], np.float32)  # blocks of 3 along axis 1 (the last one is short)
    zps = np.array([[1, -2], [0, 3]], np.int8)
    s_full = np.repeat(scales, 3, axis=1)[:, :5]
    z_full = np.repeat(zps, 3, axis=1)[:, :5]
    expected = np.clip(np.rint(x / s_full) + z_full, -128, 127).astype(np.int8)
    check("quantize_linear", [x, scales, zps], expected, axis=1, block_size=3)


@pytest.mark.parametrize("qdtype", [np.int8, np.uint8])
def test_dequantize_matches_torch(qdtype):
    x = data(3, 4)
    q = torch.quantize_per_tensor(torch.from_numpy(x), 0.25, 7, TORCH_Q[qdtype])
    raw = q.int_repr().numpy()
    check("dequantize_linear", [raw, np.array(0.25, np.float32), np.array(7, qdtype)], q.dequantize().numpy())


def test_dequantize_per_axis_and_int32():
    x = np.random.default_rng(1).integers(-2**31, 2**31, (3, 4)).astype(np.int32)
    scales = np.array([1e-3, 2e-3, 5e-4], np.float32)
    zps = np.array([0, 7, -9], np.int32)
    expected = ((x.astype(np.float64) - zps[:, None]) * scales[:, None].astype(np.float64)).astype(np.float32)
    check("dequantize_linear", [x, scales, zps], expected, axis=0)


def test_dequantize_to_half_precision():
    x = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    scales = np.array([0.5, 0.125, 2.0, 1.0], np.float16)
    zps = np.array([1, 0, -3, 2], np.int8)
    expected = ((x.astype(np.float32) - zps) * scales.astype(np.float32)).astype(np.float16)
    check("dequantize_linear", [x, scales, zps], expected, axis=1)


def test_quantize_with_symbolic_batch():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 3])
    q = b.quantize_linear(x, b.const(np.array([0.5, 1.0, 2.0], np.float32)), b.const(np.array([0, 1, 2], np.uint8)))
    m = b.module(b.function("main", [x], [b.dequantize_linear(q, b.const(np.array([0.5, 1.0, 2.0], np.float32)),
                                                              b.const(np.array([0, 1, 2], np.uint8)))]))
    for rows in (1, 4):
        xv = data(rows, 3, scale=3.0, seed=rows)
        s, z = np.array([0.5, 1.0, 2.0], np.float32), np.array([0, 1, 2], np.float32)
        want = ((np.clip(np.rint(xv / s) + z, 0, 255) - z) * s).astype(np.float32)
        np.testing.assert_array_equal(run_reference(m, [xv])[0], want)


def test_quant_ops_reject_bad_parameters():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    s4 = b.const(np.ones(4, np.float32))
    with pytest.raises(ShapeError):  # a per-axis scale of the wrong length
        b.quantize_linear(x, s4, b.const(np.zeros(4, np.int8)), axis=0)
    with pytest.raises(ShapeError):  # zero point and scale shapes differ
        b.quantize_linear(x, s4, b.const(np.zeros((), np.int8)), axis=1)
    with pytest.raises(ShapeError):  # an unsupported quantized type
        b.quantize_linear(x, b.const(np.ones((), np.float32)), b.const(np.zeros((), np.int64)))
    with pytest.raises(ShapeError):  # the zero point of dequantize must have x's dtype
        b.dequantize_linear(b.param("q", DType.i8, [3]), b.const(np.ones((), np.float32)),
                            b.const(np.zeros((), np.uint8)))
