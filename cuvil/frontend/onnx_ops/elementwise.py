"""ONNX elementwise ops -> CIR elementwise ops.

CIR's binary ops take one element type; where ONNX mixes types (Pow's exponent) the
converter inserts explicit casts. Variadic ONNX ops (Sum, Mean, Min, Max) become
left-to-right chains of the binary op.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_node import NodeCtx, onnx_dtype, onnx_op
from cuvil.ir.dtypes import DType
from cuvil.ir.rules import bitcast_refusal
from cuvil.ir.values import Value

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
    "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
    "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal",
    "Greater": "greater", "GreaterOrEqual": "greater_equal", "PRelu": "prelu",
}
_UNARY = {
    "Relu": "relu", "Neg": "neg", "Abs": "abs", "Sign": "sign", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Reciprocal": "reciprocal", "Tanh": "tanh", "Sigmoid": "sigmoid", "Erf": "erf",
    "Floor": "floor", "Ceil": "ceil", "Round": "round",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "IsNaN": "isnan", "Not": "logical_not", "BitwiseNot": "bitwise_not",
    "Softsign": "softsign", "Softplus": "softplus", "Mish": "mish", "HardSwish": "hardswish",
}
# ONNX activation -> (CIR op, {CIR attr: (ONNX attr, default)})
_ACTIVATIONS: dict[str, tuple[str, dict[str, tuple[str, float]]]] = {
    "LeakyRelu": ("leaky_relu", {"alpha": ("alpha", 0.01)}),
    "Elu": ("elu", {"alpha": ("alpha", 1.0)}),
    "Celu": ("celu", {"alpha": ("alpha", 1.0)}),
    "Selu": ("selu", {"alpha": ("alpha", 1.67326319217681884765625),
                      "gamma": ("gamma", 1.05070102214813232421875)}),
    "HardSigmoid": ("hardsigmoid", {"alpha": ("alpha", 0.2), "beta": ("beta", 0.5)}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": ("alpha", 1.0)}),
}
_VARIADIC = {"Sum": "add", "Min": "min", "Max": "max"}
# Clip before opset 11 bounds by float attributes whose defaults are the f32 extremes
_FLT_MAX = float(np.finfo(np.float32).max)


@onnx_op(*_BINARY, emits=_BINARY)
def binary(ctx: NodeCtx) -> Value:
    return ctx.b.op(_BINARY[ctx.node.op_type], ctx.input(0), ctx.input(1))


@onnx_op(*_UNARY, emits=_UNARY)
def unary(ctx: NodeCtx) -> Value:
    return ctx.b.op(_UNARY[ctx.node.op_type], ctx.input(0))


@onnx_op(*_ACTIVATIONS, emits={k: op for k, (op, _) in _ACTIVATIONS.items()})
def activation(ctx: NodeCtx) -> Value:
    op, attrs = _ACTIVATIONS[ctx.node.op_type]
    return ctx.b.op(op, ctx.input(0), **{k: ctx.attr_float(name, d) for k, (name, d) in attrs.items()})


@onnx_op(*_VARIADIC, emits=_VARIADIC)
def variadic(ctx: NodeCtx) -> Value:
    return _chain(ctx, _VARIADIC[ctx.node.op_type])


@onnx_op("Mean", emits=("add", "div"))
def mean(ctx: NodeCtx) -> Value:
    total = _chain(ctx, "add")
    count = sum(1 for i in range(len(ctx.inputs)) if ctx.has_input(i))
    if count == 1:
        return total
    return ctx.b.div(total, ctx.b.scalar(count, total.dtype))


def _chain(ctx: NodeCtx, op: str) -> Value:
    xs = [ctx.input(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    if not xs:
        raise ctx.unsupported("needs at least one input")
    out = xs[0]
    for x in xs[1:]:
        out = ctx.b.op(op, out, x)
    return out


@onnx_op("Mod", emits=("mod",))
def mod(ctx: NodeCtx) -> Value:
    return ctx.b.mod(ctx.input(0), ctx.input(1), fmod=bool(ctx.attr_int("fmod", 0)))


@onnx_op("BitShift", emits=("bit_shift",))
def bit_shift(ctx: NodeCtx) -> Value:
    direction = ctx.attr_str("direction").lower()
    if direction not in ("left", "right"):
        raise ctx.unsupported(f"direction {direction!r} (expected LEFT or RIGHT)")
    return ctx.b.bit_shift(ctx.input(0), ctx.input(1), direction=direction)


def common_dtype(a: DType, b: DType) -> DType:
    """The type numpy would compute a mixed-type binary op in (f16 with bf16 meets at f32,
    integers with floats at f64), limited to CIR's types."""
    if a is b:
        return a
    if a.is_float and b.is_float:
        if {a, b} == {DType.f16, DType.bf16}:
            return DType.f32
        return a if a.bits >= b.bits else b
    if a.is_float or b.is_float:
        return DType.f64
    promoted = np.result_type(a.np, b.np)
    return DType.i64 if promoted.kind == "f" else DType.from_numpy(promoted)


@onnx_op("Pow", emits=("pow", "cast"))
def pow_(ctx: NodeCtx) -> Value:
    """ONNX Pow's exponent may have another type: compute in the common type, return the base's."""
    base, exponent = ctx.input(0), ctx.input(1)
    if base.dtype is exponent.dtype:
        return ctx.b.pow(base, exponent)
    common = common_dtype(base.dtype, exponent.dtype)
    out = ctx.b.pow(_cast(ctx, base, common), _cast(ctx, exponent, common))
    return _cast(ctx, out, base.dtype)


def _cast(ctx: NodeCtx, x: Value, to: DType) -> Value:
    if x.dtype is to:
        return x
    if to.is_float and to.is_narrow and x.dtype.is_float and ctx.attr_int("saturate", 1):
        # ONNX saturates float8/float4 conversions by default: out-of-range values (and
        # infinities) become the largest finite value of the target type
        limit = float(ml_dtypes.finfo(to.np).max)
        if limit < float(ml_dtypes.finfo(x.dtype.np).max):
            x = ctx.b.clip(x, min=-limit if to.is_signed else None, max=limit)
    if to is DType.f8e8m0 and x.dtype.is_float:
        return _cast_power_of_two(ctx, x, ctx.attr_str("round_mode", "up"), bool(ctx.attr_int("saturate", 1)))
    return ctx.b.cast(x, to=to)


def _cast_power_of_two(ctx: NodeCtx, x: Value, mode: str, saturate: bool) -> Value:
    """A cast to FLOAT8E8M0 (powers of two) rounding as ``round_mode`` says: the nearest power
    (the cast's own rounding), then one power up where that fell below ``x`` ("up") or down where
    it rose above it ("down"); the neighbour of a power of two is exact in ``x``'s type. Saturating,
    values below the smallest power (2**-127, zero included) become it."""
    if mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={mode!r}")
    b = ctx.b
    out = near = b.cast(x, to=DType.f8e8m0)
    if mode != "nearest":
        back = b.cast(near, to=x.dtype)
        if mode == "up":
            missed, other = b.less(back, x), b.mul(back, b.scalar(2.0, x.dtype))
        else:
            missed, other = b.greater(back, x), b.mul(back, b.scalar(0.5, x.dtype))
        out = b.where(missed, b.cast(other, to=DType.f8e8m0), near)
    if saturate:
        wide = x if x.dtype in (DType.f32, DType.f64) else b.cast(x, to=DType.f32)
        smallest = np.array(2.0 ** -127, dtype=wide.dtype.np)
        below = b.less(wide, b.const(smallest))
        out = b.where(below, b.const(smallest.astype(DType.f8e8m0.np)), out)
    return out


@onnx_op("Cast", emits=("cast", "clip", "less", "greater", "mul", "where"))
def cast(ctx: NodeCtx) -> Value:
    return _cast(ctx, ctx.input(0), onnx_dtype(ctx.attr_int("to"), ctx.location))


@onnx_op("CastLike", emits=("cast", "clip", "less", "greater", "mul", "where"))
def cast_like(ctx: NodeCtx) -> Value:
    return _cast(ctx, ctx.input(0), ctx.input(1).dtype)


@onnx_op("BitCast", emits=("bitcast",))
def bitcast(ctx: NodeCtx) -> Value:
    """The input's bits read as type ``to``; ONNX requires equal widths (a bool is one byte)."""
    x = ctx.input(0)
    to = onnx_dtype(ctx.attr_int("to"), ctx.location)
    refused = bitcast_refusal(x.dtype, to)
    if refused is not None:
        raise ctx.unsupported(refused)
    return x if x.dtype is to else ctx.b.bitcast(x, to=to)


@onnx_op("Where", emits=("where",))
def where(ctx: NodeCtx) -> Value:
    return ctx.b.where(ctx.input(0), ctx.input(1), ctx.input(2))


@onnx_op("IsInf", emits=("isinf",))
def isinf(ctx: NodeCtx) -> Value:
    return ctx.b.isinf(ctx.input(0), detect_positive=bool(ctx.attr_int("detect_positive", 1)),
                       detect_negative=bool(ctx.attr_int("detect_negative", 1)))


@onnx_op("Gelu", emits=("gelu",))
def gelu(ctx: NodeCtx) -> Value:
    approximate = ctx.attr_str("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approximate!r}")
    return ctx.b.gelu(ctx.input(0), approximate=approximate)


def swish_of(ctx: NodeCtx, x: Value, alpha: float) -> Value:
    """``x sigmoid(alpha x)`` (``silu`` where alpha is 1)."""
    if alpha == 1.0:
        return ctx.b.silu(x)
    return ctx.b.mul(x, ctx.b.sigmoid(ctx.b.mul(x, ctx.b.scalar(alpha, x.dtype))))


@onnx_op("Swish", emits=("silu", "sigmoid", "mul"))
def swish(ctx: NodeCtx) -> Value:
    return swish_of(ctx, ctx.input(0), ctx.attr_float("alpha", 1.0))


@onnx_op("SwiGLU", emits=("silu", "sigmoid", "mul"))
def swiglu(ctx: NodeCtx) -> Value:
    gate, value = ctx.input(0), ctx.input(1)
    return ctx.b.mul(swish_of(ctx, gate, ctx.attr_float("alpha", 1.0)), value)


@onnx_op("Clip", emits=("clip", "max", "min", "reshape"))
def clip(ctx: NodeCtx) -> Value:
    """Bounds are attributes before opset 11 and optional inputs after. A missing bound is the
    type's extreme (so +-inf clamps to the largest finite value, as ONNX specifies); a bound that
    is not a compile-time value (or not exact as a float) becomes a max/min with the tensor."""
    x = ctx.input(0)
    if ctx.opset < 11:
        return ctx.b.clip(x, min=ctx.attr_float("min", -_FLT_MAX), max=ctx.attr_float("max", _FLT_MAX))
    extreme = _float_max(x.dtype)
    bounds: list[float | Value | None] = []
    for i, sign in ((1, -1.0), (2, 1.0)):
        if not ctx.has_input(i):
            bounds.append(None if extreme is None else sign * extreme)
            continue
        value = _static_scalar(ctx, i)
        bounds.append(_scalar_tensor(ctx, i) if value is None else value)
    lo, hi = bounds
    if not isinstance(lo, Value) and not isinstance(hi, Value):
        return ctx.b.clip(x, min=lo, max=hi)
    out = ctx.b.max(x, lo) if isinstance(lo, Value) else x if lo is None else ctx.b.clip(x, min=lo)
    if isinstance(hi, Value):
        return ctx.b.min(out, hi)
    return out if hi is None else ctx.b.clip(out, max=hi)


def _float_max(dtype: DType) -> float | None:
    """The largest finite value of a float type (None for integer types, whose range bounds them)."""
    if not dtype.is_float:
        return None
    return float(ml_dtypes.finfo(dtype.np).max)


def _scalar_tensor(ctx: NodeCtx, i: int) -> Value:
    """A bound given as a one-element tensor, as a rank-0 value so it does not widen the result."""
    v = ctx.input(i)
    return v if v.type.rank == 0 else ctx.b.reshape(v, shape=[])


def _static_scalar(ctx: NodeCtx, i: int) -> float | None:
    """Input ``i`` as a float when it is a compile-time scalar that a float represents exactly."""
    v = ctx.input(i)
    if v.is_param:
        return None
    try:
        arr = ctx.static(i)
    except UnsupportedOpError:  # a graph input (StaticInputRequired) or a symbolic value
        return None
    if arr.dtype == object or arr.size != 1:
        return None
    item = arr.reshape(()).item()
    value = float(item)
    if not math.isnan(value) and isinstance(item, int) and int(value) != item:
        return None
    return value


@onnx_op("Shrink", emits=("less", "greater", "add", "sub", "where", "cast"))
def shrink(ctx: NodeCtx) -> Value:
    """x < -lambd ? x + bias : (x > lambd ? x - bias : 0); integer inputs compute in f64 as the
    ONNX reference does, then convert back."""
    x = ctx.input(0)
    bias, lambd = ctx.attr_float("bias", 0.0), ctx.attr_float("lambd", 0.5)
    b = ctx.b
    work = x if x.dtype.is_float else b.cast(x, to=DType.f64)
    dt = work.dtype
    low = b.less(work, b.scalar(-lambd, dt))
    high = b.greater(work, b.scalar(lambd, dt))
    out = b.where(low, b.add(work, b.scalar(bias, dt)),
                  b.where(high, b.sub(work, b.scalar(bias, dt)), b.scalar(0, dt)))
    return _cast(ctx, out, x.dtype)
