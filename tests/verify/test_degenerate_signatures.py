"""Cut points where the random inputs leave many values all zeros (a network whose activations vanish on
them, as MobileViT's at its library's initialization): every such value's signature matches every other
one, so the signature cannot say which value of the other side is its partner. The sweep then tries the
partners nearest in program order first, each for a short time, instead of the first ones in the function:
the pairs of a chain of dead layers are all proved, where before only the chain's first layers were."""

from __future__ import annotations

import numpy as np
import pytest
from lemma_spy import record_lemmas

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.passes import Contract
from cuvil.passes.base import Pass
from verify.obligations import Lemma, check_application

LAYERS = 8
WEIGHTS = [np.random.default_rng(40 + k).standard_normal((16, 16)).astype(np.float32) / 4 for k in range(LAYERS)]
DEAD = np.float32(-1000.0)  # no random input reaches it: every layer's output is 0 on them


def _chain(as_max: bool) -> Module:
    """``h -> relu(h W_k + DEAD)`` for eight layers; ``as_max`` writes each ReLU as ``max(z, 0)``."""
    b = Builder()
    h = x = b.param("x", DType.f32, [2, 16])
    for w in WEIGHTS:
        z = b.add(b.matmul(h, b.const(w)), b.scalar(float(DEAD), DType.f32))
        h = b.max(z, b.scalar(0.0, DType.f32)) if as_max else b.relu(z)
    return b.module(b.function("main", [x], [h]))


def _relu_as_max() -> Pass:
    return type("ReluAsMax", (Pass,), {"name": "relu-as-max", "contract": Contract.EXACT})()


@pytest.fixture
def swept(monkeypatch: pytest.MonkeyPatch) -> list[Lemma]:
    """The sweep's lemmas, as it returns them."""
    return record_lemmas(monkeypatch, "_sweep")


def test_every_dead_layer_is_paired_with_its_own(swept: list[Lemma]) -> None:
    """Each ``max`` of the after side is paired with its own layer's ReLU (the same op as nothing of the before
    side, all zeros like every other layer's): eight proved lemmas, one per layer. Trying the before side's
    values in its own order paired only the first two layers (each later ``max`` tried the first two ReLUs and
    gave up)."""
    app = check_application(_relu_as_max(), _chain(False), _chain(True), timeout=10.0)
    assert [o.status for o in app.obligations] == ["proved"]
    paired = [lemma for lemma in swept if lemma.proved and lemma.after.startswith("max")]
    assert len(paired) == LAYERS, [(lemma.before, lemma.after, lemma.proved) for lemma in swept]


def test_a_dead_layer_changed_where_it_is_dead_is_not_proved(swept: list[Lemma]) -> None:
    """Prover-only: the after side's fifth layer adds 1 wherever its input sum is below -2000, which no random
    input reaches (all of them leave it at -1000 and some): the layers below are paired, and the output must not
    be proved."""
    b = Builder()
    h = x = b.param("x", DType.f32, [2, 16])
    for k, w in enumerate(WEIGHTS):
        z = b.add(b.matmul(h, b.const(w)), b.scalar(float(DEAD), DType.f32))
        h = b.max(z, b.scalar(0.0, DType.f32))
        if k == 4:
            h = b.add(h, b.where(b.less(z, b.scalar(-2000.0, DType.f32)), b.scalar(1.0, DType.f32),
                                 b.scalar(0.0, DType.f32)))
    changed = b.module(b.function("main", [x], [h]))
    app = check_application(_relu_as_max(), _chain(False), changed, timeout=3.0)
    assert any(lemma.proved for lemma in swept)
    assert [o.status for o in app.obligations] != ["proved"]
