"""Passes inside loop bodies: a pass runs on each loop's body as a function of the body's arguments,
and the loop is rebuilt around what comes out. Whatever the pass leaves in the body that depends on
no argument (a folded constant, a value of constants only) is captured as a loop invariant, so the
body stays closed and that work runs once, outside the loop. The verifier proves the rewritten body
equal to the old one as a function (``verify.obligations.BodyProofs``)."""

from __future__ import annotations

from collections.abc import Callable

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.ops.control import open_body
from cuvil.ir.region import close_body
from cuvil.ir.unroll import module_has_loops
from cuvil.ir.values import Value
from cuvil.passes.base import Pass, PassResult
from cuvil.passes.value_rewrite import rebuild

BODY_FUNCTION = "loop_body"


def enter_loop_bodies(p: Pass, module: Module, run: Callable[[Pass, Module], PassResult]) -> Module:
    """``module`` with ``p`` applied (through ``run``) inside every loop body, innermost first. The
    pass sees a body with its constant invariants in place (``open_body``), so it can fold them."""
    done: dict[Value, Value] = {}

    def inside(fn: Function, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "loop":
            return None
        loop = b.op(v.op, *operands, **v.attr_dict)
        if loop not in done:
            done[loop] = _rewrite_loop(p, loop, fn, b, run)
        return done[loop]

    return rebuild(module, inside)


def body_function(args: list[Value], results: list[Value], outer: Function) -> Function:
    """A body as a function: its arguments in, what it yields out, the outer constraints on its dims."""
    symbols = set().union(*(a.type.symbols() for a in args))
    return Function(BODY_FUNCTION, tuple(args), tuple(results), tuple(f"yield{k}" for k in range(len(results))),
                    tuple(c for c in outer.constraints if c.symbol in symbols))


def _rewrite_loop(p: Pass, loop: Value, outer: Function, b: Builder, run: Callable[[Pass, Module], PassResult]
                  ) -> Value:
    args, results, operands = open_body(loop)
    inner = Module((body_function(args, results, outer),), b.constants)
    out = run(p, inner).module
    if module_has_loops(out):
        out = enter_loop_bodies(p, out, run)
    fn = out.functions[0]
    if fn == inner.functions[0]:
        return loop
    b.constants.update(out.constants)
    body, captured = close_body(fn.params, fn.results)
    return b.op("loop", *operands, *captured, **{**loop.attr_dict, "body": body})
