"""The values a walk down the operand graph reaches, stopping where the caller says.

Cones, back-substitution regions and upstream sites are all such walks: what differs is which
operands each value leads on to (all, the live ones, none at a leaf or a site).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cuvil.ir.values import Value


def reachable(roots: Iterable[Value], step: Callable[[Value], Iterable[Value]]) -> list[Value]:
    """Every value reachable from ``roots``, each once, in the depth-first order they are first met.
    ``step(v)`` gives the values to go on to from ``v`` (none: the walk stops there); it is called
    once per value reached, so it may also record what it sees."""
    seen: set[Value] = set()
    order: list[Value] = []
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        order.append(v)
        stack.extend(step(v))
    return order
