"""ONNX control flow: Dropout (inference), If with a compile-time condition, Loop/Scan unrolled over
a compile-time trip count or, over a symbolic one, imported as one CIR ``loop``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import MAX_UNROLL, block_args, fill, index_const, scalar, stack, static_scalar, take
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.region import close_body
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


@onnx_op("If", emits=())
def if_(ctx: NodeCtx) -> list[Value]:
    """Inline the branch a compile-time condition selects."""
    cond = np.asarray(ctx.static(0))
    if cond.size != 1:
        raise ctx.unsupported(f"the condition must have one element, got shape {cond.shape}")
    branch = ctx.attr("then_branch") if bool(cond.reshape(())) else ctx.attr("else_branch")
    return ctx.imp.import_subgraph(branch)


@onnx_op("Loop", emits=("concat", "reshape", "loop"))
def loop(ctx: NodeCtx) -> list[Value]:
    """Unroll a loop whose trip count and continuation condition are known at compile time; a trip
    count given by symbolic dims becomes one ``loop`` (its condition must stay true)."""
    body = ctx.attr("body")
    count = static_scalar(ctx, 0, symbolic=True) if ctx.has_input(0) else None
    cond = bool(static_scalar(ctx, 1)) if ctx.has_input(1) else True
    carried = [ctx.input(i) for i in range(2, len(ctx.inputs))]
    if isinstance(count, Sym) and cond:
        return _counted_loop(ctx, body, count, carried)
    if count is not None and not isinstance(count, (int, float, np.integer, np.floating)):
        raise ctx.unsupported(f"a trip count of {count}")
    trip = int(count) if count is not None else None
    n_scan = len(body.output) - 1 - len(carried)
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    i = 0
    while cond and (trip is None or i < trip):
        if i >= MAX_UNROLL:
            raise ctx.unsupported(f"more than {MAX_UNROLL} iterations cannot be unrolled")
        ctx.imp.charge_unroll(1, ctx.location)
        outs = ctx.imp.import_subgraph(body, [index_const(ctx.b, i), scalar(ctx.b, True, DType.bool), *carried])
        cond = bool(np.asarray(ctx.imp.static_value(outs[0], ctx.location)).reshape(()))
        carried = outs[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(v)
        i += 1
    if n_scan and i == 0:
        raise ctx.unsupported("a loop that runs zero times has scan outputs of unknown shape")
    return [*carried, *(stack(ctx.b, s, 0) for s in scans)]


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


def _counted_loop(ctx: NodeCtx, body: Any, count: Dim, carried: list[Value]) -> list[Value]:
    """An ONNX Loop over a symbolic trip count as one ``loop``: the body imported once over block
    arguments (the iteration number, the carried values; the condition fed as the constant true),
    its condition output required to be that constant (a loop that may stop early is a while loop)."""
    b = ctx.b
    t, args = block_args([v.type for v in carried])
    formal = body.input[0].type.tensor_type.shape.dim if body.input else []
    index = b.reshape(t, shape=[1]) if len(formal) == 1 else t
    outs = ctx.imp.import_subgraph(body, [index, scalar(b, True, DType.bool), *args])
    try:
        stays = bool(np.asarray(ctx.imp.static_value(outs[0], ctx.location)).reshape(()))
    except CuvilError:
        stays = False
    if not stays:
        raise ctx.unsupported("a loop whose condition the body computes (a while loop) over a symbolic trip count")
    for k, (new, old) in enumerate(zip(outs[1:], args, strict=False)):
        if new.type != old.type:
            raise ctx.unsupported(f"loop-carried value {k} changes type in the body ({old.type} -> {new.type})")
    region, captured = close_body([t, *args], list(outs[1:]))
    attrs = {"body": region, "carried": len(carried), "scanned": 0, "trips": (count,)}
    return [b.loop(*carried, *captured, **attrs, output=k) for k in range(len(outs) - 1)]
