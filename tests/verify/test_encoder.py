"""The z3 encoder reads compute rules at a symbolic index: index arithmetic simplifies under
bounds, padding masks sit on the input atom, reductions unroll or become canonical named
terms, and symbolic dims are constrained integers."""

import time

import numpy as np
import pytest
import z3

from cuvil.ir import Builder, DType
from cuvil.ir.module import Function, Module
from cuvil.ir.types import DimConstraint
from cuvil.passes import Contract, Pass, PassResult
from cuvil.passes.canonicalize import Canonicalize
from cuvil.passes.decompose import Decompose
from verify import check_pass
from verify.cone import LeafTable
from verify.cone_encoder import ConeEncoder, EncodingError, IndexSpace
from verify.prove import prove

RNG = np.random.default_rng(3)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _pair(before, after, encoder="abstract-fp"):
    """Prove ``after`` equals ``before`` (two functions over the same params)."""
    table = LeafTable.build(before, after, {}, {})
    return prove(before.results[0], after.results[0], table.leaf_of, encoder, before.constraints, timeout=10)


@pytest.mark.parametrize(("shape", "mid"), [((3, 5), (15,)), ((2, 3, 4), (4, 6)), ((5, 2, 3), (3, 10))])
def test_reshape_round_trip_proves(shape, mid):
    b = Builder()
    x = b.param("x", DType.f32, shape)
    before = b.function("main", [x], [b.exp(x)])
    after = b.function("main", [x], [b.exp(b.reshape(b.reshape(x, shape=mid), shape=shape))])
    assert _pair(before, after).status == "proved"


def test_reshape_round_trip_simplifies_to_the_same_index():
    space = IndexSpace(z3.Context())
    i = [space.atom(z3.Int(f"i{k}", space.ctx), 0, n - 1) for k, n in enumerate((2, 3, 4))]
    flat = space.add(space.add(space.scale(i[0], 12), space.scale(i[1], 4)), i[2])
    assert space.mod(flat, IndexSpace.const(4)) == i[2]
    assert space.floordiv(flat, IndexSpace.const(12)) == i[0]
    assert space.mod(space.floordiv(flat, IndexSpace.const(4)), IndexSpace.const(3)) == i[1]


def test_a_wrong_reshape_is_not_proved():
    b = Builder()
    x = b.param("x", DType.f32, (4, 6))
    before = b.function("main", [x], [b.reshape(x, shape=(6, 4))])
    after = b.function("main", [x], [b.transpose(b.reshape(b.transpose(x, perm=[1, 0]), shape=(4, 6)), perm=[1, 0])])
    assert _pair(before, after).status == "sat"


@pytest.mark.parametrize(("cin", "cout"), [(3, 5), (5, 3)])
def test_conv_padding_made_explicit_is_the_same_term(cin, cout):
    """The padding mask sits on the input atom either way, so the two encodings coincide."""
    b = Builder()
    x = b.param("x", DType.f32, (2, cin, 5, 4))
    w = b.const(_f(cout, cin, 3, 3))
    before = b.function("main", [x], [b.conv(x, w, pads=[1, 2, 1, 0])])
    after = b.function("main", [x], [b.conv(b.pad(x, pads=[0, 0, 1, 2, 0, 0, 1, 0]), w)])
    table = LeafTable.build(before, after, b.constants, b.constants)
    res = prove(before.results[0], after.results[0], table.leaf_of, "abstract-fp")
    assert res.status == "proved" and res.reason == "both sides encode to the same term"


@pytest.mark.parametrize("n", [64, 1000])
def test_softmax_decomposition_proves_at_any_length(n):
    """Symbolic sums and maxes with canonical names: no unrolling, so the length does not matter."""
    b = Builder()
    x = b.param("x", DType.f32, (3, n))
    m = b.module(b.function("main", [x], [b.softmax(x, axis=1)]))
    start = time.perf_counter()
    report = check_pass(Decompose(ops=("softmax",)), m)
    assert [o.status for o in report.obligations] == ["proved"]
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("n", [16, 17])
def test_reductions_unrolled_or_symbolic_both_prove(n):
    b = Builder()
    x = b.param("x", DType.f32, (2, n))
    before = b.function("main", [x], [b.reduce_sum(b.mul(x, b.scalar(1.0, DType.f32)), axes=[1])])
    after = b.function("main", [x], [b.reduce_sum(x, axes=[1])])
    table = LeafTable.build(before, after, b.constants, b.constants)
    assert prove(before.results[0], after.results[0], table.leaf_of, "abstract-fp").status == "proved"
    enc = ConeEncoder("abstract-fp", table.leaf_of)
    term = enc.term(enc.value_at(after.results[0], enc.output_index(after.results[0].type)), DType.f32)
    named = term.decl().name().startswith("sum_")
    assert named == (n > 16)


def test_real_sums_pull_out_independent_factors():
    """sum_k (x[k] * c) and c * sum_k x[k] are one term under the real encoder."""
    b = Builder()
    x = b.param("x", DType.f32, (3, 40))
    c = b.param("c", DType.f32, (3, 1))
    before = b.function("main", [x, c], [b.reduce_sum(b.mul(x, c), axes=[1], keepdims=True)])
    after = b.function("main", [x, c], [b.mul(b.reduce_sum(x, axes=[1], keepdims=True), c)])
    assert _pair(before, after, "real").reason == "both sides encode to the same term"
    assert _pair(before, after, "abstract-fp").status != "proved"  # not bit-exact: distributivity


def test_symbolic_dims_are_constrained_integers():
    b = Builder()
    x = b.param("x", DType.f32, ("N", 3, 4))
    cons = (DimConstraint("N", lo=1, hi=64),)
    before = Function("main", (x,), (b.exp(x),), ("out",), cons)
    after = Function("main", (x,), (b.exp(b.transpose(b.transpose(x, perm=[0, 2, 1]), perm=[0, 2, 1])),),
                     ("out",), cons)
    assert _pair(before, after).status == "proved"
    flat = Function("main", (x,), (b.exp(b.reshape(b.reshape(x, shape=["N", 12]), shape=["N", 3, 4])),), ("out",),
                    cons)
    assert _pair(before, flat).status == "proved"


def test_encoding_budget_gives_unknown_not_a_crash():
    b = Builder()
    x = b.param("x", DType.f32, (3, 4))
    y = x
    for _ in range(12):
        y = b.exp(y)
    before = b.function("main", [x], [y])
    after = b.function("main", [x], [b.tanh(y)])
    table = LeafTable.build(before, after, {}, {})
    enc = ConeEncoder("abstract-fp", lambda v: table.leaf_of(v) if v.is_param else None, budget=5)
    with pytest.raises(EncodingError, match="value encodings"):
        enc.value_at(before.results[0], enc.output_index(y.type))
    res = prove(before.results[0], after.results[0], lambda v: table.leaf_of(v) if v.is_param else None,
                "abstract-fp")
    assert res.status == "sat"


class _SwapMaxOperands(Pass):
    name = "test-swap-max"
    contract = Contract.EXACT

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        fn = module.main
        (out,) = fn.results
        lhs, rhs = out.operands
        new = Function(fn.name, fn.params, (b.max(rhs, lhs),), fn.result_names)
        return PassResult(module.replace(functions=[new]), True)


def test_max_is_not_commutative_bit_for_bit():
    """max(+0.0, -0.0) keeps its second operand in the interpreter: swapping operands is not exact."""
    b = Builder()
    x, y = b.param("x", DType.f32, (2, 3)), b.param("y", DType.f32, (2, 3))
    m = b.module(b.function("main", [x, y], [b.max(x, y)]))
    (o,) = check_pass(_SwapMaxOperands(), m).obligations
    assert o.status == "refuted"
    ce = o.verdict.counterexample
    assert {float(ce.before), float(ce.after)} == {0.0} and np.signbit(ce.before) != np.signbit(ce.after)


def test_canonicalize_identities_prove_with_the_axioms_they_need():
    b = Builder()
    x = b.param("x", DType.f32, (3, 5))
    y = b.sub(b.neg(b.neg(b.mul(x, b.scalar(1.0, DType.f32)))), b.scalar(0.0, DType.f32))
    m = b.module(b.function("main", [x], [b.relu(b.relu(y))]))
    (o,) = check_pass(Canonicalize(), m).obligations
    assert o.status == "proved"
    assert {"mul-one", "neg-involution", "sub-zero", "max-idempotent"} <= set(o.verdict.axioms)
