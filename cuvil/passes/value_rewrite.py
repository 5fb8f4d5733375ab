"""Rewrites as code: a pass that visits every value once, operands first, and may replace it.

Use :class:`ValueRewrite` when a rewrite is easier to write as a function of one value and its
already-rewritten operands than as a pattern (``cuvil.passes.rewrite``): one sweep, no fixpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from cuvil.passes.base import Pass, PassResult


@dataclass(frozen=True)
class ValueRewrite(Pass):
    """A pass that rebuilds every function bottom-up, asking ``rewrite`` about each op value.

    Subclasses set ``name`` and ``contract`` and override :meth:`rewrite`. Values ``rewrite``
    keeps are rebuilt on the rewritten operands, so a replacement made low in the graph reaches
    every user. The result reports no change when every function came out identical.
    """

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        """A replacement for ``v``, or None to keep it.

        ``operands`` are ``v``'s operands as already rewritten (read them, not ``v.operands``);
        ``b`` builds new values and reads constant data (``b.data(c)``) for the whole module.
        A replacement must have ``v``'s type: the verifier refutes a changed result type.
        """
        raise NotImplementedError

    def run(self, module: Module) -> PassResult:
        out = rebuild(module, lambda fn, v, operands, b: self.rewrite(v, operands, b))
        return PassResult(out, out is not module)


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
