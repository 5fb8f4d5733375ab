"""Randomized identity testing: a reader of the compute rules over the prime field Z_p.

Float tensors become residues mod p = 2^31 - 1 (constants map exactly: a float is a dyadic
rational, and 2 is invertible mod p); + - * / are field operations, so two cones that are
different polynomials (or rational functions) of their inputs differ at a random point with
probability >= 1 - d/p (Schwartz-Zippel). Transcendental and other non-field primitives are
consistent random oracles (the same function and arguments give the same value); order
comparisons, min and max compare the residues' centered representatives. Integers and
booleans keep their exact semantics.

``Trace`` records which non-field primitives an evaluation used: only cones that used none
are a homomorphic image of real arithmetic, which matters when a disagreement with a
``real`` proof is judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES, bitcast
from cuvil.ir.opdef import contraction_ops, get_op
from cuvil.ir.ops.control import branch, iterate
from cuvil.ir.region import Region
from cuvil.ir.rulewalk import fold_ix, mentioned_vars, numpy_ix
from cuvil.ir.specialize import bind_attr
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, walk

P = 2_147_483_647
_HALF = P // 2
CHUNK_ELEMENTS = 1 << 22
"""Output points times reduction extent evaluated at once."""

# Contractions (``OpDef.contraction``) are linear in each float operand: over Z_p they run as
# float64 products of 16-bit limbs through the op's fast path (im2col and BLAS), exact while a
# reduction sums fewer than 2^20 terms.
_LIMB = 1 << 16
_LIMB_TERMS = 1 << 20
BILINEAR_SPEEDUP = 16
"""How much cheaper an element operation of a limb product is than one of the rule reader
(for the work estimate only)."""

_ORDER_OPS = ("min", "max", "abs", "lt", "le", "gt", "ge")


@dataclass
class Trace:
    """Which primitives outside field arithmetic an evaluation used."""

    oracles: set[str] = field(default_factory=set)
    order: bool = False

    @property
    def homomorphic(self) -> bool:
        return not self.oracles and not self.order


def _pow2(k: np.ndarray) -> np.ndarray:
    """2^k mod p for integer k of either sign (2 has order 31 since p = 2^31 - 1)."""
    return np.left_shift(np.int64(1), np.mod(k, 31).astype(np.int64))


def to_residues(data: np.ndarray) -> np.ndarray:
    """Exact images of float values in Z_p (non-finite values map to fixed oracle points)."""
    x = np.asarray(data).astype(np.float64)
    finite = np.isfinite(x)
    safe = np.where(finite, x, 0.0)
    m, e = np.frexp(safe)
    mant = np.round(np.ldexp(m, 53)).astype(np.int64)  # exact: |m| < 1 has 53 significant bits
    res = np.mod(np.mod(mant, P) * _pow2(e.astype(np.int64) - 53), P)
    special = np.where(np.isnan(x), 1_000_003, np.where(x > 0, 1_000_033, 1_000_037))
    return np.where(finite, res, special).astype(np.int64)


def centered(a: np.ndarray) -> np.ndarray:
    return np.where(a > _HALF, a - P, a)


def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.multiply(a.astype(np.int64, copy=False), b.astype(np.int64, copy=False))
    return np.mod(out, P, out=out)


def _inverse(a: np.ndarray) -> np.ndarray:
    out = np.ones_like(a, dtype=np.int64)
    base = np.mod(a.astype(np.int64), P)
    e = P - 2
    while e:
        if e & 1:
            out = _mulmod(out, base)
        base = _mulmod(base, base)
        e >>= 1
    return out


def work(fn: Function, dims: Mapping[str, int]) -> int:
    """Element operations a Z_p evaluation of ``fn`` costs (output points times reduction extents)."""
    return sum(_work(v, dims) for v in fn.values() if not (v.is_param or v.is_const))


def _work(v: Value, dims: Mapping[str, int]) -> int:
    if v.op == "loop":  # its body's work once per iteration
        trips = evaluate_dim(v.attr("trips")[0], dims)
        return trips * sum(_work(u, dims) for u in v.attr("body").ops())
    if v.op == "cond":  # the branch taken: at most the larger one
        return max(sum(_work(u, dims) for u in v.attr(name).ops()) for name in ("then_body", "else_body"))
    rule = get_op(v.op).make_rule([o.type for o in v.operands], v.attr_dict, v.type)
    extent = _reduce_extent(rule, dims)
    cost = int(np.prod([evaluate_dim(d, dims) for d in v.type.shape], dtype=np.int64)) * extent
    return -(-cost // BILINEAR_SPEEDUP) if _limb_product_applies(v, extent) else cost


def _limb_product_applies(v: Value, extent: int) -> bool:
    """Not for a contraction into another type than its operands' (``bf16_matmul``, ``bf16_conv``): its fast path
    reads them through float32 and sums in float32, which no limb product survives."""
    return (v.op in contraction_ops() and get_op(v.op).numpy is not None and v.dtype.is_float
            and all(o.dtype is v.dtype for o in v.operands[:2]) and extent < _LIMB_TERMS)


class ModularEvaluator:
    """Evaluates CIR functions over Z_p, reading each op's rule (fused ops included)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.trace = Trace()

    # oracles ----------------------------------------------------------------------------
    def _key(self, name: str) -> int:
        h = 1469598103934665603
        for ch in f"{self.seed}:{name}".encode():
            h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return h

    def oracle(self, name: str, *args: np.ndarray) -> np.ndarray:
        self.trace.oracles.add(name)
        with np.errstate(over="ignore"):
            x = np.full(np.broadcast_shapes(*(a.shape for a in args)), self._key(name), dtype=np.uint64)
            for a in args:
                x = x ^ a.astype(np.int64).astype(np.uint64)
                x = x * np.uint64(0x9E3779B97F4A7C15)
                x = x ^ (x >> np.uint64(29))
                x = x * np.uint64(0xBF58476D1CE4E5B9)
                x = x ^ (x >> np.uint64(32))
        return np.mod(x, np.uint64(P)).astype(np.int64)

    # functions --------------------------------------------------------------------------
    def run(self, fn: Function, constants: Mapping[str, np.ndarray], inputs: Sequence[np.ndarray],
            dims: Mapping[str, int], preset: Mapping[Value, np.ndarray] | None = None,
            free_constants: Mapping[str, np.ndarray] | None = None) -> dict[Value, np.ndarray]:
        """Every value of ``fn``; float inputs are residues, others plain arrays. ``preset`` fixes
        values (a folded constant takes its expression's value); ``free_constants`` gives
        constants, by content hash, random values instead of their data."""
        memo: dict[Value, np.ndarray] = dict(zip(fn.params, inputs, strict=True))
        memo.update(preset or {})
        free = free_constants or {}
        for v in fn.values():
            if v in memo:
                continue
            if v.is_const:
                data = np.asarray(constants[v.const_hash])
                if v.const_hash in free:
                    memo[v] = free[v.const_hash]
                else:
                    memo[v] = to_residues(data) if v.dtype.is_float else data
                continue
            memo[v] = self.op(v, [memo[o] for o in v.operands], dims)
        return memo

    def op(self, v: Value, arrays: list[np.ndarray], dims: Mapping[str, int]) -> np.ndarray:
        if v.op == "loop":
            return self._loop(v, arrays, dims)
        if v.op == "cond":  # the branch the condition (its residue or plain value, nonzero) picks
            return branch(arrays, v.attr("then_body"), v.attr("else_body"),
                          lambda r, args: self._region(r, args, dims))[int(v.attr("output"))]
        rule = get_op(v.op).make_rule([o.type for o in v.operands], v.attr_dict, v.type)
        shape = tuple(evaluate_dim(d, dims) for d in v.type.shape)
        if _limb_product_applies(v, _reduce_extent(rule, dims)):
            return self._limb_product(v, arrays, shape, dims)
        total = int(np.prod(shape, dtype=np.int64))
        out_dt = np.int64 if v.dtype.is_float else v.dtype.np
        out = np.empty(total, dtype=out_dt)
        step = max(1, CHUNK_ELEMENTS // max(1, _reduce_extent(rule, dims)))
        for start in range(0, total, step):
            stop = min(total, start + step)
            points = np.unravel_index(np.arange(start, stop, dtype=np.int64), shape) if shape else ()
            chunk = _Chunk(self, arrays, [o.dtype for o in v.operands], list(points), stop - start, dims)
            val = chunk.expr(rule)
            out[start:stop] = np.broadcast_to(val.reshape(val.shape[:1]) if val.ndim else val, (stop - start,))
        return out.reshape(shape)


    def _region(self, body: Region, args: list[np.ndarray], dims: Mapping[str, int]) -> list[np.ndarray]:
        """A region's results with its ops read over Z_p."""
        memo: dict[Value, np.ndarray] = dict(zip(body.params, args, strict=True))
        for u in walk(body.results):
            if u not in memo:
                memo[u] = self.op(u, [memo[o] for o in u.operands], dims)
        return [memo[r] for r in body.results]

    def _loop(self, v: Value, arrays: list[np.ndarray], dims: Mapping[str, int]) -> np.ndarray:
        """The loop's iteration (its one definition) with the body's ops read over Z_p."""
        results = iterate(arrays, v.attr("body"), int(v.attr("carried")), int(v.attr("scanned")),
                          evaluate_dim(v.attr("trips")[0], dims), bool(v.attr("reverse")),
                          lambda body, args: self._region(body, args, dims), int(v.attr("stop")))
        return results[int(v.attr("output"))]

    @staticmethod
    def _limb_product(v: Value, arrays: list[np.ndarray], shape: tuple[int, ...], dims: Mapping[str, int]
                      ) -> np.ndarray:
        """``v`` over Z_p for residues ``a = a1 * 2^16 + a0``: four float64 products of limbs (each
        an integer below 2^52, so exact), recombined with 2^32 = 2 (mod p)."""
        opdef = get_op(v.op)
        impl = opdef.numpy
        assert impl is not None  # _limb_product_applies checked it
        attrs = {k: bind_attr(a, dims) for k, a in v.attr_dict.items()}
        out_type = TensorType(DType.f64, shape)
        (a1, a0), (b1, b0) = (np.divmod(np.asarray(x, dtype=np.int64), _LIMB) for x in arrays[:2])

        def prod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            r = np.asarray(impl([x.astype(np.float64), y.astype(np.float64)], out_type, **attrs))
            return np.mod(r.astype(np.int64), P)

        hi = prod(a1, b1)
        mid = np.mod(prod(a1, b0) + prod(a0, b1), P)
        lo = prod(a0, b0)
        return np.mod(2 * hi + _LIMB * mid + lo, P).reshape(shape)


def _reduce_extent(e: R.Expr, dims: Mapping[str, int], binders: Mapping[str, int] | None = None) -> int:
    """Elements per output point of the largest array evaluating ``e`` builds: a reduction's
    array spans its own axes and the enclosing reduction axes its body reads (a mean inside a
    variance does not read the variance's axis, so it is not recomputed per element)."""
    binders = binders or {}
    if isinstance(e, R.Reduce):
        inner = {**binders, **{name: max(1, evaluate_dim(d, dims)) for name, d in e.axes}}
        reads = mentioned_vars(e.body)
        here = int(np.prod([n for name, n in inner.items() if name in reads], dtype=np.int64))
        return max(here, _reduce_extent(e.body, dims, inner))
    if isinstance(e, R.Call):
        return max((_reduce_extent(a, dims, binders) for a in e.args), default=1)
    if isinstance(e, R.Load):
        return max((_reduce_extent(i.args[0], dims, binders) for i in e.index if i.kind == "dyn"), default=1)
    return 1


class _Chunk:
    """One block of output points; reduction axes are appended as trailing array axes."""

    def __init__(self, ev: ModularEvaluator, arrays: list[np.ndarray], dtypes: list[DType],
                 points: list[np.ndarray], count: int, dims: Mapping[str, int]) -> None:
        self.ev = ev
        self.arrays = arrays
        self.dtypes = dtypes
        self.dims = dims
        self.depth = 1
        self.env: dict[str, np.ndarray] = {f"i{k}": p for k, p in enumerate(points)}
        self.count = count

    def lift(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim == self.depth:
            return a
        if a.ndim == 0:
            return a.reshape((1,) * self.depth)
        return a.reshape(a.shape + (1,) * (self.depth - a.ndim))

    def dim(self, d: object) -> int:
        return evaluate_dim(d, self.dims)  # type: ignore[arg-type]

    def ix(self, e: R.Ix) -> np.ndarray:
        return fold_ix(e, var=lambda n: self.lift(self.env[n]),
                       lit=lambda d: self.lift(np.array(self.dim(d), dtype=np.int64)),
                       dyn=lambda x: self.lift(np.asarray(self.expr(x)).astype(np.int64)), op=numpy_ix)

    def expr(self, e: R.Expr) -> np.ndarray:
        if isinstance(e, R.Load):
            return self._load(e)
        if isinstance(e, R.Lit):
            return self.lift(self._lit(e.value, e.dtype))
        if isinstance(e, R.IndexValue):
            return self.ix(e.ix)
        if isinstance(e, R.Call):
            return self.lift(self._call(e))
        if isinstance(e, R.Reduce):
            return self._reduce(e)
        raise TypeError(f"unknown rule node {type(e).__name__}")

    def _lit(self, value: float | int | bool, dtype: DType) -> np.ndarray:
        if dtype.is_float:
            return to_residues(np.array(value, dtype=dtype.np))
        return np.array(value, dtype=dtype.np)

    def _load(self, e: R.Load) -> np.ndarray:
        arr = self.arrays[e.operand]
        idx = [self.ix(i) for i in e.index]
        if not idx:
            return self.lift(arr)
        shape = arr.shape
        inb = np.ones((1,) * self.depth, dtype=bool)
        for k, i in enumerate(idx):
            inb = inb & (i >= 0) & (i < shape[k])
        if arr.size == 0:
            fill = self._lit(e.oob if e.oob is not None else 0, e.dtype)
            return self.lift(np.broadcast_to(fill, np.broadcast_shapes(*(i.shape for i in idx))))
        if e.oob is None:  # out-of-range reads wrap, consistently on both sides
            return arr[tuple(np.mod(i, max(shape[k], 1)) for k, i in enumerate(idx))]
        clipped = tuple(np.clip(i, 0, shape[k] - 1) for k, i in enumerate(idx))
        return np.where(inb, arr[clipped], self._lit(e.oob, e.dtype))

    def _call(self, e: R.Call) -> np.ndarray:
        args = [self.expr(a) for a in e.args]
        fn = e.fn
        if fn == "select":
            return np.where(args[0], args[1], args[2])
        if fn == "cast":
            return self._cast(args[0], e.args[0].dtype, e.dtype)
        if fn == "bitcast":
            return self._bitcast(args[0], e.args[0].dtype, e.dtype)
        dt = e.args[0].dtype
        if not dt.is_float:
            with np.errstate(all="ignore"):
                return np.asarray(NUMPY_PRIMITIVES[fn](*args)).astype(e.dtype.np, copy=False)
        return self._float(fn, args)

    def _float(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        a = args[0].astype(np.int64, copy=False)
        b = args[1].astype(np.int64, copy=False) if len(args) > 1 else a
        if fn in _ORDER_OPS:
            self.ev.trace.order = True
        if fn == "add":
            return np.mod(a + b, P)
        if fn == "sub":
            return np.mod(a - b, P)
        if fn == "mul":
            return _mulmod(a, b)
        if fn == "div":
            return _mulmod(a, _inverse(b))
        if fn == "neg":
            return np.mod(-a, P)
        if fn == "abs":
            return np.where(centered(a) < 0, np.mod(-a, P), a)
        if fn in ("min", "max"):
            ca, cb = centered(a), centered(b)
            return np.where((ca <= cb) == (fn == "min"), a, b)
        cmp = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
               "ge": np.greater_equal}
        if fn in cmp:
            if fn in ("eq", "ne"):
                return cmp[fn](a, b)
            return cmp[fn](centered(a), centered(b))
        if fn in ("isnan", "isinf"):
            return np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=bool)
        if fn == "pow":
            cb = centered(b)
            if np.all((cb >= 0) & (cb <= 8)) and cb.size and np.all(cb == cb.reshape(-1)[0]):
                out = np.ones_like(a)
                for _ in range(int(cb.reshape(-1)[0])):
                    out = _mulmod(out, a)
                return out
        return self.ev.oracle(fn, *args)

    def _cast(self, x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
        if src.is_float and dst.is_float:
            return x
        if src.is_float:
            if dst is DType.bool:
                return x != 0
            self.ev.trace.oracles.add("float-to-int")
            return centered(x).astype(dst.np)
        if dst.is_float:
            if src is DType.bool:
                return x.astype(np.int64)
            return np.mod(x.astype(np.int64), P)
        if dst is DType.bool:
            return x != 0
        return x.astype(dst.np)

    def _bitcast(self, x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
        """Integer and bool bits are read exactly; a float's bits have no image in Z_p (a residue is a
        value, not a bit pattern), so bits read from or as a float are a random oracle. A proof that
        reads bits through a chain of bitcasts (``bitcast-round-trip``) is therefore not checked here."""
        if src is dst:
            return x
        if not (src.is_float or dst.is_float):
            return bitcast(np.asarray(x).astype(src.np, copy=False), dst)
        out = self.ev.oracle(f"bitcast_{src.value}_{dst.value}", np.asarray(x).astype(np.int64))
        return out if dst.is_float else out.astype(dst.np)

    def _reduce(self, e: R.Reduce) -> np.ndarray:
        base = self.depth
        extents = [self.dim(d) for _, d in e.axes]
        saved = dict(self.env)
        self.depth = base + len(extents)
        for k, ((name, _), n) in enumerate(zip(e.axes, extents, strict=True)):
            shape = [1] * self.depth
            shape[base + k] = n
            self.env[name] = np.arange(n, dtype=np.int64).reshape(shape)
        body = self.lift(self.expr(e.body))
        full = np.broadcast_to(body, body.shape[:base] + tuple(extents))
        self.env = saved
        self.depth = base
        axes = tuple(range(base, base + len(extents)))
        dt = e.dtype
        if 0 in extents:
            return self.lift(self._identity(e.kind, dt, full.shape[:base]))
        if not dt.is_float:
            op = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[e.kind]
            with np.errstate(all="ignore"):
                return op(full, axis=axes).astype(dt.np)
        if e.kind == "sum" or e.kind in R.DOT_KINDS:  # a dot: the sum of its body, the products
            return np.mod(np.sum(full, axis=axes, dtype=np.int64), P)
        if e.kind in ("max", "min"):
            self.ev.trace.order = True
            c = centered(full)
            r = np.max(c, axis=axes) if e.kind == "max" else np.min(c, axis=axes)
            return np.mod(r, P)
        flat = full.reshape((*full.shape[:base], -1))
        out = flat[..., 0]
        for j in range(1, flat.shape[-1]):
            out = _mulmod(out, flat[..., j])
        return out

    def _identity(self, kind: str, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
        value = R.reduction_identity(kind, dt)
        if dt.is_float:
            return np.broadcast_to(to_residues(np.array(float(value))), shape)
        return np.full(shape, value, dtype=dt.np)


def random_residues(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, P, size=shape, dtype=np.int64)
