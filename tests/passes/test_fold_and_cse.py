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
