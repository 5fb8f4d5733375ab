"""Loops unrolled: each ``loop`` with a concrete trip count replaced by its body applied once per
iteration, in :func:`cuvil.ir.ops.control.iterate`'s order, the state threaded through and the scan
outputs stacked. Analyses that read element rules (the overflow prober) see every iteration's ops
this way; tests check that the unrolled function computes what the loop does, bit for bit."""

from __future__ import annotations

from cuvil.errors import BudgetError, UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.ops.control import loop_groups, loop_key
from cuvil.ir.rebuild import rebuild
from cuvil.ir.region import substitute
from cuvil.ir.values import Value

DEFAULT_BUDGET = 200_000
"""Ops an unrolling may create (iterations times body ops, summed over the loops)."""


def has_loops(fn: Function) -> bool:
    return any(v.op == "loop" for v in fn.ops())


def module_has_loops(module: Module) -> bool:
    return any(has_loops(fn) for fn in module.functions)


def module_has_regions(module: Module) -> bool:
    """Whether a function holds a loop or a cond (an op whose meaning is its regions')."""
    return any(v.op in ("loop", "cond") for fn in module.functions for v in fn.ops())


def unroll_module(module: Module, budget: int = DEFAULT_BUDGET, *, partial: bool = False) -> Module:
    """``module`` with every loop of its functions unrolled (see :func:`unroll_function`)."""
    if not module_has_loops(module):
        return module
    b = Builder(module.constants)
    fns = [unroll_function(fn, b, budget, partial=partial) for fn in module.functions]
    return module.replace(functions=fns, constants=b.constants)


def unroll_function(fn: Function, b: Builder, budget: int = DEFAULT_BUDGET, *, partial: bool = False) -> Function:
    """``fn`` without loops. A loop over a symbolic number of iterations, or more ops than ``budget``
    in all, is refused (the caller says what it needed the unrolling for); with ``partial`` it stays
    a loop instead."""
    new: dict[Value, Value] = {}
    groups: dict[tuple[object, ...], list[Value]] = {}
    spent = 0
    for v in fn.values():
        if v.is_param or v.is_const:
            new[v] = v
            continue
        operands = [new[o] for o in v.operands]
        if v.op != "loop":
            new[v] = b.op(v.op, *operands, **v.attr_dict)
            continue
        key = loop_key(operands, v.attrs)
        if key not in groups:
            trips = v.attr("trips")[0]
            cost = trips * max(1, len(v.attr("body").ops())) if isinstance(trips, int) else None
            if int(v.attr("stop")) >= 0:  # how many iterations run is known only at run time
                if not partial:
                    raise UnsupportedOpError("a while loop (one that may stop early) cannot be unrolled",
                                             location="loop", hint="its iteration count depends on the data")
                groups[key] = []
            elif cost is None or spent + cost > budget:
                if partial:
                    groups[key] = []
                elif cost is None:
                    raise UnsupportedOpError(f"a loop over {trips} iterations cannot be unrolled",
                                             location="loop", hint="give the dims concrete sizes first")
                else:
                    raise BudgetError(f"unrolling the loops would create more than {budget} ops",
                                      location="loop", hint="analyse the model at shorter sequence lengths")
            else:
                spent += cost
                groups[key] = _unrolled(b, operands, v, trips)
        results = groups[key]
        new[v] = results[int(v.attr("output"))] if results else b.op(v.op, *operands, **v.attr_dict)
    return Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names, fn.constraints)


def _unrolled(b: Builder, operands: list[Value], loop: Value, trips: int) -> list[Value]:
    """Every result of one loop, unrolled."""
    body = loop.attr("body")
    carried, scanned = int(loop.attr("carried")), int(loop.attr("scanned"))
    cs, ss, inv = loop_groups(len(operands), carried, scanned)
    state = [operands[k] for k in cs]
    slices: list[list[Value | None]] = [[None] * trips for _ in range(len(body.results) - carried)]
    for t in (range(trips - 1, -1, -1) if bool(loop.attr("reverse")) else range(trips)):
        index = b.scalar(t, body.params[0].dtype)
        args = [index, *state, *(b.gather(operands[k], index, axis=0) for k in ss), *(operands[k] for k in inv)]
        results = substitute(body.results, dict(zip(body.params, args, strict=True)))
        state = results[:carried]
        for j, y in enumerate(results[carried:]):
            slices[j][t] = y
    stacked = []
    for j, per_t in enumerate(slices):
        out_type = body.results[carried + j].type
        if not per_t:
            stacked.append(b.fill(shape=[0, *out_type.shape], value=0, dtype=out_type.dtype))
            continue
        rows = [b.reshape(y, shape=[1, *out_type.shape]) for y in per_t if y is not None]
        stacked.append(rows[0] if len(rows) == 1 else b.concat(*rows, axis=0))
    return [*state, *stacked]


def flatten_conds(module: Module) -> Module:
    """``module`` with each ``cond`` replaced by both its branches, inlined, and a ``where`` on the
    condition choosing between their results: the same values for every input, computed without
    control flow (both branches run). What analyses that bound every op by its rule read (the
    overflow prober: a bound of the ``where`` covers both branches). A cond nested in a branch is
    flattened too; a loop in a branch stays a loop."""
    while any(v.op == "cond" for fn in module.functions for v in fn.ops()):
        module = _flatten_outer_conds(module)
    return module


def _flatten_outer_conds(module: Module) -> Module:
    def flattened(fn: Function, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op != "cond":
            return None
        k = int(v.attr("output"))
        picks = [substitute([body.results[k]], dict(zip(body.params, operands[1:], strict=True)))[0]
                 for body in (v.attr("then_body"), v.attr("else_body"))]
        return b.where(operands[0], *picks)

    return rebuild(module, flattened)
