"""Structured control flow: ``loop``, a region run once per iteration over carried state, and
``cond``, one of two regions run on a run-time condition.

A loop has no element rule: its meaning is its body's meaning (the body ops' rules) applied
``trips`` times, which :func:`iterate` spells out once for every reading (the interpreter runs the
body's ops per iteration, the verifier's Z_p evaluation the same over residues; the code generator
emits that iteration as a real loop, and ``cuvil.ir.unroll`` writes it out, both tested against it;
the verifier pairs loops by their operands and bodies). Operands come in three groups, in order:

* ``carried`` initial values of the state, threaded through the iterations;
* ``scanned`` tensors whose leading dim is the trip count: iteration ``t`` reads slice ``[t]``;
* invariants (weights, constants) every iteration reads whole.

The body's arguments are ``(t: i64[], state..., slices..., invariants...)`` and it yields the new
state, then one slice per scan output; result ``output`` of the op is final state ``output`` (for
``output < carried``) or the stacked scan output ``output - carried`` (leading dim ``trips``).
``reverse`` runs ``t`` from ``trips - 1`` down to 0 (slices are still read and written at ``[t]``).
``stop`` (a carried bool scalar's position, or -1) makes it a while loop bounded by ``trips``: an
iteration runs only while that state is true (checked before each, the initial value first), so it
may end early; such a loop has no scan outputs (their length would be known only at run time).

A ``cond`` reads a boolean scalar ``pred`` and runs ``then_body`` when it is true, else
``else_body``, on the remaining operands (what the branches read from outside); both regions take
those operands as arguments and yield values of the same types; result ``output`` is the chosen
region's result ``output``. :func:`branch` is its one definition; the region not chosen is not
run (the code generator emits a real branch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cuvil.errors import BudgetError, ShapeError
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import REQUIRED, define
from cuvil.ir.region import Region, substitute
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

INDEX = TensorType(DType.i64, ())


def loop_groups(n_operands: int, carried: int, scanned: int) -> tuple[range, range, range]:
    """Operand positions of the carried, scanned and invariant groups."""
    return range(carried), range(carried, carried + scanned), range(carried + scanned, n_operands)


def loop_key(operands: Sequence[Value], attrs: Sequence[tuple[str, Any]]) -> tuple[object, ...]:
    """What the results of one loop share: operands and every attribute but ``output`` (readers that
    compute a loop once for all its results group them by it)."""
    return (tuple(operands), tuple((k, a) for k, a in attrs if k != "output"))


def scan_outputs(body: Region, carried: int) -> int:
    return len(body.results) - carried


def _loop_type(types: list[TensorType], body: Region, carried: int, scanned: int, trips: tuple[Dim, ...],
               reverse: bool, output: int, stop: int = -1) -> TensorType:
    if not isinstance(body, Region):
        raise TypeError(f"body must be a Region, got {type(body).__name__}")
    body.check()
    if len(trips) != 1:
        raise ValueError(f"trips is one dim, got {len(trips)}")
    (n,) = trips
    if isinstance(n, int) and n < 0:
        raise ValueError(f"a loop runs a non-negative number of times, not {n}")
    if carried < 0 or scanned < 0 or carried + scanned > len(types):
        raise ValueError(f"{carried} carried and {scanned} scanned operands of {len(types)}")
    if len(body.params) != 1 + len(types):
        raise ValueError(f"the body takes {len(body.params)} arguments; a loop over {len(types)} operands "
                         f"needs {1 + len(types)} (the iteration index first)")
    if body.params[0].type != INDEX:
        raise ValueError(f"the body's first argument is the iteration index (i64[]), not {body.params[0].type}")
    if len(body.results) < carried:
        raise ValueError(f"the body yields {len(body.results)} values for {carried} carried ones")
    cs, ss, _ = loop_groups(len(types), carried, scanned)
    for k, t in enumerate(types):
        p = body.params[1 + k].type
        want = TensorType(t.dtype, t.shape[1:]) if k in ss else t
        if k in ss and (not t.shape or t.shape[0] != n):
            raise ShapeError(f"scanned operand {k} is {t}; its leading dim must be the trip count {n}")
        if p != want:
            raise ShapeError(f"operand {k} is {t}, so the body's argument {k + 1} must be {want}, not {p}")
    for k in cs:
        if body.results[k].type != types[k]:
            raise ShapeError(f"the body yields {body.results[k].type} for carried value {k} of type {types[k]}")
    if not 0 <= output < len(body.results):
        raise ValueError(f"output {output} of a loop with {len(body.results)} results")
    if stop != -1:
        if not 0 <= stop < carried or types[stop] != TensorType(DType.bool, ()):
            raise ShapeError(f"stop must name a carried bool scalar, not operand {stop} of type "
                             f"{types[stop] if 0 <= stop < len(types) else None}")
        if len(body.results) > carried:
            raise ShapeError("a loop that may stop early has no scan outputs (their length would be known only "
                             "at run time)")
    r = body.results[output].type
    return r if output < carried else TensorType(r.dtype, (n, *r.shape))


def open_body(v: Value) -> tuple[list[Value], list[Value], list[Value]]:
    """A loop's body with its constant invariants read in place: ``(arguments, results, operands)``,
    one argument (renumbered from 0, the index first) per operand that is not a constant invariant.
    Passes then see the constants a body computes with (and fold them); the verifier compares two
    loops' bodies so, whatever order their invariants were captured in."""
    body: Region = v.attr("body")
    _, _, inv = loop_groups(len(v.operands), int(v.attr("carried")), int(v.attr("scanned")))
    mapping: dict[Value, Value] = {}
    kept_params, kept_operands = [body.params[0]], []
    for k, o in enumerate(v.operands):
        if k in inv and o.is_const:
            mapping[body.params[1 + k]] = o
        else:
            kept_params.append(body.params[1 + k])
            kept_operands.append(o)
    args = [Region.arg(j, p.type) for j, p in enumerate(kept_params)]
    mapping.update(zip(kept_params, args, strict=True))
    return args, substitute(body.results, mapping), kept_operands


def _no_rule(c: R.RuleCtx) -> R.Expr:
    raise NotImplementedError("a structured op has no element rule: its meaning is its regions' (a loop's "
                              "body iterated, cuvil.ir.ops.control.iterate; a cond's chosen branch, branch)")


BodyRunner = Callable[[Region, list[np.ndarray]], list[np.ndarray]]
"""Runs a body once on its arguments and returns what it yields (the interpreter's reading of the
body's ops, or another domain's: the verifier iterates the same loop over residues)."""

# the last loop or cond run, so the results of one op read one after another run its regions once
_last: list[tuple[tuple[Any, ...], tuple[Any, ...], list[np.ndarray]]] = []


def _run_once(key: tuple[Any, ...], held: Any, xs: Sequence[np.ndarray],
              run: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """``run()``'s results, or those of the last run when it had the same ``key`` and bit-for-bit the
    same operands. ``held`` (the regions) is kept so the ids in ``key`` stay unique; the operands are
    copied, so a caller that fills the same arrays with new values between calls is not answered
    from the cache."""
    if _last and _last[0][0] == key and _same_arrays(_last[0][1][1], xs):
        return _last[0][2]
    everything = run()
    _last[:] = [(key, (held, tuple(np.array(x, copy=True) for x in xs)), everything)]
    return everything


def iterate(xs: Sequence[np.ndarray], body: Region, carried: int, scanned: int, trips: int, reverse: bool,
            run_body: BodyRunner, stop: int = -1) -> list[np.ndarray]:
    """The loop's meaning, given a reading of its body: every result on concrete operands (the final
    state, then the stacked scan outputs). Scan outputs take the element type ``run_body`` returns.
    With ``stop``, an iteration runs only while that state is true (checked before it)."""
    cs, ss, inv = loop_groups(len(xs), carried, scanned)
    state = [np.asarray(xs[k]) for k in cs]
    outs: list[np.ndarray | None] = [None] * scan_outputs(body, carried)
    order = range(trips - 1, -1, -1) if reverse else range(trips)
    for t in order:
        if stop >= 0 and not bool(np.asarray(state[stop]).reshape(())):
            break
        args = [np.array(t, dtype=np.int64), *state, *(np.asarray(xs[k])[t] for k in ss),
                *(np.asarray(xs[k]) for k in inv)]
        results = run_body(body, args)
        state = [np.array(r, copy=True) for r in results[:carried]]
        for j, s in enumerate(results[carried:]):
            s = np.asarray(s)
            out = outs[j]
            if out is None:
                out = outs[j] = np.empty((trips, *s.shape), dtype=s.dtype)
            out[t] = s
    stacked = [o if o is not None else
               np.empty((0, *(int(d) for d in body.results[carried + j].type.shape)),
                        dtype=body.results[carried + j].dtype.np)
               for j, o in enumerate(outs)]
    return [*state, *stacked]


MAX_INTERPRETED_WORK = 1 << 34
"""Elements the interpreter may compute running one loop (iterations times the body's elements):
past it a loop is refused (``CUVIL-BUDGET``) instead of running for hours."""


def iterate_loop(xs: Sequence[np.ndarray], body: Region, carried: int, scanned: int, trips: int,
                 reverse: bool, *, use_fast_path: bool = True, stop: int = -1) -> list[np.ndarray]:
    """Every result of the loop on concrete arrays, the body's ops run by the interpreter."""
    key = (id(body), carried, scanned, trips, reverse, use_fast_path, stop)
    return _run_once(key, body, xs, lambda: _budgeted_iterate(xs, body, carried, scanned, trips, reverse,
                                                             use_fast_path, stop))


def _budgeted_iterate(xs: Sequence[np.ndarray], body: Region, carried: int, scanned: int, trips: int,
                      reverse: bool, use_fast_path: bool, stop: int) -> list[np.ndarray]:
    from cuvil.ir.evaluate import evaluate_region_results
    from cuvil.ir.types import bind_symbols

    env = bind_symbols([p.type for p in body.params[1:]], [np.shape(x)[1:] if k in range(carried, carried + scanned)
                                                          else np.shape(x) for k, x in enumerate(xs)])
    elements = sum(max(1, int(np.prod(v.type.concrete(env), dtype=np.int64))) for v in body.ops())
    if trips * elements > MAX_INTERPRETED_WORK:
        raise BudgetError(f"the reference interpreter would compute {trips * elements:.3g} elements running a "
                          f"loop of {trips} iterations (more than {MAX_INTERPRETED_WORK:.3g})", location="loop",
                          hint="run the compiled library instead, or the model at a smaller size")
    return iterate(xs, body, carried, scanned, trips, reverse,
                   lambda r, args: evaluate_region_results(r, args, use_fast_path=use_fast_path), stop)


def _same_arrays(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Bit for bit the same operands (NaN payloads and signed zeros included)."""
    return len(a) == len(b) and all(
        x.dtype == np.asarray(y).dtype and x.shape == np.shape(y) and x.tobytes() == np.asarray(y).tobytes()
        for x, y in zip(a, b, strict=True))


def _loop_numpy(xs: list[np.ndarray], out: TensorType, body: Region, carried: int, scanned: int,
                trips: tuple[int, ...], reverse: bool, output: int, stop: int = -1, use_fast_path: bool = True
                ) -> np.ndarray:
    return iterate_loop(xs, body, carried, scanned, int(trips[0]), reverse, use_fast_path=use_fast_path,
                        stop=stop)[output]


def _examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    """A running sum of scanned rows times an invariant scale, yielding its relu as a scan output;
    forward and reverse, each result."""
    from cuvil.ir.builder import Builder

    b = Builder()
    row = TensorType(DType.f32, (3,))
    t, acc, x, w = (Region.arg(0, INDEX), Region.arg(1, row), Region.arg(2, row), Region.arg(3, row))
    new = b.add(acc, b.mul(x, w))
    body = Region((t, acc, x, w), new, (b.relu(new),))
    xs = [rng.standard_normal(3).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32),
          rng.standard_normal(3).astype(np.float32)]
    cases = [(xs, {"body": body, "carried": 1, "scanned": 1, "trips": (4,), "output": o, "reverse": rev})
             for o in (0, 1) for rev in (False, True)]
    # a while loop: doubles its state until its sum passes a limit, at most 6 times
    acc2, go = Region.arg(1, row), Region.arg(2, TensorType(DType.bool, ()))
    limit = Region.arg(3, TensorType(DType.f32, ()))
    doubled = b.add(acc2, acc2)
    more = b.less(b.reduce_sum(b.abs(doubled), axes=[], keepdims=False), limit)
    wbody = Region((Region.arg(0, INDEX), acc2, go, limit), doubled, (more,))
    start = rng.uniform(0.1, 0.5, 3).astype(np.float32)
    for go0, lim in ((True, 10.0), (True, 1e6), (False, 10.0)):
        cases += [([start, np.array(go0), np.array(lim, np.float32)],
                   {"body": wbody, "carried": 2, "trips": (6,), "output": o, "stop": 1}) for o in (0, 1)]
    return cases


define("loop", ("*inputs",),
       attrs={"body": ("any", REQUIRED), "carried": ("int", REQUIRED), "scanned": ("int", 0),
              "trips": ("dims", REQUIRED), "reverse": ("bool", False), "output": ("int", 0), "stop": ("int", -1)},
       shape=_loop_type, rule=_no_rule, numpy=_loop_numpy, family="control", examples=_examples,
       precision_policy="keep-fp32", structured=True,
       doc="a region run trips times over carried state, scanned slices and invariants")


# --------------------------------------------------------------------------------------
# cond


def _cond_type(types: list[TensorType], then_body: Region, else_body: Region, output: int) -> TensorType:
    for name, body in (("then_body", then_body), ("else_body", else_body)):
        if not isinstance(body, Region):
            raise TypeError(f"{name} must be a Region, got {type(body).__name__}")
        body.check()
        if [p.type for p in body.params] != types[1:]:
            raise ShapeError(f"{name} takes {[str(p.type) for p in body.params]}; the cond's operands after "
                             f"the condition are {[str(t) for t in types[1:]]}")
    if not types or types[0] != TensorType(DType.bool, ()):
        raise ShapeError(f"a cond's first operand is its condition, a bool scalar, not {types[0] if types else None}")
    yields = ([r.type for r in then_body.results], [r.type for r in else_body.results])
    if yields[0] != yields[1]:
        raise ShapeError(f"the branches yield different types: {[str(t) for t in yields[0]]} and "
                         f"{[str(t) for t in yields[1]]}")
    if not 0 <= output < len(yields[0]):
        raise ValueError(f"output {output} of a cond with {len(yields[0])} results")
    return yields[0][output]


def branch(xs: Sequence[np.ndarray], then_body: Region, else_body: Region, run_body: BodyRunner
           ) -> list[np.ndarray]:
    """The cond's meaning, given a reading of a region: every result of the region ``xs[0]`` chooses,
    run on the other operands; the other region is not run."""
    chosen = then_body if bool(np.asarray(xs[0]).reshape(())) else else_body
    return run_body(chosen, [np.asarray(x) for x in xs[1:]])


def chosen_results(xs: Sequence[np.ndarray], then_body: Region, else_body: Region, *,
                   use_fast_path: bool = True) -> list[np.ndarray]:
    """Every result of a cond on concrete arrays, the chosen region's ops run by the interpreter (once
    for all its results read one after another)."""
    from cuvil.ir.evaluate import evaluate_region_results

    key = ("cond", id(then_body), id(else_body), use_fast_path)
    return _run_once(key, (then_body, else_body), xs, lambda: branch(
        xs, then_body, else_body, lambda r, args: evaluate_region_results(r, args, use_fast_path=use_fast_path)))


def _cond_numpy(xs: list[np.ndarray], out: TensorType, then_body: Region, else_body: Region, output: int,
                use_fast_path: bool = True) -> np.ndarray:
    return chosen_results(xs, then_body, else_body, use_fast_path=use_fast_path)[output]


def open_regions(v: Value) -> tuple[list[tuple[list[Value], list[Value]]], list[Value]]:
    """A structured op's regions with its constant operands that every iteration or branch reads
    whole (a loop's invariants, a cond's captured values) read in place: ``([(arguments, results)
    per region], operands)``, the operands those of the remaining arguments (a loop's iteration
    index, first, has none). Passes then see the constants a region computes with; the verifier
    compares two ops' regions so, whatever order their constants were captured in."""
    if v.op == "loop":
        args, results, operands = open_body(v)
        return [(args, results)], operands
    regions: list[Region] = [v.attr("then_body"), v.attr("else_body")]
    mappings: list[dict[Value, Value]] = [{} for _ in regions]
    kept: list[Value] = []
    for k, o in enumerate(v.operands[1:]):
        if o.is_const:
            for m, r in zip(mappings, regions, strict=True):
                m[r.params[k]] = o
        else:
            kept.append(o)
    opened: list[tuple[list[Value], list[Value]]] = []
    for m, r in zip(mappings, regions, strict=True):
        kept_params = [p for p in r.params if p not in m]
        args = [Region.arg(j, p.type) for j, p in enumerate(kept_params)]
        m.update(zip(kept_params, args, strict=True))
        opened.append((args, substitute(r.results, m)))
    return opened, [v.operands[0], *kept]


def _cond_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    """relu(x * w) and x - w both yielded, or x * w and tanh(w); each condition, each result."""
    from cuvil.ir.builder import Builder

    b = Builder()
    row = TensorType(DType.f32, (3,))
    x, w = Region.arg(0, row), Region.arg(1, row)
    then_body = Region((x, w), b.relu(b.mul(x, w)), (b.sub(x, w),))
    else_body = Region((x, w), b.mul(x, w), (b.tanh(w),))
    xs = [rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    return [([np.array(p), *xs], {"then_body": then_body, "else_body": else_body, "output": o})
            for p in (True, False) for o in (0, 1)]


define("cond", ("pred", "*inputs"),
       attrs={"then_body": ("any", REQUIRED), "else_body": ("any", REQUIRED), "output": ("int", 0)},
       shape=_cond_type, rule=_no_rule, numpy=_cond_numpy, family="control", examples=_cond_examples,
       precision_policy="keep-fp32", structured=True,
       doc="then_body or else_body, chosen by a bool scalar, run on the other operands")
