"""ONNX layout ops -> CIR: reshapes, slicing, padding, concatenation, resizing."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_node import Entity, NodeCtx, SymbolicValueRequired, onnx_op
from cuvil.frontend.onnx_ops.blocks import static_scalar
from cuvil.frontend.onnx_ops.fold import floor_of, is_symbolic, require, times
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, Sym, dim_bounds, exact_ratio, quotient, sym_max, sym_min
from cuvil.ir.values import Value


@onnx_op("Constant", emits=("const",))
def constant(ctx: NodeCtx) -> Value:
    for name, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                        ("value_int", np.int64), ("value_ints", np.int64)):
        if ctx.has_attr(name):
            return ctx.b.const(np.asarray(ctx.attr(name), dtype=dtype))
    sparse = [a.sparse_tensor for a in ctx.node.attribute if a.name == "sparse_value"]
    if sparse:
        return ctx.b.const(_dense(ctx, sparse[0]))
    raise ctx.unsupported("only tensor/sparse/float/int values are supported")


def _dense(ctx: NodeCtx, t: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse constant as its dense array: the values at the indices (flat positions, or one
    coordinate row per value), zero elsewhere."""
    values = ctx.imp.tensor_to_numpy(t.values, ctx.location).reshape(-1)
    indices = ctx.imp.tensor_to_numpy(t.indices, ctx.location).astype(np.int64)
    shape = tuple(int(d) for d in t.dims)
    size = math.prod(shape)
    flat = indices.reshape(-1) if indices.ndim <= 1 else \
        np.asarray(np.ravel_multi_index(tuple(indices.T), shape, mode="clip")).reshape(-1)
    if len(flat) != len(values) or (flat.size and (flat.min() < 0 or flat.max() >= size)):
        raise ShapeError(f"sparse constant: {len(values)} values at {len(flat)} indices within {size} elements",
                         location=ctx.location)
    out = np.zeros(size, dtype=values.dtype)
    out[flat] = values
    return out.reshape(shape)


@onnx_op("Identity", emits=())
def identity(ctx: NodeCtx) -> Entity:
    return ctx.entity(0)


def reshape_target(x_shape: tuple[Dim, ...], target: list, allowzero: bool, where: str) -> list[Dim]:
    """ONNX Reshape semantics: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out: list[Dim] = []
    infer = None
    for k, d in enumerate(target):
        if isinstance(d, (int, np.integer)) and int(d) == 0 and not allowzero:
            out.append(x_shape[k])
        elif isinstance(d, (int, np.integer)) and int(d) == -1:
            infer = k
            out.append(1)
        else:
            out.append(d if not isinstance(d, np.integer) else int(d))
    if infer is not None:
        total: Dim = 1
        for d in x_shape:
            total = total * d
        known: Dim = 1
        for d in out:
            known = known * d
        if isinstance(total, int) and isinstance(known, int) and (known == 0 or total % known):
            raise ShapeError(f"cannot infer -1 in reshape of {list(x_shape)} to {list(target)}", location=where)
        out[infer] = quotient(total, known)
    return out


@onnx_op("Reshape", emits=("reshape",))
def reshape(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    target = static_dims(ctx, 1)
    shape = reshape_target(x.shape, target, bool(ctx.attr_int("allowzero", 0)), ctx.location)
    return ctx.b.reshape(x, shape=shape)


@onnx_op("Transpose", emits=("transpose",))
def transpose(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    perm = ctx.attr_ints("perm", list(reversed(range(x.type.rank))))
    return ctx.b.transpose(x, perm=perm)


# --------------------------------------------------------------------------------------
# helpers

# bounds at or beyond this are "to the end" (exporters write INT64_MAX, INT32_MAX, ...)
HUGE = 2**30


def static_dims(ctx: NodeCtx, i: int) -> list[Dim]:
    """A 1-D compile-time input as python ints / symbolic dims."""
    arr = np.asarray(ctx.static(i))
    if arr.ndim > 1:
        raise ctx.unsupported(f"input {i} must be a vector, got shape {arr.shape}")
    items = arr.reshape(-1).tolist()
    odd = [v for v in items if is_symbolic(v) and not isinstance(v, Sym)]
    if odd:
        raise ctx.unsupported(f"input {i} holds {odd[0]}, which is not a whole number")
    return [d if isinstance(d, Sym) else int(d) for d in items]


def static_ints(ctx: NodeCtx, i: int, what: str) -> list[int]:
    dims = static_dims(ctx, i)
    if not all(isinstance(d, int) for d in dims):
        raise SymbolicValueRequired(f"{ctx.op_name} {what} {[str(d) for d in dims]}", ctx.location)
    return [int(d) for d in dims]


def axes_arg(ctx: NodeCtx, attr_before: int, input_index: int) -> list[int] | None:
    """Axes given as an attribute before opset ``attr_before`` and as an input from it on."""
    if ctx.opset < attr_before:
        return ctx.attr_ints("axes") if ctx.has_attr("axes") else None
    return static_ints(ctx, input_index, "axes") if ctx.has_input(input_index) else None


def norm_axes(ctx: NodeCtx, axes: Sequence[int], rank: int) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"axis {a} out of range for rank {rank}", location=ctx.location)
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"axes {list(axes)} repeat an axis", location=ctx.location)
    return out


def product(dims: Sequence[Dim]) -> Dim:
    n: Dim = 1
    for d in dims:
        n = n * d
    return n


def reshaped(ctx: NodeCtx, x: Value, shape: Sequence[Dim]) -> Value:
    return x if tuple(shape) == tuple(x.shape) else ctx.b.reshape(x, shape=list(shape))


# --------------------------------------------------------------------------------------
# Shape, Size, Flatten, Squeeze, Unsqueeze


@onnx_op("Shape", emits=("shape", "slice"))
def shape(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank

    def clamp(v: int) -> int:
        return min(max(v + r if v < 0 else v, 0), r)

    start, end = clamp(ctx.attr_int("start", 0)), clamp(ctx.attr_int("end", r))
    end = max(start, end)
    dims = x.shape[start:end]
    if all(isinstance(d, int) for d in dims):
        return ctx.b.const(np.array(dims, dtype=np.int64).reshape(len(dims)))
    v = ctx.b.shape(x)
    return v if (start, end) == (0, r) else ctx.b.slice(v, starts=[start], ends=[end], steps=[1])


@onnx_op("Size", emits=("shape", "reduce_prod"))
def size(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    n = product(x.shape)
    if isinstance(n, int):
        return ctx.b.const(np.array(n, dtype=np.int64))
    return ctx.b.reduce_prod(ctx.b.shape(x), axes=[0], keepdims=False)


@onnx_op("Flatten", emits=("reshape",))
def flatten(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank
    axis = ctx.attr_int("axis", 1)
    if not -r <= axis <= r:
        raise ShapeError(f"axis {axis} out of range for rank {r}", location=ctx.location)
    axis = axis + r if axis < 0 else axis
    return reshaped(ctx, x, [product(x.shape[:axis]), product(x.shape[axis:])])


@onnx_op("Squeeze", emits=("reshape",))
def squeeze(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    axes = axes_arg(ctx, 13, 1)
    if axes is None:
        drop = {k for k, d in enumerate(x.shape) if dim_bounds(d) == (1, 1)}
        for k, d in enumerate(x.shape):
            if k not in drop and not isinstance(d, int):
                _not_one(ctx, d)
    else:
        drop = set(norm_axes(ctx, axes, x.type.rank))
        for k in drop:
            if isinstance(x.shape[k], int) and x.shape[k] != 1:
                raise ShapeError(f"cannot squeeze axis {k} of size {x.shape[k]}", location=ctx.location)
    return reshaped(ctx, x, [d for k, d in enumerate(x.shape) if k not in drop])


def _not_one(ctx: NodeCtx, d: Dim) -> None:
    """A symbolic dim that Squeeze without axes keeps must not be 1 at any size (ONNX squeezes it away there,
    changing the rank): where its bounds do not say so, the model is one to import per shape signature."""
    lo, _ = dim_bounds(d)
    if lo is not None and lo >= 2:
        return
    raise SymbolicValueRequired(f"whether dim {d} is 1 (Squeeze without axes drops the dims that are)",
                                ctx.location)


@onnx_op("Unsqueeze", emits=("reshape",))
def unsqueeze(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    axes = axes_arg(ctx, 13, 1)
    if axes is None:
        raise ctx.unsupported("axes are required")
    r = x.type.rank + len(axes)
    new = set(norm_axes(ctx, axes, r))
    it = iter(x.shape)
    return reshaped(ctx, x, [1 if k in new else next(it) for k in range(r)])


# --------------------------------------------------------------------------------------
# Expand, Concat, Split, Tile


@onnx_op("Expand", emits=("expand",))
def expand(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    out = ctx.b.expand(x, shape=static_dims(ctx, 1))
    return x if out.shape == x.shape else out


@onnx_op("Concat", emits=("concat",))
def concat(ctx: NodeCtx) -> Value:
    xs = [ctx.input(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    if not xs:
        raise ctx.unsupported("no inputs")
    return xs[0] if len(xs) == 1 else ctx.b.concat(*xs, axis=ctx.attr_int("axis"))


@onnx_op("Split", emits=("split",))
def split(ctx: NodeCtx) -> list[Value]:
    x = ctx.input(0)
    axis = norm_axes(ctx, [ctx.attr_int("axis", 0)], x.type.rank)[0]
    d = x.shape[axis]
    if ctx.opset < 13 and ctx.has_attr("split"):
        sizes: list[Dim] = list(ctx.attr_ints("split"))
    elif ctx.opset >= 13 and ctx.has_input(1):
        sizes = static_dims(ctx, 1)
    else:
        n = ctx.attr_int("num_outputs") if ctx.opset >= 18 and ctx.has_attr("num_outputs") else ctx.num_outputs
        if n < 1:
            raise ctx.unsupported(f"cannot split into {n} pieces")
        if (d // n) * n == d:  # equal pieces at every size
            sizes = [d // n] * n
        elif ctx.opset >= 18:  # pieces of ceil(d / n), then the rest
            chunk = (d + (n - 1)) // n
            sizes = [sym_min(chunk, sym_max(d - k * chunk, 0)) for k in range(n)]
        elif isinstance(d, int):
            raise ShapeError(f"dim {d} does not split into {n} equal pieces", location=ctx.location)
        else:  # equal pieces: a size where they miss a part of the axis is refused at run time
            sizes = [d // n] * n
    return [ctx.b.split(x, axis=axis, sizes=sizes, index=k) for k in range(len(sizes))]


@onnx_op("Tile", emits=("tile", "reshape", "expand"))
def tile(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    reps = static_dims(ctx, 1)
    if len(reps) != x.type.rank:
        raise ShapeError(f"{len(reps)} repeats for rank {x.type.rank}", location=ctx.location)
    if all(isinstance(r, int) for r in reps):
        return x if all(r == 1 for r in reps) else ctx.b.tile(x, repeats=[int(r) for r in reps])
    for r in reps:
        lo, _ = dim_bounds(r)
        if lo is None or lo < 0:
            raise SymbolicValueRequired(f"the sign of the Tile count {r}", ctx.location)
    # symbolic counts: each axis d widens to (count, d) by broadcasting, then the pairs merge
    spread = [v for d in x.shape for v in (1, d)]
    wide = [v for r, d in zip(reps, x.shape, strict=True) for v in (r, d)]
    out = ctx.b.expand(ctx.b.reshape(x, shape=spread), shape=wide)
    return ctx.b.reshape(out, shape=[r * d for r, d in zip(reps, x.shape, strict=True)])


# --------------------------------------------------------------------------------------
# Slice


def slice_bounds(d: Dim, start: Dim, end: Dim, step: int) -> tuple[Dim, Dim]:
    """ONNX/numpy bounds normalized to what the slice op takes (see its doc): negative bounds count
    from the end, then both clamp to the axis, the end not past the start."""
    s, e = _from_start(start, d), _from_start(end, d)
    if step > 0:
        s = _within(s, 0, d)
        return s, _within(e, s, d)
    s = _within(s, 0, d - 1)
    return s, _within(e, -1, s)


def _from_start(v: Dim, d: Dim) -> Dim:
    """A bound as an index from 0: negative ones count from the end; beyond +-HUGE is past either end."""
    if isinstance(v, int):
        return d if v >= HUGE else -1 if v <= -HUGE else v + d if v < 0 else v
    return v + d if _below(v, 0) else v


def _within(v: Dim, lo: Dim, hi: Dim) -> Dim:
    """min(max(v, lo), hi) where the dims' bounds decide it; a symbolic bound they leave open is
    taken as lying within the axis, as the bounds exporters compute from shapes do (``x[:, :S]``
    of a 512-long table stays ``S`` long, so it still meets other ``S``-long values)."""
    v = lo if _below(v, lo) else v
    return hi if _below(hi, v) else v


def _below(a: Dim, b: Dim) -> bool:
    _, hi = dim_bounds(a - b)
    return hi is not None and hi < 0


PAST_THE_END = 2**20
"""A constant slice bound this large on a symbolic axis means "to the end" (exporters write 1e9,
2**31 - 1 or 2**63 - 1 for ``x[a:]``)."""


def _to_the_end(ctx: NodeCtx, d: Dim, bound: Dim) -> Dim:
    """A large constant bound on an axis that is one symbol: the axis's end, with the symbol
    constrained to at most the bound (ONNX clamps the bound to the axis, so the slice means the same
    for every admitted size; a larger one is refused at run time instead of cut short)."""
    if not (isinstance(bound, int) and PAST_THE_END <= bound < HUGE and isinstance(d, Sym)):
        return bound
    names = d.symbols()
    if len(names) != 1 or d != Sym.symbol(next(iter(names))):
        return bound
    ctx.imp.limit_dim(next(iter(names)), bound)
    return HUGE


@onnx_op("Slice", emits=("slice",))
def slice_(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank
    if ctx.opset < 10:
        starts, ends = list(ctx.attr_ints("starts")), list(ctx.attr_ints("ends"))
        axes = ctx.attr_ints("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = static_dims(ctx, 1), static_dims(ctx, 2)
        axes = static_ints(ctx, 3, "axes") if ctx.has_input(3) else list(range(len(starts)))
        steps = static_ints(ctx, 4, "steps") if ctx.has_input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("starts, ends, axes and steps differ in length", location=ctx.location)
    if any(st == 0 for st in steps):
        raise ShapeError("slice step 0", location=ctx.location)
    full_s: list[Dim] = [0] * r
    full_e: list[Dim] = list(x.shape)
    full_st = [1] * r
    for a, s, e, st in zip(norm_axes(ctx, axes, r), starts, ends, steps, strict=True):
        if st > 0:
            e = _to_the_end(ctx, x.shape[a], e)
        else:
            s = _to_the_end(ctx, x.shape[a], s)
        full_s[a], full_e[a] = slice_bounds(x.shape[a], s, e, st)
        full_st[a] = st
    if full_s == [0] * r and full_e == list(x.shape) and full_st == [1] * r:
        return x
    return ctx.b.slice(x, starts=full_s, ends=full_e, steps=full_st)


# --------------------------------------------------------------------------------------
# Pad, CenterCropPad


@onnx_op("Pad", emits=("pad", "fill", "concat", "slice"))
def pad(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank
    mode = ctx.attr_str("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.unsupported(f"mode {mode!r}")
    if ctx.opset < 11:
        pads = ctx.attr_ints("pads" if ctx.has_attr("pads") else "paddings")
        value: float = ctx.attr_float("value", 0.0)
        axes = list(range(r))
    else:
        pads = static_dims(ctx, 1)
        value = float(static_scalar(ctx, 2)) if ctx.has_input(2) and np.asarray(ctx.static(2)).size else 0.0
        axes = norm_axes(ctx, static_ints(ctx, 3, "axes"), r) if ctx.has_input(3) else list(range(r))
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"pads has {len(pads)} entries for {len(axes)} axes", location=ctx.location)
    full: list[Dim] = [0] * (2 * r)
    n = len(axes)
    for j, a in enumerate(axes):
        full[a], full[a + r] = pads[j], pads[j + n]
    if all(isinstance(p, int) and p == 0 for p in full):
        return x
    if all(isinstance(p, int) for p in full):
        return ctx.b.pad(x, pads=[int(p) for p in full], mode=mode, value=value)
    if mode != "constant":
        raise ctx.unsupported(f"{mode} padding by the symbolic amounts {[str(p) for p in full]}")
    out = x
    for k in range(r):
        out = _pad_axis(ctx, out, k, full[k], False, value)
        out = _pad_axis(ctx, out, k, full[k + r], True, value)
    return out


def _pad_axis(ctx: NodeCtx, x: Value, axis: int, amount: Dim, at_end: bool, value: float) -> Value:
    """Constant padding of one side of one axis by a symbolic amount: a filled block concatenated
    when the amount is provably non-negative, a crop when it is provably non-positive."""
    if isinstance(amount, int) and amount == 0:
        return x
    lo, hi = dim_bounds(amount)
    shape = list(x.shape)
    if lo is not None and lo >= 0:
        shape[axis] = amount
        fill = bool(value) if x.dtype is DType.bool else int(value) if x.dtype.is_int else value
        block = ctx.b.fill(shape=shape, value=fill, dtype=x.dtype)
        return ctx.b.concat(x, block, axis=axis) if at_end else ctx.b.concat(block, x, axis=axis)
    if hi is not None and hi <= 0:
        starts: list[Dim] = [0] * x.type.rank
        if at_end:
            shape[axis] = shape[axis] + amount
        else:
            starts[axis] = -amount
        return ctx.b.slice(x, starts=starts, ends=shape, steps=[1] * x.type.rank)
    raise SymbolicValueRequired(f"the sign of the pad {amount}", ctx.location)


@onnx_op("CenterCropPad", emits=("slice", "pad"))
def center_crop_pad(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank
    target = static_ints(ctx, 1, "shape")
    axes = norm_axes(ctx, ctx.attr_ints("axes", list(range(r))), r)
    if len(target) != len(axes):
        raise ShapeError(f"shape has {len(target)} entries for {len(axes)} axes", location=ctx.location)
    starts: list[Dim] = [0] * r
    ends: list[Dim] = list(x.shape)
    pads = [0] * (2 * r)
    for a, t in zip(axes, target, strict=True):
        d = x.shape[a]
        if not isinstance(d, int):
            raise ctx.unsupported(f"axis {a} has the symbolic size {d}")
        if t < d:
            starts[a] = (d - t) // 2
            ends[a] = starts[a] + t
        elif t > d:
            pads[a] = (t - d) // 2
            pads[a + r] = t - d - pads[a]
    out = x
    if starts != [0] * r or ends != list(x.shape):
        out = ctx.b.slice(out, starts=starts, ends=ends, steps=[1] * r)
    if any(pads):
        out = ctx.b.pad(out, pads=pads, mode="constant", value=0.0)
    return out


# --------------------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth


def _blocked_input(ctx: NodeCtx) -> tuple[Value, int]:
    """The NCHW input of DepthToSpace / SpaceToDepth and its blocksize."""
    x = ctx.input(0)
    if x.type.rank != 4:
        raise ctx.unsupported(f"input of rank {x.type.rank} (expected 4)")
    return x, ctx.attr_int("blocksize")


def _rearranged(ctx: NodeCtx, x: Value, split: list[Dim], perm: list[int], out: list[Dim]) -> Value:
    """``x`` viewed as ``split``, its axes permuted by ``perm``, then viewed as ``out``."""
    t = ctx.b.transpose(ctx.b.reshape(x, shape=split), perm=perm)
    return ctx.b.reshape(t, shape=out)


@onnx_op("DepthToSpace", emits=("reshape", "transpose"))
def depth_to_space(ctx: NodeCtx) -> Value:
    x, bs = _blocked_input(ctx)
    n, c, h, w = x.shape
    if isinstance(c, int) and c % (bs * bs):
        raise ShapeError(f"{c} channels do not divide by blocksize^2 = {bs * bs}", location=ctx.location)
    cb = c // (bs * bs)
    out: list[Dim] = [n, cb, h * bs, w * bs]
    if ctx.attr_str("mode", "DCR") == "DCR":
        return _rearranged(ctx, x, [n, bs, bs, cb, h, w], [0, 3, 4, 1, 5, 2], out)
    return _rearranged(ctx, x, [n, cb, bs, bs, h, w], [0, 1, 4, 2, 5, 3], out)


@onnx_op("SpaceToDepth", emits=("reshape", "transpose"))
def space_to_depth(ctx: NodeCtx) -> Value:
    x, bs = _blocked_input(ctx)
    n, c, h, w = x.shape
    for d in (h, w):
        if isinstance(d, int) and d % bs:
            raise ShapeError(f"spatial dim {d} does not divide by blocksize {bs}", location=ctx.location)
    crd = ctx.attr_str("mode", "DCR") == "CRD"
    return _rearranged(ctx, x, [n, c, h // bs, bs, w // bs, bs], [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4],
                       [n, c * bs * bs, h // bs, w // bs])


# --------------------------------------------------------------------------------------
# Resize, Upsample


def _scaled_dim(ctx: NodeCtx, d: Dim, scale: float) -> Dim:
    """floor(d * scale), as the ONNX reference computes output sizes from scales (exactly, for a
    symbolic dim and a scale that is a small fraction)."""
    if isinstance(d, int):
        return int(np.float64(scale) * d)
    return floor_of(times(d, scale, ctx.location), ctx.location)


def _resize(ctx: NodeCtx, x: Value, scales: list[float] | None, sizes: list[Dim] | None, **attrs: object) -> Value:
    r = x.type.rank
    if sizes is not None:
        out = list(sizes)
        sc: list[float] = []
        for d, o in zip(x.shape, out, strict=True):
            if d == o:
                sc.append(1.0)
            elif isinstance(d, int) and isinstance(o, int):
                sc.append(o / d)
            else:
                sc.append(float(require(exact_ratio(o, d), f"the Resize scale {o} / {d}", ctx.location)))
    else:
        assert scales is not None
        sc = list(scales)
        out = [_scaled_dim(ctx, d, s) for d, s in zip(x.shape, sc, strict=True)]
    if len(sc) != r:
        raise ShapeError(f"{len(sc)} scales/sizes for rank {r}", location=ctx.location)
    return ctx.b.resize(x, sizes=out, scales=sc, **attrs)


@onnx_op("Resize", emits=("resize",))
def resize(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    r = x.type.rank
    mode = ctx.attr_str("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"mode {mode!r}")
    if ctx.opset < 11:
        scales = [float(s) for s in np.asarray(ctx.static(1)).reshape(-1)]
        return _resize(ctx, x, scales, None, mode=mode, coordinate_transformation_mode="asymmetric",
                       nearest_mode=_legacy_nearest(ctx, scales))
    roi_in = [float(v) for v in np.asarray(ctx.static(1)).reshape(-1)] if ctx.has_input(1) else []
    scales_in = [float(v) for v in np.asarray(ctx.static(2)).reshape(-1)] if ctx.has_input(2) else []
    sizes_in = static_dims(ctx, 3) if ctx.has_input(3) else []
    if bool(scales_in) == bool(sizes_in):
        raise ShapeError("exactly one of scales and sizes must be given", location=ctx.location)
    axes = norm_axes(ctx, ctx.attr_ints("axes", list(range(r))), r)
    k = len(axes)
    coord = ctx.attr_str("coordinate_transformation_mode", "half_pixel")
    roi: list[float] = []
    if coord == "tf_crop_and_resize":
        if len(roi_in) != 2 * k:
            raise ShapeError(f"roi needs {2 * k} entries", location=ctx.location)
        roi = [0.0] * r + [1.0] * r
        for j, a in enumerate(axes):
            roi[a], roi[a + r] = roi_in[j], roi_in[j + k]
    attrs = dict(mode=mode, coordinate_transformation_mode=coord,
                 nearest_mode=ctx.attr_str("nearest_mode", "round_prefer_floor"), roi=roi,
                 cubic_coeff_a=ctx.attr_float("cubic_coeff_a", -0.75),
                 exclude_outside=bool(ctx.attr_int("exclude_outside", 0)),
                 extrapolation_value=ctx.attr_float("extrapolation_value", 0.0),
                 antialias=bool(ctx.attr_int("antialias", 0)) and mode != "nearest")
    if scales_in:
        if len(scales_in) != k:
            raise ShapeError(f"{len(scales_in)} scales for {k} axes", location=ctx.location)
        scales = [1.0] * r
        for a, s in zip(axes, scales_in, strict=True):
            scales[a] = s
        return _resize(ctx, x, scales, None, **attrs)
    if len(sizes_in) != k:
        raise ShapeError(f"{len(sizes_in)} sizes for {k} axes", location=ctx.location)
    sizes = list(x.shape)
    for a, s in zip(axes, sizes_in, strict=True):
        sizes[a] = s
    policy = ctx.attr_str("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return _resize(ctx, x, None, sizes, **attrs)
    return _resize_kept(ctx, x, _keep_aspect(ctx, x, sizes, axes, policy), axes, **attrs)


def _keep_aspect(ctx: NodeCtx, x: Value, sizes: list[Dim], axes: list[int], policy: str) -> list[float]:
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy {policy!r}")
    ratios = []
    for a in axes:
        d, o = x.shape[a], sizes[a]
        if not (isinstance(d, int) and isinstance(o, int)):
            raise ctx.unsupported("keep_aspect_ratio_policy with symbolic dims")
        ratios.append(o / d)
    s = min(ratios) if policy == "not_larger" else max(ratios)
    return [s if k in axes else 1.0 for k in range(x.type.rank)]


def _resize_kept(ctx: NodeCtx, x: Value, scales: list[float], axes: list[int], **attrs: object) -> Value:
    """keep_aspect_ratio_policy: one scale for every resized axis, sizes rounded half up."""
    out: list[Dim] = list(x.shape)
    for k in axes:
        d = x.shape[k]
        assert isinstance(d, int)  # _keep_aspect refuses symbolic dims on the resized axes
        out[k] = int(scales[k] * d + 0.5)
    return ctx.b.resize(x, sizes=out, scales=scales, **attrs)


def _legacy_nearest(ctx: NodeCtx, scales: Sequence[float]) -> str:
    """Upsample and opset-10 Resize read the source pixel at floor(i / scale) when enlarging."""
    if all(s >= 1.0 for s in scales):
        return "floor"
    if all(s <= 1.0 for s in scales):
        return "ceil"
    raise ctx.unsupported("nearest resizing that enlarges some axes and shrinks others (opset < 11)")


@onnx_op("Upsample", emits=("resize",))
def upsample(ctx: NodeCtx) -> Value:
    x = ctx.input(0)
    mode = ctx.attr_str("mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.unsupported(f"mode {mode!r}")
    if ctx.opset < 9:
        scales = [float(s) for s in ctx.attr_floats("scales")]
    else:
        scales = [float(s) for s in np.asarray(ctx.static(1)).reshape(-1)]
    return _resize(ctx, x, scales, None, mode=mode, coordinate_transformation_mode="asymmetric",
                   nearest_mode=_legacy_nearest(ctx, scales))
