"""Loops and small control-flow pieces of generated code, shared by the rule lowering and the tuned
kernels (one loop emitter, one way to attach loop hints)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from cuvil.codegen.llvm_types import I1, I32, I64, PTR
from cuvil.codegen.scalar import Builder, Flags, Val


def row_major_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


def opaque_alloca(b: Builder, ty: ir.Type, name: str, align: int = 64) -> Val:
    """A stack slot addressed as an untyped ``ptr`` (the element type is given at each access)."""
    slot = b.alloca(ty, name=name)
    slot.align = align
    slot.type = PTR
    return slot


def const(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def loop_hints(b: Builder, branch: ir.Instruction, *hints: str) -> None:
    """Attach ``llvm.loop`` hints (e.g. ``llvm.loop.unroll.disable``; a flag hint is written
    ``name=true``) to a loop's back edge. The loop id is numbered within the module, so the same
    function always gives the same code."""
    mod = b.module
    loop_id = len(mod.metadata)

    def item(h: str) -> ir.Value:
        name, _, flag = h.partition("=")
        return mod.add_metadata([ir.MetaDataString(mod, name), *([ir.Constant(I1, flag == "true")] if flag else [])])

    items = [item(h) for h in hints]
    node = mod.add_metadata([ir.MetaDataString(mod, f"cuvil.loop.{loop_id}"), *items])
    node.operands = (node, *items)  # a loop id refers to itself (printed as distinct by LLVM)
    branch.set_metadata("llvm.loop", node)


def for_range(b: Builder, start: Val | int, stop: Val | int, name: str,
              body: Callable[[Val], object], step: int = 1, hints: Sequence[str] = ()) -> None:
    """``for i in range(start, stop, step): body(i)`` with runtime bounds (i64)."""
    start_v = const(start) if isinstance(start, int) else start
    stop_v = const(stop) if isinstance(stop, int) else stop
    if isinstance(start, int) and isinstance(stop, int):
        if stop <= start:
            return
        if stop - start == 1:
            body(start_v)
            return

    def run(i: Val, carried: list[Val]) -> list[Val]:
        body(i)
        return carried

    counted_loop(b, name, start_v, lambda i: b.icmp_signed("<", i, stop_v), step, run, hints=hints)


def counted_loop(b: Builder, name: str, start: Val, more: Callable[[Val], Val], step: int,
                 body: Callable[[Val, list[Val]], list[Val]], carried: Sequence[Val] = (), *,
                 index_name: str | None = None, flags: Flags = ("nsw",), hints: Sequence[str] = (),
                 ) -> tuple[Val, list[Val]]:
    """``for (i = start; more(i); i += step) carried = body(i, carried)``: the index and the carried
    values (accumulators kept in registers) are phis of the loop head. Returns them, as the loop
    leaves them. ``flags`` go on the increment."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    loop = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=index_name or name)
    i.add_incoming(start, pre)
    phis: list[ir.PhiInstr] = []
    for x in carried:
        phi = b.phi(x.type)
        phi.add_incoming(x, pre)
        phis.append(phi)
    b.cbranch(more(i), loop, done)
    b.position_at_end(loop)
    out = body(i, list(phis))
    i.add_incoming(b.add(i, const(step), flags=flags), b.block)
    for phi, x in zip(phis, out, strict=True):
        phi.add_incoming(x, b.block)
    back = b.branch(head)
    if hints:
        loop_hints(b, back, *hints)
    b.position_at_end(done)
    return i, list(phis)


NO_UNROLL = ("llvm.loop.unroll.disable",)

OUTER_ONLY = (*NO_UNROLL, "llvm.loop.vectorize.enable=false")
"""A loop over a tile's rows around a loop along a row: neither unrolled nor vectorized across the rows. Left
free, LLVM unrolls an inner loop of known length whole and may then vectorize the outer one instead, every
element a gather from the tile and a scatter to the output, rows apart: it did so for register tiles of seven
and eight rows on AVX-512 CPUs. One thread, a 1x1 convolution with a bias and no activation (the same bits):
64 -> 128 channels at 28x28 0.243 -> 0.134 ms (ONNX Runtime 0.129), 192 -> 32 at 28x28 0.104 -> 0.087."""

MASKED_TAIL = ("llvm.loop.vectorize.predicate.enable=true",)
"""Vectorize the loop's last partial vector with masked loads and stores instead of a scalar remainder
(for short rows: 110 of a 112-wide depthwise row ran 96 in vectors and 14 one at a time)."""


def if_then(b: Builder, cond: Val, name: str, body: Callable[[], object]) -> None:
    if_else(b, cond, name, body, None)


def if_else(b: Builder, cond: Val, name: str, then_body: Callable[[], object],
            else_body: Callable[[], object] | None) -> None:
    """``then_body`` where ``cond`` holds, else ``else_body`` (nothing when None); the builder is left
    after both."""
    then = b.append_basic_block(f"{name}.then")
    other = b.append_basic_block(f"{name}.else") if else_body is not None else None
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(cond, then, other or done)
    b.position_at_end(then)
    then_body()
    b.branch(done)
    if other is not None and else_body is not None:
        b.position_at_end(other)
        else_body()
        b.branch(done)
    b.position_at_end(done)


def load_if_inside(b: Builder, row: Val, ix: Val, width: Val, otherwise: ir.Constant) -> Val:
    """``row[ix]`` (``row`` of the constant's type) where ``0 <= ix < width``, else ``otherwise``, with the
    load under a branch rather than at a selected address: the vectorizer turns it into a masked load
    of consecutive elements, not a gather."""
    inside = b.icmp_unsigned("<", ix, width)
    entry = b.block
    take = b.append_basic_block("tap.in")
    done = b.append_basic_block("tap.done")
    b.cbranch(inside, take, done)
    b.position_at_end(take)
    v = b.load(b.gep(row, [ix], inbounds=True, source_etype=otherwise.type), typ=otherwise.type, align=4)
    b.branch(done)
    b.position_at_end(done)
    phi = b.phi(otherwise.type)
    phi.add_incoming(v, take)
    phi.add_incoming(otherwise, entry)
    return phi


def load_tap(b: Builder, row: Val, x: Val, shift: int, count: int, width: int, otherwise: ir.Constant) -> Val:
    """``row[x + shift]`` for the ``x < count`` of a loop along a row of ``width`` elements, ``otherwise``
    outside it: a plain load where every ``x`` reads inside the row, else :func:`load_if_inside`."""
    ix = b.add(x, const(shift))
    if 0 <= shift and count - 1 + shift < width:
        return b.load(b.gep(row, [ix], inbounds=True, source_etype=otherwise.type), typ=otherwise.type, align=4)
    return load_if_inside(b, row, ix, const(width), otherwise)


def plane_row(b: Builder, plane: Val, row: Val, height: int, width: int, outside: Val, etype: ir.Type) -> Val:
    """The start of row ``row`` of a ``height x width`` plane of ``etype``, or ``outside`` (a row of the
    padding's value) where ``row`` is not one of its rows."""
    inside = b.icmp_unsigned("<", row, const(height))
    return b.select(inside, b.gep(plane, [b.mul(row, const(width))], inbounds=True, source_etype=etype), outside)


def i64(v: Val | int) -> Val:
    """An i64 operand from a Python int or an existing value."""
    return const(v) if isinstance(v, int) else v


def imin(b: Builder, x: Val, y: Val) -> Val:
    return b.select(b.icmp_signed("<", x, y), x, y)


def unravel(b: Builder, flat: Val, shape: Sequence[int | Val]) -> list[Val]:
    """Multi-index of ``flat`` in a row-major ``shape`` (constant divisors, or ``i64`` values known
    only at run time)."""
    out: list[Val] = []
    rest = flat
    for d in reversed(shape):
        if isinstance(d, int) and d == 1:
            out.append(const(0))
            continue
        out.append(b.urem(rest, i64(d)))
        rest = b.udiv(rest, i64(d))
    return list(reversed(out))


def start_block(fn: ir.Function) -> ir.Block:
    """The block after the alloca-only entry block."""
    return fn.blocks[1]


def fail_unless(b: Builder, ok: Val, code: int | Val) -> None:
    """Continue when ``ok``; otherwise return ``code`` (an i32) from the function."""
    fn = b.function
    fail = fn.append_basic_block("fail")
    cont = fn.append_basic_block("ok")
    b.cbranch(ok, cont, fail)
    b.position_at_end(fail)
    b.ret(code if isinstance(code, ir.Value) else ir.Constant(I32, code))
    b.position_at_end(cont)


def not_null(b: Builder, p: Val) -> Val:
    return b.icmp_unsigned("!=", p, ir.Constant(PTR, None))
