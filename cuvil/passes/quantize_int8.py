"""INT8 lowering of QDQ graphs: ``dequantize_linear -> matmul/conv -> quantize_linear`` (as
onnxruntime's QDQ quantization writes them) becomes an integer matmul/conv accumulating in
int32 and a requantization, with ONNX QLinearMatMul / QLinearConv semantics:

    y = saturate(round_half_even((x - zx) @ (w - zw) * (sx * sw / sy)) + zy)

built from catalogue ops (cast, sub, matmul/conv, mul, round, add, clip). An int32 bias
quantized at ``sx * sw`` joins the accumulator; a float bias is quantized to it as a
constant expression. The combined scale ``sx * sw / sy`` is a constant expression over the
original scales. The float path rounds once per product and once at the end, this one once
at the end only, so results may differ by one quantization step: the contract is ``bounded``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.opdef import contraction_ops
from cuvil.ir.values import Value, walk
from cuvil.passes.base import Contract, register
from cuvil.passes.rewrite import Match, RewritePass, Rule, RuleSet, any_, op


def _is_constant_expr(v: Value) -> bool:
    return not any(u.is_param for u in walk([v]))


@dataclass(frozen=True)
class _Dequant:
    """A ``dequantize_linear`` operand: quantized data, scale, zero point, quantization axis."""

    q: Value
    scale: Value
    zero: Value
    axis: int

    @staticmethod
    def of(v: Value) -> _Dequant | None:
        if v.op != "dequantize_linear" or v.attr("block_size") or v.dtype is not DType.f32:
            return None
        q, scale, zero = v.operands
        if q.dtype not in (DType.i8, DType.u8) or scale.type.rank > 1:
            return None
        return _Dequant(q, scale, zero, int(v.attr("axis")) % max(q.type.rank, 1))

    @property
    def per_tensor(self) -> bool:
        return self.scale.type.rank == 0

    def param_view(self, b: Builder, p: Value, rank: int, axis: int) -> Value:
        """A per-axis parameter reshaped to broadcast along ``axis`` of a rank-``rank`` value."""
        if p.type.rank == 0:
            return p
        return b.reshape(p, shape=tuple(p.type.shape[0] if k == axis else 1 for k in range(rank)))

    def centered(self, b: Builder) -> Value:
        """``cast(q, i32) - cast(zero, i32)`` (the zero point broadcast along the quantization axis)."""
        zero = self.param_view(b, b.cast(self.zero, to=DType.i32), self.q.type.rank, self.axis)
        return b.sub(b.cast(self.q, to=DType.i32), zero)


def _output_axis(lin: Value, w: _Dequant) -> int | None:
    """The axis of the product's output a per-channel weight scale runs along (None: not an output axis)."""
    if w.per_tensor:
        return -1
    if lin.op == "conv":
        return 1 if w.axis == 0 else None
    column = w.q.type.rank - 2 if lin.attr("transpose_b") else w.q.type.rank - 1
    return lin.type.rank - 1 if w.axis == column else None


def _at_accumulator_scale(b: Builder, dq: Value, sx: Value, sw: Value) -> bool:
    """``dq`` dequantizes int32 data with zero point 0 at scale ``sx * sw`` (onnxruntime's bias encoding)."""
    bq, bs, bz = dq.operands
    if bq.dtype is not DType.i32 or dq.attr("block_size") or not all(v.is_const for v in (bs, bz, sx, sw)):
        return False
    want = (np.asarray(b.data(sx), np.float64) * np.asarray(b.data(sw), np.float64)).reshape(-1)
    got = np.asarray(b.data(bs), np.float64).reshape(-1)
    if np.any(np.asarray(b.data(bz))) or got.size not in (1, want.size) or want.size not in (1, got.size):
        return False
    return bool(np.allclose(got, want, rtol=1e-6, atol=0.0))


def _bias(b: Builder, bias: Value, sx: Value, sw: Value, sw_view: Value) -> Value | None:
    """The bias as int32 at scale ``sx * sw``: the int32 data of a matching dequantize, else
    ``round(bias / (sx * sw))`` as a constant expression."""
    if not _is_constant_expr(bias) or bias.dtype is not DType.f32:
        return None
    inner = bias.operand("x") if bias.op == "reshape" else bias
    if inner.op == "dequantize_linear" and _at_accumulator_scale(b, inner, sx, sw):
        bq = inner.operand("x")
        return bq if inner is bias else b.reshape(bq, shape=bias.type.shape)
    return b.cast(b.round(b.div(bias, b.mul(sx, sw_view))), to=DType.i32)


def _requantize(m: Match, b: Builder) -> Value | None:
    root = m.root
    sy, zy = root.operand("scale"), root.operand("zero_point")
    if sy.type.rank != 0 or zy.dtype not in (DType.i8, DType.u8) or sy.dtype is not DType.f32:
        return None
    inner = root.operand("x")
    relu = inner.op == "relu"
    if relu:
        if m.ctx.uses(inner) != 1:
            return None
        inner = inner.operand("x")
    bias: Value | None = None
    if inner.op == "add":
        if m.ctx.uses(inner) != 1:
            return None
        lhs, rhs = inner.operands
        lin, bias = (lhs, rhs) if lhs.op in contraction_ops() else (rhs, lhs)
        if lin.type != inner.type:
            return None
    else:
        lin = inner
    if lin.op not in contraction_ops() or m.ctx.uses(lin) != 1:
        return None
    x, w = _Dequant.of(lin.operands[0]), _Dequant.of(lin.operands[1])
    if x is None or w is None or not x.per_tensor or not _is_constant_expr(lin.operands[1]):
        return None
    if lin.op == "matmul" and lin.attr("transpose_a"):
        return None
    out_axis = _output_axis(lin, w)
    if out_axis is None:
        return None
    rank = lin.type.rank
    sw_view = w.scale if w.per_tensor else w.param_view(b, w.scale, rank, out_axis)
    acc = b.op(lin.op, x.centered(b), w.centered(b), **lin.attr_dict)
    if bias is not None:
        qb = _bias(b, bias, x.scale, w.scale, sw_view)
        if qb is None:
            return None
        acc = b.add(acc, qb)
        if acc.type.shape != lin.type.shape:
            return None
    combined = b.div(b.mul(x.scale, sw_view), sy)
    y = b.mul(b.cast(acc, to=DType.f32), combined)
    if relu:
        y = b.relu(y)
    info = np.iinfo(zy.dtype.np)
    shifted = b.add(b.round(y), b.cast(zy, to=DType.f32))
    return b.cast(b.clip(shifted, min=float(info.min), max=float(info.max)), to=zy.dtype)


RULES = RuleSet((
    Rule("qdq-to-integer", op("quantize_linear", any_(), any_(), any_()), _requantize,
         "quantize(f(dequantize(x) @ dequantize(w))) -> requantize(int32 (x - zx) @ (w - zw)); f: bias add, relu"),
))


# --------------------------------------------------------------------------------------
# the patterns this lowering writes, for the analyses that read its output

QDQ_OPS = ("quantize_linear", "dequantize_linear")


def has_qdq(fn: Function) -> bool:
    """Whether ``fn`` has quantize/dequantize ops: without them this lowering has nothing to turn into integers."""
    return any(v.op in QDQ_OPS for v in fn.values())


def requantization_target(v: Value, uses: Mapping[Value, Sequence[Value]]) -> DType | None:
    """The integer type ``v`` saturates to when it is a requantization's clamp: a ``clip`` whose bounds are
    that type's range, consumed by a cast to that type (as :func:`_requantize` writes it). None otherwise."""
    if v.op != "clip" or v.attr("min") is None or v.attr("max") is None:
        return None
    for u in uses.get(v, []):
        to = u.attr("to") if u.op == "cast" else None
        if isinstance(to, DType) and to.is_int and to is not DType.bool:
            info = np.iinfo(to.np)
            if float(v.attr("min")) == int(info.min) and float(v.attr("max")) == int(info.max):
                return to
    return None


def requantization_zero_point(clamp: Value, constants: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The zero point a requantization adds just before its ``clamp`` (``x + cast(zero)``), when constant:
    at an end of the type's range, clamping there is a folded ReLU rather than saturation."""
    return _added_zero_point(clamp.operands[0], constants)


def quantize_zero_point(v: Value, constants: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The constant zero point of a ``quantize_linear`` (None for any other op, or a zero point computed
    at run time)."""
    return _added_zero_point(v.operands[2], constants) if v.op == "quantize_linear" else None


def _added_zero_point(v: Value, constants: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """A constant zero point, or the ``cast(constant)`` operand of an ``add`` (how :func:`_requantize` adds it)."""
    if v.op == "add":
        for o in v.operands:
            if o.op == "cast" and o.operands[0].is_const:
                return np.asarray(constants[o.operands[0].const_hash])
        return None
    if v.is_const:
        return np.asarray(constants[v.const_hash])
    return None


@register
@dataclass(frozen=True)
class QuantizeInt8(RewritePass):
    name = "quantize-int8"
    contract = Contract.BOUNDED
    enters_loops = False  # its plan spans the whole function
    description = "QDQ matmul/conv -> int8 x int8 with int32 accumulation and requantization (QLinear semantics)"
    tolerance: ClassVar[int] = 1
    """Largest difference, in quantization steps, from the float QDQ graph."""

    def rules(self) -> RuleSet:
        return RULES
