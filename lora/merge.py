"""Merging adapters into a CIR module with a proof: the adapters are attached unmerged
(:mod:`lora.attach`), ``merge-low-rank`` folds every update into its weight and ``fold-constants``
materializes the merged weights, each application checked by the verifier under the gate's policy
(``real``: equal over the reals), and the floating-point distance between the merged and the
unmerged computation bounded per adapted op (:mod:`lora.merge_bound`). The certificate holds all
of it; nothing is merged that the adapter checks refuse."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes.manager import run_pipeline
from lora.adapter import Adapter
from lora.attach import Attachment, WeightedAdapter, attach
from lora.base import BaseModel
from lora.checks import AdapterCheck, check_adapter
from lora.errors import AdapterError, AdapterRefused
from lora.merge_bound import SiteBound, site_bounds
from lora.model_bound import ModelBound, model_bound
from verify.certificate import Verification, seal
from verify.gate import make_gate
from verify.obligations import DEFAULT_TIMEOUT
from verify.probe.fp16_policy import normalize_ranges

MERGE_PIPELINE = ("merge-low-rank", "fold-constants")


@dataclass
class LoraMerge:
    """The unmerged and merged modules, what was attached, the verifier's record and the bounds."""

    unmerged: Module
    merged: Module
    attachments: list[Attachment]
    verification: Verification
    bounds: list[SiteBound]
    checks: list[AdapterCheck]
    ranges: dict[str, tuple[float, float]] | None = None
    model_bound: ModelBound | None = None
    """The end-to-end bound for inputs in ``ranges`` (None: no box declared, or not stated)."""

    @property
    def max_per_unit(self) -> float:
        """The largest per-op bound per unit of the op's ``max |x|``."""
        return max((b.max_per_unit for b in self.bounds), default=0.0)

    def certificate(self) -> dict[str, Any]:
        cert = self.verification.certificate()
        cert["lora"] = {
            "adapters": sorted({a.adapter for a in self.attachments}),
            "modules": [{"module": a.module, "kind": a.kind, "rank": a.rank, "scale": a.scale, "dora": a.dora,
                         "sites": len(a.sites)} for a in self.attachments],
            "input_box": {k: list(v) for k, v in (self.ranges or {}).items()} or None,
            "error_bound": {
                "meaning": "per adapted op, |merged output - unmerged output| for the same input x to that op, "
                           "float rounding included: at most per_unit_max_abs_x * max|x| for every input, and "
                           "absolute_in_box for model inputs in input_box; valid where the unmerged values are "
                           "finite",
                "max_per_unit_max_abs_x": self.max_per_unit,
                "sites": [b.to_json() for b in self.bounds],
                "model": self.model_bound.to_json() if self.model_bound is not None else None},
        }
        return seal(cert)


def as_weighted(adapters: Adapter | WeightedAdapter | Sequence[Adapter | WeightedAdapter]) -> list[WeightedAdapter]:
    items = [adapters] if isinstance(adapters, (Adapter, WeightedAdapter)) else list(adapters)
    return [a if isinstance(a, WeightedAdapter) else WeightedAdapter(a) for a in items]


def checked(adapters: list[WeightedAdapter], base: BaseModel, dtype: str) -> list[AdapterCheck]:
    """Every adapter's checks; an adapter that fails one is refused with its first errors."""
    out = []
    for w in adapters:
        check = check_adapter(w.adapter, base, dtype=dtype)
        if check.errors:
            first = "; ".join(f.message for f in check.errors[:3])
            more = f" (and {len(check.errors) - 3} more)" if len(check.errors) > 3 else ""
            raise AdapterRefused(f"the adapter fails {len(check.errors)} check(s): {first}{more}",
                                 location=str(w.adapter.directory))
        out.append(check)
    return out


def merge_adapters(module: Module, base: BaseModel,
                   adapters: Adapter | WeightedAdapter | Sequence[Adapter | WeightedAdapter], *,
                   dtype: str = "fp32", ranges: Mapping[str, tuple[float, float]] | None = None,
                   policy: str = "strict", timeout: float = DEFAULT_TIMEOUT) -> LoraMerge:
    """Check, attach, merge with every pass application verified, and bound the merge's rounding.

    ``policy`` is the gate's: ``strict`` raises when a step is refuted or unproved, ``audit``
    records it. ``dtype`` is the precision the merged weights ship in (the checks refuse merges
    that overflow it)."""
    weighted = as_weighted(adapters)
    checks = checked(weighted, base, dtype)
    unmerged, attachments = attach(module, base, weighted)
    gate = make_gate(policy, timeout)
    merged = run_pipeline(unmerged, MERGE_PIPELINE, gate=gate).module
    _all_merged(merged, attachments)
    box = normalize_ranges(unmerged, ranges) if ranges else None
    result = LoraMerge(unmerged, merged, attachments, gate.report(list(MERGE_PIPELINE)),
                       site_bounds(unmerged, attachments, base, weighted, box), checks, box)
    if box is not None:
        result.model_bound = _model_bound(result, base, weighted, box)
    return result


def _model_bound(result: LoraMerge, base: BaseModel, weighted: list[WeightedAdapter],
                 box: Mapping[str, tuple[float, float]]) -> ModelBound | None:
    """The end-to-end bound (:mod:`lora.model_bound`); None where a weight carries more than one adapter's
    update (the per-op bound is stated per adapter)."""
    per_site = {(b.module, b.site): b for b in result.bounds}
    by_hash: dict[tuple[str, str], list[SiteBound]] = {}
    for sw in site_weights(result, base, weighted):
        by_hash.setdefault((sw.const_hash, sw.op.op), []).append(per_site[(sw.module, sw.site)])
    if any(len({b.module for b in group}) > 1 for group in by_hash.values()):
        return None
    readers: dict[Value, SiteBound] = {}
    for v in result.merged.main.ops():
        for operand in v.operands:
            group = by_hash.get((operand.const_hash, v.op)) if operand.is_const else None
            if group:
                readers[v] = max(group, key=lambda b: b.max_per_unit)
    if len(readers) != sum(len(a.attached) for a in result.attachments):
        return None  # an adapted op not found by its merged weight: a difference the bound would miss
    return model_bound(result.merged.main, result.merged.constants, box, readers)


def _all_merged(merged: Module, attachments: list[Attachment]) -> None:
    """No low-rank factor may be left in the merged module: judged by content, not by what the pass said."""
    used = merged.used_constants()
    left = [att.module for att in attachments if att.factors & used]
    if left:
        raise AdapterError(f"the update of {len(left)} module(s) stays unmerged: {', '.join(left[:5])}",
                           hint="the model reads these weights in a form merge-low-rank does not recognize")


def site_weights(result: LoraMerge, base: BaseModel,
                 adapters: Adapter | WeightedAdapter | Sequence[Adapter | WeightedAdapter]) -> list[SiteWeight]:
    """The merged weight each adapted op reads, as the op reads it, bit for bit what the proved merge
    holds: each site is merged again on its own by the same passes, and its weight must be one of the
    merged module's constants (checked by content)."""
    weighted = {str(w.adapter.directory): w for w in as_weighted(adapters)}
    used = result.merged.used_constants()
    out = []
    for att in result.attachments:
        for k, site in enumerate(att.attached):
            _, merged = site_programs(site, att, base, weighted[att.adapter], result.unmerged.constants)
            weight_at = _weight_at(site)
            (reader,) = [v for v in merged.main.ops() if merged.main.params[0] in v.operands]
            weight = reader.operands[weight_at]
            if not weight.is_const or weight.const_hash not in used:
                raise RuntimeError(f"the merged weight of {att.module!r} (site {k}) is not one the proved merge "
                                   "holds")
            out.append(SiteWeight(att.module, k, site, np.asarray(merged.constant(weight)), weight.const_hash))
    return out


def _weight_at(site: Value) -> int:
    """Where an adapted op reads its weight: ``matmul(x, W)``, ``conv(x, W)``; ``embedding`` / ``gather(T, ids)``."""
    return 1 if site.op in ("matmul", "conv") else 0


def site_programs(site: Value, att: Attachment, base: BaseModel, adapter: WeightedAdapter,
                  constants: Mapping[str, np.ndarray]) -> tuple[Module, Module]:
    """One adapted op alone, on a parameter standing for its input (``x`` of a matmul, the ids of a lookup):
    with the adapter attached, and merged by the same passes as the whole model."""
    b = Builder(constants)
    weight_at = _weight_at(site)
    operand = site.operands[1 - weight_at]
    param = b.param("input", operand.dtype, operand.shape)
    ops = [param, site.operands[1]] if weight_at == 1 else [site.operands[0], param]
    one = b.module(b.function("main", [param], [b.op(site.op, *ops, **site.attr_dict)]))
    attached, _ = attach(one, base, [adapter], only={att.module})
    return attached, run_pipeline(attached, MERGE_PIPELINE).module


@dataclass(frozen=True)
class SiteWeight:
    """The merged weight read at one adapted op, in the layout that op reads its weight operand."""

    module: str
    site: int
    op: Value  # the op in the unmerged module
    weight: np.ndarray
    const_hash: str = ""
    """The merged module's constant holding ``weight``."""
