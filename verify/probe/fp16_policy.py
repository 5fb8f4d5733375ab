"""Which ops an FP16 build may run in float16: only those whose sites are proved safe.

``fp16_safe_ops`` starts from "everything in float16", probes the bounds (no witness search:
a decision needs a proof, not a counterexample), keeps every op with an unsafe site in
float32, and repeats until every float16 site left is proved safe (keeping an op wide can
move a boundary cast, which is itself a site). ``fp16_module`` builds that program.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.printer import value_names
from cuvil.ir.values import Value
from verify.probe.probe import Analysis, ProbeOptions
from verify.probe.program import reduced_program, uses_of


@dataclass(frozen=True)
class Decision:
    """One float32 op of the model: the precision it runs in, and why."""

    value: Value
    name: str
    op: str
    precision: str  # "fp16" | "fp32"
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"value": self.name, "op": self.op, "precision": self.precision, "reason": self.reason}


def fp16_module(module: Module, kept: frozenset[Value] | set[Value]) -> Module:
    """``module`` with every float32 op except ``kept`` (and casts) in float16."""
    return reduced_program(module, "fp16", keep_ops=("cast",), keep_values=kept).module


def fp16_safe_ops(module: Module, ranges: Mapping[str, tuple[Any, Any]], *, refine: bool = True,
                  time_limit: float = 60.0, max_rounds: int = 50) -> tuple[frozenset[Value], list[Decision]]:
    """The ops of ``module`` to keep in float32 for inputs in ``ranges``, and a decision per float32 op.

    Every op not kept has all its float16 sites proved safe; ops that cannot run in float16 at all
    (constants out of range, non-float32 operands) are reported as kept for that reason."""
    deadline = time.monotonic() + time_limit
    fn = module.main
    names = value_names(fn)
    keep: set[Value] = set()
    why: dict[Value, str] = {}
    options = ProbeOptions(precision="fp16", keep_ops=("cast",), refine=refine, search=False, boundary=False)
    program = reduced_program(module, "fp16", keep_ops=("cast",), keep_values=keep)
    for _ in range(max_rounds):
        program = reduced_program(module, "fp16", keep_ops=("cast",), keep_values=keep)
        if time.monotonic() > deadline:
            unsafe_all = [v for v in program.function.ops() if v.dtype is DType.f16]
            new = {program.origin[v] for v in unsafe_all if program.origin.get(v) in set(fn.ops())} - keep
            for v in new:
                why[v] = "time limit reached before its sites were proved"
            keep |= new
            program = reduced_program(module, "fp16", keep_ops=("cast",), keep_values=keep)
            break
        analysis = Analysis(program, ranges, options)
        bounds, _ = analysis.bounds(1.0, deadline=deadline)
        uses = uses_of(program.function)
        new: set[Value] = set()
        for v, ob in bounds.ops.items():
            if not ob.records or ob.safe:
                continue
            worst = max(ob.records.values(), key=lambda r: r.excess)
            detail = f"bound [{worst.lo:.4g}, {worst.hi:.4g}]{' may be NaN' if worst.nan else ''} at " \
                     f"{'its result' if worst.node == 0 else worst.label}"
            boundary = _is_boundary(v, program.origin) and v.dtype is DType.f16
            for target in _owners(v, program.origin, uses, fn):
                if target not in keep:
                    new.add(target)
                    src = names.get(program.origin.get(v), "?")
                    why.setdefault(target, f"its operand {src} does not fit float16 ({detail.split(' at ')[0]})"
                                   if boundary else f"f16 site not proved safe: {detail}")
        if not new:
            break
        keep |= new
    kept_ops = {program.origin[v] for v in program.function.ops() if v.dtype is DType.f32
                and program.origin.get(v) is not None and not _is_boundary(v, program.origin)}
    decisions = []
    for v in fn.ops():
        if v.dtype is not DType.f32:
            continue
        if v in keep:
            decisions.append(Decision(v, names[v], v.op, "fp32", why.get(v, "kept")))
        elif v in kept_ops or v.op == "cast":
            decisions.append(Decision(v, names[v], v.op, "fp32", "cannot run in float16 (cast target, "
                                                                  "constant out of range or mixed operand types)"))
        else:
            decisions.append(Decision(v, names[v], v.op, "fp16", "every float16 site proved safe"))
    return frozenset(keep), decisions


def _is_boundary(v: Value, origin: Mapping[Value, Value]) -> bool:
    """A cast the conversion inserted (its origin is the value it converts, not a cast of the model)."""
    o = origin.get(v)
    return v.op == "cast" and (o is None or o.op != "cast" or o.dtype is not v.dtype)


def _owners(v: Value, origin: Mapping[Value, Value], uses: Mapping[Value, list[Value]], fn: Any) -> list[Value]:
    """The model ops to keep wide for an unsafe site: the op itself, or, for a boundary cast into
    float16, the ops consuming it (their input does not fit float16)."""
    ops = set(fn.ops())
    if _is_boundary(v, origin) and v.dtype is DType.f16:
        return [origin[u] for u in uses.get(v, []) if origin.get(u) in ops]
    o = origin.get(v)
    return [o] if o in ops else []
