"""The z3 reading of bitcast. The abstract float sort holds one NaN, and its laws (``x * 1 = x``, ...)
are equalities up to that, while IEEE arithmetic changes a NaN's bits; so a float's bits are a
function of its value except on NaN, where they are fresh. Bits read through a chain of bitcasts are
kept exactly, as the interpreter's views keep them. Each claim is checked against the interpreter on
the inputs that would break it (signaling NaNs, payloads), and the unprovable one is shown to hinge
on the prover: without the NaN guard it would be claimed proved."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import z3

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import Pass
from verify.axioms import ALL, axiom_status
from verify.obligations import Application, check_application
from verify.scalar_semantics import AbstractFPSemantics, RealSemantics

Body = Callable[[Builder, Value], Value]

SIGNALING = np.array([0x7F800001, 0xFF800002, 0x7FA00000, 0x7FC00005, 0x80000000, 0x3F800000], dtype=np.uint32)
"""f32 words: signaling NaNs of both signs, a quiet NaN with a payload, -0.0 and 1.0."""


def _module(body: Body, dt: DType) -> Module:
    b = Builder()
    x = b.param("x", dt, [6])
    return b.module(b.function("main", [x], [body(b, x)]))


def _check(before: Body, after: Body, dt: DType, search: str = "both") -> Application:
    rewrite = type("Rewrite", (Pass,), {"name": "rewrite", "contract": Contract.EXACT})()
    return check_application(rewrite, _module(before, dt), _module(after, dt), search=search)


def _statuses(app: Application) -> list[str]:
    return [o.status for o in app.obligations]


def _reference(body: Body, dt: DType, x: np.ndarray) -> np.ndarray:
    return run_reference(_module(body, dt), [x])[0]


def _identity(b: Builder, x: Value) -> Value:
    return x


def _f32_round_trip(b: Builder, x: Value) -> Value:
    return b.bitcast(b.bitcast(x, to=DType.i32), to=DType.f32)


def _i32_round_trip(b: Builder, x: Value) -> Value:
    return b.bitcast(b.bitcast(x, to=DType.f32), to=DType.i32)


def _bits(b: Builder, x: Value) -> Value:
    return b.bitcast(x, to=DType.i32)


def _bits_of_times_one(b: Builder, x: Value) -> Value:
    return b.bitcast(b.mul(x, b.const(np.ones((), np.float32))), to=DType.i32)


@pytest.mark.parametrize(("dt", "chain"), [(DType.f32, _f32_round_trip), (DType.i32, _i32_round_trip)],
                         ids=["f32-i32-f32", "i32-f32-i32"])
def test_a_round_trip_through_another_type_is_proved_the_identity(dt: DType, chain: Body) -> None:
    app = _check(_identity, chain, dt)
    assert _statuses(app) == ["proved"]
    (ob,) = app.obligations
    assert "bitcast-round-trip" in ob.verdict.axioms  # type: ignore[union-attr]
    words = SIGNALING.view(dt.np)
    assert _reference(chain, dt, words).tobytes() == words.tobytes()  # the interpreter agrees, payloads included


def test_a_round_trip_into_the_other_signedness_is_the_direct_read() -> None:
    def via_float(b: Builder, x: Value) -> Value:
        return b.bitcast(b.bitcast(x, to=DType.f32), to=DType.u32)

    assert _statuses(_check(lambda b, x: b.bitcast(x, to=DType.u32), via_float, DType.i32)) == ["proved"]


def test_the_bits_of_x_times_one_are_not_claimed_to_be_the_bits_of_x() -> None:
    """``x * 1 = x`` holds in the sort (NaNs identified), but a signaling NaN times 1 comes out quiet:
    the bits differ, and the prover alone must not claim otherwise."""
    x = SIGNALING.view(np.float32)
    with np.errstate(invalid="ignore"):
        a, b = _reference(_bits, DType.f32, x), _reference(_bits_of_times_one, DType.f32, x)
    assert not np.array_equal(a, b)  # the claim is false in the interpreter
    assert "proved" not in _statuses(_check(_bits, _bits_of_times_one, DType.f32, search="prover"))


def test_without_the_nan_guard_the_prover_would_claim_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail only through the prover: reading a NaN's bits as a function of the
    sort's value (the guard removed) makes the false claim 'proved'."""
    def unguarded(self: AbstractFPSemantics, x: z3.ExprRef, dtype: DType) -> z3.BitVecRef:
        bv = z3.BitVecSort(dtype.bits, self.ctx)
        return self.uf(f"fbits_{dtype.value}", [self.float_sort(dtype)], bv)(x)  # type: ignore[return-value]

    monkeypatch.setattr(AbstractFPSemantics, "float_bits", unguarded)
    assert _statuses(_check(_bits, _bits_of_times_one, DType.f32, search="prover")) == ["proved"]


def test_two_reads_of_a_nan_are_not_the_same_bits() -> None:
    sem = AbstractFPSemantics(z3.Context())
    x = z3.Const("x", sem.float_sort(DType.f32))
    a, b = sem.bitcast(x, DType.f32, DType.i32), sem.bitcast(x, DType.f32, DType.i32)
    nan = sem.float_call("isnan", [x], DType.f32)
    solver = z3.Solver(ctx=sem.ctx)
    solver.add(a != b)
    assert solver.check() == z3.sat
    solver.add(z3.Not(nan))
    assert solver.check() == z3.unsat  # a number's bits are a function of it


@pytest.mark.parametrize("cls", [AbstractFPSemantics, RealSemantics])
def test_integers_and_bools_keep_their_bits(cls: type) -> None:
    sem = cls(z3.Context())
    x = z3.BitVec("x", 8, sem.ctx)
    assert z3.eq(sem.bitcast(x, DType.i8, DType.u8), x)
    c = z3.Bool("c", sem.ctx)
    solver = z3.Solver(ctx=sem.ctx)
    solver.add(sem.bitcast(c, DType.bool, DType.u8) != z3.If(c, z3.BitVecVal(1, 8, sem.ctx),
                                                              z3.BitVecVal(0, 8, sem.ctx)))
    assert solver.check() == z3.unsat


def test_known_floats_have_their_encoding() -> None:
    sem = AbstractFPSemantics(z3.Context())
    bits = sem.bitcast(sem.lit(-0.0, DType.f32), DType.f32, DType.i32)
    assert z3.is_bv_value(bits) and bits.as_long() == 0x80000000  # type: ignore[attr-defined]
    assert "bitcast-literal" in sem.axioms
    back = sem.bitcast(z3.BitVecVal(0x3F800000, 32, sem.ctx), DType.i32, DType.f32)
    assert sem.literal_value(back, DType.f32) == 1.0
    nan = sem.bitcast(sem.lit(float("nan"), DType.f32), DType.f32, DType.i32)
    assert not z3.is_bv_value(nan)  # a literal NaN stands for every NaN: its bits are not known


@pytest.mark.parametrize("name", ["bitcast-round-trip", "bitcast-literal"])
def test_the_bit_laws_hold_and_are_proved_by_definition(name: str) -> None:
    assert ALL[name].check() == []
    assert axiom_status(name)["status"] == "proved"
