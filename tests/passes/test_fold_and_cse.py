"""fold-constants materializes constant expressions (with provenance); cse merges
commutative duplicates; neither changes results."""

import numpy as np

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.passes.cse import CommonSubexpressionElimination
from cuvil.passes.dce import DeadCodeElimination
from cuvil.passes.fold_constants import FoldConstants


def test_fold_constants_materializes_and_records_provenance():
    b = Builder()
    x = b.param("x", DType.f32, [3, 2])
    w = b.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    wt = b.transpose(w, perm=[1, 0])
    m = b.module(b.function("main", [x], [b.add(x, wt)]))
    res = FoldConstants().run(m)
    assert res.changed
    assert [v.op for v in res.module.main.ops()] == ["add"]
    (prov,) = [v for k, v in res.module.metadata.items() if k.startswith("folded:")]
    assert prov.startswith("transpose(@")
    xv = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(run_reference(m, [xv])[0], run_reference(res.module, [xv])[0])
    # the pre-fold weight is no longer referenced: dce drops it
    assert DeadCodeElimination().run(res.module).changed is False  # Module already drops unused data
    assert w.const_hash not in res.module.constants


def test_fold_constants_leaves_params_alone():
    b = Builder()
    x = b.param("x", DType.f32, [3])
    m = b.module(b.function("main", [x], [b.relu(x)]))
    assert FoldConstants().run(m).changed is False


def test_cse_merges_commutative_operands():
    b = Builder()
    x = b.param("x", DType.f32, [3])
    y = b.param("y", DType.f32, [3])
    out = b.mul(b.add(x, y), b.add(y, x))
    m = b.module(b.function("main", [x, y], [out]))
    assert len(m.main.ops()) == 3
    res = CommonSubexpressionElimination().run(m)
    assert res.changed and len(res.module.main.ops()) == 2


def test_cse_keeps_non_commutative_order():
    b = Builder()
    x = b.param("x", DType.f32, [3])
    y = b.param("y", DType.f32, [3])
    m = b.module(b.function("main", [x, y], [b.mul(b.sub(x, y), b.sub(y, x))]))
    assert CommonSubexpressionElimination().run(m).changed is False


def _swapped(op: str, dtype: DType):  # type: ignore[no-untyped-def]
    b = Builder()
    x = b.param("x", dtype, [4])
    y = b.param("y", dtype, [4])
    return b.module(b.function("main", [x, y], [b.op(op, x, y), b.op(op, y, x)]))


def test_cse_keeps_the_order_of_a_float_min_or_max():
    """A tie gives the second operand, so ``max(+0, -0)`` and ``max(-0, +0)`` differ in their sign bit:
    merging them would change one output (the verifier's corpus refutes the swap)."""
    x = np.array([0.0, -0.0, 1.0, np.nan], np.float32)
    y = np.array([-0.0, 0.0, 2.0, 1.0], np.float32)
    for op in ("max", "min"):
        m = _swapped(op, DType.f32)
        res = CommonSubexpressionElimination().run(m)
        assert len(res.module.main.ops()) == 2
        before, after = run_reference(m, [x, y]), run_reference(res.module, [x, y])
        assert [np.signbit(a).tolist() for a in before] == [np.signbit(a).tolist() for a in after]
        assert np.signbit(before[0][:2]).tolist() != np.signbit(before[1][:2]).tolist()  # the tie that matters


def test_cse_merges_an_integer_min_or_max():
    for op in ("max", "min"):
        res = CommonSubexpressionElimination().run(_swapped(op, DType.i32))
        assert res.changed and len(res.module.main.ops()) == 1
