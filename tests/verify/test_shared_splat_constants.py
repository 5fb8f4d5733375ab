"""A rewrite justified by the value of a splat constant that both sides read elsewhere (``x * 1`` removed
while the same ``1`` feeds a later add, as in an exported BLOOM's alibi term): the splat is encoded as its
value on both sides, so the pair is a cut-point lemma proved by the law it needs, and the randomized
identity test reads it as that value too (a random one would contradict the proof). Before, the shared
constant was opaque: the lemma failed, every later obligation spanned the network down to the inputs, and
a two-layer BLOOM took over ten minutes to leave its outputs unknown."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import PASS_REGISTRY, Pass
from verify.obligations import check_application

WEIGHTS = [np.random.default_rng(5 + k).standard_normal((8, 8)).astype(np.float32) for k in range(6)]


def _network(first: Callable[[Builder, Value, Value], Value], splat: float) -> Module:
    """``first(x, c)``, then six tanh(h @ W + c) layers that read the same splat ``c``."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 8])
    c = b.const(np.full([1], splat, np.float32))
    h = first(b, x, c)
    for w in WEIGHTS:
        h = b.tanh(b.add(b.matmul(h, b.const(w)), c))
    return b.module(b.function("main", [x], [h]))


@pytest.mark.parametrize("op,splat,law", [("mul", 1.0, "mul-one"), ("div", 1.0, "div-one")])
def test_a_rewrite_by_a_shared_splat_is_a_proved_lemma(op: str, splat: float, law: str) -> None:
    before = _network(lambda b, x, c: b.op(op, x, c), splat)
    canonicalize = PASS_REGISTRY["canonicalize"]()
    after = canonicalize.run(before).module
    assert len(after.main.values()) < len(before.main.values()), "canonicalize no longer removes the op"
    app = check_application(canonicalize, before, after)
    assert [(o.status, o.encoder) for o in app.obligations] == [("proved", "abstract-fp")]
    assert app.lemmas and law in app.lemma_axioms


def test_a_wrong_rewrite_by_a_shared_splat_is_refuted() -> None:
    """Dropping ``x * 2`` where the same 2 is read later: the value of the splat refutes it."""
    before = _network(lambda b, x, c: b.mul(x, c), 2.0)
    after = _network(lambda b, x, c: x, 2.0)
    wrong = type("DropScale", (Pass,), {"name": "drop-scale", "contract": Contract.EXACT})()
    app = check_application(wrong, before, after)
    assert [o.status for o in app.obligations] == ["refuted"]


def test_a_splat_read_by_value_proves_no_more_than_its_value() -> None:
    """``x + 0.0 -> x`` is wrong only at ``x = -0.0`` (``-0 + +0 = +0``), which random inputs do not draw:
    with the shared +0.0 now read by its value, the prover must still not prove it (the law it has is for
    -0.0 only)."""
    before = _network(lambda b, x, c: b.add(x, c), 0.0)
    after = _network(lambda b, x, c: x, 0.0)
    wrong = type("DropZero", (Pass,), {"name": "drop-zero", "contract": Contract.EXACT})()
    app = check_application(wrong, before, after)
    assert "proved" not in [o.status for o in app.obligations]
