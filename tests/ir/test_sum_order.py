"""The float64 sums that sound bounds may run in any order (:func:`cuvil.ir.numpy_prims.float64_sums_in_any_order`)
never change what a program computes: outside the block, and for every other type inside it, products sum in
the rule's order; inside it, float64 products are one BLAS call, within ``γ_n`` of the exact sum as the
bounds' error terms assume."""

from __future__ import annotations

import numpy as np

from cuvil.ir.numpy_prims import float64_sums_in_any_order, sequential_matmul


def _in_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = a[:, :1] * b[:1, :]
    for j in range(1, a.shape[1]):
        acc = acc + a[:, j:j + 1] * b[j:j + 1, :]
    return acc


def test_programs_keep_the_rules_order_and_bounds_may_use_any() -> None:
    rng = np.random.default_rng(0)
    a64, b64 = rng.standard_normal((37, 301)) * 1e3, rng.standard_normal((301, 23))
    expected = _in_order(a64, b64)
    assert np.array_equal(sequential_matmul(a64, b64), expected)
    with float64_sums_in_any_order():
        fast = sequential_matmul(a64, b64)
        a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
        assert np.array_equal(sequential_matmul(a32, b32), _in_order(a32, b32))  # other types keep the order
    assert np.array_equal(sequential_matmul(a64, b64), expected)  # the block ends with the with
    exact_abs = np.abs(a64) @ np.abs(b64)
    n = a64.shape[1]
    gamma = n * 2.0 ** -53 / (1 - n * 2.0 ** -53)
    assert np.all(np.abs(fast - expected) <= 2 * gamma * exact_abs)
    assert not np.array_equal(fast, expected)  # (another order: the block is what is under test)
