"""Batch-norm folding: an inference ``batch_norm`` right after a conv or a matmul is a
per-output-channel affine map, so it folds into the weights and one bias add.

The new weights and bias are emitted as constant expressions over the old constants
(``W * reshape(scale * rsqrt(var + eps))``, ``bias - mean * s``) so the verifier sees how
they were derived; ``fold-constants`` materializes them afterwards. Equal over the reals
only (``rsqrt`` and the reassociated products round differently), hence ``real``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cuvil.ir.builder import Builder
from cuvil.ir.values import Value, walk
from cuvil.passes.base import Contract, register
from cuvil.passes.rewrite import Match, Pat, Replacement, RewritePass, Rule, RuleSet, any_, op


def is_constant_expr(v: Value) -> bool:
    """True when ``v`` depends on constants only (no parameters)."""
    return not any(u.is_param for u in walk([v]))


def _bn_operands(m: Match) -> tuple[Value, Value, Value, Value] | None:
    bn = m.root
    params = tuple(bn.operand(n) for n in ("scale", "bias", "mean", "var"))
    if not all(is_constant_expr(p) and p.dtype is bn.dtype for p in params):
        return None
    return params  # type: ignore[return-value]


def _channel_scale(b: Builder, bn: Value, scale: Value, var: Value) -> Value:
    """``scale * rsqrt(var + eps)``: the factor every output channel is multiplied by."""
    eps = b.scalar(float(bn.attr("epsilon")), bn.dtype)
    return b.mul(scale, b.rsqrt(b.add(var, eps)))


def _per_channel_shape(out_rank: int, channels: int, channel_axis: int) -> tuple[int, ...]:
    """A shape that broadcasts a channel vector along ``channel_axis`` of a rank-``out_rank`` value
    (right-aligned, so leading unit dims are dropped)."""
    return (channels,) + (1,) * (out_rank - 1 - channel_axis)


def _varies_only_on(v: Value, out_rank: int, channel_axis: int) -> bool:
    """``v`` broadcast to a rank-``out_rank`` value is constant along every axis but ``channel_axis``."""
    pad = (1,) * (out_rank - v.type.rank) + tuple(v.type.shape)
    return all(d == 1 for k, d in enumerate(pad) if k != channel_axis)


def _new_bias(b: Builder, bn: Value, s: Value, prior: Value | None, out_rank: int, channel_axis: int) -> Value:
    """``bias - mean * s`` (no prior bias) or ``(prior - mean) * s + bias``, shaped to broadcast on the channel axis."""
    _, _, bias, mean, _ = bn.operands
    channels = int(bn.type.shape[1])
    shape = _per_channel_shape(out_rank, channels, channel_axis)

    def shaped(v: Value) -> Value:
        return v if tuple(v.type.shape) == shape else b.reshape(v, shape=shape)

    if prior is None:
        return b.sub(shaped(bias), b.mul(shaped(mean), shaped(s)))
    return b.add(b.mul(b.sub(prior, shaped(mean)), shaped(s)), shaped(bias))


def _fold_conv(with_bias: bool) -> Replacement:
    def replace(m: Match, b: Builder) -> Value | None:
        bn, conv = m.root, m["lin"]
        if not _single_use(m, conv) or (with_bias and not _bias_add_ok(m, conv)):
            return None
        w = conv.operand("w")
        if not is_constant_expr(w) or not conv.dtype.is_float or w.type.rank != conv.type.rank:
            return None
        params = _bn_operands(m)
        if params is None:
            return None
        scale, _, _, var = params
        out_rank = conv.type.rank
        prior = m["b0"] if with_bias else None
        if prior is not None and not (is_constant_expr(prior) and _varies_only_on(prior, out_rank, 1)):
            return None
        if not isinstance(w.type.shape[0], int) or w.type.shape[0] != bn.type.shape[1]:
            return None
        s = _channel_scale(b, bn, scale, var)
        w_scaled = b.mul(w, b.reshape(s, shape=(w.type.shape[0],) + (1,) * (w.type.rank - 1)))
        new_conv = b.conv(conv.operand("x"), w_scaled, **conv.attr_dict)
        return b.add(new_conv, _new_bias(b, bn, s, prior, out_rank, 1))

    return replace


def _fold_matmul(with_bias: bool) -> Replacement:
    def replace(m: Match, b: Builder) -> Value | None:
        bn, mm = m.root, m["lin"]
        if not _single_use(m, mm) or (with_bias and not _bias_add_ok(m, mm)):
            return None
        # batch_norm normalizes axis 1; only for a rank-2 product is that the output column axis
        if mm.type.rank != 2 or not mm.dtype.is_float:
            return None
        w = mm.operand("rhs")
        if not is_constant_expr(w) or w.type.rank != 2:
            return None
        params = _bn_operands(m)
        if params is None:
            return None
        scale, _, _, var = params
        prior = m["b0"] if with_bias else None
        if prior is not None and not (is_constant_expr(prior) and _varies_only_on(prior, 2, 1)):
            return None
        s = _channel_scale(b, bn, scale, var)
        column = b.reshape(s, shape=(int(bn.type.shape[1]), 1)) if mm.attr("transpose_b") else s
        new_mm = b.matmul(mm.operand("lhs"), b.mul(w, column), **mm.attr_dict)
        return b.add(new_mm, _new_bias(b, bn, s, prior, 2, 1))

    return replace


def _single_use(m: Match, v: Value) -> bool:
    return m.ctx.uses(v) == 1


def _bias_add_ok(m: Match, linear: Value) -> bool:
    """The bias add is used once and keeps the product's type (so the BN channel axis is its channel axis)."""
    return _single_use(m, m["biased"]) and m["biased"].type == linear.type


def _bn(inner: Pat) -> Pat:
    return op("batch_norm", inner, any_("scale"), any_("bias"), any_("mean"), any_("var"))


def _linear(name: str) -> Pat:
    return op(name, any_(), any_(), capture="lin")


def _rules_for(linear: str, fold: Callable[[bool], Replacement]) -> RuleSet:
    plain = Rule(f"{linear}-batchnorm", _bn(_linear(linear)), fold(False),
                 f"batch_norm({linear}(x, W)) -> {linear}(x, W * s) + (bias - mean * s)")
    lhs_bias = Rule(f"{linear}-bias-batchnorm",
                    _bn(op("add", _linear(linear), any_("b0"), capture="biased")), fold(True),
                    f"batch_norm({linear}(x, W) + b0) -> {linear}(x, W * s) + ((b0 - mean) * s + bias)")
    rhs_bias = Rule(f"{linear}-bias-batchnorm-rhs",
                    _bn(op("add", any_("b0"), _linear(linear), capture="biased")), fold(True),
                    f"batch_norm(b0 + {linear}(x, W)) -> {linear}(x, W * s) + ((b0 - mean) * s + bias)")
    return RuleSet((plain, lhs_bias, rhs_bias))


RULES = _rules_for("conv", _fold_conv) + _rules_for("matmul", _fold_matmul)


@register
@dataclass(frozen=True)
class FoldBatchNorm(RewritePass):
    name = "fold-batchnorm"
    contract = Contract.REAL
    description = "fold inference batch_norm after conv / matmul into the weights and a bias add"

    def rules(self) -> RuleSet:
        return RULES
