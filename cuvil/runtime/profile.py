"""What a profiled library (``compile(..., profile=True)``) says about where its runs spend their time.

The library keeps one nanosecond counter per step of its run (:mod:`cuvil.codegen.profile`); the manifest's
``profile.steps`` says what each step is (op, kernel, result type). :class:`Profile` joins the two.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuvil.codegen.manifest import ManifestError
from cuvil.errors import InputError


@dataclass(frozen=True)
class StepTime:
    """One step of the run: its op, the kernel that ran it, its result type and the time it took in all."""

    step: int
    op: str
    kernel: str
    type: str
    total_ns: int


@dataclass(frozen=True)
class Profile:
    """The steps' times over ``runs`` runs (each step's ``total_ns`` summed over them)."""

    runs: int
    steps: tuple[StepTime, ...]

    @property
    def total_ns(self) -> int:
        return sum(s.total_ns for s in self.steps)

    def per_run_ms(self, step: StepTime) -> float:
        return step.total_ns / max(self.runs, 1) / 1e6

    def by_kernel(self) -> list[tuple[str, str, int, int]]:
        """``(op, kernel, steps, total_ns)`` per op and kernel, the slowest first."""
        groups: dict[tuple[str, str], list[int]] = {}
        for s in self.steps:
            groups.setdefault((s.op, s.kernel), []).append(s.total_ns)
        return sorted(((op, kernel, len(ns), sum(ns)) for (op, kernel), ns in groups.items()),
                      key=lambda row: -row[3])

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "total_ms_per_run": self.total_ns / max(self.runs, 1) / 1e6,
                "steps": [{"step": s.step, "op": s.op, "kernel": s.kernel, "type": s.type,
                           "ms_per_run": self.per_run_ms(s)} for s in self.steps]}


def profile_steps(manifest: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    """The manifest's step descriptions, or an error saying the library was built without profiling."""
    entry = manifest.get("profile")
    if entry is None:
        raise InputError(f"{where} was compiled without per-step profiling", location=where,
                         hint="compile with profile=True (on the command line: cuvil compile --profile)")
    steps = entry.get("steps") if isinstance(entry, Mapping) else None
    if not isinstance(steps, list) or not all(
            isinstance(s, Mapping) and all(isinstance(s.get(k), str) for k in ("op", "kernel", "type"))
            for s in steps):
        raise ManifestError(f"{where}: the manifest's profile.steps is not a list of {{op, kernel, type}}",
                            location=where, hint="recompile the model with this version of cuvil")
    return steps


def read_profile(reader: Any, steps: Sequence[Mapping[str, Any]], reset: bool) -> Profile:
    """Call the library's ``P_profile`` (``reader``, a ctypes function) and label its counters."""
    counters = (ctypes.c_int64 * max(len(steps), 1))()
    runs = int(reader(counters, len(steps), 1 if reset else 0))
    return Profile(runs, tuple(StepTime(k, str(s["op"]), str(s["kernel"]), str(s["type"]), int(counters[k]))
                               for k, s in enumerate(steps)))


def render_profile(profile: Profile, top: int = 20) -> str:
    """A plain-text table: the slowest steps, then the time per op and kernel."""
    runs = max(profile.runs, 1)
    total = profile.total_ns / runs / 1e6

    def share(ms: float) -> float:
        return ms / total if total else 0.0

    lines = [f"{profile.runs} run(s), {total:.3f} ms a run in the ops", "",
             f"{'step':>5}  {'ms/run':>9}  {'share':>6}  {'op':<18}{'kernel':<34}type"]
    for s in sorted(profile.steps, key=lambda s: -s.total_ns)[:top]:
        ms = profile.per_run_ms(s)
        lines.append(f"{s.step:>5}  {ms:>9.4f}  {share(ms):>6.1%}  {s.op:<18}{s.kernel:<34}{s.type}")
    lines += ["", f"{'ms/run':>9}  {'share':>6}  {'steps':>5}  {'op':<18}kernel"]
    for op, kernel, count, ns in profile.by_kernel():
        ms = ns / runs / 1e6
        lines.append(f"{ms:>9.4f}  {share(ms):>6.1%}  {count:>5}  {op:<18}{kernel}")
    return "\n".join(lines)
