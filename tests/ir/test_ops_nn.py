"""Convolution, pooling, normalization, softmax, LRN and einsum against PyTorch as the oracle.

Each case runs through a built module (the numpy fast path) and, where the shape is small
enough, through the op's compute rule as well: both readers must agree with torch.
Asymmetric padding, which torch does not take directly, is applied to the oracle's input
with ``F.pad`` first.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cuvil.errors import ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from cuvil.ir.opdef import get_op
from tests.ir.op_testing import run_fast, run_rule, t

RTOL, ATOL = 1e-4, 1e-5
RULE_MAX_WORK = 400_000  # output elements x reduction extent the rule evaluator is given


def run_op(name: str, arrays: list[np.ndarray], **attrs: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """The op through a built module (fast path) and through its compute rule (None when too big)."""
    fast, out_type = run_fast(name, arrays, **attrs)
    work = int(np.prod(fast.shape)) * max(int(np.prod(a.shape[1:])) for a in arrays)
    rule = run_rule(name, arrays, out_type, **attrs) if work <= RULE_MAX_WORK else None
    return fast, rule


def check(name: str, arrays: list[np.ndarray], expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL,
          **attrs: Any) -> None:
    fast, rule = run_op(name, arrays, **attrs)
    assert fast.shape == expected.shape, f"{name} {attrs}: shape {fast.shape} != {expected.shape}"
    np.testing.assert_allclose(fast, expected, rtol=rtol, atol=atol, err_msg=f"{name} fast path {attrs}")
    if rule is not None:
        np.testing.assert_allclose(rule, expected, rtol=rtol, atol=atol, err_msg=f"{name} rule {attrs}")


def rand(rng: np.random.Generator, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def torch_pad(x: torch.Tensor, pads: list[int], value: float = 0.0) -> torch.Tensor:
    """ONNX-style [begins..., ends...] padding of the spatial axes for torch's F.pad (last axis first)."""
    nsp = len(pads) // 2
    flat: list[int] = []
    for j in reversed(range(nsp)):
        flat += [pads[j], pads[nsp + j]]
    return F.pad(x, flat, value=value)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _conv_case(seed: int, xs: tuple[int, ...], ws: tuple[int, ...],
               attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int, list[int]]:
    """Random input and weight, the number of spatial axes and the ONNX pads (zeros when not given)."""
    rng = np.random.default_rng(seed)
    x, w = rand(rng, *xs), rand(rng, *ws)
    nsp = len(xs) - 2
    return x, w, nsp, attrs.get("pads", [0] * 2 * nsp)


def _torch_conv_args(attrs: dict[str, Any]) -> dict[str, Any]:
    """The ONNX attributes torch's conv functions take as keywords (padding goes through ``torch_pad``)."""
    return {"stride": attrs.get("strides", 1), "dilation": attrs.get("dilations", 1), "groups": attrs.get("groups", 1)}


# --------------------------------------------------------------------------------------
# conv


CONV_CASES = [
    # x shape, w shape, attrs
    ((2, 3, 9), (4, 3, 3), {}),
    ((2, 4, 11), (6, 2, 3), {"groups": 2, "strides": [2], "dilations": [2], "pads": [1, 2]}),
    ((2, 3, 8, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 8), (4, 3, 3, 2), {"strides": [2, 3], "pads": [0, 1, 2, 1]}),
    ((1, 4, 10, 9), (8, 2, 3, 3), {"groups": 2, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    ((2, 6, 7, 8), (6, 1, 3, 3), {"groups": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # depthwise
    ((2, 6, 7, 8), (12, 1, 3, 3), {"groups": 6}),  # depthwise with multiplier 2
    ((2, 5, 6, 7), (3, 5, 1, 1), {"strides": [2, 2]}),  # pointwise
    ((1, 2, 5, 6, 4), (3, 2, 3, 2, 2), {"strides": [1, 2, 1], "pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 1, 2]}),
]


@pytest.mark.parametrize("xs, ws, attrs", CONV_CASES, ids=lambda v: str(v))
def test_conv_matches_torch(xs, ws, attrs):
    x, w, nsp, pads = _conv_case(1, xs, ws, attrs)
    expected = _CONV[nsp](torch_pad(t(x), pads), t(w), **_torch_conv_args(attrs)).numpy()
    check("conv", [x, w], expected, **attrs)


def test_conv_f64_and_int():
    rng = np.random.default_rng(2)
    x, w = rand(rng, 2, 3, 6, 5, dtype=np.float64), rand(rng, 4, 3, 2, 2, dtype=np.float64)
    check("conv", [x, w], F.conv2d(t(x), t(w), stride=2, padding=1).numpy(), rtol=1e-12, atol=1e-12,
          strides=[2, 2], pads=[1, 1, 1, 1])
    xi = rng.integers(-5, 5, (1, 2, 5, 5)).astype(np.int32)
    wi = rng.integers(-5, 5, (3, 2, 3, 3)).astype(np.int32)
    expected = F.conv2d(t(xi.astype(np.float64)), t(wi.astype(np.float64)), padding=1).numpy().astype(np.int32)
    fast, rule = run_op("conv", [xi, wi], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(fast, expected)
    np.testing.assert_array_equal(rule, expected)


def test_conv_symbolic_spatial_dims_run_at_several_sizes():
    b = Builder()
    n, h, w_ = sym("N"), sym("H"), sym("W")
    x = b.param("x", DType.f32, [n, 3, h, w_])
    rng = np.random.default_rng(3)
    w = rand(rng, 4, 3, 3, 3)
    y = b.conv(x, b.const(w), strides=[2, 2], pads=[1, 0, 2, 1], dilations=[1, 2])
    assert y.type.shape[2] == h // 2 + 1  # (H + 1 + 2 - 3) // 2 + 1
    assert y.type.shape[3] == (w_ - 4) // 2 + 1  # (W + 0 + 1 - (2 * 2 + 1)) // 2 + 1
    m = b.module(b.function("main", [x], [y]))
    for shape in [(1, 3, 7, 9), (2, 3, 10, 6)]:
        xv = rand(rng, *shape)
        (out,) = run_reference(m, [xv])
        expected = F.conv2d(torch_pad(t(xv), [1, 0, 2, 1]), t(w), stride=2, dilation=(1, 2)).numpy()
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("xs, ws, attrs, why", [
    ((1, 3, 5, 5), (4, 2, 3, 3), {}, "channels"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"groups": 2}, "groups"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "does not fit"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1]}, "pads"),
    ((1, 3, 5), (4, 3, 3, 3), {}, "rank"),
])
def test_conv_rejects_bad_shapes(xs, ws, attrs, why):
    b = Builder()
    with pytest.raises(ShapeError, match=why):
        b.conv(b.param("x", DType.f32, xs), b.param("w", DType.f32, ws), **attrs)


# --------------------------------------------------------------------------------------
# conv_transpose


CONV_T_CASES = [
    ((2, 3, 5), (3, 2, 3), {"strides": [2]}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {}),
    ((2, 3, 4, 5), (3, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 2]}),
    ((1, 4, 3, 4), (4, 3, 3, 3), {"groups": 2, "strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 2, 0]}),
    ((2, 4, 4, 3), (4, 1, 3, 3), {"groups": 4, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 2, 3, 2, 3), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}),
]


@pytest.mark.parametrize("xs, ws, attrs", CONV_T_CASES, ids=lambda v: str(v))
def test_conv_transpose_matches_torch(xs, ws, attrs):
    x, w, nsp, pads = _conv_case(4, xs, ws, attrs)
    out_pad = attrs.get("output_padding", [0] * nsp)
    # torch without padding gives the full result; ONNX pads crop it and output_padding extends it with zeros
    full = _CONV_T[nsp](t(x), t(w), **_torch_conv_args(attrs)).numpy()
    ext = np.pad(full, [(0, 0), (0, 0)] + [(0, p) for p in out_pad])
    crop = tuple(slice(pads[j], ext.shape[2 + j] - pads[nsp + j]) for j in range(nsp))
    check("conv_transpose", [x, w], ext[(slice(None), slice(None), *crop)], **attrs)


def test_conv_transpose_symmetric_padding_matches_torch_directly():
    rng = np.random.default_rng(5)
    x, w = rand(rng, 2, 4, 5, 4), rand(rng, 4, 3, 3, 3)
    expected = F.conv_transpose2d(t(x), t(w), stride=2, padding=1, output_padding=1, groups=2, dilation=1).numpy()
    check("conv_transpose", [x, w], expected, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1], groups=2)


# --------------------------------------------------------------------------------------
# pooling


POOL_CASES = [
    # x shape, kernel, strides, pads (symmetric, torch-expressible), dilations, ceil_mode
    ((2, 3, 9), [3], [2], [1, 1], [1], False),
    ((2, 3, 8, 9), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], False),
    ((2, 3, 8, 9), [3, 2], [2, 2], [1, 1, 1, 1], [1, 1], True),
    ((2, 2, 7, 8), [2, 3], [3, 2], [0, 1, 0, 1], [1, 1], True),
    ((1, 3, 6, 7, 5), [2, 3, 2], [2, 1, 2], [1, 1, 0, 1, 1, 0], [1, 1, 1], True),
]


@pytest.mark.parametrize("xs, k, s, p, d, ceil", POOL_CASES, ids=lambda v: str(v))
def test_max_pool_matches_torch(xs, k, s, p, d, ceil):
    x = rand(np.random.default_rng(6), *xs)
    nsp = len(k)
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
    expected = fn(t(x), k, s, p[:nsp], d, ceil_mode=ceil).numpy()
    check("max_pool", [x], expected, kernel=k, strides=s, pads=p, dilations=d, ceil_mode=ceil)


def test_max_pool_dilation_and_asymmetric_pads():
    x = rand(np.random.default_rng(7), 2, 3, 9, 8)
    expected = F.max_pool2d(t(x), [2, 3], [1, 2], 0, [2, 2], ceil_mode=False).numpy()
    check("max_pool", [x], expected, kernel=[2, 3], strides=[1, 2], dilations=[2, 2])
    padded = torch_pad(t(x), [0, 2, 1, 1], value=-np.inf)
    expected = F.max_pool2d(padded, [3, 3], [2, 2]).numpy()
    check("max_pool", [x], expected, kernel=[3, 3], strides=[2, 2], pads=[0, 2, 1, 1])


def test_max_pool_integers_pad_with_lowest_value():
    x = -np.arange(2 * 2 * 4 * 4, dtype=np.int8).reshape(2, 2, 4, 4) - 10
    fast, rule = run_op("max_pool", [x], kernel=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1])
    expected = F.max_pool2d(t(x.astype(np.float32)), 2, 2, 1).numpy().astype(np.int8)
    np.testing.assert_array_equal(fast, expected)
    np.testing.assert_array_equal(rule, expected)


def test_max_pool_propagates_nan():
    x = rand(np.random.default_rng(8), 1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    fast, rule = run_op("max_pool", [x], kernel=[2, 2], strides=[2, 2])
    assert rule is not None
    assert np.isnan(fast[0, 0, 0, 0]) and np.isnan(rule[0, 0, 0, 0])
    assert not np.isnan(fast[0, 0, 1, 1])


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("xs, k, s, p, d, ceil", [c for c in POOL_CASES if c[4] == [1] * len(c[1])],
                         ids=lambda v: str(v))
def test_avg_pool_matches_torch(xs, k, s, p, d, ceil, include):
    x = rand(np.random.default_rng(9), *xs)
    nsp = len(k)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    expected = fn(t(x), k, s, p[:nsp], ceil_mode=ceil, count_include_pad=include).numpy()
    check("avg_pool", [x], expected, kernel=k, strides=s, pads=p, ceil_mode=ceil, count_include_pad=include)


def test_avg_pool_dilated_counts_taps_inside():
    """With dilation (which torch's avg_pool lacks) the mean is over the taps that land in the input."""
    x = rand(np.random.default_rng(10), 1, 2, 7, 6)
    k, s, d, pads = (2, 2), (2, 1), (2, 2), (1, 1, 1, 0)
    fast, rule = run_op("avg_pool", [x], kernel=k, strides=s, dilations=d, pads=pads)
    assert rule is not None
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 0)], constant_values=np.nan)
    for oh in range(fast.shape[2]):
        for ow in range(fast.shape[3]):
            rows = [oh * s[0] + i * d[0] for i in range(k[0])]
            cols = [ow * s[1] + j * d[1] for j in range(k[1])]
            taps = xp[:, :, rows][..., cols]
            np.testing.assert_allclose(fast[:, :, oh, ow], np.nanmean(taps, axis=(2, 3)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rule, fast, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p", [2.0, 3.0])
def test_lp_pool_matches_torch(p):
    x = np.abs(rand(np.random.default_rng(11), 2, 3, 7, 8)) + 0.1  # torch's lp_pool uses x^p, not |x|^p
    expected = F.lp_pool2d(t(x), p, (3, 2), (2, 2), ceil_mode=False).numpy()
    check("lp_pool", [x], expected, kernel=[3, 2], strides=[2, 2], p=p)


def test_lp_pool_takes_absolute_values_and_pads_with_zero():
    x = rand(np.random.default_rng(12), 1, 2, 5, 5)
    fast, rule = run_op("lp_pool", [x], kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=3.0)
    assert rule is not None
    xp = np.pad(np.abs(x.astype(np.float64)), [(0, 0), (0, 0), (1, 1), (1, 1)])
    expected = np.array([[[[np.sum(xp[n, c, 2 * i:2 * i + 3, 2 * j:2 * j + 3] ** 3) ** (1 / 3)
                            for j in range(3)] for i in range(3)] for c in range(2)] for n in range(1)])
    np.testing.assert_allclose(fast, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rule, expected, rtol=RTOL, atol=ATOL)


def test_pooling_symbolic_ceil_mode_shape():
    b = Builder()
    h = sym("H")
    x = b.param("x", DType.f32, [1, 2, h, 5])
    y = b.max_pool(x, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True)
    m = b.module(b.function("main", [x], [y]))
    rng = np.random.default_rng(13)
    for rows in (5, 6, 7, 8):
        xv = rand(rng, 1, 2, rows, 5)
        (out,) = run_reference(m, [xv])
        np.testing.assert_allclose(out, F.max_pool2d(t(xv), 3, 2, 1, ceil_mode=True).numpy())


def test_pool_rejects_oversized_window():
    b = Builder()
    with pytest.raises(ShapeError, match="does not fit"):
        b.avg_pool(b.param("x", DType.f32, [1, 1, 2, 2]), kernel=[3, 3])


# --------------------------------------------------------------------------------------
# normalization and softmax


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 4, 3, 5)])
def test_batch_norm_matches_torch(shape):
    rng = np.random.default_rng(14)
    ch = shape[1]
    x, scale, bias, mean = rand(rng, *shape), rand(rng, ch), rand(rng, ch), rand(rng, ch)
    var = rng.uniform(0.2, 2.0, ch).astype(np.float32)
    expected = F.batch_norm(t(x), t(mean), t(var), t(scale), t(bias), training=False, eps=1e-3).numpy()
    check("batch_norm", [x, scale, bias, mean, var], expected, epsilon=1e-3)


@pytest.mark.parametrize("shape, axis, wshape", [((2, 3, 4), -1, (4,)), ((2, 3, 4), 1, (3, 4)),
                                                 ((3, 2, 4, 5), 2, (4, 5)), ((2, 3, 4), 0, (2, 3, 4))])
def test_layer_norm_matches_torch(shape, axis, wshape):
    rng = np.random.default_rng(15)
    x, w, bias = rand(rng, *shape) * 3 + 1, rand(rng, *wshape), rand(rng, *wshape)
    expected = F.layer_norm(t(x), wshape, t(w), t(bias), eps=1e-5).numpy()
    check("layer_norm", [x, w, bias], expected, axis=axis)


def test_layer_norm_broadcasts_scale_and_symbolic_batch():
    rng = np.random.default_rng(16)
    b = Builder()
    x = b.param("x", DType.f32, [sym("B"), 3, 6])
    w, bias = rand(rng, 6), rand(rng, 1)
    m = b.module(b.function("main", [x], [b.layer_norm(x, b.const(w), b.const(bias), axis=1, epsilon=1e-4)]))
    for batch in (1, 3):
        xv = rand(rng, batch, 3, 6)
        (out,) = run_reference(m, [xv])
        expected = F.layer_norm(t(xv), (3, 6), eps=1e-4).numpy() * w + bias
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op, fn", [("softmax", torch.softmax), ("log_softmax", torch.log_softmax)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_matches_torch(op, fn, axis):
    x = rand(np.random.default_rng(17), 3, 4, 5) * 4
    check(op, [x], fn(t(x), axis).numpy(), axis=axis)


@pytest.mark.parametrize("op, fn", [("softmax", torch.softmax), ("log_softmax", torch.log_softmax)])
def test_softmax_is_stable_for_large_inputs(op, fn):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], dtype=np.float32)
    fast, rule = run_op(op, [x], axis=1)
    assert rule is not None
    expected = fn(t(x), 1).numpy()
    assert np.isfinite(fast).all() and np.isfinite(rule).all()
    np.testing.assert_allclose(fast, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rule, expected, rtol=RTOL, atol=ATOL)


def test_softmax_rule_subtracts_the_max():
    """The meaning itself carries the max subtraction, so every reader of the rule is stable."""
    op = get_op("softmax")
    from cuvil.ir.types import TensorType

    ty = TensorType(DType.f32, (2, 3))
    text = repr(op.make_rule([ty], op.check_attrs({"axis": 1}), ty))
    assert "kind='max'" in text and "'exp'" in text


@pytest.mark.parametrize("size", [3, 5])
def test_lrn_matches_torch_for_odd_sizes(size):
    x = rand(np.random.default_rng(18), 2, 7, 3, 4)
    expected = F.local_response_norm(t(x), size, alpha=1e-2, beta=0.6, k=1.5).numpy()
    check("lrn", [x], expected, size=size, alpha=1e-2, beta=0.6, bias=1.5)


def test_lrn_even_size_window_follows_onnx():
    """ONNX sums channels [c - (size-1)//2, c + size//2]; torch centres even windows the other way."""
    x = rand(np.random.default_rng(19), 1, 6, 2, 3).astype(np.float64)
    size, alpha, beta, bias = 4, 0.1, 0.75, 2.0
    expected = np.empty_like(x)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + size // 2)
        sq = (x[:, lo:hi + 1] ** 2).sum(axis=1)
        expected[:, c] = x[:, c] / (bias + alpha / size * sq) ** beta
    check("lrn", [x], expected, rtol=1e-12, atol=1e-12, size=size, alpha=alpha, beta=beta, bias=bias)


# --------------------------------------------------------------------------------------
# einsum


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("a b , b c", [(2, 3), (3, 4)]),
]


@pytest.mark.parametrize("eq, shapes", EINSUM_CASES, ids=lambda v: str(v))
def test_einsum_matches_torch(eq, shapes):
    rng = np.random.default_rng(20)
    xs = [rand(rng, *s) for s in shapes]
    expected = torch.einsum(eq.replace(" ", ""), *[t(x) for x in xs]).numpy()
    check("einsum", xs, expected, equation=eq)


@pytest.mark.parametrize("eq, shapes, why", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "sizes"),
    ("ij->k", [(3, 4)], "no operand"),
    ("ij,jk", [(3, 4)], "operands"),
    ("ijk->i", [(3, 4)], "rank"),
])
def test_einsum_rejects_bad_equations(eq, shapes, why):
    b = Builder()
    params = [b.param(f"x{k}", DType.f32, s) for k, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=why):
        b.einsum(*params, equation=eq)


# --------------------------------------------------------------------------------------
# a ResNet-18 forward: every fast path at realistic sizes, against the same network in torch


class _Block(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def _resnet18() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64),
                                     torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    net = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # tracked by default
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _to_cir(b: Builder, x: Any, m: torch.nn.Module) -> Any:
    c = lambda p: b.const(p.detach().numpy())
    if isinstance(m, torch.nn.Sequential):
        for sub in m:
            x = _to_cir(b, x, sub)
        return x
    if isinstance(m, torch.nn.Conv2d):
        return b.conv(x, c(m.weight), strides=list(m.stride), pads=list(m.padding) * 2)
    if isinstance(m, torch.nn.BatchNorm2d):
        return b.batch_norm(x, c(m.weight), c(m.bias), c(m.running_mean), c(m.running_var), epsilon=m.eps)
    if isinstance(m, torch.nn.ReLU):
        return b.relu(x)
    if isinstance(m, torch.nn.MaxPool2d):
        return b.max_pool(x, kernel=[m.kernel_size] * 2, strides=[m.stride] * 2, pads=[m.padding] * 4)
    if isinstance(m, torch.nn.AdaptiveAvgPool2d):
        return b.reduce_mean(x, axes=[2, 3])
    if isinstance(m, torch.nn.Flatten):
        return x
    if isinstance(m, torch.nn.Linear):
        return b.add(b.matmul(x, c(m.weight), transpose_b=True), c(m.bias))
    if isinstance(m, _Block):
        y = _to_cir(b, b.relu(_to_cir(b, _to_cir(b, x, m.c1), m.b1)), m.c2)
        y = _to_cir(b, y, m.b2)
        return b.relu(b.add(y, x if m.down is None else _to_cir(b, x, m.down)))
    raise AssertionError(f"unexpected module {m}")


def test_resnet18_forward_matches_torch_and_is_fast():
    net = _resnet18()
    b = Builder()
    x = b.param("x", DType.f32, [1, 3, 224, 224])
    module = b.module(b.function("main", [x], [_to_cir(b, x, net)]))
    xv = np.random.default_rng(21).standard_normal((1, 3, 224, 224)).astype(np.float32)
    start = time.perf_counter()
    (out,) = run_reference(module, [xv])
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        expected = net(t(xv)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)
    assert elapsed < 30.0, f"ResNet-18 forward took {elapsed:.1f} s on the reference interpreter"
