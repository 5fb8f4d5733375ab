"""A correct pass the verifier cannot prove (its verdict is unknown, never proved), loaded by the
CLI tests with ``--pass-plugin unprovable_passes:DoubleAsSum``, and the model it fires on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract, ValueRewrite


@dataclass(frozen=True)
class DoubleAsSum(ValueRewrite):
    """x * 2 -> x + x: bit-exact, but not provable over the abstract float sort (no distributivity)."""

    name = "double-as-sum-plugin"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "mul" and operands[1].is_const and bool(np.all(np.asarray(b.data(operands[1])) == 2)):
            return b.add(operands[0], operands[0])
        return None


def doubling_model() -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    return b.module(b.function("main", [x], [b.relu(b.mul(b.exp(x), b.scalar(2.0, DType.f32)))]))
