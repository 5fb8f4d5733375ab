"""Proofs through conds. A cond is never encoded element by element: it joins the cut when the cond on
the other side has operands proved equal and each branch proved equal as a function of its arguments
(equal operands then give equal results, whichever branch the condition picks). A branch that differs
only where random inputs never go must leave the output unproved: only the prover can tell, so these
tests fail if it says "equal" wrongly."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.region import close_branches
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from verify import check_rewrite
from verify.audit import check_certificate

ROW = TensorType(DType.f32, (2, 4))
Branch = Callable[[Builder, Value, Value], Value]  # (b, x, w) -> result


def _plain(b: Builder, x: Value, w: Value) -> Value:
    return b.tanh(b.add(b.matmul(x, w), x))


def _swapped(b: Builder, x: Value, w: Value) -> Value:
    return b.tanh(b.add(x, b.matmul(x, w)))


def _relu_instead(b: Builder, x: Value, w: Value) -> Value:
    return b.relu(b.add(b.matmul(x, w), x))


def _other(b: Builder, x: Value, w: Value) -> Value:
    return b.sub(x, b.matmul(x, w))


def _guarded(b: Builder, x: Value, w: Value) -> Value:
    """The plain branch, negated only where an element of x is exactly 0.25 (random inputs miss it)."""
    plain = _plain(b, x, w)
    return b.where(b.equal(x, b.scalar(0.25, DType.f32)), b.neg(plain), plain)


def _model(then: Branch, other: Branch = _other, *, offset_first: bool = False) -> Module:
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, [2, 4])
    c = b.const(rng.standard_normal((2, 4)).astype(np.float32))
    shifted = b.add(c, x) if offset_first else b.add(x, c)
    w = b.const((rng.standard_normal((4, 4)) * 0.5).astype(np.float32))
    pred = b.greater(b.reduce_sum(x, axes=[], keepdims=False), b.scalar(0.0, DType.f32))
    outer = {x, shifted, w, pred}
    branches = [[f(b, shifted, w), b.mul(shifted, shifted)] for f in (then, other)]
    regions, captured = close_branches(branches, outer)
    attrs = {"then_body": regions[0], "else_body": regions[1]}
    outs = [b.cond(pred, *captured, **attrs, output=k) for k in (0, 1)]
    return b.module(b.function("main", [x], outs))


def test_an_unchanged_cond_over_operands_proved_equal_is_paired_by_congruence() -> None:
    cert = check_rewrite(_model(_plain), _model(_plain, offset_first=True)).certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    assert cert["summary"]["proved"] == cert["summary"]["obligations"] >= 2
    assert check_certificate(cert).ok


def test_a_rewritten_branch_is_proved_as_a_function_and_the_proof_is_in_the_certificate() -> None:
    cert = check_rewrite(_model(_plain), _model(_swapped)).certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    obligations = cert["applications"][0]["obligations"]
    branches = [o for o in obligations if o["function"] == "main/loop_body"]
    assert branches and all(o["verdict"] == "proved" for o in branches)
    pairs = cert["applications"][0]["congruences"]
    assert any(c["op"] == "cond" and c["why"].startswith("cond:") for c in pairs)
    assert check_certificate(cert).ok


@pytest.mark.parametrize("after", [_relu_instead, None])
def test_a_wrong_branch_that_random_inputs_expose_is_refuted(after: Branch | None) -> None:
    """A branch rewritten wrongly, or the two branches swapped."""
    wrong = _model(after) if after is not None else _model(_other, _plain)
    cert = check_rewrite(_model(_plain), wrong).certificate()
    outputs = [o for o in cert["applications"][0]["obligations"] if o["function"] == "main"]
    assert any(o["verdict"] == "refuted" for o in outputs)
    assert all(o["verdict"] != "proved" for o in outputs if o["output"] == "out0")
    assert all(o["counterexample"]["inputs"] for o in outputs if o["verdict"] == "refuted")


@pytest.mark.parametrize("swap", [False, True])
def test_a_branch_wrong_only_at_one_input_value_is_never_proved(swap: bool) -> None:
    before, after = _model(_plain), _model(_guarded)
    cert = check_rewrite(*((after, before) if swap else (before, after))).certificate()
    first = [o for o in cert["applications"][0]["obligations"] if o["function"] == "main" and o["output"] == "out0"]
    assert first and all(o["verdict"] != "proved" for o in first)
