"""Row-norm facts in the interval pass (Cauchy–Schwarz after a layer norm, convex combinations after a
softmax): on attention blocks in float32 and in their FP16 program every value stays inside its bound on
random, corner and gradient-pushed inputs; the facts tighten the attention scores by orders of magnitude;
and a norm rule made too small is caught by the same check."""

from __future__ import annotations

import numpy as np
import pytest
from sampling import pushed_points, values_outside

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from verify.probe import norms as N
from verify.probe.bounds import BoundsEngine
from verify.probe.program import reduced_program

HIDDEN, HEADS, SEQ = 32, 2, 6


def _attention(seed: int, scale: float = 0.3) -> Module:
    """LayerNorm, Q/K/V projections split into heads, softmax(QKᵀ/√d)·V, an output projection."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, SEQ, HIDDEN])

    def const(*shape: int, s: float = scale) -> object:
        return b.const((rng.standard_normal(shape) * s).astype(np.float32))

    h = b.layer_norm(x, const(HIDDEN, s=1.0), const(HIDDEN, s=0.5), axis=2, epsilon=1e-12)
    d = HIDDEN // HEADS

    def heads(w: object, bias: object, perm: tuple[int, ...]) -> object:
        y = b.add(b.matmul(h, w), bias)
        return b.transpose(b.reshape(y, shape=(1, SEQ, HEADS, d)), perm=perm)

    q = heads(const(HIDDEN, HIDDEN), const(HIDDEN), (0, 2, 1, 3))
    kt = heads(const(HIDDEN, HIDDEN), const(HIDDEN), (0, 2, 3, 1))
    v = heads(const(HIDDEN, HIDDEN), const(HIDDEN), (0, 2, 1, 3))
    scores = b.div(b.matmul(q, kt), b.scalar(float(np.sqrt(d)), DType.f32))
    ctx = b.matmul(b.softmax(scores, axis=3), v)
    merged = b.reshape(b.transpose(ctx, perm=(0, 2, 1, 3)), shape=(1, SEQ, HIDDEN))
    out = b.add(b.matmul(merged, const(HIDDEN, HIDDEN)), x)
    return b.module(b.function("main", [x], [out]))


def _boxes(r: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {"x": (np.full((1, SEQ, HIDDEN), -r), np.full((1, SEQ, HIDDEN), r))}


def _points(module: Module, engine: BoundsEngine, bounds, r: float, seed: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """Random and corner inputs, and gradient ascent pushing every matmul to both ends of its bound."""
    return pushed_points(module, engine, bounds, r, seed, "matmul")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_attention_values_stay_inside_their_bounds(seed: int, precision: str) -> None:
    module = _attention(seed)
    checked = module if precision == "fp32" else reduced_program(module, "fp16").module
    engine = BoundsEngine(checked.main, checked.constants)
    bounds = engine.run(_boxes(3.0))
    inner = BoundsEngine(module.main, module.constants)
    points = _points(module, inner, inner.run(_boxes(3.0)), 3.0, seed)
    for x in points:
        feed = {"x": x["x"].astype(checked.main.params[0].dtype.np)}
        assert not values_outside(checked, bounds, feed)


def test_the_facts_tighten_attention_scores() -> None:
    module = _attention(0, scale=1.0)
    engine = BoundsEngine(module.main, module.constants)
    with_facts = engine.run(_boxes(100.0))
    plain = BoundsEngine(module.main, module.constants, tighten=False).run(_boxes(100.0))
    scores, ctx = [v for v in module.main.ops() if v.op == "matmul" and v.operands[1] not in engine.constants
                   and not v.operands[1].is_const][:2]
    for v, factor in ((scores, 5.0), (ctx, 2.0)):
        tight, loose = with_facts.values[v], plain.values[v]
        assert float(np.max(tight.magnitude())) * factor < float(np.max(loose.magnitude())), v.op


def test_a_norm_rule_made_too_small_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spectral norms 30x too small make the score bounds unsound, and the same inputs show it. (On this
    block the score bound is about 60x what gradient ascent reaches, so a rule has to be that wrong for
    sampling to see it: sampling checks soundness, it does not measure tightness.)"""
    module = _attention(0, scale=1.0)
    real = N.RowNorms._sigma
    monkeypatch.setattr(N.RowNorms, "_sigma", lambda self, w: tuple(s / 30 for s in real(self, w)))
    engine = BoundsEngine(module.main, module.constants)
    bounds = engine.run(_boxes(3.0))
    found = set()
    for x in _points(module, engine, bounds, 3.0, 0):
        found.update(values_outside(module, bounds, x))
    assert found
