"""A module rebuilt bottom-up, each value on its rebuilt operands, where a callback may replace it:
the one walk passes, the unrolling of loops and the flattening of conds share."""

from __future__ import annotations

from collections.abc import Callable

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value

Replacement = Callable[[Function, Value, list[Value], Builder], "Value | None"]


def rebuild(module: Module, replace: Replacement) -> Module:
    """Every function of ``module`` rebuilt bottom-up: ``replace(fn, v, operands, b)`` gives a value for
    ``v`` (its operands already rebuilt) or None to rebuild it as it was on them. ``module`` itself
    when every function comes out identical."""
    b = Builder(module.constants)
    fns: list[Function] = []
    for fn in module.functions:
        new: dict[Value, Value] = {}
        for v in fn.values():
            if v.is_param or v.is_const:
                new[v] = v
                continue
            operands = [new[o] for o in v.operands]
            out = replace(fn, v, operands, b)
            new[v] = out if out is not None else b.op(v.op, *operands, **v.attr_dict)
        fns.append(Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names, fn.constraints))
    if tuple(fns) == module.functions:
        return module
    return module.replace(functions=fns, constants=b.constants)
