"""Static memory planning: every intermediate value gets a buffer in one arena, and values
whose lifetimes do not overlap share a buffer (greedy by size: the largest values are
placed first, each into the smallest free buffer, which is never smaller than it).

A reshape of an intermediate is a view of its operand's buffer (row-major data does not
move). Sizes with symbolic dims use the upper bound the function's constraints give;
when a symbol has no upper bound the value goes to a dynamic pool of buffers allocated at
call time, shared only among values of the very same symbolic size. The plan is recorded
as JSON in ``Module.metadata["memory-plan"]``; no value changes (``exact``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from cuvil.ir.module import Function, Module
from cuvil.ir.symbolic import Dim, evaluate_dim, free_symbols
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass, PassResult, register

METADATA_KEY = "memory-plan"
_MAX_SYMBOLS = 10


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _bytes(v: Value) -> Dim:
    return v.type.numel() * max(v.dtype.bits // 8, 1)


def upper_bound(size: Dim, fn: Function) -> int | None:
    """The largest value ``size`` takes under ``fn``'s constraints (None if a symbol is unbounded).
    Sizes are monotone in each dim, so the maximum over the corners of the box is the maximum."""
    if isinstance(size, int):
        return size
    names = sorted(free_symbols(size))
    bounds = [fn.constraint(s) for s in names]
    if any(c.hi is None for c in bounds):
        return None
    if len(names) > _MAX_SYMBOLS:
        corners: list[tuple[int, ...]] = [tuple(int(c.hi or 0) for c in bounds)]
    else:
        corners = list(itertools.product(*[sorted({c.lo, int(c.hi or 0)}) for c in bounds]))
    best = 0
    for corner in corners:
        best = max(best, evaluate_dim(size, dict(zip(names, corner, strict=True))))
    return best


@dataclass
class _Buffer:
    id: int
    size: int | str
    pool: str  # "arena" or the symbolic size of a dynamic pool
    intervals: list[tuple[int, int]] = field(default_factory=list)
    offset: int | None = None

    def free_during(self, start: int, end: int) -> bool:
        return all(end < s or e < start for s, e in self.intervals)


def plan_function(fn: Function, alignment: int = 64, alias_reshapes: bool = True) -> dict[str, Any]:
    """The buffer assignment of one function (see the module docstring for the JSON layout)."""
    values = fn.values()
    order = {v: t for t, v in enumerate(values)}
    results = set(fn.results)
    last_use: dict[Value, int] = {}
    for v in values:
        for o in v.operands:
            last_use[o] = max(last_use.get(o, -1), order[v])

    def planned(v: Value) -> bool:
        return not (v.is_param or v.is_const or v in results)

    base: dict[Value, Value] = {}
    for v in values:
        if not planned(v):
            continue
        src = v.operands[0] if v.op == "reshape" else None
        base[v] = base[src] if alias_reshapes and src is not None and planned(src) else v

    live: dict[Value, tuple[int, int]] = {}
    for v, root in base.items():
        start, end = live.get(root, (order[root], order[root]))
        live[root] = (start, max(end, last_use.get(v, order[v])))

    sizes: dict[Value, int | None] = {root: upper_bound(_bytes(root), fn) for root in live}
    buffers: list[_Buffer] = []
    assigned: dict[Value, _Buffer] = {}
    static = sorted((r for r in live if sizes[r] is not None), key=lambda r: (-(sizes[r] or 0), order[r]))
    dynamic = sorted((r for r in live if sizes[r] is None), key=lambda r: order[r])
    for root in static:
        need = _align(sizes[root] or 0, alignment)
        start, end = live[root]
        fits = [b for b in buffers if b.pool == "arena" and b.free_during(start, end)]
        buf = min(fits, key=lambda b: (b.size, b.id)) if fits else None
        if buf is None:
            buf = _Buffer(len(buffers), need, "arena")
            buffers.append(buf)
        buf.intervals.append((start, end))
        assigned[root] = buf
    for root in dynamic:
        key = str(_bytes(root))
        start, end = live[root]
        fits = [b for b in buffers if b.pool == key and b.free_during(start, end)]
        buf = fits[0] if fits else None
        if buf is None:
            buf = _Buffer(len(buffers), key, key)
            buffers.append(buf)
        buf.intervals.append((start, end))
        assigned[root] = buf

    offset = 0
    for buf in buffers:
        if buf.pool == "arena":
            buf.offset = offset
            offset += int(buf.size)

    entries: list[dict[str, Any]] = []
    for v in values:
        entry: dict[str, Any] = {"index": order[v], "op": v.op, "type": str(v.type), "bytes": _json_dim(_bytes(v))}
        if v.is_param:
            entry.update(storage="input", name=v.name)
        elif v.is_const:
            entry.update(storage="constant", hash=v.const_hash)
        elif v in results:
            entry.update(storage="output", result=fn.results.index(v))
        else:
            root = base[v]
            buf = assigned[root]
            entry.update(storage="arena" if buf.pool == "arena" else "dynamic", buffer=buf.id, offset=buf.offset,
                         live=list(live[root]), alias_of=None if root is v else order[root])
        entries.append(entry)
    return {
        "arena_bytes": offset,
        "naive_bytes": sum(_align(s or 0, alignment) for r, s in sizes.items() if s is not None),
        "buffers": [{"id": b.id, "offset": b.offset, "size": b.size, "pool": b.pool, "values": len(b.intervals)}
                    for b in buffers],
        "values": entries,
    }


def _json_dim(d: Dim) -> int | str:
    return d if isinstance(d, int) else str(d)


def check_plan(plan: dict[str, Any]) -> None:
    """Raise ``AssertionError`` if two values live at the same time share bytes of the arena
    (views of one buffer excepted) or a value does not fit its buffer."""
    sizes = {b["id"]: b["size"] for b in plan["buffers"]}
    placed = [e for e in plan["values"] if e["storage"] in ("arena", "dynamic")]
    for e in placed:
        if isinstance(e["bytes"], int) and isinstance(sizes[e["buffer"]], int):
            assert e["bytes"] <= sizes[e["buffer"]], f"value {e['index']} does not fit buffer {e['buffer']}"
    for a, b in itertools.combinations(placed, 2):
        ra = a["index"] if a["alias_of"] is None else a["alias_of"]
        rb = b["index"] if b["alias_of"] is None else b["alias_of"]
        if ra == rb or a["buffer"] != b["buffer"]:
            continue
        (s1, e1), (s2, e2) = a["live"], b["live"]
        assert e1 < s2 or e2 < s1, f"values {a['index']} and {b['index']} share buffer {a['buffer']} while both live"


@register
@dataclass(frozen=True)
class PlanMemory(Pass):
    name = "plan-memory"
    contract = Contract.EXACT
    description = "liveness-based buffer assignment for intermediates, recorded in metadata['memory-plan']"

    alignment: int = 64
    alias_reshapes: bool = True

    def run(self, module: Module) -> PassResult:
        plans = {fn.name: plan_function(fn, self.alignment, self.alias_reshapes) for fn in module.functions}
        text = json.dumps({"version": 1, "alignment": self.alignment, "functions": plans}, sort_keys=True)
        if module.metadata.get(METADATA_KEY) == text:
            return PassResult(module, False)
        meta = {**module.metadata, METADATA_KEY: text}
        notes = tuple(f"@{name}: arena {p['arena_bytes']} bytes (without reuse {p['naive_bytes']})"
                      for name, p in plans.items())
        return PassResult(Module(module.functions, module.constants, meta), True, notes)
