"""Decomposition of composite ops into primitives, and (``reverse=True``) recognition of
those primitive patterns back into the composite ops.

Backends without a fused kernel want the primitives; backends with one (and the verifier,
which proves softmax faster as one op) want the composite. Each rule states whether it is
exact (the primitives compute literally the composite's rule) or only equal over the reals
(:data:`RULE_CONTRACTS`); the pass declares the weakest of them, ``real``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, register
from cuvil.passes.rewrite import Match, RewritePass, Rule, RuleSet, any_, op

# --------------------------------------------------------------------------------------
# forward: composite -> primitives


def _lit(b: Builder, value: float, like: Value) -> Value:
    return b.scalar(value, like.dtype)


def _tail_axes(x: Value, axis: int) -> tuple[int, ...]:
    return tuple(range(norm_axis(axis, x.type.rank), x.type.rank))


def _layer_norm(m: Match, b: Builder) -> Value | None:
    ln = m.root
    x, scale, bias = ln.operands
    axes = _tail_axes(x, ln.attr("axis"))

    def build(x: Value) -> Value:
        mean = b.reduce_mean(x, axes=axes, keepdims=True)
        dev = b.sub(x, mean)
        var = b.reduce_mean(b.mul(dev, dev), axes=axes, keepdims=True)
        norm = b.div(dev, b.sqrt(b.add(var, _lit(b, ln.attr("epsilon"), x))))
        return b.add(b.mul(norm, _as(b, scale, x.dtype)), _as(b, bias, x.dtype))

    return _widened(b, x, build)


def _softmax_parts(b: Builder, x: Value, axis: int) -> tuple[Value, tuple[int, ...]]:
    axes = (norm_axis(axis, x.type.rank),)
    return b.sub(x, b.reduce_max(x, axes=axes, keepdims=True)), axes


def _softmax(m: Match, b: Builder) -> Value | None:
    def build(x: Value) -> Value:
        shifted, axes = _softmax_parts(b, x, m.root.attr("axis"))
        e = b.exp(shifted)
        return b.div(e, b.reduce_sum(e, axes=axes, keepdims=True))

    return _widened(b, m["x"], build)


def _log_softmax(m: Match, b: Builder) -> Value | None:
    def build(x: Value) -> Value:
        shifted, axes = _softmax_parts(b, x, m.root.attr("axis"))
        return b.sub(shifted, b.log(b.reduce_sum(b.exp(shifted), axes=axes, keepdims=True)))

    return _widened(b, m["x"], build)


_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


_NARROW = (DType.f16, DType.bf16)


def _as(b: Builder, v: Value, dtype: DType) -> Value:
    return v if v.dtype is dtype else b.cast(v, to=dtype)


def _widened(b: Builder, x: Value, build: Callable[[Value], Value]) -> Value:
    """``build`` in f32 for f16/bf16 ``x``, rounded once at the end: how the catalogue defines
    these composites for narrow types, so the decomposition stays exact."""
    if x.dtype not in _NARROW:
        return build(x)
    return b.cast(build(b.cast(x, to=DType.f32)), to=x.dtype)


def _gelu(m: Match, b: Builder) -> Value | None:
    tanh_form = m.root.attr("approximate") == "tanh"

    def build(x: Value) -> Value:
        half, one = _lit(b, 0.5, x), _lit(b, 1.0, x)
        if tanh_form:
            cubic = b.mul(b.mul(b.mul(_lit(b, _GELU_CUBIC, x), x), x), x)
            inner = b.mul(_lit(b, _SQRT_2_OVER_PI, x), b.add(x, cubic))
            return b.mul(b.mul(half, x), b.add(one, b.tanh(inner)))
        return b.mul(b.mul(half, x), b.add(one, b.erf(b.mul(x, _lit(b, _INV_SQRT2, x)))))

    return _widened(b, m["x"], build)


def _silu(m: Match, b: Builder) -> Value | None:
    return _widened(b, m["x"], lambda x: b.mul(x, b.sigmoid(x)))


FORWARD = RuleSet((
    Rule("decompose-layer-norm", op("layer_norm", any_("x"), any_(), any_()), _layer_norm,
         "layer_norm -> reduce_mean, sub, mul, reduce_mean, add, sqrt, div, mul, add"),
    Rule("decompose-softmax", op("softmax", any_("x")), _softmax,
         "softmax -> exp(x - reduce_max) / reduce_sum(exp(x - reduce_max))"),
    Rule("decompose-log-softmax", op("log_softmax", any_("x")), _log_softmax,
         "log_softmax -> (x - reduce_max) - log(reduce_sum(exp(x - reduce_max)))"),
    Rule("decompose-gelu", op("gelu", any_("x")), _gelu, "gelu -> 0.5 * x * (1 + erf(x / sqrt 2)) (or the tanh form)"),
    Rule("decompose-silu", op("silu", any_("x")), _silu, "silu -> x * sigmoid(x)"),
))


def normalized_ratio(v: Value) -> Value | None:
    """The numerator ``a`` when ``v`` is the float normalisation ``a / reduce_sum(a, keepdims=True)`` (as the
    softmax decomposition writes it): each element of ``a`` is one of the summands of the sum it is divided by,
    over whichever axes, so for ``a >= 0`` the ratio lies in [0, 1]. None for any other value."""
    if v.op != "div":
        return None
    a, s = v.operands
    if s.op == "reduce_sum" and s.operands[0] is a and s.attr("keepdims") and v.dtype.is_float:
        return a
    return None


# --------------------------------------------------------------------------------------
# reverse: primitive patterns -> composite


def splat(b: Builder, v: Value) -> float | None:
    """The one value every element of a constant holds, if it is a float splat."""
    if not v.is_const:
        return None
    data = np.asarray(b.data(v))
    if data.size == 0 or data.dtype.kind != "f":
        return None
    first = data.reshape(-1)[0]
    return float(first) if bool(np.all(data == first)) else None


def _is_close(b: Builder, v: Value, want: float, rel: float = 1e-6) -> bool:
    got = splat(b, v)
    return got is not None and abs(got - want) <= rel * abs(want)


def _single_axis(v: Value) -> int | None:
    axes = tuple(v.attr("axes") or ())
    if len(axes) != 1 or not v.attr("keepdims"):
        return None
    return norm_axis(axes[0], v.type.rank)


def _softmax_axis(m: Match, shared: str) -> int | None:
    """The one axis both reductions of a matched (log-)softmax run over, when the value ``shared``
    feeds nothing but the two places the pattern uses it."""
    axis = _single_axis(m["top"])
    if axis is None or _single_axis(m["total"]) != axis or m.ctx.uses(m[shared]) != 2:
        return None
    return axis


def _recognize_softmax(m: Match, b: Builder) -> Value | None:
    axis = _softmax_axis(m, "e")
    return None if axis is None else b.softmax(m["x"], axis=axis)


def _recognize_log_softmax(m: Match, b: Builder) -> Value | None:
    axis = _softmax_axis(m, "shifted")
    return None if axis is None else b.log_softmax(m["x"], axis=axis)


def _tail_axis(v: Value) -> int | None:
    """The first axis when ``v`` reduces exactly the trailing axes [axis, rank) with keepdims."""
    rank = v.type.rank
    axes = sorted(norm_axis(a, rank) for a in (v.attr("axes") or range(rank)))
    if not v.attr("keepdims") or not axes or axes != list(range(axes[0], rank)):
        return None
    return axes[0]


def _is_square_of(b: Builder, sq: Value, d: Value) -> bool:
    if sq.op == "mul":
        return sq.operand("lhs") is d and sq.operand("rhs") is d
    return sq.op == "pow" and sq.operand("lhs") is d and splat(b, sq.operand("rhs")) == 2.0


def _normalized(b: Builder, n: Value) -> tuple[Value, int, float] | None:
    """Match ``(x - mean) / sqrt(var + eps)`` (or ``* rsqrt(...)``); give x, the axis and eps."""
    if n.op == "div" and n.operand("rhs").op == "sqrt":
        d, denom = n.operand("lhs"), n.operand("rhs").operand("x")
    elif n.op == "mul" and n.operand("rhs").op == "rsqrt":
        d, denom = n.operand("lhs"), n.operand("rhs").operand("x")
    else:
        return None
    if d.op != "sub" or d.operand("rhs").op != "reduce_mean" or denom.op != "add":
        return None
    x, mean = d.operand("lhs"), d.operand("rhs")
    var, eps_c = denom.operand("lhs"), denom.operand("rhs")
    if var.op != "reduce_mean" and eps_c.op == "reduce_mean":
        var, eps_c = eps_c, var
    eps = splat(b, eps_c)
    if mean.operand("x") is not x or var.op != "reduce_mean" or eps is None or eps_c.type.numel() != 1:
        return None
    axis = _tail_axis(mean)
    if axis is None or _tail_axis(var) != axis or not _is_square_of(b, var.operand("x"), d):
        return None
    return x, axis, eps


def _recognize_layer_norm(m: Match, b: Builder) -> Value | None:
    found = _normalized(b, m.root)
    if found is None:
        return None
    x, axis, eps = found
    if x.dtype in _NARROW:  # a half layer_norm normalizes in float32: not what these half ops compute
        return None
    one = b.const(np.ones((1,), x.dtype.np))
    zero = b.const(np.zeros((1,), x.dtype.np))
    return b.layer_norm(x, one, zero, axis=axis, epsilon=eps)


def _identity_affine(b: Builder, ln: Value) -> tuple[bool, bool]:
    """Whether a layer_norm's scale is all ones and its bias all zeros."""
    return splat(b, ln.operand("scale")) == 1.0, splat(b, ln.operand("bias")) == 0.0


def _absorb(kind: str) -> Callable[[Match, Builder], Value | None]:
    def replace(m: Match, b: Builder) -> Value | None:
        ln, c = m["ln"], m["c"]
        if m.ctx.uses(ln) != 1:
            return None
        unit_scale, zero_bias = _identity_affine(b, ln)
        if not zero_bias or (kind == "scale" and not unit_scale):
            return None
        scale, bias = (c, ln.operand("bias")) if kind == "scale" else (ln.operand("scale"), c)
        try:
            out = b.layer_norm(ln.operand("x"), scale, bias, **ln.attr_dict)
        except CuvilError:
            return None
        return out if out.type == m.root.type else None

    return replace


def _factors(v: Value, uses: Callable[[Value], int], top: bool = True) -> list[Value]:
    """The leaves of a tree of single-use multiplications rooted at ``v``."""
    if v.op != "mul" or (not top and uses(v) != 1):
        return [v]
    return _factors(v.operand("lhs"), uses, False) + _factors(v.operand("rhs"), uses, False)


def _one_plus(b: Builder, v: Value, fn: str) -> Value | None:
    """``fn``'s argument when ``v`` is ``1 + fn(arg)`` (either order)."""
    if v.op != "add":
        return None
    lhs, rhs = v.operand("lhs"), v.operand("rhs")
    if splat(b, lhs) == 1.0:
        lhs, rhs = rhs, lhs
    if splat(b, rhs) != 1.0 or lhs.op != fn:
        return None
    return lhs.operand("x")


def _scaled_by(b: Builder, v: Value, factor: float, uses: Callable[[Value], int]) -> Value | None:
    """``y`` when ``v`` is ``y * factor`` or ``y / (1 / factor)``."""
    if v.op == "div" and _is_close(b, v.operand("rhs"), 1.0 / factor):
        return v.operand("lhs")
    if v.op != "mul":
        return None
    parts = _factors(v, uses)
    consts = [p for p in parts if _is_close(b, p, factor)]
    rest = [p for p in parts if p not in consts]
    return rest[0] if len(consts) == 1 and len(rest) == 1 else None


def _tanh_inner_is_cubic(b: Builder, inner: Value, x: Value, uses: Callable[[Value], int]) -> bool:
    """``x + 0.044715 * x^3`` with the cube as a product of three x's."""
    if inner.op != "add":
        return False
    for lin, cub in ((inner.operand("lhs"), inner.operand("rhs")), (inner.operand("rhs"), inner.operand("lhs"))):
        if lin is not x or cub.op != "mul":
            continue
        parts = _factors(cub, uses)
        consts = [p for p in parts if _is_close(b, p, _GELU_CUBIC)]
        if len(consts) == 1 and sorted(id(p) for p in parts if p not in consts) == [id(x)] * 3:
            return True
    return False


def _recognize_gelu(m: Match, b: Builder) -> Value | None:
    parts = _factors(m.root, m.ctx.uses)
    if len(parts) != 3:
        return None
    halves = [p for p in parts if splat(b, p) == 0.5]
    if len(halves) != 1:
        return None
    rest = [p for p in parts if p is not halves[0]]
    for x, bracket in ((rest[0], rest[1]), (rest[1], rest[0])):
        arg = _one_plus(b, bracket, "erf")
        if arg is not None and _scaled_by(b, arg, _INV_SQRT2, m.ctx.uses) is x:
            return b.gelu(x)
        arg = _one_plus(b, bracket, "tanh")
        if arg is None:
            continue
        inner = _scaled_by(b, arg, _SQRT_2_OVER_PI, m.ctx.uses)
        if inner is not None and _tanh_inner_is_cubic(b, inner, x, m.ctx.uses):
            return b.gelu(x, approximate="tanh")
    return None


def _recognize_silu(m: Match, b: Builder) -> Value | None:
    lhs, rhs = m.root.operand("lhs"), m.root.operand("rhs")
    if m.root.dtype in _NARROW:  # narrow silu is computed in f32: not this product
        return None
    for x, s in ((lhs, rhs), (rhs, lhs)):
        if s.op == "sigmoid" and s.operand("x") is x:
            return b.silu(x)
    return None


_WIDE_COMPOSITES = ("gelu", "silu", "sigmoid", "softmax", "log_softmax")


def _narrow_composite(m: Match, b: Builder) -> Value | None:
    """cast(f(cast(x, f32)), narrow) -> f(x): exactly how ``f`` is defined on a narrow ``x``."""
    f = m["f"]
    if f.op not in _WIDE_COMPOSITES or len(f.operands) != 1 or f.operands[0].op != "cast":
        return None
    x = f.operands[0].operand("x")
    if f.op not in _WIDE_COMPOSITES or x.dtype not in _NARROW or m.root.dtype is not x.dtype \
            or f.dtype is not DType.f32 or m.ctx.uses(f) != 1:
        return None
    out = b.op(f.op, x, **f.attr_dict)
    return out if out.type == m.root.type else None


REVERSE = RuleSet((
    Rule("recognize-softmax",
         op("div", op("exp", op("sub", any_("x"), op("reduce_max", any_("x"), capture="top")), capture="e"),
            op("reduce_sum", any_("e"), capture="total")),
         _recognize_softmax, "exp(x - reduce_max(x)) / reduce_sum(that) -> softmax"),
    Rule("recognize-log-softmax",
         op("sub", op("sub", any_("x"), op("reduce_max", any_("x"), capture="top"), capture="shifted"),
            op("log", op("reduce_sum", op("exp", any_("shifted")), capture="total"))),
         _recognize_log_softmax, "(x - reduce_max(x)) - log(reduce_sum(exp(that))) -> log_softmax"),
    Rule("recognize-layer-norm-div", op("div", any_(), op("sqrt", any_())), _recognize_layer_norm,
         "(x - mean) / sqrt(var + eps) over trailing axes -> layer_norm(x, 1, 0)"),
    Rule("recognize-layer-norm-rsqrt", op("mul", any_(), op("rsqrt", any_())), _recognize_layer_norm,
         "(x - mean) * rsqrt(var + eps) over trailing axes -> layer_norm(x, 1, 0)"),
    Rule("layer-norm-absorb-scale", op("mul", op("layer_norm", any_(), any_(), any_(), capture="ln"), any_("c")),
         _absorb("scale"), "layer_norm(x, 1, 0) * s -> layer_norm(x, s, 0)"),
    Rule("layer-norm-absorb-bias", op("add", op("layer_norm", any_(), any_(), any_(), capture="ln"), any_("c")),
         _absorb("bias"), "layer_norm(x, s, 0) + c -> layer_norm(x, s, c)"),
    Rule("recognize-gelu", op("mul", any_(), any_()), _recognize_gelu,
         "0.5 * x * (1 + erf(x / sqrt 2)) (any association) -> gelu; likewise the tanh form"),
    Rule("recognize-silu", op("mul", any_(), any_()), _recognize_silu, "x * sigmoid(x) -> silu"),
    Rule("narrow-composite", op("cast", any_("f")), _narrow_composite,
         "cast(f(cast(x, f32)), f16) -> f(x) for composites the catalogue computes in f32 on narrow types"),
))

RULE_CONTRACTS: dict[str, Contract] = {
    "decompose-layer-norm": Contract.EXACT,
    "decompose-softmax": Contract.EXACT,
    "decompose-log-softmax": Contract.EXACT,
    "decompose-gelu": Contract.EXACT,
    "decompose-silu": Contract.EXACT,
    "recognize-softmax": Contract.EXACT,
    "recognize-log-softmax": Contract.EXACT,
    # the recognized form lacks the composite's `* 1 + 0` (which maps -0.0 to +0.0), or uses rsqrt / pow
    "recognize-layer-norm-div": Contract.REAL,
    "recognize-layer-norm-rsqrt": Contract.REAL,
    "layer-norm-absorb-scale": Contract.REAL,
    "layer-norm-absorb-bias": Contract.REAL,
    # the constants 1/sqrt(2) and sqrt(2/pi) are matched within a relative 1e-6, association may differ
    "recognize-gelu": Contract.REAL,
    "recognize-silu": Contract.EXACT,
    "narrow-composite": Contract.EXACT,
}
"""What each rule preserves: ``exact`` ones compute the composite's own rule literally."""

_FORWARD_OPS = {"decompose-layer-norm": "layer_norm", "decompose-softmax": "softmax",
                "decompose-log-softmax": "log_softmax", "decompose-gelu": "gelu", "decompose-silu": "silu"}


@register
@dataclass(frozen=True)
class Decompose(RewritePass):
    name = "decompose"
    contract = Contract.REAL
    description = "layer_norm / softmax / log_softmax / gelu / silu into primitives, or back with reverse=True"

    reverse: bool = False
    ops: tuple[str, ...] = ("layer_norm", "softmax", "log_softmax", "gelu", "silu")

    def rules(self) -> RuleSet:
        if self.reverse:
            return REVERSE
        return RuleSet(tuple(r for r in FORWARD if _FORWARD_OPS[r.name] in self.ops))

