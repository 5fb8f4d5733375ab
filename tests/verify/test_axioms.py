"""Every law the encoders rely on holds numerically on the interpreter's primitives, and the
check itself is able to fail: laws that IEEE arithmetic violates are rejected by it."""

import numpy as np
import pytest

from cuvil.interp import NUMPY_PRIMITIVES as P
from verify.axioms import ABSTRACT_FP, ALL, REAL, Axiom, _binary_law
from verify.scalar_semantics import AbstractFPSemantics, RealSemantics


@pytest.mark.parametrize("name", sorted(ALL))
def test_axiom_holds_numerically(name):
    assert ALL[name].check() == []


@pytest.mark.parametrize(("name", "lhs", "rhs"), [
    ("add-zero", lambda a, b: P["add"](a, np.zeros_like(a)), lambda a, b: a),  # -0.0 + 0.0 is +0.0
    ("max-commutative", P["max"], lambda a, b: P["max"](b, a)),  # max(0.0, -0.0) keeps its second operand
    ("add-associative", lambda a, b: P["add"](P["add"](a, b), b), lambda a, b: P["add"](a, P["add"](b, b))),
    ("mul-distributive", lambda a, b: P["mul"](a, P["add"](b, b)),
     lambda a, b: P["add"](P["mul"](a, b), P["mul"](a, b))),
])
def test_the_check_rejects_laws_ieee_violates(name, lhs, rhs):
    assert Axiom(name, "", _binary_law(name, lhs, rhs)).check() != []


def test_abstract_fp_has_no_associativity_or_distributivity():
    assert not any("assoc" in n or "distrib" in n for n in ABSTRACT_FP)


def _recorded_axioms() -> set[str]:
    """Axiom names the encoders can record, found by exercising them."""
    import z3

    from cuvil.ir.dtypes import DType

    names: set[str] = set()
    for cls in (AbstractFPSemantics, RealSemantics):
        sem = cls(z3.Context())
        f32, f16 = DType.f32, DType.f16
        x = sem.from_term(z3.Const("x", sem.sort(f32)), f32)
        y = sem.from_term(z3.Const("y", sem.sort(f32)), f32)
        h = sem.from_term(z3.Const("h", sem.sort(f16)), f16)
        one, zero, nzero = sem.lit(1.0, f32), sem.lit(0.0, f32), sem.lit(-0.0, f32)
        for fn, args in [("mul", [y, x]), ("mul", [x, one]), ("mul", [one, x]), ("add", [y, x]), ("add", [x, nzero]),
                         ("add", [nzero, x]), ("sub", [x, zero]), ("div", [x, one]), ("gt", [x, y]), ("ge", [x, y]),
                         ("ne", [y, x]), ("div", [x, y]), ("sqrt", [x]), ("exp", [x])]:
            sem.call(fn, args, [f32] * len(args), f32, {})
        sem.call("neg", [sem.call("neg", [x], [f32], f32, {})], [f32], f32, {})
        for k in ("max", "min"):
            sem.call(k, [sem.call(k, [x, y], [f32, f32], f32, {}), y], [f32, f32], f32, {})
        sem.cast(sem.cast(h, f16, f32), f32, f16)
        names |= sem.axioms
    return names


def test_every_axiom_an_encoder_records_is_listed_and_checked():
    recorded = _recorded_axioms()
    assert recorded, "the probe must exercise the encoders"
    assert recorded <= set(ALL) | {"sum-linearity"}
    assert {"mul-one", "add-negative-zero", "sub-zero", "neg-involution", "widen-narrow", "sqrt-square"} <= recorded


def test_real_axioms_are_separate_from_the_abstract_sort():
    assert set(REAL).isdisjoint(ABSTRACT_FP)
