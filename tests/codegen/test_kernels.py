"""Tuned kernels (GEMM, convolution, the thread pool) against the op's compute rule.

The oracle is the interpreter evaluating each op's *rule* (not its numpy fast path), on the
unoptimized function; the compiled side goes through the normal pipeline, so fusion puts the
epilogues into the kernels. Many cases share one compiled function (one output per case) to
keep compile time down. Floats are compared within 1e-5 relative to the output's scale,
widened with sqrt(K) for long reductions (summation order is not part of the meaning).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cuvil.codegen.kernels.gemm as gemm
from cuvil.codegen.kernels import force_isa, generic_only
from cuvil.codegen.kernels.pack import pack_a_tiles, pack_b_panels
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from tests.oracles import rule_reference

RNG = np.random.default_rng(11)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def assert_close(got: np.ndarray, want: np.ndarray, k: int, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    scale = float(np.abs(want).max(initial=0.0)) or 1.0
    tol = 1e-5 * scale * max(1.0, math.sqrt(k / 64))
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0))
    assert err <= tol, f"{what}: max |diff| {err:.3e} > {tol:.3e} (scale {scale:.3e})"


class Cases:
    """Many independent cases as the results of one function: one compile for all of them."""

    def __init__(self) -> None:
        self.b = Builder()
        self.params: list[Value] = []
        self.inputs: list[np.ndarray] = []
        self.results: list[Value] = []
        self.labels: list[str] = []
        self.reductions: list[int] = []

    def input(self, array: np.ndarray) -> Value:
        p = self.b.param(f"x{len(self.params)}", DType.from_numpy(array.dtype), array.shape)
        self.params.append(p)
        self.inputs.append(array)
        return p

    def add(self, label: str, value: Value, k: int) -> None:
        self.results.append(value)
        self.labels.append(label)
        self.reductions.append(k)

    def module(self) -> Module:
        names = [f"r{i}" for i in range(len(self.results))]
        return self.b.module(Function("cases", tuple(self.params), tuple(self.results), tuple(names)))

    def check(self, expect_kernel: str | None = None, **options: Any) -> dict[str, Any]:
        module = self.module()
        model = compile(module, cache=False, **options)
        got = model.run(self.inputs)
        want = rule_reference(module, self.inputs)
        for g, w, label, k in zip(got, want, self.labels, self.reductions, strict=True):
            assert_close(g, w, k, label)
        assert model.manifest is not None
        kernels = model.manifest["kernels"]
        if expect_kernel is not None:
            tuned = [n for n in kernels if n.startswith(expect_kernel)]
            assert len(tuned) == len(self.results), f"expected a {expect_kernel} kernel per case, got {kernels}"
        return model.manifest


# --------------------------------------------------------------------------------------
# packing


def test_pack_b_panels_layout():
    b = _f32(5, 37)
    packed = pack_b_panels(b, 16)
    assert packed.shape == (3, 5, 16)
    for k in range(5):
        for n in range(48):
            want = b[k, n] if n < 37 else 0.0
            assert packed[n // 16, k, n % 16] == want


def test_pack_a_tiles_layout_batched():
    a = _f32(2, 13, 4)
    packed = pack_a_tiles(a, 6)
    assert packed.shape == (2, 3, 4, 6)
    for g in range(2):
        for m in range(18):
            for k in range(4):
                want = a[g, m, k] if m < 13 else 0.0
                assert packed[g, m // 6, k, m % 6] == want


# --------------------------------------------------------------------------------------
# GEMM

ODD = (1, 3, 17, 65, 130)


def _matmul_case(c: Cases, m: int, n: int, k: int, *, const_b: bool, ta: bool = False, tb: bool = False,
                 a_batch: tuple[int, ...] = (), b_batch: tuple[int, ...] = ()) -> None:
    a = c.input(_f32(*a_batch, *((k, m) if ta else (m, k))))
    w = _f32(*b_batch, *((n, k) if tb else (k, n)))
    rhs = c.b.const(w) if const_b else c.input(w)
    c.add(f"matmul m{m} n{n} k{k} const_b={const_b} ta={ta} tb={tb} batch={a_batch}/{b_batch}",
          c.b.matmul(a, rhs, transpose_a=ta, transpose_b=tb), k)


def test_gemm_odd_sizes_packed_weights():
    c = Cases()
    for m, n, k in [(1, 1, 1), (3, 17, 65), (17, 130, 3), (65, 3, 17), (130, 65, 130), (1, 130, 17),
                    (130, 1, 65), (17, 65, 1), (65, 17, 300), (3, 130, 130)]:
        _matmul_case(c, m, n, k, const_b=True)
    _matmul_case(c, 17, 65, 30, const_b=True, ta=True)
    _matmul_case(c, 17, 65, 30, const_b=True, tb=True)
    _matmul_case(c, 65, 17, 30, const_b=True, ta=True, tb=True)
    manifest = c.check("gemm.")
    assert all(name.endswith("packed_b") for name in manifest["kernels"])


def test_gemm_odd_sizes_activation_rhs():
    c = Cases()
    for m, n, k in [(1, 1, 1), (3, 17, 65), (17, 130, 3), (65, 3, 17), (130, 65, 130), (130, 1, 65)]:
        _matmul_case(c, m, n, k, const_b=False)
        _matmul_case(c, m, n, k, const_b=False, tb=True)
    _matmul_case(c, 17, 33, 65, const_b=False, ta=True)
    manifest = c.check("gemm.")
    assert {name.rsplit(".", 1)[-1] for name in manifest["kernels"]} == {"direct_b", "pack_b"}


def test_panels_packed_at_run_time_whole_or_partial(monkeypatch):
    """A 1x1 convolution whose channel planes lie far apart packs its B panels at run time: a whole panel's rows
    are copied at their known length, a partial last panel's at its width with zeros after; both give the bits
    of the copy of any length, and the rule's values (planes of 1,155 and 1,280 positions, two images)."""
    import cuvil.codegen.kernels.conv as conv

    c = Cases()
    for xs, ws in [((1, 64, 33, 35), (80, 64, 1, 1)), ((2, 48, 32, 40), (96, 48, 1, 1))]:
        x = c.input(_f32(*xs))
        c.add(f"conv x{xs} w{ws}", c.b.conv(x, c.b.const(_f32(*ws))), ws[1])
    module = c.module()
    packs: list[int] = []
    monkeypatch.setattr(conv, "pack_panel", _noting(gemm.pack_panel, lambda *_, **__: packs.append(1)))
    builds = {}
    for whole in (True, False):
        monkeypatch.setattr(gemm, "WHOLE_PANEL_ROWS", whole)
        builds[whole] = compile(module, cache=False)
    assert len(packs) == 4, packs  # each convolution packs at run time, in both builds
    want = rule_reference(module, c.inputs)
    for g, p, w, label, k in zip(builds[True].run(c.inputs), builds[False].run(c.inputs), want, c.labels,
                                 c.reductions, strict=True):
        assert np.array_equal(g.view(np.uint32), p.view(np.uint32)), label
        assert_close(g, w, k, label)


def test_batched_matmul_broadcasting():
    c = Cases()
    _matmul_case(c, 5, 19, 7, const_b=True, a_batch=(3,))
    _matmul_case(c, 5, 19, 7, const_b=True, a_batch=(2, 3), b_batch=(3,))
    _matmul_case(c, 5, 19, 7, const_b=True, b_batch=(2,))
    _matmul_case(c, 17, 3, 65, const_b=False, tb=True, a_batch=(2, 3), b_batch=(3,))
    _matmul_case(c, 17, 3, 65, const_b=False, ta=True, a_batch=(2, 1), b_batch=(1, 3))
    _matmul_case(c, 4, 40, 33, const_b=False, a_batch=(4,), b_batch=(4,))
    c.check("gemm.")


def test_gemm_k_blocked_and_wide():
    """K longer than one cache block (partial sums kept between blocks) and N over many panels."""
    c = Cases()
    _matmul_case(c, 9, 70, 700, const_b=True)
    _matmul_case(c, 9, 70, 700, const_b=False)
    _matmul_case(c, 2, 1000, 40, const_b=True)
    c.check("gemm.")


# --------------------------------------------------------------------------------------
# epilogues: every kind, on matmul and conv (the fused body's rule is the meaning)

EPILOGUES: dict[str, Callable[[Builder, Value, Value, Value], Value]] = {
    "bias": lambda b, y, bias, res: b.add(y, bias),
    "bias_relu": lambda b, y, bias, res: b.relu(b.add(y, bias)),
    "residual_relu": lambda b, y, bias, res: b.relu(b.add(b.add(y, bias), res)),
    "clip": lambda b, y, bias, res: b.clip(b.add(y, bias), min=0.0, max=6.0),
    "gelu": lambda b, y, bias, res: b.gelu(b.add(y, bias)),
    "gelu_tanh": lambda b, y, bias, res: b.gelu(y, approximate="tanh"),
    "silu": lambda b, y, bias, res: b.silu(b.add(y, bias)),
    "sigmoid": lambda b, y, bias, res: b.sigmoid(y),
    "tanh": lambda b, y, bias, res: b.tanh(y),
    "leaky_relu": lambda b, y, bias, res: b.leaky_relu(y, alpha=0.1),
    "hardswish": lambda b, y, bias, res: b.hardswish(b.add(y, bias)),
    "scale": lambda b, y, bias, res: b.mul(y, bias),
    "div": lambda b, y, bias, res: b.div(y, res),
    # written out, as exporters without the op write them: the product (with its bias) is read twice
    "gelu_written_out": lambda b, y, bias, res: _written_out_gelu(b, b.add(y, bias)),
    "silu_written_out": lambda b, y, bias, res: (lambda p: b.mul(p, b.sigmoid(p)))(b.add(y, bias)),
}


def _written_out_gelu(b: Builder, p: Value) -> Value:
    e = b.erf(b.div(p, b.scalar(float(np.sqrt(2.0)), DType.f32)))
    return b.mul(b.mul(b.add(e, b.scalar(1.0, DType.f32)), p), b.scalar(0.5, DType.f32))


def test_matmul_epilogues():
    c = Cases()
    m, n, k = 19, 37, 23
    for name, epi in EPILOGUES.items():
        x = c.input(_f32(m, k))
        y = c.b.matmul(x, c.b.const(_f32(k, n)))
        res = c.input(_f32(m, n) + (3.0 if name == "div" else 0.0))
        c.add(f"matmul+{name}", epi(c.b, y, c.b.const(_f32(n)), res), k)
    manifest = c.check("gemm.")
    assert manifest["ops"].get("fused", 0) == len(EPILOGUES)


def test_conv_epilogues():
    c = Cases()
    for name, epi in EPILOGUES.items():
        x = c.input(_f32(1, 5, 9, 8))
        y = c.b.conv(x, c.b.const(_f32(6, 5, 3, 3)), pads=(1, 1, 1, 1))
        res = c.input(_f32(1, 6, 9, 8) + (3.0 if name == "div" else 0.0))
        c.add(f"conv+{name}", epi(c.b, y, c.b.const(_f32(6, 1, 1)), res), 45)
    manifest = c.check("conv.")
    assert manifest["ops"].get("fused", 0) == len(EPILOGUES)


@pytest.mark.parametrize("kernel, cin, side, schedule", [((3, 3), 32, 7, "conv.direct.t."),
                                                       ((1, 1), 260, 7, "conv.1x1.t."),
                                                       ((1, 1), 16, 23, "conv.1x1.{isa}.")])
def test_conv_epilogues_per_schedule(kernel: tuple[int, int], cin: int, side: int, schedule: str) -> None:
    """Every epilogue on each convolution schedule whose store has a path of its own. On small maps output
    positions are the GEMM rows (the ``.t`` schedules): an epilogue that reads only per-channel operands runs
    along the tile's rows and the tile is stored transposed in registers, one that reads the output's
    positions (a residual) element by element down its columns. An unpadded 1x1 convolution stores a tile's
    positions as one run (a whole tile row a loop of known length). Either way every element is the fused
    body's rule: 37 channels (two whole groups of sixteen and five more) over 7x7 positions (eight tiles
    of six and one of one), or 23x23 (eleven tiles of 48 and one of one on AVX-512), two images."""
    schedule = schedule.format(isa=gemm.host_isa().name)
    c = Cases()
    for name, epi in EPILOGUES.items():
        x = c.input(_f32(2, cin, side, side))
        pads = (1, 1, 1, 1) if kernel == (3, 3) else (0, 0, 0, 0)
        y = c.b.conv(x, c.b.const(_f32(37, cin, *kernel)), pads=pads)
        res = c.input(_f32(2, 37, side, side) + (3.0 if name == "div" else 0.0))
        c.add(f"{schedule}+{name}", epi(c.b, y, c.b.const(_f32(37, 1, 1)), res), cin * math.prod(kernel))
    manifest = c.check("conv.")
    assert all(k.startswith(schedule) for k in manifest["kernels"]), manifest["kernels"]
    assert manifest["ops"].get("fused", 0) == len(EPILOGUES)


def test_requantizing_epilogue_writes_int8():
    """An integer result dtype: the epilogue's cast decides what is stored."""
    b = Builder()
    x = b.param("x", DType.f32, (9, 40))
    y = b.matmul(x, b.const(_f32(40, 21)))
    q = b.cast(b.clip(b.round(b.div(y, b.const(np.array(0.05, np.float32)))), min=-128.0, max=127.0), to=DType.i8)
    module = b.module(b.function("q", [x], [q]))
    model = compile(module, cache=False)
    assert model.manifest is not None and model.manifest["kernels"][0].startswith("gemm.")
    xs = _f32(9, 40)
    got, want = model(xs), rule_reference(module, [xs])[0]
    assert got.dtype == np.int8
    # a product within rounding of a .5 boundary may round the other way; nothing else may differ
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1
    assert np.mean(got == want) > 0.98


# --------------------------------------------------------------------------------------
# convolution geometry

CONVS: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 5, 7, 9), (6, 5, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((1, 3, 17, 17), (17, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    ((1, 6, 11, 10), (9, 2, 3, 2), {"groups": 3, "dilations": (2, 1), "pads": (2, 0, 1, 1)}),
    ((1, 4, 12, 12), (4, 4, 3, 3), {"dilations": (2, 3), "pads": (2, 3, 2, 3)}),
    ((1, 16, 9, 9), (32, 16, 1, 1), {"strides": (2, 2)}),
    ((2, 17, 13, 13), (130, 17, 1, 1), {}),
    ((1, 8, 5, 6), (3, 8, 1, 1), {}),
    ((1, 8, 10, 10), (8, 8, 2, 2), {"strides": (2, 2)}),
    ((1, 4, 6, 7), (5, 4, 3, 3), {"pads": (0, 2, 1, 0), "strides": (1, 3)}),
    ((2, 3, 20), (5, 3, 4), {"strides": (3,), "pads": (2, 1)}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": (1, 2, 1), "pads": (0, 1, 1, 1, 0, 0)}),
    # rows long enough for the padded copy's vector paths (stride 1: contiguous, stride 2: deinterleaved),
    # with odd and even widths and both phases of a stride-2 row
    ((1, 3, 9, 75), (4, 3, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((1, 2, 8, 100), (3, 2, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    ((1, 2, 91), (3, 2, 3), {"strides": (2,), "pads": (1, 1)}),
    ((1, 2, 4, 70), (3, 2, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((1, 3, 5, 14), (2, 3, 3, 3), {"pads": (1, 1, 1, 1)}),  # a padded row one vector wide, its copy shorter
    ((1, 2, 3, 40), (2, 2, 3, 3), {"pads": (1, 2, 1, 21)}),  # padding wider than a vector at the row's end
    # small feature maps: output positions become the GEMM rows (the ".t" schedules)
    ((2, 8, 6, 6), (32, 8, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((1, 16, 5, 5), (32, 8, 3, 3), {"groups": 2, "pads": (1, 1, 1, 1)}),
    ((1, 40, 7, 7), (35, 40, 3, 3), {"pads": (1, 1, 1, 1)}),  # K = 360: more than one K block
    ((1, 24, 9, 9), (48, 24, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((2, 64, 7, 7), (48, 64, 1, 1), {}),
]


def test_conv_geometries():
    c = Cases()
    for xs, ws, attrs in CONVS:
        x = c.input(_f32(*xs))
        k = ws[1] * math.prod(ws[2:])
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.conv(x, c.b.const(_f32(*ws)), **attrs), k)
    manifest = c.check("conv.")
    for schedule in ("conv.1x1.", "conv.direct.", "conv.1x1.t.", "conv.direct.t."):
        assert any(n.startswith(schedule) for n in manifest["kernels"]), (schedule, manifest["kernels"])


def _conv_kernel(xs: tuple[int, ...], ws: tuple[int, ...], **attrs: Any) -> Any:
    from cuvil.codegen.kernels.conv import select_conv
    from cuvil.codegen.kernels.epilogue import contraction_of

    b = Builder()
    w = _f32(*ws)
    v = b.conv(b.param("x", DType.f32, xs), b.const(w), **attrs)
    c = contraction_of(v)
    assert c is not None
    return select_conv("conv", c, [o.type for o in v.operands], v.type, w, gemm.host_isa())


def test_padded_rows_share_their_padding_columns(monkeypatch):
    """A padded copy's row ends where the next row's left padding can stand for its right padding: a 3x3
    convolution padded by one over 56 columns computes 57 positions a row, not 58; a stride-2 7x7 stem padded
    by three, whose two column phases lead with two and one zeros, shares one; a row with no left padding in
    some phase shares none. Every geometry gives the bits of the unshared copy."""
    import cuvil.codegen.kernels.conv as conv

    assert _conv_kernel((1, 4, 56, 56), (8, 4, 3, 3), pads=(1, 1, 1, 1)).plane[-1] == 57
    assert _conv_kernel((1, 3, 224, 224), (8, 3, 7, 7), strides=(2, 2), pads=(3, 3, 3, 3)).plane[-1] == 114
    assert _conv_kernel((1, 3, 224, 224), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1)).plane[-1] == 113
    monkeypatch.setattr(conv, "SHARED_PAD_COLUMNS", False)
    assert _conv_kernel((1, 4, 56, 56), (8, 4, 3, 3), pads=(1, 1, 1, 1)).plane[-1] == 58
    c = Cases()
    extra = [((1, 4, 5, 5), (6, 4, 3, 3), {"pads": (4, 4, 4, 4)}),  # padding wider than the kernel
             ((1, 3, 9, 31), (5, 3, 5, 5), {"dilations": (1, 2), "pads": (2, 4, 2, 4)}),
             ((2, 5, 11, 19), (7, 5, 3, 3), {"strides": (1, 3), "pads": (1, 2, 1, 2)})]
    for xs, ws, attrs in CONVS + extra:
        x = c.input(_f32(*xs))
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.conv(x, c.b.const(_f32(*ws)), **attrs), ws[1] * math.prod(ws[2:]))
    module = c.module()
    unshared = compile(module, cache=False).run(c.inputs)
    monkeypatch.setattr(conv, "SHARED_PAD_COLUMNS", True)
    c.check("conv.")
    for got, want in zip(compile(module, cache=False).run(c.inputs), unshared, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_large_plane_takes_positions_as_rows_on_one_thread_or_in_bands(monkeypatch):
    """A 3x3 convolution over a plane of 1,600 positions with a reduction of 288 steps: a library for one
    thread computes it with positions as the GEMM rows (a ``.t`` schedule); one for two threads does too, in
    four bands of ten rows (a chunk of the pool copies a band's rows and computes them); without bands, two
    threads take positions as vectors (each position tile would read channels of the padded copy the other
    core wrote). The schedules sum the same products in the same order: the same bits, and the rule's
    values. (The choice by padded work is turned off, so that the plane's size alone decides on every vector
    width.)"""
    import cuvil.codegen.kernels.conv as conv

    assert conv.TRANSPOSE_PLANE < 40 * 40 <= conv.TRANSPOSE_PLANE_LOCAL
    monkeypatch.setattr(conv, "TRANSPOSE_GAIN", 1e9)
    c = Cases()
    x = c.input(_f32(1, 32, 40, 40))
    c.add("conv", c.b.relu(c.b.conv(x, c.b.const(_f32(24, 32, 3, 3)), pads=(1, 1, 1, 1))), 32 * 9)
    module = c.module()
    runs = {}
    for threads, banded, rows, bands in ((1, True, True, False), (2, True, True, True), (2, False, False, False)):
        monkeypatch.setattr(conv, "BANDED", banded)
        model = compile(module, cache=False, threads=threads)
        assert model.manifest is not None
        kernels = [k for k in model.manifest["kernels"] if k.startswith("conv.")]
        assert len(kernels) == 1 and (".t." in kernels[0]) == rows and kernels[0].endswith(".b4") == bands, \
            (threads, banded, kernels)
        runs[threads, banded] = model.run(c.inputs)[0]
    for got in runs.values():
        np.testing.assert_array_equal(got.view(np.uint32), runs[1, True].view(np.uint32))
    assert_close(runs[1, True], rule_reference(module, c.inputs)[0], 32 * 9, "conv")


BANDED_CONVS: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], int]] = [  # ..., bands expected
    ((2, 8, 12, 10), (32, 8, 3, 3), {"pads": (1, 1, 1, 1)}, 4),  # two images, bands of three rows
    ((1, 6, 8, 15), (16, 6, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}, 4),  # phases: one row a band
    ((1, 4, 15, 13), (32, 2, 3, 2), {"groups": 2, "dilations": (2, 1), "pads": (2, 0, 1, 1)}, 14),
    ((1, 3, 20, 20), (16, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}, 10),  # halo wider than a band
    ((1, 5, 16, 9), (17, 5, 5, 5), {"pads": (0, 2, 4, 1)}, 4),  # uneven pads, 17 channels: an edge panel
]


def test_bands_are_shared_evenly_and_large_enough() -> None:
    """Bands of equal rows, a multiple of the threads: four on two threads where each holds 192 positions
    (ResNet-18's 56x56 and 28x28 layers), else one a thread of at least 96 (its 14x14 layers in halves); none
    where the rows do not split so (7x7; 33 rows; 56 among three threads, 28 among eight), on one thread, or for
    an unpadded 1x1 (no copy); eight threads share 56 rows in eight bands of seven. Bands whose copies would
    hold more than ``BAND_COPY_MAX`` times the one copy's rows are not taken (their halos), nor an 11x11
    kernel's bands on eight threads over 16 rows."""
    want = {((56, 56), 2): 14, ((28, 28), 2): 7, ((14, 14), 2): 7, ((7, 7), 2): 0, ((33, 33), 2): 0,
            ((56, 56), 1): 0, ((56, 56), 3): 0, ((28, 28), 8): 0, ((56, 56), 8): 7,
            ((8, 256), 2): 4}  # four bands of two rows would copy 16 rows for 10: two of four (12)
    for (side, threads), rows in want.items():
        with gemm.pool_threads(threads):
            kernel = _conv_kernel((1, 64, *side), (64, 64, 3, 3), pads=(1, 1, 1, 1))
            assert kernel is not None and kernel._band_rows() == rows, (side, threads, kernel._band_rows())
            direct = _conv_kernel((1, 64, *side), (64, 64, 1, 1))
            assert direct is not None and direct._band_rows() == 0
    with gemm.pool_threads(8):
        wide = _conv_kernel((1, 8, 16, 256), (16, 8, 11, 11), pads=(5, 5, 5, 5))
        assert wide is not None and wide._band_rows() == 0


@pytest.mark.parametrize("xs, ws, attrs, bands", BANDED_CONVS)
def test_banded_schedule_keeps_every_bit(monkeypatch, xs: tuple[int, ...], ws: tuple[int, ...],
                                         attrs: dict[str, Any], bands: int) -> None:
    """The banded schedule (positions as rows, two threads; bands as short as one row here) against the same
    schedule unbanded: every band's copy holds the rows its taps read past the band (zeros above and below
    the input, neighbouring rows elsewhere, each phase of a strided input), and its positions land where the
    plane's would. Epilogues that read per channel (stored transposed in registers) and along positions (a
    residual: element by element): the same bits, and the rule's values."""
    import cuvil.codegen.kernels.conv as conv

    monkeypatch.setattr(conv.ConvKernel, "positions_as_rows", True)
    monkeypatch.setattr(conv, "BAND_MIN_POSITIONS", 1)
    monkeypatch.setattr(conv, "BAND_COPY_MAX", math.inf)
    c = Cases()
    x = c.input(_f32(*xs))
    y = c.b.conv(x, c.b.const(_f32(*ws)), **attrs)
    k = ws[1] * math.prod(ws[2:])
    c.add("bias_relu", EPILOGUES["bias_relu"](c.b, y, c.b.const(_f32(ws[0], 1, 1)), y), k)
    y2 = c.b.conv(c.input(_f32(*xs)), c.b.const(_f32(*ws)), **attrs)
    res = c.input(_f32(*[int(d) for d in y2.type.shape]))
    c.add("residual_relu", EPILOGUES["residual_relu"](c.b, y2, c.b.const(_f32(ws[0], 1, 1)), res), k)
    module = c.module()
    runs = {}
    for banded in (True, False):
        monkeypatch.setattr(conv, "BANDED", banded)
        model = compile(module, cache=False, threads=2)
        assert model.manifest is not None
        kernels = [n for n in model.manifest["kernels"] if n.startswith("conv.")]
        assert len(kernels) == 2 and all(".t." in n and n.endswith(f".b{bands}") == banded for n in kernels), \
            kernels
        runs[banded] = model.run(c.inputs)
    want = rule_reference(module, c.inputs)
    for got, plain, w, label in zip(runs[True], runs[False], want, c.labels, strict=True):
        np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32), err_msg=label)
        assert_close(got, w, k, label)


@pytest.mark.parametrize("rows, width", [(1, 8), (5, 8), (6, 8), (8, 8), (3, 4), (16, 16)])
def test_register_transpose_moves_every_element(rows: int, width: int) -> None:
    """``transpose`` of ``rows`` vectors of sixteen floats: column ``j`` holds element ``j`` of every row in
    row order (the lanes past the rows are unspecified), on this CPU's instructions; the eight-lane form
    (tiles of five to eight rows, stored transposed by the ``.t`` convolutions) has shuffles of its own."""
    from llvmlite import ir

    from cuvil.codegen.llvm_types import F32, PTR
    from cuvil.codegen.loops import const
    from cuvil.codegen.scalar import Builder as LLBuilder
    from tests.ir.test_dot_reduction import _jit

    mod = ir.Module("transpose")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR]), "transpose")
    b = LLBuilder(fn.append_basic_block("entry"))
    src, dst = fn.args
    vectors = [b.load(b.gep(src, [const(16 * i)], source_etype=F32), typ=gemm.vec_type(16), align=4)
               for i in range(rows)]
    columns = gemm.transpose(b, vectors, width)
    assert len(columns) == 16
    for j, column in enumerate(columns):
        b.store(column, b.gep(dst, [const(width * j)], source_etype=F32), align=4)
    b.ret_void()
    run, _engine = _jit(str(mod), "transpose", [ctypes.c_void_p, ctypes.c_void_p])
    x = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16)
    out = np.full((16, width), np.nan, dtype=np.float32)
    run(x.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out[:, :rows], x.T)


def test_depthwise_conv():
    c = Cases()
    for xs, s, d, p in [((1, 8, 9, 9), 1, 1, 1), ((2, 12, 14, 11), 2, 1, 1), ((1, 5, 10, 10), 1, 2, 2),
                        ((1, 3, 31, 33), 2, 1, 2)]:
        x = c.input(_f32(*xs))
        k = 5 if p == 2 and d == 1 else 3
        w = c.b.const(_f32(xs[1], 1, k, k))
        y = c.b.conv(x, w, groups=xs[1], strides=(s, s), dilations=(d, d), pads=(p,) * 4)
        c.add(f"depthwise x{xs} s{s} d{d} p{p}", c.b.clip(c.b.add(y, c.b.const(_f32(xs[1], 1, 1))), min=0.0,
                                                              max=6.0), k * k)
    manifest = c.check("conv.depthwise.")
    assert len(manifest["kernels"]) == 4


DEPTHWISE_GEOMETRIES = [
    # (input shape, kernel, strides, dilations, pads (begins + ends)): the in-place 2-D schedule's edge
    # columns and zero rows, where every tap falls in the padding, where none does, and the 1-D / 3-D
    # schedule that copies first
    ((1, 4, 6, 7), (3, 3), (1, 1), (1, 1), (0, 2, 1, 0)),  # asymmetric pads
    ((1, 3, 2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # no interior column: every column an edge
    ((1, 2, 1, 5), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # one input row: two of three kernel rows in padding
    ((2, 5, 9, 13), (1, 5), (1, 3), (1, 1), (0, 2, 0, 2)),  # a 1x5 kernel, stride 3 along the row
    ((1, 6, 11, 8), (5, 3), (2, 1), (1, 2), (2, 2, 2, 2)),  # taller kernel, dilated columns
    ((1, 3, 7, 7), (3, 3), (3, 3), (3, 3), (3, 3, 3, 3)),  # stride = dilation = pad = 3
    ((1, 4, 5, 5), (3, 3), (1, 1), (1, 1), (4, 4, 4, 4)),  # pads wider than the kernel: all-padding rows
    ((1, 4, 5, 5), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0)),  # no padding at all
    ((1, 3, 20, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # a block of 16 rows of 12, then one of 4
    ((1, 2, 7, 30), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # rows of 30: blocks of 4 rows, then one of 3
    ((1, 2, 9, 10), (3, 3), (2, 1), (1, 1), (1, 1, 1, 1)),  # stride 2 down, 1 across: blocks share no row
    ((1, 2, 8, 9), (5, 3), (1, 1), (2, 1), (4, 1, 4, 1)),  # dilated rows, whole kernel rows in the padding
    ((1, 4, 17), (3,), (2,), (1,), (1, 1)),  # 1-D
    ((1, 3, 4, 5, 6), (3, 3, 3), (1, 1, 2), (1, 1, 1), (1, 1, 1, 1, 1, 1)),  # 3-D
]


def test_depthwise_conv_geometries():
    c = Cases()
    for xs, ks, st, dl, pads in DEPTHWISE_GEOMETRIES:
        x = c.input(_f32(*xs))
        w = c.b.const(_f32(xs[1], 1, *ks))
        y = c.b.conv(x, w, groups=xs[1], strides=st, dilations=dl, pads=pads)
        c.add(f"depthwise x{xs} k{ks} s{st} d{dl} p{pads}", c.b.relu(y), math.prod(ks))
    manifest = c.check("conv.depthwise.")
    assert manifest["kernels"], "no depthwise kernel was used"


def test_depthwise_masked_last_vector_keeps_every_bit(monkeypatch):
    """Rows wide enough for the vector loop, with a last partial vector (masked at stride 1, one at a
    time at stride 2) and widths that are whole vectors: the same bits as the loop with a scalar
    remainder (every column's taps are the same fused steps in the same order)."""
    from cuvil.codegen.kernels import conv

    monkeypatch.setattr(conv, "TILES", False)  # the row loop (the tiles have no loop along the row)
    c = Cases()
    for xs, st in [((1, 3, 9, 112), 1), ((1, 2, 5, 40), 1), ((1, 2, 4, 34), 1), ((1, 2, 6, 50), 2),
                   ((1, 1, 3, 18), 1), ((2, 2, 4, 57), 2)]:
        x = c.input(_f32(*xs))
        y = c.b.conv(x, c.b.const(_f32(xs[1], 1, 3, 3)), groups=xs[1], strides=(st, st), pads=(1, 1, 1, 1))
        c.add(f"depthwise x{xs} s{st}", c.b.clip(y, min=0.0, max=6.0), 9)
    c.check("conv.depthwise.")
    masked = compile(c.module(), cache=False)
    monkeypatch.setattr(conv, "MASKED_TAIL", ())
    remainder = compile(c.module(), cache=False)
    for got, want, label in zip(masked.run(c.inputs), remainder.run(c.inputs), c.labels, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=label)


def test_depthwise_row_blocks_keep_every_bit(monkeypatch):
    """Rows computed several at a time (sharing their input rows' loads, edges as masked loads; at a
    stride across, every input column's sum first, the outputs picked from them) give the bits of one
    row at a time and of the interleaved loop: each output's taps are the same fused steps in the same
    order."""
    from cuvil.codegen.kernels import conv

    monkeypatch.setattr(conv, "TILES", False)  # the row loop's blocks (the tiles are tested on their own)
    c = Cases()
    for xs, ks, st, dl, pads in [g for g in DEPTHWISE_GEOMETRIES if len(g[0]) == 4] + [
            ((1, 3, 14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
            ((1, 2, 28, 28), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
            ((1, 3, 28, 28), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # four rows of 14 at stride 2
            ((1, 2, 14, 14), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # a whole 7x7 plane at stride 2
            ((1, 2, 9, 13), (3, 3), (2, 2), (1, 1), (0, 1, 2, 0)),  # asymmetric pads at stride 2
            ((1, 2, 12, 12), (3, 3), (2, 2), (2, 2), (2, 2, 2, 2)),  # dilated, stride 2
            ((1, 2, 11, 16), (3, 3), (1, 3), (1, 1), (1, 1, 1, 1))]:  # stride 3 across
        x = c.input(_f32(*xs))
        y = c.b.conv(x, c.b.const(_f32(xs[1], 1, *ks)), groups=xs[1], strides=st, dilations=dl, pads=pads)
        c.add(f"depthwise x{xs} k{ks} s{st} d{dl} p{pads}", c.b.clip(y, min=0.0, max=6.0), math.prod(ks))
    c.check("conv.depthwise.")
    assert conv.rows_per_block(14, 14) > 1 and conv.rows_per_block(7, 7, 2) > 1
    blocked = compile(c.module(), cache=False)
    monkeypatch.setattr(conv, "rows_per_block", lambda oh, ow, sw=1: 1 if sw == 1 else 0)
    single = compile(c.module(), cache=False)
    for got, want, label in zip(blocked.run(c.inputs), single.run(c.inputs), c.labels, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=label)


# --------------------------------------------------------------------------------------
# selection, fallbacks and the other vector width


def test_kernels_are_selected_and_can_be_turned_off():
    c = Cases()
    _matmul_case(c, 8, 24, 16, const_b=True)
    x = c.input(_f32(1, 4, 6, 6))
    c.add("conv", c.b.conv(x, c.b.const(_f32(5, 4, 3, 3))), 36)
    with_kernels = c.check()
    assert with_kernels["kernels"][0].startswith("gemm.") and with_kernels["kernels"][1].startswith("conv.")
    with generic_only():
        without = c.check()
    assert without["kernels"] == ["rule", "rule"]


def test_unsupported_dtypes_use_the_rule_lowering():
    b = Builder()
    x = b.param("x", DType.f64, (4, 6))
    module = b.module(b.function("f", [x], [b.matmul(x, b.const(np.ones((6, 3))))]))
    model = compile(module, cache=False)
    assert model.manifest is not None and model.manifest["kernels"] == ["rule"]
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    np.testing.assert_allclose(model(a), a @ np.ones((6, 3)))


def test_avx2_width_kernels():
    """The 8-lane schedule (the AVX2 fallback) on the same cases; it runs on any AVX2 host."""
    from cuvil.codegen.link import host_target

    if "+avx2" not in host_target().features.split(","):
        pytest.skip("the host has no AVX2")
    force_isa("avx2")
    try:
        c = Cases()
        _matmul_case(c, 17, 65, 30, const_b=True)
        _matmul_case(c, 13, 21, 40, const_b=False)
        x = c.input(_f32(1, 5, 9, 9))
        c.add("conv", c.b.relu(c.b.conv(x, c.b.const(_f32(7, 5, 3, 3)), strides=(2, 2))), 45)
        manifest = c.check()
    finally:
        force_isa(None)
    assert all(".avx2." in n for n in manifest["kernels"])


# --------------------------------------------------------------------------------------
# threads


def _big_case() -> tuple[Module, list[np.ndarray]]:
    """Large enough for the pool (a few MFLOP per op), small enough for the rule evaluator."""
    c = Cases()
    _matmul_case(c, 96, 160, 130, const_b=True)
    x = c.input(_f32(2, 16, 20, 20))
    c.add("conv", c.b.relu(c.b.conv(x, c.b.const(_f32(32, 16, 3, 3)), pads=(1, 1, 1, 1))), 144)
    return c.module(), c.inputs


BIG_MODULE, BIG_INPUTS = _big_case()


@pytest.mark.parametrize("two_ended", [True, False])
def test_threaded_runs_match_single_thread_exactly(monkeypatch, two_ended: bool):
    """Every element computed on two threads is the one thread's, whether the caller and the worker claim chunks
    from the two ends of a phase or both from its front (:data:`threads.TWO_ENDED`)."""
    import cuvil.codegen.kernels.threads as threads

    monkeypatch.setattr(threads, "TWO_ENDED", two_ended)
    one = compile(BIG_MODULE, cache=False, threads=1)
    two = compile(BIG_MODULE, cache=False, threads=2)
    assert one.manifest is not None and two.manifest is not None
    assert one.manifest["threads"] == 1 and two.manifest["threads"] == 2
    assert all(n != "rule" for n in two.manifest["kernels"])
    want = rule_reference(BIG_MODULE, BIG_INPUTS)
    a, b = one.run(BIG_INPUTS), two.run(BIG_INPUTS)
    for x, y, w in zip(a, b, want, strict=True):
        np.testing.assert_array_equal(x, y)  # the same code computes every element, whichever thread
        assert_close(y, w, 144, "threaded")


def _small_but_slow_case() -> tuple[Module, list[np.ndarray]]:
    """Kernels the pool takes by their time rather than their flops: a batch-1 product that streams 1.6 MB
    of weights, a depthwise convolution, and layer-norm rows."""
    c = Cases()
    _matmul_case(c, 1, 512, 784, const_b=True)
    x = c.input(_f32(1, 256, 14, 14))
    c.add("depthwise", c.b.conv(x, c.b.const(_f32(256, 1, 3, 3)), pads=(1, 1, 1, 1), groups=256), 9)
    rows, gamma, beta = c.input(_f32(128, 256)), c.b.const(_f32(256)), c.b.const(_f32(256))
    c.add("layer norm", c.b.layer_norm(rows, gamma, beta, axis=-1), 256)
    return c.module(), c.inputs


def test_kernels_pooled_for_their_time_match_single_thread_exactly(monkeypatch):
    module, inputs = _small_but_slow_case()
    pooled: list[str] = []
    phase = gemm.KernelFunction.phase

    def spy(self: Any, nchunks: Any, flops: Any, emit_chunk: Any) -> None:
        if isinstance(nchunks, int) and nchunks > 1 and flops >= gemm.PARALLEL_MIN_FLOPS:
            pooled.append(self.name)
        phase(self, nchunks, flops, emit_chunk)

    monkeypatch.setattr(gemm.KernelFunction, "phase", spy)
    two = compile(module, cache=False, threads=2)
    assert len(set(pooled)) == 3, pooled  # each of the three went to the pool (under 2 MFLOP each)
    monkeypatch.setattr(gemm.KernelFunction, "phase", phase)
    one = compile(module, cache=False, threads=1)
    want = rule_reference(module, inputs)
    for x, y, w, k in zip(one.run(inputs), two.run(inputs), want, (784, 9, 256), strict=True):
        np.testing.assert_array_equal(x, y)
        assert_close(y, w, k, "pooled for its time")


@pytest.mark.parametrize("threads_count", [2, 3])
def test_many_small_chunks_are_claimed_in_groups_and_every_one_runs(monkeypatch, threads_count: int):
    """A depthwise convolution of 509 channels at 7x7 and a convolution's padded copy of 300 channels:
    the pool claims a group of channels at a time (the last group shorter), the caller from the front and the
    workers (one, or two racing for the back) from the back, and every channel is computed: the bits of one
    thread."""
    c = Cases()
    x = c.input(_f32(1, 509, 7, 7))
    c.add("depthwise", c.b.conv(x, c.b.const(_f32(509, 1, 3, 3)), pads=(1, 1, 1, 1), groups=509), 9)
    y = c.input(_f32(1, 300, 6, 6))
    c.add("conv", c.b.conv(y, c.b.const(_f32(40, 300, 3, 3)), pads=(1, 1, 1, 1)), 2700)
    groups: list[tuple[int, int]] = []
    per_claim = gemm.chunks_per_claim

    def spy(nchunks: int, flops: float) -> int:
        group = per_claim(nchunks, flops)
        groups.append((nchunks, group))
        return group

    monkeypatch.setattr(gemm, "chunks_per_claim", spy)
    two = compile(c.module(), cache=False, threads=threads_count)
    assert (509, 31) in groups and any(n == 300 and g > 1 for n, g in groups), groups
    monkeypatch.setattr(gemm, "chunks_per_claim", per_claim)
    one = compile(c.module(), cache=False, threads=1)
    want = rule_reference(c.module(), c.inputs)
    for a, b, w, k in zip(one.run(c.inputs), two.run(c.inputs), want, (9, 2700), strict=True):
        np.testing.assert_array_equal(a, b)
        assert_close(b, w, k, "grouped claims")


def test_chunks_per_claim_bounds() -> None:
    assert gemm.chunks_per_claim(16, 1e9) == 1  # few chunks: one each
    assert gemm.chunks_per_claim(512, 1e12) == 1  # large chunks: one each
    group = gemm.chunks_per_claim(512, 14.4e6)  # 512 channels of 28k each
    assert group > 1 and -(-512 // group) >= gemm.MIN_CLAIMS and group * 28_125 >= gemm.CLAIM_FLOPS


def test_pool_resizes_and_serves_concurrent_contexts():
    model = compile(BIG_MODULE, cache=False)
    want = model.run(BIG_INPUTS)
    lib = ctypes.CDLL(str(model.library_path))
    assert model.manifest is not None
    set_threads = getattr(lib, f"{model.manifest['symbol_prefix']}_set_num_threads")
    set_threads.argtypes = [ctypes.c_int32]
    set_threads.restype = ctypes.c_int32
    for n in (3, 1, 0, 2):
        assert set_threads(n) == 0
        for got, w in zip(model.run(BIG_INPUTS), want, strict=True):
            np.testing.assert_array_equal(got, w)
    # two contexts of one library at once: one of them gets the pool, the other runs serially
    other = compile(BIG_MODULE, cache=False)
    failures: list[str] = []

    def worker(m: Any) -> None:
        for _ in range(5):
            for got, w in zip(m.run(BIG_INPUTS), want, strict=True):
                if not np.array_equal(got, w):
                    failures.append("mismatch")

    threads = [threading.Thread(target=worker, args=(m,)) for m in (model, other, model)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _thread_cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) of each thread of this process, from /proc."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (a thread that just left)
        out[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread CPU times from Linux's /proc")
def test_idle_workers_sleep_once_the_runs_are_over():
    """Workers spin longer while a run is in progress (to catch its next kernel), so a run must end its
    spell: a few runs later, and after a short pause, the library's workers use no CPU."""
    model = compile(BIG_MODULE, cache=False, threads=2)
    before = set(_thread_cpu_seconds())
    want = model.run(BIG_INPUTS)
    workers = set(_thread_cpu_seconds()) - before
    assert workers, "the pooled run started no worker thread"
    for _ in range(5):
        for got, w in zip(model.run(BIG_INPUTS), want, strict=True):
            np.testing.assert_array_equal(got, w)
    time.sleep(0.2)  # far beyond any spin
    start = _thread_cpu_seconds()
    time.sleep(0.5)
    end = _thread_cpu_seconds()
    spent = sum(end.get(t, 0.0) - start.get(t, 0.0) for t in workers)
    assert spent < 0.05, f"idle workers used {spent:.3f} s of CPU in 0.5 s"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_survives_fork():
    model = compile(BIG_MODULE, cache=False, threads=2)
    want = model.run(BIG_INPUTS)
    pid = os.fork()
    if pid == 0:  # the child has no worker threads: the library must start its own
        ok = all(np.array_equal(g, w) for g, w in zip(model.run(BIG_INPUTS), want, strict=True))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# --------------------------------------------------------------------------------------
# the benchmark harness


def test_bench_harness_smoke(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from rich.console import Console

    from bench.harness import parse_args, run

    out = tmp_path / "bench.json"
    args = parse_args(["--models", "mlp", "--small", "--repeat", "2", "--warmup", "1", "--gemm-size", "48",
                       "--json", str(out)])
    with open(os.devnull, "w") as sink:
        report = run(args, Console(file=sink, width=160))
    (model,) = report["models"]
    assert model["model"] == "mlp"
    for engine in ("cuvil", "ort", "torch"):
        result = model["engines"][engine]
        assert result["error"] is None and len(result["times_ms"]) == 2 and result["median_ms"] > 0
    assert model["engines"]["cuvil"]["agreement"] < 1e-4
    assert model["ratio_vs_ort"] > 0 and model["ratio_vs_torch"] > 0
    assert report["gemm"]["n"] == 48 and report["gemm"]["max_rel_error"] < 1e-5
    assert out.exists()


def _bench_small_mlp(precision: str) -> tuple[dict, dict]:
    """The harness on the reduced MLP, Cuvil against ONNX Runtime, Cuvil's library in ``precision``: the report
    and its one model."""
    pytest.importorskip("onnxruntime")
    from rich.console import Console

    from bench.harness import parse_args, run

    args = parse_args(["--models", "mlp", "--small", "--engines", "cuvil,ort", "--repeat", "2", "--warmup", "0",
                       "--gemm-size", "0", "--precision", precision])
    with open(os.devnull, "w") as sink:
        report = run(args, Console(file=sink, width=160))
    (model,) = report["models"]
    return report, model


def test_bench_harness_runs_cuvil_in_float16_where_proved():
    """``--precision fp16``: Cuvil's library is compiled with float16 over the inputs' own ranges (its
    products on float16 panels), ONNX Runtime stays float32, and the agreement column is float16's error."""
    report, model = _bench_small_mlp("fp16")
    assert report["precision"] == "fp16"
    assert any("packed16_b" in k for k in model["kernels"]), model["kernels"]
    assert 1e-6 < model["engines"]["cuvil"]["agreement"] < 1e-2  # float16's rounding, not float32's


def test_bench_harness_runs_cuvil_with_bfloat16_products():
    """``--precision bf16``: the products by constant weights in bfloat16 (paired kernels where the CPU has
    AVX512-BF16), ONNX Runtime in float32, and the agreement column is bfloat16's error."""
    from llvmlite import binding

    report, model = _bench_small_mlp("bf16")
    assert report["precision"] == "bf16"
    if binding.get_host_cpu_features().get("avx512bf16", False):
        assert any(k.endswith(".bf16x2") for k in model["kernels"]), model["kernels"]
    assert 1e-5 < model["engines"]["cuvil"]["agreement"] < 2e-2  # bfloat16's rounding, not float32's


def test_steal_share_is_the_hosts_part_of_the_cpu_time():
    from bench.harness import steal_share

    before = [100, 0, 50, 800, 0, 0, 0, 50]
    after = [200, 0, 60, 880, 0, 0, 0, 60]  # 200 jiffies passed, 10 of them stolen
    assert steal_share(before, after) == pytest.approx(0.05)
    assert steal_share(None, after) is None and steal_share(before, before) is None


@pytest.mark.parametrize("m,n,k", [(49, 512, 4608), (196, 256, 2304), (128, 1024, 256), (128, 256, 256),
                                   (9, 4096, 1024), (3136, 64, 576), (1000, 1000, 1000), (1, 1000, 1024)])
def test_streamed_b_is_read_by_as_few_m_blocks_as_the_caches_allow(m: int, n: int, k: int):
    """Where B streams from memory, every M block reads all of it: M is cut no finer than the A block
    bound needs, and the blocks the pool wants come from N first."""
    from cuvil.codegen.kernels import gemm

    isa = gemm.ISAS["avx512"]
    t = gemm.choose_tiling(isa, m, n, k, b_streams=True)
    mt, nt = -(-m // t.mr), -(-n // t.nr)
    fewest = -(-mt // max(1, gemm.A_BLOCK_STREAMING_B // (t.kc * t.mr * 4)))
    mblocks, nblocks = -(-mt // t.mb_tiles), -(-nt // t.nb_tiles)
    assert t.mb_tiles * t.mr * t.kc * 4 <= gemm.A_BLOCK_STREAMING_B or t.mb_tiles == 1
    if mblocks > fewest:  # M was cut for the pool only once N had nothing left to cut
        assert t.nb_tiles == 1 and 2.0 * m * n * k >= gemm.PARALLEL_MIN_FLOPS
    if 2.0 * m * n * k >= gemm.PARALLEL_MIN_FLOPS:
        assert mblocks * nblocks >= min(gemm.MIN_PARALLEL_BLOCKS, mt * nt)
    resident = gemm.choose_tiling(isa, m, n, k, b_streams=False)
    assert -(-mt // resident.mb_tiles) >= mblocks


def test_blocks_are_cut_so_two_threads_finish_together():
    """Column blocks are made up to a quarter smaller or up to twice as wide where the last of two threads (taking
    blocks as they become free) would finish more than 3 % past its even share, and that lets it finish sooner:
    ResNet-18's stem, 269 column tiles of one row block, went in 15 blocks of 18 (one thread 143 tiles, the other
    126), its 56x56 layers' 68 tiles in 9 blocks of 8 (36 against 32), and 67 tiles in 9 blocks (35 against 32,
    where four blocks of 17 and 16 give 34: only 2.9 % sooner, but 35 is 4.5 % past the share of 33.5); a count
    that already shares out evenly stays."""
    assert gemm._span([1], [18] * 14 + [17]) == 143
    cols = gemm._even_split(269, 18, [1])
    span = gemm._span([1], gemm._sizes(269, cols))
    assert 13 <= cols <= 2 * 18 + 1 and cols != 18 and span * 1.03 <= 143 and span <= 269 / 2 + cols
    assert gemm._even_split(64, 8, [1]) == 8  # eight blocks of eight: already even
    assert gemm._even_split(68, 8, [1]) == 17  # 9 blocks (the last half): 36 against 34 in four blocks of 17
    assert gemm._even_split(65, 8, [1]) == 8  # 9 blocks (the last of one tile): 33, as even as 65 tiles go
    assert gemm._even_split(67, 8, [1]) == 17
    assert gemm._span([1], gemm._sizes(67, 17)) == 34 < gemm._span([1], gemm._sizes(67, 8)) == 35
    # with one column block only the rows share out: 532 row tiles in blocks of 47 (11 and a short one) -> 38
    assert gemm._span(gemm._sizes(532, 47), [1]) == 282
    assert gemm._even_split(532, 47, [1], rows=True) == 38 and gemm._span(gemm._sizes(532, 38), [1]) == 266
    assert gemm._even_split(131, 16, [2], rows=True) == 16  # 134 against a share of 131: within 3 %
    assert gemm._even_split(532, 47, [1], 1, rows=True) == 47  # one thread: nothing to share
    assert gemm.choose_tiling(gemm.ISAS["avx512"], 3192, 64, 576, b_streams=False).mb_tiles <= 47
    # row blocks of unequal sizes count: two row blocks of 16 tiles and one of 3, 10 column tiles of one block
    assert gemm._span([16, 16, 3], [10]) == 190
    isa = gemm.ISAS["avx512"]
    for m, n, k in [(64, 12900, 147), (64, 3248, 576), (128, 3136, 128)]:
        t = gemm.choose_tiling(isa, m, n, k, b_streams=True)
        even = gemm._span(gemm._sizes(-(-m // t.mr), t.mb_tiles), gemm._sizes(-(-n // t.nr), t.nb_tiles))
        total = -(-m // t.mr) * -(-n // t.nr)
        assert even <= total / 2 + t.mb_tiles * t.nb_tiles  # at most one block over the even share


def test_blocks_are_cut_for_the_pool_the_library_is_built_for(monkeypatch):
    """The blocks are shared out among the threads a library is compiled for (``threads``, else the CPUs the
    compiling process may use), not always two: on eight threads the 56x56 layers' 68 column tiles go in eight
    blocks of 9 (four of 17 would leave four threads idle), on one thread the cache-sized blocks stay."""
    assert gemm._span([1], [17] * 4, 8) == 17 and gemm._span([1], [9] * 7 + [5], 8) == 9
    assert gemm._even_split(68, 8, [1], 8) == 9
    assert gemm._even_split(68, 8, [1], 1) == 8
    isa = gemm.ISAS["avx512"]
    for threads in (2, 3, 8, 16):
        with gemm.pool_threads(threads):
            t = gemm.choose_tiling(isa, 64, 3248, 576, b_streams=True)
        blocks = gemm._sizes(-(-3248 // t.nr), t.nb_tiles)
        assert len(blocks) >= min(threads, 8), (threads, blocks)  # every thread has a block where there are tiles
        assert gemm._span([1], blocks, threads) <= sum(blocks) / threads + max(blocks)  # one block over the share
    seen: list[int] = []
    even = gemm._even_split
    monkeypatch.setattr(gemm, "_even_split", lambda *a, **k: seen.append(a[3]) or even(*a, **k))
    c = Cases()
    x = c.input(_f32(1, 16, 40, 40))
    c.add("conv", c.b.conv(x, c.b.const(_f32(64, 16, 3, 3)), pads=(1, 1, 1, 1)), 16 * 9)
    for threads in (3, 1):
        seen.clear()
        compile(c.module(), cache=False, threads=threads)
        assert seen and set(seen) == {threads}, (threads, seen)
    from cuvil.codegen.kernels.threads import MAX_THREADS, default_pool_size
    for env, want in (("5", 5), ("0", None), ("many", None)):  # as the pool resolves its size at run time
        monkeypatch.setenv("CUVIL_NUM_THREADS", env)
        assert default_pool_size() == (want or min(len(os.sched_getaffinity(0)), MAX_THREADS))
        seen.clear()
        compile(c.module(), cache=False)
        assert seen and set(seen) == {default_pool_size()}


def test_a_reduction_just_past_a_k_block_runs_as_one_and_keeps_every_bit(monkeypatch):
    """A convolution whose reduction is at most a quarter longer than a K block (a 7x7 stem over three channels:
    147 steps) runs as one block, not as two short ones whose partial sums wait in between; longer ones keep
    the blocks. The partial sums continue in the same order, so both schedules give identical bits."""
    from cuvil.codegen.kernels import conv

    assert conv.conv_kc_max(147) == 147 and conv.conv_kc_max(3 * 3 * 64) == conv.CONV_KC_MAX
    assert conv.conv_kc_max(int(conv.CONV_KC_MAX * conv.ONE_BLOCK_SLACK) + 1) == conv.CONV_KC_MAX
    c = Cases()
    for xs, ws, attrs in [((1, 3, 30, 30), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
                          ((1, 17, 9, 9), (20, 17, 3, 3), {"pads": [1, 1, 1, 1]})]:  # 153 steps
        x = c.input(_f32(*xs))
        c.add(f"conv {xs} {ws}", c.b.conv(x, c.b.const(_f32(*ws)), **attrs), ws[1] * ws[2] * ws[3])
    module = c.module()
    one = compile(module, cache=False)
    monkeypatch.setattr(conv, "ONE_BLOCK_SLACK", 1.0)
    split = compile(module, cache=False)
    assert "rule" not in one.manifest["kernels"]
    for got, want in zip(one.run(c.inputs), split.run(c.inputs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_reduction_runs_as_one_block_where_l1_cannot_hold_a_block_and_keeps_every_bit(monkeypatch):
    """Where a 128-step block's panel fills most of L1 (AVX-512's tiles on a 32 KB L1), a reduction whose whole
    B panel is small, or mid-sized and read by many row tiles, runs as one block; a large panel read by few
    tiles, narrow tiles, and every reduction on a core with a 48 KB L1, keep the blocks. The L1 comes from
    the CPU's name (the build key holds it). The sums continue in the same order: identical bits."""
    from cuvil.codegen import target as target_mod
    from cuvil.codegen.kernels import conv
    from cuvil.codegen.target import Target

    assert Target("x86_64-unknown-linux-gnu", "znver4", "").l1_data_bytes == 32 * 1024
    assert Target("x86_64-unknown-linux-gnu", "sapphirerapids", "").l1_data_bytes == 48 * 1024
    assert Target("aarch64-unknown-linux-gnu", "generic", "").l1_data_bytes == 48 * 1024  # unlisted: as measured first
    cpu = target_mod.host_target().cpu
    monkeypatch.setattr(target_mod, "L1_DATA_32K", frozenset())
    assert conv.conv_kc_max(576, 48, 8) == conv.CONV_KC_MAX
    isa = gemm.ISAS["avx512"]  # its 48-wide tile: the decisions, whatever the host (the builds below are the host's)
    blocked = gemm.choose_tiling(isa, 32, 440, 576, kc_max=conv.CONV_KC_MAX, b_streams=False)
    assert blocked.kc < conv.CONV_KC_MAX  # 576 steps as five even blocks of 116
    assert conv.conv_tiling(isa, 32, 440, 576, b_streams=False) == blocked  # where one block does not apply
    monkeypatch.setattr(target_mod, "L1_DATA_32K", frozenset({cpu}))
    assert conv.conv_kc_max(576, 48, 8) == 576  # a 110 KB panel
    assert conv.conv_kc_max(2304, 64, 33) == 2304  # 590 KB read by 33 row tiles
    assert conv.conv_kc_max(2304, 64, 9) == conv.CONV_KC_MAX  # ... by 9
    assert conv.conv_kc_max(4608, 64, 99) == conv.CONV_KC_MAX  # 1.2 MB
    assert conv.conv_kc_max(576) == conv.CONV_KC_MAX  # the tile not known yet
    assert conv.conv_kc_max(576, 16, 99) == conv.CONV_KC_MAX  # AVX2's 16-wide panel: its block fits beside
    one = conv.conv_tiling(isa, 32, 440, 576, b_streams=False)
    assert one.kc == 576 and (one.mr, one.nv, one.mb_tiles, one.nb_tiles) == \
        (blocked.mr, blocked.nv, blocked.mb_tiles, blocked.nb_tiles)  # the pool's blocks as the split one's
    c = Cases()
    for xs, ws in [((1, 64, 20, 20), (32, 64, 3, 3)), ((2, 128, 7, 7), (40, 128, 3, 3))]:  # 576 and 1152 steps
        x = c.input(_f32(*xs))
        c.add(f"conv {xs} {ws}", c.b.conv(x, c.b.const(_f32(*ws)), pads=[1, 1, 1, 1]), ws[1] * 9)
    module = c.module()
    whole = compile(module, cache=False)
    monkeypatch.setattr(target_mod, "L1_DATA_32K", frozenset())
    split = compile(module, cache=False)
    assert all(k.startswith("conv.direct") for k in whole.manifest["kernels"])
    for got, want in zip(whole.run(c.inputs), split.run(c.inputs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_blocking_for_streamed_weights_keeps_every_bit(monkeypatch):
    """How M and N are cut into blocks never changes a sum (each output's K steps run in the same order):
    convolutions and GEMMs blocked for streamed weights and for resident ones give identical bits."""
    from cuvil.codegen.kernels import gemm

    c = Cases()
    for xs, ws, attrs in [((1, 64, 7, 7), (128, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
                          ((1, 32, 30, 30), (48, 32, 3, 3), {"strides": [2, 2]}),
                          ((1, 128, 14, 14), (256, 128, 1, 1), {})]:
        x = c.input(_f32(*xs))
        c.add(f"conv {xs} {ws}", c.b.conv(x, c.b.const(_f32(*ws)), **attrs), ws[1] * ws[2] * ws[3])
    a = c.input(_f32(100, 300))
    c.add("gemm", c.b.matmul(a, c.b.const(_f32(300, 700))), 300)
    module = c.module()
    monkeypatch.setattr(gemm, "B_STREAMS_BYTES", 0)
    streamed = compile(module, cache=False, threads=2)
    monkeypatch.setattr(gemm, "B_STREAMS_BYTES", 1 << 40)
    monkeypatch.setattr(gemm, "A_BLOCK_STREAMING_B", gemm.A_BLOCK_BYTES)
    resident = compile(module, cache=False, threads=2)
    assert "rule" not in streamed.manifest["kernels"]
    for got, want in zip(streamed.run(c.inputs), resident.run(c.inputs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_conv_large_output_schedule_changes_no_bit(monkeypatch):
    """A large output's schedule (tile rows outside the column tiles, output lines fetched for writing ahead of
    the stores; forced on here, down to one-tile planes) reorders the tiles and adds hints only: the results
    are those of the build without either, bit for bit, at tile and plane edges, padded and strided planes,
    several K blocks (partial sums kept per tile across the reordered sweep), groups and two images, on two
    threads, and they match the rule."""
    import cuvil.codegen.kernels.conv as conv

    c = Cases()
    for xs, ws, attrs in [((2, 5, 13, 11), (12, 5, 3, 3), {"pads": (1, 1, 1, 1)}),
                          ((1, 3, 23, 21), (9, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
                          ((1, 40, 17, 9), (13, 40, 3, 3), {"pads": (0, 1, 2, 1)}),  # K = 360: K blocks
                          ((2, 8, 19, 19), (17, 8, 1, 1), {}),
                          ((1, 6, 15, 14), (10, 3, 3, 3), {"groups": 2, "pads": (1, 1, 1, 1)})]:
        x = c.input(_f32(*xs))
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.relu(c.b.conv(x, c.b.const(_f32(*ws)), **attrs)),
              ws[1] * math.prod(ws[2:]))
    module = c.module()
    monkeypatch.setattr(conv, "TRANSPOSE_PLANE", 0)
    monkeypatch.setattr(conv, "TRANSPOSE_PLANE_1X1", 0)
    monkeypatch.setattr(conv, "TRANSPOSE_GAIN", 1e9)
    monkeypatch.setattr(conv, "LARGE_OUTPUT_BYTES", 0)
    monkeypatch.setattr(gemm.GemmCore, "emit_block", _recording(gemm.GemmCore.emit_block, seen := []))
    builds = {}
    for rows_outer, ahead in ((True, 2), (False, 2), (True, 0), (False, 0)):
        monkeypatch.setattr(conv, "ROWS_OUTER", rows_outer)
        monkeypatch.setattr(conv, "STORE_AHEAD_PANELS", ahead)
        builds[rows_outer, ahead] = compile(module, cache=False, threads=2)
    assert {(r, a is not None) for r, a in seen} == {(True, True), (False, True), (True, False), (False, False)}
    plain = builds[False, 0].run(c.inputs)
    want = rule_reference(module, c.inputs)
    for key, model in builds.items():
        assert model.manifest is not None and all(k.startswith("conv.") and ".t." not in k
                                                  for k in model.manifest["kernels"] if k != "view")
        for g, p, w, label, k in zip(model.run(c.inputs), plain, want, c.labels, c.reductions, strict=True):
            assert np.array_equal(g.view(np.uint32), p.view(np.uint32)), (key, label)
            assert_close(g, w, k, label)


def test_whole_runs_change_no_bit(monkeypatch):
    """A padded convolution with positions as vectors stores a tile inside one plane row as one run of the tile's
    width, and any other tile as runs of any length: the results are those of the build that stores every run
    at its length, bit for bit, with a residual read along the runs, on planes whose rows hold several tiles
    (whole runs, and tiles across a row's end), rows shorter than a tile (every run partial), strides, two images
    and two threads; and they match the rule. Both kinds of run are stored."""
    import cuvil.codegen.kernels.conv as conv

    c = Cases()
    for xs, ws, attrs in [((2, 5, 9, 131), (12, 5, 3, 3), {"pads": (1, 1, 1, 1)}),
                          ((1, 3, 27, 229), (9, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
                          ((1, 4, 11, 13), (10, 4, 3, 3), {"pads": (0, 2, 1, 0)})]:
        x = c.input(_f32(*xs))
        y = c.b.conv(x, c.b.const(_f32(*ws)), **attrs)
        r = c.input(_f32(*y.type.shape))
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.relu(c.b.add(y, r)), ws[1] * math.prod(ws[2:]))
    module = c.module()
    monkeypatch.setattr(conv, "TRANSPOSE_PLANE", 0)
    monkeypatch.setattr(conv, "TRANSPOSE_PLANE_LOCAL", 0)
    monkeypatch.setattr(conv, "TRANSPOSE_GAIN", 1e9)
    widths: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> None:
        widths.append(args[5])
        conv_store_rows(*args, **kwargs)

    conv_store_rows = conv.store_rows
    monkeypatch.setattr(conv, "store_rows", recording)
    builds = {}
    for whole in (False, True):
        monkeypatch.setattr(conv, "WHOLE_RUNS", whole)
        builds[whole] = compile(module, cache=False, threads=2)
    assert any(isinstance(w, int) for w in widths) and any(not isinstance(w, int) for w in widths)
    want = rule_reference(module, c.inputs)
    runs = builds[False].run(c.inputs)
    for model in builds.values():
        assert model.manifest is not None
        kernels = [k for k in model.manifest["kernels"] if k.startswith("conv.")]
        assert len(kernels) == 3 and all(k.startswith("conv.direct.") and ".t." not in k for k in kernels), kernels
        for g, p, w, label, k in zip(model.run(c.inputs), runs, want, c.labels, c.reductions, strict=True):
            assert np.array_equal(g.view(np.uint32), p.view(np.uint32)), label
            assert_close(g, w, k, label)


def test_rows_read_ahead_changes_no_bit(monkeypatch):
    """Positions as GEMM rows read in place (a 1x1 convolution's input, a padded copy through the offset table)
    may fetch a later tile row's elements at every step: a hint only, so the results are those of the build
    without it, bit for bit, at plane and tile edges (a bottom tile of fewer rows, whose fetches run past the
    plane), strided and grouped convolutions, two images, on two threads, and they match the rule."""
    import cuvil.codegen.kernels.conv as conv

    c = Cases()
    for xs, ws, attrs in [((2, 20, 15, 14), (32, 20, 1, 1), {}),
                          ((1, 24, 16, 16), (17, 24, 3, 3), {"pads": (1, 1, 1, 1)}),
                          ((1, 12, 29, 27), (20, 12, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
                          ((1, 16, 14, 14), (32, 8, 3, 3), {"groups": 2, "pads": (1, 0, 1, 2)})]:
        x = c.input(_f32(*xs))
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.relu(c.b.conv(x, c.b.const(_f32(*ws)), **attrs)),
              ws[1] * math.prod(ws[2:]))
    module = c.module()
    monkeypatch.setattr(conv.ConvKernel, "positions_as_rows", True)
    monkeypatch.setattr(conv, "ROWS_AHEAD_MIN_PLANE", 1)
    flags: list[bool] = []
    monkeypatch.setattr(gemm, "micro_function", _noting(
        gemm.micro_function, lambda *_, **kwargs: flags.append(bool(kwargs.get("read_ahead", False)))))
    builds = {}
    for ahead in (gemm.LINE_FLOATS, 0):
        monkeypatch.setattr(conv, "ROWS_AHEAD_FLOATS", ahead)
        flags.clear()
        builds[ahead] = compile(module, cache=False, threads=2)
        assert flags and all(flags) == bool(ahead) and any(flags) == bool(ahead), (ahead, flags)
    _position_rows_same_bits(builds, builds[0], c, module)


def test_streamed_weights_fetched_once_changes_no_bit(monkeypatch):
    """Where positions are the GEMM rows and the weights stream from memory (1 MB or more), the fetches of the
    weight panels to come are marked as used once; smaller weights keep the fetch into L2. A hint only: the
    results are those of the build without it, bit for bit, and match the rule (a bottom tile of fewer rows,
    two threads)."""
    import cuvil.codegen.kernels.conv as conv

    c = Cases()
    for xs, ws in [((1, 128, 7, 7), (256, 128, 3, 3)), ((1, 64, 9, 9), (64, 64, 3, 3))]:
        x = c.input(_f32(*xs))
        c.add(f"conv x{xs} w{ws}", c.b.relu(c.b.conv(x, c.b.const(_f32(*ws)), pads=(1, 1, 1, 1))),
              ws[1] * math.prod(ws[2:]))
    module = c.module()
    localities: list[int] = []

    def note(*args: Any, **kwargs: Any) -> None:
        if args[8] if len(args) > 8 else kwargs.get("ahead_every", 0):  # it fetches panels ahead
            localities.append(kwargs.get("ahead_locality", gemm.L2_LOCALITY))

    monkeypatch.setattr(gemm, "micro_function", _noting(gemm.micro_function, note))
    builds = {}
    for once in (True, False):
        monkeypatch.setattr(conv, "STREAMED_WEIGHTS_ONCE", once)
        localities.clear()
        builds[once] = compile(module, cache=False, threads=2)
        assert set(localities) == ({gemm.STREAMED_LOCALITY, gemm.L2_LOCALITY} if once else {gemm.L2_LOCALITY})
    _position_rows_same_bits(builds, builds[False], c, module)


def _position_rows_same_bits(builds: dict[Any, Any], plain: Any, c: Cases, module: Any) -> None:
    """Every build runs its convolutions with positions as rows and computes ``plain``'s outputs bit for bit,
    which match the rule."""
    base = plain.run(c.inputs)
    want = rule_reference(module, c.inputs)
    for key, model in builds.items():
        assert model.manifest is not None and all(".t." in k for k in model.manifest["kernels"] if k != "view")
        for g, p, w, label, k in zip(model.run(c.inputs), base, want, c.labels, c.reductions, strict=True):
            assert np.array_equal(g.view(np.uint32), p.view(np.uint32)), (key, label)
            assert_close(g, w, k, label)


def _noting(make: Callable[..., Any], note: Callable[..., None]) -> Callable[..., Any]:
    """``make`` that first hands each call's arguments to ``note`` (what a kernel asked its helpers for)."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        note(*args, **kwargs)
        return make(*args, **kwargs)

    return wrapped


def _recording(emit: Callable[..., Any], seen: list[tuple[bool, Any]]) -> Callable[..., Any]:
    """``GemmCore.emit_block`` that notes each core's loop order and store-ahead hook first."""
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((self.rows_outer, self.store_ahead))
        return emit(self, *args, **kwargs)

    return wrapped


def test_avx2_takes_its_4x3_tile_only_where_it_pads_a_tenth_less():
    """AVX2's tiles are 6x2 first, 4x3 second (:data:`cuvil.codegen.kernels.gemm.ISAS`): 128 output channels over
    3,136 positions (MobileNet-v1's 1x1 layers at 56x56) pad 132 x 3,136 in 6x2 and 128 x 3,144 in 4x3, 3 % more,
    and keep 6x2; 32 channels over 12,544 (its stem) pad 36 rows in 6x2, 12 % more, and take 4x3. AVX-512 takes
    whichever of its tiles pads least."""
    avx2, avx512 = gemm.ISAS["avx2"], gemm.ISAS["avx512"]
    assert (gemm.choose_tiling(avx2, 128, 3136, 128).mr, gemm.choose_tiling(avx2, 128, 3136, 128).nv) == (6, 2)
    assert (gemm.choose_tiling(avx2, 32, 12544, 27).mr, gemm.choose_tiling(avx2, 32, 12544, 27).nv) == (4, 3)
    assert gemm.choose_tiling(dataclasses.replace(avx2, other_tile_gain=1.0), 128, 3136, 128).mr == 4  # least padding
    assert gemm.choose_tiling(avx512, 128, 3136, 128).mr == 8  # 8x3 pads 3136 -> 3168 columns, 6x4 132 rows
