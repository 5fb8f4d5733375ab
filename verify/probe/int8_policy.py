"""Whether a compile runs a QDQ model's quantized products in integer arithmetic.

A model that carries QDQ (quantize/dequantize pairs around its matmuls and convs, as
onnxruntime's quantizer writes them) computes them in float32 over dequantized values. At O3
``quantize-int8`` rewrites each into an int8 x int8 product accumulated in int32 and a
requantization: ONNX QLinearMatMul/QLinearConv semantics, what onnxruntime's integer kernels run,
and what the VNNI kernels execute. That is a declared precision change (the pass's contract is
``bounded``: a requantized value may differ from the float QDQ graph's by a quantization step),
so like the FP16 plan it is applied before the proved pipeline and recorded in the manifest, not
passed off as an equivalence. It is applied only when the overflow prober proves that no int32
accumulator of the lowered program can wrap for any finite input: each float input's box is the
whole float32 range, so the proof needs no declared ranges (``quantize_linear`` bounds what it
feeds by its integer type, so a product's accumulator sees int8 values whatever the input).
Otherwise the float QDQ graph is compiled as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.module import Module
from cuvil.ir.opdef import contraction_ops
from cuvil.ir.unroll import module_has_regions
from cuvil.passes.quantize_int8 import QuantizeInt8, has_qdq
from verify.probe.probe import SAFE, ProbeOptions, probe

POLICY = "int8-where-accumulators-proved"
"""The manifest's name for the rule: QDQ products run in int8 x int8 -> int32 when every int32
accumulator is proved not to wrap for any input."""

SEMANTICS = ("QLinearMatMul / QLinearConv: (x - zx) @ (w - zw) accumulated in int32, requantized once "
             "(round half to even, saturate); a requantized value may differ from the float QDQ graph's "
             "by one quantization step")

FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Int8Plan:
    """The module a compile continues with, and what the manifest says about the decision."""

    module: Module
    applied: bool
    products: int
    accumulators: int
    proved: int
    seconds: float
    reason: str

    def manifest(self) -> dict[str, Any]:
        return {"policy": POLICY, "applied": self.applied, "integer_products": self.products,
                "int32_sites": self.accumulators, "int32_sites_proved": self.proved,
                "semantics": SEMANTICS, "reason": self.reason, "seconds": round(self.seconds, 3)}


def needs_plan(module: Module) -> bool:
    """Whether ``module`` has QDQ ops for the lowering to turn into integers."""
    return has_qdq(module.main)


def plan_int8(module: Module) -> Int8Plan:
    """Lower ``module``'s QDQ products to integers where the prober proves the accumulators; else keep it."""
    start = time.monotonic()

    def kept(reason: str, products: int = 0, sites: int = 0, proved: int = 0) -> Int8Plan:
        return Int8Plan(module, False, products, sites, proved, time.monotonic() - start, reason)

    fn = module.main
    if not has_qdq(fn):
        return kept("no quantize/dequantize ops")
    if not all(p.type.is_static for p in fn.params):
        return kept("symbolic dims: the accumulator proof is made per specialization (give the input shapes)")
    if module_has_regions(module):
        return kept("loops or conditionals: the accumulator proof needs a straight-line program")
    lowered = QuantizeInt8().run(module).module
    before = sum(1 for v in fn.values() if v.op in contraction_ops() and v.dtype.is_int)
    products = sum(1 for v in lowered.main.values() if v.op in contraction_ops() and v.dtype.is_int) - before
    if products == 0:
        return kept("no quantized matmul/conv in the QLinear pattern")
    ranges = {p.name: ((-FLOAT32_MAX, FLOAT32_MAX) if p.dtype.is_float else _int_box(p.dtype.np)) for p in fn.params}
    report = probe(module, ranges, ProbeOptions(precision="int8", search=False, boundary=False))
    sites = [s for s in report.sites if s.rule == "int-overflow"]
    proved = sum(1 for s in sites if s.verdict == SAFE)
    if proved < len(sites):
        return kept(f"{len(sites) - proved} of {len(sites)} int32 sites not proved free of wrap-around",
                    products, len(sites), proved)
    return Int8Plan(lowered, True, products, len(sites), proved, time.monotonic() - start,
                    f"every int32 value proved not to wrap for any finite input ({proved} sites)")


def _int_box(dtype: Any) -> tuple[float, float]:
    info = np.iinfo(dtype)
    return float(info.min), float(info.max)
