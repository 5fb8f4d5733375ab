"""``bf16_matmul`` on the float32 GEMM over bfloat16 pairs (``vdpbf16ps``): the rule bit for bit, at
every tile edge and in every regime of the values (any NaN equals any NaN, as CIR's exactness reads)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from llvmlite import binding as llvm

from cuvil.codegen.kernels.paired import conv_pair_words, pair_words
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.module import Module
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType

RNG = np.random.default_rng(31)
BF16 = ml_dtypes.bfloat16
NEEDS_BF16 = pytest.mark.skipif(not llvm.get_host_cpu_features().get("avx512bf16", False),
                                reason="the paired kernel needs AVX512-BF16 (vdpbf16ps) on the machine running it")


def _bits(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32).copy()
    bits[np.isnan(x)] = 0x7FC00000
    return bits


def _module(x_shape: tuple[int, ...], w: np.ndarray, transpose_b: bool) -> Module:
    b = Builder()
    x = b.param("x", DType.bf16, x_shape)
    return b.module(b.function("main", [x], [b.op("bf16_matmul", x, b.const(w), transpose_b=transpose_b)]))


def _rule(x: np.ndarray, w: np.ndarray, transpose_b: bool) -> np.ndarray:
    op = get_op("bf16_matmul")
    attrs = {"transpose_a": False, "transpose_b": transpose_b}
    out = op.infer([TensorType(DType.bf16, x.shape), TensorType(DType.bf16, w.shape)], attrs)
    return evaluate_op(op, [x, w], attrs, out)


def _values(shape: tuple[int, ...], regime: str) -> np.ndarray:
    lo, hi = {"normal": (-6, 6), "tiny": (-70, -55), "huge": (55, 66), "specials": (-70, 66)}[regime]
    v = RNG.standard_normal(shape) * 2.0 ** RNG.integers(lo, hi, shape).astype(np.float64)
    if regime == "specials":
        flat = v.reshape(-1)
        picks = [2.0 ** -130, -(2.0 ** -127), 0.0, -0.0, np.inf, -np.inf, np.nan]
        at = RNG.integers(0, flat.size, max(1, flat.size // 16))
        flat[at] = RNG.choice(picks, at.size)
    return v.astype(BF16)


def test_pair_words_put_the_even_term_in_the_low_half():
    b = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32).astype(BF16)
    words = pair_words(b).view(np.uint32)
    bits = b.view(np.uint16).astype(np.uint32)
    assert words.shape == (1, 2)
    assert list(words[0]) == [bits[0, 0] | bits[1, 0] << 16, bits[0, 1] | bits[1, 1] << 16]


@NEEDS_BF16
@pytest.mark.parametrize("x_shape,n", [((1, 2), 1), ((5, 8), 17), ((7, 64), 33), ((2, 3, 130), 48), ((96, 256), 256)])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_the_paired_kernel_is_the_rule_bit_for_bit(x_shape: tuple[int, ...], n: int, transpose_b: bool):
    k = x_shape[-1]
    w_shape = (n, k) if transpose_b else (k, n)
    for regime in ("normal", "tiny", "huge", "specials"):
        w = _values(w_shape, regime)
        model = compile(_module(x_shape, w, transpose_b), cache=False)
        assert model.manifest is not None and model.manifest["kernels"][0].endswith(".bf16x2")
        x = _values(x_shape, regime)
        np.testing.assert_array_equal(_bits(model.run({"x": x})[0]), _bits(_rule(x, w, transpose_b)), err_msg=regime)


@NEEDS_BF16
def test_a_sum_of_negative_zeros_is_negative_zero():
    """The rule folds from -0.0: products that are all -0.0 sum to -0.0, which a kernel starting from
    +0.0 would turn into +0.0."""
    w = np.full((16, 32), -1.0, np.float32).astype(BF16)
    x = np.zeros((4, 16), np.float32).astype(BF16)
    got = compile(_module(x.shape, w, False), cache=False).run({"x": x})[0]
    assert np.all(np.signbit(got)) and np.array_equal(_bits(got), _bits(_rule(x, w, False)))


@NEEDS_BF16
def test_threads_split_the_paired_kernel_without_changing_a_bit():
    w = _values((512, 384), "normal")
    x = _values((64, 512), "normal")
    one = compile(_module(x.shape, w, False), cache=False, threads=1).run({"x": x})[0]
    two = compile(_module(x.shape, w, False), cache=False, threads=2).run({"x": x})[0]
    np.testing.assert_array_equal(_bits(one), _bits(two))
    np.testing.assert_array_equal(_bits(one), _bits(_rule(x, w, False)))


def test_what_the_paired_kernel_does_not_take_runs_on_the_rule_lowering():
    """An odd K (its last pair would read past a row) and a right operand that is not constant."""
    w = _values((7, 16), "normal")
    model = compile(_module((3, 7), w, False), cache=False)
    assert model.manifest is not None and model.manifest["kernels"][0] == "rule"
    x = _values((3, 7), "normal")
    np.testing.assert_array_equal(_bits(model.run({"x": x})[0]), _bits(_rule(x, w, False)))
    b = Builder()
    p, q = b.param("x", DType.bf16, (3, 8)), b.param("w", DType.bf16, (8, 16))
    model = compile(b.module(b.function("main", [p, q], [b.op("bf16_matmul", p, q)])), cache=False)
    assert model.manifest is not None and model.manifest["kernels"][0] == "rule"


# --------------------------------------------------------------------------------------
# bf16_conv: the convolution schedule over channel pairs


def _conv_module(x_shape: tuple[int, ...], w: np.ndarray, attrs: dict, epilogue: bool) -> Module:
    b = Builder()
    x = b.param("x", DType.bf16, x_shape)
    y = b.op("bf16_conv", x, b.const(w), **attrs)
    if epilogue:  # a bias and a ReLU, fused into the kernel at O3
        bias = RNG.standard_normal((1, w.shape[0]) + (1,) * (len(x_shape) - 2)).astype(np.float32)
        y = b.relu(b.add(y, b.const(bias)))
    return b.module(b.function("main", [x], [y]))


def _conv_reference(module: Module, x: np.ndarray) -> np.ndarray:
    from cuvil.interp import run_reference

    return run_reference(module, [x])[0]


CONV_CASES = [  # (x shape, w shape, attrs): odd channel counts, strides, dilations, pads, 1-D and 3-D, batches
    ((1, 3, 11, 9), (5, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 4, 9, 9), (6, 4, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((1, 5, 10, 8), (7, 5, 1, 1), {"strides": (2, 2)}),
    ((1, 64, 12, 12), (32, 64, 3, 3), {"pads": (1, 1, 1, 1)}),  # output channels a vector: positions as rows
    ((1, 3, 20, 20), (16, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    ((1, 6, 9, 10), (4, 6, 3, 2), {"dilations": (2, 1), "pads": (2, 0, 1, 1)}),
    ((2, 3, 17), (4, 3, 3), {"strides": (2,), "pads": (1, 1)}),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), {"pads": (0, 1, 1, 1, 0, 0)}),
]


@NEEDS_BF16
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_the_paired_convolution_is_the_rule_bit_for_bit(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                                        attrs: dict):
    for regime, epilogue in (("normal", True), ("tiny", False), ("huge", True), ("specials", False)):
        w = _values(w_shape, regime)
        module = _conv_module(x_shape, w, attrs, epilogue)
        model = compile(module, cache=False)
        assert model.manifest is not None
        assert next(k for k in model.manifest["kernels"] if k.startswith("conv.")).endswith(".bf16x2"), regime
        x = _values(x_shape, regime)
        np.testing.assert_array_equal(_bits(model.run({"x": x})[0]), _bits(_conv_reference(module, x)),
                                      err_msg=regime)


@NEEDS_BF16
def test_threads_split_the_paired_convolution_without_changing_a_bit(monkeypatch):
    """One thread, two, and two in bands of four rows (each band's pairs copied by the chunk that computes it)."""
    import cuvil.codegen.kernels.conv as conv

    w = _values((64, 48, 3, 3), "normal")
    x = _values((2, 48, 16, 16), "normal")
    module = _conv_module(x.shape, w, {"pads": (1, 1, 1, 1)}, True)
    one = compile(module, cache=False, threads=1).run({"x": x})[0]
    two = compile(module, cache=False, threads=2).run({"x": x})[0]
    monkeypatch.setattr(conv, "BAND_MIN_POSITIONS", 1)
    banded = compile(module, cache=False, threads=2)
    assert banded.manifest is not None
    assert any(k.startswith("conv.") and ".b4." in k for k in banded.manifest["kernels"]), banded.manifest["kernels"]
    np.testing.assert_array_equal(_bits(one), _bits(two))
    np.testing.assert_array_equal(_bits(one), _bits(banded.run({"x": x})[0]))
    np.testing.assert_array_equal(_bits(one), _bits(_conv_reference(module, x)))


def test_conv_pair_words_put_the_even_channel_in_the_low_half_and_complete_an_odd_count():
    w = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2).astype(BF16)
    words = conv_pair_words(w).view(np.uint32)
    bits = w.view(np.uint16).astype(np.uint32)
    assert words.shape == (2, 2, 2)
    assert list(words[1, 0]) == list(bits[1, 0] | bits[1, 1] << 16)
    assert list(words[1, 1]) == list(bits[1, 2])  # the missing fourth channel: a zero high half


def test_a_convolution_without_constant_weights_runs_on_the_rule_lowering():
    b = Builder()
    x, w = b.param("x", DType.bf16, (1, 3, 6, 6)), b.param("w", DType.bf16, (4, 3, 3, 3))
    model = compile(b.module(b.function("main", [x, w], [b.op("bf16_conv", x, w)])), cache=False)
    assert model.manifest is not None and model.manifest["kernels"] == ["rule"]
    xs, ws = _values((1, 3, 6, 6), "normal"), _values((4, 3, 3, 3), "normal")
    op = get_op("bf16_conv")
    attrs = {"strides": (), "pads": (), "dilations": ()}
    want = evaluate_op(op, [xs, ws], attrs, op.infer([TensorType(DType.bf16, a.shape) for a in (xs, ws)], attrs))
    np.testing.assert_array_equal(_bits(model.run({"x": xs, "w": ws})[0]), _bits(want))
