"""The static memory plan: where every value of a function lives while it runs.

Inputs and constants stay where they are; a result is computed straight into the
caller's output buffer; every other value gets a 64-byte aligned slice of one arena,
reused once the value is dead (first fit, by liveness). An op's result never shares
memory with its operands, which is what lets kernels mark their pointers ``noalias``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.codegen.abi import ARENA_ALIGN
from cuvil.codegen.lower_rule import static_shape
from cuvil.ir.module import Function
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


def plan_memory(fn: Function) -> MemoryPlan:
    steps = tuple(fn.ops())
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

    last_use: dict[Value, int] = {}
    for pos, v in enumerate(steps):
        for o in v.operands:
            last_use[o] = pos
    arena = _Arena()
    for pos, v in enumerate(steps):
        if v not in slots:
            slots[v] = Slot("arena", arena.alloc(nbytes(v.type)))
        for o in set(v.operands):
            s = slots.get(o)
            if s is not None and s.kind == "arena" and last_use.get(o) == pos:
                arena.release(s.index, nbytes(o.type))
    return MemoryPlan(steps, slots, arena.top, tuple(copies))
