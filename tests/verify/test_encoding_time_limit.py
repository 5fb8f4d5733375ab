"""A proof attempt's time limit covers writing its cone out, not only the solver: a deep cone's reductions
can take minutes to encode (an exported LeViT's layout rewrite, whose outputs could not be cut, went past
thirteen minutes in one attempt). The attempt then ends as unknown and says why."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from verify.cone import LeafTable
from verify.prove import prove

LAYERS = 64


def _deep(first: Callable[[Builder, Value], Value]) -> Module:
    """``first(x)``, then residual softmax layers: every layer's reductions read the whole cone below."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 64])
    h = first(b, x)
    for k in range(LAYERS):
        w = (np.random.default_rng(k).standard_normal((64, 64)) / 8).astype(np.float32)
        h = b.add(b.softmax(b.matmul(h, b.const(w)), axis=1), h)
    return b.module(b.function("main", [x], [h]))


def test_an_encoding_past_the_time_limit_is_unknown_with_its_reason() -> None:
    before = _deep(lambda b, x: b.mul(x, b.const(np.float32(2.0))))
    after = _deep(lambda b, x: b.add(x, x))
    table = LeafTable.build(before.main, after.main, before.constants, after.constants)
    attempt = prove(before.main.results[0], after.main.results[0], table.leaf_of, "abstract-fp", timeout=0.05)
    assert attempt.status == "unknown"
    assert "ran past the attempt's time limit" in attempt.reason
    assert attempt.smt2 == ""
