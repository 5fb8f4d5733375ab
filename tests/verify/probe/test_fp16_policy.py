"""fp16_safe_ops: the FP16 build keeps exactly the unproved ops in float32 and never produces
inf/NaN on inputs in the declared box."""

from __future__ import annotations

import incidents
import numpy as np
import pytest

from cuvil.interp import evaluate_values
from cuvil.ir.dtypes import DType
from verify.probe.fp16_policy import fp16_module, fp16_safe_ops

FP16_CASES = [i for i in incidents.INCIDENTS + incidents.TWINS if i.precision == "fp16"]


def _samples(shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    half = n // 2
    return np.concatenate([rng.uniform(-1, 1, (half, *shape[1:])),
                           np.where(rng.random((n - half, *shape[1:])) < 0.5, -1.0, 1.0)]).astype(np.float32)


def _all_finite(module, x: np.ndarray) -> bool:  # type: ignore[no-untyped-def]
    values = evaluate_values(module.main, module.constants, {"x": x})
    return all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for v, a in values.items()
               if v.dtype.is_float)


@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: c.name)
def test_fp16_build_never_overflows_in_the_box(case) -> None:  # type: ignore[no-untyped-def]
    module = case.build(1)
    kept, decisions = fp16_safe_ops(module, case.ranges)
    assert {d.value for d in decisions} == {v for v in module.main.ops() if v.dtype is DType.f32}
    assert all(d.reason for d in decisions)
    # the same decisions on a batch of 1000 inputs (same weights, values matched by position)
    big = case.build(1000)
    position = {v: k for k, v in enumerate(module.main.values())}
    big_values = big.main.values()
    built = fp16_module(big, {big_values[position[v]] for v in kept})
    rng = np.random.default_rng(0)
    x = _samples(tuple(int(d) for d in big.main.params[0].shape), 1000, rng)
    assert _all_finite(built, x)
    if case in incidents.TWINS:
        assert not kept  # everything proved: the whole model runs in float16
        assert any(v.dtype is DType.f16 for v in built.main.ops())
    else:
        assert kept


def test_unsafe_ops_are_the_ones_kept() -> None:
    module = incidents.t5_ffn(1)
    kept, decisions = fp16_safe_ops(module, incidents.UNIT)
    by_op = {d.op: d for d in decisions}
    assert by_op["matmul"].precision == "fp32" or any(d.op == "matmul" and d.precision == "fp32" for d in decisions)
    assert by_op["relu"].precision == "fp16"
    assert {v.op for v in kept} >= {"matmul"}
    # keeping everything would be safe too, but the policy keeps only what it cannot prove
    assert len(kept) < len([v for v in module.main.ops() if v.dtype is DType.f32])


def test_everything_in_fp16_overflows_where_the_policy_keeps_fp32() -> None:
    """The kept ops are needed: with nothing kept, the incident's witness overflows."""
    module = incidents.t5_ffn(1)
    x = np.ones((1, 10), np.float32)
    rng = np.random.default_rng(1)
    xs = np.where(rng.random((400, 1, 10)) < 0.5, -1.0, 1.0).astype(np.float32)
    everything = fp16_module(module, set())
    assert not all(_all_finite(everything, xi) for xi in [x, *xs])
    kept, _ = fp16_safe_ops(module, incidents.UNIT)
    safe = fp16_module(module, kept)
    assert all(_all_finite(safe, xi) for xi in [x, *xs])
