"""ONNX control flow: Dropout (inference), If (the branch a compile-time condition selects, or one
CIR ``cond`` over both), Loop/Scan unrolled over a compile-time trip count or, over a symbolic one,
imported as one CIR ``loop``; a Loop whose condition only a run knows becomes a while ``loop``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from cuvil.errors import CuvilError, UnsupportedOpError
from cuvil.frontend.onnx_node import Entity, NodeCtx, StaticInputRequired, onnx_op
from cuvil.frontend.onnx_ops.blocks import MAX_UNROLL, block_args, fill, index_const, scalar, stack, static_scalar, take
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.region import close_body, close_branches
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@onnx_op("Dropout", emits=("fill",))
def dropout(ctx: NodeCtx) -> list[Value | None]:
    """Identity at inference; training mode is only deterministic with ratio 0."""
    x = ctx.input(0)
    training = ctx.opset >= 12 and ctx.has_input(2) and bool(static_scalar(ctx, 2))
    if training:
        ratio = float(static_scalar(ctx, 1)) if ctx.has_input(1) else 0.5
        if ratio != 0.0:
            raise ctx.unsupported("training mode with a non-zero ratio draws random masks")
    outs: list[Value | None] = [x]
    if ctx.num_outputs > 1 and ctx.node.output[1]:
        mask_dtype = DType.bool if ctx.opset >= 10 else x.dtype
        outs.append(fill(ctx.b, x.shape, True if mask_dtype is DType.bool else 1, mask_dtype))
    return outs


@onnx_op("If", emits=("cond", "reshape"))
def if_(ctx: NodeCtx) -> list[Entity]:
    """Inline the branch a compile-time condition selects; on a condition only a run knows, one
    ``cond`` over both branches (each yielding tensors of the same types)."""
    try:
        cond = np.asarray(ctx.static(0))
    except StaticInputRequired as e:
        return _run_time_if(ctx, e)
    if cond.size != 1:
        raise ctx.unsupported(f"the condition must have one element, got shape {cond.shape}")
    branch = ctx.attr("then_branch") if bool(cond.reshape(())) else ctx.attr("else_branch")
    return ctx.imp.import_subgraph(branch)


def _run_time_if(ctx: NodeCtx, needed: StaticInputRequired) -> list[Entity]:
    """Both branches imported, each into a region of one ``cond``. Branches that yield sequences, or
    tensors of other types in the two, cannot share one: the condition is then needed at compile time
    (``needed`` is raised, so a caller that can bind the input's value does)."""
    pred = ctx.input(0)
    if pred.dtype is not DType.bool or pred.type.numel() != 1:
        raise ctx.unsupported(f"the condition must be one bool, got {pred.type}")
    outer = ctx.imp.scope_values()
    outs = [ctx.imp.import_subgraph(ctx.attr(name)) for name in ("then_branch", "else_branch")]
    tensors = [[v for v in o if isinstance(v, Value)] for o in outs]
    if any(len(t) != len(o) for t, o in zip(tensors, outs, strict=True)) or \
            [v.type for v in tensors[0]] != [v.type for v in tensors[1]] or not tensors[0]:
        raise needed
    regions, captured = close_branches(tensors, outer)
    if pred.type.rank:
        pred = ctx.b.reshape(pred, shape=[])
    attrs = {"then_body": regions[0], "else_body": regions[1]}
    return [ctx.b.cond(pred, *captured, **attrs, output=k) for k in range(len(tensors[0]))]


@onnx_op("Loop", emits=("concat", "reshape", "loop"))
def loop(ctx: NodeCtx) -> Sequence[Entity]:
    """Unroll a loop whose trip count and continuation condition are known at compile time; a trip
    count given by symbolic dims becomes one ``loop``, and a condition only a run knows (the initial
    one or the body's) a while ``loop`` bounded by the trip count."""
    body = ctx.attr("body")
    count = static_scalar(ctx, 0, symbolic=True) if ctx.has_input(0) else None
    carried: list[Entity] = [ctx.entity(i) for i in range(2, len(ctx.inputs))]
    try:
        cond = bool(static_scalar(ctx, 1)) if ctx.has_input(1) else True
    except UnsupportedOpError as needed:  # a run-time initial condition
        return _while_loop(ctx, body, count, carried, needed)
    if isinstance(count, Sym) and cond:
        tensors = [v for v in carried if isinstance(v, Value)]
        if len(tensors) != len(carried):
            raise ctx.unsupported("a loop of symbolic length cannot carry sequences or optionals")
        return _counted_loop(ctx, body, count, tensors, ctx.has_input(1))
    if count is not None and not isinstance(count, (int, float, np.integer, np.floating)):
        raise ctx.unsupported(f"a trip count of {count}")
    trip = int(count) if count is not None else None
    if trip is not None and cond and _runs_every_trip(ctx.node, body):
        nested = unrolled_at_least(body, lambda t: ctx.imp.tensor_to_numpy(t, ctx.location))
        if nested:  # (a single loop's length has its own limit, MAX_UNROLL, checked as it unrolls)
            ctx.imp.expect_unroll(trip * (1 + nested), ctx.location)
    n_scan = len(body.output) - 1 - len(carried)
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    initial = list(carried)
    i = 0
    while cond and (trip is None or i < trip):
        if i >= MAX_UNROLL:
            raise ctx.unsupported(f"more than {MAX_UNROLL} iterations cannot be unrolled")
        ctx.imp.charge_unroll(1, ctx.location)
        outs = ctx.imp.import_subgraph(body, [index_const(ctx.b, i), scalar(ctx.b, True, DType.bool), *carried])
        if ctx.has_input(1):  # without an initial condition, the body's is ignored (a for loop)
            try:
                cond = bool(np.asarray(ctx.imp.static_value(outs[0], ctx.location)).reshape(()))
            except UnsupportedOpError as needed:  # the body decides at run time whether to go on
                return _while_loop(ctx, body, trip, initial, needed)
        carried = outs[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            if not isinstance(v, Value):
                raise ctx.unsupported("a scan output that is not a tensor")
            scans[k].append(v)
        i += 1
    if n_scan and i == 0:
        raise ctx.unsupported("a loop that runs zero times has scan outputs of unknown shape")
    return [*carried, *(stack(ctx.b, s, 0) for s in scans)]


def unrolled_at_least(graph: onnx.GraphProto, read: Callable[[onnx.TensorProto], np.ndarray]) -> int:
    """A lower bound on the loop iterations importing ``graph`` once unrolls: its Loops that run every trip of
    a count written in the graph itself (a Constant or an initializer), each with its own body's bound. Loops
    it cannot bound count 0, so the bound never refuses a model that would have fit. ``read``: the importer's
    reading of a tensor (a malformed one is the coded error the import would raise later)."""
    loops = [n for n in graph.node if n.op_type == "Loop"]
    wanted = {name for n in loops for name in n.input[:2] if name}  # (only these are read: bodies may hold big ones)
    known: dict[str, np.ndarray] = {t.name: read(t) for t in graph.initializer if t.name in wanted}
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and node.output[0] in wanted:
            known[node.output[0]] = read(value)
    total = 0
    for node in loops:
        if not node.input or not node.input[0]:
            continue
        trip, start = known.get(node.input[0]), known.get(node.input[1]) if len(node.input) > 1 else None
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if trip is None or trip.size != 1 or body is None or trip.dtype.kind not in "iu":
            continue
        if len(node.input) > 1 and node.input[1] and (start is None or start.size != 1 or not start.reshape(())):
            continue
        if _runs_every_trip(node, body):
            total += max(int(trip.reshape(())), 0) * (1 + unrolled_at_least(body, read))
    return total


def _runs_every_trip(node: onnx.NodeProto, body: onnx.GraphProto) -> bool:
    """Whether a Loop whose initial condition holds runs all its trips: it has no condition input (a for
    loop), or its body passes its condition on unchanged (as PyTorch exports a for loop)."""
    if len(node.input) < 2 or not node.input[1]:
        return True
    if len(body.input) < 2 or not body.output:
        return False
    name, passed = body.output[0].name, body.input[1].name
    if name == passed:
        return True
    return any(n.op_type == "Identity" and n.output[0] == name and n.input[0] == passed for n in body.node)


@onnx_op("Scan", emits=("gather", "concat", "reshape", "loop", "transpose", "slice"))
def scan(ctx: NodeCtx) -> list[Value]:
    """Unroll over the (static) scan axis; opset 8's batched form runs once per batch entry."""
    body = ctx.attr("body")
    n_scan = ctx.attr_int("num_scan_inputs")
    if ctx.opset < 9:
        if ctx.has_input(0):
            raise ctx.unsupported("sequence_lens is not supported")
        ins = [ctx.input(i) for i in range(1, len(ctx.inputs))]
        n_state = len(ins) - n_scan
        batch = ins[0].shape[0] if ins else 0
        if not isinstance(batch, int):
            raise ctx.unsupported("a symbolic batch size cannot be unrolled")
        dirs = ctx.attr_ints("directions", [0] * n_scan)
        per_batch = [_scan_once(ctx, body, [take(ctx.b, x, 0, bi) for x in ins[:n_state]],
                                [take(ctx.b, x, 0, bi) for x in ins[n_state:]], [0] * n_scan, dirs,
                                [0] * (len(body.output) - n_state), [0] * (len(body.output) - n_state))
                     for bi in range(batch)]
        return [stack(ctx.b, list(outs), 0) for outs in zip(*per_batch, strict=True)]
    ins = list(ctx.inputs)
    n_state = len(ins) - n_scan
    n_out = len(body.output) - n_state
    return _scan_once(ctx, body, [ctx.input(i) for i in range(n_state)],
                      [ctx.input(i) for i in range(n_state, len(ins))],
                      ctx.attr_ints("scan_input_axes", [0] * n_scan),
                      ctx.attr_ints("scan_input_directions", [0] * n_scan),
                      ctx.attr_ints("scan_output_axes", [0] * n_out),
                      ctx.attr_ints("scan_output_directions", [0] * n_out))


def _scan_once(ctx: NodeCtx, body: object, states: list[Value], xs: list[Value], in_axes: Sequence[int],
               in_dirs: Sequence[int], out_axes: Sequence[int], out_dirs: Sequence[int]) -> list[Value]:
    b = ctx.b
    axes = [norm_axis(a, x.type.rank) for a, x in zip(in_axes, xs, strict=True)]
    lengths = {x.shape[a] for a, x in zip(axes, xs, strict=True)}
    if len(lengths) != 1:
        raise ctx.unsupported(f"scan inputs have different lengths {sorted(map(str, lengths))}")
    (steps,) = lengths
    if not isinstance(steps, int):
        return _scan_loop(ctx, body, states, xs, axes, in_dirs, out_axes, out_dirs, steps)
    if steps > MAX_UNROLL:
        raise ctx.unsupported(f"more than {MAX_UNROLL} scan steps cannot be unrolled")
    ctx.imp.charge_unroll(steps, ctx.location)
    n_state = len(states)
    outs_per_step: list[list[Value]] = []
    for t in range(steps):
        elems = [take(b, x, a, steps - 1 - t if d else t) for x, a, d in zip(xs, axes, in_dirs, strict=True)]
        outs = ctx.imp.import_subgraph(body, [*states, *elems])  # type: ignore[arg-type]
        states = outs[:n_state]
        outs_per_step.append(outs[n_state:])
    results = list(states)
    for k, (a, d) in enumerate(zip(out_axes, out_dirs, strict=True)):
        seq = [o[k] for o in outs_per_step]
        if d:
            seq.reverse()
        if not seq:
            raise ctx.unsupported("a scan of length 0 has scan outputs of unknown shape")
        results.append(stack(b, seq, norm_axis(a, seq[0].type.rank + 1)))
    return results


def _scan_loop(ctx: NodeCtx, body: object, states: list[Value], xs: list[Value], axes: Sequence[int],
               in_dirs: Sequence[int], out_axes: Sequence[int], out_dirs: Sequence[int], steps: Dim) -> list[Value]:
    """A scan over a symbolic length as one ``loop``: scan axes moved to the front, the body imported
    once over block arguments (what it reads from enclosing scopes captured as invariants), each
    scan output flipped where its direction differs from the inputs' and moved to its axis."""
    b = ctx.b
    if len(set(in_dirs)) > 1:
        raise ctx.unsupported("scan inputs in both directions over a symbolic length")
    reverse = bool(in_dirs[0]) if in_dirs else False
    fronted = [x if a == 0 else b.transpose(x, perm=[a, *(k for k in range(x.type.rank) if k != a)])
               for x, a in zip(xs, axes, strict=True)]
    t, args = block_args([*(s.type for s in states), *(TensorType(x.dtype, x.shape[1:]) for x in fronted)])
    state_args, slice_args = args[:len(states)], args[len(states):]
    outs = ctx.imp.import_subgraph(body, [*state_args, *slice_args])  # type: ignore[arg-type]
    for k, (new, old) in enumerate(zip(outs, state_args, strict=False)):
        if new.type != old.type:
            raise ctx.unsupported(f"scan state {k} changes type in the body ({old.type} -> {new.type})")
    region, captured = close_body([t, *state_args, *slice_args], list(outs))
    attrs = {"body": region, "carried": len(states), "scanned": len(fronted), "trips": (steps,), "reverse": reverse}
    results = [b.loop(*states, *fronted, *captured, **attrs, output=k) for k in range(len(outs))]
    for k, (a, d) in enumerate(zip(out_axes, out_dirs, strict=True)):
        y = results[len(states) + k]
        if bool(d) != reverse:  # iteration t wrote position t; this output wants the other order
            rest = y.shape[1:]
            y = b.slice(y, starts=[steps - 1, *(0 for _ in rest)], ends=[-1, *rest], steps=[-1, *(1 for _ in rest)])
        axis = norm_axis(a, y.type.rank)
        if axis:
            y = b.transpose(y, perm=[*range(1, axis + 1), 0, *range(axis + 1, y.type.rank)])
        results[len(states) + k] = y
    return results


def _counted_loop(ctx: NodeCtx, body: Any, count: Dim, carried: list[Value], cond_given: bool) -> list[Value]:
    """An ONNX Loop over a symbolic trip count as one ``loop``: the body imported once over block
    arguments (the iteration number, the carried values; the condition fed as the constant true).
    A body whose condition output is not that constant makes it a while loop (:func:`_while_loop`)."""
    b = ctx.b
    t, args = block_args([v.type for v in carried])
    formal = body.input[0].type.tensor_type.shape.dim if body.input else []
    index = b.reshape(t, shape=[1]) if len(formal) == 1 else t
    outs = ctx.imp.import_subgraph(body, [index, scalar(b, True, DType.bool), *args])
    try:  # without an initial condition, the body's is ignored (a for loop)
        stays = not cond_given or bool(np.asarray(ctx.imp.static_value(outs[0], ctx.location)).reshape(()))
    except CuvilError:
        stays = False
    if not stays:
        return _while_loop(ctx, body, count, list(carried), None)
    for k, (new, old) in enumerate(zip(outs[1:], args, strict=False)):
        if new.type != old.type:
            raise ctx.unsupported(f"loop-carried value {k} changes type in the body ({old.type} -> {new.type})")
    region, captured = close_body([t, *args], list(outs[1:]))
    attrs = {"body": region, "carried": len(carried), "scanned": 0, "trips": (count,)}
    return [b.loop(*carried, *captured, **attrs, output=k) for k in range(len(outs) - 1)]


def _while_loop(ctx: NodeCtx, body: Any, count: Any, carried: Sequence[Entity],
                needed: UnsupportedOpError | None) -> list[Value]:
    """An ONNX Loop whose condition only a run knows, as one ``loop`` with the condition as its first
    carried value and ``stop`` on it: at most ``count`` iterations (static or symbolic; a loop with no
    trip count could run forever and is refused), no scan outputs (their length would be known only
    at run time). Where it cannot be one, ``needed`` (what asked for the condition's value at import)
    is raised, so a caller that can bind the input the condition comes from does."""
    try:
        return _while_loop_of(ctx, body, count, carried)
    except UnsupportedOpError as why:
        if needed is None:
            raise
        needed.hint = f"as a while loop it is refused ({why.message}); {needed.hint}"
        raise needed from None


def _while_loop_of(ctx: NodeCtx, body: Any, count: Any, carried: Sequence[Entity]) -> list[Value]:
    if count is None:
        raise ctx.unsupported("a while loop without a trip count (M): it may not terminate")
    if not isinstance(count, (int, np.integer, Sym)):
        raise ctx.unsupported(f"a trip count of {count}")
    tensors = [v for v in carried if isinstance(v, Value)]
    if len(tensors) != len(carried):
        raise ctx.unsupported("a while loop cannot carry sequences or optionals")
    if len(body.output) - 1 != len(tensors):
        raise ctx.unsupported("a while loop with scan outputs (their length is known only at run time)")
    b = ctx.b
    go = _scalar_bool(b, ctx.input(1)) if ctx.has_input(1) else scalar(b, True, DType.bool)
    t, args = block_args([go.type, *(v.type for v in tensors)])
    formal = body.input[0].type.tensor_type.shape.dim if body.input else []
    index = b.reshape(t, shape=[1]) if len(formal) == 1 else t
    cond_formal = body.input[1].type.tensor_type.shape.dim if len(body.input) > 1 else []
    cond_arg = b.reshape(args[0], shape=[1]) if len(cond_formal) == 1 else args[0]
    outs = ctx.imp.import_subgraph(body, [index, cond_arg, *args[1:]])
    new = [_scalar_bool(b, outs[0]), *outs[1:]]
    for k, (v, old) in enumerate(zip(new, args, strict=True)):
        if not isinstance(v, Value) or v.type != old.type:
            raise ctx.unsupported(f"loop-carried value {k} changes type in the body")
    region, captured = close_body([t, *args], new)
    attrs = {"body": region, "carried": len(args), "scanned": 0, "trips": (int(count) if not isinstance(count, Sym)
                                                                          else count,), "stop": 0}
    return [b.loop(go, *tensors, *captured, **attrs, output=k) for k in range(1, len(args))]


def _scalar_bool(b: Any, v: Value) -> Value:
    """A one-element condition as a bool scalar."""
    if v.dtype is not DType.bool or v.type.numel() != 1:
        raise UnsupportedOpError(f"a loop condition must be one bool, got {v.type}", location="Loop")
    return v if v.type.rank == 0 else b.reshape(v, shape=[])
