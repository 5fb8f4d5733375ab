"""Quantization: QuantizeLinear and DequantizeLinear (per-tensor, per-axis and blocked).

The scale and zero point are indexed per output element: rank 0 is one pair for the
whole tensor, rank 1 one pair per position along ``axis``, and with ``block_size`` a
pair per block of that many positions. Rounding is half to even; quantizing saturates.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from cuvil.errors import InputError
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import define
from cuvil.ir.types import TensorType

NARROW_FLOATS = (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz, DType.f4e2m1)
QUANT_DTYPES = (DType.i8, DType.u8, DType.i16, DType.u16, DType.i4, DType.u4, DType.i2, DType.u2, *NARROW_FLOATS)
DEQUANT_DTYPES = (*QUANT_DTYPES, DType.i32)


def quant_range(dt: DType) -> tuple[float, float]:
    """The saturation range of a quantized type (largest finite values for float8/float4)."""
    if dt.is_float:
        hi = float(ml_dtypes.finfo(dt.np).max)
        return -hi, hi
    info = ml_dtypes.iinfo(dt.np)
    return float(info.min), float(info.max)


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def _check_params(x: TensorType, scale: TensorType, zp: TensorType, axis: int, block_size: int) -> None:
    if not scale.dtype.is_float:
        raise TypeError(f"scale must be a float tensor, got {scale.dtype}")
    if zp.shape != scale.shape:
        raise ValueError(f"zero point {zp} and scale {scale} must have one shape")
    if block_size < 0:
        raise ValueError(f"block_size must be >= 0, got {block_size}")
    if scale.rank == 0:
        return
    ax = _axis(axis, x.rank)
    if block_size:
        if scale.rank != x.rank:
            raise ValueError(f"blocked scale {scale} must have the rank of x {x}")
        for k, (s, d) in enumerate(zip(scale.shape, x.shape, strict=True)):
            want = -(-d // block_size) if k == ax else d
            if isinstance(s, int) and isinstance(want, int) and s != want:
                raise ValueError(f"blocked scale dim {k} must be {want}, got {s}")
        return
    if scale.rank != 1:
        raise ValueError(f"scale must be a scalar or a vector along axis {axis}, got {scale}")
    if isinstance(scale.shape[0], int) and isinstance(x.shape[ax], int) and scale.shape[0] != x.shape[ax]:
        raise ValueError(f"per-axis scale {scale} must have dim {ax} of x {x} ({x.shape[ax]}) entries")


def _param_index(c: R.RuleCtx, scale: R.TensorRef) -> list[R.Ix]:
    if scale.rank == 0:
        return []
    ax = _axis(c.attrs["axis"], c.out_type.rank)
    bs = c.attrs["block_size"]
    if bs:
        return [o // bs if k == ax else o for k, o in enumerate(c.out)]
    return [c.out[ax]]


def _param_numpy(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point broadcastable against x."""
    if p.ndim == 0:
        return p
    ax = _axis(axis, len(shape))
    if block_size:
        return np.repeat(p, block_size, axis=ax)[tuple(slice(0, d) for d in shape)]
    return p.reshape([shape[ax] if k == ax else 1 for k in range(len(shape))])


def _np_dtype(dt: np.dtype) -> DType:
    try:
        return DType.from_numpy(dt)
    except InputError:
        return DType.f32


def _quotient_dtype(x: DType, scale: DType) -> DType:
    """The dtype x / scale is computed in (numpy promotion, as the ONNX reference does)."""
    return _np_dtype(np.result_type(x.np, scale.np))


def _wide(dt: DType) -> DType:
    """Integers of the quantized ranges are exact in f32 (f64 when the math is already f64)."""
    return DType.f64 if dt is DType.f64 else DType.f32


# --------------------------------------------------------------------------------------
# quantize_linear


def _quantize_type(types: list[TensorType], axis: int, block_size: int) -> TensorType:
    x, scale, zp = types
    if not (x.dtype.is_float or x.dtype is DType.i32):
        raise TypeError(f"x must be a float (or i32) tensor, got {x.dtype}")
    if zp.dtype not in QUANT_DTYPES:
        raise TypeError(f"zero point dtype must be one of {', '.join(map(str, QUANT_DTYPES))}, got {zp.dtype}")
    _check_params(x, scale, zp, axis, block_size)
    return x.with_dtype(zp.dtype)


def _quantize_rule(c: R.RuleCtx) -> R.Expr:
    x, scale, zp = c.inputs
    q = _quotient_dtype(x.dtype, scale.dtype)
    w = _wide(q)
    pidx = _param_index(c, scale)
    lo, hi = quant_range(zp.dtype)
    quotient = R.cast(x.at(*c.out), q) / R.cast(scale.at(*pidx), q)
    if zp.dtype.is_float:  # float8/float4: the cast itself rounds to nearest even
        shifted = R.cast(quotient, w) + R.cast(zp.at(*pidx), w)
        return R.cast(R.smin(R.smax(shifted, lo), hi), zp.dtype)
    shifted = R.cast(R.call("round_even", quotient), w) + R.cast(zp.at(*pidx), w)
    return R.cast(R.smin(R.smax(shifted, lo), hi), zp.dtype)


def _quantize_numpy(xs: list[np.ndarray], out: TensorType, axis: int, block_size: int) -> np.ndarray:
    x, scale, zp = xs
    q = _quotient_dtype(DType.from_numpy(x.dtype), DType.from_numpy(scale.dtype)).np
    w = _wide(DType.from_numpy(q)).np
    s = _param_numpy(scale, x.shape, axis, block_size).astype(q)
    z = _param_numpy(zp, x.shape, axis, block_size).astype(w)
    zdt = DType.from_numpy(zp.dtype)
    lo, hi = quant_range(zdt)
    quotient = x.astype(q) / s
    if zdt.is_float:
        return np.clip(quotient.astype(w) + z, lo, hi).astype(zp.dtype)
    v = np.clip(np.round(quotient).astype(w) + z, lo, hi)
    return np.where(np.isfinite(v), v, 0).astype(zp.dtype)


def _quant_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    x = (rng.standard_normal((2, 3, 4)) * 40).astype(np.float32)
    x.flat[:4] = [2.5, -2.5, 3.5, np.inf]
    return [
        ([x, np.array(1.0, np.float32), np.array(3, np.uint8)], {}),
        ([x, np.array([0.5, 2.0, 0.25], np.float32), np.array([0, -3, 100], np.int8)], {"axis": 1}),
        ([x, np.array([0.5, 2.0, 0.25, 4.0], np.float32), np.array([0, -3, 100, 7], np.int16)], {"axis": -1}),
        ([x.astype(np.float16), np.full((2, 3, 2), 0.5, np.float16), np.full((2, 3, 2), 9, np.uint16)],
         {"axis": 2, "block_size": 3}),
        ([x.astype(ml_dtypes.bfloat16), np.array(0.125, ml_dtypes.bfloat16), np.array(-1, np.int8)], {})]


define("quantize_linear", ("x", "scale", "zero_point"), attrs={"axis": ("int", 1), "block_size": ("int", 0)},
       shape=_quantize_type, rule=_quantize_rule, numpy=_quantize_numpy, family="quant",
       doc="saturate(round_half_even(x / scale) + zero_point) in the zero point's dtype; scale and zero point "
           "per tensor (rank 0), per position along `axis` (rank 1) or per block of `block_size`",
       examples=_quant_examples)


# --------------------------------------------------------------------------------------
# dequantize_linear


def _dequantize_type(types: list[TensorType], axis: int, block_size: int) -> TensorType:
    x, scale, zp = types
    if x.dtype not in DEQUANT_DTYPES:
        raise TypeError(f"x dtype must be one of {', '.join(map(str, DEQUANT_DTYPES))}, got {x.dtype}")
    if zp.dtype is not x.dtype:
        raise TypeError(f"zero point dtype {zp.dtype} differs from x's {x.dtype}")
    _check_params(x, scale, zp, axis, block_size)
    return x.with_dtype(scale.dtype)


def _dequant_dtype(x: DType, scale: DType) -> DType:
    """(x - zero_point) is exact in f32 for 8/16-bit x; i32 x and f64 scales use f64."""
    return DType.f64 if scale is DType.f64 or x is DType.i32 else DType.f32


def _dequantize_rule(c: R.RuleCtx) -> R.Expr:
    x, scale, zp = c.inputs
    w = _dequant_dtype(x.dtype, scale.dtype)
    pidx = _param_index(c, scale)
    v = (R.cast(x.at(*c.out), w) - R.cast(zp.at(*pidx), w)) * R.cast(scale.at(*pidx), w)
    return R.cast(v, scale.dtype)


def _dequantize_numpy(xs: list[np.ndarray], out: TensorType, axis: int, block_size: int) -> np.ndarray:
    x, scale, zp = xs
    w = _dequant_dtype(DType.from_numpy(x.dtype), DType.from_numpy(scale.dtype)).np
    s = _param_numpy(scale, x.shape, axis, block_size).astype(w)
    z = _param_numpy(zp, x.shape, axis, block_size).astype(w)
    return ((x.astype(w) - z) * s).astype(scale.dtype)


define("dequantize_linear", ("x", "scale", "zero_point"), attrs={"axis": ("int", 1), "block_size": ("int", 0)},
       shape=_dequantize_type, rule=_dequantize_rule, numpy=_dequantize_numpy, family="quant",
       doc="(x - zero_point) * scale in the scale's dtype; parameters per tensor, per axis or per block",
       examples=lambda rng: [
           ([rng.integers(-128, 128, (2, 3, 4)).astype(np.int8), np.array(0.5, np.float32), np.array(-7, np.int8)], {}),
           ([rng.integers(0, 256, (2, 3, 4)).astype(np.uint8), np.array([0.5, 2.0, 0.25], np.float16),
             np.array([0, 3, 255], np.uint8)], {"axis": 1}),
           ([rng.integers(-2**31, 2**31, (4, 3)).astype(np.int32), np.full((2, 3), 1e-3, np.float32),
             np.zeros((2, 3), np.int32)], {"axis": 0, "block_size": 2})])
