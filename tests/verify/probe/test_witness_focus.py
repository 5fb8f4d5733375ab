"""The witness search pushes every open site that came close to its limit at once (the sum of their
scores, from the input where the closest got furthest) instead of one site per ascent; and integer
convolutions and matmuls run on torch's kernels in the search when float64 sums them exactly."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.rulewalk import RuleInfo
from verify.probe import torch_eval
from verify.probe.probe import OVERFLOW, ProbeOptions, probe
from verify.probe.witness import Searcher

torch = pytest.importorskip("torch", reason="the gradient search reads rules with torch autograd")

SITES = 6
BLOCK = 4
SCALE = 6560.0  # (BLOCK + 6) * SCALE = 65600 rounds to inf in FP16; the centre reaches 60 % of that


def _blocks_model() -> Module:
    """``y_k = (sum of x's k-th block + 6 + k/4) * 6560`` for six disjoint blocks: each site overflows FP16
    only at its own block's all-ones face, and the centre of the box is already 60 % of the way."""
    b = Builder()
    x = b.param("x", DType.f32, [1, SITES * BLOCK])
    outs = []
    for k in range(SITES):
        mask = np.zeros((SITES * BLOCK, 1), np.float32)
        mask[k * BLOCK:(k + 1) * BLOCK] = 1.0
        s = b.add(b.matmul(x, b.const(mask)), b.const(np.float32(6.0 + 0.25 * k)))  # no ties at the centre
        outs.append(b.mul(s, b.const(np.float32(SCALE))))
    return b.module(b.function("main", [x], outs))


def _witnessed(**kw: object) -> list[str]:
    rep = probe(_blocks_model(), {"x": (-1.0, 1.0)},
                ProbeOptions(boundary=False, restarts=1, z3_witness=False, **kw))  # type: ignore[arg-type]
    sites = [s for s in rep.sites if s.op == "mul"]
    assert len(sites) == SITES
    return [rep.witnesses[s.witness].method for s in sites if s.verdict == OVERFLOW and s.witness is not None]


def test_close_sites_are_pushed_together_in_one_ascent(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _witnessed()
    assert len(found) == SITES and found.count("gradient") >= SITES - 1  # a random corner may hit one first
    # the same search with the largest-score objective only: one ascent moves one block (the other
    # blocks' gradients are 0), so most sites stay open
    monkeypatch.setattr(Searcher, "_near", staticmethod(lambda *a: []))
    assert len(_witnessed()) < SITES


def _integer_cases(rng: np.random.Generator) -> list[tuple[str, dict[str, object], np.ndarray, np.ndarray]]:
    cases: list[tuple[str, dict[str, object], np.ndarray, np.ndarray]] = []
    for strides, pads, groups in [((1, 1), (1, 1, 1, 1), 1), ((2, 1), (0, 2, 1, 0), 2), ((1, 2), (0, 0, 0, 0), 4)]:
        x = rng.integers(-128, 128, (1, 4, 7, 6)).astype(np.int32)
        w = rng.integers(-128, 128, (8, 4 // groups, 3, 2)).astype(np.int32)
        cases.append(("conv", {"strides": strides, "pads": pads, "groups": groups}, x, w))
    for ta, tb in [(False, False), (True, False), (False, True)]:
        a = rng.integers(-128, 128, (5, 3) if ta else (3, 5)).astype(np.int32)
        bm = rng.integers(-128, 128, (4, 5) if tb else (5, 4)).astype(np.int32)
        cases.append(("matmul", {"transpose_a": ta, "transpose_b": tb}, a, bm))
    return cases


@pytest.mark.parametrize("case", range(6))
def test_integer_schedules_compute_the_rule_exactly(case: int) -> None:
    """The class: integer conv (strides, asymmetric pads, groups) and matmul (transposes) on int32
    operands; the schedule's float64 result equals the rule read term by term."""
    op, attrs, x, w = _integer_cases(np.random.default_rng(case))[case]
    b = Builder()
    px, pw = b.param("x", DType.i32, list(x.shape)), b.param("w", DType.i32, list(w.shape))
    v = b.op(op, px, pw, **attrs)
    info = RuleInfo.of(v)
    operands = [torch.from_numpy(a.astype(np.float64)) for a in (x, w)]
    assert torch_eval._exact_in_float64(v, operands)
    fast, _ = torch_eval.op_value(v, info, operands)
    slow, _ = torch_eval.op_value(v, info, operands, use_schedules=False)
    assert torch.equal(fast, slow)


def test_integer_schedules_step_aside_when_float64_could_round() -> None:
    b = Builder()
    x, w = b.param("x", DType.i32, [1, 2, 4, 4]), b.param("w", DType.i32, [3, 2, 3, 3])
    v = b.op("conv", x, w, pads=(1, 1, 1, 1))
    big = torch.full((1, 2, 4, 4), float(2 ** 30), dtype=torch.float64)
    assert not torch_eval._exact_in_float64(v, [big, torch.full((3, 2, 3, 3), float(2 ** 30), dtype=torch.float64)])
    assert torch_eval._exact_in_float64(v, [big, torch.ones((3, 2, 3, 3), dtype=torch.float64)])
