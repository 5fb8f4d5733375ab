"""The rule primitives (cuvil.ir.rules.PRIMITIVES) over numpy arrays, written once.

The reference interpreter evaluates rules with this table, and the ops' numpy fast paths call
the same functions, so a primitive's edge cases (integer division by zero, float-to-int casts
of NaN) cannot drift between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cuvil.ir.dtypes import DType

_erf_obj = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Gauss error function, evaluated in float64 and rounded to the operand's dtype."""
    return _erf_obj(np.asarray(x).astype(np.float64)).astype(np.asarray(x).dtype)


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Truncating integer division; division by zero yields 0 (CIR's definition of the C UB)."""
    a, b = np.broadcast_arrays(a, b)
    safe = np.where(b == 0, np.ones((), b.dtype), b)
    q = np.floor_divide(a, safe)
    fix = (np.mod(a, safe) != 0) & ((a < 0) != (safe < 0))
    return np.where(b == 0, np.zeros((), a.dtype), q + fix.astype(q.dtype)).astype(a.dtype)


def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return int_div(a, b)
    return np.true_divide(a, b).astype(a.dtype)


def pow_(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer powers go through float64 (as ONNX Pow does), float powers stay in their dtype."""
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b)


def cast(x: np.ndarray, to: DType) -> np.ndarray:
    """Float to int truncates toward zero, and NaN/inf become 0; any nonzero is true."""
    if to is DType.bool:
        return x != 0
    if to.is_int and x.dtype.kind not in "iub":
        x = np.trunc(x)
        x = np.where(np.isfinite(x), x, np.zeros((), x.dtype))
    return x.astype(to.np)


NUMPY_PRIMITIVES: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": div,
    "min": np.minimum, "max": np.maximum, "pow": pow_, "fmod": np.fmod, "mod": np.mod,
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "erf": erf, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "floor": np.floor, "ceil": np.ceil, "round_even": np.round,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "not": np.logical_not,
    "isnan": np.isnan, "isinf": np.isinf,
    "bit_and": np.bitwise_and, "bit_or": np.bitwise_or, "bit_xor": np.bitwise_xor,
    "bit_not": np.invert, "shl": np.left_shift, "shr": np.right_shift,
    "select": np.where,
}
