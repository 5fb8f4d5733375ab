"""The 2-D transposed convolution kernel (cuvil.codegen.kernels.conv_transpose) is a schedule of the op's rule:
bit for bit the interpreter's result and the generic lowering's, signed zeros, infinities and NaNs included,
over random geometries (strides, asymmetric pads, dilations, groups, output padding, rows of one to several
vectors, taps that reach nothing) and on one and three threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from tests.oracles import rule_reference, same_float32_bits

Geometry = tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]

FIXED: list[Geometry] = [
    ((1, 6, 5, 7), (6, 4, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1), "output_padding": (1, 1)}),
    ((2, 4, 3, 3), (4, 3, 2, 3), {"groups": 2, "dilations": (2, 1), "strides": (1, 2), "pads": (0, 1, 1, 1)}),
    ((1, 9, 8, 12), (9, 5, 2, 2), {"strides": (2, 2)}),  # an upsampling layer: one tap per output
    ((1, 3, 4, 40), (3, 5, 3, 3), {"pads": (2, 2, 0, 0)}),  # phases of 40 and 42 outputs: vectors and a tail
    ((1, 2, 3, 4), (2, 2, 5, 4), {"strides": (3, 3), "pads": (0, 1, 2, 0), "output_padding": (2, 1)}),
    ((1, 2, 2, 2), (2, 3, 1, 1), {"strides": (3, 3), "output_padding": (2, 2)}),  # outputs no tap reaches
    ((1, 1, 1, 70), (1, 1, 1, 3), {"strides": (1, 2), "dilations": (1, 3)}),  # a row of several vectors
]


def _random_geometries(rng: np.random.Generator, count: int) -> list[Geometry]:
    out: list[Geometry] = []
    while len(out) < count:
        groups = int(rng.integers(1, 3))
        c, og = groups * int(rng.integers(1, 4)), int(rng.integers(1, 4))
        kh, kw = (int(k) for k in rng.integers(1, 5, 2))
        sy, sx = (int(s) for s in rng.integers(1, 4, 2))
        dy, dx = (int(d) for d in rng.integers(1, 3, 2))
        pads = [int(p) for p in rng.integers(0, 3, 4)]
        h, w = int(rng.integers(1, 7)), int(rng.integers(1, 30))
        padding = (int(rng.integers(0, sy)), int(rng.integers(0, sx)))
        oh = (h - 1) * sy + (kh - 1) * dy + 1 - pads[0] - pads[2] + padding[0]
        ow = (w - 1) * sx + (kw - 1) * dx + 1 - pads[1] - pads[3] + padding[1]
        if oh < 1 or ow < 1 or padding[0] >= max(sy, dy) or padding[1] >= max(sx, dx):
            continue
        out.append(((int(rng.integers(1, 3)), c, h, w), (c, og, kh, kw),
                    {"groups": groups, "strides": (sy, sx), "dilations": (dy, dx), "pads": tuple(pads),
                     "output_padding": padding}))
    return out


def _module(geometries: list[Geometry]) -> Module:
    b = Builder()
    params, outs = [], []
    for i, (xs, ws, attrs) in enumerate(geometries):
        x, w = b.param(f"x{i}", DType.f32, list(xs)), b.param(f"w{i}", DType.f32, list(ws))
        params += [x, w]
        outs.append(b.conv_transpose(x, w, **attrs))
    return b.module(b.function("main", params, outs, [f"y{i}" for i in range(len(outs))]))


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with zeros of both signs, and rarely an infinity or a NaN."""
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    for value, every in ((0.0, 5), (-0.0, 7), (np.inf, 53), (-np.inf, 59), (np.nan, 61)):
        flat[rng.integers(0, every, flat.size) == 0] = value
    return a


@pytest.mark.parametrize("threads", [1, 3])
def test_transposed_convolution_matches_the_rule_bit_for_bit(threads: int) -> None:
    rng = np.random.default_rng(41 + threads)
    geometries = FIXED + _random_geometries(rng, 18)
    module = _module(geometries)
    fast = compile(module, cache=False, threads=threads)
    assert fast.manifest["kernels"].count("conv_transpose.rows") == len(geometries), fast.manifest["kernels"]
    with kernels.generic_only():
        generic = compile(module, cache=False)
    args = [_values(rng, tuple(int(d) for d in p.shape)) for p in module.main.params]
    got, slow = fast(*args), generic(*args)
    want = rule_reference(module, args)
    for i, geometry in enumerate(geometries):
        assert same_float32_bits(np.asarray(got[i]), want[i]), geometry
        assert same_float32_bits(np.asarray(slow[i]), want[i]), geometry


def test_a_half_precision_or_one_dimensional_transposed_convolution_keeps_the_rule_lowering() -> None:
    b = Builder()
    x1, w1 = b.param("x1", DType.f32, [1, 2, 9]), b.param("w1", DType.f32, [2, 3, 3])
    x2, w2 = b.param("x2", DType.f16, [1, 2, 3, 3]), b.param("w2", DType.f16, [2, 3, 2, 2])
    y1, y2 = b.conv_transpose(x1, w1, strides=(2,)), b.conv_transpose(x2, w2, strides=(2, 2))
    module = b.module(b.function("main", [x1, w1, x2, w2], [y1, y2], ["y1", "y2"]))
    lib = compile(module, cache=False)
    assert "conv_transpose.rows" not in lib.manifest["kernels"]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(tuple(int(d) for d in p.shape)).astype(p.dtype.np) for p in module.main.params]
    for got, want in zip(lib(*args), rule_reference(module, args), strict=True):
        assert same_float32_bits(np.asarray(got, np.float32), np.asarray(want, np.float32))
