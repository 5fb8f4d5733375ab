"""The value guard a fail-safe policy builds into a library (``compile(..., failsafe=POLICY)``).

The run entry point checks, before any op runs, that every float input element is finite and that
every element of an input the policy gives a box lies inside it; after the ops ran, that every float
output element is finite. Each check is one branch-free loop over the tensor (an ``and`` of element
tests, which LLVM vectorizes); only when it fails does a second loop tell a non-finite element from
one outside the box. A failed check returns ``ERR_INPUT_BOX``, ``ERR_INPUT_NONFINITE`` or
``ERR_OUTPUT_NONFINITE`` (:mod:`cuvil.codegen.abi`); the exported
``const char* P_guard_fault(int32_t code)`` names the policy's fault for such a code.

Bounds are exact: a box ``[lo, hi]`` becomes the smallest and largest values of the element's compare
type inside it, so an element passes exactly when its real value lies in ``[lo, hi]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec, element_bounds
from cuvil.codegen.llvm_types import F64, I1, I8, I32, PTR, declare
from cuvil.codegen.loops import const, counted_loop
from cuvil.codegen.scalar import Builder, GlobalVariable, ScalarEmitter, Val, storage_type
from cuvil.errors import CodegenError
from cuvil.ir.dtypes import DType

ElementTest = Callable[[Builder, Val], Val]
INPUT_CODES = (abi.ERR_INPUT_BOX, abi.ERR_INPUT_NONFINITE)


@dataclass(frozen=True)
class TensorCheck:
    """One guarded tensor: ``kind`` is ``"box"`` (every element in ``[lo, hi]``, hence finite) or
    ``"finite"``; ``bounds`` are the exact bounds in the element's compare type (None: no value of
    the type lies in the box, so any element fails)."""

    side: str  # "input" or "output"
    index: int
    spec: TensorSpec
    kind: str
    lo: float | None = None
    hi: float | None = None
    bounds: tuple[float, float] | tuple[int, int] | None = None

    @property
    def failure(self) -> int:
        """The code of a failed check (a box check whose elements are all finite: ``ERR_INPUT_BOX``)."""
        if self.side == "output":
            return abi.ERR_OUTPUT_NONFINITE
        return abi.ERR_INPUT_BOX if self.kind == "box" else abi.ERR_INPUT_NONFINITE

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"side": self.side, "tensor": self.spec.name, "index": self.index, "check": self.kind}
        if self.kind == "box":
            out.update(lo=self.lo, hi=self.hi, element_bounds=list(self.bounds) if self.bounds else None)
        return out


@dataclass(frozen=True)
class GuardChecks:
    """What a guarded library checks: ``boxes`` as (input name, lo, hi); every float input without a box
    and every float output only finite. ``input_fault``/``output_fault``: the policy's fault names the
    input codes and the output code stand for (None: the policy names none)."""

    boxes: tuple[tuple[str, float, float], ...] = ()
    input_fault: str | None = None
    output_fault: str | None = None

    def box(self, name: str) -> tuple[float, float] | None:
        return next(((lo, hi) for n, lo, hi in self.boxes if n == name), None)

    def fault(self, code: int) -> str | None:
        """The fault name a return code stands for (None for a code that is not the guard's)."""
        if code in INPUT_CODES:
            return self.input_fault
        return self.output_fault if code == abi.ERR_OUTPUT_NONFINITE else None

    def plan(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> list[TensorCheck]:
        """The check of every tensor that has one, inputs first, each side in signature order."""
        self.validate(inputs)
        checks: list[TensorCheck] = []
        for k, spec in enumerate(inputs):
            box = self.box(spec.name)
            if box is not None:
                checks.append(TensorCheck("input", k, spec, "box", box[0], box[1],
                                          element_bounds(spec.dtype, *box)))
            elif spec.dtype.is_float:
                checks.append(TensorCheck("input", k, spec, "finite"))
        checks += [TensorCheck("output", k, s, "finite") for k, s in enumerate(outputs) if s.dtype.is_float]
        return checks

    def validate(self, inputs: Sequence[TensorSpec]) -> None:
        """Refuse a box on an input the function does not have, an empty or non-finite box, and a box
        on a bool input (the guard compares numbers)."""
        by_name = {s.name: s for s in inputs}
        for name, lo, hi in self.boxes:
            spec = by_name.get(name)
            if spec is None:
                raise CodegenError(f"the guard gives a box for input {name!r}, which the function does not have",
                                   location=name, hint="inputs: " + ", ".join(by_name))
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise CodegenError(f"the guard's box [{lo}, {hi}] for input {name!r} is not a finite interval",
                                   location=name)
            if spec.dtype is DType.bool:
                raise CodegenError(f"input {name!r} is bool: the guard has no box check for it", location=name)

    def to_json(self, prefix: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> dict[str, Any]:
        """The manifest's ``guard`` entry: the fault names, their codes and every check."""
        return {"symbol": f"{prefix}_guard_fault", "input_fault": self.input_fault,
                "output_fault": self.output_fault,
                "codes": {abi.ERROR_NAMES[c]: c for c in sorted(abi.GUARD_CODES)},
                "checks": [c.to_json() for c in self.plan(inputs, outputs)]}


# --------------------------------------------------------------------------------------
# code


def emit_checks(mod: ir.Module, prefix: str, checks: Sequence[TensorCheck]) -> list[tuple[TensorCheck, ir.Function]]:
    """One internal ``i32 check(ptr data)`` per tensor check: 0, or the code of its failure."""
    return [(c, _emit_check(mod, f"{prefix}.guard.{c.side}{c.index}", c)) for c in checks]


def _emit_check(mod: ir.Module, name: str, check: TensorCheck) -> ir.Function:
    fn = ir.Function(mod, ir.FunctionType(I32, [PTR]), name=name)
    fn.linkage = "internal"
    data = fn.args[0]
    b = Builder(fn.append_basic_block("entry"))
    test = _box_test(check) if check.kind == "box" else _finite
    ok = _all(b, data, check.spec, test, "all")
    passed, failed = fn.append_basic_block("passed"), fn.append_basic_block("failed")
    b.cbranch(ok, passed, failed)
    b.position_at_end(passed)
    b.ret(ir.Constant(I32, abi.OK))
    b.position_at_end(failed)
    code: Val = ir.Constant(I32, check.failure)
    if check.kind == "box" and check.spec.dtype.is_float:  # tell a NaN or infinity from a finite outlier
        finite = _all(b, data, check.spec, _finite, "finite")
        code = b.select(finite, code, ir.Constant(I32, abi.ERR_INPUT_NONFINITE))
    b.ret(code)
    return fn


def _all(b: Builder, data: Val, spec: TensorSpec, test: ElementTest, name: str) -> Val:
    """Whether ``test`` holds for every element of the tensor at ``data`` (a loop without branches)."""
    dt = spec.dtype
    ty = storage_type(dt)
    em = ScalarEmitter(b)
    n = math.prod(int(d) for d in spec.shape)

    def body(i: Val, carried: list[Val]) -> list[Val]:
        x = em.from_storage(b.load(b.gep(data, [i], inbounds=True, source_etype=ty), typ=ty), dt)
        return [b.and_(carried[0], test(b, x))]

    _, (ok,) = counted_loop(b, name, const(0), lambda i: b.icmp_signed("<", i, const(n)), 1, body,
                            [ir.Constant(I1, 1)])
    return ok


def _finite(b: Builder, x: Val) -> Val:
    suffix = "f64" if x.type == F64 else "f32"
    fabs = declare(b.module, f"llvm.fabs.{suffix}", x.type, [x.type])
    return b.fcmp_ordered("<", b.call(fabs, [x]), ir.Constant(x.type, math.inf))


def _box_test(check: TensorCheck) -> ElementTest:
    """``lo <= x <= hi`` on the element's compare type (false for NaN; always false for an empty box)."""
    bounds, dt = check.bounds, check.spec.dtype
    if bounds is None:
        return lambda b, x: ir.Constant(I1, 0)
    least, greatest = bounds
    if dt.is_float:
        return lambda b, x: b.and_(b.fcmp_ordered(">=", x, ir.Constant(x.type, float(least))),
                                   b.fcmp_ordered("<=", x, ir.Constant(x.type, float(greatest))))
    signed, bits = dt.is_signed, dt.bits

    def test(b: Builder, x: Val) -> Val:
        compare = b.icmp_signed if signed else b.icmp_unsigned
        lo_c, hi_c = (ir.Constant(x.type, _twos(int(v), bits)) for v in (least, greatest))
        return b.and_(compare(">=", x, lo_c), compare("<=", x, hi_c))

    return test


def _twos(value: int, bits: int) -> int:
    """``value`` as the signed number with the same ``bits`` low bits (how LLVM prints constants)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def emit_fault_names(mod: ir.Module, prefix: str, checks: GuardChecks) -> ir.Function:
    """``const char* P_guard_fault(int32_t code)``: the policy's fault name for a guard code, else NULL."""
    fn = ir.Function(mod, ir.FunctionType(PTR, [I32]), name=f"{prefix}_guard_fault")
    code = fn.args[0]
    code.name = "code"
    b = Builder(fn.append_basic_block("entry"))
    names = {c: name.encode() for c in sorted(abi.GUARD_CODES) if (name := checks.fault(c)) is not None}
    width = max((len(text) for text in names.values()), default=0) + 1  # one array type: selects agree
    result: Val = ir.Constant(PTR, None)
    for c, text in names.items():
        g = GlobalVariable(mod, ir.ArrayType(I8, width), name=f"{prefix}.fault.{c}")
        g.initializer = ir.Constant(g.value_type, bytearray(text.ljust(width, b"\0")))
        g.global_constant = True
        g.linkage = "private"
        result = b.select(b.icmp_signed("==", code, ir.Constant(I32, c)), g, result)
    b.ret(result)
    return fn


__all__ = ["GuardChecks", "TensorCheck", "element_bounds", "emit_checks", "emit_fault_names"]
