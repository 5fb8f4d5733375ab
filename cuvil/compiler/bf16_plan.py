"""The BF16 step of a compile: a model's products by constant weights in bfloat16 (``bf16=True``).

A declared precision change, made once before the proved pipeline (as the FP16 plan is): inference batch
norms that follow a product are first folded into its weights and bias (``fold-batchnorm``,
``fold-constants``: what ``-O2`` would do, here before the weights are rounded, since a batch norm cannot
be folded into bfloat16 weights afterwards), then the ``bf16`` pass pairs every product it can. The
manifest's ``precision`` entry says what was done and what was kept float32, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.opdef import get_op
from cuvil.ir.printer import value_names
from cuvil.passes import run_pipeline
from cuvil.passes.bf16 import PRODUCTS, Bf16, why_float32

PAIRED = ("bf16_matmul", "bf16_conv")

SEMANTICS = {op: "operands rounded to bfloat16 (nearest even) by casts, then: " + get_op(op).doc for op in PAIRED}
"""What each paired op computes (the manifest's ``precision.semantics``), read from its definition."""


@dataclass(frozen=True)
class Bf16Plan:
    """A module with its eligible products in bfloat16, and what stayed float32 and why."""

    module: Module
    products: int
    kept: tuple[tuple[str, str, str], ...]
    """(value name, op, reason) of each float32 ``matmul`` or ``conv`` that kept float32 products."""
    folded_batch_norms: int = 0

    def manifest(self) -> dict[str, Any]:
        """The artifact manifest's ``precision`` entry."""
        return {"mode": "bf16", "bf16_products": self.products, "fp32_products": len(self.kept),
                "folded_batch_norms": self.folded_batch_norms, "semantics": SEMANTICS,
                "kept_fp32": [{"op": op, "value": name, "reason": reason} for name, op, reason in self.kept]}


def plan_bf16(module: Module) -> Bf16Plan:
    """``module`` with its batch norms folded into the products before them and then :class:`Bf16` applied,
    with the products it changed and the reasons of those it did not."""
    norms = _count(module, ("batch_norm",))
    if norms:
        module = run_pipeline(module, ["fold-batchnorm", "fold-constants"]).module
    out = Bf16().run(module).module
    b = Builder(module.constants)
    names = value_names(module.main)
    kept = tuple((names.get(v, v.op), v.op, why) for v in module.main.values()
                 if v.op in PRODUCTS and v.dtype is DType.f32
                 for why in [why_float32(v, v.operands, b)] if why is not None)
    return Bf16Plan(out, _count(out, PAIRED) - _count(module, PAIRED), kept, norms - _count(module, ("batch_norm",)))


def _count(module: Module, ops: tuple[str, ...]) -> int:
    return sum(1 for v in module.main.values() if v.op in ops)
