"""Passes inside loop bodies and branches: a pass runs on each region of a ``loop`` or ``cond`` as a
function of the region's arguments, and the op is rebuilt around what comes out. Whatever the pass
leaves in a loop body that depends on no argument (a folded constant, a value of constants only) is
captured as a loop invariant, so the body stays closed and that work runs once, outside the loop; a
branch captures the constants it computes with. The verifier proves each rewritten region equal to
the old one as a function (``verify.obligations.BodyProofs``)."""

from __future__ import annotations

from collections.abc import Callable

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.ops.control import open_body, open_regions
from cuvil.ir.region import close_body, close_branches, substitute
from cuvil.ir.unroll import module_has_regions
from cuvil.ir.values import Value
from cuvil.passes.base import Pass, PassResult
from cuvil.passes.value_rewrite import rebuild

BODY_FUNCTION = "loop_body"


def enter_loop_bodies(p: Pass, module: Module, run: Callable[[Pass, Module], PassResult]) -> Module:
    """``module`` with ``p`` applied (through ``run``) inside every loop body and branch, innermost
    first. The pass sees a region with its constant operands in place (``open_regions``), so it can
    fold them."""
    done: dict[Value, Value] = {}

    def inside(fn: Function, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op not in ("loop", "cond"):
            return None
        op = b.op(v.op, *operands, **v.attr_dict)
        if op not in done:
            done[op] = (_rewrite_loop if v.op == "loop" else _rewrite_cond)(p, op, fn, b, run)
        return done[op]

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
    if module_has_regions(out):
        out = enter_loop_bodies(p, out, run)
    fn = out.functions[0]
    if fn == inner.functions[0]:
        return loop
    b.constants.update(out.constants)
    body, captured = close_body(fn.params, fn.results)
    return b.op("loop", *operands, *captured, **{**loop.attr_dict, "body": body})


def _rewrite_region(p: Pass, args: list[Value], results: list[Value], outer: Function, b: Builder,
                    run: Callable[[Pass, Module], PassResult]) -> Function:
    inner = Module((body_function(args, results, outer),), b.constants)
    out = run(p, inner).module
    if module_has_regions(out):
        out = enter_loop_bodies(p, out, run)
    b.constants.update(out.constants)
    return out.functions[0]


def _rewrite_cond(p: Pass, cond: Value, outer: Function, b: Builder, run: Callable[[Pass, Module], PassResult]
                  ) -> Value:
    """Both branches rewritten; the cond rebuilt over what they read (its operands, the constants)."""
    regions, operands = open_regions(cond)
    pred, kept = operands[0], operands[1:]
    fns = [_rewrite_region(p, args, results, outer, b, run) for args, results in regions]
    if all(fn.results == tuple(results) for fn, (_, results) in zip(fns, regions, strict=True)):
        return cond
    branches = [substitute(fn.results, dict(zip(fn.params, kept, strict=True))) for fn in fns]
    new, captured = close_branches(branches, set(kept))
    return b.op("cond", pred, *captured, **{**cond.attr_dict, "then_body": new[0], "else_body": new[1]})
