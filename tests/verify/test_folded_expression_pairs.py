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
