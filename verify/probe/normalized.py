"""An element divided by its row's ℓ2 norm: ``a / sqrt(Σ a·a)`` lies within ±1.25 whatever the box.

Intervals cannot see it: the norm's interval reaches 0 wherever ``a``'s does, and the quotient's bound
becomes infinite (the LpNormalization and ``F.normalize`` of every exporter, and the fused ReduceL2 an
importer widens to float32). The fact, for a row norm computed in any float type from the squares of
``a`` (or of ``a`` widened exactly), rounded to nearest:

* the rounded sum of nonnegative squares is at least each rounded square, and the rounded square root
  is monotone, so when no square underflows ``D >= |a_i|·(1 - u)^(3/2)`` and ``|a_i / D|`` rounds to at
  most ``1 + 3u``; a square in the subnormal range is within ``η/2`` of ``a_i²``, and a positive rounded
  sum is at least ``η``, so ``a_i² <= 1.5·sum`` and the quotient is at most ``√1.5·(1 + u)/(1 - u) < 1.25``;
* the quotient needs ``D > 0``: a ``where(D == 0, c, a / D)`` guard (the zero case takes ``c``), a floor
  ``max(D, ε)`` / ``clip(D, ε)`` with ``ε > 0`` (a row whose squares all round to zero has
  ``|a_i| <= √η``, so ``|a_i / ε| <= √η / ε``), or a norm whose interval is positive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value
from cuvil.passes.fold_batchnorm import is_constant_expr
from verify.probe import interval as I
from verify.probe.interval import Interval

RATIO = 1.25
"""``|a_i| / ‖a‖`` as the float program computes it, when the norm is positive (see the module)."""

_WIDENING = {(DType.f16, DType.f32), (DType.bf16, DType.f32), (DType.f16, DType.f64), (DType.bf16, DType.f64),
             (DType.f32, DType.f64)}


def _squared(m: Value, a: Value) -> bool:
    """``m`` is ``a·a``, or ``b·b`` with ``b`` an exact widening cast of ``a``."""
    if m.op != "mul" or m.operands[0] is not m.operands[1]:
        return False
    b = m.operands[0]
    return b is a or (b.op == "cast" and b.operands[0] is a and (a.dtype, b.dtype) in _WIDENING)


def _norm_of(d: Value, a: Value) -> DType | None:
    """The type ``a``'s squares are computed in, when ``d`` is ``sqrt(reduce_sum(a·a, keepdims))`` (possibly
    cast to another float type)."""
    if d.op == "cast" and d.operands[0].dtype.is_float:
        d = d.operands[0]
    if d.op != "sqrt":
        return None
    s = d.operands[0]
    if s.op == "reduce_sum" and bool(s.attr("keepdims")) and _squared(s.operands[0], a):
        return s.operands[0].dtype
    return None


def _floor(d: Value, constant_value: Callable[[Value], np.ndarray]) -> tuple[Value, float] | None:
    """``max(n, ε)`` or ``clip(n, ε, ...)`` with a constant ``ε > 0``: ``(n, ε)``."""
    if d.op == "max" and len(d.operands) == 2:
        for n, e in (d.operands, d.operands[::-1]):
            if is_constant_expr(e) and not is_constant_expr(n):
                eps = float(np.min(np.asarray(constant_value(e), dtype=np.float64)))
                return (n, eps) if eps > 0 else None
    if d.op == "clip" and d.attr("min") is not None:
        eps = float(np.asarray(float(d.attr("min")), dtype=d.dtype.np))  # the bound as the op's type holds it
        return (d.operands[0], eps) if eps > 0 else None
    return None


def ratio_bound(v: Value, values: Mapping[Value, Interval],
                constant_value: Callable[[Value], np.ndarray]) -> float | None:
    """The bound ``B`` with ``|v| <= B`` when ``v`` is ``a / ‖a‖`` with a positive (or floored) norm."""
    if v.op != "div" or not v.dtype.is_float:
        return None
    a, d = v.operands
    ia = values.get(a)
    if ia is None or bool(np.any(ia.nan)) or not np.all(np.isfinite(ia.magnitude())):
        return None
    floored = _floor(d, constant_value)
    if floored is not None:
        n, eps = floored
        squares = _norm_of(n, a)
        if squares is None:
            return None
        # every square rounded to zero: a_i² <= η/2 in the squares' type
        return max(RATIO, math.sqrt(I.smallest_subnormal(squares)) / eps * 1.01)
    if _norm_of(d, a) is None:
        return None
    idn = values.get(d)
    return RATIO if idn is not None and float(np.min(idn.lo)) > 0 else None


def guarded_ratio(v: Value, values: Mapping[Value, Interval]) -> Interval | None:
    """``where(equal(D, 0), c, a / D)`` with ``D = ‖a‖`` and a constant ``c``: the hull of ``c`` and ±1.25."""
    if v.op != "where" or len(v.operands) != 3:
        return None
    cond, c, q = v.operands
    if cond.op != "equal" or q.op != "div" or not is_constant_expr(c):
        return None
    a, d = q.operands
    zero = [o for o in cond.operands if o is not d]
    if len(zero) != 1 or d not in cond.operands or not is_constant_expr(zero[0]) or _norm_of(d, a) is None:
        return None
    ia, ic = values.get(a), values.get(c)
    if ia is None or ic is None or bool(np.any(ia.nan)) or not np.all(np.isfinite(ia.magnitude())):
        return None
    iz = values.get(zero[0])
    if iz is None or float(np.max(np.abs(iz.lo))) != 0 or float(np.max(np.abs(iz.hi))) != 0:
        return None  # the guard compares with zero itself
    return Interval(np.minimum(ic.lo, -RATIO), np.maximum(ic.hi, RATIO), np.asarray(ic.nan))
