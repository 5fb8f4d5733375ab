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

