"""A pass that removes a chain of layout ops which is the identity on a value both sides read (Swin's
export: reshape into windows, a transpose that moves a unit axis, reshape back): the chain's last value
pairs with no value of the other side, so it is paired with the shared value it equals, proved by index
arithmetic, and cut; the matmul above it then meets the same leaf on both sides. Before, the matmuls'
reductions were compared over different index expressions and the output was left unknown."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import PASS_REGISTRY, Pass
from verify.obligations import check_application

WEIGHTS = [np.random.default_rng(9 + k).standard_normal((32, 32)).astype(np.float32) for k in range(4)]


def _windows(b: Builder, h: Value) -> Value:
    """The identity, written as Swin's export writes it."""
    w = b.reshape(h, shape=(2, 1, 4, 1, 4, 32))
    return b.reshape(b.transpose(w, perm=(0, 1, 3, 2, 4, 5)), shape=(2, 16, 32))


def _network(middle: Callable[[Builder, Value], Value]) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 16, 32])
    h = b.tanh(b.matmul(x, b.const(WEIGHTS[0])))
    h = middle(b, h)
    for w in WEIGHTS[1:]:
        h = b.tanh(b.add(b.matmul(h, b.const(w)), h))
    return b.module(b.function("main", [x], [h]))


def test_an_identity_layout_chain_removed_is_cut_and_proved() -> None:
    before = _network(_windows)
    eliminate = PASS_REGISTRY["eliminate-layout-ops"]()
    after = eliminate.run(before).module
    assert not any(v.op in ("reshape", "transpose") for v in after.main.values()), "the chain was not removed"
    app = check_application(eliminate, before, after)
    assert [(o.status, o.encoder) for o in app.obligations] == [("proved", "abstract-fp")]
    assert app.lemmas


def test_a_chain_that_is_not_the_identity_removed_is_refuted() -> None:
    """Windows whose transpose moves two axes of four: dropping them changes the matmul's rows."""
    def swapped(b: Builder, h: Value) -> Value:
        w = b.reshape(h, shape=(2, 4, 4, 32))
        return b.reshape(b.transpose(w, perm=(0, 2, 1, 3)), shape=(2, 16, 32))

    before = _network(swapped)
    after = _network(lambda b, h: h)
    wrong = type("DropWindows", (Pass,), {"name": "drop-windows", "contract": Contract.EXACT})()
    app = check_application(wrong, before, after)
    assert [o.status for o in app.obligations] == ["refuted"]
