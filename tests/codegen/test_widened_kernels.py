"""Float16 and bfloat16 matrix products and convolutions, with and without fused epilogues, on the
float32 kernels (cuvil.codegen.kernels.widen): the kernel is chosen, and the result is bit for bit the
op's rule evaluated by the interpreter (exact products of halves, a float32 sum in K order, one
rounding to the half type, the epilogue's own roundings) and the generic lowering's. Products of two halves
are exact in float32, so the kernels' fused multiply-adds round exactly as the rule's separate
product and sum do; long K (several cache blocks) and threads included."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference

RNG = np.random.default_rng(23)
HALF = {"f16": DType.f16, "bf16": DType.bf16}


def _h(h: DType, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(h.np)


def _matmul(b: Builder, h: DType):
    x = b.param("x", h, [19, 40])
    return [x], b.matmul(x, b.const(_h(h, 40, 33, scale=0.2)))


def _linear_relu(b: Builder, h: DType):  # matmul + bias + relu: one fused epilogue after the pipeline
    x = b.param("x", h, [7, 64])
    return [x], b.relu(b.add(b.matmul(x, b.const(_h(h, 64, 48, scale=0.15))), b.const(_h(h, 48))))


def _conv_residual(b: Builder, h: DType):  # conv + bias + residual + relu
    x = b.param("x", h, [2, 8, 9, 9])
    y = b.conv(x, b.const(_h(h, 8, 8, 3, 3, scale=0.15)), pads=(1, 1, 1, 1))
    return [x], b.relu(b.add(b.add(y, b.const(_h(h, 1, 8, 1, 1))), x))


def _long_k(b: Builder, h: DType):  # K over several of the kernel's cache blocks, M and N over several tiles
    x = b.param("x", h, [70, 2100])
    return [x], b.matmul(x, b.const(_h(h, 2100, 80, scale=0.03)))


def _conv_strided(b: Builder, h: DType):
    x = b.param("x", h, [1, 3, 16, 15])
    return [x], b.conv(x, b.const(_h(h, 5, 3, 3, 3, scale=0.3)), strides=(2, 2), pads=(1, 0, 1, 1))


def _mixed(b: Builder, h: DType):  # a float32 operand in the epilogue: widened where float16, read as is where not
    x, s = b.param("x", h, [5, 32]), b.param("s", DType.f32, [5, 24])
    y = b.matmul(x, b.const(_h(h, 32, 24, scale=0.2)))
    return [x, s], b.cast(b.mul(b.cast(y, to=DType.f32), s), to=h)


CASES: dict[str, Callable] = {"matmul": _matmul, "linear-relu": _linear_relu, "conv-residual": _conv_residual,
                              "conv-strided": _conv_strided, "mixed": _mixed, "long-k": _long_k}


@pytest.mark.parametrize("half", sorted(HALF))
@pytest.mark.parametrize("name", sorted(CASES))
def test_half_contraction_runs_widened_and_matches_the_rule(name: str, half: str) -> None:
    b = Builder()
    params, y = CASES[name](b, HALF[half])
    module = b.module(b.function("main", params, [y]))
    args = [_h(HALF[half], *(int(d) for d in p.shape)) if p.dtype is HALF[half] else RNG.standard_normal(
        tuple(int(d) for d in p.shape)).astype(np.float32) for p in params]
    fast = compile(module, cache=False)
    assert any("halves widened" in k for k in fast.manifest["kernels"]), fast.manifest["kernels"]
    with kernels.generic_only():
        generic = compile(module, cache=False)
    got, slow = np.asarray(fast(*args)), np.asarray(generic(*args))
    (want,) = rule_reference(module, args)
    assert got.dtype == HALF[half].np and got.shape == want.shape
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), name
    assert np.array_equal(got.view(np.uint16), slow.view(np.uint16)), name


def test_float32_contractions_are_not_wrapped() -> None:
    b = Builder()
    x = b.param("x", DType.f32, [4, 8])
    module = b.module(b.function("main", [x], [b.matmul(x, b.const(np.ones((8, 3), np.float32)))]))
    assert not any("widened" in k for k in compile(module, cache=False).manifest["kernels"])
