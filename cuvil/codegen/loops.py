"""Loops and small control-flow pieces of generated code, shared by the rule lowering and the tuned
kernels (one loop emitter, one way to attach loop hints)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from cuvil.codegen.scalar import I64, PTR


def row_major_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


def opaque_alloca(b: ir.IRBuilder, ty: ir.Type, name: str, align: int = 64) -> ir.Value:
    """A stack slot addressed as an untyped ``ptr`` (the element type is given at each access)."""
    slot = b.alloca(ty, name=name)
    slot.align = align
    slot.type = PTR
    return slot


def const(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def loop_hints(b: ir.IRBuilder, branch: ir.Instruction, *hints: str) -> None:
    """Attach ``llvm.loop`` hints (e.g. ``llvm.loop.unroll.disable``) to a loop's back edge. The
    loop id is numbered within the module, so the same function always gives the same code."""
    mod = b.module
    loop_id = len(mod.metadata)
    items = [mod.add_metadata([ir.MetaDataString(mod, h)]) for h in hints]
    node = mod.add_metadata([ir.MetaDataString(mod, f"cuvil.loop.{loop_id}"), *items])
    node.operands = (node, *items)  # a loop id refers to itself (printed as distinct by LLVM)
    branch.set_metadata("llvm.loop", node)


def for_range(b: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int, name: str,
              body: Callable[[ir.Value], None], step: int = 1, hints: Sequence[str] = ()) -> None:
    """``for i in range(start, stop, step): body(i)`` with runtime bounds (i64)."""
    start_v = const(start) if isinstance(start, int) else start
    stop_v = const(stop) if isinstance(stop, int) else stop
    if isinstance(start, int) and isinstance(stop, int):
        if stop <= start:
            return
        if stop - start == 1:
            body(start_v)
            return
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    loop = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(start_v, pre)
    b.cbranch(b.icmp_signed("<", i, stop_v), loop, done)
    b.position_at_end(loop)
    body(i)
    i.add_incoming(b.add(i, const(step), flags=("nsw",)), b.block)
    back = b.branch(head)
    if hints:
        loop_hints(b, back, *hints)
    b.position_at_end(done)


NO_UNROLL = ("llvm.loop.unroll.disable",)


def if_then(b: ir.IRBuilder, cond: ir.Value, name: str, body: Callable[[], None]) -> None:
    then = b.append_basic_block(f"{name}.then")
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(cond, then, done)
    b.position_at_end(then)
    body()
    b.branch(done)
    b.position_at_end(done)


def i64(v: ir.Value | int) -> ir.Value:
    """An i64 operand from a Python int or an existing value."""
    return const(v) if isinstance(v, int) else v


def imin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def unravel(b: ir.IRBuilder, flat: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
    """Multi-index of ``flat`` in a row-major ``shape`` (constant divisors)."""
    out: list[ir.Value] = []
    rest = flat
    for d in reversed(shape):
        if d == 1:
            out.append(const(0))
            continue
        out.append(b.urem(rest, const(d)))
        rest = b.udiv(rest, const(d))
    return list(reversed(out))


def start_block(fn: ir.Function) -> ir.Block:
    """The block after the alloca-only entry block."""
    return fn.blocks[1]
