"""Reference answers that tests in several folders compare with: a module evaluated by its ops'
compute rules alone, the bitwise agreement a kernel must reach with it, and the agreement a frontend's
outputs must reach with PyTorch eager."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.models import agreement
from cuvil.interp import bind_inputs, evaluate_op
from cuvil.ir.module import Module
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


def rule_reference(module: Module, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every result of ``module.main``, each op evaluated from its compute rule (no numpy fast path):
    the literal meaning a compiled library must reproduce."""
    fn = module.main
    arrays, _ = bind_inputs(fn, list(inputs))
    memo: dict[Value, np.ndarray] = dict(zip(fn.params, arrays, strict=True))
    for v in fn.values():
        if v in memo:
            continue
        if v.is_const:
            memo[v] = module.constants[v.const_hash]
            continue
        memo[v] = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], v.attr_dict,
                              TensorType(v.dtype, v.type.shape), use_fast_path=False)
    return [memo[r] for r in fn.results]


def same_float32_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Float32 arrays of one shape, bit for bit, except that any NaN equals any NaN (which operand's payload
    an IEEE operation keeps is not part of the meaning, and LLVM may commute a sum's or product's operands)."""
    nan = np.isnan(want)
    return bool(got.shape == want.shape and np.array_equal(np.isnan(got), nan)
                and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)))


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-45], dtype=np.float32)
"""Values a float32 kernel must carry through as its rule does: NaN, infinities, signed zeros, values near
overflow, the smallest subnormal."""


def float32_with_specials(shape: tuple[int, ...], rng: np.random.Generator, scales: Sequence[float],
                          every: int) -> np.ndarray:
    """Normal values at mixed ``scales``, one element in ``every`` replaced by one of :data:`SPECIALS`."""
    x = (rng.standard_normal(shape) * rng.choice(scales, shape)).astype(np.float32)
    flat = x.reshape(-1)
    pick = rng.choice(flat.size, size=max(1, flat.size // every), replace=False)
    flat[pick] = rng.choice(SPECIALS, pick.size)
    return x


def assert_agrees(outs: list[np.ndarray], refs: list[np.ndarray]) -> None:
    """Same number, shapes and dtypes of outputs, each within 1e-4 of its reference's scale and at a
    cosine of 0.99999 or more."""
    assert len(outs) == len(refs)
    for got, want in zip(outs, refs, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        a = agreement(got, want)
        assert a.within(rtol=1e-4, min_cosine=0.99999), a
