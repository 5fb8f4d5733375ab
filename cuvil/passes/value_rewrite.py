"""Rewrites as code: a pass that visits every value once, operands first, and may replace it.

Use :class:`ValueRewrite` when a rewrite is easier to write as a function of one value and its
already-rewritten operands than as a pattern (``cuvil.passes.rewrite``): one sweep, no fixpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir.builder import Builder
from cuvil.ir.module import Module
from cuvil.ir.rebuild import rebuild
from cuvil.ir.values import Value
from cuvil.passes.base import Pass, PassResult

__all__ = ["ValueRewrite", "rebuild"]


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
