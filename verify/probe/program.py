"""The reduced-precision program a probe analyses, and the sites in it.

For FP16/BF16 the program is the model with float32 compute moved to the narrow type, built by
the FP16 pass's own construction (:func:`cuvil.passes.fp16.narrow_function`: casts at the
boundaries, constants cast as constant expressions, ops whose constants do not fit kept wide)
with a per-value keep set, so a compile can keep exactly the unsafe ops in float32 and ships
what was probed. For INT8 it is the model after :class:`cuvil.passes.quantize_int8.QuantizeInt8`.

A *site* is one value of that program whose type can overflow or saturate: a float value of
the narrow type, an integer value (wrap-around), or a float clamp feeding an integer cast
(saturation). Each value maps back to the value of the original model it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from cuvil.errors import BudgetError, InputError, UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import all_ops, ops_with_precision
from cuvil.ir.rules import Call, Expr, Lit, Reduce
from cuvil.ir.rulewalk import RuleInfo
from cuvil.ir.unroll import flatten_conds, module_has_regions, unroll_module
from cuvil.ir.values import Value
from cuvil.passes.fp16 import KEEP_FP32, narrow_function
from cuvil.passes.quantize_int8 import (
    QuantizeInt8,
    has_qdq,
    quantize_zero_point,
    requantization_target,
    requantization_zero_point,
)
from verify.probe.interval import ROUNDING

PRECISIONS = ("fp16", "bf16", "int8")
NARROW = {"fp16": DType.f16, "bf16": DType.bf16}

DEFAULT_KEEP = tuple(sorted(ops_with_precision("as-declared")))
"""Ops the probe keeps in float32 by default: only those whose result type is declared (casts).
The FP16 pass's default keep list (:data:`cuvil.passes.fp16.KEEP_FP32`) is available as
``keep_ops="default"``; probing everything in the narrow type is what shows which ops need it."""


def max_finite(dtype: DType) -> float:
    """The largest finite value of a float type (the safety threshold of its sites)."""
    return float(ml_dtypes.finfo(dtype.np).max)


def overflow_threshold(dtype: DType) -> float:
    """The smallest magnitude that rounds to infinity (max finite plus half an ulp)."""
    info = ml_dtypes.finfo(dtype.np)
    return float(info.max) + float(2.0 ** (int(info.maxexp) - 2 - int(info.nmant)))


def int_range(dtype: DType) -> tuple[int, int]:
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class Program:
    """The function a probe analyses, where its values came from, and what was kept wide."""

    module: Module
    precision: str
    origin: Mapping[Value, Value] = field(default_factory=dict)
    kept: frozenset[Value] = frozenset()

    @property
    def function(self) -> Function:
        return self.module.main

    @property
    def narrow(self) -> DType | None:
        return NARROW.get(self.precision)


def reduced_program(module: Module, precision: str, *, keep_ops: Iterable[str] | str = DEFAULT_KEEP,
                    keep_values: Iterable[Value] = ()) -> Program:
    """The program whose sites a probe checks. ``keep_ops="default"`` uses the FP16 pass's list."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}", hint="choose one of " + ", ".join(PRECISIONS))
    module = without_loops(module)
    fn = module.main
    if precision == "int8":
        return _int8_program(module)
    if isinstance(keep_ops, str):
        keep_ops = _keep_list(keep_ops)
    b = Builder(module.constants)
    narrowed = narrow_function(fn, b, NARROW[precision], keep_ops, keep_values)
    identity = {v: v for v in fn.values() if v.is_param or v.is_const}
    return Program(Module((narrowed.function,), b.constants, module.metadata), precision,
                   {**identity, **narrowed.origin}, narrowed.kept)


def without_loops(module: Module) -> Module:
    """The module with its loops unrolled and its conds flattened: the prober bounds every iteration's
    ops by their rules (a loop has none of its own), so a loop needs a concrete trip count and fits a
    budget; a cond becomes both branches and a ``where`` (its bound covers either branch, and a site
    in a branch is checked whichever way the condition goes, so a run that takes the other branch may
    not reach it). Unrolling is deterministic and values are interned, so every caller unrolling one
    module gets the same values (a keep set computed on one unrolling applies to another)."""
    try:
        while module_has_regions(module):  # a loop in a branch, a cond in a loop body
            module = flatten_conds(unroll_module(module))
        return module
    except (UnsupportedOpError, BudgetError) as e:
        raise UnsupportedOpError(f"the overflow prober analyses loops unrolled, and {e.message}",
                                 location=e.location, hint=e.hint) from None


def _keep_list(spec: str) -> tuple[str, ...]:
    if spec == "default":
        return KEEP_FP32
    if spec in ("", "none"):
        return DEFAULT_KEEP
    ops = [s.strip() for s in spec.split(",") if s.strip()]
    known = {o.name for o in all_ops()}
    unknown = [o for o in ops if o not in known]
    if unknown:
        raise InputError(f"--keep-fp32 names ops CIR does not have: {', '.join(unknown)}", location="--keep-fp32",
                         hint="'none', 'default' or a comma-separated list of ops (`cuvil ops` lists them)")
    return tuple(dict.fromkeys((*DEFAULT_KEEP, *ops)))


def _int8_program(module: Module) -> Program:
    fn = module.main
    if not has_qdq(fn):
        raise InputError("the model has no quantize/dequantize ops, so it has no INT8 program to probe",
                         location=fn.name, hint="quantize it first (QDQ format), or probe --precision fp16")
    result = QuantizeInt8().run(module)
    new = result.module
    origin = {v: v for v in new.main.values() if v in set(fn.values())}
    return Program(new, "int8", origin, frozenset())


# --------------------------------------------------------------------------------------
# sites


@dataclass(frozen=True)
class SiteSpec:
    """What makes a value a site: the range its components must stay in, and the check's name.

    ``rule`` is ``fp16-overflow``/``bf16-overflow`` (a narrow float leaves the finite range),
    ``int-overflow`` (an integer wraps) or ``int8-saturation`` (a clamp to an integer type's
    range changes the value)."""

    rule: str
    lo: float
    hi: float
    dtype: DType


def float_spec(dtype: DType) -> SiteSpec:
    m = max_finite(dtype)
    return SiteSpec("fp16-overflow" if dtype is DType.f16 else "bf16-overflow", -m, m, dtype)


def int_spec(dtype: DType) -> SiteSpec:
    lo, hi = int_range(dtype)
    return SiteSpec("int-overflow", float(lo), float(hi), dtype)


def saturation_spec(dtype: DType) -> SiteSpec:
    lo, hi = int_range(dtype)
    return SiteSpec("int8-saturation", float(lo), float(hi), dtype)


SITE_INT_TYPES = (DType.i8, DType.u8, DType.i16, DType.u16, DType.i32, DType.u32)


def site_values(program: Program) -> list[Value]:
    """The values of the program that are sites, operands before users."""
    fn = program.function
    uses = fn.users()
    live = input_dependent(fn)
    return [v for v in fn.ops() if v in live and is_site_value(program, v, uses)]


def input_dependent(fn: Function) -> set[Value]:
    """Values whose cone reaches a parameter (the rest are constant expressions)."""
    live: set[Value] = set()
    for v in fn.values():
        if v.is_param or any(o in live for o in v.operands):
            live.add(v)
    return live


def is_site_value(program: Program, v: Value, uses: Mapping[Value, list[Value]]) -> bool:
    if v.is_param or v.is_const:
        return False
    narrow = program.narrow
    if narrow is not None:
        return v.dtype is narrow
    if v.dtype in SITE_INT_TYPES:
        return True
    return requantization_target(v, uses) is not None


class SiteWatch:
    """Which nodes of a value's rule a probe watches, and the range each must stay in.

    Narrow floats: the result and every rounding node computed in the narrow type. Integers:
    the result and every integer arithmetic node (wrap-around), and the operand of each clamp to
    an integer type's range that a cast to that type consumes (saturation)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.uses = program.function.users()
        self.live = input_dependent(program.function)
        self.constants = program.module.constants

    def __call__(self, v: Value, info: RuleInfo) -> dict[int, SiteSpec]:
        if v not in self.live or v.is_param or v.is_const:
            return {}
        narrow = self.program.narrow
        if narrow is not None:
            return self._narrow(v, info, narrow)
        return self._integer(v, info)

    def _narrow(self, v: Value, info: RuleInfo, narrow: DType) -> dict[int, SiteSpec]:
        if v.dtype is not narrow:
            return {}
        spec = float_spec(narrow)
        out = {0: spec}
        for k, e in enumerate(info.nodes):
            if e.dtype is not narrow:
                continue
            if (isinstance(e, Call) and (e.fn in ROUNDING or e.fn == "cast")) or \
                    (isinstance(e, Reduce) and e.kind in ("sum", "prod")):
                out[k] = spec
        return out

    def _integer(self, v: Value, info: RuleInfo) -> dict[int, SiteSpec]:
        out: dict[int, SiteSpec] = {}
        target = requantization_target(v, self.uses)
        if target is not None:
            root = info.rule
            inner = _clamped(root)
            if inner is not None:
                zero = requantization_zero_point(v, self.constants)
                out[info.index[id(inner[0])]] = self._intended(saturation_spec(target), zero)
        if v.dtype in SITE_INT_TYPES:
            out[0] = int_spec(v.dtype)
        for k, e in enumerate(info.nodes):
            if isinstance(e, Call) and e.fn == "cast":
                to = dict(e.attrs)["to"]
                inner = _clamped(e.args[0])
                if inner is not None and to.is_int and to is not DType.bool and \
                        (inner[1], inner[2]) == tuple(float(x) for x in int_range(to)):
                    zero = quantize_zero_point(v, self.constants)
                    out[info.index[id(inner[0])]] = self._intended(saturation_spec(to), zero)
            if e.dtype not in SITE_INT_TYPES:
                continue
            if (isinstance(e, Call) and e.fn in ("add", "sub", "mul", "neg", "abs", "pow")) or \
                    (isinstance(e, Reduce) and e.kind in ("sum", "prod")):
                out[k] = int_spec(e.dtype)
        return out

    @staticmethod
    def _intended(spec: SiteSpec, zero: np.ndarray | None) -> SiteSpec:
        """A zero point at the type's minimum (maximum) puts real 0 at the end of the range: clamping
        below (above) it is the ReLU a quantizer folds into the quantization, not saturation."""
        if zero is None or zero.size == 0:
            return spec
        lo, hi = spec.lo, spec.hi
        if np.all(zero == lo):
            lo = -np.inf
        if np.all(zero == hi):
            hi = np.inf
        return SiteSpec(spec.rule, lo, hi, spec.dtype)


def _clamped(e: Expr) -> tuple[Expr, float, float] | None:
    """``min(max(x, a), b)`` or ``max(min(x, b), a)`` with literal bounds: ``(x, a, b)``."""
    if not (isinstance(e, Call) and e.fn in ("min", "max")):
        return None
    inner, outer_lit = e.args
    if not isinstance(outer_lit, Lit) or not isinstance(inner, Call) or inner.fn == e.fn or \
            inner.fn not in ("min", "max"):
        return None
    x, inner_lit = inner.args
    if not isinstance(inner_lit, Lit):
        return None
    a, b = (float(inner_lit.value), float(outer_lit.value)) if e.fn == "min" else \
        (float(outer_lit.value), float(inner_lit.value))
    return x, a, b
