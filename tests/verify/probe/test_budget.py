"""The probe's work budget: spending is counted in work units, so a probe whose budget ends its search and
its boundary bisection gives the same report on an idle and on a loaded machine; the wall-clock limit is
only an outer guard, and when it fires the report names the phase it cut."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench.models import ZOO_SMALL
from cuvil.frontend.dispatch import import_model
from cuvil.ir.module import Module
from verify.probe.budget import Budget
from verify.probe.probe import ProbeOptions, probe
from verify.probe.report import to_report

SPIN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


@functools.cache
def _module(name: str) -> Module:
    return import_model(ZOO_SMALL[name].to_onnx())


def _ranges(module: Module) -> dict[str, tuple[float, float]]:
    return {p.name: ((-1.0, 1.0) if p.dtype.is_float else (0.0, 127.0)) for p in module.main.params}


@contextmanager
def _loaded(processes: int = 3) -> Iterator[None]:
    """More busy processes than the machine has spare cores, for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(processes)]
    try:
        time.sleep(0.2)
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def _report(name: str, effort: float) -> dict[str, Any]:
    module = _module(name)
    rep = probe(module, _ranges(module), ProbeOptions(effort=effort))
    assert rep.budget is not None and not rep.budget.cut
    data = to_report(rep, model=name).to_dict()
    data.pop("timings")
    data.pop("created")
    return data


@pytest.mark.parametrize(("name", "effort"), [("bert", 300.0), ("resnet18", 3000.0)])
def test_a_probe_gives_the_same_report_idle_and_loaded(name: str, effort: float) -> None:
    idle = _report(name, effort)
    with _loaded():
        loaded = _report(name, effort)
    assert idle == loaded
    budget = idle["sections"]["budget"]
    assert budget["spent_units"] >= 0.9 * effort  # the budget, not the search running dry, ended the work


def test_a_larger_budget_does_more_work() -> None:
    small, large = _report("resnet18", 1000.0), _report("resnet18", 3000.0)
    assert large["sections"]["budget"]["spent_units"] > small["sections"]["budget"]["spent_units"]
    assert large["sections"]["boundary"]["bisection_steps"] > small["sections"]["boundary"]["bisection_steps"]


def test_the_wall_clock_guard_names_the_phase_it_cut() -> None:
    module = _module("resnet18")
    rep = probe(module, _ranges(module), ProbeOptions(effort=1e9, time_limit=1e-3))
    assert rep.budget is not None and rep.budget.cut
    assert to_report(rep).sections["budget"]["cut_by_time_limit"] == rep.budget.cut


def test_spending_reaches_every_enclosing_budget() -> None:
    root = Budget(100.0)
    phase = root.until(0.5, "first")
    assert phase.left == 50.0
    part = phase.share(0.5, "part")
    assert part.left == 25.0
    part.charge(25.0)
    assert (part.spent, phase.spent, root.spent) == (25.0, 25.0, 25.0)
    assert part.exhausted and not phase.exhausted and phase.left == 25.0
    phase.charge(25.0)
    assert phase.exhausted and not root.exhausted and root.left == 50.0
    assert root.until(0.5, "second").left == 0.0 and root.until(1.0, "rest").left == 50.0
    assert not Budget(math.inf).exhausted


def _scaled(factor: float) -> Module:
    """``relu(x) · factor + x``: past FP16's range at the box's scale 1 once ``factor`` passes 65,504."""
    import numpy as np

    from cuvil.ir.builder import Builder
    from cuvil.ir.dtypes import DType

    b = Builder()
    x = b.param("x", DType.f32, [1, 8])
    y = b.op("add", b.op("mul", b.op("relu", x), b.const(np.full((1, 8), factor, np.float32))), x)
    return b.module(b.function("main", [x], [y]))


def test_the_boundary_does_not_repeat_the_scale_one_pass() -> None:
    """The bisection's proof at scale 1 starts from the pass the bounds already ran there: one pass fewer,
    and the same decision as a fresh analysis (same verdict, same excess)."""
    import verify.probe.probe as _  # noqa: F401  (the module, not the function it exports)

    P = sys.modules["verify.probe.probe"]
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
