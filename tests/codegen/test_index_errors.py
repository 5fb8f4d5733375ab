"""Out-of-range indices read from data: the numpy fast path, the op's rule and compiled code
agree, on errors as on values. For every catalogue op with an integer operand and every example,
one index entry is moved out of range (just past the end, just before -dim, far out) and the
three readings are compared: all raise an index error, or all give the same bits."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.errors import RuntimeEvalError
from cuvil.interp import evaluate_op, evaluate_rule
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import OpDef, all_ops
from cuvil.ir.types import TensorType


def _index_operands(op: OpDef, arrays: list[np.ndarray]) -> list[int]:
    return [k for k, a in enumerate(arrays) if np.issubdtype(a.dtype, np.integer) and a.size
            and k < len(op.operands) and op.operands[k] in ("indices", "ids", "index")]


def _cases() -> list[tuple[str, OpDef, list[np.ndarray], dict]]:
    out = []
    for op in all_ops():
        if op.examples is None:
            continue
        for e, (arrays, attrs) in enumerate(op.examples(np.random.default_rng(0))):
            arrays = [np.asarray(a) for a in arrays]
            largest = max((max(a.shape, default=1) for a in arrays), default=1)
            for k in _index_operands(op, arrays):
                limits = np.iinfo(arrays[k].dtype)
                for label, bad in (("past-end", largest), ("before-start", -largest - 1), ("far", 1 << 40)):
                    if not limits.min <= bad <= limits.max:
                        continue
                    moved = [a.copy() for a in arrays]
                    moved[k].flat[moved[k].size // 2] = bad
                    out.append((f"{op.name}-{e}-operand{k}-{label}", op, moved, dict(attrs)))
    return out


CASES = _cases()


def _reading(fn) -> tuple[str, np.ndarray | None]:
    try:
        return "value", np.asarray(fn())
    except RuntimeEvalError:
        return "index error", None


def _compiled(op: OpDef, arrays: list[np.ndarray], attrs: dict) -> np.ndarray:
    b = Builder()
    ps = [b.param(f"a{i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(arrays)]
    fn = b.function("main", ps, [b.op(op.name, *ps, **attrs)])
    with tempfile.TemporaryDirectory(prefix="cuvil-index-") as tmp:
        model = compile(b.module(fn), output_dir=tmp, cache=False)
        return model.run(arrays)[0]


def test_every_op_reading_indices_from_data_is_covered():
    ops = {name.split("-")[0] for name, *_ in CASES}
    assert {"gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd", "embedding",
            "one_hot"} <= ops


@pytest.mark.parametrize(("op", "arrays", "attrs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_out_of_range_indices_read_alike_everywhere(op, arrays, attrs):
    full = op.check_attrs(attrs)
    out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
    fast = _reading(lambda: evaluate_op(op, arrays, full, out_type))
    rule = _reading(lambda: evaluate_rule(op, arrays, full, out_type))
    native = _reading(lambda: _compiled(op, arrays, attrs))
    assert fast[0] == rule[0] == native[0], (fast[0], rule[0], native[0])
    if fast[1] is not None:
        np.testing.assert_array_equal(rule[1].view(np.uint8), fast[1].view(np.uint8))
        np.testing.assert_array_equal(native[1].view(np.uint8), fast[1].view(np.uint8))
