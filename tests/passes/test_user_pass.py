"""A pass written the way a user writes one: only cuvil.passes' public API (ValueRewrite,
Contract, register, run_pipeline) and the Builder; it runs by name inside a pipeline, next
to the built-in passes, and the gate hook sees it like any other."""

from dataclasses import dataclass

import numpy as np
from pass_testing import assert_same_results, ops

from cuvil.ir import Builder, DType
from cuvil.ir.values import Value
from cuvil.passes import Contract, ValueRewrite, register, run_pipeline


@register
@dataclass(frozen=True)
class DoubleToAdd(ValueRewrite):
    """x * 2 -> x + x: exact in IEEE arithmetic (both round the same real, signed zeros and infinities too)."""

    name = "test-double-to-add"
    contract = Contract.EXACT
    description = "strength-reduce multiplication by two"

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "mul" and operands[1].is_const and operands[0].type == v.type \
                and np.all(np.asarray(b.data(operands[1])) == 2):
            return b.add(operands[0], operands[0])
        return None


@dataclass
class _Verdict:
    accept: bool


def _module():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    y = b.mul(b.relu(x), b.scalar(2.0, DType.f32))
    return b.module(b.function("main", [x], [b.exp(b.mul(y, b.scalar(1.0, DType.f32)))]))


def test_user_pass_runs_by_name_in_a_pipeline_with_built_in_passes():
    before = _module()
    res = run_pipeline(before, "canonicalize,test-double-to-add,fuse-elementwise")
    assert [r.name for r in res.records] == ["canonicalize", "test-double-to-add", "fuse-elementwise"]
    assert res.records[1].changed and res.records[1].contract is Contract.EXACT
    assert ops(res.records[1].after) == ["relu", "add", "exp"]
    assert ops(res.module) == ["fused"]  # relu is read twice, by the add alone: it joins the body
    assert [u.op for u in res.module.main.results[0].attr("body").ops()] == ["relu", "add", "exp"]
    assert_same_results(before, res.module)


def test_gate_hook_sees_the_user_pass_and_can_roll_it_back():
    seen = []

    def gate(p, before, after):
        seen.append(p.name)
        return _Verdict(accept=p.name != "test-double-to-add")

    before = _module()
    res = run_pipeline(before, ["canonicalize", DoubleToAdd()], gate=gate)
    assert seen == ["canonicalize", "test-double-to-add"]
    assert res.records[1].rolled_back
    assert ops(res.module) == ["relu", "mul", "exp"]
