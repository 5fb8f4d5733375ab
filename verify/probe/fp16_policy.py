"""Which ops an FP16 build may run in float16: only those whose sites are proved safe.

``fp16_safe_ops`` starts from "everything in float16", probes the bounds (no witness search:
a decision needs a proof, not a counterexample), keeps every op with an unsafe site in
float32, and repeats until every float16 site left is proved safe (keeping an op wide can
move a boundary cast, which is itself a site). ``fp16_module`` builds that program, and
``plan_fp16`` does both for a compile: the program, the decision per op, and what the
artifact manifest records about them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.errors import InputError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.printer import value_names
from cuvil.ir.values import Value
from cuvil.passes.fp16 import fits, is_boundary_cast
from verify.errors import ProofIncomplete
from verify.probe.budget import PLAN_EFFORT, Budget
from verify.probe.probe import Analysis, ProbeOptions
from verify.probe.program import DEFAULT_KEEP, max_finite, reduced_program, without_loops

F16_MAX = max_finite(DType.f16)

POLICY = "fp16-where-proved"
"""The manifest's name for the rule: an op runs in float16 only if every site it has there is proved
finite for the declared input ranges; every other float32 op stays float32."""

HALF_SEMANTICS: dict[str, str] = {
    **dict.fromkeys(("matmul", "conv", "conv_transpose"),
                    "float16 operands widened to float32 (exact products), summed in float32 in order, rounded "
                    "once, as PyTorch and ONNX Runtime accumulate"),
    "reduce_sum": "float32 accumulation rounded once; a sum past 65504 is inf in float16, as torch.sum's",
    **dict.fromkeys(("reduce_mean", "avg_pool"), "float32 sum divided in float32, rounded once, as PyTorch and "
                                                 "ONNX Runtime"),
    **dict.fromkeys(("softmax", "log_softmax", "layer_norm"),
                    "computed in float32 and rounded once, as PyTorch's fused kernels and ONNX Runtime "
                    "(stash_type float32)"),
    "cumsum": "a float32 running sum, each output rounded once, as PyTorch's",
    **dict.fromkeys(("lp_pool", "lrn"),
                    "every step of the sum rounded to float16 (PyTorch and ONNX Runtime accumulate in float32: "
                    "results may differ by the rounding of the partial sums)"),
}
"""What an op computes when it runs in float16 (its rule says it; this is the manifest's account), for the
ops whose half-precision arithmetic engines do not all share. Elementwise ops round every result to
float16, as every engine does."""


PROVED, UNPROVED, CONSTANT, TYPE = "proved", "unproved", "constant", "type"
"""Why an op runs where it does: ``proved`` (float16, every site proved), ``unproved`` (a site was not
proved finite, or the time limit came first), ``constant`` (a constant operand exceeds float16's
range) or ``type`` (not a float32 computation float16 applies to: a cast keeps its declared type, an
op with integer or mixed-type operands, an op float16 does not define)."""


@dataclass(frozen=True)
class Decision:
    """One float32 op of the model: the precision it runs in, and why."""

    value: Value
    name: str
    op: str
    precision: str  # "fp16" | "fp32"
    reason: str
    cause: str = PROVED

    @property
    def unsafe(self) -> bool:
        """Kept in float32 because float16 could not be shown safe (as opposed to not applying)."""
        return self.cause in (UNPROVED, CONSTANT)


class Fp16Unproved(ProofIncomplete):
    """A gated FP16 compile found ops whose float16 sites are not proved safe: nothing is emitted."""

    code = "CUVIL-FP16-UNPROVED"
    default_hint = ("narrow the declared ranges (--range NAME=LO:HI), or compile without --gate to keep "
                    "these ops in float32 (the rest still runs in float16)")


def fp16_module(module: Module, kept: frozenset[Value] | set[Value]) -> Module:
    """``module`` with every float32 op except ``kept`` (and casts) in float16: the program the
    prober analyses, built by the FP16 pass's construction."""
    return reduced_program(without_loops(module), "fp16", keep_values=kept).module


def fp16_safe_ops(module: Module, ranges: Mapping[str, tuple[Any, Any]], *, refine: bool = True,
                  effort: float = PLAN_EFFORT, time_limit: float = 600.0, max_rounds: int | None = None
                  ) -> tuple[frozenset[Value], list[Decision]]:
    """The ops of ``module`` to keep in float32 for inputs in ``ranges``, and a decision per float32 op.

    Every op not kept has all its float16 sites proved safe; ops that cannot run in float16 at all
    (constants out of range, non-float32 operands) are reported as kept for that reason. Each round
    keeps at least one more op, so the loop ends by itself; ``max_rounds`` (default: as many as the
    function has ops), the work budget ``effort`` (units, :mod:`.budget`: the same plan on any machine) and
    the outer guard ``time_limit`` (seconds) end it early, keeping every float16 op left unproved."""
    budget = Budget(effort, time.monotonic() + time_limit, phase="fp16 planning")
    module = without_loops(module)  # the ops to keep are those of every iteration
    fn = module.main
    ops = set(fn.ops())
    names = value_names(fn)
    keep: set[Value] = set()
    why: dict[Value, str] = {}
    options = ProbeOptions(precision="fp16", keep_ops=DEFAULT_KEEP, refine=refine, search=False, boundary=False)
    rounds = max_rounds if max_rounds is not None else len(ops) + 1
    converged = False
    program = reduced_program(module, "fp16", keep_values=keep)
    for _ in range(rounds):
        program = reduced_program(module, "fp16", keep_values=keep)
        analysis = Analysis(program, ranges, options)
        if budget.exhausted or budget.left < analysis.pass_units:  # a round is only started when it can end
            break
        bounds, _ = analysis.bounds(1.0, budget)
        uses = program.function.users()
        new: set[Value] = set()
        for v, ob in bounds.ops.items():
            if not ob.records or ob.safe:
                continue
            worst = max(ob.records.values(), key=lambda r: r.excess if math.isfinite(r.excess) else math.inf)
            bound = f"bound [{worst.lo:.6g}, {worst.hi:.6g}]{' (may be NaN)' if worst.nan else ''}"
            where = "its result" if worst.node == 0 else worst.label
            boundary = is_boundary_cast(v, program.origin) and v.dtype is DType.f16
            for target in _owners(v, program.origin, uses, ops):
                if target not in keep:
                    new.add(target)
                    src = names.get(program.origin.get(v), "?")  # type: ignore[arg-type]
                    why.setdefault(target, f"not proved: its float32 operand {src} may not fit float16 ({bound})"
                                   if boundary else
                                   f"not proved: {bound} at {where} exceeds float16's finite range "
                                   f"(+-{F16_MAX:g})")
        if not new:
            converged = True
            break
        keep |= new
    if not converged:  # out of time or rounds: every op still in float16 is unproved, so it stays wide
        left = {program.origin[v] for v in program.function.ops()
                if v.dtype is DType.f16 and program.origin.get(v) in ops and not is_boundary_cast(v, program.origin)}
        for v in left - keep:
            why[v] = ("not proved: the time limit was reached before its sites were proved" if budget.cut else
                      "not proved: the work budget was spent before its sites were proved")
        keep |= left
        program = reduced_program(module, "fp16", keep_values=keep)
    kept_ops = {program.origin[v] for v in program.function.ops() if v.dtype is DType.f32
                and program.origin.get(v) is not None and not is_boundary_cast(v, program.origin)}
    from cuvil.ir.builder import Builder

    b = Builder(module.constants)
    decisions = []
    for v in fn.ops():
        if v.dtype is not DType.f32:
            continue
        if v in keep:
            decisions.append(Decision(v, names[v], v.op, "fp32", why.get(v, "not proved"), UNPROVED))
        elif v in kept_ops or v.op in DEFAULT_KEEP:
            cause, reason = _structural_reason(v, b)
            decisions.append(Decision(v, names[v], v.op, "fp32", reason, cause))
        else:
            decisions.append(Decision(v, names[v], v.op, "fp16", "every float16 site proved safe", PROVED))
    return frozenset(keep), decisions


def _structural_reason(v: Value, b: Any) -> tuple[str, str]:
    """Why a float32 op the policy did not keep still runs in float32 (a type or constant reason)."""
    if v.op in DEFAULT_KEEP:
        return TYPE, f"a {v.op} keeps its declared target type"
    floats = [o for o in v.operands if o.dtype.is_float]
    if not floats or any(o.dtype is not DType.f32 for o in floats):
        return TYPE, "not a float32 computation (integer or mixed-type operands)"
    if not all(fits(b, o, F16_MAX) for o in floats):
        return CONSTANT, f"a constant operand exceeds float16's finite range (+-{F16_MAX:g})"
    return TYPE, "the op is not defined on float16 operands"


def _owners(v: Value, origin: Mapping[Value, Value], uses: Mapping[Value, list[Value]], ops: set[Value]
            ) -> list[Value]:
    """The model ops to keep wide for an unsafe site: the op itself, or, for a boundary cast into
    float16, the ops consuming it (their input does not fit float16)."""
    if is_boundary_cast(v, origin) and v.dtype is DType.f16:
        return [origin[u] for u in uses.get(v, []) if origin.get(u) in ops]
    o = origin.get(v)
    return [o] if o in ops else []


# --------------------------------------------------------------------------------------
# a compile's plan


def normalize_ranges(module: Module, ranges: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """``ranges`` checked against the inputs of ``module``: one finite, non-empty ``(lo, hi)`` per input."""
    names = [p.name for p in module.main.params]
    unknown = sorted(set(ranges) - set(names))
    if unknown:
        raise InputError(f"a range is declared for {', '.join(map(repr, unknown))}, which is not an input of "
                         "the model", location="ranges", hint="inputs: " + ", ".join(names))
    missing = [n for n in names if n not in ranges]
    if missing:
        raise InputError(f"FP16 needs a declared range for every input; none for {', '.join(map(repr, missing))}",
                         location="ranges", hint="declare one per input (--range NAME=LO:HI, or ranges={'name': "
                                                 "(lo, hi)}); integer inputs such as token ids take the range of "
                                                 "their values, e.g. 0:VOCAB-1")
    out: dict[str, tuple[float, float]] = {}
    for n in names:
        r = ranges[n]
        try:
            lo, hi = (float(x) for x in r)
        except (TypeError, ValueError):
            raise InputError(f"the range of {n!r} must be a pair (lo, hi) of numbers, got {r!r}",
                             location=n) from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise InputError(f"the range of {n!r} must be finite with lo <= hi, got ({lo}, {hi})", location=n)
        out[n] = (lo, hi)
    return out


@dataclass(frozen=True)
class Fp16Plan:
    """The program an FP16 compile emits (float16 where proved) and the decision per float32 op."""

    module: Module
    kept: frozenset[Value]
    decisions: tuple[Decision, ...]
    ranges: Mapping[str, tuple[float, float]]
    seconds: float

    @property
    def fp16_ops(self) -> list[Decision]:
        return [d for d in self.decisions if d.precision == "fp16"]

    @property
    def fp32_ops(self) -> list[Decision]:
        return [d for d in self.decisions if d.precision == "fp32"]

    @property
    def unproved(self) -> list[Decision]:
        """Ops kept in float32 because their float16 version could not be shown safe."""
        return [d for d in self.decisions if d.unsafe]

    def manifest(self) -> dict[str, Any]:
        """The artifact manifest's ``precision`` entry."""
        return {"policy": POLICY, "ranges": {k: [lo, hi] for k, (lo, hi) in self.ranges.items()},
                "fp16_ops": len(self.fp16_ops), "fp32_ops": len(self.fp32_ops),
                "unproved": len(self.unproved), "seconds": round(self.seconds, 3),
                "semantics": {op: HALF_SEMANTICS[op] for op in sorted({d.op for d in self.fp16_ops})
                              if op in HALF_SEMANTICS},
                "kept_fp32": [{"op": d.op, "value": d.name, "cause": d.cause, "reason": d.reason}
                              for d in self.fp32_ops]}

    def require_all_proved(self) -> None:
        """Raise :class:`Fp16Unproved` unless every float32 op float16 applies to was proved safe."""
        bad = self.unproved
        if not bad:
            return
        shown = "; ".join(f"{d.name} ({d.op}): {d.reason}" for d in bad[:5])
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        box = ", ".join(f"{k} in [{lo:g}, {hi:g}]" for k, (lo, hi) in self.ranges.items())
        raise Fp16Unproved(f"FP16 build refused: {len(bad)} of {len(self.decisions)} float32 ops are not proved "
                           f"safe in float16 for {box}: {shown}{more}", location="fp16")


def plan_fp16(module: Module, ranges: Mapping[str, Any], *, time_limit: float = 600.0) -> Fp16Plan:
    """The FP16 program of ``module`` (static shapes) for inputs in ``ranges``, and its decisions."""
    start = time.monotonic()
    module = without_loops(module)  # an FP16 program runs its loops unrolled, each iteration planned
    box = normalize_ranges(module, ranges)
    bounds = {k: (np.float64(lo), np.float64(hi)) for k, (lo, hi) in box.items()}
    kept, decisions = fp16_safe_ops(module, bounds, time_limit=time_limit)
    program = fp16_module(module, kept)
    return Fp16Plan(program, kept, tuple(decisions), box, time.monotonic() - start)
