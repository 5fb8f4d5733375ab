"""Small CNNs whose layers the window norms read, and one-op modules whose rule factors a chosen input
reaches (shared by the window-norm and centered-norm tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from verify.probe.windows import max_window


def cnn(seed: int, blocks: int = 3, width: int = 16, size: int = 12, gain: float = 1.0, batch: int = 1) -> Module:
    """conv + bias, ReLU, max pool, residual blocks (conv, bias, ReLU, conv, bias, add, ReLU), a strided
    grouped conv, and a product by a per-channel constant."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [batch, 3, size, size])
    return b.module(b.function("main", [x], [_cnn_body(b, rng, x, blocks, width, gain)]))


def _cnn_body(b: Builder, rng: np.random.Generator, x: Any, blocks: int, width: int, gain: float) -> Any:
    def conv(v: object, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> object:
        w = rng.standard_normal((cout, cin // groups, k, k)) * gain * np.sqrt(2.0 / (cin // groups * k * k))
        y = b.conv(v, b.const(w.astype(np.float32)), strides=(stride, stride), pads=(k // 2,) * 4, groups=groups)
        return b.add(y, b.const((rng.standard_normal((1, cout, 1, 1)) * 0.3).astype(np.float32)))

    h = b.max_pool(b.relu(conv(x, 3, width, k=5)), kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    for _ in range(blocks):
        y = conv(b.relu(conv(h, width, width)), width, width)
        h = b.relu(b.add(y, h))
    h = conv(h, width, 2 * width, stride=2, groups=2)
    return b.mul(h, b.const(rng.uniform(0.5, 1.5, (1, 2 * width, 1, 1)).astype(np.float32)))


def classifier(seed: int, classes: int = 7, width: int = 16, gain: float = 1.0) -> Module:
    """:func:`cnn`'s body and a ReLU, then a classifier head as exporters write it: a global mean keeping its
    axes, a reshape to [N, C], a product by a constant read transposed, and a bias."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 3, 12, 12])
    h = b.relu(_cnn_body(b, rng, x, 3, width, gain))
    h = b.reshape(b.reduce_mean(h, axes=(2, 3), keepdims=True), shape=(1, 2 * width))
    w = b.const((rng.standard_normal((classes, 2 * width)) / np.sqrt(2 * width)).astype(np.float32))
    y = b.add(b.matmul(h, w, transpose_b=True), b.const(rng.standard_normal(classes).astype(np.float32)))
    return b.module(b.function("main", [x], [y]))


def mobile(seed: int, depth: int = 4, width: int = 16) -> Module:
    """Exporter-style layers the windows also read: an unfolded batch norm, ReLU6 as a clip, depthwise and
    pointwise convolutions, an average pool, a division and a max by constants, and a global mean."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 3, 12, 12])

    def const(*shape: int, lo: float = -1.0, hi: float = 1.0) -> object:
        return b.const(rng.uniform(lo, hi, shape).astype(np.float32))

    def bn(v: object, c: int) -> object:
        return b.batch_norm(v, const(c, lo=0.9, hi=1.1), const(c), const(c), const(c, lo=0.9, hi=1.1), epsilon=1e-5)

    h = b.conv(x, const(width, 3, 3, 3, lo=-0.4, hi=0.4), pads=(1, 1, 1, 1))
    for _ in range(depth):
        h = b.clip(bn(h, width), min=0.0, max=1e30)
        h = b.conv(h, const(width, 1, 3, 3, lo=-0.6, hi=0.6), pads=(1, 1, 1, 1), groups=width)
        h = b.conv(h, const(width, width, 1, 1, lo=-0.5, hi=0.5))
        h = b.max(b.div(h, b.scalar(1.5, DType.f32)), b.scalar(0.0, DType.f32))
    h = b.avg_pool(h, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))
    out = b.reduce_mean(h, axes=(2, 3), keepdims=False)
    return b.module(b.function("main", [x], [out]))


def one_op(build: Any, shape: tuple[int, ...] = (1, 4, 6, 6)) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [build(b, x)]))


_C = np.array([0.5, -3.0, 1.0, 2.0], np.float32).reshape(1, 4, 1, 1)
TIGHT = {  # a rule's factor is reached on an input that fills one channel with ones (channel 1: the largest |c|)
    "mul": lambda b, x: b.mul(x, b.const(_C)),
    "div": lambda b, x: b.div(x, b.const(1 / _C)),
    "avg_pool": lambda b, x: b.avg_pool(x, kernel=(2, 2), strides=(2, 2)),
    "reduce_mean": lambda b, x: b.reduce_mean(x, axes=(2, 3), keepdims=False),
    "clip": lambda b, x: b.clip(x, min=-1e9, max=1e9),
    "max": lambda b, x: b.max(x, b.scalar(0.0, DType.f32)),
    "batch_norm": lambda b, x: b.batch_norm(x, b.const(np.abs(_C.reshape(-1))), b.const(np.zeros(4, np.float32)),
                                            b.const(np.zeros(4, np.float32)), b.const(np.ones(4, np.float32)),
                                            epsilon=0.0),
}



def strided_conv(w: np.ndarray, x: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """``y[o, i, j] = Σ w[o, c, a, b] x[c, s·i + a - pad, s·j + b - pad]`` on the torus (outputs: 1/s of it)."""
    size = x.shape[1] // stride
    y = np.zeros((w.shape[0], size, size))
    for a in range(w.shape[2]):
        for b in range(w.shape[3]):
            shifted = np.roll(x, (pad - a, pad - b), axis=(1, 2))[:, ::stride, ::stride]
            y += np.einsum("oc,cij->oij", w[:, :, a, b], shifted)
    return y


def window_distance(a: np.ndarray, c: Any, win: tuple[int, ...]) -> float:
    """The largest ℓ2 norm of ``a - c`` over a ``win`` window (all channels)."""
    d = np.asarray(a, dtype=np.float64) - c
    return max_window(np.sum(d * d, axis=1), win)
