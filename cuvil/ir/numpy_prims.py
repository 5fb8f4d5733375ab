"""The rule primitives (cuvil.ir.rules.PRIMITIVES) over numpy arrays, written once.

The reference interpreter evaluates rules with this table, and the ops' numpy fast paths call
the same functions, so a primitive's edge cases (integer division by zero, float-to-int casts
of NaN) cannot drift between the two.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from cuvil.ir import narrow
from cuvil.ir.dtypes import DType
from cuvil.ir.rules import DOT_FTZ_BELOW, bitcast_refusal, reduction_identity


def _c_math() -> ctypes.CDLL | None:
    """The C math library the compiled libraries call, or None where the platform has none to load."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except OSError:
        return None


_LIBM = _c_math()


def _c_function(name: str, arity: int, fallback: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """The C library's double-precision ``name`` over float64 arrays: the function generated code calls."""
    fn = getattr(_LIBM, name, None) if _LIBM is not None else None
    if fn is None:
        return fallback
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double] * arity
    each = np.frompyfunc(fn, arity, 1)
    return lambda *xs: np.asarray(each(*xs), dtype=np.float64)


def _transcendental(c_name: str, wide: Callable[..., np.ndarray], arity: int = 1,
                    domain: tuple[float, float] | None = None) -> Callable[..., np.ndarray]:
    """A primitive meaning the real function rounded to its operands' float type, evaluated as generated code
    evaluates it: float64 by the C library's ``c_name`` (the call the code generator emits), float32 in float64
    rounded once (``wide``: numpy's float64 loop, within an ulp of the C library's, so the two round alike but
    within about 1e-9 of a float32 rounding boundary), float16 and bfloat16 through float32 as their registers
    are. numpy's own float32 loops are not correctly rounded: the interpreter and a library differed by an
    ulp on 10-45 % of random inputs."""
    exact = _c_function(c_name, arity, wide)

    def apply(*xs: Any) -> np.ndarray:
        arrays = [np.asarray(x) for x in xs]
        dt = np.result_type(*arrays)
        with np.errstate(all="ignore"):
            if dt == np.float64:
                y = exact(*arrays)
                if domain is not None:  # outside it the rule says NaN, whatever the C library returns
                    y = np.where((arrays[0] < domain[0]) | (arrays[0] > domain[1]), np.nan, y)
                return y
            if dt == np.float32:
                return wide(*(a.astype(np.float64) for a in arrays)).astype(np.float32)
            return apply(*(a.astype(np.float32) for a in arrays)).astype(dt)

    return apply


_erf_each = np.frompyfunc(math.erf, 1, 1)


def _erf_float64(x: np.ndarray) -> np.ndarray:
    # asarray: on a 0-d operand the object ufunc returns a bare python float, not an array
    return np.asarray(_erf_each(x), dtype=np.float64)


exp = _transcendental("exp", np.exp)
erf = _transcendental("erf", _erf_float64)
log = _transcendental("log", np.log, domain=(0.0, math.inf))
tanh = _transcendental("tanh", np.tanh)
float_pow = _transcendental("pow", np.power, arity=2)
_TRANSCENDENTAL: dict[str, Callable[..., np.ndarray]] = {
    "exp": exp, "log": log, "tanh": tanh, "erf": erf,
    **{name: _transcendental(name, fn, domain=domain) for name, fn, domain in [
        ("sin", np.sin, None), ("cos", np.cos, None), ("tan", np.tan, None),
        ("asin", np.arcsin, (-1.0, 1.0)), ("acos", np.arccos, (-1.0, 1.0)), ("atan", np.arctan, None),
        ("sinh", np.sinh, None), ("cosh", np.cosh, None), ("asinh", np.arcsinh, None),
        ("acosh", np.arccosh, (1.0, math.inf)), ("atanh", np.arctanh, (-1.0, 1.0))]}}
"""The transcendental primitives by rule name (numpy has no ``erf``: Python's ``math.erf`` is its float64 loop)."""


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
    """Integer powers go through float64 (as ONNX Pow does), float powers are the real power rounded to
    their dtype (:func:`float_pow`)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu":
        return float_pow(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return float_pow(a, b)


def float_to_int(x: np.ndarray, to: DType) -> np.ndarray:
    """Float to a standard integer type: truncate toward zero, NaN and +-inf give 0; out of range,
    i32/i64 give their minimum, i8/i16/u8/u16 keep the low bits of the i32 conversion, and
    u32/u64 convert values >= 2**(bits-1) shifted down by that much (the x86 conversions, written
    out so the meaning does not depend on the machine numpy runs on)."""
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        t = np.where(np.isfinite(t), t, 0.0)

    def signed(v: np.ndarray, bits: int) -> np.ndarray:
        lo, hi = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)
        ok = (v >= lo) & (v < hi)
        return np.where(ok, np.where(ok, v, 0.0).astype(np.int64), np.int64(-(1 << (bits - 1))))

    bits = to.bits
    if to in (DType.i32, DType.i64):
        return signed(t, bits).astype(to.np)
    if to in (DType.u32, DType.u64):
        half = 2.0 ** (bits - 1)
        high = t >= half
        r = signed(np.where(high, t - half, t), bits).astype(np.dtype(f"i{bits // 8}"))
        top = np.array(-(1 << (bits - 1)), dtype=r.dtype)
        return np.where(high, r ^ top, r).view(to.np)
    return signed(t, 32).astype(np.int32).astype(to.np)  # i8/i16/u8/u16 keep the low bits


def cast(x: np.ndarray, to: DType) -> np.ndarray:
    """Convert to ``to``: to bool is != 0; float to int as :func:`float_to_int`; narrow types as
    ``cuvil.ir.narrow`` defines them (a narrow source is widened exactly first)."""
    x = np.asarray(x)
    if DType.from_numpy(x.dtype).is_narrow:
        x = narrow.decode(x)
    if to is DType.bool:
        return x != 0
    if to.is_narrow:
        return narrow.encode(to, x).view(to.np)
    if to.is_int and DType.from_numpy(x.dtype).is_float:
        return float_to_int(x, to)
    return x.astype(to.np)


def bitcast(x: np.ndarray, to: DType) -> np.ndarray:
    """``x``'s bits read as ``to``: a numpy view, so every bit pattern (NaN payloads, -0.0) is kept."""
    x = np.asarray(x)
    refused = bitcast_refusal(DType.from_numpy(x.dtype), to)
    if refused is not None:
        raise TypeError(f"bitcast: {refused}")
    return x.view(to.np)


def literal(value: float | int | bool, to: DType) -> np.ndarray:
    """A scalar of the rule language as a rank-0 array of ``to``, rounded by :func:`cast`."""
    return cast(np.asarray(value), to)


def maximum(a: Any, b: Any) -> np.ndarray:
    """The rules' ``max(a, b)``: a NaN in either operand propagates (``a``'s when both are), and a tie gives
    ``b`` (``max(+0, -0)`` is -0, ``max(-0, +0)`` is +0), as the code generator and every op's doc say. numpy's
    float16 loop keeps ``a`` on a tie, so float operands are compared here, whatever numpy's loop does."""
    return _extremum(a, b, np.maximum, np.greater)


def minimum(a: Any, b: Any) -> np.ndarray:
    """The rules' ``min(a, b)``: as :func:`maximum`, with ``a < b`` picking ``a``."""
    return _extremum(a, b, np.minimum, np.less)


def _extremum(a: Any, b: Any, integral: Callable[..., np.ndarray], keeps_a: Callable[..., np.ndarray]
              ) -> np.ndarray:
    dtype = np.result_type(a, b)  # numpy's promotion (a Python scalar takes the array's type)
    if not DType.from_numpy(dtype).is_float:
        return integral(a, b)
    x, y = np.asarray(a), np.asarray(b)
    with np.errstate(invalid="ignore"):  # a comparison with a NaN is false, as meant
        return np.where(np.isnan(x) | keeps_a(x, y), x, y).astype(dtype, copy=False)


def _fold_extremum(kind: str, flat: np.ndarray) -> np.ndarray:
    """The left fold of :func:`maximum` (``kind`` "max") or :func:`minimum` over the last axis of a float
    array, vectorized: the first NaN where a row has one, else the row's last element equal to its extremum
    (a tie gives the later operand, so the fold keeps the last of the equal ones, signed zeros included)."""
    nan = np.isnan(flat)
    filled = np.where(nan, flat.dtype.type(-np.inf if kind == "max" else np.inf), flat)
    best = filled.max(axis=-1) if kind == "max" else filled.min(axis=-1)
    n = flat.shape[-1]
    last = n - 1 - np.argmax((filled == best[..., None])[..., ::-1], axis=-1)
    pick = np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), last)
    return np.take_along_axis(flat, pick[..., None], axis=-1)[..., 0]


_REDUCE_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def sequential_reduce(kind: str, full: np.ndarray, first_axis: int) -> np.ndarray:
    """``kind`` over the axes from ``first_axis`` on, in the order a rule fixes: one left fold over
    the row-major enumeration of those axes (``((x0 op x1) op x2) ...``, each step rounded to the
    dtype), whatever the array's memory layout; an empty range gives the identity. The
    interpreter reads every ``Reduce`` this way, and fast paths that reduce call it too."""
    dt = full.dtype
    lead = full.shape[:first_axis]
    n = int(np.prod(full.shape[first_axis:], dtype=np.int64))
    if n == 0:
        return np.full(lead, reduction_identity(kind, DType.from_numpy(dt)), dtype=dt)
    flat = np.ascontiguousarray(full).reshape((*lead, n))
    if dt.kind == "b":
        return (np.logical_or if kind in ("sum", "max") else np.logical_and).reduce(flat, axis=-1)
    if n == 1:
        return flat[..., 0].copy()
    if kind in ("max", "min") and DType.from_numpy(dt).is_float:
        return _fold_extremum(kind, flat)
    return _REDUCE_UFUNC[kind].accumulate(flat, axis=-1, dtype=dt)[..., -1]


def reduce_axes(kind: str, x: np.ndarray, axes: Sequence[int], keepdims: bool = False) -> np.ndarray:
    """:func:`sequential_reduce` over ``axes`` (sorted ascending: the order reduction rules use)."""
    axes = sorted(a % x.ndim for a in axes) if x.ndim else []
    moved = np.moveaxis(x, axes, range(x.ndim - len(axes), x.ndim)) if axes else x
    out = sequential_reduce(kind, moved, x.ndim - len(axes))
    if keepdims:
        out = out.reshape([1 if k in axes else d for k, d in enumerate(x.shape)])
    return out




def flush_subnormal(x: np.ndarray) -> np.ndarray:
    """Subnormal float32 values as zero of their sign: what flush-to-zero hardware writes and
    denormals-are-zero hardware reads."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x) < np.float32(DOT_FTZ_BELOW), x * np.float32(0.0), x)


def fma_f32(x: np.ndarray, y: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``x * y + acc`` for float32 operands, the exact value rounded once to float32 (IEEE
    fusedMultiplyAdd). The product is exact in float64; the sum is rounded to odd in float64 (its
    TwoSum error moves an even result one ulp toward the exact value) and then to nearest float32,
    which is correct because float64 carries more than 2 x 24 + 1 bits."""
    with np.errstate(all="ignore"):
        p = np.asarray(x, dtype=np.float64) * np.asarray(y, dtype=np.float64)
        a = np.asarray(acc, dtype=np.float64)
        s = p + a
        back = s - a
        err = (a - (s - back)) + (p - back)
        even = (np.asarray(s).view(np.uint64) & np.uint64(1)) == 0
        fix = (err != 0) & even & np.isfinite(s) & np.isfinite(err)
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return np.asarray(s).astype(np.float32)


def sequential_dot(kind: str, x: np.ndarray, y: np.ndarray, first_axis: int) -> np.ndarray:
    """A ``dot`` / ``dot_ftz`` reduction (:data:`cuvil.ir.rules.DOT_KINDS`) of float32 factors over the
    axes from ``first_axis`` on, in row-major order: ``acc = fma(x_k, y_k, acc)`` from -0.0 (``dot_ftz``:
    subnormal factors read as zero, every running sum flushed); over nothing, +0.0."""
    shape = np.broadcast_shapes(x.shape, y.shape)
    lead = shape[:first_axis]
    n = int(np.prod(shape[first_axis:], dtype=np.int64))
    xs = np.broadcast_to(x, shape).reshape((*lead, n))
    ys = np.broadcast_to(y, shape).reshape((*lead, n))
    flush = kind == "dot_ftz"
    acc = np.full(lead, -0.0 if n else 0.0, dtype=np.float32)
    for k in range(n):
        xk, yk = xs[..., k], ys[..., k]
        if flush:
            xk, yk = flush_subnormal(xk), flush_subnormal(yk)
        acc = fma_f32(xk, yk, acc)
        if flush:
            acc = flush_subnormal(acc)
    return acc


_ANY_ORDER: ContextVar[bool] = ContextVar("float64_sums_in_any_order", default=False)


@contextmanager
def float64_sums_in_any_order() -> Iterator[None]:
    """Within this block, float64 products (:func:`sequential_matmul`) may be summed in any order (one BLAS
    call). For callers whose error analysis holds for every order alike (sound bounds, whose float64 error
    is ``γ_n`` of the magnitudes whichever way the sum runs); never for evaluating a program."""
    token = _ANY_ORDER.set(True)
    try:
        yield
    finally:
        _ANY_ORDER.reset(token)


def sequential_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (batch dims broadcast) as the matmul rule computes it: each product rounded, the
    products summed over k in ascending order (float16/bfloat16 widened to f32 and rounded once
    at the end). Integers use numpy's matmul: wrapping sums do not depend on the order."""
    half = a.dtype in (np.dtype(np.float16), DType.bf16.np)
    if a.dtype.kind in "iub" and not half:
        return np.matmul(a, b)
    if _ANY_ORDER.get() and a.dtype == np.float64 and b.dtype == np.float64:
        return np.matmul(a, b)
    out_dtype = a.dtype
    if half:
        a, b = a.astype(np.float32), b.astype(np.float32)
    k = a.shape[-1]
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    if k == 0:
        return np.zeros(shape, dtype=out_dtype)
    acc = np.empty(shape, dtype=a.dtype)
    np.multiply(a[..., :, 0:1], b[..., 0:1, :], out=acc)
    term = np.empty_like(acc)
    for j in range(1, k):
        np.multiply(a[..., :, j:j + 1], b[..., j:j + 1, :], out=term)
        np.add(acc, term, out=acc)
    return acc.astype(out_dtype, copy=False)


NUMPY_PRIMITIVES: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": div,
    "min": minimum, "max": maximum, "pow": pow_, "fmod": np.fmod, "mod": np.mod,
    "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt, **_TRANSCENDENTAL,
    "floor": np.floor, "ceil": np.ceil, "round_even": np.round,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "not": np.logical_not,
    "isnan": np.isnan, "isinf": np.isinf,
    "bit_and": np.bitwise_and, "bit_or": np.bitwise_or, "bit_xor": np.bitwise_xor,
    "bit_not": np.invert, "shl": np.left_shift, "shr": np.right_shift,
    "select": np.where,
}
