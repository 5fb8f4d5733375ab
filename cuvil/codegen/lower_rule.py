"""An op's compute rule as an LLVM loop nest: the generic (unscheduled) lowering.

The kernel loops over every output index, evaluates the rule there and stores the
element. ``Reduce`` becomes an inner loop nest with an accumulator. Two cheap
scheduling decisions keep it from being naive: a reduction is emitted at the
outermost loop where all its free index variables are bound (so softmax's max and
sum run once per row, not once per element), and output loops whose variables no
reduction depends on go innermost. Repeated subexpressions (inlined producers of
fused ops) are computed once per loop body, recognized up to renaming of reduction
variables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen import abi, vmath
from cuvil.codegen.coalesce import coalesce
from cuvil.codegen.dims import DimValues
from cuvil.codegen.llvm_types import F32, I1, I32, I64, PTR, declare
from cuvil.codegen.loops import const, for_range, if_else, imin, row_major_strides, start_block
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val, compute_type, identity, literal, storage_type
from cuvil.errors import CodegenError
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.rulewalk import FreeVars, fold_ix, walk_exprs
from cuvil.ir.symbolic import Dim, dim_bounds
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

Token = tuple  # ("o", k) for output variable k; ("b", depth, k) for axis k of a reduction at that depth


@dataclass(frozen=True)
class Buffer:
    """An operand or result as a kernel sees it: its pointer, dtype and shape (ints, or symbolic dims
    in a kernel that reads them at run time)."""

    ptr: Val
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def numel(self) -> Dim:
        n: Dim = 1
        for d in self.shape:
            n = n * d
        return n


def static_shape(t: TensorType, where: str) -> tuple[int, ...]:
    if not t.is_static:
        raise CodegenError(f"{where} has the symbolic type {t}; native code needs static shapes",
                           location=where,
                           hint="pass example_inputs (or input_shapes) to compile() to specialize symbolic dims")
    return tuple(int(d) for d in t.shape)


def _static_int(d: object, where: str) -> int:
    if isinstance(d, int):
        return d
    raise CodegenError(f"{where}: the rule uses the symbolic extent {d}", location=where,
                       hint="specialize symbolic dims before compiling")


def _symbolic_strides(shape: Sequence[Dim]) -> list[Dim]:
    """Row-major strides of a shape whose dims may be symbolic."""
    strides: list[Dim] = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


# --------------------------------------------------------------------------------------
# structural keys (common subexpressions up to renaming of reduction variables)


class _Keys:
    """Interned structural keys and free-token sets of rule nodes at a position (env, depth)."""

    def __init__(self) -> None:
        self._intern: dict[object, int] = {}
        self._memo: dict[tuple, tuple[int, frozenset]] = {}
        self._free = FreeVars()

    def raw_free(self, e: R.Expr) -> frozenset[str]:
        """Free index-variable names of a node (the names reductions bind are excluded)."""
        return self._free(e)

    def key(self, e: R.Expr, env: dict[str, Token], depth: int) -> tuple[int, frozenset]:
        """(interned key, free tokens) of ``e`` where its free variables mean ``env``'s tokens."""
        free = sorted(self.raw_free(e))
        memo_key = (id(e), depth, tuple(env.get(n) for n in free))
        hit = self._memo.get(memo_key)
        if hit is not None:
            return hit
        tokens: set = set()
        raw = self._build(e, env, depth, tokens)
        out = (self._intern.setdefault(raw, len(self._intern)), frozenset(tokens))
        self._memo[memo_key] = out
        return out

    def _ix(self, ix: R.Ix, env: dict[str, Token], depth: int, tokens: set) -> object:
        def var(name: str) -> object:
            tok = env.get(name)
            if tok is None:
                raise CodegenError(f"index variable {name} is not bound", hint="a bug in the op's rule")
            tokens.add(tok)
            return ("v", tok)

        def dyn(e: R.Expr) -> object:
            k, t = self.key(e, env, depth)
            tokens.update(t)
            return ("d", k)

        return fold_ix(ix, var=var, lit=lambda d: ("l", d), dyn=dyn, op=lambda kind, a, b: (kind, a, b))

    def _build(self, e: R.Expr, env: dict[str, Token], depth: int, tokens: set) -> object:
        if isinstance(e, R.Load):
            return ("L", e.operand, e.dtype, _lit_key(e.oob), tuple(self._ix(i, env, depth, tokens) for i in e.index))
        if isinstance(e, R.Lit):
            return ("C", e.dtype, _lit_key(e.value))
        if isinstance(e, R.IndexValue):
            return ("I", e.dtype, self._ix(e.ix, env, depth, tokens))
        if isinstance(e, R.Call):
            keys = []
            for a in e.args:
                k, t = self.key(a, env, depth)
                tokens.update(t)
                keys.append(k)
            return ("F", e.fn, e.dtype, e.attrs, tuple(keys))
        if isinstance(e, R.Reduce):
            inner = dict(env)
            own = set()
            for k, (name, _) in enumerate(e.axes):
                inner[name] = ("b", depth + 1, k)
                own.add(inner[name])
            k, t = self.key(e.body, inner, depth + 1)
            tokens.update(t - own)
            return ("R", e.kind, e.dtype, tuple(str(n) for _, n in e.axes), k)
        raise CodegenError(f"unknown rule node {type(e).__name__}")


def _lit_key(v: object) -> object:
    return (type(v).__name__, repr(v))



# --------------------------------------------------------------------------------------
# the kernel


ERF_BLOCK = 128
"""Elements of a rule kernel's innermost loop that choose float32 erf's form together
(:meth:`RuleKernel._erf_blocks`): a GELU's operand reaches the far polynomial only past |x| = 2.25 sqrt 2,
in few blocks of this length, and the block's operands stay in a buffer on the stack between the passes.
One thread, a GELU over 128x1024: 0.117 ms at 128 against 0.120 at 64 and 0.131 at 512 (N(0, 0.25));
0.129 against 0.128 and 0.157 (N(0, 1))."""


class ErfBlocks:
    """A loop whose body computes float32 erf, run in two passes over a block of at most ``length``
    elements: the first computes the erf operands into a buffer on the stack and notes which of
    ``vmath.ERF_BOUNDS`` some operand reaches (NaN reaches all), the second computes the block from them
    with the cheapest form of erf that every operand lies below (the shorter polynomial below
    ``vmath.ERF_SMALL``, the near one below ``vmath.ERF_SPLIT``), else in full. Every element is the same
    function either way (:func:`cuvil.codegen.vmath.erf_f32`); the near form does half the work."""

    def __init__(self, b: Builder, alloca: Builder, emitter: ScalarEmitter, count: int, length: int, name: str) -> None:
        self.b, self.emitter, self.name = b, emitter, name
        self.reached = [alloca.alloca(I1, name=f"{name}.reach{n}") for n in range(len(vmath.ERF_BOUNDS))]
        self.buffers = [alloca.alloca(ir.ArrayType(F32, length), name=f"{name}.erf{n}") for n in range(count)]

    def run(self, start: Val, stop: Val, operands: Callable[[Val], Sequence[Val]],
            body: Callable[[Val, list[Val]], object]) -> None:
        """``body(i, operands(i))`` for ``start <= i < stop``, ``operands`` giving the erf operands of element
        ``i`` (computed once, in the first pass, and read back for ``body``)."""
        b = self.b
        fabs = declare(b.module, "llvm.fabs.f32", F32, [F32])

        def slots(i: Val) -> list[Val]:
            at = b.sub(i, start)
            return [b.gep(buf, [const(0), at], inbounds=True) for buf in self.buffers]

        def scan(i: Val) -> None:
            for v, slot in zip(operands(i), slots(i), strict=True):
                b.store(v, slot)
                size = b.call(fabs, [v])
                for bound, reached in zip(vmath.ERF_BOUNDS, self.reached, strict=True):
                    beyond = b.fcmp_unordered(">=", size, ir.Constant(F32, bound))  # or NaN
                    b.store(b.or_(b.load(reached, typ=I1), beyond), reached)

        def reread(i: Val) -> None:
            body(i, [b.load(slot, typ=F32) for slot in slots(i)])

        def below(bound: float | None) -> Callable[[], object]:
            def loop(i: Val) -> None:
                self.emitter.erf_below = bound
                try:
                    reread(i)
                finally:
                    self.emitter.erf_below = None

            tag = "full" if bound is None else "small" if bound == vmath.ERF_SMALL else "near"
            return lambda: for_range(b, start, stop, f"{self.name}.{tag}", loop)

        def choose(level: int) -> None:
            """Operands reach none of the bounds before ``level``: the form below that bound, or a test."""
            if level == len(self.reached):
                below(None)()
                return
            if_else(b, b.load(self.reached[level], typ=I1), f"{self.name}.reach{level}",
                    lambda: choose(level + 1), below(vmath.ERF_BOUNDS[level]))

        for reached in self.reached:
            b.store(ir.Constant(I1, 0), reached)
        for_range(b, start, stop, f"{self.name}.scan", scan)
        choose(0)


class RuleKernel:
    """Emits one op as ``i32 name(ptr out, ptr in0, ...)``; returns 0 or ``ERR_INDEX``. With ``dims``
    (the symbols of a function compiled for a whole shape class, in order) the kernel takes one more
    argument, ``ptr dims`` (their ``i64`` values), and its extents, strides and bounds come from them."""

    def __init__(self, module: ir.Module, name: str, rule: R.Expr, in_types: Sequence[TensorType],
                 out_type: TensorType, op: str, dims: Sequence[str] | None = None, *, chunked: bool = False,
                 scalars: Mapping[int, float | int | bool] | None = None) -> None:
        self.op = op
        self.scalars = dict(scalars or {})
        """Operands every element of which holds one known value (:func:`scalar_operands`): a read of one
        that is always in bounds is that value, so LLVM folds what depends on it (a ``pow``'s exponent)."""
        self.rule = rule
        self.out_type = out_type
        self.symbolic = dims is not None
        shape_of: Callable[[TensorType], tuple[Dim, ...]] = \
            (lambda t: tuple(t.shape)) if self.symbolic else (lambda t: static_shape(t, op))
        self.out_shape = shape_of(out_type)
        in_shapes = [shape_of(t) for t in in_types]
        self.chunked = chunked and not self.symbolic
        fnty = ir.FunctionType(I32, [PTR] * (1 + len(in_types) + (1 if self.symbolic else 0))
                               + [I64, I64] * self.chunked)
        self.fn = ir.Function(module, fnty, name=name)
        # Hidden but not internal, and never inlined: the optimizer cannot see which buffers a
        # kernel is called with, so it does not fold weight arrays into immediates (code size
        # and compile time stay proportional to the rule, not to the weights).
        self.fn.linkage = "hidden"  # external linkage, hidden visibility: not exported from the library
        self.fn.attributes.add("noinline")
        self.chunk_axis: int | None = None
        """The output axis a chunked kernel runs from ``lo`` to ``hi`` (its last two arguments); None: the
        whole nest runs whatever they say (no axis could be split without repeating work)."""
        self.chunk_extent = 1
        self.fn.args[0].name = "out"
        self.fn.args[0].add_attribute("noalias")
        for k, a in enumerate(self.fn.args[1:1 + len(in_types)]):
            a.name = f"in{k}"
            a.add_attribute("noalias")
            a.add_attribute("captures(none)")
        self.inputs = [Buffer(a, t.dtype, s) for a, t, s in zip(self.fn.args[1:], in_types, in_shapes, strict=False)]
        self.out = Buffer(self.fn.args[0], out_type.dtype, self.out_shape)

        entry = self.fn.append_basic_block("entry")
        start = self.fn.append_basic_block("start")
        self.alloca_builder = Builder(entry)
        self.b = Builder(start)
        self.s = ScalarEmitter(self.b)
        self.err = self.alloca_builder.alloca(I1, name="err")
        self.alloca_builder.store(ir.Constant(I1, 0), self.err)
        self.dims: DimValues | None = None
        if dims is not None:
            arg = self.fn.args[-1]
            arg.name = "dims"
            self.dims = DimValues(self.alloca_builder, arg, dims)

        self.keys = _Keys()
        self.extents: dict[str, Dim | None] = {f"i{k}": n for k, n in enumerate(self.out_shape)}
        self._collect_extents(rule)
        self.bound: dict[Token, Val] = {}
        self.layers: list[dict[int, Val]] = [{}]

    # -- driver -------------------------------------------------------------------------
    def _dim(self, d: Dim) -> Val | int:
        """An extent as the loop emitter takes it: an int where static, else its run-time value."""
        if isinstance(d, int):
            return d
        if self.dims is None:
            raise CodegenError(f"{self.op}: the symbolic extent {d} in a kernel compiled for static shapes",
                               location=self.op, hint="specialize symbolic dims before compiling")
        return self.dims.value(d)

    def emit(self) -> ir.Function:
        env = {f"i{k}": ("o", k) for k in range(len(self.out_shape))}
        order = self._loop_order(env)
        strides = _symbolic_strides(self.out_shape)
        if self.chunked:
            self.fn.args[-2].name, self.fn.args[-1].name = "lo", "hi"
            self.chunk_axis = self._chunk_axis(order, env)
            if self.chunk_axis is not None:
                self.chunk_extent = int(self.out_shape[self.chunk_axis])
        self._hoist(self.rule, env, 0)

        def level(pos: int) -> None:
            if pos == len(order):
                v = self.lower(self.rule, env, 0)
                flat = self._flat([self.bound[("o", k)] for k in range(len(order))], strides)
                self._store(self.out, flat, v)
                return
            k = order[pos]

            def body(i: Val, known: Callable[[], object] | None = None) -> None:
                with self._layer():
                    self.bound[("o", k)] = i
                    if known is not None:
                        known()
                    self._hoist(self.rule, env, 0)
                    level(pos + 1)
                    del self.bound[("o", k)]

            extent = self.out_shape[k]
            if k == self.chunk_axis:
                for_range(self.b, self.fn.args[-2], self.fn.args[-1], f"i{k}", body)
            elif pos == len(order) - 1 and isinstance(extent, int) and extent > ERF_BLOCK and \
                    (arguments := self.erf_arguments()) is not None:
                self._erf_blocks(k, extent, env, arguments, body)
            else:
                for_range(self.b, 0, self._dim(extent), f"i{k}", body)

        level(0)
        failed = self.b.load(self.err, typ=I1)
        self.b.ret(self.b.select(failed, ir.Constant(I32, abi.ERR_INDEX), ir.Constant(I32, abi.OK)))
        self.alloca_builder.branch(start_block(self.fn))
        return self.fn

    def erf_arguments(self) -> list[R.Expr] | None:
        """The operands of the rule's float32 erf calls, when there are some and neither they nor their
        operands lie inside a reduction (so a loop over the innermost axis computes them alone)."""
        inside: set[int] = set()
        for e in walk_exprs(self.rule):
            if isinstance(e, R.Reduce):
                inside |= {id(x) for x in walk_exprs(e)}
        calls = [e for e in walk_exprs(self.rule)
                 if isinstance(e, R.Call) and e.fn == "erf" and e.dtype == DType.f32]
        if not calls or any(id(c) in inside or any(isinstance(x, R.Reduce) for x in walk_exprs(c)) for c in calls):
            return None
        return [c.args[0] for c in calls]

    def _erf_blocks(self, k: int, extent: int, env: dict[str, Token], arguments: list[R.Expr],
                    body: Callable[[Val, Callable[[], object]], None]) -> None:
        """The innermost loop in blocks of :data:`ERF_BLOCK`, each choosing erf's form (:class:`ErfBlocks`)."""
        b = self.b
        keys = [self.keys.key(a, env, 0)[0] for a in arguments]
        blocks = ErfBlocks(b, self.alloca_builder, self.s, len(arguments), ERF_BLOCK, f"i{k}")

        def operands(i: Val) -> list[Val]:
            with self._layer():
                self.bound[("o", k)] = i
                values = [self.lower(a, env, 0) for a in arguments]
                del self.bound[("o", k)]
            return values

        def block(start: Val) -> None:
            stop: Val = b.add(start, const(ERF_BLOCK)) if extent % ERF_BLOCK == 0 else \
                imin(b, b.add(start, const(ERF_BLOCK)), const(extent))
            blocks.run(start, stop, operands, lambda i, values: body(i, lambda: self._known(keys, values)))

        for_range(b, 0, extent, f"i{k}.blocks", block, step=ERF_BLOCK)

    def _known(self, keys: Sequence[int], values: Sequence[Val]) -> None:
        """Values of subexpressions (by key) computed before the current layer: read, not lowered again."""
        for key, v in zip(keys, values, strict=True):
            self.layers[-1][key] = v

    def _loop_order(self, env: dict[str, Token]) -> list[int]:
        """Output loops the hoistable reductions depend on go outermost."""
        rank = len(self.out_shape)
        used: set[int] = set()
        for red in self._reduces(self.rule, env, 0):
            _, free = self.keys.key(*red)
            if all(t[0] == "o" for t in free):
                used |= {t[1] for t in free}
        if not used or len(used) == rank:
            return list(range(rank))
        return [k for k in range(rank) if k in used] + [k for k in range(rank) if k not in used]

    def _chunk_axis(self, order: list[int], env: dict[str, Token]) -> int | None:
        """The outermost loop with more than one step, when every loop outside it has one and no reduction
        computed outside it (once per chunk, it would be computed again in every chunk) is left: chunks of
        it write disjoint outputs and repeat nothing."""
        level = next((p for p, k in enumerate(order) if int(self.out_shape[k]) > 1), None)
        if level is None:
            return None
        inside = {("o", k) for k in order[level:]}
        for red in self._reduces(self.rule, env, 0):
            _, free = self.keys.key(*red)
            if all(t[0] == "o" for t in free) and not free & inside:
                return None
        return order[level]

    def _reduces(self, e: R.Expr, env: dict[str, Token], depth: int) -> Iterator[tuple[R.Expr, dict, int]]:
        """Every reduction inside ``e`` (post-order) with the env and depth it sits at."""
        seen: set[tuple[int, int]] = set()

        def walk(x: R.Expr, env: dict[str, Token], depth: int) -> Iterator[tuple[R.Expr, dict, int]]:
            if (id(x), depth) in seen:
                return
            seen.add((id(x), depth))
            if isinstance(x, R.Call):
                for a in x.args:
                    yield from walk(a, env, depth)
            elif isinstance(x, R.Load):
                for i in x.index:
                    yield from walk_ix(i, env, depth)
            elif isinstance(x, R.IndexValue):
                yield from walk_ix(x.ix, env, depth)
            elif isinstance(x, R.Reduce):
                inner = dict(env)
                for k, (name, _) in enumerate(x.axes):
                    inner[name] = ("b", depth + 1, k)
                yield from walk(x.body, inner, depth + 1)
                yield (x, env, depth)

        def walk_ix(ix: R.Ix, env: dict[str, Token], depth: int) -> Iterator[tuple[R.Expr, dict, int]]:
            if ix.kind == "dyn":
                yield from walk(ix.args[0], env, depth)
            elif ix.kind not in ("var", "lit"):
                for a in ix.args:
                    yield from walk_ix(a, env, depth)

        yield from walk(e, env, depth)

    def _hoist(self, scope: R.Expr, env: dict[str, Token], depth: int) -> None:
        """Emit every not-yet-computed reduction in ``scope`` whose free variables are all bound."""
        for red, renv, rdepth in self._reduces(scope, env, depth):
            k, free = self.keys.key(red, renv, rdepth)
            if self._cached(k) is None and all(t in self.bound for t in free):
                self.lower(red, renv, rdepth)

    # -- caches -------------------------------------------------------------------------
    def _cached(self, key: int) -> Val | None:
        for layer in reversed(self.layers):
            if key in layer:
                return layer[key]
        return None

    @contextlib.contextmanager
    def _layer(self) -> Iterator[None]:
        """A loop body: values computed inside it are forgotten when it closes."""
        self.layers.append({})
        try:
            yield
        finally:
            self.layers.pop()

    def _collect_extents(self, e: R.Expr) -> None:
        for red in self._all_reduces(e):
            for name, n in red.axes:
                ext: Dim = n if self.symbolic else _static_int(n, self.op)
                old = self.extents.get(name, ext)
                if isinstance(ext, int) and isinstance(old, int):
                    self.extents[name] = max(ext, old)
                else:  # symbolic extents that may differ: no static bound for the variable
                    self.extents[name] = ext if old == ext else None

    def _all_reduces(self, e: R.Expr) -> Iterator[R.Reduce]:
        return (x for x in walk_exprs(e) if isinstance(x, R.Reduce))

    # -- expressions --------------------------------------------------------------------
    def lower(self, e: R.Expr, env: dict[str, Token], depth: int) -> Val:
        key, _ = self.keys.key(e, env, depth)
        hit = self._cached(key)
        if hit is not None:
            return hit
        v = self._lower(e, env, depth)
        self.layers[-1][key] = v
        return v

    def _lower(self, e: R.Expr, env: dict[str, Token], depth: int) -> Val:
        if isinstance(e, R.Lit):
            return literal(e.value, e.dtype)
        if isinstance(e, R.Load):
            return self._load(e, env, depth)
        if isinstance(e, R.IndexValue):
            return self.s.from_index(self.ix(e.ix, env, depth), e.dtype)
        if isinstance(e, R.Call):
            args = [self.lower(a, env, depth) for a in e.args]
            return self.s.call(e.fn, args, [a.dtype for a in e.args], e.dtype, dict(e.attrs))
        if isinstance(e, R.Reduce):
            return self._reduce(e, env, depth)
        raise CodegenError(f"unknown rule node {type(e).__name__}", location=self.op)

    def _reduce(self, e: R.Reduce, env: dict[str, Token], depth: int) -> Val:
        if e.kind not in R.REDUCTIONS:
            raise CodegenError(f"unknown reduction {e.kind!r}", location=self.op)
        dt = e.dtype
        folds_from_zero = e.kind == "sum" or e.kind in R.DOT_KINDS
        extents: list[Dim] = [n if self.symbolic else _static_int(n, self.op) for _, n in e.axes]
        terms: Dim = 1
        for n in extents:
            terms = terms * n
        ct = compute_type(dt)
        acc = self.alloca_builder.alloca(ct, name=f"acc.{e.kind}")
        # the rule folds from the first term; a float sum folded from -0.0 is the same bit for bit
        # (x + -0.0 is x), and a sum over nothing is +0.0
        start: Val = ir.Constant(ct, -0.0) if folds_from_zero and dt.is_float and terms else identity(e.kind, dt)
        if folds_from_zero and dt.is_float and not isinstance(terms, int):
            empty = self.b.icmp_signed("==", self._value(terms), ir.Constant(I64, 0))
            start = self.b.select(empty, identity(e.kind, dt), ir.Constant(ct, -0.0))
        self.b.store(start, acc)
        rounds = dt in (DType.f16, DType.bf16) or (dt.is_float and dt.is_narrow)
        inner = dict(env)
        tokens = []
        for k, (name, _) in enumerate(e.axes):
            inner[name] = ("b", depth + 1, k)
            tokens.append(inner[name])

        def level(pos: int) -> None:
            if pos == len(extents):
                if e.kind in R.DOT_KINDS:
                    self.b.store(self._dot_step(e, inner, depth + 1, self.b.load(acc, typ=ct)), acc)
                    return
                v = self.lower(e.body, inner, depth + 1)
                cur = self.b.load(acc, typ=ct)
                step = self._combine(e.kind, cur, v, dt)
                self.b.store(self.s.round_to(step, dt) if rounds else step, acc)  # each step in the dtype
                return

            def body(i: Val) -> None:
                with self._layer():
                    self.bound[tokens[pos]] = i
                    self._hoist(e.body, inner, depth + 1)
                    level(pos + 1)
                    del self.bound[tokens[pos]]

            for_range(self.b, 0, self._dim(extents[pos]), f"r{depth}_{pos}", body)

        level(0)
        out = self.b.load(acc, typ=ct)
        return out

    def _dot_step(self, e: R.Reduce, env: dict[str, Token], depth: int, acc: Val) -> Val:
        """One term of a ``dot`` reduction: ``fma(x, y, acc)`` of its factors (``dot_ftz``: factors and
        result flushed)."""
        x, y = (self.lower(f, env, depth) for f in R.dot_factors(e))
        if e.kind == "dot_ftz":
            x, y = self.s.flush_subnormal(x), self.s.flush_subnormal(y)
        out = self.s.fma(x, y, acc)
        return self.s.flush_subnormal(out) if e.kind == "dot_ftz" else out

    def _combine(self, kind: str, acc: Val, v: Val, dt: DType) -> Val:
        b = self.b
        if dt.is_float and kind == "sum":  # in the rule's order: no reassociation
            return b.fadd(acc, v)
        if dt.is_float and kind == "prod":
            return b.fmul(acc, v)
        fn = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[kind]
        if dt is DType.bool:
            return self.s.call({"sum": "or", "prod": "and", "max": "or", "min": "and"}[kind], [acc, v],
                               [dt, dt], dt, {})
        if dt.is_float:
            return self.s.call(fn, [acc, v], [DType.f32 if dt is not DType.f64 else dt] * 2,
                               DType.f32 if dt is not DType.f64 else dt, {})
        return self.s.call(fn, [acc, v], [dt, dt], dt, {})

    # -- memory -------------------------------------------------------------------------
    def _value(self, d: Dim) -> Val:
        v = self._dim(d)
        return ir.Constant(I64, v) if isinstance(v, int) else v

    def _flat(self, idx: Sequence[Val], strides: Sequence[Dim]) -> Val:
        flat: Val = ir.Constant(I64, 0)
        for i, s in zip(idx, strides, strict=True):
            term = i if isinstance(s, int) and s == 1 else self.b.mul(i, self._value(s), flags=("nuw", "nsw"))
            flat = term if isinstance(flat, ir.Constant) and flat.constant == 0 else \
                self.b.add(flat, term, flags=("nuw", "nsw"))
        return flat

    def _load_at(self, buf: Buffer, flat: Val) -> Val:
        """``buf``'s element at flat index ``flat`` (in range), in its compute type."""
        ty = storage_type(buf.dtype)
        ptr = self.b.gep(buf.ptr, [flat], inbounds=True, source_etype=ty)
        return self.s.from_storage(self.b.load(ptr, typ=ty), buf.dtype)

    def _store(self, buf: Buffer, flat: Val, v: Val) -> None:
        ty = storage_type(buf.dtype)
        ptr = self.b.gep(buf.ptr, [flat], inbounds=True, source_etype=ty)
        self.b.store(self.s.to_storage(v, buf.dtype), ptr)

    def _load(self, e: R.Load, env: dict[str, Token], depth: int) -> Val:
        buf = self.inputs[e.operand]
        if len(e.index) != len(buf.shape):
            raise CodegenError(f"operand {e.operand} has rank {len(buf.shape)}, indexed with {len(e.index)}",
                               location=self.op, hint="a bug in the op's rule")
        b = self.b
        fallback = literal(e.oob, buf.dtype) if e.oob is not None else None
        if isinstance(buf.numel, int) and buf.numel == 0:
            if fallback is None:
                b.store(ir.Constant(I1, 1), self.err)
                return literal(0, buf.dtype)
            return fallback
        idx: list[Val] = []
        inb: Val | None = None
        for ix, dim in zip(e.index, buf.shape, strict=True):
            i = self.ix(ix, env, depth)
            if self._within(ix, dim):
                idx.append(i)
                continue
            ok = b.icmp_unsigned("<", i, self._value(dim))
            inb = ok if inb is None else b.and_(inb, ok)
            idx.append(b.select(ok, i, ir.Constant(I64, 0)))
        if inb is None and e.operand in self.scalars:
            return literal(self.scalars[e.operand], buf.dtype)
        strides = row_major_strides([int(d) for d in buf.shape]) if not self.symbolic else _symbolic_strides(buf.shape)
        flat = self._flat(idx, strides)
        ty = storage_type(buf.dtype)
        ptr = b.gep(buf.ptr, [flat], inbounds=True, source_etype=ty)
        if inb is not None and not isinstance(buf.numel, int):
            # the buffer may be empty at run time: an index out of range reads a stack slot instead
            spare = self.alloca_builder.alloca(ty, name="spare")
            ptr = b.select(inb, ptr, spare)
        v = self.s.from_storage(b.load(ptr, typ=ty), buf.dtype)
        if inb is None:
            return v
        if fallback is not None:
            return b.select(inb, v, fallback)
        failed = b.or_(b.load(self.err, typ=I1), b.not_(inb))
        b.store(failed, self.err)
        return v

    def _within(self, ix: R.Ix, dim: Dim) -> bool:
        """Whether ``ix`` is always in ``[0, dim)``: by its interval where ``dim`` is static, or as a
        loop variable over ``dim`` itself where it is symbolic."""
        if isinstance(dim, int):
            lo, hi = self.ix_range(ix)
            return lo is not None and hi is not None and lo >= 0 and hi < dim
        return ix.kind == "var" and self.extents.get(ix.args[0]) == dim

    # -- index expressions --------------------------------------------------------------
    def ix_range(self, ix: R.Ix) -> tuple[int | None, int | None]:
        """A sound interval for an index expression (None: unbounded)."""
        return fold_ix(ix, var=self._var_range, lit=self._lit_range, dyn=lambda _: (None, None), op=_range_op)

    def _var_range(self, name: str) -> tuple[int | None, int | None]:
        n = self.extents.get(name)
        if isinstance(n, int):
            return (0, max(n - 1, 0))
        return (0, None) if n is not None else (None, None)

    def _lit_range(self, d: Dim) -> tuple[int | None, int | None]:
        if not isinstance(d, int) and self.symbolic:
            return dim_bounds(d)
        v = _static_int(d, self.op)
        return (v, v)

    def ix(self, ix: R.Ix, env: dict[str, Token], depth: int) -> Val:
        """The index as an i64; each node carries its interval (floored division and modulo pick
        unsigned instructions where both operands are known non-negative) and whether a value
        read from data takes part (no ``nsw`` then: such an index may be anything)."""
        def var(name: str) -> _IxCode:
            return _IxCode(self.bound[env[name]], self._var_range(name), False)

        def lit(d: Dim) -> _IxCode:
            if not isinstance(d, int) and self.symbolic:
                return _IxCode(self._value(d), self._lit_range(d), False)
            v = _static_int(d, self.op)
            return _IxCode(ir.Constant(I64, v), (v, v), False)

        def dyn(e: R.Expr) -> _IxCode:
            return _IxCode(self.s.to_index(self.lower(e, env, depth), e.dtype), (None, None), True)

        return fold_ix(ix, var=var, lit=lit, dyn=dyn, op=self._ix_op).value

    def _ix_op(self, kind: str, a: _IxCode, c: _IxCode) -> _IxCode:
        b = self.b
        has_dyn = a.has_dyn or c.has_dyn
        flags = () if has_dyn else ("nsw",)
        if kind == "add":
            v = b.add(a.value, c.value, flags=flags)
        elif kind == "sub":
            v = b.sub(a.value, c.value, flags=flags)
        elif kind == "mul":
            v = b.mul(a.value, c.value, flags=flags)
        elif kind == "min":
            v = b.select(b.icmp_signed("<", a.value, c.value), a.value, c.value)
        elif kind == "max":
            v = b.select(b.icmp_signed(">", a.value, c.value), a.value, c.value)
        else:
            v = self._floor_divmod(kind, a.value, c.value, a.range, c.range)
        return _IxCode(v, _range_op(kind, a.range, c.range), has_dyn)

    def _floor_divmod(self, kind: str, a: Val, c: Val, arange: tuple, crange: tuple) -> Val:
        """numpy's floored ``//`` and ``%`` on i64 (a zero divisor gives 0, as numpy does)."""
        b = self.b
        zero = ir.Constant(I64, 0)
        if crange[0] is not None and crange[0] > 0 and arange[0] is not None and arange[0] >= 0:
            return b.udiv(a, c) if kind == "floordiv" else b.urem(a, c)
        one = ir.Constant(I64, 1)
        by_zero = b.icmp_signed("==", c, zero)
        overflow = b.and_(b.icmp_signed("==", a, ir.Constant(I64, -(1 << 63))),
                          b.icmp_signed("==", c, ir.Constant(I64, -1)))
        safe = b.select(b.or_(by_zero, overflow), one, c)
        q = b.sdiv(a, safe)
        r = b.srem(a, safe)
        fix = b.and_(b.icmp_signed("!=", r, zero), b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", c, zero)))
        if kind == "floordiv":
            out = b.select(fix, b.sub(q, one), q)
        else:
            out = b.select(fix, b.add(r, c), r)
        return b.select(by_zero, zero, out)


def _opt(a: int | None, b: int | None, f: Callable[[int, int], int]) -> int | None:
    return None if a is None or b is None else f(a, b)


@dataclass(frozen=True)
class _IxCode:
    """An index lowered to LLVM: its i64, a sound interval, whether data takes part."""

    value: Val
    range: tuple[int | None, int | None]
    has_dyn: bool


def _range_op(kind: str, a: tuple[int | None, int | None], b: tuple[int | None, int | None],
              ) -> tuple[int | None, int | None]:
    """A sound interval of ``a kind b`` from the operands' intervals (None: unbounded)."""
    (alo, ahi), (blo, bhi) = a, b
    if kind == "add":
        return (_opt(alo, blo, int.__add__), _opt(ahi, bhi, int.__add__))
    if kind == "sub":
        return (_opt(alo, bhi, int.__sub__), _opt(ahi, blo, int.__sub__))
    if kind == "min":  # min(a, b) <= each bounded operand
        his = [h for h in (ahi, bhi) if h is not None]
        return (_opt(alo, blo, min), min(his) if his else None)
    if kind == "max":
        los = [lo for lo in (alo, blo) if lo is not None]
        return (max(los) if los else None, _opt(ahi, bhi, max))
    if alo is None or ahi is None or blo is None or bhi is None:
        return (None, None)
    if kind == "mul":
        prods = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return (min(prods), max(prods))
    if blo == bhi and blo > 0:
        if kind == "floordiv":
            return (alo // blo, ahi // blo)
        if kind == "mod":
            return (alo, ahi) if alo >= 0 and ahi < blo else (0, blo - 1)
    return (None, None)


def op_rule(v: Value) -> R.Expr:
    """The compute rule of ``v``'s op at its operand and result types (a CodegenError when it cannot be
    built at these shapes)."""
    from cuvil.ir.opdef import get_op

    in_types = [o.type for o in v.operands]
    try:
        return get_op(v.op).make_rule(in_types, v.attr_dict, v.type)
    except CodegenError:
        raise
    except Exception as e:  # a rule that cannot be built at these shapes
        raise CodegenError(f"the rule of {v.op} could not be built for {v.type}: {e}", location=v.op) from e


SCALAR_OPERAND_LIMIT = 1024
"""Constants up to this many elements are checked for holding one value (:func:`scalar_operands`)."""


def scalar_operands(v: Value, constants: Mapping[str, np.ndarray]) -> dict[int, float | int | bool]:
    """The operands of ``v`` that are constants of one repeated value (a literal broadcast to a shape), by
    position: the rule lowering reads them as immediates."""
    out: dict[int, float | int | bool] = {}
    for j, o in enumerate(v.operands):
        if not o.is_const or o.const_hash not in constants or not o.type.is_static:
            continue
        data = np.asarray(constants[o.const_hash]).reshape(-1)
        if 0 < data.size <= SCALAR_OPERAND_LIMIT and bool(np.all(data.view(_same_width_int(data)) ==
                                                                 data[:1].view(_same_width_int(data)))):
            out[j] = data[0].item()
    return out


def _same_width_int(data: np.ndarray) -> np.dtype:
    """An integer type as wide as ``data``'s: elements compared by their bits (NaNs, signed zeros)."""
    return np.dtype(f"u{data.dtype.itemsize}")


def emit_rule_kernel(module: ir.Module, name: str, rule: R.Expr, in_types: Sequence[TensorType],
                     out_type: TensorType, op: str, dims: Sequence[str] | None = None,
                     scalars: Mapping[int, float | int | bool] | None = None) -> ir.Function:
    """Lower ``rule`` to an internal kernel function in ``module``: at concrete shapes, or over the
    symbolic dims ``dims`` (read at run time from the kernel's last argument); ``scalars``: operands
    known to hold one value (:func:`scalar_operands`)."""
    if dims is None:
        merged = coalesce(rule, in_types, out_type)
        if merged is not None:
            rule, in_types, out_type = merged
    return RuleKernel(module, name, rule, in_types, out_type, op, dims, scalars=scalars).emit()


SUPPORTED_REDUCTIONS: dict[str, frozenset[str]] = {
    "float": frozenset({"sum", "prod", "max", "min", *R.DOT_KINDS}),
    **{kind: frozenset({"sum", "prod", "max", "min"}) for kind in ("int", "bool")}}
"""The reduction kinds :class:`RuleKernel` lowers, by element kind (over bool: or / and folds).
``cuvil ops`` checks each op's rule against this table."""
