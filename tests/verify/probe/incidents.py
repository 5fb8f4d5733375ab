"""Incident models: small in-process programs that reproduce real FP16/INT8 failures, each with
a safe twin (same model, smaller weights or a narrower range). Seeds are fixed; ``batch``
gives the same weights at another batch size (for sampled checks)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir import Builder, DType, Module

F16_MAX = 65504.0


@dataclass(frozen=True)
class Incident:
    name: str
    build: Callable[[int], Module]
    ranges: dict[str, tuple[float, float]]
    precision: str = "fp16"
    fails: Callable[[np.ndarray], bool] | None = None


def _f(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


# --------------------------------------------------------------------------------------
# T5-style feed-forward: relu(x Wi) Wo + x; activations past 65504 (a T5 FP16 overflow reached 66246)


def t5_weights(peak: float) -> tuple[np.ndarray, np.ndarray]:
    """Weights whose largest reachable output is exactly ``peak``: Wo >= 0 makes each output convex
    in x, so its maximum over the box is at a corner, and all 2^d corners are enumerated."""
    rng = np.random.default_rng(5)
    d, ffn = 10, 48
    wi = rng.standard_normal((d, ffn))
    wo = np.abs(rng.standard_normal((ffn, d)))
    corners = np.array(list(itertools.product((-1.0, 1.0), repeat=d)))
    reach = (np.maximum(corners @ wi, 0) @ wo + corners).max()
    return _f(wi), _f(wo * (peak / reach))


def t5_ffn(batch: int = 1, peak: float = 1.3 * F16_MAX) -> Module:
    wi, wo = t5_weights(peak)
    b = Builder()
    x = b.param("x", DType.f32, [batch, wi.shape[0]])
    h = b.relu(b.matmul(x, b.const(wi)))
    y = b.add(b.matmul(h, b.const(wo)), x)
    return b.module(b.function("main", [x], [y]))


def t5_ffn_safe(batch: int = 1) -> Module:
    return t5_ffn(batch, peak=0.1 * F16_MAX)


# --------------------------------------------------------------------------------------
# attention with a -1e9 additive mask before softmax


def attention_weights(mask_value: float) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(7)
    seq, d = 6, 8
    wq, wk, wv = (_f(rng.standard_normal((d, d)) * 0.3) for _ in range(3))
    return wq, wk, wv, _f(np.triu(np.full((seq, seq), mask_value), 1))


def attention(batch: int = 1, mask_value: float = -1e9) -> Module:
    wq, wk, wv, mask = attention_weights(mask_value)
    seq, d = mask.shape[0], wq.shape[0]
    b = Builder()
    x = b.param("x", DType.f32, [batch, seq, d])
    q, k, v = (b.matmul(x, b.const(w)) for w in (wq, wk, wv))
    scores = b.mul(b.matmul(q, k, transpose_b=True), b.const(np.float32(1 / np.sqrt(d))))
    probs = b.softmax(b.add(scores, b.const(mask)), axis=-1)
    return b.module(b.function("main", [x], [b.matmul(probs, v)]))


def attention_safe(batch: int = 1) -> Module:
    return attention(batch, mask_value=-1e4)


# --------------------------------------------------------------------------------------
# layer norm whose squared deviations overflow for large activations (the variance itself is a
# mean accumulated in f32, so only a square above 65504 overflows)


def layer_norm_weights(gain: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    d, width = 12, 32
    w = rng.standard_normal((d, width))
    w = _f(w / np.abs(w).sum(axis=0) * gain)  # every feature reaches exactly +-gain at a corner
    return w, _f(rng.uniform(0.8, 1.2, width)), _f(rng.normal(0, 0.1, width))


def spelled_layer_norm(b: Builder, h, scale, bias, eps: float):  # type: ignore[no-untyped-def]
    """A layer norm written as separate ops, as exporters without a fused op emit it: in a float16 program
    every op rounds to float16 (the fused ``layer_norm`` op normalizes in float32 instead)."""
    mean = b.reduce_mean(h, axes=(-1,), keepdims=True)
    dev = b.sub(h, mean)
    var = b.reduce_mean(b.mul(dev, dev), axes=(-1,), keepdims=True)
    norm = b.div(dev, b.sqrt(b.add(var, b.scalar(eps, h.dtype))))
    return b.add(b.mul(norm, scale), bias)


def layer_norm(batch: int = 1, gain: float = 300.0) -> Module:
    w, scale, bias = layer_norm_weights(gain)
    b = Builder()
    x = b.param("x", DType.f32, [batch, w.shape[0]])
    h = b.matmul(x, b.const(w))
    y = spelled_layer_norm(b, h, b.const(scale), b.const(bias), 1e-5)
    return b.module(b.function("main", [x], [y]))


def layer_norm_safe(batch: int = 1) -> Module:
    return layer_norm(batch, gain=8.0)


# --------------------------------------------------------------------------------------
# softmax written without the max subtraction


def naive_softmax_weights(gain: float) -> np.ndarray:
    rng = np.random.default_rng(13)
    w = rng.standard_normal((8, 10))
    return _f(w / np.abs(w).sum(axis=0) * gain)


def naive_softmax(batch: int = 1, gain: float = 16.0) -> Module:
    w = naive_softmax_weights(gain)
    b = Builder()
    x = b.param("x", DType.f32, [batch, w.shape[0]])
    e = b.exp(b.matmul(x, b.const(w)))
    y = b.div(e, b.reduce_sum(e, axes=(-1,), keepdims=True))
    return b.module(b.function("main", [x], [y]))


def naive_softmax_safe(batch: int = 1) -> Module:
    return naive_softmax(batch, gain=4.0)


# --------------------------------------------------------------------------------------
# INT8: a QDQ linear layer whose output scale was calibrated on a narrower range than it is used on


def int8_weights(calibrated: float) -> dict[str, Any]:
    rng = np.random.default_rng(17)
    d, out = 16, 8
    w = rng.standard_normal((d, out)) * 0.5
    sw = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / sw), -127, 127).astype(np.int8)
    bias = _f(rng.normal(0, 0.1, out))
    sx = np.float32(1 / 127)
    # the output scale covers what inputs in [-calibrated, calibrated] produce
    reach = calibrated * (np.abs(wq.astype(np.float64) * sw).sum(axis=0)) + np.abs(bias)
    sy = np.float32(reach.max() * 1.05 / 127)
    return {"wq": wq, "sw": sw, "bias": bias, "sx": sx, "sy": sy}


def int8_layer(batch: int = 1, calibrated: float = 0.25) -> Module:
    p = int8_weights(calibrated)
    wq, sw, bias, sx, sy = p["wq"], p["sw"], p["bias"], p["sx"], p["sy"]
    d = wq.shape[0]
    b = Builder()
    x = b.param("x", DType.f32, [batch, d])
    zero8 = b.const(np.int8(0))
    xq = b.dequantize_linear(b.quantize_linear(x, b.const(sx), zero8), b.const(sx), zero8)
    wd = b.dequantize_linear(b.const(wq), b.const(sw), zero8)
    y = b.add(b.matmul(xq, wd), b.const(bias))
    yq = b.dequantize_linear(b.quantize_linear(y, b.const(sy), zero8), b.const(sy), zero8)
    return b.module(b.function("main", [x], [yq]))


def int8_layer_safe(batch: int = 1) -> Module:
    return int8_layer(batch, calibrated=1.0)


# --------------------------------------------------------------------------------------
# oracles: the failure, computed independently with numpy in the reduced precision


F16 = np.float16


def t5_overflows(x: np.ndarray, peak: float = 1.3 * F16_MAX) -> bool:
    wi, wo = t5_weights(peak)
    h = np.maximum(x.astype(F16) @ wi.astype(F16), F16(0))
    with np.errstate(over="ignore"):
        y = h @ wo.astype(F16)
    return not np.isfinite(y).all()


def attention_overflows(x: np.ndarray, mask_value: float = -1e9) -> bool:
    wq, wk, _, mask = attention_weights(mask_value)
    x16 = x.astype(F16)
    q, k = x16 @ wq.astype(F16), x16 @ wk.astype(F16)
    scores = (q @ np.swapaxes(k, -1, -2)) * F16(1 / np.sqrt(wq.shape[0]))
    with np.errstate(over="ignore"):
        masked = (scores.astype(np.float32) + mask).astype(F16)  # the mask does not fit f16: the add stays f32
    return not np.isfinite(masked).all()


def layer_norm_overflows(x: np.ndarray, gain: float = 300.0) -> bool:
    """Whether a deviation's float16 square (or the variance) overflows: PyTorch's decomposed FP16 graph."""
    w, _, _ = layer_norm_weights(gain)
    h = x.astype(F16) @ w.astype(F16)
    n = np.float32(h.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):  # means: summed and divided in f32, rounded once
        mean = (h.astype(np.float32).sum(-1, keepdims=True) / n).astype(F16)
        dev = h - mean
        square = dev * dev
        var = (square.astype(np.float32).sum(-1) / n).astype(F16)
    return not (np.isfinite(square).all() and np.isfinite(var).all())


def naive_softmax_overflows(x: np.ndarray, gain: float = 16.0) -> bool:
    w = naive_softmax_weights(gain)
    with np.errstate(over="ignore"):
        e = np.exp(x.astype(F16) @ w.astype(F16))
    return not np.isfinite(e).all()


def int8_saturates(x: np.ndarray, calibrated: float = 0.25) -> bool:
    p = int8_weights(calibrated)
    xq = np.clip(np.round(x.astype(np.float32) / p["sx"]), -128, 127).astype(np.int32)
    bias_q = np.round(p["bias"] / (p["sx"] * p["sw"])).astype(np.int32)
    acc = xq @ p["wq"].astype(np.int32) + bias_q
    y = np.round(acc.astype(np.float32) * (p["sx"] * p["sw"] / p["sy"]))
    return bool(np.any((y < -128) | (y > 127)))


UNIT = {"x": (-1.0, 1.0)}

INCIDENTS = [
    Incident("t5_ffn", t5_ffn, UNIT, fails=t5_overflows),
    Incident("attention_mask", attention, UNIT, fails=attention_overflows),
    Incident("layer_norm", layer_norm, UNIT, fails=layer_norm_overflows),
    Incident("naive_softmax", naive_softmax, UNIT, fails=naive_softmax_overflows),
    Incident("int8_saturation", int8_layer, UNIT, "int8", fails=int8_saturates),
]

TWINS = [
    Incident("t5_ffn_safe", t5_ffn_safe, UNIT),
    Incident("attention_mask_safe", attention_safe, UNIT),
    Incident("layer_norm_safe", layer_norm_safe, UNIT),
    Incident("naive_softmax_safe", naive_softmax_safe, UNIT),
    Incident("int8_saturation_safe", int8_layer_safe, UNIT, "int8"),
]


def open_layer_norm() -> Module:
    """A layer norm spelled as separate ops after a matmul, with an epsilon (1e-12) that is 0 in float16:
    the division may be 0/0 unless the inputs are never all equal, which the biases guarantee but
    intervals cannot see, so the prober can neither prove it safe nor find an overflow (sites stay open)."""
    rng = np.random.default_rng(2)
    b = Builder()
    x = b.param("x", DType.f32, [1, 4])
    w = (rng.standard_normal((4, 8)) * 0.1).astype(np.float32)
    h = b.add(b.matmul(x, b.const(w)), b.const(np.arange(8, dtype=np.float32) * 0.01))
    y = spelled_layer_norm(b, h, b.const(np.ones(8, np.float32)), b.const(np.zeros(8, np.float32)), 1e-12)
    return b.module(b.function("main", [x], [y]))
