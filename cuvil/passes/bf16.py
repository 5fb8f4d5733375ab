"""BF16 products: a float32 ``matmul`` or ``conv`` by constant weights becomes ``bf16_matmul`` /
``bf16_conv`` over its operands rounded to bfloat16, accumulated in float32 (x86 ``vdpbf16ps``: twice
the products per instruction of a float32 fused multiply-add where the CPU has AVX512-BF16).

Only the products change: every other op, the signature and each product's float32 result stay as
they are, so the error is each operand's rounding to bfloat16 (8 significant bits) carried through a
sum, not a half-precision pipeline. bfloat16 keeps float32's exponent range, so no finite weight or
activation of a float32 model overflows on the way (a weight beyond bfloat16's largest value keeps its
product float32). A product qualifies when its weights depend on no input (cast as a constant
expression for ``fold-constants`` to materialize) and its shapes are static; a matmul also needs a
matrix of weights, an even K (the paired kernel's steps) and a left operand not read transposed, a
convolution no groups (:func:`why_float32` says which rule kept a product). The contract is
``bounded``: a declared precision change, not an equivalence, applied before the proved pipeline as the
FP16 plan is; :attr:`Bf16.tolerance` is the error budget the differential tests hold it to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value, walk
from cuvil.passes.base import Contract, register
from cuvil.passes.fp16 import fits
from cuvil.passes.value_rewrite import ValueRewrite

PRODUCTS = ("matmul", "conv")
"""The float32 ops this lowering pairs: ``matmul`` -> ``bf16_matmul``, ``conv`` -> ``bf16_conv``."""


def why_float32(v: Value, operands: Sequence[Value], b: Builder) -> str | None:
    """Why the ``matmul`` or ``conv`` ``v`` (on ``operands``) keeps float32 products (None: it runs in bfloat16)."""
    lhs, rhs = operands
    if lhs.dtype is not DType.f32 or rhs.dtype is not DType.f32 or v.dtype is not DType.f32:
        return "not a float32 product"
    if any(u.is_param for u in walk([rhs])):
        return "its right operand depends on an input (only constant weights are paired at compile time)"
    if not rhs.type.is_static:
        return "its weights' shape is not static"
    if not lhs.type.is_static:
        return "its input's shape is known only at run time (the bfloat16 kernels are built per shape)"
    if v.op == "conv":
        if int(v.attr("groups") or 1) != 1:
            return "a grouped convolution (channel pairs would straddle groups)"
        if not 1 <= rhs.type.rank - 2 <= 3:
            return "the bfloat16 convolution covers 1 to 3 spatial axes"
    else:
        if rhs.type.rank != 2:
            return "its weights are not one matrix"
        if v.attr("transpose_a"):
            return "its left operand is read transposed"
        k = int(lhs.type.shape[-1])
        if k == 0 or k % 2:
            return f"K = {k} is odd (the bfloat16 kernel steps through K in pairs)"
    if not fits(b, rhs, float(DType.bf16.max_value)):
        return "a weight exceeds bfloat16's range"
    return None


@register
@dataclass(frozen=True)
class Bf16(ValueRewrite):
    name = "bf16"
    contract = Contract.BOUNDED
    description = "run float32 matmuls and convs by constant weights as bfloat16 products summed in float32"
    tolerance: ClassVar[tuple[float, float]] = (2e-2, 2e-2)
    """(rtol, atol) against the float32 module, for activations and weights of order 1."""

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op not in PRODUCTS or why_float32(v, operands, b) is not None:
            return None
        x, w = (b.cast(o, to=DType.bf16) for o in operands)
        if v.op == "conv":
            return b.op("bf16_conv", x, w, strides=v.attr("strides"), pads=v.attr("pads"),
                        dilations=v.attr("dilations"))
        return b.op("bf16_matmul", x, w, transpose_b=bool(v.attr("transpose_b")))
