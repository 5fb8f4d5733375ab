"""Translation validation and overflow probing over CIR (z3-backed).

``check_pass(pass_, module)`` and ``check_pipeline(module, pipeline)`` prove each pass
application equivalent (or refute it with a replayed counterexample) and return a
:class:`Verification` with a certificate; ``make_gate(policy=...)`` plugs the same check into the
pass manager.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.ir.hashing import module_hash
from cuvil.ir.module import Module
from cuvil.passes.base import Contract, Pass
from verify.certificate import Verification
from verify.errors import ProofFailure, ProofIncomplete, VerifierInconsistency
from verify.gate import Gate, GateDecision, make_gate
from verify.obligations import DEFAULT_TIMEOUT, Application, ObligationRecord, check_application
from verify.verdict import Counterexample, Proved, Refuted, Unknown, Verdict


def check_pass(pass_: Pass, module: Module, *, timeout: float = DEFAULT_TIMEOUT, seed: int = 0,
               search: str = "both") -> Verification:
    """Run ``pass_`` on ``module`` and check that application (``search``: see
    ``verify.obligations.SEARCH_MODES``)."""
    from cuvil.passes.manager import content_changed

    out = pass_.run(module)
    report = Verification(module_hash(module), [pass_.name])
    if content_changed(module, out.module):
        report.applications.append(check_application(pass_, module, out.module, timeout=timeout, seed=seed,
                                                      search=search))
    return report


def check_rewrite(before: Module, after: Module, contract: Contract | str = Contract.EXACT, *, name: str = "rewrite",
                  timeout: float = DEFAULT_TIMEOUT, seed: int = 0) -> Verification:
    """Check ``before -> after`` under ``contract`` as if a pass called ``name`` had made it
    (rewrites written by hand, before/after pairs from a corpus)."""
    contract = Contract(contract) if isinstance(contract, str) else contract
    rewrite = type("Rewrite", (Pass,), {"name": name, "contract": contract})()
    report = Verification(module_hash(before), [name])
    report.applications.append(check_application(rewrite, before, after, timeout=timeout, seed=seed))
    return report


def check_pipeline(module: Module, pipeline: str | Sequence[str | Pass], *, policy: str = "audit",
                   timeout: float = DEFAULT_TIMEOUT, seed: int = 0, jobs: int = 1) -> Verification:
    """Run a pipeline with every application checked. ``audit`` (the default) keeps every pass and
    reports; ``strict`` / ``degrade`` behave as the gate does. Under ``audit``, ``jobs > 1`` checks
    the applications in that many worker processes (same verdicts as ``jobs=1``)."""
    from cuvil.passes.manager import PassManager, parse_pipeline

    passes = parse_pipeline(pipeline)
    if policy == "audit" and jobs != 1:
        from verify.batch import check_all, collect

        pending, _ = collect(module, passes)
        apps = check_all(pending, timeout=timeout, seed=seed, jobs=jobs)
        return Verification(module_hash(module), [p.name for p in passes], apps, policy="audit")
    gate = make_gate(policy, timeout, seed=seed)
    PassManager(passes, gate=gate).run(module)
    report = gate.report([p.name for p in passes])
    report.module = module_hash(module)
    return report


__all__ = [
    "DEFAULT_TIMEOUT",
    "Application",
    "Counterexample",
    "Gate",
    "GateDecision",
    "ObligationRecord",
    "ProofFailure",
    "ProofIncomplete",
    "Proved",
    "Refuted",
    "Unknown",
    "Verdict",
    "Verification",
    "VerifierInconsistency",
    "check_application",
    "check_pass",
    "check_pipeline",
    "check_rewrite",
    "make_gate",
    "module_hash",
]
