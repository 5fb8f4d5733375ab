"""Float16 and bfloat16 matrix products and convolutions, with and without fused epilogues, on the
float32 kernels (cuvil.codegen.kernels.widen): the kernel is chosen, and the result is bit for bit the
op's rule evaluated by the interpreter (products rounded to float32, a float32 sum in K order, one
rounding to the half type, the epilogue's own roundings) and the generic lowering's. Products of two
float16 values are exact in float32, so the kernels' fused multiply-adds round exactly as the rule's
separate product and sum do; bfloat16 products need not be, and are rounded first; long K (several
cache blocks) and threads included."""

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


# Products at the ends of the range. A float16 product is exact in float32 (|x·y| in [2^-48, 2^32]), so
# a fused multiply-add rounds as the rule does; a bfloat16 one spans float32's exponents and may round
# to inf or below float32's subnormals, where fusing the product into the sum changes the result.

def _exact_pairs(products: list[tuple[float, float]], h: DType) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[p for p, _ in products]], np.float32).astype(h.np)
    w = np.array([[q] for _, q in products], np.float32).astype(h.np)
    assert np.array_equal(x.astype(np.float64)[0], [p for p, _ in products])  # every factor a half
    assert np.array_equal(w.astype(np.float64)[:, 0], [q for _, q in products])
    return x, w


EDGE_PRODUCTS = {
    # -1.5·2^127 + 2^128: the exact sum is 2^126; the product 2^128 rounds to inf on its own
    "overflow": [(-1.5 * 2.0**63, 2.0**64), (2.0**64, 2.0**64)],
    # 2^-126 + 3·2^-134 - 2^-149 lies just under a bfloat16 midpoint; 2^-150 rounds to 0 on its own
    # (a tie, to even) but, added exactly, lifts the sum onto the midpoint, which rounds up
    "underflow": [(2.0**-63, 2.0**-63), (3 * 2.0**-67, 2.0**-67), (-(2.0**-75), 2.0**-74), (2.0**-75, 2.0**-75)],
}


def _contraction(h: DType, w: np.ndarray, conv: bool):
    b = Builder()
    k = w.shape[0]
    if conv:  # a 1x1 convolution over K channels: the conv kernels' schedule
        x = b.param("x", h, [1, k, 1, 1])
        y = b.conv(x, b.const(np.ascontiguousarray(w.T.reshape(w.shape[1], k, 1, 1))))
    else:
        x = b.param("x", h, [1, k])
        y = b.matmul(x, b.const(w))
    return b.module(b.function("main", [x], [y]))


def _agree(module, args: list[np.ndarray]) -> None:
    fast = compile(module, cache=False)
    assert any("halves widened" in k for k in fast.manifest["kernels"]), fast.manifest["kernels"]
    got = np.asarray(fast(*args))
    (want,) = rule_reference(module, args)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("conv", [False, True], ids=["matmul", "conv"])
@pytest.mark.parametrize("edge", sorted(EDGE_PRODUCTS))
def test_bf16_products_beyond_float32_round_as_the_rule_does(edge: str, conv: bool) -> None:
    x, w = _exact_pairs(EDGE_PRODUCTS[edge], DType.bf16)
    module = _contraction(DType.bf16, w, conv)
    args = [x.reshape(module.main.params[0].type.shape)]
    (want,) = rule_reference(module, args)
    fused = np.float32(sum(float(p) * float(q) for p, q in EDGE_PRODUCTS[edge])).astype(DType.bf16.np)
    assert want.reshape(-1)[0].view(np.uint16) != fused.view(np.uint16)  # the case tells the two apart
    _agree(module, args)


@pytest.mark.parametrize("half", sorted(HALF))
def test_products_with_extreme_exponents_round_as_the_rule_does(half: str) -> None:
    """Random factors whose exponents put their products around float32's overflow threshold, across
    its subnormals and under them, with signs mixed so that sums cancel."""
    h = HALF[half]
    rng = np.random.default_rng(5)
    lo, hi = (-24, 15) if h is DType.f16 else (-100, 64)
    k, n = 8, 6

    def draw(band: int, *shape: int) -> np.ndarray:
        sig = rng.uniform(1, 2, shape) * rng.choice([-1, 1], shape)
        return (sig * np.exp2(rng.integers(band, band + 3, shape))).astype(h.np)

    for band in range(lo, hi, 3):
        _agree(_contraction(h, draw(band, k, n), conv=False), [draw(band, 1, k)])


def test_float16_weights_stay_float16_in_the_gemm_panels() -> None:
    """A float16 matmul's constant rhs is packed as float16 and widened as each vector is read: half the
    bytes of the float32 panels, and the same bits as the rule, over every panel (N = 300, several column
    tiles and an edge), K past one cache block, and weights that are zero of either sign, subnormal, the
    largest half, infinite or NaN."""
    rng = np.random.default_rng(31)
    w = (rng.standard_normal((700, 300)) * 0.05).astype(np.float16)
    specials = np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, np.inf, -np.inf, np.nan], np.float16)
    w.reshape(-1)[rng.choice(w.size, 600, replace=False)] = np.resize(specials, 600)
    b = Builder()
    x = b.param("x", DType.f16, [3, 700])
    module = b.module(b.function("main", [x], [b.matmul(x, b.const(w))]))
    fast = compile(module, cache=False)
    assert any("packed16_b" in k for k in fast.manifest["kernels"]), fast.manifest["kernels"]
    assert fast.manifest["constants_bytes"] < 0.6 * w.size * 4
    args = [(rng.standard_normal((3, 700)) * 0.5).astype(np.float16)]
    got = np.asarray(fast(*args))
    (want,) = rule_reference(module, args)
    assert np.isnan(want).any() and np.isinf(want).any()  # the specials reach the result
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all()
