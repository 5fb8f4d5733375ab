"""Row reductions (softmax, log_softmax, layer norm) as schedules of their rules that vectorize.

Each rule reduces a row in order (softmax: the max, then the sum of ``exp(x - max)`` from the first
element to the last; layer norm: the sum, then the sum of squared deviations). The generic lowering
walks one row at a time, so each step waits for the previous one and nothing vectorizes. Here sixteen
rows advance together: a block of rows is copied into a column-major tile, and each reduction step is
one operation across the sixteen rows' accumulators, which LLVM vectorizes while every row still
reduces its own terms in the rule's order. Every scalar operation is the one the generic lowering
emits (:class:`cuvil.codegen.scalar.ScalarEmitter`, the same literals), so the result is the same bit
for bit, up to which NaN payload survives (``tests/codegen/test_row_kernels.py``). Values the rule
computes twice (softmax's exponentials, in the sum and in the output) are computed once and kept in
the tile: the same values. Where rows are contiguous, the outputs are computed a vector of sixteen rows at
a time and transposed back in registers (softmax over 4x128x128 on one Zen 4 core: 0.104 -> 0.088 ms, the
division one vector per element instead of one scalar per element).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, cast

from llvmlite import ir

from cuvil.codegen import abi, vmath
from cuvil.codegen.dims import DimValues
from cuvil.codegen.kernels.gemm import Ctx, KernelFunction, splat, transpose, vec_type
from cuvil.codegen.kernels.widen import HALVES
from cuvil.codegen.llvm_types import F32, I1, I32, I64, PTR
from cuvil.codegen.loops import for_range, if_else, opaque_alloca
from cuvil.codegen.scalar import Builder, ScalarEmitter, Val, identity, literal
from cuvil.codegen.shape_class import ShapeClass
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, dim_range
from cuvil.ir.values import Value

LANES = 16
"""Rows that advance together (one AVX-512 vector of float32)."""

TILE_LIMIT = 1 << 22
"""Largest tile (bytes): longer rows stay on the generic lowering."""

STACK_TILE_LIMIT = 1 << 17
"""Largest tile kept on a thread's stack; a larger one is the kernel's scratch and its blocks run on
the calling thread."""

WORK_PER_ELEMENT = 80
"""What an element weighs against a GEMM's flop in the pool's threshold (an exp in double precision and
the passes). A 128x256 layer norm takes about 0.5 ns an element on one thread beyond the call, some 90 flops
at the GEMM's rate; at 40, BERT's 128x256 layer norms ran on one thread with two (two threads, in-process A/B at 80:
BERT -14 % in two runs, one thread unchanged, same bits)."""

F32_ARGS = [DType.f32]


class Block:
    """One block of sixteen rows inside a kernel: where each row starts, whether it exists (the last
    block may be short: its missing rows read row 0, are computed and never stored), per-row
    accumulators, and the tile holding the block column-major (element ``k`` of every row together)."""

    def __init__(self, b: Builder, alloca: Builder, kernel: RowKernel, tile: Val, dims: DimValues | None) -> None:
        self.b, self.kernel, self.tile = b, kernel, tile
        self.s = ScalarEmitter(b)

        def value(d: Dim) -> Val:
            return ir.Constant(I64, d) if isinstance(d, int) else cast(DimValues, dims).value(d)

        self.length, self.inner = value(kernel.length), value(kernel.inner)
        self.stride = b.mul(self.length, self.inner)
        self.rows = b.mul(value(kernel.outer), self.inner)
        self.base = opaque_alloca(alloca, ir.ArrayType(I64, LANES), "base")
        self.valid = opaque_alloca(alloca, ir.ArrayType(I1, LANES), "valid")
        self.acc = {name: opaque_alloca(alloca, ir.ArrayType(F32, LANES), name) for name in kernel.accumulators}
        self.flag = alloca.alloca(I1, name="flag")  # a block-wide condition a kernel folds over its elements

    def lane(self, array: Val, j: Val, ty: ir.Type = F32) -> Val:
        return self.b.gep(array, [j], source_etype=ty, inbounds=True)

    def load(self, array: Val, j: Val) -> Val:
        return self.b.load(self.lane(array, j), typ=F32)

    def lanes(self, array: Val) -> Val:
        """A per-row array's sixteen values as one vector."""
        return self.b.load(array, typ=vec_type(LANES), align=4)

    def cell(self, k: Val, j: Val) -> Val:
        b = self.b
        return b.gep(self.tile, [b.add(b.mul(k, ir.Constant(I64, LANES)), j)], source_etype=F32, inbounds=True)

    def element(self, ptr: Val, j: Val, k: Val) -> Val:
        b = self.b
        offset = b.add(b.load(self.lane(self.base, j, I64), typ=I64), b.mul(k, self.inner))
        return b.gep(ptr, [offset], source_etype=F32, inbounds=True)

    def locate(self, r0: Val, starts: dict[str, tuple[Val, ir.Constant]]) -> None:
        """Each lane's row offset and validity; each named accumulator set to its start value."""
        b = self.b

        def one(j: Val) -> None:
            r = b.add(r0, j)
            ok = b.icmp_signed("<", r, self.rows)
            r = b.select(ok, r, ir.Constant(I64, 0))
            offset = b.add(b.mul(b.sdiv(r, self.inner), self.stride), b.srem(r, self.inner))
            b.store(offset, self.lane(self.base, j, I64))
            b.store(ok, self.lane(self.valid, j, I1))
            for array, start in starts.values():
                b.store(start, self.lane(array, j))

        for_range(b, 0, LANES, "lane", one)

    def gather(self, src: Val) -> None:
        """The block's rows into the tile. Rows contiguous along the axis (``inner == 1``) are read sixteen
        elements at a time, one vector per row, and transposed in registers into one vector per element;
        the elements past the last whole sixteen (and strided rows) one load per lane (a gather)."""
        b = self.b
        start: Val = ir.Constant(I64, 0)
        if self.kernel.inner == 1:
            start = b.and_(self.length, ir.Constant(I64, -LANES))

            def sixteen(k0: Val) -> None:
                rows = [b.load(self.element(src, ir.Constant(I64, j), k0), typ=vec_type(LANES), align=4)
                        for j in range(LANES)]
                for kk, column in enumerate(transpose(b, rows, LANES)):
                    b.store(column, self.cell(b.add(k0, ir.Constant(I64, kk)), ir.Constant(I64, 0)), align=4)

            for_range(b, 0, start, "k16", sixteen, step=LANES)
        for_range(b, start, self.length, "k", lambda k: for_range(
            b, 0, LANES, "g", lambda j: b.store(b.load(self.element(src, j, k), typ=F32), self.cell(k, j))))

    def sweep(self, step: Callable[[Val, Val], None]) -> None:
        """``step(k, j)`` for every element ``k`` in order, the sixteen lanes ``j`` innermost."""
        for_range(self.b, 0, self.length, "k", lambda k: for_range(self.b, 0, LANES, "j",
                                                                          lambda j: step(k, j)))

    def fold(self, array: Val, j: Val, value: Val, combine: Callable[[Val, Val], Val]) -> None:
        self.b.store(combine(self.load(array, j), value), self.lane(array, j))

    def rows_out(self, per_row: Callable[[Val], Callable[[Val], object]],
                 columns: Callable[[Val, Val], Val] | None = None, out: Val | None = None) -> None:
        """For each existing row ``j``: ``per_row(j)`` prepares it and returns ``put(k)``, run for every
        element in order (contiguous along the row when it is the innermost axis).

        Given ``columns`` (``columns(k, cells)``: the sixteen rows' outputs at element ``k`` from their tile
        cells, each lane the operations ``put`` applies to its row) and rows contiguous along the axis, every
        whole sixteen elements are computed one vector per element, transposed in registers and stored one
        vector per row: the same operations on the same values, where ``put`` runs one element at a time
        (a scalar division per element in softmax); ``out`` is the output they are stored to."""
        b = self.b
        start: Val = ir.Constant(I64, 0)
        if columns is not None and out is not None and self.kernel.inner == 1:
            start = b.and_(self.length, ir.Constant(I64, -LANES))
            valid = [b.load(self.lane(self.valid, ir.Constant(I64, j), I1), typ=I1) for j in range(LANES)]

            def sixteen(k0: Val) -> None:
                cells = []
                for kk in range(LANES):
                    k = b.add(k0, ir.Constant(I64, kk))
                    cells.append(columns(k, b.load(self.cell(k, ir.Constant(I64, 0)), typ=vec_type(LANES),
                                                   align=4)))
                for j, row in enumerate(transpose(b, cells, LANES)):
                    with b.if_then(valid[j]):
                        b.store(row, self.element(out, ir.Constant(I64, j), k0), align=4)

            for_range(b, 0, start, "k16", sixteen, step=LANES)

        def row(j: Val) -> None:
            with b.if_then(b.load(self.lane(self.valid, j, I1), typ=I1)):
                for_range(b, start, self.length, "k", per_row(j))

        for_range(b, 0, LANES, "row", row)


@dataclass(frozen=True)
class RowKernel:
    """``i32 name(ptr out, ptr in0, ..., ptr scratch)`` over ``outer * inner`` rows of ``length`` float32
    elements, element ``k`` of row ``r`` at ``(r // inner) * length * inner + r % inner + k * inner``. In a
    shape class (``runtime``: the symbols of a trailing ``ptr dims`` argument) the three may be dims read
    at run time, the tile sized for ``length_max``."""

    outer: Dim
    length: Dim
    inner: Dim
    length_max: int
    runtime: tuple[str, ...] | None = None

    unused_operands: frozenset[int] = frozenset()
    constant_bytes = 0
    operands = 1
    accumulators: ClassVar[tuple[str, ...]] = ()  # per-row float32 values, one slot per lane

    @property
    def on_stack(self) -> bool:
        """Whether each thread keeps its tile on its own stack (blocks then run on the pool)."""
        return self.length_max * LANES * 4 <= STACK_TILE_LIMIT

    @property
    def scratch_bytes(self) -> int:
        return 0 if self.on_stack else self.length_max * LANES * 4

    @property
    def name(self) -> str:
        return "row reduction"

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, self.operands, dims=self.runtime is not None)
        b = kf.b
        main_dims = DimValues(b, kf.dims, self.runtime) if kf.dims is not None and self.runtime is not None else None

        if all(isinstance(d, int) for d in (self.outer, self.length, self.inner)):
            rows = cast(int, self.outer) * cast(int, self.inner)
            work = rows * cast(int, self.length) * WORK_PER_ELEMENT if self.on_stack else 0
            kf.phase(-(-rows // LANES), work, self._chunk)
        else:
            dims = cast(DimValues, main_dims)
            rows_v = b.mul(dims.value(self.outer), dims.value(self.inner))
            blocks = b.sdiv(b.add(rows_v, ir.Constant(I64, LANES - 1)), ir.Constant(I64, LANES))
            work_v = b.mul(b.mul(rows_v, dims.value(self.length)), ir.Constant(I64, WORK_PER_ELEMENT))
            kf.phase(blocks, work_v if self.on_stack else 0, self._chunk)
        b.ret(ir.Constant(I32, abi.OK))
        return kf.fn

    def _chunk(self, ctx: Ctx, block: Val) -> None:
        b = ctx.b
        dims = DimValues(b, ctx.dims, self.runtime) if ctx.dims is not None and self.runtime is not None else None
        tile = ctx.entry_alloca(ir.ArrayType(F32, self.length_max * LANES), "tile") if self.on_stack else ctx.scratch
        blk = Block(b, ctx.alloca, self, tile, dims)
        self.block(blk, b.mul(block, ir.Constant(I64, LANES)), ctx.out, ctx.ins)

    def block(self, blk: Block, r0: Val, out: Val, ins: Sequence[Val]) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class SoftmaxKernel(RowKernel):
    op: str = "softmax"  # or "log_softmax"
    accumulators = ("top", "bottom", "total", "log_total")

    @property
    def name(self) -> str:
        return "softmax rows"

    def block(self, blk: Block, r0: Val, out: Val, ins: Sequence[Val]) -> None:
        b, s = blk.b, blk.s
        top, bottom, total = blk.acc["top"], blk.acc["bottom"], blk.acc["total"]
        blk.locate(r0, {"top": (top, identity("max", DType.f32)), "bottom": (bottom, identity("min", DType.f32)),
                        "total": (total, ir.Constant(F32, -0.0))})
        blk.gather(ins[0])

        def maximum(acc: Val, v: Val) -> Val:  # as the generic lowering folds a max: (accumulator, term)
            return s.call("max", [acc, v], F32_ARGS * 2, DType.f32, {})

        def minimum(acc: Val, v: Val) -> Val:  # NaN propagates, as in max
            return s.call("min", [acc, v], F32_ARGS * 2, DType.f32, {})

        def extremes(k: Val, j: Val) -> None:
            cell = b.load(blk.cell(k, j), typ=F32)
            blk.fold(top, j, cell, maximum)
            blk.fold(bottom, j, cell, minimum)

        blk.sweep(extremes)

        def operand(k: Val, j: Val) -> Val:
            return b.fsub(b.load(blk.cell(k, j), typ=F32), blk.load(top, j))

        # Whether every exp operand of the block lies in exp's domain: then exp needs neither its NaN test nor
        # its clamp, the same bits for less work (vmath.exp_f32's ``inside``). A row's operands x - max lie
        # from min - max to 0 (subtraction rounds monotonically), and a NaN, or an infinity at either end,
        # makes min - max NaN or -inf: one test of min - max per row.
        inside = blk.flag
        b.store(ir.Constant(I1, 1), inside)
        lowest = ir.Constant(F32, vmath.EXP_DOMAIN[0])

        def within(j: Val) -> None:
            ok = b.fcmp_ordered(">=", b.fsub(blk.load(bottom, j), blk.load(top, j)), lowest)
            b.store(b.and_(b.load(inside, typ=I1), ok), inside)

        for_range(b, 0, LANES, "domain", within)

        def accumulate(fast: bool) -> Callable[[Val, Val], None]:
            def step(k: Val, j: Val) -> None:
                x = operand(k, j)
                e = vmath.exp_f32(b, x, inside=True) if fast else s.call("exp", [x], F32_ARGS, DType.f32, {})
                blk.fold(total, j, e, b.fadd)
                if self.op == "softmax":
                    b.store(e, blk.cell(k, j))

            return step

        if_else(b, b.load(inside, typ=I1), "domain", lambda: blk.sweep(accumulate(True)),
                lambda: blk.sweep(accumulate(False)))

        norm = total
        if self.op == "log_softmax":  # each row's log(total), once
            norm = blk.acc["log_total"]
            for_range(b, 0, LANES, "log", lambda j: b.store(s.call("log", [blk.load(total, j)], F32_ARGS, DType.f32,
                                                                    {}), blk.lane(norm, j)))

        def output(cell: Val, m: Val, n: Val) -> Val:
            """A row's output element, or sixteen rows' as vectors: ``x - max - log(total)``, or ``e / total``."""
            return b.fsub(b.fsub(cell, m), n) if self.op == "log_softmax" else b.fdiv(cell, n)

        def per_row(j: Val) -> Callable[[Val], object]:
            m, n = blk.load(top, j), blk.load(norm, j)
            return lambda k: b.store(output(b.load(blk.cell(k, j), typ=F32), m, n), blk.element(out, j, k))

        tops, norms = blk.lanes(top), blk.lanes(norm)
        blk.rows_out(per_row, lambda k, cells: output(cells, tops, norms), out)


@dataclass(frozen=True)
class LayerNormKernel(RowKernel):
    """Rows are the trailing axes (``inner`` is 1); scale and bias have the row's shape."""

    epsilon: float = 1e-5
    operands = 3
    accumulators = ("sum", "squares", "mean", "denom")

    @property
    def name(self) -> str:
        return "layer norm rows"

    def block(self, blk: Block, r0: Val, out: Val, ins: Sequence[Val]) -> None:
        b, s = blk.b, blk.s
        x, scale, bias = ins
        total, squares, mean, denom = (blk.acc[n] for n in self.accumulators)
        minus_zero = ir.Constant(F32, -0.0)
        blk.locate(r0, {"sum": (total, minus_zero), "squares": (squares, minus_zero)})
        blk.gather(x)
        count = literal(cast(int, self.length), DType.f32)  # static (see row_kernel)
        blk.sweep(lambda k, j: blk.fold(total, j, b.load(blk.cell(k, j), typ=F32), b.fadd))
        for_range(b, 0, LANES, "mean", lambda j: b.store(b.fdiv(blk.load(total, j), count), blk.lane(mean, j)))

        def square(k: Val, j: Val) -> None:
            dev = b.fsub(b.load(blk.cell(k, j), typ=F32), blk.load(mean, j))
            blk.fold(squares, j, b.fmul(dev, dev), b.fadd)

        blk.sweep(square)
        eps = literal(self.epsilon, DType.f32)

        def spread(j: Val) -> None:
            var = b.fdiv(blk.load(squares, j), count)
            b.store(s.call("sqrt", [b.fadd(var, eps)], F32_ARGS, DType.f32, {}), blk.lane(denom, j))

        for_range(b, 0, LANES, "denom", spread)

        def normalized(cell: Val, m: Val, d: Val, k: Val) -> Val:
            """``(x - mean) / denom * scale[k] + bias[k]``: a row's element, or sixteen rows' as vectors."""
            g = b.load(b.gep(scale, [k], source_etype=F32, inbounds=True), typ=F32)
            beta = b.load(b.gep(bias, [k], source_etype=F32, inbounds=True), typ=F32)
            if isinstance(cell.type, ir.VectorType):
                g, beta = splat(b, g, LANES), splat(b, beta, LANES)
            return b.fadd(b.fmul(b.fdiv(b.fsub(cell, m), d), g), beta)

        def per_row(j: Val) -> Callable[[Val], object]:
            m, d = blk.load(mean, j), blk.load(denom, j)
            return lambda k: b.store(normalized(b.load(blk.cell(k, j), typ=F32), m, d, k), blk.element(out, j, k))

        means, denoms = blk.lanes(mean), blk.lanes(denom)
        blk.rows_out(per_row, lambda k, cells: normalized(cells, means, denoms, k), out)


SUM_WORK_PER_ELEMENT = 4
"""What an element of a plain sum weighs against a GEMM's flop in the pool's threshold (a load and an add)."""


@dataclass(frozen=True)
class SumRowsKernel(RowKernel):
    """A float32 ``reduce_sum`` or ``reduce_mean`` over consecutive axes (a global average pool's): each row
    summed from -0.0 in the rule's order, sixteen rows in the lanes of one accumulator vector, read straight
    from the operand (rows contiguous along the axis: sixteen elements of each row at a time, transposed in
    registers); a mean divides the sum by the count as the rule does. No tile: nothing is read twice."""

    mean: bool = False

    @property
    def name(self) -> str:
        return "mean rows" if self.mean else "sum rows"

    @property
    def on_stack(self) -> bool:
        return True

    @property
    def scratch_bytes(self) -> int:
        return 0

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        kf = KernelFunction(mod, name, self.operands)
        rows = cast(int, self.outer) * cast(int, self.inner)
        kf.phase(-(-rows // LANES), rows * cast(int, self.length) * SUM_WORK_PER_ELEMENT, self._chunk)
        kf.b.ret(ir.Constant(I32, abi.OK))
        return kf.fn

    def _chunk(self, ctx: Ctx, block: Val) -> None:
        b = ctx.b
        s = ScalarEmitter(b)
        blk = Block(b, ctx.alloca, self, ir.Constant(PTR, None), None)  # no tile: each element is read once

        def fold(acc: Val, column: Val) -> Val:  # the rule's sum step on sixteen rows at once
            return s.call(R.REDUCTIONS["sum"].combine, [acc, column], F32_ARGS * 2, DType.f32, {})

        r0 = b.mul(block, ir.Constant(I64, LANES))
        blk.locate(r0, {})
        x = ctx.ins[0]
        acc = opaque_alloca(ctx.alloca, vec_type(LANES), "acc")
        b.store(splat(b, ir.Constant(F32, -0.0), LANES), acc, align=4)
        start: Val = ir.Constant(I64, 0)
        if self.inner == 1:
            start = ir.Constant(I64, cast(int, self.length) & -LANES)

            def sixteen(k0: Val) -> None:
                rows = [b.load(blk.element(x, ir.Constant(I64, j), k0), typ=vec_type(LANES), align=4)
                        for j in range(LANES)]
                total = b.load(acc, typ=vec_type(LANES), align=4)
                for column in transpose(b, rows, LANES):
                    total = fold(total, column)
                b.store(total, acc, align=4)

            for_range(b, 0, start, "k16", sixteen, step=LANES)

        def one(k: Val) -> None:
            lanes = [b.load(blk.element(x, ir.Constant(I64, j), k), typ=F32) for j in range(LANES)]
            column: Val = ir.Constant(vec_type(LANES), None)
            for j, v in enumerate(lanes):
                column = b.insert_element(column, v, ir.Constant(I32, j))
            b.store(fold(b.load(acc, typ=vec_type(LANES), align=4), column), acc, align=4)

        for_range(b, start, ir.Constant(I64, cast(int, self.length)), "k", one)
        total = b.load(acc, typ=vec_type(LANES), align=4)
        if self.mean:
            count = splat(b, literal(cast(int, self.length), DType.f32), LANES)
            total = s.call("div", [total, count], F32_ARGS * 2, DType.f32, {})  # the rule's mean: sum / count

        def store(j: Val) -> None:
            with b.if_then(b.load(blk.lane(blk.valid, j, I1), typ=I1)):
                b.store(b.extract_element(total, j), b.gep(ctx.out, [b.add(r0, j)], source_etype=F32, inbounds=True))

        for_range(b, 0, LANES, "row", store)


def sum_rows_kernel(v: Value) -> SumRowsKernel | None:
    """The lane-blocked schedule of a float32 ``reduce_sum`` / ``reduce_mean`` at static shapes whose reduced
    axes are consecutive, over at least two rows (one row is one chain of adds whatever the schedule)."""
    if v.op not in ("reduce_sum", "reduce_mean") or v.is_param or v.is_const:
        return None
    x = v.operands[0].type
    if x.dtype is not DType.f32 or v.dtype is not DType.f32 or not x.is_static or x.rank == 0:
        return None
    shape = [int(d) for d in x.shape]
    axes = sorted({a % x.rank for a in (v.attr("axes") or range(x.rank))})
    if 0 in shape or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    outer, length, inner = math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), \
        math.prod(shape[axes[-1] + 1:])
    if outer * inner < 2:
        return None
    return SumRowsKernel(outer, length, inner, length, mean=v.op == "reduce_mean")


def row_kernel(v: Value, shape_class: ShapeClass | None = None, *, halves: bool = False) -> RowKernel | None:
    """The row-blocked schedule of ``v``: a float32 softmax or log_softmax, or a float32 layer norm whose
    scale and bias have the normalized axes' (static) shape; at static shapes, or in ``shape_class`` with
    the dims read at run time and the tile sized for the row length's largest value. With ``halves`` the
    types may also be float16 or bfloat16: these rules compute in float32 from widened operands and round
    once at the end, so the float32 kernel over buffers the caller widens computes them exactly."""
    if v.op not in ("softmax", "log_softmax", "layer_norm") or v.is_param or v.is_const:
        return None
    types = [v.type, *(o.type for o in v.operands)]
    if any(t.dtype is not DType.f32 and not (halves and t.dtype in HALVES) for t in types):
        return None
    static = all(t.is_static for t in types)
    if not static and shape_class is None:
        return None
    shape: list[Dim] = list(v.operands[0].type.shape)
    if not shape or any(isinstance(d, int) and d == 0 for d in shape):
        return None
    axis = int(cast(int, v.attr("axis", -1))) % len(shape)
    if v.op == "layer_norm":
        tail = shape[axis:]
        if any(not isinstance(d, int) for d in tail) or any(list(o.type.shape) != tail for o in v.operands[1:]):
            return None
        shape = [*shape[:axis], math.prod(tail)]  # one row axis: the normalized axes, flattened
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if isinstance(length, int):
        length_max = length
    else:
        sc = cast(ShapeClass, shape_class)
        if not all(t.symbols() <= set(sc.symbols) for t in types):
            return None
        _, hi = dim_range(length, {s: sc.bound(s)[:2] for s in sc.symbols})
        if hi is None:
            return None
        length_max = hi
    if length_max * LANES * 4 > TILE_LIMIT or length_max == 0:
        return None
    runtime = None if static else cast(ShapeClass, shape_class).symbols
    if v.op == "layer_norm":
        return LayerNormKernel(outer, length, inner, length_max, runtime,
                               epsilon=float(cast(float, v.attr("epsilon", 1e-5))))
    return SoftmaxKernel(outer, length, inner, length_max, runtime, op=v.op)


__all__ = ["LANES", "TILE_LIMIT", "LayerNormKernel", "SoftmaxKernel", "SumRowsKernel", "row_kernel",
           "sum_rows_kernel"]
