"""How much work the probe may do, counted in work units instead of seconds, so that the same command
gives the same report on an idle and on a loaded machine.

One unit is a million element operations: an op's work is its output elements times the terms each one
reduces over (a matmul's ``M·N·K``), read from its shape and rule, plus :data:`OP_UNITS` per op. An interval
pass over the program costs :data:`INTERVAL_FACTOR` times its work, an evaluation for a witness
:data:`CONFIRM_FACTOR` times (plus :data:`WATCH_FACTOR` times each op whose inner nodes it watches), a
gradient step :data:`GRADIENT_FACTOR` times, a back-substitution
:data:`LINEAR_FACTOR` times its dense products, a z3 query its resource count. The wall-clock limit stays
as an outer guard: when it fires, the budget says which phase it cut, and only then may two runs differ."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cuvil.ir.rulewalk import RuleInfo
from cuvil.ir.values import Value

if TYPE_CHECKING:
    from verify.probe.bounds import BoundsEngine

UNIT = 1e6
"""Element operations per work unit."""

OP_UNITS = 0.5
"""Units per op of any evaluation, for its fixed cost (dispatch, allocation): small programs are not free."""

INTERVAL_FACTOR = 8.0
"""An interval pass costs this many units per unit of the program's work (lower and upper ends, rounding,
relational facts)."""

LINEAR_FACTOR = 8.0
"""A back-substitution: per multiply-add of its dense coefficient products (building and reading the
coefficients is not free either)."""

CONFIRM_FACTOR = 3.0
"""An evaluation of the reduced-precision program on one input by the reference interpreter, watching its sites."""

WATCH_FACTOR = 8.0
"""Reading an op's rule again to watch its inner or integer nodes on a candidate input, per unit of its work."""

GRADIENT_FACTOR = 3.0
"""A gradient step: a forward and a backward evaluation."""

Z3_RLIMIT_PER_UNIT = 30
"""z3 resource count charged as one unit."""

DEFAULT_EFFORT = 200_000.0
"""Units of a probe unless the caller says otherwise (under a minute for the zoo on two cores)."""

PLAN_EFFORT = 2_000_000.0
"""Units of an FP16 compile's planning (a few minutes at most; its wall-clock guard is 600 s)."""


@dataclass
class Budget:
    """A share of work units; spending is passed up to the enclosing budgets. ``guard`` is the wall-clock
    deadline (``time.monotonic``) of the whole run, or None."""

    limit: float
    guard: float | None = None
    parent: Budget | None = None
    phase: str = "probe"
    spent: float = 0.0
    cut: list[str] = field(default_factory=list)
    """Phases the wall-clock guard stopped (kept on the outermost budget)."""

    def charge(self, units: float) -> None:
        b: Budget | None = self
        while b is not None:
            b.spent += units
            b = b.parent

    @property
    def left(self) -> float:
        own = self.limit - self.spent
        return own if self.parent is None else min(own, self.parent.left)

    @property
    def exhausted(self) -> bool:
        """No units left, or the wall-clock guard has fired (recorded on the outermost budget)."""
        if self.left <= 0:
            return True
        if self.guard is not None and time.monotonic() > self.guard:
            root = self.root
            if self.phase not in root.cut:
                root.cut.append(self.phase)
            return True
        return False

    @property
    def root(self) -> Budget:
        b = self
        while b.parent is not None:
            b = b.parent
        return b

    def share(self, fraction: float, phase: str) -> Budget:
        """A child budget of ``fraction`` of what is left now."""
        return Budget(max(0.0, fraction * self.left), self.guard, self, phase)

    def until(self, total_fraction: float, phase: str) -> Budget:
        """A child budget that may spend until the outermost budget has spent ``total_fraction`` of its limit."""
        root = self.root
        return Budget(max(0.0, min(self.left, total_fraction * root.limit - root.spent)), self.guard, self, phase)

    def to_json(self) -> dict[str, object]:
        return {"effort_units": self.limit, "spent_units": round(self.spent, 3),
                "cut_by_time_limit": list(self.cut)}


def unlimited() -> Budget:
    return Budget(math.inf)


def op_work(v: Value, info: RuleInfo | None) -> float:
    """Element operations of one evaluation of ``v``: the grid its rule is evaluated on (output elements
    times the terms of its deepest reduction), at least one per output element."""
    elements = math.prod(int(d) for d in v.shape)
    return float(max(elements, info.grid if info is not None else 1))


def program_work(values: Iterable[Value], info_of: Callable[[Value], RuleInfo | None]) -> float:
    """Units of one evaluation of ``values`` (``info_of(v)``: the op's rule at its shapes), with
    :data:`OP_UNITS` per op for what an evaluation spends on an op whatever its size."""
    ops = list(values)
    return sum(op_work(v, info_of(v)) for v in ops) / UNIT + OP_UNITS * len(ops)


def engine_work(engine: BoundsEngine) -> float:
    """Units of one evaluation of the program an interval engine reads (its ops that depend on an input)."""
    return program_work((v for v in engine.live if not v.is_param), lambda v: engine.context(v).info)
