"""Overflow probing: where a reduced-precision (FP16/BF16/INT8) version of a model can overflow or
saturate, proofs for the sites that cannot, and witness inputs for those that do.

* :mod:`.bounds` / :mod:`.interval`: sound bounds by reading every op's compute rule with
  interval semantics (plus relational facts of normalized patterns);
* :mod:`.linear`: tighter bounds by back-substitution through affine and ReLU-like chains;
* :mod:`.witness` / :mod:`.torch_eval`: gradient-guided witness search and confirmation on the
  reduced-precision program;
* :mod:`.probe`: verdicts per site and the boundary scale; :mod:`.fp16_policy`: which ops an
  FP16 build keeps in float32; :mod:`.budget`: the work units every phase spends;
* :mod:`.difference`: how far two programs that differ at a few ops may drift apart (a merged
  and an unmerged LoRA model), rounding of both included.
"""

from verify.probe.fp16_policy import Decision, fp16_module, fp16_safe_ops
from verify.probe.probe import Boundary, ProbeOptions, ProbeReport, SiteResult, probe, save_witnesses
from verify.probe.program import Program, reduced_program
from verify.probe.report import to_report

__all__ = ["Boundary", "Decision", "ProbeOptions", "ProbeReport", "Program", "SiteResult", "fp16_module",
           "fp16_safe_ops", "probe", "reduced_program", "save_witnesses", "to_report"]
