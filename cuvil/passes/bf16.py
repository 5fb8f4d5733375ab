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
from typing import Any, ClassVar

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.printer import value_names
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


@dataclass(frozen=True)
class Bf16Plan:
    """An imported module with its eligible products in bfloat16, and what stayed float32 and why."""

    module: Module
    products: int
    kept: tuple[tuple[str, str, str], ...]
    """(value name, op, reason) of each float32 ``matmul`` or ``conv`` that kept float32 products."""

    def manifest(self) -> dict[str, Any]:
        """The artifact manifest's ``precision`` entry."""
        return {"mode": "bf16", "bf16_products": self.products, "fp32_products": len(self.kept),
                "semantics": SEMANTICS,
                "kept_fp32": [{"op": op, "value": name, "reason": reason} for name, op, reason in self.kept]}


SEMANTICS = {
    "bf16_matmul": "operands rounded to bfloat16 (nearest even), products summed in float32 along K in pairs, each "
                   "pair's odd term first, subnormal factors and sums flushed to zero (x86 vdpbf16ps)",
    "bf16_conv": "input and weights rounded to bfloat16 (nearest even), products summed in float32 over channel "
                 "pairs (odd channel first) and taps, pair outermost, subnormal factors and sums flushed to zero "
                 "(x86 vdpbf16ps)"}


def plan_bf16(module: Module) -> Bf16Plan:
    """``module`` after :class:`Bf16`, with the products it changed and the reasons of those it did not."""
    out = Bf16().run(module).module
    b = Builder(module.constants)
    names = value_names(module.main)
    kept = tuple((names.get(v, v.op), v.op, why) for v in module.main.values()
                 if v.op in PRODUCTS and v.dtype is DType.f32
                 for why in [why_float32(v, v.operands, b)] if why is not None)
    paired = ("bf16_matmul", "bf16_conv")
    products = sum(1 for v in out.main.values() if v.op in paired) - \
        sum(1 for v in module.main.values() if v.op in paired)
    return Bf16Plan(out, products, kept)
