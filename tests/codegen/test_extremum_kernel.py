"""A whole tensor's float32 ``reduce_min`` / ``reduce_max`` (cuvil.codegen.kernels.extremum) is a schedule of
the rule's left fold: bit for bit the interpreter's result, whatever the tensor holds (NaNs, infinities, zeros of
both signs in every arrangement, a zero result whose sign the last zero decides) and whatever its length (whole
blocks of vectors, tails, one element)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference

SIZES = (1, 2, 15, 16, 63, 64, 65, 200, 4097)


def _arrangements(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Tensors of ``n`` elements whose fold's bits depend on what they hold and where."""
    normal = rng.standard_normal(n).astype(np.float32)
    relu = np.maximum(normal, np.float32(0.0))  # zeros everywhere: a min of zero
    out = [normal, relu, -relu]
    for sign in (0.0, -0.0):
        for at in {0, n // 2, n - 1}:  # one zero of each sign among positives, the other sign everywhere else
            a = np.abs(normal) + np.float32(1.0)
            a[:] = -0.0 if sign == 0.0 else 0.0
            a[at] = sign
            out.append(a)
            b = np.abs(normal) + np.float32(1.0)
            b[at] = sign
            out.append(b)
    for _ in range(6):  # a few zeros of random signs among positives (negatives), anywhere
        for flip in (1.0, -1.0):
            a = (np.abs(normal) + np.float32(1.0)) * np.float32(flip)
            at = rng.integers(0, n, min(n, 3))
            a[at] = np.where(rng.integers(0, 2, at.size) == 1, np.float32(0.0), np.float32(-0.0))
            out.append(a)
    for special in (np.nan, np.inf, -np.inf):
        a = normal.copy()
        a[rng.integers(0, n)] = special
        out.append(a)
    return out


@pytest.mark.parametrize("op", ["reduce_min", "reduce_max"])
def test_a_whole_tensor_fold_matches_the_rule_bit_for_bit(op: str) -> None:
    rng = np.random.default_rng(17)
    b = Builder()
    params, outs = [], []
    for n in SIZES:
        x = b.param(f"x{n}", DType.f32, [n] if n % 2 else [n // 2, 1, 2])
        params.append(x)
        outs.append(getattr(b, op)(x, axes=(), keepdims=bool(n % 3)))
    module = b.module(b.function("main", params, outs, [f"y{n}" for n in SIZES]))
    lib = compile(module, cache=False)
    assert lib.manifest["kernels"].count("extremum.vectors") == len(SIZES), lib.manifest["kernels"]
    cases = [_arrangements(rng, n) for n in SIZES]
    for k in range(max(len(c) for c in cases)):
        args = [c[k % len(c)].reshape(tuple(int(d) for d in p.shape)) for c, p in zip(cases, params, strict=True)]
        got, want = lib(*args), rule_reference(module, args)
        for n, g, w in zip(SIZES, got, want, strict=True):
            g, w = np.asarray(g), np.asarray(w)
            assert g.shape == w.shape
            assert (np.isnan(g) and np.isnan(w)) or g.view(np.uint32) == w.view(np.uint32), (op, n, k, g, w)


def test_a_partial_or_integer_reduction_keeps_its_lowering() -> None:
    b = Builder()
    x, i = b.param("x", DType.f32, [3, 4]), b.param("i", DType.i32, [5])
    module = b.module(b.function("main", [x, i], [b.reduce_min(x, axes=(1,)), b.reduce_max(i, axes=())],
                                 ["rows", "ints"]))
    lib = compile(module, cache=False)
    assert "extremum.vectors" not in lib.manifest["kernels"]
    args = [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=np.int32)]
    for got, want in zip(lib(*args), rule_reference(module, args), strict=True):
        assert np.array_equal(np.asarray(got), want)
