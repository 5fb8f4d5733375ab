"""Canonicalization: algebraic identities that hold bit-for-bit under IEEE semantics.

Only identities that are exact belong here: ``x * 1``, ``x - 0``, ``x + (-0.0)`` are exact,
but ``x + 0.0`` is not (it turns -0.0 into +0.0), so it is deliberately absent. Each rule
is data (a pattern and a replacement) and is proved by the verifier's rule proofs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, register
from cuvil.passes.rewrite import Match, RewritePass, Rule, RuleSet, any_, const, op


def _splat(b: Builder, v: Value) -> float | None:
    """The single value a constant holds in every element, if it is a splat."""
    data = np.asarray(b.data(v))
    if data.size == 0:
        return None
    first = data.reshape(-1)[0]
    if not np.all(data == first):
        return None
    return float(first) if data.dtype.kind in "fiub" else None


def _is_splat(value: float, *, signbit: bool | None = None):
    def pred(m: Match, b: Builder, name: str) -> bool:
        s = _splat(b, m[name])
        if s is None or s != value:
            return False
        if signbit is None:
            return True
        return (math.copysign(1.0, s) < 0) == signbit

    return pred


def _keeps_type(m: Match, keep: Value) -> bool:
    """The replacement may only drop an op that does not broadcast or convert."""
    return keep.type == m.root.type


def _drop_identity(x: str, c: str, value: float, signbit: bool | None = None):
    check = _is_splat(value, signbit=signbit)

    def replace(m: Match, b: Builder) -> Value | None:
        keep = m[x]
        if not _keeps_type(m, keep) or not check(m, b, c):
            return None
        return keep

    return replace


def _same_value(m: Match, b: Builder) -> Value | None:
    keep = m["x"]
    return keep if keep.type == m.root.type else None


def _compose_transposes(m: Match, b: Builder) -> Value | None:
    inner, outer = m["inner"], m.root
    p_in, p_out = inner.attr("perm"), outer.attr("perm")
    perm = tuple(p_in[p] for p in p_out)
    if perm == tuple(range(len(perm))):
        return m["x"]
    return b.transpose(m["x"], perm=perm)


def _identity_transpose(m: Match, b: Builder) -> Value | None:
    perm = m.root.attr("perm")
    return m["x"] if tuple(perm) == tuple(range(len(perm))) else None


def _collapse_reshapes(m: Match, b: Builder) -> Value | None:
    x = m["x"]
    if x.type.shape == m.root.type.shape:
        return x
    return b.reshape(x, shape=m.root.type.shape)


def _identity_reshape(m: Match, b: Builder) -> Value | None:
    return m["x"] if m["x"].type == m.root.type else None


def _identity_cast(m: Match, b: Builder) -> Value | None:
    return m["x"] if m["x"].type == m.root.type else None


_WIDENS_EXACTLY = {
    (DType.f16, DType.f32), (DType.f16, DType.f64), (DType.f32, DType.f64), (DType.bf16, DType.f32),
    (DType.bf16, DType.f64), (DType.i8, DType.i16), (DType.i8, DType.i32), (DType.i8, DType.i64),
    (DType.i16, DType.i32), (DType.i16, DType.i64), (DType.i32, DType.i64), (DType.u8, DType.i16),
    (DType.u8, DType.i32), (DType.u8, DType.i64), (DType.u8, DType.u16), (DType.u8, DType.u32),
}


def _round_trip_cast(m: Match, b: Builder) -> Value | None:
    x, mid = m["x"], m["mid"]
    if (x.dtype, mid.dtype) in _WIDENS_EXACTLY and m.root.type == x.type:
        return x
    return None


def _pad_into_conv(m: Match, b: Builder) -> Value | None:
    """A constant +0.0 (or integer 0) pad of a convolution's spatial axes only, every width >= 0
    (TensorFlow's "same" padding, exported as its own op): the convolution reads exactly that value
    outside its input (its rule's ``oob``), so its own pads can grow by the pad's widths and it reads
    ``x`` itself, in the same order, each product of the same two values."""
    pad, conv, x = m["pad"], m.root, m["x"]
    pads, value = list(pad.attr("pads")), float(pad.attr("value"))
    rank = x.type.rank
    nsp = rank - 2
    if pad.attr("mode") != "constant" or value != 0.0 or math.copysign(1.0, value) < 0 or nsp < 1:
        return None
    if any(p < 0 for p in pads) or any(pads[k] or pads[k + rank] for k in (0, 1)):
        return None  # a crop, or a pad of the batch or channel axis
    own = list(conv.attr("pads")) or [0] * (2 * nsp)
    grown = [own[j] + pads[2 + j] for j in range(nsp)] + [own[nsp + j] + pads[rank + 2 + j] for j in range(nsp)]
    out = b.conv(x, m["w"], strides=conv.attr("strides"), pads=tuple(grown), dilations=conv.attr("dilations"),
                 groups=conv.attr("groups"))
    return out if out.type == conv.type else None


RULES = RuleSet((
    Rule("mul-by-one", op("mul", any_("x"), const("c")), _drop_identity("x", "c", 1.0),
         "x * 1 -> x"),
    Rule("mul-by-one-lhs", op("mul", const("c"), any_("x")), _drop_identity("x", "c", 1.0),
         "1 * x -> x"),
    Rule("div-by-one", op("div", any_("x"), const("c")), _drop_identity("x", "c", 1.0),
         "x / 1 -> x"),
    Rule("sub-zero", op("sub", any_("x"), const("c")), _drop_identity("x", "c", 0.0, signbit=False),
         "x - 0.0 -> x (exact: -0.0 - 0.0 = -0.0)"),
    Rule("add-negative-zero", op("add", any_("x"), const("c")), _drop_identity("x", "c", 0.0, signbit=True),
         "x + (-0.0) -> x (exact; x + 0.0 is not, it maps -0.0 to 0.0)"),
    Rule("double-transpose", op("transpose", op("transpose", any_("x"), capture="inner")), _compose_transposes,
         "transpose(transpose(x, p), q) -> transpose(x, p o q)"),
    Rule("identity-transpose", op("transpose", any_("x")), _identity_transpose, "transpose(x, id) -> x"),
    Rule("reshape-chain", op("reshape", op("reshape", any_("x"))), _collapse_reshapes,
         "reshape(reshape(x)) -> reshape(x)"),
    Rule("identity-reshape", op("reshape", any_("x")), _identity_reshape, "reshape(x) to its own shape -> x"),
    Rule("identity-cast", op("cast", any_("x")), _identity_cast, "cast(x) to its own dtype -> x"),
    Rule("widening-cast-round-trip", op("cast", op("cast", any_("x"), capture="mid")), _round_trip_cast,
         "cast(cast(x, wider), orig) -> x when the widening is exact"),
    Rule("double-negation", op("neg", op("neg", any_("x"))), _same_value, "neg(neg(x)) -> x"),
    Rule("relu-idempotent", op("relu", op("relu", any_("x"), capture="inner")),
         lambda m, b: m["inner"], "relu(relu(x)) -> relu(x)"),
    Rule("pad-into-conv", op("conv", op("pad", any_("x"), capture="pad"), any_("w")), _pad_into_conv,
         "conv(pad(x, +0.0 on spatial axes)) -> conv(x) with its pads grown by the pad's (exact: it reads +0.0 "
         "there)"),
))


@register
@dataclass(frozen=True)
class Canonicalize(RewritePass):
    name = "canonicalize"
    contract = Contract.EXACT
    description = "exact algebraic identities: x*1, x-0, double transposes, reshape chains, identity casts, " \
                  "zero pads into convolutions"

    def rules(self) -> RuleSet:
        return RULES
