"""The gate the pass manager calls after every pass application that changed the module.

``refuted`` always stops (ProofFailure, with the counterexample table). ``unknown`` stops
under ``strict``; under ``degrade`` the application is rolled back (``accept=False``) and
recorded, and the pipeline continues from the module before it. ``audit`` accepts every
application and only records (for reports that must cover a whole pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuvil.ir.module import Module
from cuvil.passes.base import Pass
from verify.certificate import Report, module_hash
from verify.errors import ProofFailure, ProofIncomplete
from verify.obligations import DEFAULT_TIMEOUT, Application, check_application
from verify.verdict import Refuted

POLICIES = ("strict", "degrade", "audit")


@dataclass
class GateDecision:
    """What the pass manager reads (``accept``), with the evidence behind it."""

    accept: bool
    application: Application
    rolled_back: bool = False


@dataclass
class Gate:
    policy: str = "strict"
    timeout: float = DEFAULT_TIMEOUT
    seed: int = 0
    applications: list[Application] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    first_module: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            from cuvil.errors import CuvilError

            raise CuvilError(f"unknown proof-failure policy {self.policy!r}", location="gate",
                             hint="policies: " + ", ".join(POLICIES))

    def __call__(self, pass_: Pass, before: Module, after: Module) -> GateDecision:
        if self.first_module is None:
            self.first_module = module_hash(before)
        app = check_application(pass_, before, after, timeout=self.timeout, seed=self.seed)
        self.applications.append(app)
        if self.policy == "audit":
            return GateDecision(True, app)
        refuted = app.refuted
        if refuted:
            ce = refuted[0].verdict
            assert isinstance(ce, Refuted)
            raise ProofFailure(f"pass {pass_.name} changed result {refuted[0].function}:{refuted[0].output}\n"
                               f"{ce.counterexample.table()}", location=f"pass {pass_.name}")
        unknown = app.unknown
        if not unknown:
            return GateDecision(True, app)
        if self.policy == "strict":
            reasons = "; ".join(f"{o.function}:{o.output}: {o.verdict.reason}" for o in unknown)  # type: ignore[union-attr]
            raise ProofIncomplete(f"pass {pass_.name} could not be proved: {reasons}", location=f"pass {pass_.name}")
        self.rolled_back.append(pass_.name)
        return GateDecision(False, app, rolled_back=True)

    def report(self, pipeline: list[str] | None = None) -> Report:
        names = pipeline if pipeline is not None else [a.pass_name for a in self.applications]
        return Report(self.first_module or "", names, list(self.applications), list(self.rolled_back))


def make_gate(policy: str = "strict", timeout: float = DEFAULT_TIMEOUT, *, seed: int = 0) -> Gate:
    """A gate for ``PassManager(gate=...)`` / ``run_pipeline(..., gate=...)``."""
    return Gate(policy, timeout, seed)
