"""Every law the encoders use, with a numeric check against the interpreter's primitives.

An unsound axiom proves anything, so each one here is stated once and checked on the
reference interpreter's scalar functions (``cuvil.ir.numpy_prims.NUMPY_PRIMITIVES``) at every
float dtype, over edge values (signed zeros, infinities, NaN, subnormals, extremes) and
random ones. ``verify.scalar_semantics`` records which of them a proof used; the certificate
lists them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES as P


@dataclass(frozen=True)
class Axiom:
    name: str
    statement: str
    check: Callable[[], list[str]]
    """Returns the violations found (empty when the law holds on every sample)."""


FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64))


def samples(dt: np.dtype, n: int = 48, seed: int = 0) -> np.ndarray:
    """Edge values of ``dt`` plus random ones across magnitudes, both signs."""
    info = ml_dtypes.finfo(dt) if dt == np.dtype(ml_dtypes.bfloat16) else np.finfo(dt)
    edge = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, np.inf, -np.inf, np.nan, float(info.max), -float(info.max),
            float(info.tiny), -float(info.tiny), float(info.smallest_subnormal), float(info.eps), 1 + float(info.eps)]
    rng = np.random.default_rng(seed)
    rand = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    return np.concatenate([np.array(edge, dtype=np.float64), rand]).astype(dt)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equality with all NaNs identified (the abstract sort's equality)."""
    with np.errstate(all="ignore"):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    equal = (a64 == b64) & (np.signbit(a64) == np.signbit(b64))
    return both_nan | equal


def _pairs(dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    s = samples(dt)
    a, b = zip(*itertools.product(s, s), strict=True)
    return np.array(a, dtype=dt), np.array(b, dtype=dt)


def _binary_law(name: str, lhs: Callable[[np.ndarray, np.ndarray], np.ndarray],
                rhs: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[], list[str]]:
    def check() -> list[str]:
        bad: list[str] = []
        with np.errstate(all="ignore"):
            for dt in FLOAT_DTYPES:
                a, b = _pairs(dt)
                x, y = np.asarray(lhs(a, b)), np.asarray(rhs(a, b))
                ok = same_bits(x, y) if x.dtype.kind == "f" or x.dtype == dt else (x == y)
                if not np.all(ok):
                    k = int(np.argmin(ok))
                    bad.append(f"{name} fails at {dt}: a={a[k]!r} b={b[k]!r}: {x[k]!r} vs {y[k]!r}")
        return bad

    return check


def _widen_narrow() -> list[str]:
    bad: list[str] = []
    pairs = [(np.float16, np.float32), (np.float16, np.float64), (np.float32, np.float64),
             (ml_dtypes.bfloat16, np.float32), (ml_dtypes.bfloat16, np.float64)]
    for narrow, wide in pairs:
        bits = np.arange(1 << 16, dtype=np.uint16) if np.dtype(narrow).itemsize == 2 else None
        x = bits.view(narrow) if bits is not None else samples(np.dtype(narrow), n=4096)
        with np.errstate(all="ignore"):
            back = x.astype(wide).astype(narrow)
        if not np.all(same_bits(x, back)):
            bad.append(f"widen-narrow fails for {np.dtype(narrow)} via {np.dtype(wide)}")
    return bad


ABSTRACT_FP: dict[str, Axiom] = {a.name: a for a in [
    Axiom("add-commutative", "a + b = b + a", _binary_law("add-commutative", P["add"], lambda a, b: P["add"](b, a))),
    Axiom("mul-commutative", "a * b = b * a", _binary_law("mul-commutative", P["mul"], lambda a, b: P["mul"](b, a))),
    Axiom("eq-commutative", "(a == b) = (b == a)",
          _binary_law("eq-commutative", P["eq"], lambda a, b: P["eq"](b, a))),
    Axiom("mul-one", "x * 1 = x", _binary_law("mul-one", lambda a, b: P["mul"](a, np.ones_like(a)), lambda a, b: a)),
    Axiom("div-one", "x / 1 = x", _binary_law("div-one", lambda a, b: P["div"](a, np.ones_like(a)), lambda a, b: a)),
    Axiom("sub-zero", "x - (+0.0) = x",
          _binary_law("sub-zero", lambda a, b: P["sub"](a, np.zeros_like(a)), lambda a, b: a)),
    Axiom("add-negative-zero", "x + (-0.0) = x",
          _binary_law("add-negative-zero", lambda a, b: P["add"](a, -np.zeros_like(a)), lambda a, b: a)),
    Axiom("neg-involution", "-(-x) = x", _binary_law("neg-involution", lambda a, b: P["neg"](P["neg"](a)),
                                                     lambda a, b: a)),
    Axiom("max-idempotent", "max(max(x, y), y) = max(x, y)",
          _binary_law("max-idempotent", lambda a, b: P["max"](P["max"](a, b), b), P["max"])),
    Axiom("min-idempotent", "min(min(x, y), y) = min(x, y)",
          _binary_law("min-idempotent", lambda a, b: P["min"](P["min"](a, b), b), P["min"])),
    Axiom("gt-as-swapped", "(a > b) = (b < a)", _binary_law("gt-as-swapped", P["gt"], lambda a, b: P["lt"](b, a))),
    Axiom("ge-as-swapped", "(a >= b) = (b <= a)", _binary_law("ge-as-swapped", P["ge"], lambda a, b: P["le"](b, a))),
    Axiom("ne-as-not-eq", "(a != b) = not (a == b)",
          _binary_law("ne-as-not-eq", P["ne"], lambda a, b: P["not"](P["eq"](a, b)))),
    Axiom("widen-narrow", "cast(cast(x, wider), narrow) = x for exact widenings", _widen_narrow),
]}
"""Laws of the abstract float sort: each holds bit for bit (NaNs identified) in IEEE arithmetic.
Associativity and distributivity are deliberately absent: they do not hold."""


def _ulps(x: np.ndarray, y: np.ndarray, ref: np.ndarray, n: float) -> np.ndarray:
    return np.abs(x - y) <= n * np.spacing(np.abs(ref)) + np.finfo(np.float64).tiny


def _real_samples(nonnegative: bool = False) -> np.ndarray:
    s = samples(np.dtype(np.float64), n=400, seed=1)
    s = s[np.isfinite(s)]
    s = s[np.abs(s) < 1e150]
    return np.abs(s) if nonnegative else s


def _sqrt_square() -> list[str]:
    y = _real_samples(nonnegative=True)
    r = P["sqrt"](y)
    ok = _ulps(r * r, y, y, 4)
    return [] if np.all(ok) else [f"sqrt-square fails at y={y[np.argmin(ok)]!r}"]


def _sqrt_nonnegative() -> list[str]:
    y = _real_samples(nonnegative=True)
    return [] if np.all(P["sqrt"](y) >= 0) else ["sqrt-nonnegative fails"]


def _sqrt_positive() -> list[str]:
    y = _real_samples(nonnegative=True)
    y = y[y > 0]
    return [] if np.all(P["sqrt"](y) > 0) else ["sqrt-positive fails"]


def _exp_positive() -> list[str]:
    x = np.linspace(-700.0, 700.0, 20001)
    return [] if np.all(P["exp"](x) > 0) else ["exp-positive fails"]


def _real_division() -> list[str]:
    a, b = _real_samples(), _real_samples()[::-1]
    keep = (b != 0) & (np.abs(a) < 1e100) & (np.abs(b) > 1e-100)
    a, b = a[keep], b[keep]
    q = P["div"](a, b)
    ok = _ulps(a * P["div"](np.ones_like(b), b), q, q, 4)
    return [] if np.all(ok) else ["real-division fails"]


def _sum_linearity() -> list[str]:
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((50, 64)), rng.standard_normal((50, 64))
    c = rng.standard_normal((50, 1))
    lhs = np.sum(c * (a + b), axis=1)
    rhs = c[:, 0] * np.sum(a, axis=1) + c[:, 0] * np.sum(b, axis=1)
    ok = np.abs(lhs - rhs) <= 1e-12 * np.sum(np.abs(c * (np.abs(a) + np.abs(b))), axis=1)
    return [] if np.all(ok) else ["sum-linearity fails"]


REAL: dict[str, Axiom] = {a.name: a for a in [
    Axiom("sqrt-square", "y >= 0 -> sqrt(y) * sqrt(y) = y", _sqrt_square),
    Axiom("sqrt-nonnegative", "y >= 0 -> sqrt(y) >= 0", _sqrt_nonnegative),
    Axiom("sqrt-positive", "y > 0 -> sqrt(y) > 0", _sqrt_positive),
    Axiom("exp-positive", "exp(x) > 0 (over the reals; floats underflow below -745)", _exp_positive),
    Axiom("real-division", "a / b = a * (1 / b)", _real_division),
    Axiom("sum-linearity", "sum_k (c * (a_k + b_k)) = c * sum_k a_k + c * sum_k b_k (c independent of k)",
          _sum_linearity),
]}
"""Facts of the real encoder; checked in float64 within a few ulps (the real tier ignores rounding)."""

def _bit_words(bits: int) -> np.ndarray:
    """Every 16-bit pattern, or edge and random patterns of a wider word (NaN payloads, zeros, extremes)."""
    if bits == 16:
        return np.arange(1 << 16, dtype=np.uint16)
    ints = np.dtype(f"u{bits // 8}")
    top = (1 << bits) - 1
    edge = [0, 1, top, top >> 1, 1 << (bits - 1), (top >> 1) ^ (top >> 10), 0x7F800001, 0x7FC00005]
    rng = np.random.default_rng(3)
    rand = rng.integers(0, 1 << 62, 4096, dtype=np.uint64).astype(ints)
    return np.concatenate([np.array(edge, dtype=np.uint64).astype(ints), rand])


_BIT_TYPES = {16: (np.int16, np.uint16, np.float16, ml_dtypes.bfloat16), 32: (np.int32, np.uint32, np.float32),
              64: (np.int64, np.uint64, np.float64)}


def _bitcast_round_trip() -> list[str]:
    bad: list[str] = []
    for bits, types in _BIT_TYPES.items():
        words = _bit_words(bits)
        for a, mid, b in itertools.product(types, repeat=3):
            x = words.view(a)
            if not np.array_equal(x.view(mid).view(b).view(words.dtype), x.view(b).view(words.dtype)):
                bad.append(f"bitcast-round-trip fails for {np.dtype(a)} via {np.dtype(mid)} to {np.dtype(b)}")
    return bad


def _bitcast_literal() -> list[str]:
    """As the encoders fold a literal: a float stored as a literal of its type has the float's own bits,
    and a word read as a float and stored as a literal again has the word's bits (NaNs identified)."""
    from cuvil.ir.dtypes import DType
    from cuvil.ir.numpy_prims import literal

    bad: list[str] = []
    for dt in FLOAT_DTYPES:
        with np.errstate(all="ignore"):
            x = samples(dt, n=256)
        cir = DType.from_numpy(dt)
        ints = np.dtype(f"u{dt.itemsize}")
        for v in x:
            stored = literal(float(v.astype(np.float64)), cir)
            if not np.isnan(v) and stored.view(ints) != np.array(v).view(ints):
                bad.append(f"bitcast-literal fails at {dt}: {v!r}")
                break
            if not same_bits(np.array(v), stored):
                bad.append(f"bitcast-literal fails at {dt}: {v!r} read back")
                break
    return bad


BITS: dict[str, Axiom] = {a.name: a for a in [
    Axiom("bitcast-round-trip", "bitcast(bitcast(x, a), b) = bitcast(x, b): reading bits as one type, then as "
          "another, reads them as the second", _bitcast_round_trip),
    Axiom("bitcast-literal", "the bits of a known non-NaN float are its IEEE encoding, and bits read as a float "
          "are the float they encode", _bitcast_literal),
]}
"""Laws of bit reinterpretation, used by both encoders: they hold by definition (a bitcast is a numpy
view, an LLVM bitcast), checked over every 16-bit pattern and sampled wider ones."""

ALL: dict[str, Axiom] = {**ABSTRACT_FP, **REAL, **BITS}


# --------------------------------------------------------------------------------------
# proofs of the abstract float laws in IEEE 754 arithmetic (z3's floating-point theory)

IEEE_FORMATS = {"f16": (5, 11), "bf16": (8, 8), "f32": (8, 24), "f64": (11, 53)}
"""(exponent bits, significand bits) of the float dtypes. The interpreter's f16 and bf16 arithmetic
computes in f32 and rounds once, which equals the format's own correctly rounded operation for
+, -, *, / (f32 carries more than twice their precision plus two bits)."""

AXIOM_TIME_LIMIT_MS = 60_000


def _ieee_claim(name: str, e: int, s: int, ctx: Any) -> Any:
    """The law ``name`` for all values of the IEEE format (e, s), as the interpreter computes each
    side; SMT-LIB's single NaN is the abstract sort's 'any NaN equals any NaN'."""
    import z3

    sort = z3.FPSort(e, s, ctx)
    a, b = z3.FP("a", sort, ctx), z3.FP("b", sort, ctx)
    rne = z3.RNE(ctx)

    def lit(v: float) -> Any:
        return z3.FPVal(v, None, sort, ctx)

    def maximum(x: Any, y: Any) -> Any:  # numpy: NaN propagates; otherwise x > y ? x : y (ties give y)
        nan = z3.Or(z3.fpIsNaN(x, ctx=ctx), z3.fpIsNaN(y, ctx=ctx))
        return z3.If(nan, z3.fpNaN(sort), z3.If(z3.fpGT(x, y, ctx=ctx), x, y))

    def minimum(x: Any, y: Any) -> Any:
        nan = z3.Or(z3.fpIsNaN(x, ctx=ctx), z3.fpIsNaN(y, ctx=ctx))
        return z3.If(nan, z3.fpNaN(sort), z3.If(z3.fpLT(x, y, ctx=ctx), x, y))

    add = lambda x, y: z3.fpAdd(rne, x, y, ctx=ctx)
    mul = lambda x, y: z3.fpMul(rne, x, y, ctx=ctx)
    claims = {
        "add-commutative": lambda: add(a, b) == add(b, a),
        "mul-commutative": lambda: mul(a, b) == mul(b, a),
        "eq-commutative": lambda: z3.fpEQ(a, b, ctx=ctx) == z3.fpEQ(b, a, ctx=ctx),
        "mul-one": lambda: mul(a, lit(1.0)) == a,
        "div-one": lambda: z3.fpDiv(rne, a, lit(1.0), ctx=ctx) == a,
        "sub-zero": lambda: z3.fpSub(rne, a, lit(0.0), ctx=ctx) == a,
        "add-negative-zero": lambda: add(a, z3.fpMinusZero(sort)) == a,
        "neg-involution": lambda: z3.fpNeg(z3.fpNeg(a, ctx=ctx), ctx=ctx) == a,
        "max-idempotent": lambda: maximum(maximum(a, b), b) == maximum(a, b),
        "min-idempotent": lambda: minimum(minimum(a, b), b) == minimum(a, b),
        "gt-as-swapped": lambda: z3.fpGT(a, b, ctx=ctx) == z3.fpLT(b, a, ctx=ctx),
        "ge-as-swapped": lambda: z3.fpGEQ(a, b, ctx=ctx) == z3.fpLEQ(b, a, ctx=ctx),
    }
    if name == "widen-narrow":
        wide = z3.FPSort(11, 53, ctx) if (e, s) != (11, 53) else None
        if wide is None:
            return None
        back = z3.fpFPToFP(rne, z3.fpFPToFP(rne, a, wide, ctx=ctx), sort, ctx=ctx)
        return back == a
    make = claims.get(name)
    return None if make is None else make()


@functools.cache
def axiom_status(name: str) -> dict[str, str]:
    """How an axiom is established: ``proved`` (every IEEE float format, by z3's floating-point
    theory, each side as the interpreter computes it) or ``assumed`` (with the reason and the
    numeric check it passed)."""
    import z3

    axiom = ALL.get(name)
    if axiom is None:
        return {"status": "assumed", "how": "not a known axiom of the encoders"}
    if name in BITS:
        return {"status": "proved", "statement": axiom.statement,
                "how": "by definition: a bitcast reads the same bits as another type (a numpy view, an LLVM bitcast)"}
    if name == "ne-as-not-eq":
        return {"status": "proved", "statement": axiom.statement,
                "how": "by definition: IEEE 754's compareQuietNotEqual (numpy's !=) is the negation of =="}
    if name == "real-division":
        ctx = z3.Context()
        x, y = z3.Real("a", ctx), z3.Real("b", ctx)
        solver = z3.Solver(ctx=ctx)
        solver.add(y != 0, x / y != x * (1 / y))
        if solver.check() == z3.unsat:
            return {"status": "proved", "statement": axiom.statement, "how": "z3 real arithmetic (b != 0)"}
    if name in REAL:
        return {"status": "assumed", "statement": axiom.statement,
                "how": "a fact of real analysis about an uninterpreted function; checked numerically in float64"}
    proved: list[str] = []
    for dt, (e, s) in IEEE_FORMATS.items():
        ctx = z3.Context()
        claim = _ieee_claim(name, e, s, ctx)
        if claim is None:
            continue
        solver = z3.Solver(ctx=ctx)
        solver.set("timeout", AXIOM_TIME_LIMIT_MS)
        solver.add(z3.Not(claim))
        if solver.check() != z3.unsat:
            return {"status": "assumed", "statement": axiom.statement,
                    "how": f"not proved for {dt} within the time limit; checked numerically"}
        proved.append(dt)
    return {"status": "proved", "statement": axiom.statement,
            "how": "z3 floating-point theory, all values of " + ", ".join(proved)}
