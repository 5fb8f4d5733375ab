"""Integer matrix products on int8 dot products (cuvil.codegen.kernels.vnni): the int32 matmul that quantize-int8
writes runs on ``vpdpbusd`` over int8 weights (on AVX2, each four-product step as two ``vpmaddwd`` on the
bytes widened to 16 bits; tested on VNNI hosts too), and its result is bit for bit the rule's (the
interpreter's) and the generic lowering's: int32 sums wrap modulo 2^32 in any order. Rows whose values
span more than 255 take the scalar path; sums that wrap, M/N/K tails, a ``[K, N]`` rhs, fused
requantization epilogues and threads are included, and weights outside int8 up to twice its range (uint8
weights less their zero point, as ``MatMulInteger`` and ``ConvInteger`` carry them), packed as two halves."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.codegen.kernels import vnni
from cuvil.codegen.kernels.vnni import (
    fits_int8,
    host_int8_dot,
    int8_halves,
    pack_conv_weights,
    pack_vnni,
    split_int8,
)
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference

RNG = np.random.default_rng(31)

needs_int8_dot = pytest.mark.skipif(host_int8_dot() is None,
                                    reason="the host has neither AVX-512 VNNI nor AVX2: no int8 kernel is chosen")


INT8 = (-128, 127)
UINT8_LESS_ZERO = (-119, 136)  # uint8 weights less a zero point of 119
TWICE_INT8 = (-256, 254)  # the widest weights two int8 halves hold


def _weights(shape: tuple[int, ...], span: tuple[int, int] = INT8) -> np.ndarray:
    """Weights in ``span``, both ends included (each at least once)."""
    w = RNG.integers(span[0], span[1] + 1, shape).astype(np.int32)
    w.flat[0], w.flat[-1] = span
    return w


def _w(n: int, k: int, span: tuple[int, int] = INT8) -> np.ndarray:
    return _weights((n, k), span)


def _centered(b: Builder, m: int, k: int, zero: int):
    """``cast(x_i8, i32) - zero``: what quantize-int8 feeds the product (spans 255 values)."""
    x = b.param("x", DType.i8, [m, k])
    return x, b.sub(b.cast(x, to=DType.i32), b.const(np.int32(zero)))


def _requantize(m: int, k: int, n: int, *, relu: bool = False, zero: int = -3,
                span: tuple[int, int] = INT8) -> Callable:
    def build(b: Builder):
        x, a = _centered(b, m, k, zero)
        acc = b.add(b.matmul(a, b.const(_w(n, k, span)), transpose_b=True),
                    b.const(RNG.integers(-5000, 5000, n).astype(np.int32)))
        y = b.mul(b.cast(acc, to=DType.f32), b.const(np.float32(0.0021)))
        if relu:
            y = b.relu(y)
        q = b.clip(b.add(b.round(y), b.const(np.float32(-7.0))), min=-128.0, max=127.0)
        return [x], b.cast(q, to=DType.i8)
    return build


def _plain(m: int, k: int, n: int, *, transposed: bool = True, zero: int = 128,
           span: tuple[int, int] = INT8) -> Callable:
    def build(b: Builder):
        x, a = _centered(b, m, k, zero)
        w = _w(n, k, span)
        return [x], (b.matmul(a, b.const(w), transpose_b=True) if transposed else b.matmul(a, b.const(w.T.copy())))
    return build


def _leading(shape: tuple[int, ...], n: int, span: tuple[int, int] = INT8) -> Callable:
    """A run-time operand with leading dims (more rows, as an LSTM's input projection over its steps) and a
    scaled float epilogue indexed by them."""
    def build(b: Builder):
        x = b.param("x", DType.i8, list(shape))
        a = b.sub(b.cast(x, to=DType.i32), b.const(np.int32(5)))
        acc = b.matmul(a, b.const(_w(n, shape[-1], span).T.copy()))
        scale = b.const(RNG.uniform(0.5, 2.0, (shape[-2], n)).astype(np.float32) / 1024)
        return [x], b.mul(b.cast(acc, to=DType.f32), scale)
    return build


def _wide(m: int, k: int, n: int, span: tuple[int, int] = INT8) -> Callable:
    """A raw int32 operand: rows that do not fit uint8, sums that wrap."""
    def build(b: Builder):
        x = b.param("x", DType.i32, [m, k])
        return [x], b.matmul(x, b.const(_w(n, k, span)), transpose_b=True)
    return build


def _conv(n: int, c: int, h: int, w: int, co: int, k: int, *, relu: bool = True, zero: int = -3,
          span: tuple[int, int] = INT8, **attrs) -> Callable:
    """conv of a centered int8 image + int32 bias, requantized (what quantize-int8 writes for QLinearConv)."""
    def build(b: Builder):
        x = b.param("x", DType.i8, [n, c, h, w])
        a = b.sub(b.cast(x, to=DType.i32), b.const(np.int32(zero)))
        weights = _weights((co, c, k, k), span)
        acc = b.add(b.conv(a, b.const(weights), **attrs), b.const(RNG.integers(-900, 900, (1, co, 1, 1)).astype(
            np.int32)))
        y = b.mul(b.cast(acc, to=DType.f32), b.const(np.float32(0.0007)))
        if relu:
            y = b.relu(y)
        q = b.clip(b.add(b.round(y), b.const(np.float32(3.0))), min=-128.0, max=127.0)
        return [x], b.sub(b.cast(b.cast(q, to=DType.i8), to=DType.i32), b.const(np.int32(3)))
    return build


def _conv_plain(n: int, c: int, h: int, w: int, co: int, kh: int, kw: int, span: tuple[int, int] = INT8,
                **attrs) -> Callable:
    def build(b: Builder):
        x = b.param("x", DType.i32, [n, c, h, w])
        return [x], b.conv(x, b.const(_weights((co, c, kh, kw), span)), **attrs)
    return build


CASES: dict[str, Callable] = {
    "conv3x3": _conv(1, 16, 12, 20, 24, 3, pads=(1, 1, 1, 1)),
    "conv-stride2": _conv(2, 5, 15, 17, 9, 3, strides=(2, 2), pads=(1, 1, 1, 1)),
    "conv-stem": _conv(1, 3, 30, 34, 8, 7, strides=(2, 2), pads=(3, 3, 3, 3)),
    "conv1x1-stride2": _conv(1, 8, 14, 14, 16, 1, relu=False, zero=-128, strides=(2, 2)),  # shift 0
    "conv-wide-row": _conv(1, 4, 5, 70, 6, 3, pads=(0, 2, 1, 0), dilations=(1, 2)),
    "gemv-requantize": _requantize(1, 784, 512),
    "gemv-relu": _requantize(1, 100, 70, relu=True, zero=-128),
    "batch-requantize": _requantize(64, 784, 512),  # pooled: 51 MFLOP
    "row-tail": _requantize(6, 37, 130),
    "k1": _plain(3, 1, 17),
    "k3-n1": _plain(5, 3, 1),
    "kn-rhs": _plain(9, 66, 40, transposed=False),
    "long-k": _plain(4, 4099, 20, zero=0),
    # weights in two int8 halves: uint8 less a zero point, and the widest range the halves hold
    "u8-weights-requantize": _requantize(7, 300, 70, span=UINT8_LESS_ZERO),
    "u8-weights-gemv": _requantize(1, 1023, 90, relu=True, span=UINT8_LESS_ZERO),
    "halves-extremes": _plain(9, 66, 40, transposed=False, span=TWICE_INT8),
    "halves-k-tail": _plain(5, 7, 130, span=TWICE_INT8),
    "leading-dims": _leading((15, 1, 512), 200, span=UINT8_LESS_ZERO),
    "leading-dims-3": _leading((3, 5, 66), 40),
    "conv-u8-weights": _conv(1, 16, 12, 20, 24, 3, span=UINT8_LESS_ZERO, pads=(1, 1, 1, 1)),
    "conv-halves-stride2": _conv(2, 5, 15, 17, 9, 3, span=TWICE_INT8, strides=(2, 2), pads=(1, 1, 1, 1)),
    "conv1x1-halves": _conv(1, 6, 14, 14, 16, 1, relu=False, span=TWICE_INT8),
}


def _inputs(params) -> list[np.ndarray]:
    out = []
    for p in params:
        shape = tuple(int(d) for d in p.shape)
        if p.dtype is DType.i8:
            out.append(RNG.integers(-128, 128, shape).astype(np.int8))
        else:  # rows 0-3 fit uint8 after their shift (row 0 spans exactly 256 values: vectors), rows 4-7 too but
            # row 5 spans 257 (scalar), rows 8-11 span the whole int32 range (sums wrap), row 12 is a tail row
            x = RNG.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
            fit = [r for r in (0, 1, 2, 3, 4, 5, 6, 7, 12) if r < shape[0]]
            x[fit] = RNG.integers(1000, 1256, (len(fit), shape[1])).astype(np.int32)
            x[0] = RNG.integers(-7, 249, shape[1])
            x[0, :2] = (-7, 248)
            if shape[0] > 5:
                x[5] = RNG.integers(-7, 250, shape[1])
                x[5, :2] = (-7, 249)
            out.append(x)
    return out


def _module(name: str):
    b = Builder()
    params, y = CASES[name](b)
    return b.module(b.function("main", params, [y])), params


OUTSIDE_INT8 = {
    **dict.fromkeys(("u8-weights-requantize", "u8-weights-gemv", "leading-dims", "wide-offset"), "offset"),
    **dict.fromkeys(("halves-extremes", "halves-k-tail", "wide-halves", "conv-u8-weights", "conv-halves-stride2",
                     "conv1x1-halves", "conv-wide-halves"), "halves"),
}
"""How each case's weights outside int8 are packed: a matmul's columns less an offset each where every column
spans at most 256 values, else (and a convolution's weights) in two halves."""

WIDE: dict[str, Callable] = {
    "wide": _wide(13, 300, 50),
    "wide-halves": _wide(13, 300, 50, span=TWICE_INT8),
    "wide-offset": _wide(13, 300, 50, span=UINT8_LESS_ZERO),
    # an input spanning more than 255 values: the scalar sums (zero padding, a wrap-around)
    "conv-wide": _conv_plain(1, 5, 6, 7, 3, 3, 2, pads=(1, 0, 1, 1), strides=(1, 2)),
    "conv-wide-halves": _conv_plain(1, 5, 6, 7, 3, 3, 2, span=TWICE_INT8, pads=(1, 0, 1, 1), strides=(1, 2)),
}


def _conv_inputs(params) -> list[np.ndarray]:
    (p,) = params
    x = RNG.integers(-2**31, 2**31, tuple(int(d) for d in p.shape), dtype=np.int64).astype(np.int32)
    return [x]


SEVEN_BITS = (-64, 63)  # int8 weights quantized with a reduced range: every pair fits vpmaddubsw


@pytest.fixture(params=["host", "avx2", "pairs"])
def dot_steps(request, monkeypatch) -> str | None:
    """The host's four-product steps; the AVX2 ones (``vpmaddwd`` on widened bytes) on a host with VNNI, where
    they are not chosen by themselves; and AVX2's ``vpmaddubsw`` pairs, the cases' int8 weights drawn from
    :data:`SEVEN_BITS` instead (weights outside int8 keep their spans, and the widened steps)."""
    if request.param == "avx2":
        if host_int8_dot() != "vnni":
            pytest.skip("the host's own steps are not VNNI: the host case runs whichever it has")
        monkeypatch.setattr(vnni, "host_has_vnni", lambda: False)
        assert host_int8_dot() == "avx2"
    if request.param == "pairs":
        if host_int8_dot() is None:
            pytest.skip("the host has no int8 dot product")
        monkeypatch.setattr(vnni, "host_has_vnni", lambda: False)
        weights = _weights
        monkeypatch.setattr(sys.modules[__name__], "_weights",
                            lambda shape, span=INT8: weights(shape, SEVEN_BITS if span == INT8 else span))
        return "pairs"
    return host_int8_dot()


@pytest.mark.parametrize("name", [*sorted(CASES), *sorted(WIDE)])
def test_integer_product_matches_the_rule_bit_for_bit(name: str, dot_steps: str | None) -> None:
    if name in WIDE:
        b = Builder()
        params, y = WIDE[name](b)
        module = b.module(b.function("main", params, [y]))
    else:
        module, params = _module(name)
    args = _conv_inputs(params) if name in ("conv-wide", "conv-wide-halves") else _inputs(params)
    fast = compile(module, cache=False, threads=2)
    if dot_steps is not None:
        # in the pairs case weights outside int8 take the widened steps (their packed pairs may saturate); in the
        # AVX2 one, weights whose pairs cannot (k = 1: each weight paired with a zero) take the pairs
        how = {"pairs": ("avx2",) if name in OUTSIDE_INT8 else ("pairs",), "avx2": ("avx2", "pairs")}.get(
            dot_steps, (dot_steps,))
        (kernel,) = [k for k in fast.manifest["kernels"] if k.startswith("int8.") and k.split(".")[1] in how]
        last = kernel.split(".")[-1]
        assert last == OUTSIDE_INT8[name] if name in OUTSIDE_INT8 else last not in ("offset", "halves"), kernel
    with kernels.generic_only():
        generic = compile(module, cache=False)
    got, slow = np.asarray(fast(*args)), np.asarray(generic(*args))
    (want,) = rule_reference(module, args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want), name
    assert np.array_equal(slow, want), name


@needs_int8_dot
@pytest.mark.parametrize("value, vnni", [(128, True), (-256, True), (255, False), (-257, False)])
def test_a_constant_beyond_two_int8_halves_stays_on_the_rule(value: int, vnni: bool) -> None:
    b = Builder()
    x = b.param("x", DType.i32, [4, 16])
    w = _w(8, 16)
    w[3, 5] = value  # one value int8 cannot hold: two halves can hold 128 and -256, not 255 or -257
    module = b.module(b.function("main", [x], [b.matmul(x, b.const(w), transpose_b=True)]))
    fast = compile(module, cache=False)
    assert any(k.startswith(f"int8.{host_int8_dot()}.") for k in fast.manifest["kernels"]) == vnni
    args = _inputs([x])
    assert np.array_equal(np.asarray(fast(*args)), rule_reference(module, args)[0])


def test_pairs_fit_exactly_where_vpmaddubsw_never_saturates() -> None:
    """Every pair of int8 weights: :func:`vnni.pairs_fit` holds iff no two uint8 values make the pair's sum leave
    int16 (the sum is linear in each value, so its extremes are at 0 and 255)."""
    w0, w1 = (a.ravel() for a in np.meshgrid(np.arange(-128, 128), np.arange(-128, 128)))
    corners = [u0 * w0 + u1 * w1 for u0 in (0, 255) for u1 in (0, 255)]
    never = (np.min(corners, axis=0) >= -32768) & (np.max(corners, axis=0) <= 32767)
    fit = np.array([vnni.pairs_fit(np.array(p, np.int8)) for p in zip(w0, w1, strict=True)])
    assert np.array_equal(fit, never)
    assert vnni.pairs_fit(np.arange(-64, 64, dtype=np.int8)) and not vnni.pairs_fit(np.array([127, 2], np.int8))


@needs_int8_dot
@pytest.mark.parametrize(("pair", "fits"), [((127, 1), True), ((-128, 0), True), ((127, 2), False),
                                            ((-128, -1), False), ((100, -128), True)])
@pytest.mark.parametrize("forced", [False, True])
def test_weights_whose_pairs_could_saturate_take_the_widened_steps(monkeypatch, pair, fits, forced) -> None:
    """Every pair of weights ``pair`` against uint8 values of 255: at the int16 bound the pairs are exact; past
    it the widened steps are chosen and exact, where ``vpmaddubsw`` forced on them saturates."""
    monkeypatch.setattr(vnni, "host_has_vnni", lambda: False)
    if forced:
        monkeypatch.setattr(vnni, "pairs_fit", lambda packed: True)
    k, n = 64, 32
    w = np.empty((n, k), np.int32)
    w[:, 0::2], w[:, 1::2] = pair
    b = Builder()
    x = b.param("x", DType.i8, [4, k])
    module = b.module(b.function("main", [x], [b.matmul(b.sub(b.cast(x, to=DType.i32), b.const(np.int32(-128))),
                                                        b.const(w), transpose_b=True)]))
    xs = np.full((4, k), 127, np.int8)
    xs[:, -2:] = -128  # each row spans 0..255 after the shift: every other pair meets 255 twice
    fast = compile(module, cache=False)
    (kernel,) = [k for k in fast.manifest["kernels"] if k.startswith("int8.")]
    assert kernel.startswith("int8.pairs." if fits or forced else "int8.avx2."), kernel
    (want,) = rule_reference(module, [xs])
    assert np.array_equal(np.asarray(fast(xs)), want) == (fits or not forced)


def test_packing_puts_four_k_per_lane_and_sums_columns() -> None:
    w = _w(21, 10)
    packed, colsum = pack_vnni(w)
    assert packed.dtype == np.int8 and packed.shape == (4, 3, 16, 4)  # 2 blocks of 16 padded to a group of 4
    for n in range(21):
        for k in range(10):
            assert packed[n // 16, k // 4, n % 16, k % 4] == w[n, k]
    assert not packed[1, :, 5:].any() and not packed[2:].any() and not packed[:, 2, :, 2:].any()
    assert np.array_equal(colsum[:21], w.sum(axis=1)) and not colsum[21:].any()
    assert fits_int8(w) and not fits_int8(w + 1 - w.min() + 127)


@pytest.mark.parametrize("span", [INT8, UINT8_LESS_ZERO, TWICE_INT8, (-257, 0), (0, 255)], ids=str)
def test_weights_split_into_int8_halves_that_sum_to_them(span: tuple[int, int]) -> None:
    w = _w(21, 10, span)
    halves = int8_halves(w)
    assert halves == (1 if span == INT8 else 2 if span[0] >= -256 and span[1] <= 254 else 0)
    if halves != 2:
        return
    first, rest = split_int8(w)
    assert fits_int8(first) and fits_int8(rest) and np.array_equal(first + rest, w)
    packed, colsum = pack_vnni(w, 2)
    assert packed.shape == (4, 6, 16, 4)  # each half's three quads of k, one after the other
    for n in range(21):
        for k in range(10):
            assert int(packed[n // 16, k // 4, n % 16, k % 4]) + int(packed[n // 16, 3 + k // 4, n % 16, k % 4]) \
                == w[n, k]
    assert np.array_equal(colsum[:21], w.sum(axis=1))
    cw = _weights((5, 6, 3, 3), span)
    cpacked, csum = pack_conv_weights(cw, 2)
    assert cpacked.shape == (5, 9, 16)  # two halves of two channel quads per tap
    both = cpacked[:, :, :8].astype(np.int32) + cpacked[:, :, 8:]
    assert np.array_equal(both[:, :, :6], cw.reshape(5, 6, 9).transpose(0, 2, 1)) and not both[:, :, 6:].any()
    assert np.array_equal(csum, cw.reshape(5, -1).sum(axis=1))
