"""An adapter check as a :class:`reports.Report`: one result per finding and one per module
measured, so the terminal, JSON, SARIF and HTML renderers show it like every other check."""

from __future__ import annotations

from typing import Any

from lora.checks import AdapterCheck, Finding
from reports.model import Evidence, Location, Report, Result, Rule

_RULES = (
    ("lora-key", "Key PEFT applies", "Every tensor key is one PEFT's loader applies to the model.",
     "A key with a doubled or missing 'base_model.model.' prefix or a torch.compile '_orig_mod.' is silently "
     "skipped by PEFT: save the adapter from the plain PEFT model."),
    ("lora-module", "Module of the base, targeted",
     "Every adapted module exists in the base model and is selected by target_modules.",
     "Check the base model and target_modules."),
    ("lora-missing", "Complete factors",
     "Every targeted module has lora_A and lora_B (and a magnitude vector under DoRA).",
     "The adapter file is incomplete: save it again."),
    ("lora-shape", "Shapes fit the base",
     "Factor shapes agree with the base weight and the rank, and no tensor is empty.",
     "The adapter was trained for another model or rank."),
    ("lora-dtype", "Float factors", "Factors are floating-point tensors.", ""),
    ("lora-config", "Config agrees with tensors", "The config describes the tensors present.", ""),
    ("lora-finite", "Finite values", "Every adapter and base value is finite.", ""),
    ("lora-base-identity", "The base it was trained on",
     "The base model is the one the adapter records (name, revision, saved copies of base weights).", ""),
    ("lora-base-content", "The base weights it was stamped with",
     "Each base weight the adapter recorded a digest of (cuvil lora stamp) has that digest.",
     "The adapter was made for other weights: find the base it was stamped with."),
    ("lora-merge-overflow", "Merge fits the dtype", "Every merged weight element is finite in the target dtype.",
     "Merge in a wider dtype, or keep the adapter unmerged."),
    ("lora-merge-precision", "Merge keeps precision",
     "Merged elements keep the target dtype's relative precision (not subnormal).", ""),
    ("lora-module-measured", "Module merged and measured",
     "The module passes every check; its scale, update size and merged range are recorded.", ""),
)
RULES = {r[0]: Rule(*r) for r in _RULES}


def _finding_result(k: int, f: Finding) -> Result:
    metrics: dict[str, Any] = {"severity": f.severity}
    if f.expected is not None:
        metrics["expected"] = str(f.expected)
    if f.found is not None:
        metrics["found"] = str(f.found)
    evidence = [Evidence("elements", f"{len(f.elements)} elements listed",
                         values={f"{e['index']}": e["value"] for e in f.elements})] if f.elements else []
    return Result(f"F{k + 1}", f.rule, "fail" if f.severity == "error" else "pass",
                  f.message if f.severity == "error" else f"warning: {f.message}",
                  Location(component=f.module, value=f.tensor), metrics, evidence)


def to_report(check: AdapterCheck, *, version: str = "", settings: dict[str, Any] | None = None) -> Report:
    results = [_finding_result(k, f) for k, f in enumerate(check.findings)]
    failed = {f.module for f in check.errors}
    for k, m in enumerate(check.modules):
        if m.module in failed:
            continue
        results.append(Result(f"M{k + 1}", "lora-module-measured", "pass",
                              f"{m.module}: {m.kind}, rank {m.rank}, scale {m.scale:.6g}"
                              + (", DoRA" if m.dora else ""),
                              Location(component=m.module),
                              {"rank": m.rank, "scale": m.scale, "update_norm_ratio": m.update_norm_ratio,
                               "merged_max": m.merged_max, "bound_max": m.bound_max}))
    used = sorted({r.rule for r in results})
    return Report("lora check", {"adapter": check.adapter, "base": check.base, "dtype": check.dtype},
                  results, [RULES[r] for r in used if r in RULES], tool={"name": "cuvil", "version": version},
                  settings=dict(settings or {}), timings={"check_s": round(check.seconds, 4)})
