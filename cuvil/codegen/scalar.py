"""The primitives of the rule language (``cuvil.ir.rules.PRIMITIVES``) as LLVM instructions.

Every value lives in registers in its *compute type*: f16 and bf16 are computed in
f32 and rounded back to their storage precision after each primitive, which is what
numpy does for float16 and ml_dtypes for bfloat16, so results match the interpreter.
Integer and cast semantics follow ``cuvil/interp.py`` (truncating ``div``, floored
``mod``, C ``fmod``, numpy's shift; float->int conversions as ``numpy_prims.float_to_int`` writes them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import ml_dtypes
import numpy as np
from llvmlite import ir

from cuvil.codegen import vmath
from cuvil.codegen.llvm_types import F16, F32, F64, I1, I8, I16, I32, I64, declare
from cuvil.codegen.narrow import emit_narrow, emit_widen
from cuvil.errors import CodegenError
from cuvil.ir import numpy_prims
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.narrow import INT_RANGES


class Val(Protocol):
    """An LLVM value of a known type (a constant, argument, instruction or global): llvmlite's
    ``ir.Value`` base class declares no ``type``."""

    @property
    def type(self) -> ir.Type: ...

    def get_reference(self) -> str: ...


Flags = Sequence[str]

if TYPE_CHECKING:  # llvmlite has no type annotations: what its classes are, as far as this package uses them
    class GlobalVariable(ir.GlobalVariable):
        initializer: ir.Constant | None  # llvmlite starts both at None, so they would be typed as None
        align: int | None

    class AllocaInstr(ir.AllocaInstr):
        align: int | None

    class Builder(ir.IRBuilder):
        """The builder as it behaves: decorators hide what the arithmetic and cast methods return
        (the instruction; a cast to the value's own type returns the value) and the ``flags`` they take."""

        def shl(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def lshr(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def ashr(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def add(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def fadd(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def sub(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def fsub(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def mul(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def fmul(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def udiv(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def sdiv(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def fdiv(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def urem(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def srem(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def frem(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def or_(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def and_(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def xor(self, lhs: Val, rhs: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def fneg(self, arg: Val, name: str = "", flags: Flags = ()) -> ir.Instruction: ...
        def not_(self, value: Val, name: str = "") -> ir.Instruction: ...
        def neg(self, value: Val, name: str = "") -> ir.Instruction: ...
        def trunc(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def zext(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def sext(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def fptrunc(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def fpext(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def bitcast(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def addrspacecast(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def fptoui(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def uitofp(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def fptosi(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def sitofp(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def ptrtoint(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def inttoptr(self, value: Val, typ: ir.Type, name: str = "") -> Val: ...
        def alloca(self, typ: ir.Type, size: Val | None = None, name: str = "") -> AllocaInstr: ...
else:
    GlobalVariable = ir.GlobalVariable
    Builder = ir.IRBuilder


def storage_type(dt: DType) -> ir.Type:
    """How an element is laid out in memory (bool is one byte, bf16 its 16 raw bits)."""
    if dt is DType.f64:
        return F64
    if dt is DType.f32:
        return F32
    if dt is DType.f16:
        return F16
    if dt is DType.bf16:
        return I16
    if dt is DType.bool or dt.is_narrow:  # narrow types: one byte per element, as ml_dtypes stores them
        return I8
    return ir.IntType(dt.bits)


def compute_type(dt: DType) -> ir.Type:
    """How an element is held in registers while computing."""
    if dt is DType.f64:
        return F64
    if dt.is_float:
        return F32
    if dt is DType.bool:
        return I1
    return ir.IntType(dt.bits)


def _signed_int(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def literal(value: float | int | bool, dt: DType) -> ir.Constant:
    """A constant in compute type; f16/bf16 literals are rounded to their storage precision first."""
    if dt is DType.bool:
        return ir.Constant(I1, int(bool(value)))
    if dt.is_int:
        return ir.Constant(compute_type(dt), _signed_int(int(value), dt.bits))
    if dt is DType.f16:
        return ir.Constant(F32, float(np.float16(value)))
    if dt is DType.bf16:
        return ir.Constant(F32, float(np.array(value, dtype=np.float32).astype(ml_dtypes.bfloat16)))
    if dt is DType.f32:
        return ir.Constant(F32, float(np.float32(value)))
    if dt.is_narrow:
        return ir.Constant(F32, float(numpy_prims.cast(numpy_prims.literal(value, dt), DType.f32)))
    return ir.Constant(F64, float(value))


_INT_MIN = {bits: -(1 << (bits - 1)) for bits in (2, 4, 8, 16, 32, 64)}


def identity(kind: str, dt: DType) -> ir.Constant:
    """The start value of a reduction (:data:`cuvil.ir.rules.REDUCTIONS`); a narrow float's
    max/min accumulates in f32."""
    value = R.reduction_identity(kind, dt)
    if dt.is_float and dt.is_narrow and kind in ("max", "min"):
        return ir.Constant(F32, value)
    return literal(value, dt)


class ScalarEmitter:
    """Emits primitives at the builder's position; declares the libm functions it needs."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder
        self._stored: dict[int, tuple[Val, Val]] = {}
        """Half-precision registers (by id) whose exact storage bits are known, with those bits: a
        register holds f16/bf16 widened to f32, and the hardware quiets a signaling NaN on the way,
        so a value read from memory or bit-cast keeps its own bits for a store or a bitcast."""
        self.erf_below: float | None = None
        """Set while a loop whose every float32 erf operand is below this bound (one of ``vmath.ERF_BOUNDS``;
        none is NaN) is emitted (:class:`cuvil.codegen.lower_rule.ErfBlocks`): erf is then the form for that
        bound alone."""

    @property
    def module(self) -> ir.Module:
        return self.b.module

    # -- external functions ---------------------------------------------------------
    def _extern(self, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
        return declare(self.module, name, ret, args)

    def _intrinsic(self, name: str, ty: ir.Type, arity: int = 1) -> ir.Function:
        suffix = "f64" if ty == F64 else "f32"
        return self._extern(f"llvm.{name}.{suffix}", ty, [ty] * arity)

    def _libm(self, name: str, ty: ir.Type, arity: int = 1) -> ir.Function:
        """The C library's function (``expf``); on a GPU, libdevice's (``__nv_expf``)."""
        from cuvil.codegen.target import codegen_target

        full = name if ty == F64 else name + "f"
        return self._extern("__nv_" + full if codegen_target().arch == "nvptx64" else full, ty, [ty] * arity)

    # -- memory <-> registers ---------------------------------------------------------
    def _remember(self, reg: Val, stored: Val) -> Val:
        self._stored[id(reg)] = (reg, stored)
        return reg

    def _stored_form(self, reg: Val) -> Val | None:
        """The exact storage value of a half-precision register, when known."""
        found = self._stored.get(id(reg))
        return found[1] if found is not None and found[0] is reg else None

    def from_storage(self, v: Val, dt: DType) -> Val:
        if dt is DType.bool:
            return self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        if dt is DType.f16:
            return self._remember(self.b.fpext(v, F32), v)
        if dt is DType.bf16:
            bits = self.b.shl(self.b.zext(v, I32), ir.Constant(I32, 16))
            return self._remember(self.b.bitcast(bits, F32), v)
        if dt.is_narrow:  # floats widen through a table; ints keep their low bits
            return emit_widen(self.b, v, dt) if dt.is_float else self.b.trunc(v, compute_type(dt))
        return v

    def to_storage(self, v: Val, dt: DType) -> Val:
        if dt is DType.bool:
            return self.b.zext(v, I8)
        if dt in (DType.f16, DType.bf16):
            stored = self._stored_form(v)
            if stored is not None:
                return stored
        if dt is DType.f16:
            return self.b.fptrunc(v, F16)
        if dt is DType.bf16:
            return self._bf16_bits(v)
        if dt.is_narrow:
            return emit_narrow(self.b, v, dt) if dt.is_float else self.b.zext(v, I8)
        return v

    def _bf16_bits(self, v: Val) -> Val:
        """f32 -> bf16 bits, round to nearest even, NaN kept quiet (as ml_dtypes does)."""
        b = self.b
        if v.type == F64:
            v = b.fptrunc(v, F32)
        bits = b.bitcast(v, I32)
        lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.add(bits, b.add(lsb, ir.Constant(I32, 0x7FFF)))
        quiet = b.or_(bits, ir.Constant(I32, 0x00400000))
        is_nan = b.fcmp_unordered("uno", v, v)
        chosen = b.select(is_nan, quiet, rounded)
        return b.trunc(b.lshr(chosen, ir.Constant(I32, 16)), I16)

    def round_to(self, v: Val, dt: DType) -> Val:
        """Round a float result (f32 or f64 register) to ``dt``'s precision, in compute type."""
        if dt is DType.f16:
            return self.b.fpext(self.b.fptrunc(v, F16), F32)
        if dt is DType.bf16:
            return self.from_storage(self._bf16_bits(v), dt)
        if dt.is_narrow:
            return self.from_storage(self.to_storage(v, dt), dt)
        target = compute_type(dt)
        ty = v.type
        vector = ty if isinstance(ty, ir.VectorType) else None  # a kernel's explicit vector
        element = vector.element if vector is not None else ty
        if element == target:
            return v
        wide = ir.VectorType(target, vector.count) if vector is not None else target
        return self.b.fptrunc(v, wide) if element == F64 else self.b.fpext(v, wide)

    def fma(self, x: Val, y: Val, acc: Val) -> Val:
        """``x * y + acc`` rounded once (a ``dot`` reduction's step)."""
        return self.b.call(self._intrinsic("fma", x.type, 3), [x, y, acc])

    def flush_subnormal(self, v: Val) -> Val:
        """A float32 ``v`` under ``rules.DOT_FTZ_BELOW`` as zero of its sign (a ``dot_ftz`` reduction's factors
        and sums)."""
        tiny = ir.Constant(v.type, R.DOT_FTZ_BELOW)
        small = self.b.fcmp_ordered("<", self.b.call(self._intrinsic("fabs", v.type), [v]), tiny)
        return self.b.select(small, self.b.fmul(v, ir.Constant(v.type, 0.0)), v)

    # -- primitives -------------------------------------------------------------------
    def call(self, fn: str, args: Sequence[Val], arg_dtypes: Sequence[DType], out: DType,
             attrs: dict[str, object]) -> Val:
        if fn == "cast":
            return self.cast(args[0], arg_dtypes[0], out)
        if fn == "bitcast":
            return self.bitcast(args[0], arg_dtypes[0], out)
        if fn == "select":
            return self.b.select(args[0], args[1], args[2])
        dt = arg_dtypes[0]
        if fn in _COMPARE:
            return self._compare(fn, args[0], args[1], dt)
        if dt is DType.bool:
            return self._bool_op(fn, args)
        if dt.is_float:
            v = self._float_op(fn, args, dt)
            return v if out is DType.bool else self.round_to(v, out)
        return self._int_op(fn, args, dt)

    def _compare(self, fn: str, a: Val, b: Val, dt: DType) -> Val:
        op = _COMPARE[fn]
        if dt.is_float:
            if fn == "ne":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(op, a, b)
        if dt.is_signed:
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def _bool_op(self, fn: str, args: Sequence[Val]) -> Val:
        if fn in _BOOL_BINARY:
            return _BOOL_BINARY[fn](self.b, args[0], args[1])
        if fn in ("not", "bit_not"):
            return self.b.xor(args[0], ir.Constant(I1, 1))
        if fn == "abs":
            return args[0]
        raise CodegenError(f"primitive {fn!r} is not defined on bool", location=fn)

    def _float_op(self, fn: str, args: Sequence[Val], dt: DType) -> Val:
        b = self.b
        x = args[0]
        ty = x.type
        if fn in _FLOAT_BINARY:
            return _FLOAT_BINARY[fn](b, x, args[1])
        if fn in _FLOAT_INTRINSIC:
            return b.call(self._intrinsic(_FLOAT_INTRINSIC[fn], ty), [x])
        if ty == F32 and fn == "erf" and self.erf_below is not None:
            return vmath.erf_f32(b, x, self.erf_below)
        if ty == F32 and fn in vmath.FLOAT32_INLINE:
            return vmath.FLOAT32_INLINE[fn](b, x)
        if fn in _LIBM_UNARY:  # the double-precision function rounded once, as the interpreter evaluates it
            y = b.call(self._libm(_LIBM_UNARY[fn], F64), [x if ty == F64 else b.fpext(x, F64)])
            if ty != F64:
                y = b.fptrunc(y, ty)
            if fn in _LIBM_DOMAIN:  # outside the domain the rule gives NaN, whatever a target's libm does
                lo, hi = _LIBM_DOMAIN[fn]
                outside = b.or_(b.fcmp_ordered("<", x, ir.Constant(ty, lo)),
                                b.fcmp_ordered(">", x, ir.Constant(ty, hi)))
                y = b.select(outside, ir.Constant(ty, math.nan), y)
            return y
        if fn == "neg":
            return b.fneg(x)
        if fn in _MIN_MAX:  # numpy: NaN in either operand propagates; ties give the second operand
            y = args[1]
            pick = b.or_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered(_MIN_MAX[fn], x, y))
            return b.select(pick, x, y)
        if fn == "mod":
            return self._float_mod(x, args[1])
        if fn == "pow":
            return vmath.pow_f32(b, x, args[1]) if ty == F32 else b.call(self._libm("pow", ty, 2), [x, args[1]])
        if fn == "isnan":
            return b.fcmp_unordered("uno", x, x)
        if fn == "isinf":
            mag = b.call(self._intrinsic("fabs", ty), [x])
            return b.fcmp_ordered("==", mag, ir.Constant(ty, float("inf")))
        if fn == "erf":  # the interpreter evaluates erf in double precision for every float type (float32: inline)
            wide = x if ty == F64 else b.fpext(x, F64)
            return b.call(self._libm("erf", F64), [wide])
        raise CodegenError(f"primitive {fn!r} is not defined on {dt}", location=fn)

    def _float_mod(self, x: Val, y: Val) -> Val:
        """numpy's floored float modulo: fmod, moved into the divisor's sign; zero takes its sign."""
        b = self.b
        ty = x.type
        zero = ir.Constant(ty, 0.0)
        r = b.frem(x, y)
        nonzero = b.fcmp_unordered("!=", r, zero)
        signs_differ = b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", r, zero))
        adjusted = b.select(b.and_(nonzero, signs_differ), b.fadd(r, y), r)
        signed_zero = b.call(self._extern(f"llvm.copysign.{'f64' if ty == F64 else 'f32'}", ty, [ty, ty]),
                             [zero, y])
        return b.select(nonzero, adjusted, signed_zero)

    def _int_op(self, fn: str, args: Sequence[Val], dt: DType) -> Val:
        b = self.b
        x = args[0]
        ty = x.type
        zero = ir.Constant(ty, 0)
        if fn in _INT_BINARY:
            return _INT_BINARY[fn](b, x, args[1])
        if fn == "neg":
            return b.sub(zero, x)
        if fn == "abs":
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if dt.is_signed else x
        if fn in _MIN_MAX:
            y = args[1]
            cmp = b.icmp_signed if dt.is_signed else b.icmp_unsigned
            return b.select(cmp(_MIN_MAX[fn], x, y), x, y)
        if fn in ("div", "fmod", "mod"):
            return self._int_divmod(fn, x, args[1], dt)
        if fn == "pow":  # numpy's integer pow in the interpreter goes through float64
            to_f64 = b.sitofp if dt.is_signed else b.uitofp
            p = b.call(self._libm("pow", F64, 2), [to_f64(x, F64), to_f64(args[1], F64)])
            return self.float_to_int(p, dt)
        if fn == "bit_not":
            return b.xor(x, ir.Constant(ty, -1))
        if fn in ("shl", "shr"):
            return self._shift(fn, x, args[1], dt)
        raise CodegenError(f"primitive {fn!r} is not defined on {dt}", location=fn)

    def _int_divmod(self, fn: str, x: Val, y: Val, dt: DType) -> Val:
        """Division by zero gives 0 and INT_MIN / -1 wraps, as in the interpreter (never a trap)."""
        b = self.b
        ty = x.type
        zero = ir.Constant(ty, 0)
        one = ir.Constant(ty, 1)
        by_zero = b.icmp_unsigned("==", y, zero)
        if dt.is_signed:
            overflow = b.and_(b.icmp_signed("==", x, ir.Constant(ty, _INT_MIN[dt.bits])),
                              b.icmp_signed("==", y, ir.Constant(ty, -1)))
            safe = b.select(b.or_(by_zero, overflow), one, y)
            if fn == "div":
                return b.select(by_zero, zero, b.sdiv(x, safe))
            r = b.select(overflow, zero, b.srem(x, safe))
            if fn == "mod":
                signs_differ = b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero))
                fix = b.and_(b.icmp_signed("!=", r, zero), signs_differ)
                r = b.select(fix, b.add(r, y), r)
            return b.select(by_zero, zero, r)
        safe = b.select(by_zero, one, y)
        q = b.udiv(x, safe) if fn == "div" else b.urem(x, safe)
        return b.select(by_zero, zero, q)

    def _shift(self, fn: str, x: Val, y: Val, dt: DType) -> Val:
        """numpy: a shift by >= the width (or a negative amount) gives 0, or -1 for negative >>."""
        b = self.b
        ty = x.type
        zero = ir.Constant(ty, 0)
        in_range = b.icmp_unsigned("<", y, ir.Constant(ty, dt.bits))
        amount = b.select(in_range, y, zero)
        if fn == "shl":
            return b.select(in_range, b.shl(x, amount), zero)
        if not dt.is_signed:
            return b.select(in_range, b.lshr(x, amount), zero)
        fill = b.select(b.icmp_signed("<", x, zero), ir.Constant(ty, -1), zero)
        return b.select(in_range, b.ashr(x, amount), fill)

    # -- conversions ------------------------------------------------------------------
    def _float_to_signed(self, v: Val, bits: int) -> Val:
        """x86 truncating conversion: out of range (or NaN) gives INT_MIN, as numpy's astype does."""
        b = self.b
        ty = v.type
        lo = ir.Constant(ty, float(-(2 ** (bits - 1))))
        hi = ir.Constant(ty, float(2 ** (bits - 1)))
        ok = b.and_(b.fcmp_ordered(">=", v, lo), b.fcmp_ordered("<", v, hi))
        safe = b.select(ok, v, ir.Constant(ty, 0.0))
        out_ty = ir.IntType(bits)
        return b.select(ok, b.fptosi(safe, out_ty), ir.Constant(out_ty, _INT_MIN[bits]))

    def _float_to_unsigned(self, v: Val, bits: int) -> Val:
        """numpy's unsigned conversion: values >= 2**(bits-1) are converted shifted down by that much."""
        b = self.b
        ty = v.type
        half = ir.Constant(ty, float(2 ** (bits - 1)))
        high = b.fcmp_ordered(">=", v, half)
        shifted = b.select(high, b.fsub(v, half), v)
        r = self._float_to_signed(shifted, bits)
        top = ir.Constant(ir.IntType(bits), _INT_MIN[bits])
        return b.select(high, b.xor(r, top), r)

    def float_to_int(self, v: Val, dt: DType) -> Val:
        """A truncated float register as ``dt`` (``numpy_prims.float_to_int``; narrow integers as
        ``cuvil.ir.narrow`` defines them: 0 out of range)."""
        b = self.b
        target = ir.IntType(dt.bits)
        if dt.is_narrow:
            lo, hi = INT_RANGES[dt]
            ok = b.and_(b.fcmp_ordered(">=", v, ir.Constant(v.type, float(lo))),
                        b.fcmp_ordered("<=", v, ir.Constant(v.type, float(hi))))
            safe = b.select(ok, v, ir.Constant(v.type, 0.0))
            return b.trunc(b.fptosi(safe, I32), target)
        if dt in (DType.i64, DType.i32):
            return self._float_to_signed(v, dt.bits)
        if dt in (DType.u64, DType.u32):
            return self._float_to_unsigned(v, dt.bits)
        return b.trunc(self._float_to_signed(v, 32), target)  # i8/i16/u8/u16 go through int32

    def int_to_int(self, v: Val, src: DType, dst: DType) -> Val:
        target = cast(ir.IntType, compute_type(dst))
        if v.type == target:
            return v
        if cast(ir.IntType, v.type).width > target.width:
            return self.b.trunc(v, target)
        if src.is_signed:
            return self.b.sext(v, target)
        return self.b.zext(v, target)

    def cast(self, v: Val, src: DType, dst: DType) -> Val:
        """The interpreter's ``_cast``: ->bool is != 0; float->int truncates, non-finite -> 0."""
        b = self.b
        if src is dst:
            return v
        if dst is DType.bool:
            if src.is_float:
                return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if dst.is_float:
            if src.is_float:
                return self.round_to(v, dst)
            wide = F64 if dst is DType.f64 or dst.is_narrow else F32  # narrow: one rounding of the exact value
            f = b.sitofp(v, wide) if src.is_signed and src is not DType.bool else b.uitofp(v, wide)
            return self.round_to(f, dst)
        if src is DType.bool:
            return b.zext(v, compute_type(dst))
        if src.is_int:
            return self.int_to_int(v, src, dst)
        ty = v.type
        t = b.call(self._intrinsic("trunc", ty), [v])
        mag = b.call(self._intrinsic("fabs", ty), [t])
        finite = b.fcmp_ordered("<", mag, ir.Constant(ty, float("inf")))
        t = b.select(finite, t, ir.Constant(ty, 0.0))
        return self.float_to_int(t, dst)

    def bitcast(self, v: Val, src: DType, dst: DType) -> Val:
        """``v``'s bits read as ``dst`` (``numpy_prims.bitcast``): a bool is the byte 0 or 1; a
        half-precision register goes through its exact storage bits."""
        refused = R.bitcast_refusal(src, dst)
        if refused is not None:
            raise CodegenError(f"bitcast: {refused}", location="bitcast")
        if src is dst:
            return v
        if src is DType.bool:
            return self.b.zext(v, I8)
        bits = self._float_bits(v, src) if src.is_float else v
        return self._bits_float(bits, dst) if dst.is_float else bits

    def _float_bits(self, v: Val, dt: DType) -> Val:
        """A float register's storage bits as an integer of its width."""
        b = self.b
        if dt in (DType.f32, DType.f64):
            return b.bitcast(v, ir.IntType(dt.bits))
        stored = self._stored_form(v)
        if dt is DType.f16:
            return b.bitcast(stored if stored is not None else b.fptrunc(v, F16), I16)
        return stored if stored is not None else b.trunc(b.lshr(b.bitcast(v, I32), ir.Constant(I32, 16)), I16)

    def _bits_float(self, bits: Val, dt: DType) -> Val:
        """Integer bits as a float register of ``dt`` (halves widened to f32, their bits kept for a store)."""
        b = self.b
        if dt in (DType.f32, DType.f64):
            return b.bitcast(bits, compute_type(dt))
        if dt is DType.f16:
            half = b.bitcast(bits, F16)
            return self._remember(b.fpext(half, F32), half)
        return self._remember(b.bitcast(b.shl(b.zext(bits, I32), ir.Constant(I32, 16)), F32), bits)

    def to_index(self, v: Val, dt: DType) -> Val:
        """A scalar used as an index: ``astype(int64)`` as in the interpreter."""
        if dt is DType.bool:
            return self.b.zext(v, I64)
        if dt.is_float:
            return self.float_to_int(v, DType.i64)
        return self.int_to_int(v, dt, DType.i64)

    def from_index(self, v: Val, dt: DType) -> Val:
        """An i64 index value as a scalar of ``dt`` (IndexValue)."""
        return self.cast(v, DType.i64, dt)


_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

_MIN_MAX = {"min": "<", "max": ">"}
"""The comparison that picks the first operand."""

BinaryOp = Callable[[Builder, Val, Val], Val]

_FLOAT_BINARY: dict[str, BinaryOp] = {"add": Builder.fadd, "sub": Builder.fsub, "mul": Builder.fmul,
                                      "div": Builder.fdiv, "fmod": Builder.frem}
_INT_BINARY: dict[str, BinaryOp] = {"add": Builder.add, "sub": Builder.sub, "mul": Builder.mul,
                                    "bit_and": Builder.and_, "bit_or": Builder.or_, "bit_xor": Builder.xor}
_BOOL_BINARY: dict[str, BinaryOp] = {
    **dict.fromkeys(("and", "mul", "min", "bit_and"), Builder.and_),
    **dict.fromkeys(("or", "max", "bit_or", "add"), Builder.or_),  # numpy adds booleans as logical or
    **dict.fromkeys(("xor", "bit_xor", "ne"), Builder.xor),
}
"""Primitives that are one LLVM instruction, by operand kind."""

_FLOAT_INTRINSIC = {"abs": "fabs", "sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round_even": "roundeven"}

_LIBM_UNARY = {
    "exp": "exp", "log": "log", "tanh": "tanh", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
}

_LIBM_DOMAIN = {"acosh": (1.0, math.inf), "atanh": (-1.0, 1.0), "asin": (-1.0, 1.0), "acos": (-1.0, 1.0),
                "log": (0.0, math.inf)}
"""Where the libm functions are defined: numpy (the rule) gives NaN outside; a target's libm may not
(wasi-libc's acoshf(-100) is -2.2)."""

SUPPORTED_PRIMITIVES: dict[str, frozenset[str]] = {
    "float": R.primitives_for("float"),
    "int": R.primitives_for("int"),
    "bool": R.primitives_for("bool") | {"bit_and", "bit_or", "bit_xor", "bit_not", "add", "mul", "min", "max", "abs"},
}
"""The rule primitives :meth:`ScalarEmitter.call` lowers, by the element kind of their operands (of a
``select``: its branches'). ``cuvil ops`` checks each op's rule against this table."""
