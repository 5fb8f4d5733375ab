"""The boundary's bisection on the box's scale (:func:`verify.probe.probe._boundary`): it does not repeat
the pass the bounds ran at scale 1, and where the bounds fail even at the point 0 that every scaled box
holds it stops and asks the witness search about that point."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from verify.probe.budget import Budget
from verify.probe.probe import ProbeOptions, probe

P = sys.modules["verify.probe.probe"]  # the module (the package exports its function ``probe``)


def _scaled(factor: float) -> Module:
    """``relu(x) · factor + x``: past FP16's range at the box's scale 1 once ``factor`` passes 65,504."""
    b = Builder()
    x = b.param("x", DType.f32, [1, 8])
    y = b.op("add", b.op("mul", b.op("relu", x), b.const(np.full((1, 8), factor, np.float32))), x)
    return b.module(b.function("main", [x], [y]))


def test_the_boundary_does_not_repeat_the_scale_one_pass() -> None:
    """The bisection's proof at scale 1 starts from the pass the bounds already ran there: one pass fewer,
    and the same decision as a fresh analysis (same verdict, same excess)."""
    program = P.reduced_program(_scaled(1e5), "fp16")
    ranges = {"x": (-1.0, 1.0)}

    def counted(analysis: Any) -> list[float]:
        passes: list[float] = []
        run = analysis.run

        def spy(boxes: Any, budget: Budget, scale: float = 1.0, **kw: Any) -> Any:
            passes.append(scale)
            return run(boxes, budget, scale, **kw)

        analysis.run = spy
        return passes

    fresh = P.Analysis(program, ranges, P.ProbeOptions())
    fresh_passes = counted(fresh)
    assert not fresh.proved(1.0, Budget(math.inf))
    analysis = P.Analysis(program, ranges, P.ProbeOptions())
    passes = counted(analysis)
    analysis.bounds(1.0, Budget(math.inf))
    before = len(passes)
    assert not analysis.proved(1.0, Budget(math.inf))
    assert len(passes) - before == len(fresh_passes) - 1
    assert analysis.excess == fresh.excess and fresh.excess is not None and fresh.excess > 1.4
    assert analysis.proved(0.5, Budget(math.inf)) and passes[-1] == 0.5  # another scale runs its own pass
    before = len(passes)
    analysis.bounds(0.5, Budget(math.inf), refine=False)
    analysis.bounds(0.5, Budget(math.inf), refine=False)
    assert passes[before:] == [0.5]  # proved's pass may stop early: bounds runs one whole pass, then reuses it


def _offset() -> Module:
    """``(x + 60,000) + 60,000``: past FP16's range at every input near 0, the point 0 included."""
    b = Builder()
    x = b.param("x", DType.f32, [1, 4])
    big = b.const(np.full((1, 4), 6e4, np.float32))
    y = b.op("add", b.op("add", x, big), big)
    return b.module(b.function("main", [x], [y]))


def test_bounds_that_fail_at_the_point_zero_end_the_bisection_and_that_point_is_the_witness() -> None:
    rep = probe(_offset(), {"x": (-1.0, 1.0)}, ProbeOptions())
    b = rep.boundary
    assert b.safe_scale is None and b.unproved_scale == 0.0 and b.bisection_steps == 1
    assert b.witness_scale == 0.0 and "scale 0" in b.note and "confirmed" in b.note


def test_a_box_that_does_not_hold_zero_is_bisected_as_before() -> None:
    """[1, 2] scaled never holds the point 0: failing there says nothing about a smaller box."""
    rep = probe(_offset(), {"x": (1.0, 2.0)}, ProbeOptions())
    b = rep.boundary
    assert b.safe_scale is None and b.unproved_scale is not None and 0 < b.unproved_scale < 1e-3
    assert b.bisection_steps > 1 and "scale 0" not in b.note


def test_the_first_step_above_one_uses_the_closest_sites_room() -> None:
    """Every site proved at 1, the closest within 1/1.5 of its limit: the first step up is just under 1.5 (where
    that site's bound, growing with the scale, meets its limit), which proves; a step to 2 would not, and the
    bisection then ends between the two."""
    module = _scaled(65504 / 1.5 - 1)
    program = P.reduced_program(module, "fp16")
    analysis = P.Analysis(program, {"x": (-1.0, 1.0)}, ProbeOptions())
    tried: list[float] = []
    proved = analysis.proved

    def spy(scale: float, budget: Budget, rounds: int = 4) -> bool:
        tried.append(scale)
        return proved(scale, budget, rounds)

    analysis.proved = spy  # type: ignore[method-assign]
    analysis.bounds(1.0, Budget(1e6))
    out = P._boundary(analysis, ProbeOptions(), Budget(1e6), Budget(1e6), False)
    assert tried[:2] == [1.0, tried[1]] and 1.35 < tried[1] < 1.5
    assert out.safe_scale is not None and tried[1] <= out.safe_scale < 1.5
    assert out.unproved_scale is not None and out.unproved_scale <= 1.5 * 1.05
