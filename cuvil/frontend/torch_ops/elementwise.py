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
    "round": "round", "sign": "sign", "silu": "silu", "mish": "mish", "hardswish": "hardswish",
}


def _unary(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self", ctx.out_dtype())
        return ctx.b.op(cir, x)

    return conv


for _aten, _cir in _UNARY_FLOAT.items():
    aten_op(f"{_aten}.default", emits=(_cir, "cast"))(_unary(_cir))


@aten_op("log1p.default", emits=("log", "add", "cast"))
def _log1p(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.log(ctx.b.add(x, ctx.b.scalar(1, x.dtype)))


@aten_op("expm1.default", emits=("exp", "sub", "cast"))
def _expm1(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.sub(ctx.b.exp(x), ctx.b.scalar(1, x.dtype))


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


@aten_op("isnan.default", emits=("isnan",))
def _isnan(ctx: AtenCtx) -> Value:
    return ctx.b.isnan(ctx.tensor("self"))


@aten_op("isinf.default", emits=("isinf",))
def _isinf(ctx: AtenCtx) -> Value:
    return ctx.b.isinf(ctx.tensor("self"), detect_positive=True, detect_negative=True)


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
    y = x if lo is None else b.max(x, b.scalar(lo, x.dtype))
    return y if hi is None else b.min(y, b.scalar(hi, x.dtype))


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


def _binary(aten: str, cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        a, b_ = first_two(ctx)
        dtype = ctx.out_dtype()
        alpha = ctx.args.get("alpha")
        if alpha is not None and alpha != 1:
            b_ = ctx.b.mul(ctx.imp.as_value(b_, dtype, ctx.location), ctx.b.scalar(alpha, dtype))
        x, y = binary_operands(ctx, a, b_, dtype)
        if aten == "fmod":
            return ctx.b.mod(x, y, fmod=True)
        if aten == "remainder" and dtype.is_float:
            return ctx.b.mod(x, y, fmod=False)
        return ctx.b.op(cir, x, y)

    return conv


for _aten, _cir in _BINARY_ARITH.items():
    _overloads = {"add": ("Tensor", "Scalar"), "sub": ("Tensor", "Scalar"), "mul": ("Tensor", "Scalar"),
                  "div": ("Tensor", "Scalar"), "maximum": ("default",), "minimum": ("default",),
                  "pow": ("Tensor_Tensor", "Tensor_Scalar", "Scalar"), "remainder": ("Tensor", "Scalar"),
                  "fmod": ("Tensor", "Scalar")}[_aten]
    aten_op(*(f"{_aten}.{o}" for o in _overloads), emits=(_cir, "mul", "cast"))(_binary(_aten, _cir))


@aten_op("rsub.Scalar", "rsub.Tensor", emits=("sub", "mul", "cast"))
def _rsub(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    x = ctx.tensor("self", dtype)
    alpha = ctx.get("alpha", 1)
    if alpha != 1:
        x = ctx.b.mul(x, ctx.b.scalar(alpha, dtype))
    return ctx.b.sub(ctx.tensor("other", dtype), x)


@aten_op("div.Tensor_mode", "div.Scalar_mode", "floor_divide.default", emits=("div", "floor", "ceil", "where",
                                                                               "less", "mod", "sub", "cast"))
def _div_mode(ctx: AtenCtx) -> Value:
    mode = ctx.get("rounding_mode", "floor" if ctx.op_name.startswith("aten.floor_divide") else None)
    dtype = ctx.out_dtype()
    x, y = binary_operands(ctx, *first_two(ctx), dtype)
    b = ctx.b
    if mode is None:
        return b.div(x, y)
    if dtype.is_float:
        q = b.div(x, y)
        if mode == "floor":
            return b.floor(q)
        return b.where(b.less(q, b.scalar(0, dtype)), b.ceil(q), b.floor(q))
    if mode == "trunc":
        return b.div(x, y)
    # floored integer division: (x - x mod y) / y is exact, with mod taking the sign of y
    return b.div(b.sub(x, b.mod(x, y, fmod=False)), y)


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
