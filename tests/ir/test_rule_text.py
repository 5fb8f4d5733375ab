"""Compute rules print as readable infix text (``cuvil ops NAME`` shows them)."""

import numpy as np
import pytest

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import all_ops, get_op
from cuvil.ir.rule_text import rule_text
from cuvil.ir.types import TensorType


def _text(name: str, shapes: list[tuple[int, ...]], **attrs: object) -> str:
    op = get_op(name)
    full = op.check_attrs(attrs)
    types = [TensorType(DType.f32, s) for s in shapes]
    out = op.infer(types, full)
    return rule_text(op.make_rule(types, full, out), [o.lstrip("*") for o in op.operands], out.rank)


def test_pad_reads_its_fill_value_out_of_bounds() -> None:
    assert _text("pad", [(2, 3)], pads=(1, 2, 0, 3), value=1.5) == "out[i0, i1] = x[i0 - 1, i1 - 2] ?? 1.5"


def test_matmul_is_a_sum_of_products() -> None:
    assert _text("matmul", [(2, 4), (4, 5)]) == "out[i0, i1] = sum[r0 < 4](lhs[i0, r0] * rhs[r0, i1])"


def test_shared_subexpressions_print_once() -> None:
    assert _text("softmax", [(2, 3)], axis=1).splitlines() == [
        "t0 = max[r0 < 3](x[i0, r0])",
        "out[i0, i1] = exp(x[i0, i1] - t0) / sum[r1 < 3](exp(x[i0, r1] - t0))"]


def test_precedence_and_casts() -> None:
    x = R.Load(DType.f32, 0, (R.Ix.var("i0"),))
    rule = R.cast((x + 1.0) * x - (x - x), DType.f16)
    assert rule_text(rule, ["x"], 1) == "out[i0] = f16((x[i0] + 1.0) * x[i0] - (x[i0] - x[i0]))"
    assert rule_text(R.select(x > 0.0, x, -x), ["x"], 1) == "out[i0] = x[i0] > 0.0 ? x[i0] : -x[i0]"


@pytest.mark.parametrize("op", [o for o in all_ops() if not o.structured], ids=lambda o: o.name)
def test_every_catalogue_rule_prints(op) -> None:
    """Every op with an element rule (a loop has none: its meaning is its body iterated)."""
    arrays, attrs = op.examples(np.random.default_rng(0))[0]
    full = op.check_attrs(attrs)
    types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    out = op.infer(types, full)
    text = rule_text(op.make_rule(types, full, out), (), out.rank)
    assert text.splitlines()[-1].startswith("out")
    assert "Load(" not in text and "Call(" not in text
