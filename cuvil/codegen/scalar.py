"""The primitives of the rule language (``cuvil.ir.rules.PRIMITIVES``) as LLVM instructions.

Every value lives in registers in its *compute type*: f16 and bf16 are computed in
f32 and rounded back to their storage precision after each primitive, which is what
numpy does for float16 and ml_dtypes for bfloat16, so results match the interpreter.
Integer and cast semantics follow ``cuvil/interp.py`` (truncating ``div``, floored
``mod``, C ``fmod``, numpy's shift; float->int conversions as ``numpy_prims.float_to_int`` writes them).
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
from llvmlite import ir

from cuvil.codegen.narrow import emit_narrow, emit_widen
from cuvil.errors import CodegenError
from cuvil.ir import numpy_prims
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.narrow import INT_RANGES

F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()


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

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder

    @property
    def module(self) -> ir.Module:
        return self.b.module

    # -- external functions ---------------------------------------------------------
    def _extern(self, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
        found = self.module.globals.get(name)
        if isinstance(found, ir.Function):
            return found
        return ir.Function(self.module, ir.FunctionType(ret, list(args)), name=name)

    def _intrinsic(self, name: str, ty: ir.Type, arity: int = 1) -> ir.Function:
        suffix = "f64" if ty == F64 else "f32"
        return self._extern(f"llvm.{name}.{suffix}", ty, [ty] * arity)

    def _libm(self, name: str, ty: ir.Type, arity: int = 1) -> ir.Function:
        return self._extern(name if ty == F64 else name + "f", ty, [ty] * arity)

    # -- memory <-> registers ---------------------------------------------------------
    def from_storage(self, v: ir.Value, dt: DType) -> ir.Value:
        if dt is DType.bool:
            return self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        if dt is DType.f16:
            return self.b.fpext(v, F32)
        if dt is DType.bf16:
            bits = self.b.shl(self.b.zext(v, I32), ir.Constant(I32, 16))
            return self.b.bitcast(bits, F32)
        if dt.is_narrow:  # floats widen through a table; ints keep their low bits
            return emit_widen(self.b, v, dt) if dt.is_float else self.b.trunc(v, compute_type(dt))
        return v

    def to_storage(self, v: ir.Value, dt: DType) -> ir.Value:
        if dt is DType.bool:
            return self.b.zext(v, I8)
        if dt is DType.f16:
            return self.b.fptrunc(v, F16)
        if dt is DType.bf16:
            return self._bf16_bits(v)
        if dt.is_narrow:
            return emit_narrow(self.b, v, dt) if dt.is_float else self.b.zext(v, I8)
        return v

    def _bf16_bits(self, v: ir.Value) -> ir.Value:
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

    def round_to(self, v: ir.Value, dt: DType) -> ir.Value:
        """Round a float result (f32 or f64 register) to ``dt``'s precision, in compute type."""
        if dt is DType.f16:
            return self.b.fpext(self.b.fptrunc(v, F16), F32)
        if dt is DType.bf16:
            return self.from_storage(self._bf16_bits(v), dt)
        if dt.is_narrow:
            return self.from_storage(self.to_storage(v, dt), dt)
        target = compute_type(dt)
        if v.type == target:
            return v
        return self.b.fptrunc(v, target) if v.type == F64 else self.b.fpext(v, target)

    # -- primitives -------------------------------------------------------------------
    def call(self, fn: str, args: Sequence[ir.Value], arg_dtypes: Sequence[DType], out: DType,
             attrs: dict[str, object]) -> ir.Value:
        if fn == "cast":
            return self.cast(args[0], arg_dtypes[0], out)
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

    def _compare(self, fn: str, a: ir.Value, b: ir.Value, dt: DType) -> ir.Value:
        op = _COMPARE[fn]
        if dt.is_float:
            if fn == "ne":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(op, a, b)
        if dt.is_signed:
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def _bool_op(self, fn: str, args: Sequence[ir.Value]) -> ir.Value:
        b = self.b
        if fn in ("and", "mul", "min", "bit_and"):
            return b.and_(args[0], args[1])
        if fn in ("or", "max", "bit_or"):
            return b.or_(args[0], args[1])
        if fn in ("xor", "bit_xor", "ne"):
            return b.xor(args[0], args[1])
        if fn in ("not", "bit_not"):
            return b.xor(args[0], ir.Constant(I1, 1))
        if fn == "add":  # numpy adds booleans as logical or
            return b.or_(args[0], args[1])
        if fn in ("abs",):
            return args[0]
        raise CodegenError(f"primitive {fn!r} is not defined on bool", location=fn)

    def _float_op(self, fn: str, args: Sequence[ir.Value], dt: DType) -> ir.Value:
        b = self.b
        ty = args[0].type
        x = args[0]
        y = args[1] if len(args) > 1 else None
        if fn == "add":
            return b.fadd(x, y)
        if fn == "sub":
            return b.fsub(x, y)
        if fn == "mul":
            return b.fmul(x, y)
        if fn == "div":
            return b.fdiv(x, y)
        if fn == "neg":
            return b.fneg(x)
        if fn == "abs":
            return b.call(self._intrinsic("fabs", ty), [x])
        if fn == "min":  # numpy: NaN in either operand propagates; ties give the second operand
            pick = b.or_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered("<", x, y))
            return b.select(pick, x, y)
        if fn == "max":
            pick = b.or_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered(">", x, y))
            return b.select(pick, x, y)
        if fn == "fmod":
            return b.frem(x, y)
        if fn == "mod":
            return self._float_mod(x, y)
        if fn == "pow":
            return b.call(self._libm("pow", ty, 2), [x, y])
        if fn in ("sqrt", "floor", "ceil"):
            return b.call(self._intrinsic(fn, ty), [x])
        if fn == "round_even":
            return b.call(self._intrinsic("roundeven", ty), [x])
        if fn == "isnan":
            return b.fcmp_unordered("uno", x, x)
        if fn == "isinf":
            mag = b.call(self._intrinsic("fabs", ty), [x])
            return b.fcmp_ordered("==", mag, ir.Constant(ty, float("inf")))
        if fn == "erf":  # the interpreter evaluates erf in double precision for every float type
            wide = x if ty == F64 else b.fpext(x, F64)
            return b.call(self._extern("erf", F64, [F64]), [wide])
        if fn in _LIBM_UNARY:
            return b.call(self._libm(_LIBM_UNARY[fn], ty), [x])
        raise CodegenError(f"primitive {fn!r} is not defined on {dt}", location=fn)

    def _float_mod(self, x: ir.Value, y: ir.Value) -> ir.Value:
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

    def _int_op(self, fn: str, args: Sequence[ir.Value], dt: DType) -> ir.Value:
        b = self.b
        ty = args[0].type
        signed = dt.is_signed
        x = args[0]
        y = args[1] if len(args) > 1 else None
        zero = ir.Constant(ty, 0)
        if fn == "add":
            return b.add(x, y)
        if fn == "sub":
            return b.sub(x, y)
        if fn == "mul":
            return b.mul(x, y)
        if fn == "neg":
            return b.sub(zero, x)
        if fn == "abs":
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if signed else x
        if fn in ("min", "max"):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<" if fn == "min" else ">", x, y), x, y)
        if fn in ("div", "fmod", "mod"):
            return self._int_divmod(fn, x, y, dt)
        if fn == "pow":  # numpy's integer pow in the interpreter goes through float64
            fa = b.sitofp(x, F64) if signed else b.uitofp(x, F64)
            fb = b.sitofp(y, F64) if signed else b.uitofp(y, F64)
            p = b.call(self._libm("pow", F64, 2), [fa, fb])
            return self.float_to_int(p, dt)
        if fn == "bit_and":
            return b.and_(x, y)
        if fn == "bit_or":
            return b.or_(x, y)
        if fn == "bit_xor":
            return b.xor(x, y)
        if fn == "bit_not":
            return b.xor(x, ir.Constant(ty, -1))
        if fn in ("shl", "shr"):
            return self._shift(fn, x, y, dt)
        raise CodegenError(f"primitive {fn!r} is not defined on {dt}", location=fn)

    def _int_divmod(self, fn: str, x: ir.Value, y: ir.Value, dt: DType) -> ir.Value:
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

    def _shift(self, fn: str, x: ir.Value, y: ir.Value, dt: DType) -> ir.Value:
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
    def _float_to_signed(self, v: ir.Value, bits: int) -> ir.Value:
        """x86 truncating conversion: out of range (or NaN) gives INT_MIN, as numpy's astype does."""
        b = self.b
        ty = v.type
        lo = ir.Constant(ty, float(-(2 ** (bits - 1))))
        hi = ir.Constant(ty, float(2 ** (bits - 1)))
        ok = b.and_(b.fcmp_ordered(">=", v, lo), b.fcmp_ordered("<", v, hi))
        safe = b.select(ok, v, ir.Constant(ty, 0.0))
        out_ty = ir.IntType(bits)
        return b.select(ok, b.fptosi(safe, out_ty), ir.Constant(out_ty, _INT_MIN[bits]))

    def _float_to_unsigned(self, v: ir.Value, bits: int) -> ir.Value:
        """numpy's unsigned conversion: values >= 2**(bits-1) are converted shifted down by that much."""
        b = self.b
        ty = v.type
        half = ir.Constant(ty, float(2 ** (bits - 1)))
        high = b.fcmp_ordered(">=", v, half)
        shifted = b.select(high, b.fsub(v, half), v)
        r = self._float_to_signed(shifted, bits)
        top = ir.Constant(ir.IntType(bits), _INT_MIN[bits])
        return b.select(high, b.xor(r, top), r)

    def float_to_int(self, v: ir.Value, dt: DType) -> ir.Value:
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

    def int_to_int(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        target = compute_type(dst)
        if v.type == target:
            return v
        if v.type.width > target.width:
            return self.b.trunc(v, target)
        if src.is_signed:
            return self.b.sext(v, target)
        return self.b.zext(v, target)

    def cast(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
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

    def to_index(self, v: ir.Value, dt: DType) -> ir.Value:
        """A scalar used as an index: ``astype(int64)`` as in the interpreter."""
        if dt is DType.bool:
            return self.b.zext(v, I64)
        if dt.is_float:
            return self.float_to_int(v, DType.i64)
        return self.int_to_int(v, dt, DType.i64)

    def from_index(self, v: ir.Value, dt: DType) -> ir.Value:
        """An i64 index value as a scalar of ``dt`` (IndexValue)."""
        return self.cast(v, DType.i64, dt)


_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

_LIBM_UNARY = {
    "exp": "exp", "log": "log", "tanh": "tanh", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
}

SUPPORTED_PRIMITIVES: dict[str, frozenset[str]] = {
    "float": frozenset({"add", "sub", "mul", "div", "neg", "abs", "min", "max", "fmod", "mod", "pow", "sqrt", "floor",
                        "ceil", "round_even", "isnan", "isinf", "erf", "exp", "log", "tanh", "sin", "cos", "tan",
                        "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "eq", "ne", "lt", "le",
                        "gt", "ge", "select", "cast"}),
    "int": frozenset({"add", "sub", "mul", "div", "neg", "abs", "min", "max", "fmod", "mod", "pow", "bit_and",
                      "bit_or", "bit_xor", "bit_not", "shl", "shr", "eq", "ne", "lt", "le", "gt", "ge", "select",
                      "cast"}),
    "bool": frozenset({"and", "or", "xor", "not", "bit_and", "bit_or", "bit_xor", "bit_not", "add", "mul", "min",
                       "max", "abs", "eq", "ne", "lt", "le", "gt", "ge", "select", "cast"}),
}
"""The rule primitives :meth:`ScalarEmitter.call` lowers, by the element kind of their operands (of a
``select``: its branches'). ``cuvil ops`` checks each op's rule against this table."""
