"""Both sides compute a constant expression that equals, bit for bit, a constant both sides also read (a
bias quantized to the very integers it was dequantized from), written differently on each side (a pass
reordered a product's operands). The two expressions and the constant are one folded leaf: the proof
and the randomized identity test read the constant's bytes for both, so a correct rewrite is proved and
the verifier does not report itself inconsistent."""

from __future__ import annotations

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.hashing import structural_hash
from cuvil.passes import run_pipeline
from verify import make_gate


def _module(swap: bool):
    b = Builder()
    x = b.param("x", DType.i32, [1, 6])
    q = b.const(np.array([3, -7, 120, 0, -128, 45], dtype=np.int32))
    lo, hi = b.const(np.float32(0.5)), b.const(np.float32(4.0))
    scale = b.mul(hi, lo) if swap else b.mul(lo, hi)  # 2.0 either way
    requantized = b.cast(b.round(b.div(b.mul(b.cast(q, to=DType.f32), b.const(np.float32(2.0))), scale)),
                         to=DType.i32)  # q again, bit for bit
    y = b.add(b.mul(x, q), requantized)  # q read directly too
    return b.module(b.function("main", [x], [y]))


def test_a_reordered_folded_expression_is_proved_without_inconsistency() -> None:
    for swap in (False, True):
        before = _module(swap)
        after = run_pipeline(before, ["cse"]).module
        if structural_hash(after.main.results[0]) != structural_hash(before.main.results[0]):
            break
    else:
        raise AssertionError("cse reorders neither operand order: the case does not arise")
    gate = make_gate("strict")
    run_pipeline(before, ["cse"], gate=gate)  # raised CUVIL-VERIFY-INCONSISTENT before the fix
    report = gate.report()
    assert report.obligations and report.count("proved") == len(report.obligations), report.summary()


def _two_expressions_one_constant():
    """``-exp(c1)`` and ``-exp(c2 - 1)`` with ``c2 - 1 == c1`` exactly: fold-constants makes both the same
    constant, which a max then reads twice (a recurrence's initial state, as RWKV's layers each compute it)."""
    b = Builder()
    x = b.param("x", DType.f32, [4])
    c1 = b.const(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    c2 = b.const(np.array([2.0, 3.0, 4.0, 5.0], np.float32))
    e1 = b.neg(b.exp(c1))
    e2 = b.neg(b.exp(b.sub(c2, b.const(np.ones(4, np.float32)))))
    y = b.op("max", b.add(x, e1), b.op("max", e2, b.mul(x, x)))
    return b.module(b.function("main", [x], [y]))


def test_every_expression_of_one_folded_constant_reads_its_bytes_in_the_identity_test() -> None:
    """The randomized identity test reads each expression paired with a folded constant as that constant's
    image; it took only one of the two here, so the other's exp became a random oracle of random
    residues, the test differed from the proof, and the verifier reported itself inconsistent."""
    before = _two_expressions_one_constant()
    after = run_pipeline(before, ["fold-constants"]).module
    assert sum(v.op == "exp" for v in before.main.ops()) == 2 and not any(v.op == "exp" for v in after.main.ops())
    gate = make_gate("strict")
    run_pipeline(before, ["fold-constants"], gate=gate)
    report = gate.report()
    assert [o.status for o in report.obligations] == ["proved"]
