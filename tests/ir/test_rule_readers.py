"""The readers of the compute rules publish which primitives and reductions they implement
(``cuvil ops`` derives its z3 and LLVM columns from them): each table must say exactly what the
reader does, found here by making the reader emit every primitive and reduction on every dtype."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import z3
from llvmlite import ir

from cuvil.codegen import lower_rule, scalar
from cuvil.ir import opdef
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import define
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, param
from verify import cone_encoder, scalar_semantics

KIND_DTYPES = {"float": (DType.f16, DType.bf16, DType.f32, DType.f64),
               "int": (DType.i8, DType.u8, DType.i32, DType.i64, DType.u64), "bool": (DType.bool,)}
APPLIES = {"float": ("num", "float", "any"), "int": ("num", "int", "any")}
"""Which primitives apply to a kind (bool: every one; numpy gives some arithmetic a bool meaning)."""
BITCAST_PARTNER = {DType.f16: DType.i16, DType.bf16: DType.u16, DType.f32: DType.i32, DType.f64: DType.u64,
                   DType.i8: DType.u8, DType.u8: DType.i8, DType.i32: DType.f32, DType.i64: DType.f64,
                   DType.u64: DType.f64, DType.bool: DType.u8}
"""A type of the same width each probed type's bits are read as (a bool's byte as u8)."""
REDUCTIONS = ("sum", "prod", "max", "min", "dot", "dot_ftz", "mean")  # "mean" is no kind: both readers refuse it


def _universe(kind: str) -> list[str]:
    return [n for n, p in R.PRIMITIVES.items() if kind == "bool" or p.kinds in APPLIES[kind]]


def _signature(fn: str, dt: DType) -> tuple[list[DType], DType, dict[str, object]]:
    """Operand dtypes, result dtype and attributes of one application of ``fn`` to ``dt`` elements."""
    prim = R.PRIMITIVES[fn]
    if fn == "select":
        return [DType.bool, dt, dt], dt, {}
    if fn == "cast":
        return [dt], DType.f64, {"to": DType.f64}
    if fn == "bitcast":
        return [dt], BITCAST_PARTNER[dt], {"to": BITCAST_PARTNER[dt]}
    return [dt] * prim.arity, DType.bool if prim.result == "bool" else dt, {}


def _probe(works: Callable[[str, DType], bool], kinds: dict[str, list[str]]) -> dict[str, frozenset[str]]:
    return {kind: frozenset(n for n in names if all(works(n, dt) for dt in KIND_DTYPES[kind]))
            for kind, names in kinds.items()}


def _llvm_primitive(fn: str, dt: DType) -> bool:
    arg_dtypes, out, attrs = _signature(fn, dt)
    f = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), [scalar.compute_type(d) for d in arg_dtypes]), "f")
    try:
        scalar.ScalarEmitter(ir.IRBuilder(f.append_basic_block())).call(fn, list(f.args), arg_dtypes, out, attrs)
    except Exception:
        return False
    return True


@functools.cache
def _semantics() -> list[scalar_semantics.Semantics]:
    return [cls(z3.Context()) for cls in scalar_semantics.ENCODERS.values()]


def _z3_primitive(fn: str, dt: DType) -> bool:
    arg_dtypes, out, attrs = _signature(fn, dt)
    for sem in _semantics():
        args = [z3.Bool(f"a{k}", sem.ctx) if d is DType.bool else z3.BitVec(f"a{k}", d.bits, sem.ctx) if d.is_int
                else sem.from_term(z3.Const(f"a{k}", sem.float_sort(d)), d) for k, d in enumerate(arg_dtypes)]
        try:
            sem.call(fn, args, arg_dtypes, out, attrs)
        except Exception:
            return False
    return True


def _reduce_rule(kind: str, dt: DType) -> Callable[[R.RuleCtx], R.Expr]:
    if kind in R.DOT_KINDS:  # products of float32 factors: a float input widened (a dot of ints is none)
        def dot(c: R.RuleCtx) -> R.Expr:
            if not dt.is_float:
                raise TypeError(f"no {kind} of {dt}")
            return R.dot(kind, [3], lambda r: (R.cast(c.inputs[0].at(r), DType.f32),) * 2)
        return dot
    return lambda c: R.Reduce(dt, kind, (("r", 3),), c.inputs[0].at(R.Ix.var("r")))


def _reduce_type(kind: str, dt: DType) -> TensorType:
    return TensorType(DType.f32 if kind in R.DOT_KINDS else dt, ())


def _llvm_reduction(kind: str, dt: DType) -> bool:
    try:
        rule = _reduce_rule(kind, dt)(R.RuleCtx.make([TensorType(dt, (3,))], {}, _reduce_type(kind, dt)))
        lower_rule.emit_rule_kernel(ir.Module(), "k", rule, [TensorType(dt, (3,))], _reduce_type(kind, dt), "probe")
    except Exception:
        return False
    return True


def test_llvm_primitive_table_is_what_the_scalar_emitter_lowers() -> None:
    probed = _probe(_llvm_primitive, {k: _universe(k) for k in KIND_DTYPES})
    assert {k: set(v) for k, v in scalar.SUPPORTED_PRIMITIVES.items()} == {k: set(v) for k, v in probed.items()}


def test_llvm_reduction_table_is_what_the_rule_lowering_lowers() -> None:
    probed = _probe(_llvm_reduction, {k: list(REDUCTIONS) for k in KIND_DTYPES})
    assert {k: set(v) for k, v in lower_rule.SUPPORTED_REDUCTIONS.items()} == {k: set(v) for k, v in probed.items()}


def test_z3_primitive_table_is_what_every_encoder_encodes() -> None:
    probed = _probe(_z3_primitive, {k: _universe(k) for k in KIND_DTYPES})
    published = scalar_semantics.SUPPORTED_PRIMITIVES
    assert {k: set(v) for k, v in published.items()} == {k: set(v) for k, v in probed.items()}


def test_z3_reduction_table_is_what_the_cone_encoder_encodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opdef, "OPS", dict(opdef.OPS))  # the probe ops vanish with the test
    monkeypatch.setattr(opdef, "_NAMES", {})

    def encodes(kind: str, dt: DType) -> bool:
        name = f"probe_{kind}_{dt}"
        if name not in opdef.OPS:
            define(name, ("x",), shape=lambda types: _reduce_type(kind, dt), rule=_reduce_rule(kind, dt))
        v = Value(name, (param("x", TensorType(dt, (3,))),), {}, _reduce_type(kind, dt))
        for encoder in scalar_semantics.ENCODERS:
            enc = cone_encoder.ConeEncoder(
                encoder, lambda u: cone_encoder.Leaf("x", "x", u.type, "param") if u.is_param else None)
            try:
                enc.value_at(v, ())
            except Exception:
                return False
        return True

    probed = _probe(encodes, {k: list(REDUCTIONS) for k in KIND_DTYPES})
    assert {k: set(v) for k, v in cone_encoder.SUPPORTED_REDUCTIONS.items()} == {k: set(v) for k, v in probed.items()}
