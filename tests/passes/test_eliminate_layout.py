"""eliminate-layout-ops: transposes fold into matmul flags, unit-dim transposes become
reshapes, reshape/transpose pairs cancel (also around elementwise ops); results are
bit-identical, and layouts that do not cancel stay."""

import numpy as np
import pytest
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil.ir import Builder, DType
from cuvil.passes import run_pipeline
from cuvil.passes.eliminate_layout import RULES, EliminateLayoutOps

RNG = np.random.default_rng(5)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _module(shapes, build):
    b = Builder()
    params = [b.param(f"p{k}", DType.f32, s) for k, s in enumerate(shapes)]
    return b.module(b.function("main", params, [build(b, *params)]))


def _matmul_lhs(b, x, y):
    return b.matmul(b.transpose(x, perm=[0, 2, 1]), y)


def _matmul_rhs_flag(b, x, y):
    return b.matmul(x, b.transpose(y, perm=[1, 0]), transpose_b=True)


def _unit_transpose(b, x):
    return b.relu(b.transpose(x, perm=[1, 0, 2, 3]))


def _squeeze_around_relu(b, x):
    return b.reshape(b.relu(b.reshape(x, shape=[3, 1, 4, 1])), shape=[3, 4])


def _unsqueeze_around_bias_add(b, x):
    y = b.add(b.reshape(x, shape=[2, 5, 1, 1]), b.const(_f(5, 1, 1)))
    return b.reshape(y, shape=[2, 5])


def _unsqueeze_around_relu(b, x):
    """The inner reshape removes a unit dim, the outer one restores it."""
    return b.reshape(b.relu(b.reshape(x, shape=[3, 4])), shape=[3, 1, 4])


def _residual_after_flattened_matmul(b, a, x):
    """A flattened product reshaped back to [1, T, H] and added to a residual of that shape."""
    return b.add(b.reshape(b.matmul(a, b.const(_f(8, 8))), shape=[1, 6, 8]), x)


def _transpose_through_exp(b, x):
    return b.transpose(b.exp(b.transpose(x, perm=[2, 0, 1])), perm=[1, 2, 0])


def _reshape_pair(b, x):
    return b.neg(b.reshape(b.reshape(x, shape=[6, 4]), shape=[2, 3, 4]))


CASES = {
    "transpose-into-matmul-lhs": ([[2, 5, 3], [5, 4]], _matmul_lhs, ["matmul"]),
    "transpose-into-matmul-rhs": ([[3, 5], [5, 4]], _matmul_rhs_flag, ["matmul"]),
    "transpose-as-reshape": ([[1, 3, 1, 4]], _unit_transpose, ["reshape", "relu"]),
    "reshape-around-elementwise": ([[3, 1, 4]], _unsqueeze_around_relu, ["relu"]),
    "sink-unsqueeze then cancel": ([[3, 4]], _squeeze_around_relu, ["relu"]),
    "sink-unsqueeze": ([[6, 8], [1, 6, 8]], _residual_after_flattened_matmul, ["matmul", "reshape", "add", "reshape"]),
    "reshape-around-elementwise broadcast operand": ([[2, 5]], _unsqueeze_around_bias_add, ["reshape", "add"]),
    "transpose-through-unary": ([[2, 3, 4]], _transpose_through_exp, ["exp"]),
    "reshape-chain": ([[2, 3, 4]], _reshape_pair, ["neg"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_fires(case):
    shapes, build, expected = CASES[case]
    before = _module(shapes, build)
    res = EliminateLayoutOps().run(before)
    assert res.changed
    assert ops(res.module) == expected
    assert_same_results(before, res.module)


def test_every_own_rule_has_a_case():
    fired: set[str] = set()
    for shapes, build, _ in CASES.values():
        fired.update(n.split(":")[0] for n in EliminateLayoutOps().run(_module(shapes, build)).notes)
    own = {r.name for r in RULES} - {"double-transpose", "identity-transpose", "identity-reshape"}
    assert own <= fired


def test_matmul_flags_toggle():
    before = _module([[3, 5], [5, 4]], _matmul_rhs_flag)
    mm = EliminateLayoutOps().run(before).module.main.results[0]
    assert mm.attr("transpose_b") is False and mm.operand("rhs").op == "param"
    before = _module([[2, 5, 3], [5, 4]], _matmul_lhs)
    mm = EliminateLayoutOps().run(before).module.main.results[0]
    assert mm.attr("transpose_a") is True


def test_broadcast_operand_becomes_a_constant_expression_that_folds():
    before = _module([[2, 5]], _unsqueeze_around_bias_add)
    res = run_pipeline(before, "eliminate-layout-ops,fold-constants")
    assert ops(res.module) == ["add"]
    assert_same_results(before, res.module)


NEGATIVE = {
    "transpose of a constant is left for fold-constants":
        ([[3, 5]], lambda b, x: b.matmul(x, b.transpose(b.const(_f(4, 5)), perm=[1, 0])), ["transpose", "matmul"]),
    "transpose that moves a batch dim is not a matmul flag":
        ([[2, 3, 5], [3, 5, 4]], lambda b, x, y: b.matmul(b.transpose(x, perm=[1, 0, 2]), y),
         ["transpose", "matmul"]),
    "transpose that moves non-unit dims is not a reshape":
        ([[2, 1, 3]], lambda b, x: b.transpose(x, perm=[2, 1, 0]), ["transpose"]),
    "transposes whose permutations do not cancel":
        ([[2, 3, 4]], lambda b, x: b.transpose(b.exp(b.transpose(x, perm=[2, 0, 1])), perm=[2, 0, 1]),
         ["transpose", "exp", "transpose"]),
    "reshape that is not a squeeze/unsqueeze stays around the elementwise op":
        ([[2, 3, 4]], lambda b, x: b.reshape(b.relu(b.reshape(x, shape=[6, 4])), shape=[2, 3, 4]),
         ["reshape", "relu", "reshape"]),
}


def _multi_use_case():
    b = Builder()
    x = b.param("x", DType.f32, [3, 1, 4])
    r = b.relu(b.reshape(x, shape=[3, 4]))  # a squeeze: relu runs at the smaller rank
    return b.module(b.function("main", [x], [b.reshape(r, shape=[3, 1, 4]), r]))


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_rule_does_not_fire(case):
    shapes, build, expected = NEGATIVE[case]
    before = _module(shapes, build)
    res = EliminateLayoutOps().run(before)
    assert ops(res.module) == expected
    assert_same_results(before, res.module)


def test_elementwise_value_with_another_user_is_not_moved():
    # moving the reshape would compute relu twice, once per layout
    before = _multi_use_case()
    assert_unchanged(EliminateLayoutOps(), before)


def test_sinking_an_unsqueeze_below_a_multi_use_value_computes_it_once():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    r = b.relu(b.reshape(x, shape=[3, 1, 4]))
    before = b.module(b.function("main", [x], [b.reshape(r, shape=[3, 4]), r]))
    res = EliminateLayoutOps().run(before)
    assert ops(res.module) == ["relu", "reshape"]
    assert res.module.main.results[0].op == "relu"
    assert_same_results(before, res.module)


@pytest.mark.parametrize("case", sorted(CASES))
def test_reaches_a_fixpoint(case):
    # rules that move reshapes in opposite directions would undo each other sweep after sweep
    shapes, build, _ = CASES[case]
    once = EliminateLayoutOps().run(_module(shapes, build)).module
    assert EliminateLayoutOps().run(once).changed is False
