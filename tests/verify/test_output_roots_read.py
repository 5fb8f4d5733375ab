"""An output whose before-value a cut-point lemma already paired with another after-value: a pass that
drops a unit axis (a tiny LeViT's last stage is 1x1) leaves the pooled output, a mean over that axis,
equal to the unsqueezed sum it averages, and the sweep pairs the two. Read as that lemma's leaf, the
pooled output related to nothing the after-side's mean reads and stayed unknown; its root is now read by
its rule, and the two means meet the same leaf below."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import PASS_REGISTRY, Pass
from verify.obligations import check_application

W = [np.random.default_rng(40 + k).standard_normal((48, 48)).astype(np.float32) / 7 for k in range(3)]
BIAS = np.random.default_rng(50).standard_normal(48).astype(np.float32)


def _stage(last: Callable[[Builder, Value, Value], Value]) -> Module:
    """Three tanh layers, then ``last(h, bias)`` as [2, 1, 48]; outputs it and its mean over the unit axis."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 48])
    h = x
    for w in W:
        h = b.tanh(b.matmul(h, b.const(w)))
    hidden = last(b, h, b.const(BIAS))
    return b.module(b.function("main", [x], [hidden, b.reduce_mean(hidden, axes=[1])]))


def _unit_axis_then_add(b: Builder, h: Value, bias: Value) -> Value:
    return b.add(b.reshape(h, shape=[2, 1, 48]), b.reshape(bias, shape=[1, 1, 48]))


def test_a_pooled_output_of_a_wrong_sink_is_refuted() -> None:
    """The bias added twice after the sink: both outputs differ, and are refuted."""
    def twice(b: Builder, h: Value, bias: Value) -> Value:
        row = b.reshape(bias, shape=[1, 48])
        return b.reshape(b.add(b.add(h, row), row), shape=[2, 1, 48])

    wrong = type("SinkTwice", (Pass,), {"name": "sink-twice", "contract": Contract.EXACT})()
    app = check_application(wrong, _stage(_unit_axis_then_add), _stage(twice), timeout=5.0)
    assert [o.status for o in app.obligations] == ["refuted", "refuted"]


def test_a_tiny_levit_layout_rewrite_is_proved() -> None:
    """The model the class came from, through torch.export: every output of eliminate-layout-ops proved."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import cuvil

    transformers.logging.set_verbosity_error()
    cfg = transformers.LevitConfig(image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
                                   depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LevitModel(cfg).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module = cuvil.import_model(model, {"pixel_values": pixels})
    for name in ("canonicalize", "cse", "fold-batchnorm"):
        module = PASS_REGISTRY[name]().run(module).module
    layout = PASS_REGISTRY["eliminate-layout-ops"]()
    after = layout.run(module).module
    app = check_application(layout, module, after)
    assert [o.status for o in app.obligations] == ["proved", "proved"], \
        [(o.output, str(o.verdict)) for o in app.obligations]


def test_a_root_paired_already_is_first_read_as_its_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    """fold-batchnorm on a tiny MobileViT (bias-free convolutions, batch norms at their initial statistics):
    the sweep pairs each batch norm with the folded convolution (the folded bias is zero), then with the
    convolution's bias add. Read by its rule, the paired batch norm expanded into sums the other side
    reads as that pair's leaf: two of those lemmas ran into the 20 s limit, two more were not proved.
    Read first as its leaf, every batch norm's lemma is proved."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import cuvil
    from verify import check_pipeline, obligations

    found: list[tuple[str, str, bool]] = []
    lemma = obligations._lemma

    def spy(vb: Value, va: Value, *args: Any, **kwargs: Any) -> obligations.Lemma:
        out = lemma(vb, va, *args, **kwargs)
        found.append((vb.op, va.op, out.proved))
        return out

    monkeypatch.setattr(obligations, "_lemma", spy)
    cfg = transformers.MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32], num_attention_heads=2,
                                       neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], patch_size=2, mlp_ratio=2.0,
                                       expand_ratio=2.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.MobileViTModel(cfg).eval()
        for m in model.modules():  # the library's 0.02 init shrinks activations to zero within a few layers
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                m.reset_parameters()  # pyright: ignore[reportCallIssue]
        pixels = torch.randn(1, 3, 32, 32)
    module = cuvil.import_model(model, {"pixel_values": pixels})
    report = check_pipeline(module, ["canonicalize", "cse", "fold-batchnorm"], timeout=20.0)
    assert [o.status for o in report.obligations] == ["proved"] * len(report.obligations)
    norms = [proved for before, after, proved in found if before == "batch_norm" and after == "add"]
    assert len(norms) >= 30 and all(norms)
