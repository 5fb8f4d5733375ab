"""Scalar semantics for the cone encoder: what a primitive, a literal, a cast or a
reduction means under each encoder.

* ``real``: floats are z3 reals kept in polynomial normal form (``verify.poly``);
  transcendental functions are uninterpreted, with the few facts a proof needs
  instantiated at each application (each one checked numerically in the tests).
  Float casts are the identity: this tier ignores rounding by definition.
* ``abstract-fp``: floats of each dtype are an opaque sort; every float operation is an
  uninterpreted function. The only laws used are ones IEEE arithmetic (as the reference
  interpreter computes it) satisfies bit for bit: see ``verify.axioms.ABSTRACT_FP``.
  Never associativity or distributivity.

Integers are bit-vectors of their real width and booleans z3 booleans under both.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import z3
from z3 import z3core as Z3C

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.narrow import values as narrow_values
from cuvil.ir.numpy_prims import cast, literal
from verify.narrow_bits import float_to_int, narrow_float_code
from verify.poly import AtomTable, Poly
from verify.z3_terms import arith, bitvec, boolean, bv_value, int_value, ite

VAR_PREFIXES = ("__i", "__d_", "__k")
"""Names of the integer variables a term may depend on: output indices, symbolic dims and
reduction binders. Reduction terms take the ones their body mentions as arguments."""


class EncodingError(Exception):
    """A rule uses something this encoder cannot express; the obligation becomes unknown."""


def stable_hash(key: object) -> int:
    """A hash of ``repr(key)`` that is the same in every process (Python's ``hash`` of a string
    changes with PYTHONHASHSEED, and the order it induces would make verdicts vary)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


class VarScan:
    """Per z3 term: the index variables it mentions and a structural key that ignores their
    names (memoized by AST id; walks raw ASTs for speed).

    The key orders the arguments of commutative operations and the monomials of polynomials:
    unlike AST ids it does not depend on which variables a reduction binds, so a reduction
    body built with other binder names comes out in the same order and gets the same name."""

    def __init__(self) -> None:
        # keyed by AST id; each entry holds a reference to its AST so the id cannot be reused
        self._memo: dict[int, tuple[z3.AstRef, tuple[str, ...], int]] = {}

    def names(self, t: z3.ExprRef) -> tuple[str, ...]:
        """Variables in first-occurrence order of a left-to-right walk."""
        return self._scan(t)[1]

    def shape(self, t: z3.ExprRef) -> int:
        return self._scan(t)[2]

    def _scan(self, t: z3.ExprRef) -> tuple[z3.AstRef, tuple[str, ...], int]:
        found = self._memo.get(t.get_id())
        if found is not None:
            return found
        ctx = t.ctx
        c = ctx.ref()
        stack: list[tuple[Any, bool]] = [(t.as_ast(), False)]
        while stack:
            a, expanded = stack.pop()
            aid = Z3C.Z3_get_ast_id(c, a)
            if aid in self._memo:
                continue
            if Z3C.Z3_get_ast_kind(c, a) != z3.Z3_APP_AST:
                self._memo[aid] = (z3.AstRef(a, ctx), (), stable_hash(Z3C.Z3_ast_to_string(c, a)))
                continue
            app = Z3C.Z3_to_app(c, a)
            n = Z3C.Z3_get_app_num_args(c, app)
            decl = Z3C.Z3_get_app_decl(c, app)
            if n == 0:
                out: tuple[str, ...] = ()
                text = Z3C.Z3_ast_to_string(c, a)
                if Z3C.Z3_get_decl_kind(c, decl) == z3.Z3_OP_UNINTERPRETED and text.startswith(VAR_PREFIXES):
                    out, key = (text,), stable_hash("<index variable>")
                else:
                    key = stable_hash(("const", text))
                self._memo[aid] = (z3.AstRef(a, ctx), out, key)
                continue
            args = [Z3C.Z3_get_app_arg(c, app, i) for i in range(n)]
            if not expanded:
                stack.append((a, True))
                stack.extend((x, False) for x in reversed(args))
                continue
            seen: dict[str, None] = {}
            keys: list[int] = []
            for x in args:
                entry = self._memo[Z3C.Z3_get_ast_id(c, x)]
                keys.append(entry[2])
                for nm in entry[1]:
                    seen.setdefault(nm, None)
            name = Z3C.Z3_get_symbol_string(c, Z3C.Z3_get_decl_name(c, decl))
            self._memo[aid] = (z3.AstRef(a, ctx), tuple(seen), stable_hash((name, tuple(keys))))
        return self._memo[t.get_id()]

    def order_key(self, t: z3.ExprRef) -> tuple[int, int]:
        """Structure first, AST id only to break ties."""
        return self.shape(t), t.get_id()

    def depends(self, t: z3.ExprRef, binders: frozenset[str]) -> bool:
        return any(n in binders for n in self.names(t))


def float_value(value: float | int | bool, dtype: DType) -> float:
    """A literal rounded to ``dtype``, as the interpreter stores it."""
    return float(cast(literal(value, dtype), DType.f64))


def _bits_key(x: float, dtype: DType) -> str:
    if math.isnan(x):
        return "nan"
    return literal(x, dtype).tobytes().hex()


class Semantics:
    """Shared parts: sorts, uninterpreted functions, integers, booleans and named reductions."""

    name = "base"
    models_rounding = False  # whether float values are bit patterns (casts round) or reals

    def __init__(self, ctx: z3.Context) -> None:
        self.ctx = ctx
        self.facts: list[z3.BoolRef] = []
        self.axioms: set[str] = set()
        self.scan = VarScan()
        self._ufs: dict[str, z3.FuncDeclRef] = {}
        self._reductions: dict[tuple, str] = {}
        self._dag_keys: dict[int, tuple[z3.ExprRef, str]] = {}
        self.int_sort = z3.IntSort(ctx)
        self._narrow_terms: dict[tuple[DType, str], tuple[z3.BitVecRef, z3.BitVecRef]] = {}
        self._fresh = itertools.count()

    # sorts and functions ----------------------------------------------------------
    def float_sort(self, dtype: DType) -> z3.SortRef:
        raise NotImplementedError

    def sort(self, dtype: DType) -> z3.SortRef:
        if dtype is DType.bool:
            return z3.BoolSort(self.ctx)
        if dtype.is_int:
            return z3.BitVecSort(dtype.bits, self.ctx)
        return self.float_sort(dtype)

    def uf(self, name: str, domain: Sequence[z3.SortRef], rng: z3.SortRef) -> z3.FuncDeclRef:
        f = self._ufs.get(name)
        if f is None:
            f = z3.Function(name, *domain, rng)
            self._ufs[name] = f
        return f

    # values <-> terms -----------------------------------------------------------------
    def term(self, v: Any, dtype: DType) -> z3.ExprRef:
        return v

    def from_term(self, t: z3.ExprRef, dtype: DType) -> Any:
        return t

    def same(self, a: Any, b: Any, dtype: DType) -> bool:
        return z3.eq(self.term(a, dtype), self.term(b, dtype))

    # literals -------------------------------------------------------------------------
    def lit(self, value: float | int | bool, dtype: DType) -> Any:
        if dtype is DType.bool:
            return z3.BoolVal(bool(value), self.ctx)
        if dtype.is_int:
            return z3.BitVecVal(int(value) % (1 << dtype.bits), dtype.bits, self.ctx)
        return self.float_lit(float_value(value, dtype), dtype)

    def float_lit(self, x: float, dtype: DType) -> Any:
        raise NotImplementedError

    # primitives -----------------------------------------------------------------------
    def call(self, fn: str, args: list[Any], dtypes: list[DType], out: DType, attrs: dict[str, Any]) -> Any:
        if fn == "select":
            return self.select(args[0], args[1], args[2], out)
        if fn == "cast":
            return self.cast(args[0], dtypes[0], out)
        if fn == "bitcast":
            return self.bitcast(args[0], dtypes[0], out)
        dt = dtypes[0]
        if dt is DType.bool:
            return self._bool_call(fn, args)
        if dt.is_int:
            return self._int_call(fn, args, dt)
        return self.float_call(fn, args, dt)

    def float_call(self, fn: str, args: list[Any], dtype: DType) -> Any:
        raise NotImplementedError

    def select(self, c: z3.BoolRef, a: Any, b: Any, dtype: DType) -> Any:
        if z3.is_true(c):
            return a
        if z3.is_false(c):
            return b
        if self.same(a, b, dtype):
            return a
        return self.from_term(ite(c, self.term(a, dtype), self.term(b, dtype)), dtype)

    def _bool_call(self, fn: str, args: list[z3.BoolRef]) -> z3.BoolRef:
        ops = {"and": lambda a, b: z3.And(a, b), "or": lambda a, b: z3.Or(a, b), "xor": lambda a, b: z3.Xor(a, b),
               "not": lambda a: z3.Not(a), "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
               "max": lambda a, b: z3.Or(a, b), "min": lambda a, b: z3.And(a, b),
               "lt": lambda a, b: z3.And(z3.Not(a), b), "gt": lambda a, b: z3.And(a, z3.Not(b)),
               "le": lambda a, b: z3.Or(z3.Not(a), b), "ge": lambda a, b: z3.Or(a, z3.Not(b))}
        if fn not in ops:
            raise EncodingError(f"no boolean meaning for {fn}")
        return boolean(z3.simplify(ops[fn](*args)))

    def _int_call(self, fn: str, args: list[z3.BitVecRef], dt: DType) -> Any:
        signed = dt.is_signed
        a = args[0]
        b = args[1] if len(args) > 1 else None
        zero = z3.BitVecVal(0, dt.bits, self.ctx)
        if fn == "add":
            return a + b
        if fn == "sub":
            return a - b
        if fn == "mul":
            return a * b
        if fn == "div":
            return z3.If(b == zero, zero, a / b if signed else z3.UDiv(a, b))
        if fn == "mod":
            return z3.If(b == zero, zero, a % b if signed else z3.URem(a, b))  # z3py's % is bvsmod (floored)
        if fn == "fmod":
            return z3.If(b == zero, zero, z3.SRem(a, b) if signed else z3.URem(a, b))
        if fn in ("min", "max"):
            less = a < b if signed else z3.ULT(a, b)
            return z3.If(less, a, b) if fn == "min" else z3.If(less, b, a)
        if fn == "neg":
            return -a
        if fn == "abs":
            return z3.If(a < zero, -a, a) if signed else a
        if fn == "bit_and":
            return a & b
        if fn == "bit_or":
            return a | b
        if fn == "bit_xor":
            return a ^ b
        if fn == "bit_not":
            return ~a
        if fn == "shl":
            return a << b
        if fn == "shr":
            return a >> b if signed else z3.LShR(a, b)
        cmp = {"eq": lambda: a == b, "ne": lambda: a != b,
               "lt": lambda: a < b if signed else z3.ULT(a, b), "le": lambda: a <= b if signed else z3.ULE(a, b),
               "gt": lambda: a > b if signed else z3.UGT(a, b), "ge": lambda: a >= b if signed else z3.UGE(a, b)}
        if fn in cmp:
            return cmp[fn]()
        # pow and anything else on integers: an opaque (but consistent) function
        sort = self.sort(dt)
        return self.uf(f"{fn}_{dt.value}", [sort] * len(args), sort)(*args)

    # casts ----------------------------------------------------------------------------
    def cast(self, x: Any, src: DType, dst: DType) -> Any:
        if src is dst:
            return x
        if src.is_narrow or dst.is_narrow:
            folded = self._fold_narrow(x, src, dst)
            if folded is not None:
                return folded
        if src is DType.bool:
            return self.select(x, self.lit(1, dst), self.lit(0, dst), dst)
        if dst is DType.bool:
            if src.is_int:
                return x != z3.BitVecVal(0, src.bits, self.ctx)
            return self.float_nonzero(x, src)
        if src.is_int and dst.is_int:
            if dst.bits > src.bits:
                return z3.SignExt(dst.bits - src.bits, x) if src.is_signed else z3.ZeroExt(dst.bits - src.bits, x)
            if dst.bits < src.bits:
                return z3.Extract(dst.bits - 1, 0, x)
            return x
        if src.is_int:
            return self.int_to_float(x, src, dst)
        if dst.is_int:
            return self.float_to_int(x, src, dst)
        return self.float_to_float(x, src, dst)

    def literal_value(self, x: Any, dtype: DType) -> float | None:
        """The value of ``x`` when it is a known float literal of ``dtype`` (only tiers that
        model rounding know one: under ``real`` casts are the identity)."""
        return None

    def _fold_narrow(self, x: Any, src: DType, dst: DType) -> Any:
        """A conversion into or out of a narrow type of a known value, evaluated through the z3
        reading of the narrow rule (``verify.narrow_bits``); None when ``x`` is not known."""
        if not self.models_rounding:
            return None
        if src.is_float:
            v = self.literal_value(x, src)
        elif src is not DType.bool and z3.is_bv_value(x):
            v = float(bv_value(x, src.is_signed))
        else:
            return None
        if v is None:
            return None
        if src.is_narrow and dst.is_float and not dst.is_narrow:
            return self.lit(v, dst)  # a narrow value is exact in f32; f16/bf16 round it once
        pattern = struct.unpack("<Q", struct.pack("<d", v))[0]
        if dst.is_float and dst.is_narrow:
            code = bv_value(self._narrow_term(dst, "code", pattern))
            return self.lit(float(narrow_values(dst)[code]), dst)
        if dst.is_narrow and src.is_float:
            return self._narrow_term(dst, "int", pattern)
        return None

    def _narrow_term(self, dst: DType, kind: str, pattern: int) -> z3.BitVecRef:
        """The narrow conversion of the f64 bit pattern ``pattern``: one symbolic term per target
        and kind, evaluated by substitution."""
        key = (dst, kind)
        found = self._narrow_terms.get(key)
        if found is None:
            var = z3.BitVec(f"__narrow_{dst.value}_{kind}", 64, self.ctx)
            found = (var, narrow_float_code(var, dst) if kind == "code" else float_to_int(var, dst))
            self._narrow_terms[key] = found
        var, term = found
        return bitvec(z3.simplify(z3.substitute(term, (var, z3.BitVecVal(pattern, 64, self.ctx)))))

    def float_nonzero(self, x: Any, dtype: DType) -> z3.BoolRef:
        raise NotImplementedError

    def int_to_float(self, x: z3.BitVecRef, src: DType, dst: DType) -> Any:
        raise NotImplementedError

    def index_to_float(self, i: z3.ArithRef, dst: DType) -> Any:
        """An index-valued integer (known to fit in i64) as a float of ``dst``."""
        raise NotImplementedError

    def float_to_int(self, x: Any, src: DType, dst: DType) -> z3.BitVecRef:
        sort = self.sort(dst)
        return bitvec(self.uf(f"cast_{src.value}_{dst.value}", [self.sort(src)], sort)(self.term(x, src)))

    def float_to_float(self, x: Any, src: DType, dst: DType) -> Any:
        raise NotImplementedError

    # bit reinterpretation ---------------------------------------------------------------
    def bitcast(self, x: Any, src: DType, dst: DType) -> Any:
        """``x``'s bits read as ``dst`` (``numpy_prims.bitcast``): an integer keeps its bit-vector, a
        bool is the byte 0 or 1, a float goes through its bit pattern."""
        refused = R.bitcast_refusal(src, dst)
        if refused is not None:
            raise EncodingError(f"bitcast: {refused}")
        if src is dst:
            return x
        if src is DType.bool:
            return self.select(x, self.lit(1, dst), self.lit(0, dst), dst)
        bits = self._known_float_bits(x, src) if src.is_float else bitvec(x)
        return self._known_bits_float(bits, dst) if dst.is_float else bits

    def _known_float_bits(self, x: Any, dtype: DType) -> z3.BitVecRef:
        """A float literal's bits as a numeral (not a NaN's: a literal NaN stands for every NaN)."""
        value = self.literal_value(x, dtype)
        if value is None or math.isnan(value):
            return self.float_bits(x, dtype)
        self.axioms.add("bitcast-literal")
        pattern = literal(value, dtype).view(np.dtype(f"u{dtype.bits // 8}"))
        return z3.BitVecVal(int(pattern), dtype.bits, self.ctx)

    def _known_bits_float(self, bits: z3.BitVecRef, dtype: DType) -> Any:
        """A numeral's bits as a float literal (any NaN pattern as the NaN literal)."""
        if not z3.is_bv_value(bits):
            return self.bits_float(bits, dtype)
        self.axioms.add("bitcast-literal")
        word = np.array(bv_value(bits), dtype=np.dtype(f"u{dtype.bits // 8}")).view(dtype.np)
        return self.lit(float(word.astype(np.float64)), dtype)

    def fresh_bits(self, dtype: DType) -> z3.BitVecRef:
        """A bit-vector of ``dtype``'s width that nothing constrains, new at each call."""
        return z3.BitVec(f"free_bits_{dtype.value}_{next(self._fresh)}", dtype.bits, self.ctx)

    def float_bits(self, x: Any, dtype: DType) -> z3.BitVecRef:
        raise NotImplementedError

    def bits_float(self, bits: z3.BitVecRef, dtype: DType) -> Any:
        raise NotImplementedError

    # reductions -----------------------------------------------------------------------
    def named_reduction(self, kind: str, body: z3.ExprRef, binders: Sequence[z3.ArithRef],
                        extents: Sequence[int | z3.ArithRef], sort: z3.SortRef) -> z3.ExprRef:
        """``kind`` of ``body`` over ``binders`` as one uninterpreted application whose name is a
        hash of the body with its binders and free variables renamed positionally: bodies equal
        up to renaming give the same function, and its arguments are the body's free variables."""
        binder_names = [b.decl().name() for b in binders]
        free = [n for n in self.scan.names(body) if n not in binder_names]
        sub: list[tuple[z3.ExprRef, z3.ExprRef]] = []
        for j, b in enumerate(binders):
            sub.append((b, z3.Int(f"__b{j}", self.ctx)))
        free_terms = [z3.Int(n, self.ctx) for n in free]
        for n, v in enumerate(free_terms):
            sub.append((v, z3.Int(f"__a{n}", self.ctx)))
        canon = z3.substitute(body, *sub) if sub else body
        # the simplifier orders the arguments of + and * among the renamed variables, which index
        # expressions were built in AST-id order of the original (binder-specific) variables
        canon = z3.simplify(canon, sort_sums=True)
        sym_extents = [e for e in extents if not isinstance(e, int)]
        ext_key = ",".join(str(e) if isinstance(e, int) else "?" for e in extents)
        key = (kind, ext_key, self._dag_key(canon), sort.sexpr())
        name = self._reductions.get(key)
        if name is None:
            digest = hashlib.sha1(repr(key).encode()).hexdigest()[:16]
            name = f"{kind}_{digest}"
            self._reductions[key] = name
        args = [*free_terms, *sym_extents]
        f = self.uf(name, [self.int_sort] * len(args), sort)
        return f(*args)

    def _dag_key(self, t: z3.ExprRef) -> str:
        """A digest of a term's text computed over its DAG, each shared subterm once: the text itself
        (what ``sexpr`` prints) writes a subterm out at every path to it, exponentially many in a
        deep network's cone. Leaves are keyed by their text; an application by its declaration, sort
        and its arguments' keys. Terms are held with their keys, so an id is never reused."""
        memo = self._dag_keys
        stack = [t]
        while stack:
            x = stack[-1]
            if x.get_id() in memo:
                stack.pop()
                continue
            kids = x.children() if z3.is_app(x) else []
            pending = [c for c in kids if c.get_id() not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if not kids:
                text = x.sexpr()
            else:
                text = "(" + " ".join([x.decl().sexpr(), x.sort().sexpr(), *(memo[c.get_id()][1] for c in kids)]) + ")"
            memo[x.get_id()] = (x, hashlib.sha1(text.encode()).hexdigest())
        return memo[t.get_id()][1]

    def reduce_symbolic(self, kind: str, body: Any, dtype: DType, binders: Sequence[z3.ArithRef],
                        extents: Sequence[int | z3.ArithRef]) -> Any:
        names = frozenset(b.decl().name() for b in binders)
        t = self.term(body, dtype)
        if kind in ("max", "min") and not self.scan.depends(t, names):
            return body  # max/min of a constant body over a non-empty range (dims are >= 1)
        return self.from_term(self.named_reduction(kind, t, binders, extents, self.sort(dtype)), dtype)

    def reduce_identity(self, kind: str, dtype: DType) -> Any:
        return self.lit(R.reduction_identity(kind, dtype), dtype)

    # a dot reduction (rules.DOT_KINDS): each step a fused multiply-add of two factors
    def dot_step(self, kind: str, acc: Any, x: Any, y: Any, dtype: DType) -> Any:
        """One step ``acc = fma(x, y, acc)`` (``dot_ftz``: factors and result flushed): by default one
        uninterpreted function of the three, per kind and dtype."""
        sort = self.sort(dtype)
        f = self.uf(f"{kind}_step_{dtype.value}", [sort] * 3, sort)
        return self.from_term(f(self.term(acc, dtype), self.term(x, dtype), self.term(y, dtype)), dtype)

    def dot_term(self, kind: str, x: Any, y: Any, dtype: DType) -> Any:
        """A symbolic dot's body: by default an uninterpreted pair of its factors, the reduction over it
        one named fold like any other."""
        sort = self.sort(dtype)
        f = self.uf(f"{kind}_pair_{dtype.value}", [sort] * 2, sort)
        return self.from_term(f(self.term(x, dtype), self.term(y, dtype)), dtype)

    # leaves -----------------------------------------------------------------------------
    def range_facts(self, t: z3.ExprRef, dtype: DType, lo: float, hi: float) -> None:
        """Facts a constant's data guarantees for every element read (preconditions)."""
        if dtype.is_int:
            lo_v, hi_v = z3.BitVecVal(int(lo), dtype.bits, self.ctx), z3.BitVecVal(int(hi), dtype.bits, self.ctx)
            if dtype.is_signed:
                self.facts.append(boolean(z3.And(lo_v <= t, t <= hi_v)))
            else:
                self.facts.append(boolean(z3.And(z3.ULE(lo_v, t), z3.ULE(t, hi_v))))


# --------------------------------------------------------------------------------------
# real


_REAL_TRANSCENDENTAL = ("exp", "log", "sqrt", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                        "cosh", "asinh", "acosh", "atanh", "round_even", "fmod", "mod", "pow")


class RealSemantics(Semantics):
    """Floats as reals in polynomial normal form; rounding is ignored (the ``real`` tier)."""

    name = "real"

    def __init__(self, ctx: z3.Context) -> None:
        super().__init__(ctx)
        self.atoms = AtomTable(ctx, self.scan.order_key)
        self.real = z3.RealSort(ctx)
        self._specials: dict[str, z3.ArithRef] = {}

    def float_sort(self, dtype: DType) -> z3.SortRef:
        return self.real

    def term(self, v: Any, dtype: DType) -> z3.ExprRef:
        if isinstance(v, Poly):
            return self.atoms.term(v)
        return v

    def from_term(self, t: z3.ExprRef, dtype: DType) -> Any:
        if dtype.is_float:
            return self.atoms.atom(arith(t))
        return t

    def same(self, a: Any, b: Any, dtype: DType) -> bool:
        if isinstance(a, Poly) and isinstance(b, Poly):
            return a.key == b.key
        return super().same(a, b, dtype)

    def float_lit(self, x: float, dtype: DType) -> Any:
        if math.isfinite(x):
            return Poly.const(Fraction(x))
        name = "nan" if math.isnan(x) else ("posinf" if x > 0 else "neginf")
        special = self._specials.get(name)
        if special is None:
            special = z3.Real(f"real_{name}", self.ctx)
            self._specials[name] = special
        return self.atoms.atom(special)

    def _fn(self, name: str, arity: int = 1) -> z3.FuncDeclRef:
        return self.uf(f"real_{name}", [self.real] * arity, self.real)

    def float_call(self, fn: str, args: list[Any], dtype: DType) -> Any:
        a = args[0]
        b: Any = args[1] if len(args) > 1 else None
        if fn == "add":
            return a + b
        if fn == "sub":
            return a - b
        if fn == "mul":
            return self.atoms.product([a, b])
        if fn == "neg":
            return -a
        if fn == "div":
            return self.divide(a, b)
        if fn in ("min", "max"):
            ta, tb = self.atoms.term(a), self.atoms.term(b)
            if a.key == b.key:
                return a
            less = ta < tb
            return self.atoms.atom(ite(less, ta, tb) if fn == "min" else ite(less, tb, ta))
        if fn == "abs":
            ta = self.atoms.term(a)
            return self.atoms.atom(ite(ta >= 0, ta, arith(-ta)))
        if fn == "floor":
            return self.atoms.atom(arith(z3.ToReal(z3.ToInt(self.atoms.term(a)))))
        if fn == "ceil":
            return -self.atoms.atom(arith(z3.ToReal(z3.ToInt(self.atoms.term(-a)))))
        if fn == "pow" and b.is_const:
            e = b.constant
            if e.denominator == 1 and 0 <= e.numerator <= 4:
                return self.atoms.product([a] * e.numerator)
        cmp = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
               "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y}
        if fn in cmp:
            if a.key == b.key:
                return z3.BoolVal(fn in ("eq", "le", "ge"), self.ctx)
            return cmp[fn](self.atoms.term(a), self.atoms.term(b))
        if fn in ("isnan", "isinf"):
            return z3.BoolVal(False, self.ctx)
        if fn in _REAL_TRANSCENDENTAL:
            terms = [self.atoms.term(x) for x in args]
            out = arith(self._fn(fn, len(terms))(*terms))
            self._instantiate(fn, terms, out)
            return self.atoms.atom(out)
        raise EncodingError(f"no real meaning for {fn}")

    def divide(self, a: Poly, b: Poly) -> Poly:
        if b.is_const and b.constant != 0:
            return a.scale(1 / b.constant)
        tb = self.atoms.term(b)
        inv = arith(1 / tb)
        self.axioms.add("real-division")
        return self.atoms.product([a, self.atoms.atom(inv)])

    def _instantiate(self, fn: str, args: list[z3.ArithRef], out: z3.ArithRef) -> None:
        """Ground instances of the real axioms (``verify.axioms.REAL``) at one application."""
        if fn == "sqrt":
            y = args[0]
            self.facts.append(z3.Implies(y >= 0, z3.And(out >= 0, out * out == y)))
            self.facts.append(z3.Implies(y > 0, out > 0))
            self.axioms.update(("sqrt-square", "sqrt-nonnegative", "sqrt-positive"))
        elif fn == "exp":
            self.facts.append(out > 0)
            self.axioms.add("exp-positive")

    def select(self, c: z3.BoolRef, a: Any, b: Any, dtype: DType) -> Any:
        return super().select(boolean(z3.simplify(c)) if not z3.is_const(c) else c, a, b, dtype)

    def float_nonzero(self, x: Any, dtype: DType) -> z3.BoolRef:
        return boolean(self.atoms.term(x) != 0)

    def int_to_float(self, x: z3.BitVecRef, src: DType, dst: DType) -> Any:
        return self.atoms.atom(arith(z3.ToReal(z3.BV2Int(x, is_signed=src.is_signed))))

    def index_to_float(self, i: z3.ArithRef, dst: DType) -> Any:
        if z3.is_int_value(i):
            return Poly.const(int_value(i))
        return self.atoms.atom(arith(z3.ToReal(i)))

    def float_to_int(self, x: Any, src: DType, dst: DType) -> z3.BitVecRef:
        t = self.atoms.term(x)
        trunc = z3.If(t >= 0, z3.ToInt(t), -z3.ToInt(-t))
        return z3.Int2BV(trunc, dst.bits)

    def float_to_float(self, x: Any, src: DType, dst: DType) -> Any:
        return x

    def float_bits(self, x: Any, dtype: DType) -> z3.BitVecRef:
        """This tier has no NaN and no rounding: a value's bits are an uninterpreted function of the real."""
        bv = z3.BitVecSort(dtype.bits, self.ctx)
        return bitvec(self.uf(f"real_bits_{dtype.value}", [self.real], bv)(self.atoms.term(x)))

    def bits_float(self, bits: z3.BitVecRef, dtype: DType) -> Any:
        bv = z3.BitVecSort(dtype.bits, self.ctx)
        return self.atoms.atom(arith(self.uf(f"real_from_bits_{dtype.value}", [bv], self.real)(bits)))

    def range_facts(self, t: z3.ExprRef, dtype: DType, lo: float, hi: float) -> None:
        if not dtype.is_float:
            super().range_facts(t, dtype, lo, hi)
            return
        if math.isfinite(lo):
            self.facts.append(t >= self.atoms.value(Fraction(lo)))
        if math.isfinite(hi):
            self.facts.append(t <= self.atoms.value(Fraction(hi)))

    def dot_step(self, kind: str, acc: Any, x: Any, y: Any, dtype: DType) -> Any:
        """Rounding ignored (flushing included): ``acc + x * y``."""
        return self.float_call("add", [acc, self.float_call("mul", [x, y], dtype)], dtype)

    def dot_term(self, kind: str, x: Any, y: Any, dtype: DType) -> Any:
        """Rounding ignored: the product, summed like a ``sum``'s body."""
        return self.float_call("mul", [x, y], dtype)

    def reduce_symbolic(self, kind: str, body: Any, dtype: DType, binders: Sequence[z3.ArithRef],
                        extents: Sequence[int | z3.ArithRef]) -> Any:
        if kind in R.DOT_KINDS:  # rounding ignored: a sum of the products
            kind = "sum"
        if kind != "sum" or not dtype.is_float:
            return super().reduce_symbolic(kind, body, dtype, binders, extents)
        names = frozenset(b.decl().name() for b in binders)
        groups: dict[tuple, Poly] = {}
        for mono, coef in body.terms.items():
            dep = tuple((a, p) for a, p in mono if self.scan.depends(self.atoms.atoms[a], names))
            ind = tuple((a, p) for a, p in mono if (a, p) not in dep)
            groups[dep] = groups.get(dep, Poly({})) + Poly({ind: coef})
        out = Poly({})
        count: Poly | None = None
        for dep, coef in sorted(groups.items()):
            if not dep:
                if count is None:
                    count = Poly.const(1)
                    for e in extents:
                        count = count * (Poly.const(e) if isinstance(e, int) else self.atoms.atom(arith(z3.ToReal(e))))
                out = out + self.atoms.product([coef, count])
                continue
            inner = self.atoms.mono_term(dep)
            assert inner is not None
            s = self.named_reduction("sum", inner, binders, extents, self.real)
            self.axioms.add("sum-linearity")
            out = out + self.atoms.product([coef, self.atoms.atom(arith(s))])
        return out


# --------------------------------------------------------------------------------------
# abstract floating point

_WIDENS_EXACTLY = {
    (DType.f16, DType.f32), (DType.f16, DType.f64), (DType.f32, DType.f64), (DType.bf16, DType.f32),
    (DType.bf16, DType.f64),
}
"""Float conversions that represent every value of the source exactly (so narrowing back is
the identity)."""


class AbstractFPSemantics(Semantics):
    """Opaque floats: operations are uninterpreted functions normalized only by IEEE-valid laws."""

    name = "abstract-fp"
    models_rounding = True

    def __init__(self, ctx: z3.Context) -> None:
        super().__init__(ctx)
        self._sorts: dict[DType, z3.SortRef] = {}
        self.literals: dict[int, tuple[DType, float]] = {}
        self._lits_by_sort: dict[DType, dict[str, z3.ExprRef]] = {}
        # applications by AST id (each entry holds its term, so ids stay unique): operation, arguments
        self._apps: dict[int, tuple[z3.ExprRef, str, tuple[z3.ExprRef, ...]]] = {}

    def float_sort(self, dtype: DType) -> z3.SortRef:
        s = self._sorts.get(dtype)
        if s is None:
            s = z3.DeclareSort(f"fp_{dtype.value}", self.ctx)
            self._sorts[dtype] = s
        return s

    def float_lit(self, x: float, dtype: DType) -> z3.ExprRef:
        key = _bits_key(x, dtype)
        table = self._lits_by_sort.setdefault(dtype, {})
        found = table.get(key)
        if found is not None:
            return found
        c = z3.Const(f"lit_{dtype.value}_{key}", self.float_sort(dtype))
        table[key] = c
        self.literals[c.get_id()] = (dtype, x)
        return c

    def literal_value(self, x: Any, dtype: DType) -> float | None:
        found = self.literals.get(x.get_id()) if isinstance(x, z3.ExprRef) else None
        return None if found is None or found[0] is not dtype else found[1]

    def literal_facts(self) -> list[z3.BoolRef]:
        """Distinct literals are distinct values (different bit patterns)."""
        out: list[z3.BoolRef] = []
        for table in self._lits_by_sort.values():
            if len(table) > 1:
                out.append(z3.Distinct(*table.values()))
        return out

    def _is_lit(self, t: z3.ExprRef, value: float, negative: bool | None = None) -> bool:
        found = self.literals.get(t.get_id())
        if found is None or found[1] != value:
            return False
        return negative is None or (math.copysign(1.0, found[1]) < 0) == negative

    def _app(self, fn: str, dtype: DType, args: tuple[z3.ExprRef, ...], rng: z3.SortRef | None = None) -> z3.ExprRef:
        sort = self.float_sort(dtype)
        f = self.uf(f"f{fn}_{dtype.value}", [sort] * len(args), rng if rng is not None else sort)
        out = f(*args)
        self._apps[out.get_id()] = (out, fn, args)
        return out

    def _commuted(self, fn: str, a: z3.ExprRef, b: z3.ExprRef) -> tuple[z3.ExprRef, z3.ExprRef]:
        if self.scan.order_key(a) > self.scan.order_key(b):
            self.axioms.add(f"{fn}-commutative")
            return b, a
        return a, b

    def float_call(self, fn: str, args: list[Any], dtype: DType) -> Any:
        a = args[0]
        b: Any = args[1] if len(args) > 1 else None
        if fn == "mul":
            if self._is_lit(b, 1.0):
                self.axioms.add("mul-one")
                return a
            if self._is_lit(a, 1.0):
                self.axioms.update(("mul-one", "mul-commutative"))
                return b
            return self._app("mul", dtype, self._commuted("mul", a, b))
        if fn == "add":
            if self._is_lit(b, 0.0, negative=True):
                self.axioms.add("add-negative-zero")
                return a
            if self._is_lit(a, 0.0, negative=True):
                self.axioms.update(("add-negative-zero", "add-commutative"))
                return b
            return self._app("add", dtype, self._commuted("add", a, b))
        if fn == "sub" and self._is_lit(b, 0.0, negative=False):
            self.axioms.add("sub-zero")
            return a
        if fn == "div" and self._is_lit(b, 1.0):
            self.axioms.add("div-one")
            return a
        if fn == "neg":
            inner = self._apps.get(a.get_id())
            if inner is not None and inner[1] == "neg":
                self.axioms.add("neg-involution")
                return inner[2][0]
        if fn in ("max", "min"):
            inner = self._apps.get(a.get_id())
            if inner is not None and inner[1] == fn and z3.eq(inner[2][1], b):
                self.axioms.add(f"{fn}-idempotent")
                return a
        boolean = z3.BoolSort(self.ctx)
        if fn in ("gt", "ge"):
            self.axioms.add(f"{fn}-as-swapped")
            return self._app("lt" if fn == "gt" else "le", dtype, (b, a), boolean)
        if fn in ("lt", "le"):
            return self._app(fn, dtype, (a, b), boolean)
        if fn in ("eq", "ne"):
            x, y = self._commuted("eq", a, b)
            eq = self._app("eq", dtype, (x, y), boolean)
            if fn == "ne":
                self.axioms.add("ne-as-not-eq")
                return z3.Not(eq)
            return eq
        if fn in ("isnan", "isinf"):
            return self._app(fn, dtype, (a,), boolean)
        return self._app(fn, dtype, tuple(args))

    def float_nonzero(self, x: Any, dtype: DType) -> z3.BoolRef:
        return boolean(z3.Not(self._app("eq", dtype, (x, self.float_lit(0.0, dtype)), z3.BoolSort(self.ctx))))

    def int_to_float(self, x: z3.BitVecRef, src: DType, dst: DType) -> Any:
        f = self.uf(f"cast_{src.value}_{dst.value}", [self.sort(src)], self.float_sort(dst))
        return f(x)

    def index_to_float(self, i: z3.ArithRef, dst: DType) -> Any:
        if z3.is_int_value(i):
            return self.lit(int_value(i), dst)
        f = self.uf(f"cast_index_{dst.value}", [self.int_sort], self.float_sort(dst))
        return f(i)

    def float_to_float(self, x: Any, src: DType, dst: DType) -> Any:
        inner = self._apps.get(x.get_id())
        if inner is not None and inner[1] == f"cast_{dst.value}" and (dst, src) in _WIDENS_EXACTLY:
            self.axioms.add("widen-narrow")
            return inner[2][0]
        f = self.uf(f"cast_{src.value}_{dst.value}", [self.float_sort(src)], self.float_sort(dst))
        out = f(x)
        self._apps[out.get_id()] = (out, f"cast_{src.value}", (x,))
        return out

    def float_bits(self, x: Any, dtype: DType) -> z3.BitVecRef:
        """A float's bits: a function of its value except on NaN. The sort holds one NaN and its laws
        (``x * 1 = x``, ...) are equalities up to that, while IEEE arithmetic may change a NaN's bits
        (a signaling NaN times 1 comes out quiet), so a NaN's bits are fresh: no proof rests on them."""
        bv = z3.BitVecSort(dtype.bits, self.ctx)
        known = self.uf(f"fbits_{dtype.value}", [self.float_sort(dtype)], bv)(x)
        nan = boolean(self._app("isnan", dtype, (x,), z3.BoolSort(self.ctx)))
        return bitvec(ite(nan, self.fresh_bits(dtype), bitvec(known)))

    def bits_float(self, bits: z3.BitVecRef, dtype: DType) -> Any:
        bv = z3.BitVecSort(dtype.bits, self.ctx)
        return self.uf(f"ffrom_bits_{dtype.value}", [bv], self.float_sort(dtype))(bits)


ENCODERS: dict[str, type[Semantics]] = {"real": RealSemantics, "abstract-fp": AbstractFPSemantics}

SUPPORTED_PRIMITIVES: dict[str, frozenset[str]] = {
    "float": R.primitives_for("float"),
    "int": R.primitives_for("int"),
    "bool": R.primitives_for("bool") | {"min", "max"},
}
"""The rule primitives every encoder gives a meaning, by the element kind of their operands (of a
``select``: its branches'). ``cuvil ops`` checks each op's rule against this table."""
