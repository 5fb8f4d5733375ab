"""Index arithmetic over symbolic dims: an index variable ranging over ``[0, T)`` satisfies
``i % T == i`` and ``i // T == 0`` by construction, which the encoder uses, so a reshape chain over a
symbolic sequence length folded away before a matrix product (a recurrent model's projection) is
proved exactly; an index that can reach ``T`` (a roll along the axis) is not simplified and the
rewrite is refuted."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.types import DimConstraint
from cuvil.ir.values import Value
from cuvil.passes.manager import PassManager, parse_pipeline
from verify import check_rewrite

W = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


def _projection(through_reshapes: bool, roll: bool = False, lo: int = 1) -> Module:
    """x: f32[T, 1, 16] -> x (or x reshaped to [T, 1, 1, 16] and back, or rolled by one step) @ W^T."""
    b = Builder()
    x = b.param("x", DType.f32, ["T", 1, 16])
    t = x.type.shape[0]
    src: Value = x
    if through_reshapes:
        src = b.reshape(b.reshape(x, shape=[t, 1, 1, 16]), shape=[t, 1, 16])
    if roll:
        ones = [1, 1, 1]
        src = b.concat(b.slice(x, starts=[1, 0, 0], ends=[t, 1, 16], steps=ones),
                       b.slice(x, starts=[0, 0, 0], ends=[1, 1, 16], steps=ones), axis=0)
    y = b.matmul(src, b.const(W), transpose_b=True)
    return b.module(b.function("main", [x], [y], ["y"], [DimConstraint("T", lo=lo)]))


def test_a_folded_reshape_chain_over_a_symbolic_length_is_proved() -> None:
    before = _projection(through_reshapes=True)
    after = PassManager(parse_pipeline("canonicalize")).run(before).module
    assert not any(v.op == "reshape" for v in after.main.values())
    report = check_rewrite(before, after, "exact", name="canonicalize")
    assert [o.status for o in report.obligations] == ["proved"]


def test_an_index_that_can_reach_the_extent_is_not_simplified() -> None:
    report = check_rewrite(_projection(through_reshapes=False), _projection(through_reshapes=False, roll=True),
                           "exact", name="roll-by-one")
    assert report.obligations and all(o.status != "proved" for o in report.obligations)


@pytest.mark.parametrize("lo", [1, 3])
def test_the_same_chain_is_proved_under_any_lower_bound(lo: int) -> None:
    before = _projection(through_reshapes=True, lo=lo)
    after = PassManager(parse_pipeline("canonicalize")).run(before).module
    assert [o.status for o in check_rewrite(before, after, "exact").obligations] == ["proved"]
