"""Proofs through loops. A loop is never encoded element by element: it joins the cut when the loop on
the other side has the same body and operands proved equal, or a body proved equal as a function of
its arguments (each iteration maps equal state to equal state, so the results are equal for every
trip count). A body that differs only where random inputs never go must leave the output unproved:
only the prover can tell, so these tests fail if it says "equal" wrongly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module
from cuvil.ir.ops.control import INDEX
from cuvil.ir.region import close_body
from cuvil.ir.specialize import specialize_dims
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.unroll import unroll_module
from cuvil.ir.values import Value, param
from cuvil.passes import Contract, Pass, PassResult
from cuvil.passes.value_rewrite import rebuild
from verify import check_pass, check_pipeline, check_rewrite
from verify.audit import check_certificate

H = 4
ROW = TensorType(DType.f32, (2, H))
Step = Callable[[Builder, Value, Value, Value], Value]  # (b, h, x_t, w) -> new h


def _plain(b: Builder, h: Value, x: Value, w: Value) -> Value:
    return b.tanh(b.add(b.matmul(h, w), x))


def _swapped(b: Builder, h: Value, x: Value, w: Value) -> Value:
    return b.tanh(b.add(x, b.matmul(h, w)))


def _relu_instead(b: Builder, h: Value, x: Value, w: Value) -> Value:
    return b.relu(b.add(b.matmul(h, w), x))


def _guarded(b: Builder, h: Value, x: Value, w: Value) -> Value:
    """Flips the new state where the state equals the input exactly: the plain step everywhere
    random inputs go (and it reads nothing more, so both loops have the same operands)."""
    plain = _plain(b, h, x, w)
    return b.where(b.equal(h, x), b.neg(plain), plain)


def _model(step: Step, *, offset_first: bool = False) -> Module:
    rng = np.random.default_rng(0)
    b = Builder()
    h0 = b.param("h0", DType.f32, [2, H])
    xs = b.param("xs", DType.f32, ["T", 2, H])
    c = b.const(rng.standard_normal((2, H)).astype(np.float32))
    shifted = b.add(c, xs) if offset_first else b.add(xs, c)
    w = b.const((rng.standard_normal((H, H)) * 0.5).astype(np.float32))
    t, h, x = param("%s.t", INDEX), param("%s.h", ROW), param("%s.x", ROW)
    new = step(b, h, x, w)
    body, captured = close_body([t, h, x], [new, b.mul(new, new)])
    attrs = {"body": body, "carried": 1, "scanned": 1, "trips": ["T"]}
    outs = [b.loop(h0, shifted, *captured, **attrs, output=k) for k in (0, 1)]
    return b.module(b.function("main", [h0, xs], outs, constraints=[DimConstraint("T", lo=0, hi=64)]))


def test_an_unchanged_loop_over_operands_proved_equal_is_paired_by_congruence() -> None:
    cert = check_rewrite(_model(_plain), _model(_plain, offset_first=True)).certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    assert cert["summary"]["proved"] == cert["summary"]["obligations"] >= 2
    assert check_certificate(cert).ok


def test_a_rewritten_body_is_proved_as_a_function_and_the_proof_is_in_the_certificate() -> None:
    cert = check_rewrite(_model(_plain), _model(_swapped)).certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    obligations = cert["applications"][0]["obligations"]
    bodies = [o for o in obligations if o["function"] == "main/loop_body"]
    assert bodies and all(o["verdict"] == "proved" for o in bodies)
    assert {o["output"] for o in obligations if o["function"] == "main"} == {"out0", "out1"}
    pairs = cert["applications"][0]["congruences"]
    assert any(c["op"] == "loop" and c["why"].startswith("loop:") for c in pairs)
    assert check_certificate(cert).ok


def test_a_wrong_body_that_random_inputs_expose_is_refuted_with_a_replayed_counterexample() -> None:
    cert = check_rewrite(_model(_plain), _model(_relu_instead)).certificate()
    assert cert["summary"]["proved"] == 0
    assert cert["summary"]["refuted"] >= 1
    refuted = [o for o in cert["applications"][0]["obligations"] if o["verdict"] == "refuted"]
    assert all(o["function"] == "main" for o in refuted), "a body's difference is not the model's"
    assert all(o["counterexample"]["inputs"] for o in refuted)


@pytest.mark.parametrize("swap", [False, True])
def test_a_body_wrong_only_at_one_input_value_is_never_proved(swap: bool) -> None:
    before, after = _model(_plain), _model(_guarded)
    cert = check_rewrite(*((after, before) if swap else (before, after))).certificate()
    assert cert["summary"]["proved"] < cert["summary"]["obligations"]
    outputs = [o for o in cert["applications"][0]["obligations"] if o["function"] == "main"]
    assert outputs and all(o["verdict"] != "proved" for o in outputs)
    assert all("loop body" in " ".join(o["notes"]) for o in outputs if o["verdict"] == "unknown")


def _trips(module: Module, trips: int) -> Module:
    return module.replace(functions=[specialize_dims(module.main, {"T": trips})])


@dataclass(frozen=True)
class DropLastIteration(Pass):
    """The seeded bug: unrolls every loop one iteration short (an off-by-one in a trip count)."""

    name = "drop-last-iteration"
    contract = Contract.EXACT

    def run(self, module: Module) -> PassResult:
        def shorter(fn: Function, v: Value, operands: list[Value], b: Builder) -> Value | None:
            trips = v.attr("trips")[0] if v.op == "loop" else 0
            if trips <= 1:
                return None
            scanned = b.slice(operands[1], starts=[0, 0, 0], ends=[trips - 1, 2, H], steps=[1, 1, 1])
            return b.op("loop", operands[0], scanned, *operands[2:], **{**v.attr_dict, "trips": (trips - 1,)})

        out = rebuild(module, shorter)
        return PassResult(unroll_module(out, partial=True), True)


def test_unrolling_is_proved_by_the_verifier_unrolling_too() -> None:
    """The loops cannot be paired with straight-line code; checked with both sides unrolled, every
    result is identical (the unrolling is the loop's meaning)."""
    mod = _trips(_model(_plain), 4)
    report = check_pipeline(mod, "unroll-loops", policy="strict")
    cert = report.certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    app = cert["applications"][0]
    assert app.get("vacuous", "").startswith("every result is structurally identical once the loops are unrolled")


def test_an_unrolling_one_iteration_short_is_refuted() -> None:
    mod = _trips(_model(_plain), 4)
    cert = check_pass(DropLastIteration(), mod).certificate()
    assert cert["summary"]["proved"] == 0 and cert["summary"]["refuted"] >= 1
