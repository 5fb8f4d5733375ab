"""Cut points by congruence: a rewrite near the inputs makes every value downstream a new value, but
each keeps its op, attributes and operands up to the cut below it, so the verifier pairs them without
reading the whole network (whose encoding would grow 9x per 3x3 convolution). Operands of a
commutative op swapped are proved like any lemma, with the axioms the proof used in the certificate;
operands of a non-commutative op swapped stay a difference the prover refutes."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.deep import run_deep
from cuvil.ir.module import Module
from verify import check_rewrite
from verify.audit import check_certificate

DEPTH = 8  # 3x3 convolutions: a whole-cone encoding needs 9**8 reads of the input


def _network(first: str, swap: bool, depth: int = DEPTH) -> Module:
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, [1, 2, 12, 12])
    scale = b.const(rng.uniform(0.5, 1.5, (1, 2, 12, 12)).astype(np.float32))
    y = b.op(first, scale, x) if swap else b.op(first, x, scale)
    for k in range(depth):
        w = b.const((rng.standard_normal((2, 2, 3, 3)) * 0.3).astype(np.float32))
        y = b.relu(b.conv(y, w, pads=[1, 1, 1, 1])) if k % 2 else b.tanh(b.conv(y, w, pads=[1, 1, 1, 1]))
    return b.module(b.function("main", [x], [y]))


@pytest.mark.parametrize("op", ["mul", "add"])
def test_a_reordered_product_near_the_inputs_is_proved_through_a_deep_network(op: str) -> None:
    cert = check_rewrite(_network(op, False), _network(op, True)).certificate()
    assert cert["summary"] == {**cert["summary"], "obligations": 1, "proved": 1, "unknown": 0, "refuted": 0}
    app = cert["applications"][0]
    assert len(app["lemmas"]) == 1  # the swapped op; everything above it is paired by congruence
    pairs = app["congruences"]  # listed for audit: each pair cut without a query, and why
    assert len(pairs) >= DEPTH and all(c["why"].startswith("congruence") for c in pairs)
    assert {c["op"] for c in pairs} >= {"conv", "relu", "tanh"}
    assert f"{op}-commutative" in cert["axioms"]  # the lemma's proof used it: listed, proved, re-checked
    assert check_certificate(cert).ok


@pytest.mark.parametrize("op", ["sub", "div"])
def test_swapped_operands_of_a_non_commutative_op_are_not_paired(op: str) -> None:
    """The seeded bug: ``x - s`` rewritten to ``s - x`` at the bottom of the network."""
    cert = check_rewrite(_network(op, False, depth=2), _network(op, True, depth=2)).certificate()
    assert cert["summary"]["proved"] == 0
    assert cert["summary"]["refuted"] == 1


def test_a_changed_attribute_is_not_congruent() -> None:
    """Same operands, another padding: the pair differs and is not cut."""
    def model(pad: int) -> Module:
        b = Builder()
        x = b.param("x", DType.f32, [1, 1, 6, 6])
        w = b.const(np.ones((1, 1, 3, 3), np.float32))
        y = b.conv(x, w, pads=[pad, pad, pad, pad])
        return b.module(b.function("main", [x], [b.reduce_sum(y, axes=(2, 3))]))

    cert = check_rewrite(model(1), model(0)).certificate()
    assert cert["summary"]["proved"] == 0 and cert["summary"]["refuted"] == 1


def test_deep_recursion_runs_on_a_large_stack() -> None:
    def depth(n: int) -> int:
        return 0 if n == 0 else 1 + depth(n - 1)

    assert run_deep(lambda: depth(60_000)) == 60_000
    assert run_deep(lambda: run_deep(lambda: 7)) == 7  # nested: runs in place
    with pytest.raises(ZeroDivisionError):
        run_deep(lambda: 1 // 0)


def test_the_recursion_limit_is_restored_after_a_deep_run() -> None:
    import sys

    before = sys.getrecursionlimit()
    run_deep(lambda: None)
    assert sys.getrecursionlimit() == before  # parsers that refuse deep nesting keep their limit



@pytest.mark.parametrize("oracles", [set(), {"sqrt"}])
def test_a_z_p_difference_is_reported_as_evidence_only_inside_field_arithmetic(oracles: set[str]) -> None:
    """An unknown obligation's reason: over Z_p, sqrt and exp are random oracles, so 1/sqrt(v) and rsqrt(v)
    differ there although they are equal; such a difference is said to prove nothing."""
    from cuvil.passes.base import Contract
    from verify.modular import Trace
    from verify.obligations import _combine
    from verify.prove import Attempt
    from verify.refute import Search

    search = Search(rit_differs=True, rit_index=(0, 1), rit_trace=Trace(oracles=set(oracles)))
    verdict = _combine(Attempt("unknown", "real", 0.1, reason="solver timeout"), None, search, Contract.REAL,
                       "real", (), [])
    text = str(verdict.reason)
    if oracles:
        assert "says nothing here" in text and "sqrt" in text and "finds a difference" not in text
    else:
        assert "finds a difference at (0, 1)" in text
