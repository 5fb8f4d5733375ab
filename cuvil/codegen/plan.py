"""The static memory plan: where every value of a function lives while it runs.

Inputs and constants stay where they are; a result is computed straight into the
caller's output buffer; every other value gets a 64-byte aligned slice of one arena,
reused once the value is dead (first fit, by liveness). An op's result never shares
memory with its operands, which is what lets kernels mark their pointers ``noalias``;
the one exception computes nothing: with ``views=True`` a ``reshape`` of an arena value or an
input (row-major: the same elements in the same order) is that value's memory under another
type, which stays live until the view's last reader, and no kernel runs for it.
The results of one ``loop`` are computed together (at the first of them), so they are planned
side by side, with the loop's work area live across them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cuvil.codegen.abi import ARENA_ALIGN
from cuvil.codegen.lower_rule import static_shape
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.ops.control import loop_key
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@dataclass(frozen=True)
class Slot:
    """``kind`` is input | output | const | arena; ``index`` the position, or the arena offset."""

    kind: str
    index: int


@dataclass(frozen=True)
class MemoryPlan:
    steps: tuple[Value, ...]  # ops in execution order
    slots: dict[Value, Slot]
    arena_bytes: int
    copies: tuple[tuple[Value, int], ...]  # results that are filled by a copy: (value, output index)
    work: dict[Value, int] = field(default_factory=dict)  # a loop group's first result -> its work area
    views: dict[Value, Value] = field(default_factory=dict)  # a reshape that runs no kernel -> whose memory it is


def nbytes(t: TensorType) -> int:
    n = t.dtype.np.itemsize
    for d in static_shape(t, "memory plan"):
        n *= d
    return n


def _round_up(n: int, align: int = ARENA_ALIGN) -> int:
    return (n + align - 1) // align * align


class _Arena:
    """First-fit allocation over a growing arena with coalescing free blocks."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.top = 0

    def alloc(self, size: int) -> int:
        size = _round_up(max(size, 1))
        for k, (off, sz) in enumerate(self.free):
            if sz >= size:
                if sz == size:
                    del self.free[k]
                else:
                    self.free[k] = (off + size, sz - size)
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off, _ = self.free.pop()
        else:
            off = self.top
        self.top = off + size
        return off

    def release(self, off: int, size: int) -> None:
        size = _round_up(max(size, 1))
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def structured_group_key(v: Value) -> tuple[object, ...]:
    return loop_key(v.operands, v.attrs)


def _structured(v: Value) -> bool:
    return get_op(v.op).structured


def ordered_steps(fn: Function) -> tuple[Value, ...]:
    """The function's ops in order (see :func:`order_steps`)."""
    return order_steps(fn.ops())


def order_steps(steps: Sequence[Value]) -> tuple[Value, ...]:
    """Ops in order, the results of one loop or cond moved up to sit right after the first (they
    read the same operands, so the order stays topological)."""
    members: dict[tuple[object, ...], list[Value]] = {}
    for v in steps:
        if _structured(v):
            members.setdefault(structured_group_key(v), []).append(v)
    out: list[Value] = []
    placed: set[Value] = set()
    for v in steps:
        if v in placed:
            continue
        group = members.get(structured_group_key(v), [v]) if _structured(v) else [v]
        out += group
        placed.update(group)
    return tuple(out)


def plan_steps(steps: Sequence[Value], keep: Sequence[Value] = (),
               size_of: Callable[[TensorType], int] | None = None) -> tuple[dict[Value, int], int]:
    """Arena offsets for ``steps`` run in order (a region body), each freed after its last reader;
    ``keep`` live to the end; ``size_of`` as for :func:`plan_memory`. Returns the offsets and the
    arena's size."""
    size = size_of or nbytes
    last_use: dict[Value, int] = {}
    for pos, v in enumerate(steps):
        for o in v.operands:
            last_use[o] = pos
    for v in keep:
        last_use[v] = len(steps)
    arena = _Arena()
    offsets: dict[Value, int] = {}
    for pos, v in enumerate(steps):
        offsets[v] = arena.alloc(size(v.type))
        for o in set(v.operands):
            if o in offsets and last_use.get(o) == pos:
                arena.release(offsets[o], size(o.type))
    return offsets, arena.top


def _views(steps: Sequence[Value], slots: Mapping[Value, Slot]) -> dict[Value, Value]:
    """The reshapes that can be their operand's memory: each maps to the value whose memory it is
    (through chains of reshapes), an arena value or an input, never a result the caller receives."""
    views: dict[Value, Value] = {}
    for v in steps:
        if v.op != "reshape" or v in slots or v.dtype != v.operands[0].dtype:
            continue
        root = views.get(v.operands[0], v.operands[0])
        if root.is_const or (root in slots and slots[root].kind != "input"):  # a constant's, an output's
            continue
        views[v] = root
    return views


def plan_memory(fn: Function, work: Mapping[Value, int] | None = None,
                size_of: Callable[[TensorType], int] | None = None, views: bool = False,
                laid_out: Mapping[Value, int] | None = None) -> MemoryPlan:
    """``work``: the work area (bytes) of each loop or cond group, by its first result; ``size_of``
    the bytes a value's slot takes (its size, by default; a function compiled for a shape class
    plans each value at the largest size its dims' constraints allow); ``views``: reshapes share
    their operand's memory (the emitter then runs no kernel for them); ``laid_out``: the bytes of
    values that kernels store in a layout larger than their type (a convolution's padded input)."""
    work = work or {}
    by_type = size_of or nbytes
    larger = laid_out or {}

    def size(v: Value) -> int:
        return larger.get(v, by_type(v.type))

    steps = ordered_steps(fn)
    slots: dict[Value, Slot] = {}
    for k, p in enumerate(fn.params):
        slots[p] = Slot("input", k)
    for v in fn.values():
        if v.is_const:
            slots[v] = Slot("const", 0)
    copies: list[tuple[Value, int]] = []
    for r, v in enumerate(fn.results):
        if v.is_param or v.is_const or v in slots:
            copies.append((v, r))
        else:
            slots[v] = Slot("output", r)
    view_of = _views(steps, slots) if views else {}

    last_use: dict[Value, int] = {}
    for pos, v in enumerate(steps):
        for o in v.operands:
            last_use[view_of.get(o, o)] = pos  # a view's readers keep the memory it is live
    # a loop's or cond's work area: from its first result until its last one (its members are adjacent)
    work_end = {first: max(pos for pos, v in enumerate(steps)
                           if _structured(v) and structured_group_key(v) == structured_group_key(first))
                for first in work}
    arena = _Arena()
    work_at: dict[Value, int] = {}
    open_work: dict[int, tuple[int, int]] = {}
    for pos, v in enumerate(steps):
        if v in view_of:
            slots[v] = slots[view_of[v]]
        elif v not in slots:
            slots[v] = Slot("arena", arena.alloc(size(v)))
        if v in work:
            work_at[v] = arena.alloc(work[v])
            open_work[work_end[v]] = (work_at[v], work[v])
        if pos in open_work:
            arena.release(*open_work.pop(pos))
        for o in {view_of.get(o, o) for o in v.operands}:
            s = slots.get(o)
            if s is not None and s.kind == "arena" and last_use.get(o) == pos:
                arena.release(s.index, size(o))
    return MemoryPlan(steps, slots, arena.top, tuple(copies), work_at, view_of)
