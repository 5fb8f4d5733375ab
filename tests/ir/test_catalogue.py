"""Walk the op catalogue: every op has examples, and its fast path agrees with its rule."""

import numpy as np
import pytest

from cuvil.interp import evaluate_op, evaluate_rule
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import all_ops
from cuvil.ir.types import TensorType

OPS = all_ops()


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_op_has_examples_and_rule_matches_fast_path(op):
    assert op.examples is not None, f"{op.name} defines no examples"
    cases = op.examples(np.random.default_rng(0))
    assert cases, f"{op.name} has an empty example list"
    for arrays, attrs in cases:
        full = op.check_attrs(attrs)
        out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
        by_rule = evaluate_rule(op, arrays, full, out_type)
        assert by_rule.shape == tuple(out_type.shape)
        assert by_rule.dtype == out_type.dtype.np
        if op.numpy is None:
            continue
        fast = evaluate_op(op, arrays, full, out_type)
        if out_type.dtype.is_float:
            tol = {DType.f16: 2e-3, DType.bf16: 2e-2}.get(out_type.dtype, 1e-5)
            np.testing.assert_allclose(fast.astype(np.float64), by_rule.astype(np.float64), rtol=tol, atol=tol,
                                       equal_nan=True, err_msg=f"{op.name} {attrs}")
        else:
            np.testing.assert_array_equal(fast, by_rule, err_msg=f"{op.name} {attrs}")
