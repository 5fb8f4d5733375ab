"""The block transpose (cuvil.codegen.kernels.transpose) against the rule lowering, bit for bit: every
permutation class that moves the last axis (to the front, to the middle, a plain 2-D turn, with unit and
outer axes around it), NaN payloads and signed zeros moved untouched, and the cases it leaves to the rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cuvil.codegen import kernels
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

CASES = [
    ((32, 48), (1, 0)),
    ((1, 128, 4, 64), (0, 2, 3, 1)),  # BERT's keys turned for Q @ K^T
    ((2, 16, 3, 32), (3, 0, 2, 1)),
    ((16, 5, 32), (2, 1, 0)),
    ((3, 32, 1, 16), (0, 3, 2, 1)),
    ((16, 16, 16), (0, 2, 1)),
    *(((16, 2, 32, 48), p) for p in itertools.permutations(range(4)) if p[-1] != 3 and p[-1] in (0, 2)),
]


def _module(shape: tuple[int, ...], perm: tuple[int, ...]):
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [b.transpose(x, perm=list(perm))]))


def _bits(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Numbers, signed zeros, infinities and NaNs with payloads: a move must keep every bit."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2 ** 32, size=shape, dtype=np.uint64).astype(np.uint32)
    x = rng.standard_normal(shape).astype(np.float32)
    pick = rng.random(shape)
    return np.where(pick < 0.1, raw.view(np.float32), np.where(pick < 0.15, np.float32(-0.0), x)).astype(np.float32)


@pytest.mark.parametrize(("shape", "perm"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_block_transpose_is_the_rule_bit_for_bit(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    module = _module(shape, perm)
    fast = compile(module, cache=False, passes="O0", threads=2)
    assert fast.manifest["kernels"] == ["transpose.blocks"]
    with kernels.generic_only():
        rule = compile(module, cache=False, passes="O0")
    x = _bits(shape, sum(shape) + sum(p * k for k, p in enumerate(perm)))
    got, want = np.asarray(fast(x)), np.asarray(rule(x))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got.view(np.uint32), np.transpose(x, perm).view(np.uint32))


@pytest.mark.parametrize(("shape", "perm"), [((16, 32), (0, 1)), ((2, 16, 32), (1, 0, 2)), ((24, 32), (1, 0)),
                                             ((32, 12), (1, 0)), ((4, 64, 8), (0, 2, 1))])
def test_other_transposes_keep_the_rule(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    """The last axis kept (contiguous runs: the rule copies them), or an exchanged axis not whole blocks."""
    module = _module(shape, perm)
    model = compile(module, cache=False, passes="O0")
    assert "transpose.blocks" not in model.manifest["kernels"]
    x = _bits(shape, 1)
    assert np.array_equal(np.asarray(model(x)).view(np.uint32), np.transpose(x, perm).view(np.uint32))
