"""ONNX spectral windows, DFT and STFT: constant tables of twiddle factors times the signal."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cuvil.frontend.onnx_node import ONNX_DTYPES, NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import (
    cast_to,
    fill,
    positions,
    reshape_to,
    scalar,
    slice_along,
    stack,
    static_scalar,
    take,
    unsqueeze,
)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.values import Value


def _window(ctx: NodeCtx, coeffs: Sequence[float]) -> Value:
    """sum_k (-1)^k c_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
    b = ctx.b
    size = int(static_scalar(ctx, 0))
    dtype = ONNX_DTYPES.get(ctx.attr_int("output_datatype", 1))
    if dtype is None or (not dtype.is_float and not dtype.is_int):
        raise ctx.unsupported(f"output_datatype {ctx.attr_int('output_datatype', 1)}")
    periodic = bool(ctx.attr_int("periodic", 1))
    denom = size if periodic else size - 1
    n = positions(b, [size], DType.f64)
    out = fill(b, [size], coeffs[0], DType.f64)
    for k, c in enumerate(coeffs[1:], start=1):
        if denom <= 0:
            break
        angle = b.mul(n, scalar(b, 2.0 * math.pi * k / denom, DType.f64))
        term = b.mul(b.cos(angle), scalar(b, c, DType.f64))
        out = b.sub(out, term) if k % 2 else b.add(out, term)
    return b.cast(out, to=dtype)


@onnx_op("HannWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def hann_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [0.5, 0.5])


@onnx_op("HammingWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def hamming_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [25.0 / 46.0, 21.0 / 46.0])


@onnx_op("BlackmanWindow", emits=("iota", "cos", "mul", "add", "sub", "cast", "fill"))
def blackman_window(ctx: NodeCtx) -> Value:
    return _window(ctx, [0.42, 0.5, 0.08])


def _dft(b: Builder, x: Value, axis: int, length: int, inverse: bool, onesided: bool) -> Value:
    """The DFT of ``x`` (trailing dim 1: real, 2: complex) along ``axis``, computed in f64.

    Forward: out_j = sum_i x_i e^{-2 pi i ij/L}, the first L//2+1 bins when one-sided.
    Inverse: out_j = (1/L) sum_i x_i e^{+2 pi i ij/L}; one-sided input is the half spectrum of a
    real signal (each bin but the first and the Nyquist one stands for its mirror too) and gives
    a real output."""
    rank = x.type.rank
    perm = [k for k in range(rank - 1) if k != axis] + [axis, rank - 1]
    xt = b.transpose(x, perm=perm) if perm != list(range(rank)) else x
    parts = xt.shape[-1]
    n_in = xt.shape[-2]
    assert isinstance(n_in, int)  # DFT and STFT check that the signal axis is static
    real_out = inverse and onesided
    rows = min(n_in, length // 2 + 1 if real_out else length)
    cols = length // 2 + 1 if onesided and not inverse else length
    i = np.arange(rows, dtype=np.int64)[:, None]
    j = np.arange(cols, dtype=np.int64)[None, :]
    angle = (2.0 * np.pi / length) * ((i * j) % length)
    sign = 1.0 if inverse else -1.0
    weight = np.ones((rows, 1))
    if real_out:
        weight[1:] = 2.0
        if length % 2 == 0 and rows > length // 2:
            weight[length // 2] = 1.0
    scale = weight / length if inverse else weight
    cos_t = b.const(np.cos(angle) * scale)
    sin_t = b.const(sign * np.sin(angle) * scale)

    def component(k: int) -> Value:
        v = cast_to(b, take(b, xt, rank - 1, k), DType.f64)
        return slice_along(b, v, -1, 0, rows) if n_in != rows else v

    re = component(0)
    out_re = b.matmul(re, cos_t)
    out_im = b.matmul(re, sin_t)
    if parts == 2:
        im = component(1)
        out_re = b.sub(out_re, b.matmul(im, sin_t))
        out_im = b.add(out_im, b.matmul(im, cos_t))
    out = unsqueeze(b, out_re, -1) if real_out else stack(b, [out_re, out_im], -1)
    out = cast_to(b, out, x.dtype)
    inv = [perm.index(k) for k in range(rank)]
    return b.transpose(out, perm=inv) if inv != list(range(rank)) else out


@onnx_op("DFT", emits=("transpose", "gather", "cast", "slice", "matmul", "add", "sub", "concat", "reshape"))
def dft(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    rank = x.type.rank
    if ctx.opset >= 20:
        axis = int(static_scalar(ctx, 2)) if ctx.has_input(2) else -2
    else:
        axis = ctx.attr_int("axis", 1)
    axis = norm_axis(axis, rank)
    if axis == rank - 1:
        raise ctx.unsupported("the axis cannot be the trailing real/imaginary axis")
    if x.shape[-1] not in (1, 2) or not isinstance(x.shape[axis], int):
        raise ctx.unsupported(f"needs a static signal axis and a trailing dim of 1 or 2, got {x.type}")
    inverse, onesided = bool(ctx.attr_int("inverse", 0)), bool(ctx.attr_int("onesided", 0))
    n = int(x.shape[axis])
    if ctx.has_input(1):
        length = int(static_scalar(ctx, 1))
    else:
        length = 2 * (n - 1) if inverse and onesided else n
    if length <= 0:
        raise ctx.unsupported(f"dft_length {length}")
    return _dft(ctx.b, x, axis, length, inverse, onesided)


@onnx_op("STFT", emits=("gather", "mul", "reshape", "transpose", "cast", "matmul", "add", "sub", "concat"))
def stft(ctx: NodeCtx) -> Value:
    """Frames of the signal (gathered by a constant index table), windowed, then one DFT per frame."""
    b = ctx.b
    x = ctx.input(0)
    if x.type.rank != 3 or not isinstance(x.shape[1], int):
        raise ctx.unsupported(f"the signal must be [batch, length, 1 or 2] with a static length, got {x.type}")
    step = int(static_scalar(ctx, 1))
    window = ctx.input(2) if ctx.has_input(2) else None
    if ctx.has_input(3):
        frame = int(static_scalar(ctx, 3))
    elif window is not None and isinstance(window.shape[0], int):
        frame = int(window.shape[0])
    else:
        raise ctx.unsupported("needs a frame_length or a window of static size")
    frames = 1 + (int(x.shape[1]) - frame) // step
    if step <= 0 or frame <= 0 or frames <= 0:
        raise ctx.unsupported(f"frame_step {step} and frame_length {frame} on a signal of {x.shape[1]}")
    idx = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(frame, dtype=np.int64)[None, :]
    framed = b.gather(x, b.const(idx), axis=1)  # [B, frames, frame, c]
    if window is not None:
        framed = b.mul(framed, reshape_to(b, cast_to(b, window, x.dtype), [1, 1, frame, 1]))
    return _dft(b, framed, 2, frame, False, bool(ctx.attr_int("onesided", 1)))
