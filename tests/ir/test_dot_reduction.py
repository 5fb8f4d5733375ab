"""The ``dot`` reductions: one fused multiply-add per term, and ``dot_ftz``'s flushing, as the hardware
computes them. ``bf16_matmul``'s rule is checked against x86's ``vdpbf16ps`` itself (run through
llvmlite), so the rule states the instruction's meaning and not a neighbour of it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from llvmlite import binding as llvm

from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op, evaluate_rule
from cuvil.ir.module import Module
from cuvil.ir.numpy_prims import fma_f32, sequential_dot
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType

RNG = np.random.default_rng(23)
BF16 = ml_dtypes.bfloat16


def _bits(x: np.ndarray) -> np.ndarray:
    """float32 bit patterns with every NaN the same (CIR's exactness: any NaN equals any NaN)."""
    bits = np.asarray(x, np.float32).view(np.uint32).copy()
    bits[np.isnan(x)] = 0x7FC00000
    return bits


def _host_has(feature: str) -> bool:
    return llvm.get_host_cpu_features().get(feature, False) is True


NEEDS_BF16 = pytest.mark.skipif(not _host_has("avx512bf16"),
                                reason="needs a CPU with AVX512-BF16 to run vdpbf16ps, the instruction compared with")


def _jit(ir_text: str, name: str, argtypes: list[Any]) -> tuple[Callable[..., None], Any]:
    """``name`` of ``ir_text`` compiled for this CPU (the engine is returned: it owns the code)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu=llvm.get_host_cpu_name(),
                                                                 features=llvm.get_host_cpu_features().flatten())
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    return ctypes.CFUNCTYPE(None, *argtypes)(engine.get_function_address(name)), engine


_FMA_IR = """
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
define void @fma(ptr %x, ptr %y, ptr %z, ptr %o, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %pz = getelementptr float, ptr %z, i64 %i
  %po = getelementptr float, ptr %o, i64 %i
  %vx = load <16 x float>, ptr %px, align 4
  %vy = load <16 x float>, ptr %py, align 4
  %vz = load <16 x float>, ptr %pz, align 4
  %r = call <16 x float> @llvm.fma.v16f32(<16 x float> %vx, <16 x float> %vy, <16 x float> %vz)
  store <16 x float> %r, ptr %po, align 4
  %next = add i64 %i, 16
  %done = icmp uge i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _exponents(n: int, lo: int, hi: int) -> np.ndarray:
    return 2.0 ** RNG.integers(lo, hi, n).astype(np.float64)


def test_fma_f32_is_the_hardware_fused_multiply_add():
    """Every regime of float32: overflow, subnormal results, exact cancellation, ties."""
    fma, _engine = _jit(_FMA_IR, "fma", [ctypes.c_void_p] * 4 + [ctypes.c_int64])
    n = 1 << 14
    for trial in range(24):
        x = (RNG.standard_normal(n) * _exponents(n, -75, 64)).astype(np.float32)
        y = (RNG.standard_normal(n) * _exponents(n, -75, 64)).astype(np.float32)
        if trial % 3 == 0:  # near-cancellation: z close to -x*y
            z = (-(x.astype(np.float64) * y) * (1 + RNG.standard_normal(n) * _exponents(n, -40, -1)))
        else:
            z = RNG.standard_normal(n) * _exponents(n, -150, 127)
        with np.errstate(over="ignore"):
            z = z.astype(np.float32)
        if trial == 0:
            x[:8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 2.0 ** -149]
            z[:8] = [-np.inf, 1.0, 1.0, -0.0, -0.0, -0.0, 0.0, -(2.0 ** -149)]
        out = np.empty(n, np.float32)
        fma(x.ctypes.data, y.ctypes.data, z.ctypes.data, out.ctypes.data, n)
        np.testing.assert_array_equal(_bits(fma_f32(x, y, z)), _bits(out))


def test_fma_f32_rounds_once_where_a_rounded_product_would_not():
    x = np.float32(1 + 2.0 ** -12)
    z = np.float32(-(1 + 2.0 ** -11))  # x*x = 1 + 2^-11 + 2^-24: the 2^-24 survives only unrounded
    assert fma_f32(np.array([x]), np.array([x]), np.array([z]))[0] == np.float32(2.0 ** -24)
    assert np.float32(x * x) + z == 0.0


_DP_IR = """
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define void @dp(ptr %acc, ptr %a, ptr %b, i64 %pairs) {
entry:
  %c0 = load <16 x float>, ptr %acc, align 4
  br label %loop
loop:
  %j = phi i64 [0, %entry], [%next, %loop]
  %c = phi <16 x float> [%c0, %entry], [%r, %loop]
  %pa = getelementptr i32, ptr %a, i64 %j
  %pair = load i32, ptr %pa, align 4
  %ins = insertelement <16 x i32> poison, i32 %pair, i64 0
  %bc = shufflevector <16 x i32> %ins, <16 x i32> poison, <16 x i32> zeroinitializer
  %x = bitcast <16 x i32> %bc to <32 x bfloat>
  %pb = getelementptr <32 x bfloat>, ptr %b, i64 %j
  %y = load <32 x bfloat>, ptr %pb, align 4
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %x, <32 x bfloat> %y)
  %next = add i64 %j, 1
  %done = icmp uge i64 %next, %pairs
  br i1 %done, label %exit, label %loop
exit:
  store <16 x float> %r, ptr %acc, align 4
  ret void
}
"""


def _vdpbf16ps_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a[1, K] @ b[K, 16]`` by the instruction: pairs of K (a zero completing an odd K), acc from -0.0."""
    dp, _engine = _jit(_DP_IR, "dp", [ctypes.c_void_p] * 3 + [ctypes.c_int64])
    k = a.shape[1]
    kk = k + k % 2
    a2 = np.zeros(kk, BF16)
    a2[:k] = a[0]
    b2 = np.zeros((kk, 16), BF16)
    b2[:k] = b
    packed = np.ascontiguousarray(b2.reshape(kk // 2, 2, 16).transpose(0, 2, 1))  # [pair][column][2]
    acc = np.full(16, -0.0, np.float32)
    dp(acc.ctypes.data, a2.ctypes.data, packed.ctypes.data, kk // 2)
    return acc


def _bf16(shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 2.0 ** RNG.integers(lo, hi, shape).astype(np.float64)).astype(BF16)


def _bf16_matmul(a: np.ndarray, b: np.ndarray, *, rule: bool = False) -> np.ndarray:
    op = get_op("bf16_matmul")
    attrs = {"transpose_a": False, "transpose_b": False}
    out = op.infer([TensorType(DType.bf16, a.shape), TensorType(DType.bf16, b.shape)], attrs)
    return evaluate_rule(op, [a, b], attrs, out) if rule else evaluate_op(op, [a, b], attrs, out)


@NEEDS_BF16
@pytest.mark.parametrize("k", [1, 2, 7, 64, 301])
@pytest.mark.parametrize("regime", ["normal", "tiny", "huge", "specials"])
def test_bf16_matmul_is_vdpbf16ps_bit_for_bit(k: int, regime: str):
    lo, hi = {"normal": (-4, 4), "tiny": (-70, -55), "huge": (55, 66), "specials": (-70, 66)}[regime]
    a, b = _bf16((1, k), lo, hi), _bf16((k, 16), lo, hi)
    if regime == "specials":  # subnormal factors, zeros of both signs, infinities, NaN
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        picks = np.array([2.0 ** -130, -(2.0 ** -127), 0.0, -0.0, np.inf, -np.inf, np.nan], np.float32).astype(BF16)
        flat_a[RNG.integers(0, k, max(1, k // 4))] = RNG.choice(picks, max(1, k // 4))
        flat_b[RNG.integers(0, k * 16, 4 * k)] = RNG.choice(picks, 4 * k)
    want = _vdpbf16ps_row(a, b)
    for rule in (False, True):  # the op's fast path and its rule
        got = _bf16_matmul(a, b, rule=rule)[0]
        np.testing.assert_array_equal(_bits(got), _bits(want))


@NEEDS_BF16
def test_the_rule_is_pinned_down_by_the_instruction():
    """The order (each pair's odd term first) and the flushing matter: an even-first order and a dot
    without flushing each differ from the instruction where the rule does not. (In float32's normal
    range a product of two bfloat16 is exact, so rounding it changes nothing there.)"""
    odd_first = np.arange(64) ^ 1
    even_first = 0
    for _ in range(8):
        a, b = _bf16((1, 64), -12, 12), _bf16((64, 16), -12, 12)
        want = _vdpbf16ps_row(a, b).view(np.uint32)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        x, y = a32[:, None, :], b32.T[None]
        assert np.array_equal(sequential_dot("dot_ftz", x[..., odd_first], y[..., odd_first], 2)[0].view(np.uint32),
                              want)
        even_first += int(np.sum(sequential_dot("dot_ftz", x, y, 2)[0].view(np.uint32) != want))
    assert even_first > 0
    # products under float32's normals: flushed by the instruction (and the rule), kept by a plain dot
    t, u = _bf16((1, 8), -70, -66), _bf16((8, 16), -64, -60)
    flushed = _vdpbf16ps_row(t, u)
    assert np.all(flushed == 0)
    np.testing.assert_array_equal(_bf16_matmul(t, u)[0].view(np.uint32), flushed.view(np.uint32))
    order = np.arange(8) ^ 1
    plain = sequential_dot("dot", t.astype(np.float32)[:, None, order], u.astype(np.float32).T[None][..., order], 2)
    assert np.any(plain[0] != 0)


def _bf16_matmul_module(m: int, k: int, n: int) -> Module:
    b = Builder()
    x = b.param("x", DType.bf16, (m, k))
    w = b.param("w", DType.bf16, (k, n))
    return b.module(b.function("main", [x, w], [b.op("bf16_matmul", x, w)]))


@pytest.mark.parametrize("shape", [(3, 5, 17), (4, 64, 33), (2, 1, 3)])
def test_the_generic_lowering_computes_the_rule_bit_for_bit(shape: tuple[int, int, int]):
    m, k, n = shape
    model = compile(_bf16_matmul_module(m, k, n), cache=False)
    for lo, hi in ((-4, 4), (-70, -55), (-70, 66)):
        a, b = _bf16((m, k), lo, hi), _bf16((k, n), lo, hi)
        got = model.run({"x": a, "w": b})[0]
        np.testing.assert_array_equal(_bits(got), _bits(_bf16_matmul(a, b)))
