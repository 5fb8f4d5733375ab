"""Regions: the body of a fused op, a loop or a branch, a single block of CIR over its own block arguments."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, param, walk


@dataclass(frozen=True, repr=False)
class Region:
    """Block arguments ``params`` (``param`` values) and the values the block yields: ``result``,
    then ``more`` (a loop body yields its new carried values and its scan slices; a fused body one value).
    A body refers only to its own arguments: constants enter as operands of the op that holds it."""

    params: tuple[Value, ...]
    result: Value
    more: tuple[Value, ...] = ()

    @property
    def results(self) -> tuple[Value, ...]:
        return (self.result, *self.more)

    @staticmethod
    def arg(index: int, type: TensorType) -> Value:
        return param(f"arg{index}", type)

    def ops(self) -> list[Value]:
        return [v for v in walk(self.results) if not v.is_param]

    def check(self) -> None:
        own = set(self.params)
        for v in walk(self.results):
            if v.is_const:
                raise ValueError("a region body may not refer to constants; pass them as operands")
            if v.is_param and v not in own:
                raise ValueError(f"region body refers to %{v.name}, which is not one of its arguments")

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        yields = f", {len(self.results)} results" if self.more else ""
        return f"region({len(self.params)} args, {len(self.ops())} ops{yields})"


def close_body(params: Sequence[Value], results: Sequence[Value]) -> tuple[Region, list[Value]]:
    """A region over ``params`` yielding ``results``, built by code that also read outer values
    (weights, constants, anything computed before the loop). Every value the body reads that does not
    depend on a parameter is captured: it becomes one more argument (after ``params``) and is returned,
    so the holder passes it as an operand and loop-invariant work stays outside the region."""
    own = set(params)
    inner: dict[Value, bool] = {}
    for v in walk(list(results)):
        inner[v] = v in own or any(inner[o] for o in v.operands)
    captured: list[Value] = []
    for v in walk(list(results)):
        if inner[v]:
            captured += [o for o in v.operands if not inner[o] and o not in captured]
    captured += [r for r in results if not inner[r] and r not in captured]
    args = [Region.arg(k, p.type) for k, p in enumerate([*params, *captured])]
    new = substitute(results, dict(zip([*params, *captured], args, strict=True)))
    region = Region(tuple(args), new[0], tuple(new[1:]))
    region.check()
    return region, captured


def substitute(roots: Sequence[Value], mapping: Mapping[Value, Value]) -> list[Value]:
    """``roots`` rebuilt with the values in ``mapping`` replaced (all at once: a value that is both
    replaced and a replacement is read as the original); values that reach none of them are kept."""
    memo: dict[Value, Value] = dict(mapping)
    for v in walk(list(roots)):
        if v not in memo:
            operands = tuple(memo[o] for o in v.operands)
            memo[v] = v if operands == v.operands else Value(v.op, operands, v.attr_dict, v.type)
    return [memo[r] for r in roots]


def close_branches(branches: Sequence[Sequence[Value]], outer: Collection[Value]) -> tuple[list[Region], list[Value]]:
    """Regions yielding each branch's ``results``, built by code that read ``outer`` values (those
    computed before the branches: they are captured, once, as arguments every region takes, in the
    order first read) and constants (captured too); everything else the branches computed stays
    inside, so only the branch a run takes does its work."""
    captured: list[Value] = []

    def outside(v: Value) -> bool:
        return v in outer or v.is_const or v.is_param

    for results in branches:
        for v in walk_inside(results, outside):
            captured += [o for o in v.operands if outside(o) and o not in captured]
        captured += [r for r in results if outside(r) and r not in captured]
    args = [Region.arg(k, c.type) for k, c in enumerate(captured)]
    regions = []
    for results in branches:
        new = substitute(results, dict(zip(captured, args, strict=True)))
        region = Region(tuple(args), new[0], tuple(new[1:]))
        region.check()
        regions.append(region)
    return regions, captured


def walk_inside(roots: Sequence[Value], outside: Callable[[Value], bool]) -> list[Value]:
    """The values ``roots`` reach without entering those ``outside`` says are (operands first)."""
    order: list[Value] = []
    seen: set[Value] = set()
    for root in roots:
        if outside(root) or root in seen:
            continue
        stack: list[tuple[Value, bool]] = [(root, False)]
        while stack:
            v, expanded = stack.pop()
            if expanded:
                order.append(v)
                continue
            if v in seen:
                continue
            seen.add(v)
            stack.append((v, True))
            stack.extend((o, False) for o in v.operands if not outside(o) and o not in seen)
    return order
