"""What a fail-safe spec says, once read and checked (:mod:`failsafe.load` reads the YAML).

A spec names the **state** (real variables with ranges and units), **constants**, **faults**
(conditions a monitor can see: a sensor lost, latency above budget, an input outside the box the
proofs cover, a non-finite output, a proof missing), and **modes** in order of capability, most
capable first (nominal, degraded levels, a minimal-risk manoeuvre). Each fault states what holds
while it is absent (``nominal``: latency <= 0.1) and may state what still holds while it is present
(``active``). A mode may be unavailable under some faults (``requires``), enforces assumptions on
the state (``assume``: speed <= cap), may define derived quantities, and has **parameters** to
synthesize, each with an objective (maximize a speed cap, minimize a margin). **Invariants** must
hold in every state the scenario allows under the chosen mode.

A **scenario** is a set of active faults. The policy picks, per scenario, the most capable mode
whose best parameters make every invariant hold for every state in range: an exists-forall
problem (:mod:`failsafe.synth`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from failsafe.expr import Expr

FAULT_KINDS = ("sensor", "latency", "input-box", "non-finite", "proof", "other")
OBJECTIVES = ("maximize", "minimize")


@dataclass(frozen=True)
class StateVar:
    name: str
    lo: float
    hi: float
    unit: str = ""


@dataclass(frozen=True)
class Fault:
    """``nominal`` holds while the fault is absent, ``active`` while it is present (None: nothing)."""

    name: str
    kind: str = "other"
    description: str = ""
    nominal: Expr | None = None
    active: Expr | None = None


@dataclass(frozen=True)
class Parameter:
    """A mode parameter to synthesize in ``[lo, hi]``; ``objective`` orders its values (None: any)."""

    name: str
    lo: float
    hi: float
    objective: str | None = None
    unit: str = ""


@dataclass(frozen=True)
class Mode:
    """``requires`` (over fault flags) says when the mode is available; ``assume`` is what the mode
    enforces on the state (may read parameters); ``define`` adds derived quantities for the
    invariants (may read state, constants, parameters and earlier definitions)."""

    name: str
    description: str = ""
    requires: Expr | None = None
    parameters: tuple[Parameter, ...] = ()
    assume: tuple[Expr, ...] = ()
    define: Mapping[str, Expr] = field(default_factory=dict)


@dataclass(frozen=True)
class Invariant:
    name: str
    expr: Expr
    description: str = ""


@dataclass(frozen=True)
class DecisionModel:
    """A policy network the spec trusts where proved: its inputs are state variables (in order),
    its outputs become names the invariants read."""

    path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Spec:
    name: str
    state: tuple[StateVar, ...]
    faults: tuple[Fault, ...]
    modes: tuple[Mode, ...]  # most capable first
    invariants: tuple[Invariant, ...]
    constants: Mapping[str, float] = field(default_factory=dict)
    define: Mapping[str, Expr] = field(default_factory=dict)  # derived quantities of every mode
    model: DecisionModel | None = None
    source: str = ""
    digest: str = ""  # sha256 of the spec file as read

    def state_var(self, name: str) -> StateVar:
        return next(v for v in self.state if v.name == name)

    def mode(self, name: str) -> Mode:
        return next(m for m in self.modes if m.name == name)

    def scenarios(self) -> Iterator[frozenset[str]]:
        """Every set of active faults, fewest first, in the order the faults are declared."""
        names = [f.name for f in self.faults]
        for k in range(len(names) + 1):
            for combo in itertools.combinations(names, k):
                yield frozenset(combo)


def scenario_label(faults: frozenset[str], order: tuple[str, ...] | list[str]) -> str:
    """``"none"`` or the active faults joined with ``+`` in declaration order."""
    active = [f for f in order if f in faults]
    return "+".join(active) if active else "none"
