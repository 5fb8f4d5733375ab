"""aten layout ops (view, permute, cat, slice, index, ...) -> CIR."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.frontend.aten_node import AtenCtx, aten_op
from cuvil.frontend.torch_ops.helpers import (
    as_vector,
    axis_of,
    clamp_index,
    like_input,
    python_scalar,
    reshape_to,
    slice_axis,
)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.values import Value


@aten_op("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
         "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "flatten.using_ints",
         "unflatten.int", emits=("reshape",))
def _view(ctx: AtenCtx) -> Value:
    return reshape_to(ctx, ctx.tensor("self"), ctx.out_shape())


@aten_op("permute.default", "permute_copy.default", emits=("transpose",))
def _permute(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    perm = tuple(axis_of(ctx, d, x.type.rank) for d in ctx["dims"])
    return x if perm == tuple(range(x.type.rank)) else ctx.b.transpose(x, perm=perm)


@aten_op("transpose.int", "t.default", emits=("transpose",))
def _transpose(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    r = x.type.rank
    if r < 2:
        return x
    d0, d1 = (axis_of(ctx, ctx["dim0"], r), axis_of(ctx, ctx["dim1"], r)) if "dim0" in ctx.args else (0, 1)
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x if d0 == d1 else ctx.b.transpose(x, perm=tuple(perm))


@aten_op("diagonal.default", "diagonal_copy.default", emits=("transpose", "reshape", "slice"))
def _diagonal(ctx: AtenCtx) -> Value:
    """The elements ``x[..., i, i + offset]`` of two dims, as a new last dim: the two dims moved last and
    merged, then every ``m + 1``-th element from the first on the diagonal (``trace``, ``diag`` of a matrix and
    ``einsum('ii->i')`` export as this)."""
    x = ctx.tensor("self")
    r = x.type.rank
    d1, d2 = axis_of(ctx, ctx.get("dim1", 0), r), axis_of(ctx, ctx.get("dim2", 1), r)
    if d1 == d2:
        raise ctx.unsupported("dim1 and dim2 are the same dim")
    offset = int(ctx.get("offset", 0))
    n, m = x.shape[d1], x.shape[d2]
    if not (isinstance(n, int) and isinstance(m, int)):
        raise ctx.unsupported(f"a diagonal of symbolic dims {n} x {m}")
    rest = [k for k in range(r) if k not in (d1, d2)]
    perm = (*rest, d1, d2)
    moved = x if perm == tuple(range(r)) else ctx.b.transpose(x, perm=perm)
    lead = [x.shape[k] for k in rest]
    flat = reshape_to(ctx, moved, (*lead, n * m))
    length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    start = offset if offset >= 0 else -offset * m
    if length == 0:
        return slice_axis(ctx.b, flat, len(lead), 0, 0)
    return slice_axis(ctx.b, flat, len(lead), start, start + (length - 1) * (m + 1) + 1, m + 1)


@aten_op("expand.default", "expand_copy.default", emits=("expand",))
def _expand(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    shape = ctx.out_shape()
    return x if tuple(x.shape) == shape else ctx.b.expand(x, shape=shape)


@aten_op("repeat.default", emits=("tile", "reshape"))
def _repeat(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    reps = [int(r) for r in ctx["repeats"]]
    if len(reps) > x.type.rank:
        x = reshape_to(ctx, x, (1,) * (len(reps) - x.type.rank) + tuple(x.shape))
    return x if all(r == 1 for r in reps) else ctx.b.tile(x, repeats=tuple(reps))


@aten_op("cat.default", emits=("concat", "cast"))
def _cat(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    xs = [ctx.imp.as_value(t, dtype, ctx.location) for t in ctx["tensors"]]
    rank = len(ctx.out_shape())
    axis = axis_of(ctx, ctx.get("dim", 0), rank)
    # torch skips legacy empty 1-D tensors; pieces empty along the axis add nothing
    kept = [x for x in xs if x.type.rank == rank and x.shape[axis] != 0] or [x for x in xs if x.type.rank == rank]
    if len(kept) == 1:
        return kept[0]
    return ctx.b.concat(*kept, axis=axis)


@aten_op("stack.default", emits=("concat", "reshape", "cast"))
def _stack(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    shape = ctx.out_shape()
    axis = axis_of(ctx, ctx.get("dim", 0), len(shape))
    xs = []
    for t in ctx["tensors"]:
        x = ctx.imp.as_value(t, dtype, ctx.location)
        xs.append(reshape_to(ctx, x, (*x.shape[:axis], 1, *x.shape[axis:])))
    return xs[0] if len(xs) == 1 else ctx.b.concat(*xs, axis=axis)


@aten_op("slice.Tensor", "slice_copy.Tensor", emits=("slice",))
def _slice(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    axis = axis_of(ctx, ctx.get("dim", 0), x.type.rank)
    size = x.shape[axis]
    step = int(ctx.get("step", 1))
    start = clamp_index(ctx.get("start"), size, 0)
    end = clamp_index(ctx.get("end"), size, size)
    if isinstance(start, int) and isinstance(end, int):
        end = max(start, end)
    if start == 0 and end == size and step == 1:
        return x
    return slice_axis(ctx.b, x, axis, start, end, step)


def _select(ctx: AtenCtx, x: Value, axis: int, index: Any) -> Value:
    size = x.shape[axis]
    if isinstance(index, Sym):
        i: Dim = index
    else:
        i = int(index)
        if i < 0:
            i = size + i
    piece = slice_axis(ctx.b, x, axis, i, i + 1, 1)
    return reshape_to(ctx, piece, tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:]))


@aten_op("select.int", "select_copy.int", emits=("slice", "reshape"))
def _select_int(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return _select(ctx, x, axis_of(ctx, ctx["dim"], x.type.rank), ctx["index"])


@aten_op("unbind.int", emits=("slice", "reshape"))
def _unbind(ctx: AtenCtx) -> list[Value]:
    x = ctx.tensor("self")
    axis = axis_of(ctx, ctx.get("dim", 0), x.type.rank)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ctx.unsupported("unbind along a symbolic dim")
    return [_select(ctx, x, axis, i) for i in range(n)]


@aten_op("split_with_sizes.default", "split.Tensor", "split_with_sizes_copy.default", "split_copy.Tensor",
         emits=("slice",))
def _split(ctx: AtenCtx) -> list[Value]:
    x = ctx.tensor("self")
    axis = axis_of(ctx, ctx.get("dim", 0), x.type.rank)
    out: list[Value] = []
    start: Dim = 0
    for k in range(len(ctx.meta)):
        size = ctx.out_shape(k)[axis]
        end = start + size
        out.append(x if start == 0 and end == x.shape[axis] else slice_axis(ctx.b, x, axis, start, end, 1))
        start = end
    return out


@aten_op("slice_scatter.default", "select_scatter.default", emits=("slice", "concat", "reshape", "scatter_elements"))
def _slice_scatter(ctx: AtenCtx) -> Value:
    """``self`` with ``self[start:end:step]`` along ``dim`` replaced by ``src`` (``select_scatter``: one
    index, ``src`` without that axis), what an in-place slice assignment becomes in an exported graph: the
    parts of ``self`` around the slice joined to ``src`` at a step of 1; at another step ``src`` scattered
    to its positions (static shapes)."""
    x = ctx.tensor("self")
    src = ctx.tensor("src", x.dtype)
    b = ctx.b
    axis = axis_of(ctx, ctx.get("dim", 0), x.type.rank)
    size = x.shape[axis]
    if ctx.op_name == "aten.select_scatter.default":
        index = ctx["index"]
        start: Dim = index if isinstance(index, Sym) else (int(index) + size if int(index) < 0 else int(index))
        src = reshape_to(ctx, src, (*src.shape[:axis], 1, *src.shape[axis:]))
        end: Dim = start + 1
        step = 1
    else:
        step = int(ctx.get("step", 1))
        start = clamp_index(ctx.get("start"), size, 0)
        end = clamp_index(ctx.get("end"), size, size)
    if step == 1:
        parts = [slice_axis(b, x, axis, 0, start, 1)] if start != 0 else []
        parts.append(src)
        if end != size:
            parts.append(slice_axis(b, x, axis, end, size, 1))
        return parts[0] if len(parts) == 1 else b.concat(*parts, axis=axis)
    if not (x.type.is_static and src.type.is_static and isinstance(start, int)):
        raise ctx.unsupported(f"slice_scatter with step {step} over symbolic shapes")
    positions = start + step * np.arange(int(src.shape[axis]), dtype=np.int64)
    where = [1] * src.type.rank
    where[axis] = len(positions)
    index = np.broadcast_to(positions.reshape(where), tuple(int(d) for d in src.shape))
    return b.scatter_elements(x, b.const(np.ascontiguousarray(index)), src, axis=axis, reduction="none")


@aten_op("as_strided.default", "as_strided_copy.default", emits=("reshape", "gather"))
def _as_strided(ctx: AtenCtx) -> Value:
    """A strided view of ``self``'s elements in memory order: taken where ``self`` is laid out row-major
    from its start (its exported metadata says so) and the shapes are static, else refused (a view of
    another layout reads memory the graph does not describe)."""
    x = ctx.tensor("self")
    source = ctx.node.args[0].meta.get("val") if hasattr(ctx.node.args[0], "meta") else None
    shape = tuple(int(d) for d in ctx["size"])
    strides = tuple(int(d) for d in ctx["stride"])
    offset = int(ctx.get("storage_offset", 0))
    if source is None or not x.type.is_static:
        raise ctx.unsupported("as_strided of a value with symbolic shape or no metadata")
    dims = tuple(int(d) for d in x.shape)
    row_major = [1] * len(dims)
    for k in range(len(dims) - 2, -1, -1):
        row_major[k] = row_major[k + 1] * dims[k + 1]
    laid_out = all(int(s) == r for s, r, d in zip(source.stride(), row_major, dims, strict=True) if d > 1)
    if not laid_out or int(source.storage_offset()) != 0:
        raise ctx.unsupported("as_strided of a value that is not laid out row-major from its start")
    flat_index = np.full(shape, offset, dtype=np.int64)
    for k, (n, st) in enumerate(zip(shape, strides, strict=True)):
        where = [1] * len(shape)
        where[k] = n
        flat_index = flat_index + st * np.arange(n, dtype=np.int64).reshape(where)
    count = math.prod(dims)
    if flat_index.size and (int(flat_index.min()) < 0 or int(flat_index.max()) >= count):
        raise ctx.unsupported(f"as_strided reads outside its input's {count} elements")
    flat = reshape_to(ctx, x, (count,))
    if np.array_equal(flat_index.reshape(-1), np.arange(count)) and flat_index.size == count:
        return reshape_to(ctx, flat, shape)
    return ctx.b.gather(flat, ctx.b.const(flat_index), axis=0)


@aten_op("index_select.default", emits=("gather", "cast"))
def _index_select(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    return ctx.b.gather(x, idx, axis=axis_of(ctx, ctx["dim"], x.type.rank))


@aten_op("gather.default", emits=("gather_elements", "cast"))
def _gather(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    return ctx.b.gather_elements(x, idx, axis=axis_of(ctx, ctx["dim"], x.type.rank))


_SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


@aten_op("scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two",
         emits=("scatter_elements", "fill", "expand", "cast"))
def _scatter(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    if "src" in ctx.args:
        src = ctx.tensor("src", x.dtype)
    else:
        value = ctx["value"]
        src = ctx.imp.as_value(value, x.dtype, ctx.location) if isinstance(value, (Value, Sym)) else None
        if src is None:
            src = ctx.b.fill(shape=tuple(idx.shape), value=python_scalar(value, x.dtype), dtype=x.dtype)
        elif tuple(src.shape) != tuple(idx.shape):
            src = ctx.b.expand(src, shape=tuple(idx.shape))
    reduction = "none"
    if ctx.op_name == "aten.scatter_add.default":
        reduction = "add"
    elif ctx.op_name == "aten.scatter_reduce.two":
        kind = str(ctx["reduce"])
        if kind not in _SCATTER_REDUCE or not ctx.get("include_self", True):
            raise ctx.unsupported(f"reduce={kind!r} include_self={ctx.get('include_self', True)}")
        reduction = _SCATTER_REDUCE[kind]
    elif ctx.args.get("reduce") is not None:
        raise ctx.unsupported(f"reduce={ctx['reduce']!r}")
    return ctx.b.scatter_elements(x, idx, src, axis=axis_of(ctx, ctx["dim"], x.type.rank), reduction=reduction)


@aten_op("embedding.default", emits=("embedding", "cast"))
def _embedding(ctx: AtenCtx) -> Value:
    ids = ctx.tensor("indices")
    if ids.dtype not in (DType.i64, DType.i32):
        ids = ctx.cast(ids, DType.i64)
    return ctx.b.embedding(ctx.tensor("weight"), ids)


@aten_op("index.Tensor", "_unsafe_index.Tensor", emits=("gather", "gather_nd", "transpose", "reshape", "expand",
                                                          "concat", "cast"))
def _index(ctx: AtenCtx) -> Value:
    """Advanced indexing ``x[i0, i1, ...]``: the indexed axes move to the front, their broadcast
    indices are stacked into one gather_nd, and the result axes go where numpy puts them."""
    x = ctx.tensor("self")
    b = ctx.b
    axes, idxs = _index_tensors(ctx)
    if len(idxs) == 1:
        return b.gather(x, idxs[0], axis=axes[0])
    bshape, index = _stacked(b, idxs)
    g = b.gather_nd(_front(b, x, axes), index, batch_dims=0)
    if _in_place(axes):
        nb = len(bshape)
        leading = list(range(nb, nb + axes[0]))
        perm = leading + list(range(nb)) + list(range(nb + axes[0], g.type.rank))
        g = b.transpose(g, perm=tuple(perm))
    return g


@aten_op("index_put.default", "_unsafe_index_put.default", emits=("scatter_nd", "transpose", "reshape", "expand",
                                                                  "concat", "cast", "where", "add"))
def _index_put(ctx: AtenCtx) -> Value:
    """``x[i0, i1, ...] = values`` (``accumulate``: ``+=``, repeated indices summed), the inverse of
    :func:`_index`'s layout: the indexed axes in front, the values broadcast to what ``x[i0, i1, ...]``
    reads and its broadcast index axes moved first, one scatter_nd, the axes moved back."""
    x = ctx.tensor("self")
    b = ctx.b
    masked = _masked_put(ctx, x)
    if masked is not None:
        return masked
    axes, idxs = _index_tensors(ctx)
    bshape, index = _stacked(b, idxs)
    rest = [k for k in range(x.type.rank) if k not in axes]
    nb = len(bshape)
    if _in_place(axes):  # numpy keeps the broadcast index axes where the indexed ones were
        read = (*x.shape[:axes[0]], *bshape, *x.shape[axes[-1] + 1:])
        perm = list(range(axes[0], axes[0] + nb)) + list(range(axes[0])) + list(range(axes[0] + nb, len(read)))
    else:
        read = (*bshape, *(x.shape[k] for k in rest))
        perm = list(range(len(read)))
    values = ctx.tensor("values", x.dtype)
    if values.type.rank > len(read):
        raise ctx.unsupported(f"values of rank {values.type.rank} for an indexed read of rank {len(read)}")
    if tuple(values.shape) != read:
        values = b.expand(values, shape=read)
    if perm != list(range(len(read))):
        values = b.transpose(values, perm=tuple(perm))
    reduction = "add" if ctx.get("accumulate", False) else "none"
    out = b.scatter_nd(_front(b, x, axes), index, values, reduction=reduction)
    front = axes + rest
    if front == list(range(x.type.rank)):
        return out
    return b.transpose(out, perm=tuple(front.index(k) for k in range(x.type.rank)))


def _masked_put(ctx: AtenCtx, x: Value) -> Value | None:
    """``x[mask] = v`` with one boolean mask and one value: a ``where`` (``accumulate``: ``v`` added where the
    mask holds), no data-dependent shape. None: not that form."""
    raw = list(ctx["indices"])
    at = [k for k, t in enumerate(raw) if t is not None]
    if len(at) != 1:
        return None
    mask = ctx.imp.as_value(raw[at[0]], None, ctx.location)
    values = ctx.tensor("values", x.dtype)
    if mask.dtype is not DType.bool or any(d != 1 for d in values.shape):
        return None
    k, b = at[0], ctx.b
    if k + mask.type.rank > x.type.rank:
        raise ctx.unsupported(f"a mask of rank {mask.type.rank} from axis {k} of a rank-{x.type.rank} tensor")
    shape = tuple(x.shape)
    mask = reshape_to(ctx, mask, (1,) * k + tuple(mask.shape) + (1,) * (x.type.rank - k - mask.type.rank))
    mask = b.expand(mask, shape=shape) if tuple(mask.shape) != shape else mask
    v = reshape_to(ctx, values, ()) if values.type.rank else values
    if ctx.get("accumulate", False):
        return b.add(x, b.where(mask, v, b.scalar(0, x.dtype)))
    return b.where(mask, v, x)


def _index_tensors(ctx: AtenCtx) -> tuple[list[int], list[Value]]:
    """The indexed axes of an ``indices`` list (``None``: a whole axis) and their indices as int64."""
    raw = list(ctx["indices"])
    axes = [k for k, t in enumerate(raw) if t is not None]
    idxs = []
    for k in axes:
        t = ctx.imp.as_value(raw[k], None, ctx.location)
        if t.dtype is DType.bool:
            raise ctx.unsupported("boolean mask indexing (data-dependent shape)")
        idxs.append(ctx.cast(t, DType.i64))
    return axes, idxs


def _stacked(b: Builder, idxs: list[Value]) -> tuple[tuple[Dim, ...], Value]:
    """The indices broadcast together and stacked on a last axis (gather_nd's and scatter_nd's form)."""
    from cuvil.ir.opdef import broadcast_shapes

    bshape = broadcast_shapes(*(t.shape for t in idxs))
    stacked = []
    for t in idxs:
        t = t if tuple(t.shape) == bshape else b.expand(t, shape=bshape)
        stacked.append(b.reshape(t, shape=(*bshape, 1)))
    return bshape, stacked[0] if len(stacked) == 1 else b.concat(*stacked, axis=len(bshape))


def _front(b: Builder, x: Value, axes: list[int]) -> Value:
    """``x`` with ``axes`` first, in their order, then the others in theirs."""
    front = axes + [k for k in range(x.type.rank) if k not in axes]
    return x if front == list(range(x.type.rank)) else b.transpose(x, perm=tuple(front))


def _in_place(axes: list[int]) -> bool:
    """Whether numpy puts advanced indexing's broadcast axes where the indexed ones were (consecutive axes
    after the first), not in front."""
    return axes == list(range(axes[0], axes[0] + len(axes))) and axes[0] > 0


@aten_op("flip.default", emits=("slice",))
def _flip(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    axes = {axis_of(ctx, d, x.type.rank) for d in ctx["dims"]}
    if not axes:
        return x
    starts = [x.shape[k] - 1 if k in axes else 0 for k in range(x.type.rank)]
    ends = [-1 if k in axes else x.shape[k] for k in range(x.type.rank)]
    steps = [-1 if k in axes else 1 for k in range(x.type.rank)]
    return ctx.b.slice(x, starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


@aten_op("topk.default", emits=("topk", "reshape"))
def _topk(ctx: AtenCtx) -> tuple[Value, Value]:
    given = ctx.tensor("self")
    x = as_vector(ctx, given)
    k = ctx["k"]
    if not isinstance(k, int):
        raise ctx.unsupported("symbolic k")
    axis = axis_of(ctx, ctx.get("dim", -1), x.type.rank)
    largest, ordered = bool(ctx.get("largest", True)), bool(ctx.get("sorted", True))
    return tuple(like_input(ctx, ctx.b.topk(x, k=k, axis=axis, largest=largest, sorted=ordered, output=o), given)
                 for o in ("values", "indices"))  # type: ignore[return-value]


@aten_op("sort.default", "sort.stable", emits=("topk", "reshape"))
def _sort(ctx: AtenCtx) -> tuple[Value, Value]:
    """A full sort is a top-k with k = the axis length, ties in their order (so it is also the stable sort)."""
    given = ctx.tensor("self")
    x = as_vector(ctx, given)
    axis = axis_of(ctx, ctx.get("dim", -1), x.type.rank)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ctx.unsupported("sorting along a symbolic dim")
    largest = bool(ctx.get("descending", False))
    return tuple(like_input(ctx, ctx.b.topk(x, k=n, axis=axis, largest=largest, sorted=True, output=o), given)
                 for o in ("values", "indices"))  # type: ignore[return-value]


def _resize(ctx: AtenCtx, mode: str, transform: str) -> Value:
    x = ctx.tensor("input")
    out = ctx.out_shape()
    # torch maps coordinates with the given scale factors, except under align_corners (sizes only)
    factors = ctx.args.get("scale_factors") if transform != "align_corners" else None
    n = x.type.rank - 2
    if factors is not None:
        scales = (1.0, 1.0, *(float(f) for f in _spatial_floats(factors, n)))
    else:
        if not all(isinstance(d, int) for d in (*x.shape[2:], *out[2:])):
            raise ctx.unsupported("resizing between symbolic sizes")
        scales = (1.0, 1.0, *(int(o) / int(i) for o, i in zip(out[2:], x.shape[2:], strict=True)))
    return ctx.b.resize(x, sizes=out, scales=scales, mode=mode, coordinate_transformation_mode=transform,
                        nearest_mode="floor")


def _spatial_floats(values: Sequence[float], n: int) -> tuple[float, ...]:
    vals = [float(v) for v in values]
    return tuple(vals * n) if len(vals) == 1 else tuple(vals)


@aten_op("upsample_nearest2d.vec", "upsample_nearest1d.vec", "upsample_nearest3d.vec", emits=("resize",))
def _upsample_nearest(ctx: AtenCtx) -> Value:
    return _resize(ctx, "nearest", "asymmetric")


@aten_op("upsample_bilinear2d.vec", "upsample_linear1d.vec", "upsample_trilinear3d.vec", emits=("resize",))
def _upsample_linear(ctx: AtenCtx) -> Value:
    return _resize(ctx, "linear", "align_corners" if ctx.get("align_corners", False) else "pytorch_half_pixel")


@aten_op("constant_pad_nd.default", emits=("pad",))
def _constant_pad(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    pad = [int(p) for p in ctx["pad"]]
    r = x.type.rank
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):
        axis = r - 1 - k
        begins[axis], ends[axis] = pad[2 * k], pad[2 * k + 1]
    if not any(pad):  # (a negative amount crops that side, as the pad op's does)
        return x
    return ctx.b.pad(x, pads=tuple(begins + ends), mode="constant", value=float(ctx.get("value", 0.0)))


@aten_op("tril.default", "triu.default", emits=("trilu",))
def _trilu(ctx: AtenCtx) -> Value:
    return ctx.b.trilu(ctx.tensor("self"), upper=ctx.op_name.startswith("aten.triu"),
                       k=int(ctx.get("diagonal", 0)))


@aten_op("cumsum.default", emits=("cumsum", "cast", "reshape"))
def _cumsum(ctx: AtenCtx) -> Value:
    given = ctx.tensor("self", ctx.out_dtype())
    x = as_vector(ctx, given)
    y = ctx.b.cumsum(x, axis=axis_of(ctx, ctx["dim"], x.type.rank), exclusive=False, reverse=False)
    return like_input(ctx, y, given)
