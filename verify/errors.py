"""Errors the verifier raises: a failed or incomplete proof stops a gated compile."""

from __future__ import annotations

from cuvil.errors import CuvilError


class ProofFailure(CuvilError):
    """A pass changed a result: the counterexample (replayed on the reference interpreter) is in the message."""

    code = "CUVIL-PROOF-REFUTED"
    default_hint = "the pass is wrong on this model; fix it, or drop it from the pipeline"


class ProofIncomplete(ProofFailure):
    """Under the strict gate, an obligation that was neither proved nor refuted stops compilation."""

    code = "CUVIL-PROOF-UNKNOWN"
    default_hint = ("raise the proof time limit, or use --on-proof-failure=degrade to roll the pass back "
                    "and continue")


class VerifierInconsistency(CuvilError):
    """A proof and a replayed counterexample disagree about one obligation: a bug in Cuvil itself
    (an unsound axiom, an encoder that misreads a rule, or an interpreter fast path that
    disagrees with its rule)."""

    code = "CUVIL-VERIFY-INCONSISTENT"
    default_hint = "please report this with the model and the pass; the verifier cannot be trusted on it"
