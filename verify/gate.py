"""The gate the pass manager calls after every pass application that changed the module.

``refuted`` stops (ProofFailure, with the counterexample table). ``unknown`` stops
under ``strict``; under ``degrade`` the application is rolled back (``accept=False``) and
recorded, and the pipeline continues from the module before it. ``audit`` accepts every
application and only records (for reports that must cover a whole pipeline). A degrade gate
made with ``roll_back_refuted=True`` (``compile --on-proof-failure=degrade``) also rolls a
refuted application back instead of stopping: what is emitted is then the pipeline without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cuvil.ir.hashing import module_hash
from cuvil.ir.module import Module
from cuvil.passes.base import Pass
from verify.certificate import Verification
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
    roll_back_refuted: bool = False
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    """Per rolled-back application: the pass, the application's index and why."""
    _modules: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            from cuvil.errors import InputError

            raise InputError(f"unknown proof-failure policy {self.policy!r}", location="gate",
                             hint="policies: " + ", ".join(POLICIES))

    def __call__(self, pass_: Pass, before: Module, after: Module) -> GateDecision:
        self._modules.append(module_hash(before))
        if self.first_module is None:
            self.first_module = self._modules[0]
        app = check_application(pass_, before, after, timeout=self.timeout, seed=self.seed)
        self.applications.append(app)
        if self.policy == "audit":
            return GateDecision(True, app)
        refuted = app.refuted
        if refuted and self.policy == "degrade" and self.roll_back_refuted:
            first = refuted[0]
            return self._roll_back(pass_.name, app, f"refuted at {first.function}:{first.output}")
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
        reason = "; ".join(f"unknown at {o.function}:{o.output}: {o.verdict.reason}"  # type: ignore[union-attr]
                           for o in unknown)
        return self._roll_back(pass_.name, app, reason)

    def _roll_back(self, name: str, app: Application, reason: str) -> GateDecision:
        self.rolled_back.append(name)
        self.rollbacks.append({"pass": name, "application": len(self.applications) - 1, "reason": reason})
        return GateDecision(False, app, rolled_back=True)

    def __repr__(self) -> str:
        """Stable across runs and independent of what was checked: the compile cache keys on it."""
        extra = ", roll_back_refuted=True" if self.roll_back_refuted else ""
        return f"Gate(policy={self.policy!r}, timeout={self.timeout!r}, seed={self.seed!r}{extra})"

    def mark(self) -> int:
        """A position in the record: :meth:`report` with ``since=mark`` covers only later applications."""
        return len(self.applications)

    def report(self, pipeline: list[str] | None = None, *, since: int = 0) -> Verification:
        apps = self.applications[since:]
        names = pipeline if pipeline is not None else [a.pass_name for a in apps]
        rollbacks = [dict(r, application=r["application"] - since) for r in self.rollbacks
                     if r["application"] >= since]
        first = self._modules[since] if since < len(self._modules) else ""
        return Verification(first, names, list(apps), [r["pass"] for r in rollbacks], rollbacks, policy=self.policy)


def make_gate(policy: str = "strict", timeout: float = DEFAULT_TIMEOUT, *, seed: int = 0,
              roll_back_refuted: bool = False) -> Gate:
    """A gate for ``PassManager(gate=...)`` / ``run_pipeline(..., gate=...)``."""
    return Gate(policy, timeout, seed, roll_back_refuted=roll_back_refuted)
