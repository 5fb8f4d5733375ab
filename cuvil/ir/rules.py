"""The scalar compute-rule language every op's meaning is written in.

An op's rule gives its output element at a symbolic output index ``i``:
an elementwise map (``f(a[bcast(i)], b[bcast(i)])``), an index remap
(``a[g(i)]`` with an out-of-bounds value), or a reduction over named axes.
Three readers interpret the same rule: the numpy interpreter, the z3 encoder
and the LLVM lowering. The primitive scalar functions in :data:`PRIMITIVES`
are all a reader has to implement; everything else (gelu, sigmoid, ...) is
composed from them here, once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.types import TensorType, Typed

# --------------------------------------------------------------------------------------
# index expressions


def _ix_operator(kind: str, swap: bool = False) -> Callable[[Ix, IxLike], Ix]:
    """An arithmetic operator of :class:`Ix` (``swap``: the reflected form, the other operand first)."""
    return lambda self, o: self._bin(kind, o, swap)


@dataclass(frozen=True)
class Ix:
    """An integer index expression: a variable, a (possibly symbolic) literal, arithmetic,
    or ``dyn(e)``: the value of a scalar expression used as an index (gather)."""

    kind: str  # var | lit | add | sub | mul | floordiv | mod | min | max | dyn
    args: tuple[Any, ...]

    @staticmethod
    def var(name: str) -> Ix:
        return Ix("var", (name,))

    @staticmethod
    def lit(v: Dim) -> Ix:
        return Ix("lit", (v.simplify() if isinstance(v, Sym) else int(v),))

    @staticmethod
    def dyn(e: Expr) -> Ix:
        return Ix("dyn", (e,))

    @property
    def is_lit(self) -> bool:
        return self.kind == "lit"

    @property
    def value(self) -> Dim:
        return self.args[0]

    def _bin(self, kind: str, other: IxLike, swap: bool = False) -> Ix:
        a, b = self, as_ix(other)
        if swap:
            a, b = b, a
        if a.is_lit and b.is_lit:
            x, y = a.value, b.value
            folded = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                      "floordiv": lambda: x // y, "mod": lambda: x % y}
            if kind in folded and (kind not in ("floordiv", "mod") or (isinstance(x, int) and isinstance(y, int))):
                return Ix.lit(folded[kind]())
        if kind in ("add", "sub") and b.is_lit and b.value == 0:
            return a
        if kind == "add" and a.is_lit and a.value == 0:
            return b
        if kind == "mul":
            if (b.is_lit and b.value == 1):
                return a
            if a.is_lit and a.value == 1:
                return b
            if (b.is_lit and b.value == 0) or (a.is_lit and a.value == 0):
                return Ix.lit(0)
        if kind == "floordiv" and b.is_lit and b.value == 1:
            return a
        return Ix(kind, (a, b))

    __add__ = _ix_operator("add")
    __radd__ = _ix_operator("add", swap=True)
    __sub__ = _ix_operator("sub")
    __rsub__ = _ix_operator("sub", swap=True)
    __mul__ = _ix_operator("mul")
    __rmul__ = _ix_operator("mul", swap=True)
    __floordiv__ = _ix_operator("floordiv")
    __mod__ = _ix_operator("mod")

    def __str__(self) -> str:
        if self.kind == "var":
            return self.args[0]
        if self.kind == "lit":
            return str(self.args[0])
        if self.kind == "dyn":
            return f"dyn({self.args[0]})"
        sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}.get(self.kind)
        if sym:
            return f"({self.args[0]} {sym} {self.args[1]})"
        return f"{self.kind}({self.args[0]}, {self.args[1]})"


IxLike = Ix | int | Sym


def as_ix(v: IxLike) -> Ix:
    return v if isinstance(v, Ix) else Ix.lit(v)


def ix_min(a: IxLike, b: IxLike) -> Ix:
    return Ix("min", (as_ix(a), as_ix(b)))


def ix_max(a: IxLike, b: IxLike) -> Ix:
    return Ix("max", (as_ix(a), as_ix(b)))


# --------------------------------------------------------------------------------------
# scalar expressions


def _expr_operator(fn: str, swap: bool = False) -> Callable[[Expr, ExprLike], Expr]:
    """An operator of :class:`Expr`: the primitive ``fn`` on both operands (``swap``: the reflected form)."""
    if swap:
        return lambda self, o: call(fn, o, self)
    return lambda self, o: call(fn, self, o)


@dataclass(frozen=True, eq=False)
class Expr:
    """A scalar expression of a known dtype, evaluated at an index point."""

    dtype: DType

    # arithmetic sugar: literals take the other operand's dtype
    __add__ = _expr_operator("add")
    __radd__ = _expr_operator("add", swap=True)
    __sub__ = _expr_operator("sub")
    __rsub__ = _expr_operator("sub", swap=True)
    __mul__ = _expr_operator("mul")
    __rmul__ = _expr_operator("mul", swap=True)
    __truediv__ = _expr_operator("div")
    __rtruediv__ = _expr_operator("div", swap=True)
    __lt__ = _expr_operator("lt")
    __le__ = _expr_operator("le")
    __gt__ = _expr_operator("gt")
    __ge__ = _expr_operator("ge")

    def __neg__(self) -> Expr:
        return call("neg", self)


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """``operand[index]``; when ``oob`` is set, out-of-range indices read ``oob`` instead."""

    operand: int
    index: tuple[Ix, ...]
    oob: float | int | bool | None = None


@dataclass(frozen=True, eq=False)
class Lit(Expr):
    value: float | int | bool


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A primitive scalar function applied to arguments (see :data:`PRIMITIVES`)."""

    fn: str
    args: tuple[Expr, ...]
    attrs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    """The value of an index expression, as a scalar (iota, one-hot, trilu masks)."""

    ix: Ix


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """``kind`` (sum | prod | max | min | dot | dot_ftz) of ``body`` over fresh index variables ``axes``.
    A ``dot`` kind's body is the product ``x * y`` of its two factors (:func:`dot_factors`): readers
    take the factors, not the rounded product (see :data:`REDUCTIONS`)."""

    kind: str
    axes: tuple[tuple[str, Dim], ...]
    body: Expr


ExprLike = Expr | float | int | bool


@dataclass(frozen=True)
class Primitive:
    name: str
    arity: int
    result: str  # "same" | "bool" | "cast" | "cond" (select: dtype of the branches)
    kinds: str  # which element kinds it accepts: "num" | "float" | "int" | "bool" | "any"
    doc: str


PRIMITIVES: dict[str, Primitive] = {}


def _prim(name: str, arity: int, result: str, kinds: str, doc: str) -> None:
    PRIMITIVES[name] = Primitive(name, arity, result, kinds, doc)


for _n, _d in [("add", "a + b"), ("sub", "a - b"), ("mul", "a * b"), ("div", "a / b (ints: truncating)"),
               ("min", "min(a, b), NaN-propagating"), ("max", "max(a, b), NaN-propagating"),
               ("pow", "a ** b"), ("fmod", "C fmod (sign of a)"), ("mod", "floored modulo (sign of b)")]:
    _prim(_n, 2, "same", "num", _d)
for _n in ["neg", "abs"]:
    _prim(_n, 1, "same", "num", _n)
for _n in ["exp", "log", "sqrt", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
           "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "round_even"]:
    _prim(_n, 1, "same", "float", _n)
for _n in ["eq", "ne", "lt", "le", "gt", "ge"]:
    _prim(_n, 2, "bool", "any", f"comparison {_n}")
for _n in ["and", "or", "xor"]:
    _prim(_n, 2, "same", "bool", f"logical {_n}")
_prim("not", 1, "same", "bool", "logical not")
_prim("isnan", 1, "bool", "float", "x is NaN")
_prim("isinf", 1, "bool", "float", "x is +-inf")
for _n in ["bit_and", "bit_or", "bit_xor", "shl", "shr"]:
    _prim(_n, 2, "same", "int", f"bitwise {_n}")
_prim("bit_not", 1, "same", "int", "bitwise not")
_prim("select", 3, "cond", "any", "c ? a : b")
_prim("cast", 1, "cast", "any", "convert to attr `to` (float->int truncates, ->bool is != 0)")
_prim("bitcast", 1, "cast", "any", "reinterpret the bits as attr `to` (same width; a bool is the byte 0 or 1)")

_KIND_ACCEPTS = {"float": ("num", "float", "any"), "int": ("num", "int", "any"), "bool": ("bool", "any")}


def primitives_for(kind: str) -> frozenset[str]:
    """The primitives defined on elements of ``kind`` (``float``, ``int`` or ``bool``): what a reader of
    the rules must implement for that kind (numpy also gives some arithmetic a bool meaning)."""
    return frozenset(n for n, p in PRIMITIVES.items() if p.kinds in _KIND_ACCEPTS[kind])


def lit(value: float | int | bool, dtype: DType) -> Lit:
    if dtype is DType.bool:
        return Lit(dtype, bool(value))
    if dtype.is_int:
        return Lit(dtype, int(value))
    return Lit(dtype, float(value))


def _coerce(args: Sequence[ExprLike]) -> list[Expr]:
    dtype = next((a.dtype for a in args if isinstance(a, Expr)), None)
    if dtype is None:
        raise TypeError("a scalar call needs at least one typed argument")
    return [a if isinstance(a, Expr) else lit(a, dtype) for a in args]


def call(fn: str, *args: ExprLike, **attrs: Any) -> Expr:
    """Apply a primitive; checks arity and operand dtypes so a malformed rule fails at definition."""
    prim = PRIMITIVES[fn]
    if len(args) != prim.arity:
        raise TypeError(f"{fn} takes {prim.arity} arguments, got {len(args)}")
    if fn == "select":
        c = args[0]
        rest = _coerce(args[1:])
        if not isinstance(c, Expr) or c.dtype is not DType.bool:
            raise TypeError("select condition must be a bool expression")
        if rest[0].dtype is not rest[1].dtype:
            raise TypeError(f"select branches differ: {rest[0].dtype} vs {rest[1].dtype}")
        return Call(rest[0].dtype, fn, (c, rest[0], rest[1]))
    xs = _coerce(args)
    if prim.result != "cast" and any(x.dtype is not xs[0].dtype for x in xs):
        raise TypeError(f"{fn}: operand dtypes differ: {[str(x.dtype) for x in xs]}")
    if fn == "bitcast":
        refused = bitcast_refusal(xs[0].dtype, attrs["to"])
        if refused is not None:
            raise TypeError(f"bitcast: {refused}")
    if prim.result == "bool":
        dtype = DType.bool
    elif prim.result == "cast":
        dtype = attrs["to"]
    else:
        dtype = xs[0].dtype
    return Call(dtype, fn, tuple(xs), tuple(sorted(attrs.items())))


# --------------------------------------------------------------------------------------
# reductions: written once here, read by every reader


def lowest(dtype: DType) -> float | int | bool:
    """The bottom of ``dtype``'s order: -inf for floats, False for bool, the minimum integer."""
    if dtype.is_float:
        return -math.inf
    if dtype is DType.bool:
        return False
    return int(dtype.min_value)


def highest(dtype: DType) -> float | int | bool:
    """The top of ``dtype``'s order: +inf for floats, True for bool, the maximum integer."""
    if dtype.is_float:
        return math.inf
    if dtype is DType.bool:
        return True
    return int(dtype.max_value)


@dataclass(frozen=True)
class Reduction:
    """A reduction kind: the primitive that folds two partial results (on bool: ``bool_combine``)
    and what a reduction over nothing gives. A ``Reduce`` is a left fold in the row-major order
    of its axes, each step rounded to the dtype (``sequential_reduce`` in the interpreter)."""

    kind: str
    combine: str
    bool_combine: str
    doc: str

    def identity(self, dtype: DType) -> float | int | bool:
        """The result over an empty range: 0 / 1 for sum / prod (False / True on bool), the bottom
        of the order for max and the top for min."""
        if self.kind == "sum":
            return False if dtype is DType.bool else 0
        if self.kind == "prod":
            return True if dtype is DType.bool else 1
        return lowest(dtype) if self.kind == "max" else highest(dtype)


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction("sum", "add", "or", "sum of the terms"),
    "prod": Reduction("prod", "mul", "and", "product of the terms"),
    "max": Reduction("max", "max", "or", "largest term (NaN-propagating)"),
    "min": Reduction("min", "min", "and", "smallest term (NaN-propagating)"),
    "dot": Reduction("dot", "add", "or", "sum of products, each multiplied exactly and added to the running "
                     "sum with one rounding (a fused multiply-add per term)"),
    "dot_ftz": Reduction("dot_ftz", "add", "or", "a dot whose subnormal factors are read as zero and whose "
                         "subnormal running sums are flushed to zero of their sign, at every step (the x86 "
                         "vdpbf16ps rule)"),
}

DOT_FTZ_BELOW = 2.0 ** -126
"""``dot_ftz`` reads a factor, and leaves a running sum, of magnitude under this (float32's smallest normal) as
zero of its sign."""

DOT_KINDS = ("dot", "dot_ftz")
"""Reductions whose body is a product read as its two factors: each step is ``acc = fma(x, y, acc)`` in
the reduction's dtype (float32), folded from -0.0 like a float sum."""


def reduction_identity(kind: str, dtype: DType) -> float | int | bool:
    return REDUCTIONS[kind].identity(dtype)


_fresh = itertools.count()


def reduce(kind: str, extents: Sequence[Dim], body: Callable[..., Expr]) -> Expr:
    """``kind`` over fresh index variables, one per extent; ``body`` receives them as :class:`Ix`."""
    if kind not in REDUCTIONS:
        raise TypeError(f"unknown reduction {kind!r} (expected one of {', '.join(REDUCTIONS)})")
    names = tuple(f"r{next(_fresh)}" for _ in extents)
    expr = body(*[Ix.var(n) for n in names])
    return Reduce(expr.dtype, kind, tuple(zip(names, extents, strict=True)), expr)


def dot(kind: str, extents: Sequence[Dim], factors: Callable[..., tuple[Expr, Expr]]) -> Expr:
    """A :data:`DOT_KINDS` reduction of the products ``x * y`` that ``factors`` gives (float32 factors)."""
    if kind not in DOT_KINDS:
        raise TypeError(f"unknown dot reduction {kind!r} (expected one of {', '.join(DOT_KINDS)})")

    def body(*ix: Ix) -> Expr:
        x, y = factors(*ix)
        if x.dtype is not DType.f32 or y.dtype is not DType.f32:
            raise TypeError(f"a {kind} multiplies float32 factors, not {x.dtype} and {y.dtype}")
        return call("mul", x, y)

    return reduce(kind, extents, body)


def dot_factors(e: Reduce) -> tuple[Expr, Expr]:
    """The two factors of a :data:`DOT_KINDS` reduction's body."""
    body = e.body
    if e.kind not in DOT_KINDS or not isinstance(body, Call) or body.fn != "mul" or len(body.args) != 2:
        raise TypeError(f"not a dot reduction: {e.kind} of {type(body).__name__}")
    return body.args[0], body.args[1]


# --------------------------------------------------------------------------------------
# composite scalar functions: written once here, in terms of the primitives


def select(c: Expr, a: ExprLike, b: ExprLike) -> Expr:
    return call("select", c, a, b)


def cast(x: Expr, to: DType) -> Expr:
    return x if x.dtype is to else call("cast", x, to=to)


def bitcast_refusal(src: DType, to: DType) -> str | None:
    """Why ``src`` bits cannot be read as ``to`` (None when they can): the widths must be equal, a
    bool is one byte (0 or 1) and may be read as an 8-bit integer but no byte may be read as a bool
    (any other value would be no bool), and narrow storage types have no bit pattern of their own
    in a register."""
    if src is to:
        return None
    if src.is_narrow or to.is_narrow:
        return f"{src} -> {to}: narrow storage types (under 8 bits of int, 16 of float) are not bit-cast"
    if to is DType.bool:
        return f"{src} -> bool: a byte other than 0 or 1 is no bool"
    if src is DType.bool and to not in (DType.i8, DType.u8):
        return f"bool -> {to}: a bool is one byte, read only as i8 or u8"
    if src.bits != to.bits:
        return f"{src} -> {to}: {src.bits} bits cannot be read as {to.bits}"
    return None


def bitcast(x: Expr, to: DType) -> Expr:
    """``x``'s bit pattern read as ``to`` (see :func:`bitcast_refusal` for the pairs allowed)."""
    return x if x.dtype is to else call("bitcast", x, to=to)


HALF_DTYPES = (DType.f16, DType.bf16)


def widen(x: Expr) -> Expr:
    """A half-precision value as f32: products and sums of halves accumulate in f32 and are
    rounded once at the end (what ONNX's reference and every fast GEMM compute)."""
    return cast(x, DType.f32) if x.dtype in HALF_DTYPES else x


def dim_scalar(n: Dim, dtype: DType) -> Expr:
    """A (possibly symbolic) extent as a scalar of ``dtype``."""
    if isinstance(n, int):
        return lit(n, dtype)
    return cast(IndexValue(DType.i64, Ix.lit(n)), dtype)


def wide_sum(extents: Sequence[Dim], body: Callable[..., Expr]) -> Expr:
    """The sum of ``body`` over fresh index variables with half-precision terms widened to f32:
    a sum of halves accumulates in f32 (as PyTorch, ONNX Runtime and every GEMM do), so the
    caller rounds it once; other types sum in their own type."""
    return reduce("sum", extents, lambda *ks: widen(body(*ks)))


def wide_mean(extents: Sequence[Dim], body: Callable[..., Expr], dtype: DType) -> Expr:
    """The mean of ``body`` as a ``dtype`` value: :func:`wide_sum` divided by the count in the
    accumulator's type, rounded to ``dtype`` once (a half sum rounded before the division
    overflows long before the mean does)."""
    n: Dim = 1
    for d in extents:
        n = n * d
    total = wide_sum(extents, body)
    return cast(total / dim_scalar(n, total.dtype), dtype)


def smax(a: ExprLike, b: ExprLike) -> Expr:
    return call("max", a, b)


def smin(a: ExprLike, b: ExprLike) -> Expr:
    return call("min", a, b)


def exp(x: Expr) -> Expr:
    return call("exp", x)


def log(x: Expr) -> Expr:
    return call("log", x)


def sqrt(x: Expr) -> Expr:
    return call("sqrt", x)


def tanh(x: Expr) -> Expr:
    return call("tanh", x)


def erf(x: Expr) -> Expr:
    return call("erf", x)


def sigmoid(x: Expr) -> Expr:
    return 1.0 / (1.0 + exp(-x))


def relu(x: Expr) -> Expr:
    return smax(x, 0)


def gelu(x: Expr, approximate: str = "none") -> Expr:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def expm1(x: Expr) -> Expr:
    """exp(x) - 1 without cancellation near 0 (Kahan: rescale by x / log(exp(x)))."""
    u = exp(x)
    um1 = u - 1.0
    accurate = um1 * x / log(u)
    return select(call("eq", u, 1.0), x, select(call("eq", um1, -1.0), -1.0,
                                                 select(call("isinf", u), u, accurate)))


def log1p(x: Expr) -> Expr:
    """log(1 + x) without losing small x (Goldberg: rescale by x / ((1 + x) - 1))."""
    w = 1.0 + x
    accurate = log(w) * x / (w - 1.0)
    return select(call("eq", w, 1.0), x, select(call("isinf", w), w, accurate))


def reciprocal(x: Expr) -> Expr:
    return 1.0 / x


def rsqrt(x: Expr) -> Expr:
    return 1.0 / sqrt(x)


def sign(x: Expr) -> Expr:
    """1, -1 or x itself for zeros (keeping -0.0) and NaN."""
    if not x.dtype.is_signed:
        return select(x > 0, 1, x)
    return select(x > 0, 1, select(x < 0, -1, x))


def clip(x: Expr, lo: ExprLike | None, hi: ExprLike | None) -> Expr:
    """min(max(x, lo), hi): NaN propagates and lo > hi gives hi, as ONNX Clip specifies."""
    y = x if lo is None else smax(x, lo)
    return y if hi is None else smin(y, hi)


def leaky_relu(x: Expr, alpha: float = 0.01) -> Expr:
    return select(x < 0, x * alpha, x)


def thresholded_relu(x: Expr, alpha: float = 1.0) -> Expr:
    return select(x > alpha, x, 0)


def elu(x: Expr, alpha: float = 1.0) -> Expr:
    return select(x < 0, expm1(x) * alpha, x)


def selu(x: Expr, alpha: float, gamma: float) -> Expr:
    return select(x > 0, x, expm1(x) * alpha) * gamma


def celu(x: Expr, alpha: float = 1.0) -> Expr:
    return smax(x, 0) + smin(expm1(x / alpha) * alpha, 0)


def softplus(x: Expr) -> Expr:
    """log(1 + exp(x)) in the form that neither overflows for large x nor loses small results."""
    return smax(x, 0) + log1p(exp(-call("abs", x)))


def softsign(x: Expr) -> Expr:
    return x / (1.0 + call("abs", x))


def silu(x: Expr) -> Expr:
    return x * sigmoid(x)


def mish(x: Expr) -> Expr:
    return x * tanh(softplus(x))


def hardsigmoid(x: Expr, alpha: float = 0.2, beta: float = 0.5) -> Expr:
    return smax(smin(x * alpha + beta, 1), 0)


def hardswish(x: Expr) -> Expr:
    return x * hardsigmoid(x, 1.0 / 6.0, 0.5)


# --------------------------------------------------------------------------------------
# rule context


@dataclass(frozen=True)
class TensorRef(Typed):
    """An operand as a rule sees it: its type and an ``at`` that builds loads."""

    index: int
    type: TensorType

    def at(self, *idx: IxLike, oob: float | int | bool | None = None) -> Load:
        if len(idx) != self.rank:
            raise TypeError(f"operand {self.index} has rank {self.rank}, indexed with {len(idx)}")
        return Load(self.dtype, self.index, tuple(as_ix(i) for i in idx), oob)


@dataclass(frozen=True)
class RuleCtx:
    """What a rule is given: output index variables, operand refs, attributes, result type."""

    out: tuple[Ix, ...]
    inputs: tuple[TensorRef, ...]
    attrs: Mapping[str, Any]
    out_type: TensorType

    @staticmethod
    def make(in_types: Sequence[TensorType], attrs: Mapping[str, Any], out_type: TensorType) -> RuleCtx:
        out = tuple(Ix.var(f"i{k}") for k in range(out_type.rank))
        ins = tuple(TensorRef(k, t) for k, t in enumerate(in_types))
        return RuleCtx(out, ins, attrs, out_type)


def broadcast_index(out: Sequence[Ix], in_shape: Sequence[Dim], out_shape: Sequence[Dim]) -> tuple[Ix, ...]:
    """numpy broadcasting as an index map: right-aligned, size-1 dims read index 0."""
    offset = len(out_shape) - len(in_shape)
    idx: list[Ix] = []
    for k, d in enumerate(in_shape):
        o = out_shape[k + offset]
        idx.append(Ix.lit(0) if (d == 1 and o != 1) else out[k + offset])
    return tuple(idx)


def elementwise(fn: Callable[..., Expr]) -> Callable[[RuleCtx], Expr]:
    """A rule ``out[i] = fn(x0[bcast(i)], x1[bcast(i)], ..., **attrs)``."""

    def rule(c: RuleCtx) -> Expr:
        loads = [t.at(*broadcast_index(c.out, t.shape, c.out_type.shape)) for t in c.inputs]
        return fn(*loads, **c.attrs)

    rule.elementwise_fn = fn  # type: ignore[attr-defined]
    return rule
