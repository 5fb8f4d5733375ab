"""A pass that squeezes a unit axis out of a computation (MobileViT's one-patch attention after
eliminate-layout-ops): the values above the squeeze have other types on the two sides, so no cut point pairs
them and the output's obligation spans the whole chain. Each value is paired with the other side's value
that is it with the unit axis added (one tensor in two views), proved by the encoder reading one leaf
through both shapes; the chain then closes level by level."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import z3
from lemma_spy import record_lemmas

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import Pass
from verify.cone_encoder import IndexSpace, unit_view, view_index
from verify.obligations import Lemma, check_application

WEIGHTS = [np.random.default_rng(21 + k).standard_normal((32, 32)).astype(np.float32) / 6 for k in range(5)]


def _network(unit_axis: bool, last: Callable[[Builder, Value], Value] = lambda b, h: h) -> Module:
    """``x -> tanh(x W0)``, then four residual layers, on ``[2, 16, 32]`` or (``unit_axis``) on the same
    tensor viewed as ``[2, 1, 16, 32]`` and squeezed back at the end."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 16, 32])
    h = b.tanh(b.matmul(x, b.const(WEIGHTS[0])))
    if unit_axis:
        h = b.reshape(h, shape=(2, 1, 16, 32))
    for w in WEIGHTS[1:]:
        h = b.tanh(b.add(b.matmul(h, b.const(w)), h))
    if unit_axis:
        h = b.reshape(h, shape=(2, 16, 32))
    return b.module(b.function("main", [x], [last(b, h)]))


def _squeeze() -> Pass:
    return type("SqueezeUnitAxis", (Pass,), {"name": "squeeze-unit-axis", "contract": Contract.EXACT})()


@pytest.fixture
def found(monkeypatch: pytest.MonkeyPatch) -> list[Lemma]:
    """The view lemmas the sweep tries, as it tries them."""
    return record_lemmas(monkeypatch, "_view_lemmas")


def test_mobilevit_one_patch_block_is_proved_through_views(found: list[Lemma]) -> None:
    """A MobileViT block whose feature map is one patch (4x4 input, stride 2, patches of 2x2), four
    transformer layers, through torch.export and O3: every obligation proved. Without the view pairs the
    eliminate-layout-ops application's output was unknown after 53 s (the sweep paired nothing above the
    squeeze); with them, all seven obligations are proved in about 4 s."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.mobilevit.modeling_mobilevit import MobileViTLayer

    import cuvil
    from verify import check_pipeline

    cfg = transformers.MobileViTConfig(num_attention_heads=2, mlp_ratio=2.0, patch_size=2, expand_ratio=2.0,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = MobileViTLayer(cfg, in_channels=8, out_channels=16, stride=2, hidden_size=24, num_stages=4).eval()
        for m in block.modules():  # the library's 0.02 init shrinks activations to zero within a few layers
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                m.reset_parameters()  # pyright: ignore[reportCallIssue]
        x = torch.randn(1, 8, 4, 4)
    report = check_pipeline(cuvil.import_model(block, {"features": x}), "O3", timeout=20.0)
    assert [o.status for o in report.obligations] == ["proved"] * len(report.obligations), report.summary()
    assert any(lemma.proved for lemma in found)


def test_a_squeeze_that_also_reverses_the_rows_is_refuted() -> None:
    """The after side reverses the 16 rows before its last layer: no view pairs that value, and the
    search finds the difference."""
    def reversed_rows(b: Builder, h: Value) -> Value:
        return b.gather(h, b.const(np.arange(15, -1, -1, dtype=np.int64)), axis=1)

    app = check_application(_squeeze(), _network(True), _network(False, reversed_rows))
    assert [o.status for o in app.obligations] == ["refuted"]


def test_a_squeeze_that_changes_one_exact_value_is_not_proved(found: list[Lemma]) -> None:
    """Prover-only: the after side also replaces the value wherever it equals one float exactly, which random
    inputs never hit; every layer below is paired across the views, and the output must still not be
    proved (the search cannot replay the difference, so the verdict is left open)."""
    def one_value(b: Builder, h: Value) -> Value:
        return b.where(b.equal(h, b.const(np.float32(0.123456789))), b.const(np.float32(0.5)), h)

    app = check_application(_squeeze(), _network(True), _network(False, one_value), timeout=5.0)
    assert any(lemma.proved for lemma in found)
    assert [o.status for o in app.obligations] != ["proved"]


@pytest.mark.parametrize(("shape", "base", "expected"), [
    ((2, 16, 32), (2, 1, 16, 32), (0, None, 1, 2)),
    ((2, 1, 16, 32), (2, 16, 32), (0, 2, 3)),
    ((1, 4, 1), (4, 1, 1, 1), (1, None, None, None)),
])
def test_view_index_reads_the_other_extents_in_order(shape: tuple[int, ...], base: tuple[int, ...],
                                                       expected: tuple[int | None, ...]) -> None:
    """Each index of the view goes to the base's axis of the same rank among the non-unit ones; the base's
    unit axes read 0."""
    idx = tuple(IndexSpace.const(100 + k) for k in range(len(shape)))
    got = view_index(idx, shape, base)
    assert got is not None
    assert tuple(i.const for i in got) == tuple(0 if e is None else 100 + e for e in expected)


@pytest.mark.parametrize(("shape", "base"), [
    ((2, 16, 32), (2, 32, 16)),  # the same elements in another order: not a view
    ((2, 16, 32), (32, 32)),  # a reshape that merges axes
    ((2, 16, 32), (2, 16, 32)),  # the same shape is no view
])
def test_shapes_that_are_not_unit_views_are_refused(shape: tuple[int, ...], base: tuple[int, ...]) -> None:
    assert not unit_view(shape, base)
    assert view_index(tuple(IndexSpace.const(0) for _ in shape), shape, base) is None


def test_a_leaf_read_through_a_shape_that_is_no_view_does_not_encode() -> None:
    """The encoder refuses to read a leaf through a shape that is not one of its views (a cut is made only
    for proved views; reading one otherwise would relate unrelated elements)."""
    from verify.cone_encoder import ConeEncoder, EncodingError, Leaf

    b = Builder()
    x = b.param("x", DType.f32, [2, 16, 32])
    y = b.param("y", DType.f32, [2, 32, 16])
    leaf = Leaf("cut1_x", "%x", x.type, "cut")
    enc = ConeEncoder("abstract-fp", lambda v: leaf if v in (x, y) else None, ctx=z3.Context())
    with pytest.raises(EncodingError, match="not a view"):
        enc.value_at(y, enc.output_index(y.type))
