"""aten elementwise ops (unary, binary, comparisons, logic, where) -> CIR."""

from __future__ import annotations

import math
from typing import Any

from cuvil.frontend.aten_node import AtenConverter, AtenCtx, aten_op
from cuvil.frontend.torch_ops.helpers import binary_operands, first_two
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

_UNARY_FLOAT = {  # aten name -> CIR op; the input is converted to the output dtype first
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "neg": "neg", "abs": "abs", "erf": "erf", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "reciprocal": "reciprocal", "floor": "floor", "ceil": "ceil",
    "round": "round", "silu": "silu", "mish": "mish", "hardswish": "hardswish",
}
_WHOLE_ON_INTEGERS = frozenset({"floor", "ceil", "round"})
"""torch rounds an integer tensor to itself."""


def _unary(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self", ctx.out_dtype())
        if cir in _WHOLE_ON_INTEGERS and not x.dtype.is_float:
            return x
        return ctx.b.op(cir, x)

    return conv


for _aten, _cir in _UNARY_FLOAT.items():
    aten_op(f"{_aten}.default", emits=(_cir, "cast"))(_unary(_cir))


@aten_op("log1p.default", emits=("log", "add", "sub", "mul", "div", "equal", "where", "cast"))
def _log1p(ctx: AtenCtx) -> Value:
    """log(1 + x) without losing a small x (Kahan: ``log(u) * x / (u - 1)`` for ``u = 1 + x``, x where
    ``u`` rounds to 1): ``log1p(1e-10)`` is 1e-10, not 0."""
    x = ctx.tensor("self", ctx.out_dtype())
    b = ctx.b
    one = b.scalar(1, x.dtype)
    u = b.add(x, one)
    step = b.sub(u, one)
    scaled = b.div(b.mul(b.log(u), x), step)
    return b.where(b.equal(step, b.scalar(0, x.dtype)), x, b.where(b.equal(u, x), b.log(u), scaled))


@aten_op("expm1.default", emits=("exp", "log", "sub", "mul", "div", "equal", "isinf", "where", "cast"))
def _expm1(ctx: AtenCtx) -> Value:
    """exp(x) - 1 without losing a small x (Kahan: ``(u - 1) * x / log(u)`` for ``u = exp(x)``, x where ``u``
    rounds to 1): ``expm1(1e-7)`` is 1.00000005e-7, not 1.19e-7."""
    x = ctx.tensor("self", ctx.out_dtype())
    b = ctx.b
    one = b.scalar(1, x.dtype)
    u = b.exp(x)
    step = b.sub(u, one)
    scaled = b.div(b.mul(step, x), b.log(u))
    plain = b.where(b.isinf(u), u, scaled)  # exp overflowed: inf, not inf * x / inf
    plain = b.where(b.equal(u, b.scalar(0, x.dtype)), b.scalar(-1, x.dtype), plain)  # not 0 * -inf / -inf
    return b.where(b.equal(u, one), x, plain)


@aten_op("sign.default", "sgn.default", emits=("greater", "less", "sub", "cast", "sign"))
def _sign(ctx: AtenCtx) -> Value:
    """torch's sign: ``(x > 0) - (x < 0)``, so a NaN and either zero give +0."""
    x = ctx.tensor("self", ctx.out_dtype())
    if not x.dtype.is_float:
        return ctx.b.sign(x) if x.dtype is not DType.bool else x
    b = ctx.b
    zero = b.scalar(0, x.dtype)
    return b.sub(b.cast(b.greater(x, zero), to=x.dtype), b.cast(b.less(x, zero), to=x.dtype))


_SAME_WIDTH_INT = {DType.f64: DType.i64, DType.f32: DType.i32, DType.f16: DType.i16, DType.bf16: DType.i16}


def _sign_bit(ctx: AtenCtx, x: Value) -> Value:
    """Whether ``x``'s sign bit is set: -0.0 and NaNs with it too, which no comparison tells."""
    b = ctx.b
    if not x.dtype.is_float:
        return b.less(x, b.scalar(0, x.dtype))
    as_int = _SAME_WIDTH_INT[x.dtype]
    return b.less(b.bitcast(x, to=as_int), b.scalar(0, as_int))


@aten_op("signbit.default", emits=("bitcast", "less"))
def _signbit(ctx: AtenCtx) -> Value:
    return _sign_bit(ctx, ctx.tensor("self"))


@aten_op("copysign.Tensor", "copysign.Scalar", emits=("bitcast", "less", "abs", "neg", "where", "cast"))
def _copysign(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    x, y = binary_operands(ctx, *first_two(ctx), dtype)
    b = ctx.b
    magnitude = b.abs(x)
    return b.where(_sign_bit(ctx, y), b.neg(magnitude), magnitude)


@aten_op("atan2.default", "arctan2.default",
         emits=("atan", "div", "add", "bitcast", "less", "greater", "equal", "isnan", "isinf", "logical_or",
                "logical_and", "where", "cast"))
def _atan2(ctx: AtenCtx) -> Value:
    """The angle of (x, y) in (-pi, pi]: ``atan(y / x)`` moved by pi where x < 0, C's values on the axes and at
    infinities (``atan2(-0.0, -1)`` is -pi, ``atan2(inf, -inf)`` 3pi/4), NaN where either is. Narrower floats
    are computed in float64 and rounded once, so they are within half an ulp of the exact angle."""
    out = ctx.out_dtype()
    b = ctx.b
    wide = DType.f64
    y, x = (b.cast(v, to=wide) if v.dtype is not wide else v for v in binary_operands(ctx, *first_two(ctx), out))
    zero = b.scalar(0.0, wide)

    def signed(magnitude: float, of: Value) -> Value:
        return b.where(_sign_bit(ctx, of), b.scalar(-magnitude, wide), b.scalar(magnitude, wide))

    angle = b.atan(b.div(y, x))
    angle = b.where(b.less(x, zero), b.add(angle, signed(math.pi, y)), angle)
    on_axis = b.where(b.equal(y, zero), b.where(_sign_bit(ctx, x), signed(math.pi, y), y),
                      signed(math.pi / 2, y))
    angle = b.where(b.equal(x, zero), on_axis, angle)
    corner = b.where(b.greater(x, zero), signed(math.pi / 4, y), signed(3 * math.pi / 4, y))
    angle = b.where(b.logical_and(b.isinf(x), b.isinf(y)), corner, angle)
    angle = b.where(b.logical_or(b.isnan(x), b.isnan(y)), b.add(x, y), angle)
    return angle if out is wide else b.cast(angle, to=out)


@aten_op("fmax.default", "fmin.default", emits=("max", "min", "isnan", "where"))
def _fmax_fmin(ctx: AtenCtx) -> Value:
    """max/min ignoring a NaN operand (NaN only where both are)."""
    dtype = ctx.out_dtype()
    x, y = binary_operands(ctx, *first_two(ctx), dtype)
    b = ctx.b
    pick = b.max(x, y) if ctx.op_name.startswith("aten.fmax") else b.min(x, y)
    if not dtype.is_float:
        return pick
    return b.where(b.isnan(x), y, b.where(b.isnan(y), x, pick))


@aten_op("log2.default", "log10.default", emits=("log", "mul", "cast"))
def _log_base(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    base = 2.0 if ctx.op_name.startswith("aten.log2") else 10.0
    return ctx.b.mul(ctx.b.log(x), ctx.b.scalar(1.0 / math.log(base), x.dtype))


@aten_op("exp2.default", emits=("pow", "cast"))
def _exp2(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.pow(ctx.b.scalar(2, x.dtype), x)


@aten_op("trunc.default", emits=("floor", "ceil", "less", "where"))
def _trunc(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    if not x.dtype.is_float:
        return x
    b = ctx.b
    return b.where(b.less(x, b.scalar(0, x.dtype)), b.ceil(x), b.floor(x))


@aten_op("isnan.default", emits=("isnan", "expand"))
def _isnan(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return ctx.b.isnan(x) if x.dtype.is_float else _none_of(ctx, x)


@aten_op("isinf.default", emits=("isinf", "expand"))
def _isinf(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return ctx.b.isinf(x, detect_positive=True, detect_negative=True) if x.dtype.is_float else _none_of(ctx, x)


def _none_of(ctx: AtenCtx, x: Value) -> Value:
    """False for every element of an integer or bool tensor (no NaN or infinity there)."""
    return ctx.b.expand(ctx.b.scalar(False, DType.bool), shape=tuple(x.shape))


@aten_op("logical_not.default", emits=("logical_not", "cast"))
def _logical_not(ctx: AtenCtx) -> Value:
    return ctx.b.logical_not(ctx.tensor("self", DType.bool))


@aten_op("bitwise_not.default", emits=("bitwise_not", "logical_not"))
def _bitwise_not(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return ctx.b.logical_not(x) if x.dtype is DType.bool else ctx.b.bitwise_not(x)


@aten_op("hardsigmoid.default", emits=("hardsigmoid", "cast"))
def _hardsigmoid(ctx: AtenCtx) -> Value:
    return ctx.b.hardsigmoid(ctx.tensor("self", ctx.out_dtype()), alpha=1.0 / 6.0, beta=0.5)


@aten_op("gelu.default", emits=("gelu",))
def _gelu(ctx: AtenCtx) -> Value:
    return ctx.b.gelu(ctx.tensor("self"), approximate=str(ctx.get("approximate", "none")))


@aten_op("leaky_relu.default", emits=("leaky_relu",))
def _leaky_relu(ctx: AtenCtx) -> Value:
    return ctx.b.leaky_relu(ctx.tensor("self"), alpha=float(ctx.get("negative_slope", 0.01)))


@aten_op("rrelu_with_noise_functional.default", "rrelu.default", emits=("leaky_relu",))
def _rrelu(ctx: AtenCtx) -> Value | tuple[Value, Value]:
    """RReLU in evaluation: a leaky ReLU whose slope is the middle of its range (training draws it)."""
    if ctx.get("training", False):
        raise ctx.unsupported("training (a random slope per element)")
    lower, upper = float(ctx.get("lower", 1.0 / 8.0)), float(ctx.get("upper", 1.0 / 3.0))
    y = ctx.b.leaky_relu(ctx.tensor("self"), alpha=(lower + upper) / 2)
    return (y, ctx.tensor("noise")) if ctx.op_name.startswith("aten.rrelu_with_noise_functional") else y


@aten_op("elu.default", emits=("elu", "mul"))
def _elu(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    scale, input_scale = float(ctx.get("scale", 1.0)), float(ctx.get("input_scale", 1.0))
    if input_scale != 1.0:
        raise ctx.unsupported(f"input_scale={input_scale}")
    y = ctx.b.elu(x, alpha=float(ctx.get("alpha", 1.0)))
    return y if scale == 1.0 else ctx.b.mul(y, ctx.b.scalar(scale, x.dtype))


@aten_op("softplus.default", emits=("softplus", "mul", "div", "greater", "where"))
def _softplus(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    beta, threshold = float(ctx.get("beta", 1.0)), float(ctx.get("threshold", 20.0))
    b = ctx.b
    bx = x if beta == 1.0 else b.mul(x, b.scalar(beta, x.dtype))
    soft = b.softplus(bx)
    if beta != 1.0:
        soft = b.div(soft, b.scalar(beta, x.dtype))
    return b.where(b.greater(bx, b.scalar(threshold, x.dtype)), x, soft)


def _clip(ctx: AtenCtx, x: Value, lo: Any, hi: Any) -> Value:
    b = ctx.b
    if isinstance(lo, Value) or isinstance(hi, Value):
        y = x if lo is None else b.max(x, ctx.imp.as_value(lo, x.dtype, ctx.location))
        return y if hi is None else b.min(y, ctx.imp.as_value(hi, x.dtype, ctx.location))
    if x.dtype.is_float:
        return b.clip(x, min=None if lo is None else float(lo), max=None if hi is None else float(hi))
    y = x if lo is None else b.max(x, ctx.imp.as_value(lo, x.dtype, ctx.location))
    return y if hi is None else b.min(y, ctx.imp.as_value(hi, x.dtype, ctx.location))


@aten_op("hardtanh.default", emits=("clip", "max", "min"))
def _hardtanh(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self"), ctx.get("min_val", -1.0), ctx.get("max_val", 1.0))


@aten_op("clamp.default", "clamp.Tensor", emits=("clip", "max", "min", "cast"))
def _clamp(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), ctx.get("min"), ctx.get("max"))


@aten_op("clamp_min.default", "clamp_min.Tensor", emits=("clip", "max", "cast"))
def _clamp_min(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), ctx["min"], None)


@aten_op("clamp_max.default", "clamp_max.Tensor", emits=("clip", "min", "cast"))
def _clamp_max(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), None, ctx["max"])


_BINARY_ARITH = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
                 "pow": "pow", "remainder": "mod", "fmod": "mod"}


_ON_BOOLS = {"mul": "logical_and", "min": "logical_and", "add": "logical_or", "max": "logical_or"}
"""What torch's arithmetic means on bool tensors (``isclose`` and ``logaddexp`` decompose to a ``mul`` of masks)."""


def _integer_power(ctx: AtenCtx, x: Value, n: int) -> Value:
    """An integer tensor to a whole constant power as torch computes it: products (square and multiply), so
    exact where it fits and wrapping where it overflows (``3 ** 39`` in int64 is 4052555153018976267; the rule's
    ``pow`` of integers goes through float64 and loses the low bits past 2**53)."""
    if n < 0:
        raise ctx.unsupported(f"an integer to the negative power {n} (torch refuses it)")
    b = ctx.b
    result: Value | None = None
    square = x
    while n:
        if n & 1:
            result = square if result is None else b.mul(result, square)
        n >>= 1
        if n:
            square = b.mul(square, square)
    return result if result is not None else b.expand(ctx.imp.as_value(1, x.dtype, ctx.location), shape=x.shape)


def _binary(aten: str, cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        a, b_ = first_two(ctx)
        dtype = ctx.out_dtype()
        alpha = ctx.args.get("alpha")
        if alpha is not None and alpha != 1:
            b_ = ctx.b.mul(ctx.imp.as_value(b_, dtype, ctx.location), ctx.imp.as_value(alpha, dtype, ctx.location))
        if aten == "pow" and dtype.is_int and isinstance(b_, int) and not isinstance(b_, bool):
            return _integer_power(ctx, ctx.imp.as_value(a, dtype, ctx.location), b_)
        x, y = binary_operands(ctx, a, b_, dtype)
        if dtype is DType.bool and cir in _ON_BOOLS:  # torch's arithmetic on bools is logic
            return ctx.b.op(_ON_BOOLS[cir], x, y)
        if aten == "fmod":
            return ctx.b.mod(x, y, fmod=True)
        if aten == "remainder" and dtype.is_float:
            return ctx.b.mod(x, y, fmod=False)
        return ctx.b.op(cir, x, y)

    return conv


for _aten, _cir in _BINARY_ARITH.items():
    _overloads = {"add": ("Tensor", "Scalar"), "sub": ("Tensor", "Scalar"), "mul": ("Tensor", "Scalar"),
                  "div": ("Tensor", "Scalar"), "maximum": ("default",), "minimum": ("default",),
                  "pow": ("Tensor_Tensor", "Tensor_Scalar", "Scalar"),
                  "remainder": ("Tensor", "Scalar", "Scalar_Tensor"), "fmod": ("Tensor", "Scalar")}[_aten]
    aten_op(*(f"{_aten}.{o}" for o in _overloads), emits=(_cir, "mul", "cast", "expand", "logical_and", "logical_or"))(
        _binary(_aten, _cir))


@aten_op("rsub.Scalar", "rsub.Tensor", emits=("sub", "mul", "cast"))
def _rsub(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    x = ctx.tensor("self", dtype)
    alpha = ctx.get("alpha", 1)
    if alpha != 1:
        x = ctx.b.mul(x, ctx.imp.as_value(alpha, dtype, ctx.location))
    return ctx.b.sub(ctx.tensor("other", dtype), x)


@aten_op("div.Tensor_mode", "div.Scalar_mode", "floor_divide.default",
         emits=("div", "floor", "ceil", "where", "less", "greater", "equal", "not_equal", "logical_and", "mod", "sub",
                "add", "mul", "cast"))
def _div_mode(ctx: AtenCtx) -> Value:
    mode = ctx.get("rounding_mode", "floor" if ctx.op_name.startswith("aten.floor_divide") else None)
    dtype = ctx.out_dtype()
    x, y = binary_operands(ctx, *first_two(ctx), dtype)
    b = ctx.b
    if mode is None:
        return b.div(x, y)
    if dtype.is_float and mode == "floor":
        return _floor_divide(ctx, x, y)
    if dtype.is_float:
        q = b.div(x, y)
        return b.where(b.less(q, b.scalar(0, dtype)), b.ceil(q), b.floor(q))
    if mode == "trunc":
        return b.div(x, y)
    # floored integer division: (x - x mod y) / y is exact, with mod taking the sign of y
    return b.div(b.sub(x, b.mod(x, y, fmod=False)), y)


def _floor_divide(ctx: AtenCtx, x: Value, y: Value) -> Value:
    """torch's (and Python's) float ``x // y``: ``(x - fmod(x, y)) / y``, moved down one where the remainder's
    sign is not the divisor's, then rounded to the nearest whole number; a zero keeps the quotient's sign and a
    zero divisor gives ``x / y``. ``floor(x / y)`` differs where the quotient rounds up to a whole number
    (``1 // 0.1`` is 9, ``floor(1 / 0.1)`` 10) and at infinities (``inf // 2`` is NaN, ``-1 // inf`` -1). Each
    step rounds to the operands' type, half precision too, as torch's kernels do (the same bits on all four float
    types)."""
    b = ctx.b
    dt = x.dtype
    zero, one = b.scalar(0, dt), b.scalar(1, dt)
    rem = b.mod(x, y, fmod=True)
    div = b.div(b.sub(x, rem), y)
    off = b.logical_and(b.not_equal(rem, zero), b.not_equal(b.less(y, zero), b.less(rem, zero)))
    div = b.where(off, b.sub(div, one), div)
    whole = b.floor(div)
    whole = b.where(b.greater(b.sub(div, whole), b.scalar(0.5, dt)), b.add(whole, one), whole)
    q = b.div(x, y)
    whole = b.where(b.equal(div, zero), b.mul(q, zero), whole)
    return b.where(b.equal(y, zero), q, whole)


_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
            "ge": "greater_equal"}


def _compare(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        a, b_ = first_two(ctx)
        x, y = binary_operands(ctx, a, b_, ctx.promote(a, b_))
        return ctx.b.op(cir, x, y)

    return conv


for _aten, _cir in _COMPARE.items():
    aten_op(f"{_aten}.Tensor", f"{_aten}.Scalar", emits=(_cir, "cast"))(_compare(_cir))


def _bitwise(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        dtype = ctx.out_dtype()
        x, y = binary_operands(ctx, *first_two(ctx), dtype)
        return ctx.b.op(f"logical_{kind}" if dtype is DType.bool else f"bitwise_{kind}", x, y)

    return conv


for _kind in ("and", "or", "xor"):
    aten_op(f"bitwise_{_kind}.Tensor", f"bitwise_{_kind}.Scalar",
            emits=(f"bitwise_{_kind}", f"logical_{_kind}", "cast"))(_bitwise(_kind))


def _logical(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x, y = binary_operands(ctx, *first_two(ctx), DType.bool)
        return ctx.b.op(f"logical_{kind}", x, y)

    return conv


for _kind in ("and", "or", "xor"):
    aten_op(f"logical_{_kind}.default", emits=(f"logical_{_kind}", "cast"))(_logical(_kind))


@aten_op("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", emits=("where", "cast"))
def _where(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    cond = ctx.tensor("condition", DType.bool)
    return ctx.b.where(cond, ctx.tensor("self", dtype), ctx.tensor("other", dtype))


@aten_op("masked_fill.Scalar", "masked_fill.Tensor", emits=("where", "cast"))
def _masked_fill(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    return ctx.b.where(ctx.tensor("mask", DType.bool), ctx.tensor("value", dtype), ctx.tensor("self", dtype))
