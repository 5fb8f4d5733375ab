"""Constant expressions that a pass rewrote (an exported relative-position bias: the indices into its
table are computed from aranges by reshapes, wheres and sums, and canonicalize removes the reshapes):
each side's expression is evaluated by the reference interpreter and two that hold the same bytes are
one folded leaf, so the gather above them reads the same tensor on both sides. Before, the proof had to
relate the two index computations through the gather: a tiny BEiT's canonicalize stayed unknown after
four minutes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import PASS_REGISTRY, Pass
from verify.cone import LeafTable
from verify.obligations import check_application

N = 4
TABLE = np.random.default_rng(3).standard_normal(((2 * N - 1) ** 2, 2)).astype(np.float32)


def _i64(b: Builder, x: int | list[int]) -> Value:
    return b.const(np.array(x, dtype=np.int64))


def _relative_index(b: Builder) -> Value:
    """Relative-position indices of an N x N grid, written as an exporter writes them (reshape chains)."""
    coords = _i64(b, list(range(N)))
    rows = b.expand(b.reshape(coords, shape=[N, 1]), shape=[N, N])
    cols = b.expand(b.reshape(coords, shape=[1, N]), shape=[N, N])
    grid = b.reshape(b.reshape(b.concat(rows, cols, axis=0), shape=[2, N, N]), shape=[2, N * N])
    rel = b.add(b.sub(b.reshape(grid, shape=[2, N * N, 1]), b.reshape(grid, shape=[2, 1, N * N])), _i64(b, N - 1))
    m = N ** 4
    dy = b.reshape(b.reshape(b.slice(rel, starts=[0, 0, 0], ends=[1, N * N, N * N], steps=[1, 1, 1]),
                             shape=[N * N, N * N]), shape=[m])
    dx = b.reshape(b.reshape(b.slice(rel, starts=[1, 0, 0], ends=[2, N * N, N * N], steps=[1, 1, 1]),
                             shape=[N * N, N * N]), shape=[m])
    return b.add(b.mul(dy, _i64(b, 2 * N - 1)), dx)


def _attention(index: Callable[[Builder], Value]) -> Module:
    """Scores of x against itself plus the gathered bias, then softmax and the weighted values."""
    b = Builder()
    x = b.param("x", DType.f32, [2, N * N, 8])
    bias = b.transpose(b.reshape(b.gather(b.const(TABLE), index(b)), shape=[N * N, N * N, 2]), perm=[2, 0, 1])
    q = b.transpose(b.reshape(x, shape=[2, N * N, 2, 4]), perm=[0, 2, 1, 3])
    scores = b.add(b.matmul(q, b.transpose(q, perm=[0, 1, 3, 2])), b.reshape(bias, shape=[1, 2, N * N, N * N]))
    return b.module(b.function("main", [x], [b.matmul(b.softmax(scores, axis=3), q)]))


def _gathers(module: Module) -> Value:
    return next(v for v in module.main.values() if v.op == "gather")


def test_two_spellings_of_one_index_computation_are_one_leaf() -> None:
    """The whole class, not one model: canonicalize rewrites the index chain, and the two gathers (whose
    indices and table are constant) become one folded leaf holding the interpreter's bytes."""
    before = _attention(_relative_index)
    after = PASS_REGISTRY["canonicalize"]().run(before).module
    gb, ga = _gathers(before), _gathers(after)
    assert len(after.main.values()) < len(before.main.values()), "canonicalize no longer rewrites the chain"
    table = LeafTable.build(before.main, after.main, before.constants, after.constants)
    leaf_b, leaf_a = table.leaf_of(gb), table.leaf_of(ga)
    assert leaf_b is not None and leaf_b is leaf_a and leaf_b.kind == "folded"
    assert leaf_b.data is not None and np.array_equal(leaf_b.data.view(np.uint32), TABLE[_flat_index()].view(np.uint32))
    assert any("pairs of constant expressions equal bit for bit" in n for n in table.notes)
    app = check_application(PASS_REGISTRY["canonicalize"](), before, after)
    assert [o.status for o in app.obligations] == ["proved"]


def _flat_index() -> np.ndarray:
    """The relative-position indices, computed here in numpy."""
    ys, xs = np.divmod(np.arange(N * N), N)
    return ((ys[:, None] - ys[None, :] + N - 1) * (2 * N - 1) + (xs[:, None] - xs[None, :] + N - 1)).reshape(-1)


def test_an_index_computation_that_changed_one_index_is_refuted() -> None:
    """The after-side indices differ at one position: not one leaf, and the difference is found."""
    def off_by_one(b: Builder) -> Value:
        bump = np.zeros(N ** 4, dtype=np.int64)
        bump[5] = 1
        return b.add(_relative_index(b), b.const(bump))

    before, after = _attention(_relative_index), _attention(off_by_one)
    table = LeafTable.build(before.main, after.main, before.constants, after.constants)
    leaf_b, leaf_a = table.leaf_of(_gathers(before)), table.leaf_of(_gathers(after))
    assert leaf_b is None or leaf_b is not leaf_a
    wrong = type("BumpIndex", (Pass,), {"name": "bump-index", "contract": Contract.EXACT})()
    app = check_application(wrong, before, after, timeout=2.0)
    assert [o.status for o in app.obligations] == ["refuted"]


def _thresholded(third: float) -> Module:
    """``where(x == c, 1, x)`` with ``c`` a constant expression (``third`` times 3, then over 3)."""
    b = Builder()
    x = b.param("x", DType.f32, [4, 8])
    c = b.div(b.mul(b.const(np.float32(third)), b.const(np.float32(3.0))), b.const(np.float32(3.0)))
    y = b.where(b.equal(x, c), b.const(np.float32(1.0)), x)
    for k in range(3):
        w = np.random.default_rng(20 + k).standard_normal((8, 8)).astype(np.float32)
        y = b.tanh(b.matmul(y, b.const(w)))
    return b.module(b.function("main", [x], [y]))


@pytest.mark.parametrize("ulps", [1, -1])
def test_constant_expressions_one_ulp_apart_are_not_one_leaf(ulps: int) -> None:
    """Two thresholds one ulp apart differ only where ``x`` equals one of them, which random inputs do
    not draw: only the pairing (bit for bit, never within a tolerance) keeps the prover from proving the
    rewrite."""
    third = np.float32(0.3)
    other = np.nextafter(third, np.float32(ulps * np.inf), dtype=np.float32)
    before, after = _thresholded(float(third)), _thresholded(float(other))
    wrong = type("MoveThreshold", (Pass,), {"name": "move-threshold", "contract": Contract.EXACT})()
    app = check_application(wrong, before, after, timeout=2.0)
    assert "proved" not in [o.status for o in app.obligations]


def test_a_tiny_beit_canonicalize_is_proved() -> None:
    """The model the class came from: BEiT's relative position bias, through torch.export."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import cuvil
    from tests.frontend.test_hf_models import _build

    model, inputs = _build("beit")
    before = cuvil.import_model(model, inputs)
    canonicalize = PASS_REGISTRY["canonicalize"]()
    after = canonicalize.run(before).module
    app = check_application(canonicalize, before, after)
    assert app.obligations and all(o.status == "proved" for o in app.obligations), \
        [(o.output, o.status) for o in app.obligations]
