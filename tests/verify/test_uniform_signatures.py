"""Cut points whose random signature is one value repeated (all zeros where a network's activations vanish on
the random inputs; one constant where a dead path or a normalization makes a value independent of them): such a
signature matches every other value's that holds the same constant, so a pair found by it is a guess. Each guess
gets an eighth of a lemma's time limit, in the sweep as in the identity layout chains (library-initialized
MobileViTV2 at O3: two such chain pairs spent the whole limit each, 50 s -> 14 s, 14 of 14 proved both ways)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes.base import PASS_REGISTRY
from verify import obligations
from verify.obligations import GUESS_SHARE, check_application

WEIGHTS = [np.random.default_rng(70 + k).standard_normal((32, 32)).astype(np.float32) / 8 for k in range(3)]
DEAD = -1000.0  # no random input reaches the ReLU's positive side: everything after it is 0 on them
TIMEOUT = 8.0


def _network() -> Module:
    """A dead layer, then the identity written as Swin's export writes it, then two residual layers."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 16, 32])
    h = b.relu(b.add(b.matmul(x, b.const(WEIGHTS[0])), b.scalar(DEAD, DType.f32)))
    w = b.reshape(h, shape=(2, 1, 4, 1, 4, 32))
    h = b.reshape(b.transpose(w, perm=(0, 1, 3, 2, 4, 5)), shape=(2, 16, 32))
    for wk in WEIGHTS[1:]:
        h = b.tanh(b.add(b.matmul(h, b.const(wk)), h))
    return b.module(b.function("main", [x], [h]))


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float, bool]]:
    """Every lemma the verifier tries: (before op, after op, its time limit, proved)."""
    found: list[tuple[str, str, float, bool]] = []
    real = obligations._lemma

    def spy(vb: Value, va: Value, *args: Any) -> obligations.Lemma:
        lemma = real(vb, va, *args)
        found.append((vb.op, va.op, args[3], lemma.proved))
        return lemma

    monkeypatch.setattr(obligations, "_lemma", spy)
    return found


def test_a_dead_identity_chain_is_a_guess_and_still_proved(limits: list[tuple[str, str, float, bool]]) -> None:
    """The chain's last value and the shared ReLU are all zeros on the random inputs: their pair is tried with
    an eighth of the limit (it took the whole limit before), and proved within it, as is the obligation."""
    before = _network()
    eliminate = PASS_REGISTRY["eliminate-layout-ops"]()
    after = eliminate.run(before).module
    assert not any(v.op == "transpose" for v in after.main.values()), "the chain was not removed"
    app = check_application(eliminate, before, after, timeout=TIMEOUT)
    assert [o.status for o in app.obligations] == ["proved"]
    chain = [(limit, proved) for vb, va, limit, proved in limits if vb == "reshape" and va == "relu"]
    assert chain == [(TIMEOUT * GUESS_SHARE, True)], limits


@pytest.mark.parametrize(("signature", "uniform"), [
    (np.zeros((3, 4)), True),
    (np.zeros(1), True),
    (np.full((2, 5), 5.0), True),
    (np.full((2, 5), -0.25, dtype=np.float32), True),
    (np.array([1.0, 1.0, 1.0 + 2.0 ** -40]), False),
    (np.array([0.0, 0.0, 1e-30]), False),
    (np.array([3.0]), False),  # one element: a value, not a repetition
    (np.full(4, np.nan), False),
    (np.array([7, 7, 7], dtype=np.int32), True),
])
def test_which_signatures_are_guesses(signature: np.ndarray, uniform: bool) -> None:
    assert obligations._uniform(signature) is uniform
