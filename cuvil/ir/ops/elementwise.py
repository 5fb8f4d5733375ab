"""Elementwise ops: numpy broadcasting over operands, one scalar function per element.

Binary ops take operands of one element type (frontends insert explicit casts for
mixed-type sources such as ONNX Pow). Composite activations (sigmoid, gelu, ...)
are computed in f32 for f16/bf16 operands and rounded once, as PyTorch and ONNX
Runtime do, so a half-precision rule is not a chain of half-precision roundings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from cuvil.errors import OpDefinitionError
from cuvil.ir import numpy_prims
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import REQUIRED, PrecisionPolicy, broadcast_shapes, define
from cuvil.ir.types import TensorType

Example = tuple[list[np.ndarray], dict[str, Any]]

# --------------------------------------------------------------------------------------
# shape rules

_KINDS: dict[str, Callable[[DType], bool]] = {
    "num": lambda d: d is not DType.bool,
    "float": lambda d: d.is_float,
    "int": lambda d: d.is_int,
    "bool": lambda d: d is DType.bool,
    "any": lambda d: True,
}
_KIND_WORDS = {"num": "a numeric", "float": "a floating-point", "int": "an integer", "bool": "a bool"}


def _broadcast_type(types: list[TensorType], **_: Any) -> TensorType:
    dt = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dt:
            raise TypeError(f"operand dtypes differ: {dt} vs {t.dtype}")
    return TensorType(dt, broadcast_shapes(*(t.shape for t in types)))


def _typed(kinds: str, result: DType | None = None) -> Callable[..., TensorType]:
    """A broadcasting shape rule that also checks the element type kind the op accepts."""

    def shape(types: list[TensorType], **_: Any) -> TensorType:
        out = _broadcast_type(types)
        if not _KINDS[kinds](out.dtype):
            raise TypeError(f"element type {out.dtype} is not accepted; it needs {_KIND_WORDS[kinds]} type")
        return out if result is None else out.with_dtype(result)

    return shape


# --------------------------------------------------------------------------------------
# rule and fast-path helpers

_NARROW = (DType.f16, DType.bf16)
_NARROW_NP = (DType.f16.np, DType.bf16.np)


def _wide(fn: Callable[..., R.Expr]) -> Callable[..., R.Expr]:
    """Evaluate a composite scalar function in f32 for f16/bf16 operands, rounding once at the end."""

    def wrapped(x: R.Expr, **attrs: Any) -> R.Expr:
        if x.dtype in _NARROW:
            return R.cast(fn(R.cast(x, DType.f32), **attrs), x.dtype)
        return fn(x, **attrs)

    return wrapped


def _wide_np(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """The numpy counterpart of :func:`_wide` for fast paths: ``fn(x, **attrs)`` on one operand."""

    def run(xs: list[np.ndarray], out: TensorType, **attrs: Any) -> np.ndarray:
        x = xs[0]
        if x.dtype in _NARROW_NP:
            return np.asarray(fn(x.astype(np.float32), **attrs)).astype(x.dtype)
        return fn(x, **attrs)

    return run


def _np_div(xs: list[np.ndarray], out: TensorType) -> np.ndarray:
    return numpy_prims.div(*xs)


def _np_pow(xs: list[np.ndarray], out: TensorType) -> np.ndarray:
    return numpy_prims.pow_(*xs)


def _np_cast(xs: list[np.ndarray], out: TensorType, to: DType) -> np.ndarray:
    return numpy_prims.cast(xs[0], to)


def _np_bitcast(xs: list[np.ndarray], out: TensorType, to: DType) -> np.ndarray:
    return numpy_prims.bitcast(xs[0], to)


def _np_clip(xs: list[np.ndarray], out: TensorType, min: float | None, max: float | None) -> np.ndarray:
    x = xs[0]
    lo, hi = _clip_bound(min, out.dtype), _clip_bound(max, out.dtype)
    if lo is not None:
        x = numpy_prims.maximum(x, np.array(lo, dtype=x.dtype))
    if hi is not None:
        x = numpy_prims.minimum(x, np.array(hi, dtype=x.dtype))
    return x


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + numpy_prims.exp(-x))


def _np_hardsigmoid(x: np.ndarray, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    return numpy_prims.maximum(numpy_prims.minimum(x * alpha + beta, 1), 0)


def _np_gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + numpy_prims.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + numpy_prims.erf(x * (1.0 / math.sqrt(2.0))))


# --------------------------------------------------------------------------------------
# example inputs: random values plus the edge values every elementwise op must get right

_F_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0,
            1e-30, -1e-30, 1e30, -1e30, 88.0, -88.0, 20.0, -20.0, 1e-7, -1e-7, 100.0, -100.0]


def _fedges(dtype: Any = np.float32) -> np.ndarray:
    """The float edge values as a (4, 6) array of ``dtype`` (huge values become inf in f16)."""
    with np.errstate(all="ignore"):
        return np.array(_F_EDGES, dtype=np.float64).astype(dtype).reshape(4, 6)


def _iedges(dtype: Any) -> np.ndarray:
    """Integer edge values (type min/max, 0, +-1, small values) as a (2, 5) array."""
    info = np.iinfo(dtype)
    vals = [0, 1, 2, 3, 7, 100, info.max, info.max - 1, info.min, info.min + 1]
    if info.min < 0:
        vals[3:6] = [-1, -7, -100]
    return np.array(vals, dtype=dtype).reshape(2, 5)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.float32,
            scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _pairs(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Every element of ``a`` against every element of ``b`` by broadcasting (n, 1) with (m,)."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    if fa.size == fb.size:
        fb = fb[:-1]
    return [fa.reshape(-1, 1), fb]


def _unary_examples(kinds: str, attrs: dict[str, Any] | None = None
                    ) -> Callable[[np.random.Generator], list[Example]]:
    at = attrs or {}

    def examples(rng: np.random.Generator) -> list[Example]:
        if kinds == "bool":
            return [([rng.standard_normal((2, 3)) > 0], at)]
        cases: list[Example] = []
        if kinds in ("float", "num"):
            cases += [([_normal(rng, (2, 3), scale=2.0)], at), ([_fedges()], at), ([_fedges(np.float64)], at),
                      ([_fedges(np.float16)], at), ([_fedges(DType.bf16.np)], at)]
        if kinds in ("int", "num"):
            cases += [([_iedges(np.int32)], at), ([_iedges(np.int8)], at), ([_iedges(np.int64)], at)]
        if kinds == "int":
            cases += [([_iedges(np.uint8)], at), ([_iedges(np.uint64)], at)]
        return cases

    return examples


def _binary_examples(kinds: str, attrs: dict[str, Any] | None = None, *, int_rhs: Callable[[Any], np.ndarray]
                     | None = None) -> Callable[[np.random.Generator], list[Example]]:
    at = attrs or {}

    def examples(rng: np.random.Generator) -> list[Example]:
        if kinds == "bool":
            return [([rng.standard_normal((3, 1)) > 0, rng.standard_normal((4,)) > 0], at)]
        cases: list[Example] = []
        if kinds in ("float", "num", "any"):
            cases += [([_normal(rng, (3, 1)), _normal(rng, (4,))], at),
                      (_pairs(_fedges(), _fedges()), at),
                      (_pairs(_fedges(np.float16), _fedges(np.float16)), at),
                      (_pairs(_fedges(DType.bf16.np), _fedges(DType.bf16.np)), at),
                      ([_normal(rng, (2, 3), np.float64), _normal(rng, (3,), np.float64)], at)]
        if kinds in ("int", "num", "any"):
            for dt in (np.int32, np.int8, np.uint8, np.int64):
                rhs = int_rhs(dt) if int_rhs else _iedges(dt)
                cases.append((_pairs(_iedges(dt), rhs), at))
        if kinds == "any":
            cases.append(([rng.standard_normal((3, 1)) > 0, rng.standard_normal((4,)) > 0], at))
        return cases

    return examples


# --------------------------------------------------------------------------------------
# binary arithmetic


def _binary(name: str, fn: Callable[..., R.Expr], np_fn: Callable[..., np.ndarray] | None, kinds: str, doc: str,
            *, commutative: bool = False, commutative_float: bool = True, result: DType | None = None,
            attrs: dict[str, tuple[str, Any]] | None = None,
            examples: Callable[[np.random.Generator], list[Example]] | None = None,
            epilogue_fusible: bool = False, precision_policy: PrecisionPolicy = "narrow") -> None:
    define(name, ("lhs", "rhs"), attrs=attrs or {}, shape=_typed(kinds, result), rule=R.elementwise(fn),
           numpy=np_fn, family="elementwise", commutative=commutative, commutative_float=commutative_float, doc=doc,
           examples=examples or _binary_examples(kinds), epilogue_fusible=epilogue_fusible,
           precision_policy=precision_policy)


define("add", ("lhs", "rhs"), shape=_typed("num"), rule=R.elementwise(lambda a, b: a + b),
       numpy=lambda xs, out: np.add(xs[0], xs[1]), family="elementwise", commutative=True,
       examples=_binary_examples("num"), epilogue_fusible=True,
       doc="lhs + rhs with numpy broadcasting")

_binary("sub", lambda a, b: a - b, lambda xs, out: np.subtract(xs[0], xs[1]), "num", "lhs - rhs",
        epilogue_fusible=True)
_binary("mul", lambda a, b: a * b, lambda xs, out: np.multiply(xs[0], xs[1]), "num", "lhs * rhs",
        commutative=True, epilogue_fusible=True)
_binary("div", lambda a, b: a / b, _np_div, "num",
        "lhs / rhs; integers truncate toward zero (ONNX Div), integer division by zero gives 0",
        epilogue_fusible=True)
_binary("pow", lambda a, b: R.call("pow", a, b), _np_pow, "num",
        "lhs ** rhs; integer powers are computed in f64 and converted back",
        examples=_binary_examples("num", int_rhs=lambda dt: np.array([0, 1, 2, 3, 5], dtype=dt)),
        precision_policy="keep-fp32")
_binary("mod", lambda a, b, fmod: R.call("fmod" if fmod else "mod", a, b),
        lambda xs, out, fmod: (np.fmod if fmod else np.mod)(xs[0], xs[1]), "num",
        "remainder: floored, with the sign of rhs (fmod=False, Python %), or C fmod with the sign of lhs "
        "(fmod=True); integer remainder by zero gives 0",
        attrs={"fmod": ("bool", False)},
        examples=lambda rng: [c for f in (False, True) for c in _binary_examples("num", {"fmod": f})(rng)])
_binary("min", R.smin, lambda xs, out: numpy_prims.minimum(xs[0], xs[1]), "num",
        "min(lhs, rhs); NaN propagates; a tie gives rhs (min(-0, +0) is +0)", commutative=True,
        commutative_float=False)
_binary("max", R.smax, lambda xs, out: numpy_prims.maximum(xs[0], xs[1]), "num",
        "max(lhs, rhs); NaN propagates; a tie gives rhs (max(+0, -0) is -0)", commutative=True,
        commutative_float=False)
_binary("bitwise_and", lambda a, b: R.call("bit_and", a, b), lambda xs, out: np.bitwise_and(xs[0], xs[1]),
        "int", "lhs & rhs", commutative=True)
_binary("bitwise_or", lambda a, b: R.call("bit_or", a, b), lambda xs, out: np.bitwise_or(xs[0], xs[1]),
        "int", "lhs | rhs", commutative=True)
_binary("bitwise_xor", lambda a, b: R.call("bit_xor", a, b), lambda xs, out: np.bitwise_xor(xs[0], xs[1]),
        "int", "lhs ^ rhs", commutative=True)


def _shift_type(types: list[TensorType], direction: str) -> TensorType:
    if direction not in ("left", "right"):
        raise OpDefinitionError(f"bit_shift direction must be 'left' or 'right', got {direction!r}",
                                location="bit_shift")
    return _typed("int")(types)


define("bit_shift", ("lhs", "rhs"), attrs={"direction": ("str", REQUIRED)}, shape=_shift_type,
       rule=R.elementwise(lambda a, b, direction: R.call("shl" if direction == "left" else "shr", a, b)),
       numpy=lambda xs, out, direction: (np.left_shift if direction == "left" else np.right_shift)(xs[0], xs[1]),
       family="elementwise", doc="lhs << rhs or lhs >> rhs (arithmetic for signed types)",
       examples=lambda rng: [
           (_pairs(_iedges(dt), np.array([0, 1, 3, 7], dtype=dt)), {"direction": d})
           for dt in (np.uint8, np.uint16, np.uint32, np.uint64, np.int32) for d in ("left", "right")])

define("prelu", ("x", "slope"), shape=_typed("num"),
       rule=R.elementwise(lambda x, slope: R.select(x < 0, x * slope, x)),
       numpy=lambda xs, out: np.where(xs[0] < 0, xs[0] * xs[1], xs[0]), family="elementwise",
       doc="x < 0 ? x * slope : x, slope broadcast against x (ONNX PRelu)",
       examples=lambda rng: [([_normal(rng, (2, 3, 4)), _normal(rng, (3, 1))], {}),
                             (_pairs(_fedges(), np.array([0.25, -2.0, 0.0], np.float32)), {}),
                             ([_iedges(np.int32), np.array([2, -1, 0, 3, 1], np.int32)], {})])

# --------------------------------------------------------------------------------------
# comparisons and logic

for _name, _prim, _np_fn, _comm in [("equal", "eq", np.equal, True), ("not_equal", "ne", np.not_equal, True),
                                    ("less", "lt", np.less, False), ("less_equal", "le", np.less_equal, False),
                                    ("greater", "gt", np.greater, False),
                                    ("greater_equal", "ge", np.greater_equal, False)]:
    _binary(_name, lambda a, b, _p=_prim: R.call(_p, a, b), lambda xs, out, _f=_np_fn: _f(xs[0], xs[1]),
            "any", f"comparison lhs {_prim} rhs -> bool (IEEE: every comparison with NaN is false but ne)",
            commutative=_comm, result=DType.bool)

for _name, _prim, _np_fn in [("logical_and", "and", np.logical_and), ("logical_or", "or", np.logical_or),
                             ("logical_xor", "xor", np.logical_xor)]:
    _binary(_name, lambda a, b, _p=_prim: R.call(_p, a, b), lambda xs, out, _f=_np_fn: _f(xs[0], xs[1]),
            "bool", f"logical {_prim} of bool tensors", commutative=True)

# --------------------------------------------------------------------------------------
# unary ops


def _unary(name: str, fn: Callable[..., R.Expr], np_fn: Callable[..., np.ndarray] | None, kinds: str, doc: str,
           *, attrs: dict[str, tuple[str, Any]] | None = None, result: DType | None = None,
           shape: Callable[..., TensorType] | None = None, variants: tuple[dict[str, Any], ...] = (),
           examples: Callable[[np.random.Generator], list[Example]] | None = None,
           epilogue_fusible: bool = False, precision_policy: PrecisionPolicy = "narrow") -> None:
    """``variants`` are non-default attribute sets the examples also cover (on the edge values)."""
    defaults = {k: v for k, (_, v) in (attrs or {}).items() if v is not REQUIRED and v is not None}

    def with_variants(rng: np.random.Generator) -> list[Example]:
        cases = _unary_examples(kinds, defaults)(rng)
        return cases + [([_fedges(dt)], v) for v in variants for dt in (np.float32, np.float16)]

    define(name, ("x",), attrs=attrs or {}, shape=shape or _typed(kinds, result), rule=R.elementwise(fn),
           numpy=np_fn, family="elementwise", doc=doc, examples=examples or with_variants,
           epilogue_fusible=epilogue_fusible, precision_policy=precision_policy)


def _np_unary(f: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda xs, out: f(xs[0])


_unary("neg", lambda x: -x, _np_unary(np.negative), "num", "-x (integers wrap: -min is min)")
_unary("abs", lambda x: R.call("abs", x), _np_unary(np.abs), "num", "|x| (integers wrap: |min| is min)")
_unary("sign", R.sign, _np_unary(lambda x: np.where(x > 0, 1, np.where(x < 0, -1, x)).astype(x.dtype)), "num",
       "-1, 0 or 1; zeros keep their sign and NaN stays NaN")
_unary("reciprocal", R.reciprocal, _np_unary(np.reciprocal), "float", "1 / x")
_unary("rsqrt", _wide(R.rsqrt), _wide_np(lambda x: 1 / np.sqrt(x)), "float", "1 / sqrt(x)")

_PLAIN: dict[str, Any] = {}
_SENSITIVE: dict[str, Any] = {"precision_policy": "keep-fp32"}  # range-sensitive in float16
_EPILOGUE: dict[str, Any] = {"epilogue_fusible": True}
_SENSITIVE_EPILOGUE: dict[str, Any] = {**_SENSITIVE, **_EPILOGUE}  # erf: GELU written out in a matmul's epilogue

for _name, _np_fn, _doc, _props in [
        ("exp", numpy_prims.exp, "e ** x", _SENSITIVE),
        ("log", numpy_prims.log, "natural log; log(0) = -inf, log(x < 0) = NaN", _SENSITIVE),
        ("sqrt", np.sqrt, "square root; NaN for x < 0", _PLAIN),
        ("tanh", numpy_prims.tanh, "hyperbolic tangent", _EPILOGUE),
        ("erf", numpy_prims.erf, "Gauss error function", _SENSITIVE_EPILOGUE),
        *((name, numpy_prims.NUMPY_PRIMITIVES[name], doc, props) for name, doc, props in [
            ("sin", "sine", _PLAIN), ("cos", "cosine", _PLAIN), ("tan", "tangent", _PLAIN),
            ("asin", "arc sine; NaN outside [-1, 1]", _PLAIN), ("acos", "arc cosine; NaN outside [-1, 1]", _PLAIN),
            ("atan", "arc tangent", _PLAIN), ("sinh", "hyperbolic sine", _SENSITIVE),
            ("cosh", "hyperbolic cosine", _SENSITIVE), ("asinh", "inverse hyperbolic sine", _PLAIN),
            ("acosh", "inverse hyperbolic cosine; NaN for x < 1", _PLAIN),
            ("atanh", "inverse hyperbolic tangent; +-inf at +-1, NaN outside", _PLAIN)]),
        ("floor", np.floor, "round toward -inf", _PLAIN), ("ceil", np.ceil, "round toward +inf", _PLAIN)]:
    _unary(_name, lambda x, _p=_name: R.call(_p, x), _np_unary(_np_fn), "float", _doc, **_props)

_unary("round", lambda x: R.call("round_even", x), _np_unary(np.round), "float",
       "round to nearest, ties to even (ONNX Round)", epilogue_fusible=True)

define("relu", ("x",), shape=_typed("num"), rule=R.elementwise(R.relu),
       numpy=lambda xs, out: numpy_prims.maximum(xs[0], np.zeros((), xs[0].dtype)), family="elementwise",
       examples=_unary_examples("num"), epilogue_fusible=True,
       doc="max(x, 0); NaN propagates")

_unary("sigmoid", _wide(R.sigmoid), _wide_np(_np_sigmoid), "float", "1 / (1 + exp(-x))", epilogue_fusible=True)
_unary("silu", _wide(R.silu), _wide_np(lambda x: x * _np_sigmoid(x)), "float", "x * sigmoid(x) (swish)",
       epilogue_fusible=True)
# the composites below have no fast path: the rule (with its accurate expm1/log1p forms) is
# evaluated, so the interpreter computes exactly what the rule says
_unary("softplus", _wide(R.softplus), None, "float",
       "log(1 + exp(x)), computed without overflow for large x", precision_policy="keep-fp32")
_unary("mish", _wide(R.mish), None, "float",
       "x * tanh(softplus(x))", precision_policy="keep-fp32")
_unary("softsign", _wide(R.softsign), _wide_np(lambda x: x / (1 + np.abs(x))), "float", "x / (1 + |x|)")
_unary("hardsigmoid", _wide(R.hardsigmoid), _wide_np(_np_hardsigmoid), "float",
       "max(0, min(1, alpha * x + beta))", attrs={"alpha": ("float", 0.2), "beta": ("float", 0.5)},
       variants=({"alpha": 0.3, "beta": 0.4}, {"alpha": -1.0, "beta": 0.0}), epilogue_fusible=True)
_unary("hardswish", _wide(R.hardswish), _wide_np(lambda x: x * _np_hardsigmoid(x, 1.0 / 6.0, 0.5)), "float",
       "x * max(0, min(1, x / 6 + 1 / 2)) (ONNX HardSwish)", epilogue_fusible=True)
_unary("leaky_relu", _wide(R.leaky_relu), _wide_np(lambda x, alpha: np.where(x < 0, x * alpha, x)), "float",
       "x < 0 ? alpha * x : x", attrs={"alpha": ("float", 0.01)}, variants=({"alpha": 0.2}, {"alpha": -1.5}),
       epilogue_fusible=True)
_unary("thresholded_relu", _wide(R.thresholded_relu),
       _wide_np(lambda x, alpha: np.where(x > alpha, x, np.zeros((), x.dtype))), "float",
       "x > alpha ? x : 0", attrs={"alpha": ("float", 1.0)}, variants=({"alpha": -0.5}, {"alpha": 0.0}))
_unary("elu", _wide(R.elu), None, "float",
       "x < 0 ? alpha * (exp(x) - 1) : x", attrs={"alpha": ("float", 1.0)}, variants=({"alpha": 0.5},),
       epilogue_fusible=True)
_unary("selu", _wide(R.selu), None, "float",
       "gamma * (x > 0 ? x : alpha * (exp(x) - 1)); defaults are ONNX's constants",
       attrs={"alpha": ("float", 1.67326319217681884765625), "gamma": ("float", 1.05070102214813232421875)},
       variants=({"alpha": 2.0, "gamma": 3.0},))
_unary("celu", _wide(R.celu), None, "float",
       "max(0, x) + min(0, alpha * (exp(x / alpha) - 1))", attrs={"alpha": ("float", 1.0)},
       variants=({"alpha": 2.0}, {"alpha": 0.25}))


def _gelu_type(types: list[TensorType], approximate: str) -> TensorType:
    if approximate not in ("none", "tanh"):
        raise OpDefinitionError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}",
                                location="gelu")
    return _typed("float")(types)


_unary("gelu", _wide(R.gelu), _wide_np(_np_gelu), "float",
       "x * Phi(x) (approximate='none', with erf) or its tanh approximation (approximate='tanh')",
       attrs={"approximate": ("str", "none")}, shape=_gelu_type, epilogue_fusible=True,
       examples=lambda rng: [c for a in ("none", "tanh") for c in _unary_examples("float", {"approximate": a})(rng)])

# --------------------------------------------------------------------------------------
# clip


def _clip_bound(v: float | None, dtype: DType) -> float | int | None:
    """A clip bound as a value of ``dtype``: integer types clamp it to their range first."""
    if v is None or not dtype.is_int:
        return v
    info = np.iinfo(dtype.np)
    if not math.isfinite(v):
        return int(info.max) if v > 0 else int(info.min)
    return min(max(int(v), int(info.min)), int(info.max))


def _clip_type(types: list[TensorType], min: float | None, max: float | None) -> TensorType:
    out = _typed("num")(types)
    if out.dtype.is_int:
        for what, v in (("min", min), ("max", max)):
            if v is not None and (math.isnan(v) or (math.isfinite(v) and v != int(v))):
                raise OpDefinitionError(f"clip {what}={v} is not an integer, but the operand is {out.dtype}",
                                        location="clip")
    return out


def _clip_rule(x: R.Expr, min: float | None, max: float | None) -> R.Expr:
    return R.clip(x, _clip_bound(min, x.dtype), _clip_bound(max, x.dtype))


def _clip_examples(rng: np.random.Generator) -> list[Example]:
    bounds = [{"min": -0.5, "max": 0.5}, {"min": 1.0, "max": -1.0}, {"min": 0.0}, {"max": 2.5}, {},
              {"min": -math.inf, "max": math.inf}]
    cases: list[Example] = [([_fedges()], b) for b in bounds]
    cases += [([_normal(rng, (2, 3), np.float16)], {"min": -0.3, "max": 0.7}),
              ([_fedges(DType.bf16.np)], {"min": -1.0, "max": 1.0}),
              ([_fedges(np.float64)], {"min": -1e300, "max": 1e-300}),
              ([_iedges(np.int32)], {"min": -5.0, "max": 7.0}), ([_iedges(np.int8)], {"min": -1e10, "max": 1e10}),
              ([_iedges(np.int64)], {"min": -math.inf, "max": 3.0}), ([_iedges(np.uint8)], {"min": 2.0, "max": 1.0})]
    return cases


_unary("clip", _clip_rule, _np_clip, "num",
       "min(max(x, min), max); a missing bound is no bound, min > max gives max, NaN propagates; "
       "integer operands clamp the bounds to their range",
       attrs={"min": ("float", None), "max": ("float", None)}, shape=_clip_type, examples=_clip_examples,
       epilogue_fusible=True)

# --------------------------------------------------------------------------------------
# classification and bitwise/logical not


def _isinf_rule(x: R.Expr, detect_positive: bool, detect_negative: bool) -> R.Expr:
    inf = R.call("isinf", x)
    if detect_positive and detect_negative:
        return inf
    if detect_positive:
        return R.call("and", inf, x > 0)
    if detect_negative:
        return R.call("and", inf, x < 0)
    return R.lit(False, DType.bool)


def _np_isinf(xs: list[np.ndarray], out: TensorType, detect_positive: bool, detect_negative: bool) -> np.ndarray:
    x = xs[0]
    return np.isinf(x) & (((x > 0) & detect_positive) | ((x < 0) & detect_negative))


_unary("isnan", lambda x: R.call("isnan", x), _np_unary(np.isnan), "float", "x is NaN", result=DType.bool)
_unary("isinf", _isinf_rule, _np_isinf, "float", "x is +inf (detect_positive) or -inf (detect_negative)",
       result=DType.bool, attrs={"detect_positive": ("bool", True), "detect_negative": ("bool", True)},
       examples=lambda rng: [([_fedges(dt)], {"detect_positive": p, "detect_negative": n})
                             for dt in (np.float32, np.float16) for p in (True, False) for n in (True, False)])
_unary("bitwise_not", lambda x: R.call("bit_not", x), _np_unary(np.invert), "int", "~x")
_unary("logical_not", lambda x: R.call("not", x), _np_unary(np.logical_not), "bool", "not x")

# --------------------------------------------------------------------------------------
# cast and where


def _cast_type(types: list[TensorType], to: DType) -> TensorType:
    return types[0].with_dtype(to)


def _cast_examples(rng: np.random.Generator) -> list[Example]:
    cases: list[Example] = []
    floats = [_fedges(np.float32), _fedges(np.float64), _fedges(np.float16), _fedges(DType.bf16.np)]
    for src in floats:
        for to in (DType.f32, DType.f64, DType.f16, DType.bf16, DType.bool):
            cases.append(([src], {"to": to}))
    for to in (DType.i32, DType.i64, DType.i8, DType.u8, DType.i16, DType.u64):
        info = np.iinfo(to.np)
        lo, hi = max(float(info.min), -1000.0), min(float(info.max), 1000.0)
        vals = np.clip(_normal(rng, (3, 4), np.float64, 100.0), lo, hi)
        vals[0, :3] = [np.nan, np.inf, -np.inf]
        vals[1, :2] = [lo + 0.75, hi - 0.75]
        for src_dt in (np.float32, np.float64, np.float16):
            cases.append(([vals.astype(src_dt)], {"to": to}))
    for src_dt in (np.int64, np.int32, np.int8, np.uint8, np.uint64):
        for to in (DType.f32, DType.f16, DType.bf16, DType.i8, DType.u16, DType.i64, DType.bool):
            cases.append(([_iedges(src_dt)], {"to": to}))
    cases.append(([rng.standard_normal((2, 3)) > 0], {"to": DType.f32}))
    cases.append(([rng.standard_normal((2, 3)) > 0], {"to": DType.i64}))
    return cases


define("cast", ("x",), attrs={"to": ("dtype", REQUIRED)},
       shape=_cast_type, rule=R.elementwise(lambda x, to: R.cast(x, to)), numpy=_np_cast, family="elementwise",
       examples=_cast_examples, epilogue_fusible=True, precision_policy="as-declared",
       doc="convert element type; float->int truncates toward zero (NaN/inf give 0, other out-of-range values "
           "are unspecified), ->bool is x != 0, int->int wraps, float->narrower float rounds to nearest even")


# --------------------------------------------------------------------------------------
# bitcast


def _bitcast_type(types: list[TensorType], to: DType) -> TensorType:
    """The operand's shape with element type ``to``, when its bits can be read as ``to``."""
    refused = R.bitcast_refusal(types[0].dtype, to)
    if refused is not None:
        raise TypeError(refused)
    return types[0].with_dtype(to)


def _float_bits(dt: DType) -> np.ndarray:
    """Floats of ``dt`` with every kind of bit pattern as a (2, 6) array: signed zeros, a subnormal,
    normals, infinities, and quiet and signaling NaNs of both signs carrying payloads."""
    nmant = int(ml_dtypes.finfo(dt.np).nmant)
    ints = np.dtype(f"u{dt.bits // 8}")
    sign, quiet = 1 << (dt.bits - 1), 1 << (nmant - 1)
    inf = (sign - 1) ^ ((1 << nmant) - 1)
    nans = np.array([inf | 1, inf | quiet | 5, sign | inf | 2, sign | inf | quiet], dtype=ints)
    info = ml_dtypes.finfo(dt.np)
    values = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, float(info.smallest_subnormal), float(info.max)],
                      dtype=np.float64).astype(dt.np)
    return np.concatenate([values.view(ints), nans]).view(dt.np).reshape(2, 6)


_BITCAST_FLOATS = ((DType.f32, (DType.i32, DType.u32)), (DType.f64, (DType.i64, DType.u64)),
                   (DType.f16, (DType.i16, DType.u16, DType.bf16)), (DType.bf16, (DType.i16, DType.u16, DType.f16)))
_BITCAST_INTS = ((DType.i32, DType.f32), (DType.u32, DType.f32), (DType.i64, DType.f64), (DType.u64, DType.f64),
                 (DType.i16, DType.f16), (DType.u16, DType.bf16), (DType.i8, DType.u8), (DType.u8, DType.i8),
                 (DType.u32, DType.i32), (DType.i64, DType.u64))


def _bitcast_examples(rng: np.random.Generator) -> list[Example]:
    """Every float's bit patterns read as integers (and back, so NaN payloads come from the integer
    side too), integer edge values read as floats and as the other signedness, bools as bytes."""
    cases: list[Example] = []
    for src, targets in _BITCAST_FLOATS:
        bits = _float_bits(src)
        cases += [([bits], {"to": to}) for to in targets]
        cases.append(([bits.view(np.dtype(f"i{src.bits // 8}"))], {"to": src}))
    cases += [([_iedges(src.np)], {"to": to}) for src, to in _BITCAST_INTS]
    cases += [([rng.standard_normal((2, 3)) > 0], {"to": DType.u8}),
              ([rng.standard_normal((3,)) > 0], {"to": DType.i8})]
    return cases


define("bitcast", ("x",), attrs={"to": ("dtype", REQUIRED)}, shape=_bitcast_type,
       rule=R.elementwise(lambda x, to: R.bitcast(x, to)), numpy=_np_bitcast, family="elementwise",
       examples=_bitcast_examples, precision_policy="as-declared",
       doc="reinterpret each element's bits as type `to` of the same width (ONNX BitCast): every bit pattern "
           "is kept, NaN payloads and -0.0 included; a bool is the byte 0 or 1 and reads as i8 or u8; no "
           "byte reads as a bool and narrow storage types are not bit-cast")


def _where_type(types: list[TensorType], **_: Any) -> TensorType:
    c, a, b = types
    if c.dtype is not DType.bool:
        raise TypeError(f"condition must be bool, got {c.dtype}")
    return _broadcast_type([a, b]).with_shape(broadcast_shapes(c.shape, a.shape, b.shape))


define("where", ("cond", "lhs", "rhs"), shape=_where_type, rule=R.elementwise(R.select),
       numpy=lambda xs, out: np.where(xs[0], xs[1], xs[2]), family="elementwise",
       examples=lambda rng: [([rng.standard_normal((2, 3)) > 0, rng.standard_normal((2, 3)).astype(np.float32),
                               rng.standard_normal((3,)).astype(np.float32)], {}),
                             ([rng.standard_normal((4, 1)) > 0, _fedges()[0], np.array(np.nan, np.float32)], {}),
                             ([rng.standard_normal((2, 5)) > 0, _iedges(np.int64), _iedges(np.int64)[::-1]], {})],
       doc="cond ? lhs : rhs with broadcasting")
