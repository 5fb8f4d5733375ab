"""FP16 conversion: float32 compute runs in float16, with casts where values cross between
the two; ops whose results are sensitive to range or accumulated rounding stay float32.

The function signature stays float32 (inputs are cast down where first used in fp16,
results are cast back up). Constants used by fp16 ops are cast as constant expressions
(``cast(W, f16)``) for ``fold-constants`` to materialize; an op whose constant operand does
not fit float16's range stays float32. The contract is ``bounded``: the verifier proves
overflow freedom over the declared input domain, and :attr:`Fp16.tolerance` is the error
budget the differential tests hold it to.

This pass decides by op kind alone. :func:`narrow_function` is the one construction of the
reduced-precision program: the pass calls it with its keep list, and the overflow prober
(``verify.probe.program``) calls it with a per-value keep set and for BF16 too, so what the prober
proves is what this builds. ``cuvil.compile(..., fp16=True, ranges=...)`` ships the program the
prober built last: exactly the ops it cannot prove safe for the declared ranges kept float32
(``verify.probe.fp16_policy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.opdef import ops_with_precision
from cuvil.ir.rules import HALF_DTYPES
from cuvil.ir.values import Value, walk
from cuvil.passes.base import Contract, FunctionPass, register

KEEP_FP32 = tuple(sorted(ops_with_precision("keep-fp32", "as-declared")))
"""Ops kept in float32 by default: every op whose precision policy is not ``narrow``
(:attr:`cuvil.ir.opdef.OpDef.precision_policy`): exponentials and powers overflow float16 early,
reductions and normalizations accumulate rounding, a cast keeps its declared target type."""


def fits(b: Builder, v: Value, limit: float) -> bool:
    """False for a constant expression over constants whose data exceeds ``limit`` in magnitude:
    casting it down would turn data into infinities, so its user stays wide."""
    cone = list(walk([v]))
    if any(u.is_param for u in cone):
        return True
    for c in (u for u in cone if u.is_const):
        data = np.asarray(b.data(c))
        if data.dtype.kind == "f" and data.size and float(np.nanmax(np.abs(data.astype(np.float64)))) > limit:
            return False
    return True


@dataclass(frozen=True)
class Narrowed:
    """A function with its float32 compute in a narrow float type, and how it maps to the original."""

    function: Function
    origin: Mapping[Value, Value]
    """Each new value's source: an op's narrow or wide version maps to the op, a boundary cast to
    the value it converts."""
    kept: frozenset[Value]
    """The original float32 ops that stayed float32."""


def narrow_function(fn: Function, b: Builder, dtype: DType = DType.f16, keep_ops: Iterable[str] = KEEP_FP32,
                    keep_values: Iterable[Value] = ()) -> Narrowed:
    """``fn`` with float32 compute in ``dtype`` (float16 or bfloat16): every float32 op whose float
    operands are all float32 runs narrow unless its op is in ``keep_ops``, it is in ``keep_values``,
    a constant operand does not fit ``dtype``, or the op is not defined on ``dtype``. Values cross
    between the two types through casts inserted where first needed; the signature stays float32."""
    keep_ops = frozenset(keep_ops)
    keep_set = frozenset(keep_values) | declared_wide(fn)
    limit = float(dtype.max_value)
    low: dict[Value, Value] = {}  # value -> its narrow version, where it is narrow now
    full: dict[Value, Value] = {}  # value -> its version in the original dtype
    origin: dict[Value, Value] = {}
    kept: set[Value] = set()

    def as_wide(v: Value) -> Value:
        if v not in full:
            full[v] = b.cast(low[v], to=DType.f32)
            origin.setdefault(full[v], v)
        return full[v]

    def as_narrow(v: Value) -> Value:
        if v not in low:
            low[v] = b.cast(full[v], to=dtype)
            origin.setdefault(low[v], v)
        return low[v]

    def convertible(v: Value) -> bool:
        if v in keep_set or v.op in keep_ops or v.dtype is not DType.f32:
            return False
        floats = [o for o in v.operands if o.dtype.is_float]
        if not floats or any(o.dtype is not DType.f32 for o in floats):
            return False
        return all(fits(b, o, limit) for o in floats)

    def convert(v: Value) -> Value | None:
        operands = tuple(as_narrow(o) if o.dtype is DType.f32 else o for o in v.operands)
        try:
            out = b.op(v.op, *operands, **v.attr_dict)
        except CuvilError:
            return None
        return out if out.dtype is dtype and out.type.shape == v.type.shape else None

    for v in fn.values():
        if v.is_param or v.is_const:
            full[v] = v
            continue
        converted = convert(v) if convertible(v) else None
        if converted is not None:
            low[v] = converted
            origin[converted] = v
            continue
        full[v] = b.op(v.op, *(as_wide(o) for o in v.operands), **v.attr_dict)
        origin.setdefault(full[v], v)
        if v.dtype is DType.f32:
            kept.add(v)
    results = tuple(full[r] if r in full else as_wide(r) for r in fn.results)
    return Narrowed(Function(fn.name, fn.params, results, fn.result_names, fn.constraints), origin, frozenset(kept))


def declared_wide(fn: Function) -> frozenset[Value]:
    """The float32 values a model computes on purpose from narrower floats: a cast widening a
    float16/bfloat16 value, and every float32 op whose float operands are such values or constants (the
    islands importers write where ONNX Runtime reduces or normalizes halves in float32). Narrowing them
    would probe and build a program the model does not describe."""
    out: set[Value] = set()
    live: set[Value] = set()  # the values that depend on an input
    for v in fn.values():
        if v.is_param or any(o in live for o in v.operands):
            live.add(v)
        if v.is_param or v.is_const or v.dtype is not DType.f32:
            continue
        if v.op == "cast":
            if v.operands[0].dtype in HALF_DTYPES or v.operands[0] in out:
                out.add(v)
            continue
        floats = [o for o in v.operands if o.dtype.is_float]
        if any(o in out for o in floats) and all(o in out or o not in live for o in floats):
            out.add(v)
    return frozenset(out)


def is_boundary_cast(v: Value, origin: Mapping[Value, Value]) -> bool:
    """Whether ``v`` is a cast :func:`narrow_function` inserted where a value crosses between the wide and
    narrow types (its origin is the value it converts), not a cast of the model carried over."""
    o = origin.get(v)
    return v.op == "cast" and (o is None or o.op != "cast" or o.dtype is not v.dtype)


@register
@dataclass(frozen=True)
class Fp16(FunctionPass):
    name = "fp16"
    contract = Contract.BOUNDED
    enters_loops = False  # its plan spans the whole function
    description = "run float32 compute in float16 (casts at the boundaries; sensitive ops stay float32)"
    tolerance: ClassVar[tuple[float, float]] = (1e-2, 1e-2)
    """(rtol, atol) against the float32 module, for activations of order 1."""

    keep_fp32: tuple[str, ...] = KEEP_FP32

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        return narrow_function(fn, b, DType.f16, self.keep_fp32).function
