"""ONNX AffineGrid, GridSample, RoiAlign and DeformConv: constant coordinate grids, and per-axis
interpolation taps read with gathers at coordinates computed at run time."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.frontend.onnx_node import ONNX_DTYPES, NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import cast_to, fill, scalar, static_dims, static_scalar, take
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value


@onnx_op("AffineGrid", emits=("cast", "matmul", "reshape"))
def affine_grid(ctx: NodeCtx) -> Value:
    """grid[n, *p] = theta[n] @ (x, y[, z], 1) over the normalized output coordinates p (in f64)."""
    b = ctx.b
    theta = ctx.input(0)
    size = [int(d) for d in np.asarray(ctx.static(1)).tolist()]
    spatial = size[2:]
    if len(spatial) not in (2, 3) or any(d <= 0 for d in spatial):
        raise ctx.unsupported(f"size {size} (2-D or 3-D, positive)")
    align = bool(ctx.attr_int("align_corners", 0))

    def coords(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.array([-1.0])
        return (2.0 * np.arange(n) + 1.0) / n - 1.0

    mesh = np.meshgrid(*(coords(n) for n in spatial), indexing="ij")  # one per axis, outermost first
    points = np.stack([*reversed(mesh), np.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    grid = b.matmul(b.const(points), cast_to(b, theta, DType.f64), transpose_b=True)  # [N, P, k]
    out = b.reshape(grid, shape=[theta.shape[0], *spatial, len(spatial)])
    return cast_to(b, out, theta.dtype)


@onnx_op("MelWeightMatrix", emits=("const",))
def mel_weight_matrix(ctx: NodeCtx) -> Value:
    """Triangular mel filters over the DFT bins: every operand is a compile-time scalar, so the
    matrix is a constant (the ONNX spec's construction, bin edges truncated to integers)."""
    mels, length = int(static_scalar(ctx, 0)), int(static_scalar(ctx, 1))
    rate = int(static_scalar(ctx, 2))
    low, high = float(static_scalar(ctx, 3)), float(static_scalar(ctx, 4))
    dtype = ONNX_DTYPES.get(ctx.attr_int("output_datatype", 1))
    if dtype is None or mels <= 0 or length <= 0 or rate <= 0:
        raise ctx.unsupported(f"num_mel_bins {mels}, dft_length {length}, sample_rate {rate}")

    def to_mel(hz: float) -> float:
        return 2595.0 * np.log1p(hz / 700.0) / np.log(10.0)

    lo_mel, hi_mel = to_mel(low), to_mel(high)
    points = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    hz = 700.0 * np.expm1(points / 2595.0 * np.log(10.0))
    edges = (((length + 1) * hz) // rate).astype(np.int64)
    table = np.zeros((length // 2 + 1, mels))
    for m in range(mels):
        left, center, right = (int(e) for e in edges[m:m + 3])
        if center == left:
            table[center, m] = 1.0
        else:
            table[left:center + 1, m] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            table[center:right, m] = (right - np.arange(center, right)) / (right - center)
    return ctx.b.const(table.astype(dtype.np))


_CUBIC_A = -0.75


class _Arith:
    """Scalar-constant arithmetic on tensors of one dtype (keeps the sampling formulas readable)."""

    def __init__(self, b: Builder, dtype: DType) -> None:
        self.b, self.dt = b, dtype

    def c(self, v: float) -> Value:
        return scalar(self.b, v, self.dt)

    def add(self, x: Value, y: Value | float) -> Value:
        return self.b.add(x, y if isinstance(y, Value) else self.c(y))

    def sub(self, x: Value | float, y: Value | float) -> Value:
        return self.b.sub(x if isinstance(x, Value) else self.c(x), y if isinstance(y, Value) else self.c(y))

    def mul(self, x: Value, y: Value | float) -> Value:
        return self.b.mul(x, y if isinstance(y, Value) else self.c(y))

    def reflect(self, x: Value, lo: float, hi: float) -> Value:
        """Fold x back into [lo, hi] by mirroring at the bounds (values inside stay)."""
        b = self.b
        span = hi - lo
        if span <= 0:
            return self.add(self.mul(x, 0.0), lo)
        below, above = b.less(x, self.c(lo)), b.greater(x, self.c(hi))
        dist = b.where(below, self.sub(lo, x), self.sub(x, hi))
        folds = b.floor(b.div(dist, self.c(span)))
        rest = self.sub(dist, self.mul(folds, span))
        even = b.equal(b.mod(folds, self.c(2.0)), self.c(0.0))
        from_lo = b.where(even, self.add(rest, lo), self.sub(hi, rest))
        from_hi = b.where(even, self.sub(hi, rest), self.add(rest, lo))
        return b.where(below, from_lo, b.where(above, from_hi, x))


def _cubic_weights(ar: _Arith, t: Value) -> list[Value]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = _CUBIC_A
    t1, u, u1 = ar.add(t, 1.0), ar.sub(1.0, t), ar.sub(2.0, t)

    def far(s: Value) -> Value:  # |s| in [1, 2)
        return ar.sub(ar.mul(ar.add(ar.mul(ar.sub(ar.mul(s, a), 5 * a), s), 8 * a), s), 4 * a)

    def near(s: Value) -> Value:  # |s| in [0, 1)
        return ar.add(ar.mul(ar.mul(ar.sub(ar.mul(s, a + 2), a + 3), s), s), 1.0)

    return [far(t1), near(t), near(u), far(u1)]


Tap = tuple[Value, Value | None, Value | None]
"""One interpolation tap along an axis: its index (i64), its weight (None: 1) and its in-bounds
mask (None: always in bounds)."""


def _axis_taps(ar: _Arith, pos: Value, size: int, mode: str, padding: str, align: bool) -> list[Tap]:
    """The taps that sample one axis of extent ``size`` at the pixel coordinates ``pos``, with
    GridSample's interpolation modes and padding rules (shared by every sampling op)."""
    b = ar.b
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        pos = b.round(pos)
    # cubic pads only its taps (as ONNX Runtime and PyTorch do); the others pad the coordinate first
    if padding == "border" and mode != "cubic":
        outside = b.logical_or(b.less(pos, ar.c(lo)), b.greater(pos, ar.c(hi)))
        pos = b.where(outside, b.clip(pos, min=0.0, max=size - 1.0), pos)
    elif padding == "reflection" and mode != "cubic":
        pos = ar.reflect(pos, lo, hi)
    if mode == "nearest":
        starts, weights = [pos], [None]
    else:
        base = b.floor(pos)
        frac = ar.sub(pos, base)
        if mode == "linear":
            starts, weights = [base, ar.add(base, 1.0)], [ar.sub(1.0, frac), frac]
        else:
            starts = [ar.add(base, float(k)) for k in (-1, 0, 1, 2)]
            weights = _cubic_weights(ar, frac)
    taps: list[Tap] = []
    for tap, w in zip(starts, weights, strict=True):
        valid = None
        if padding == "zeros":
            valid = b.logical_and(b.greater_equal(tap, ar.c(0.0)), b.less(tap, ar.c(size - 0.5)))
        elif padding == "reflection":
            tap = ar.reflect(tap, lo, hi)
        idx = b.cast(b.clip(tap, min=0.0, max=size - 1.0), to=DType.i64)
        taps.append((idx, w, valid))
    return taps


def _broadcast_to(b: Builder, v: Value, shape: Sequence[Dim]) -> Value:
    return v if tuple(v.shape) == tuple(shape) else b.expand(v, shape=list(shape))


def _gather_taps(b: Builder, x: Value, per_axis: Sequence[Sequence[Tap]], out_sp: Sequence[Dim]) -> list[Value]:
    """x [n, ch, *sizes] read at every combination of one tap per spatial axis, each masked and
    weighted: one [n, ch, *out_sp] term per combination (the tap tensors broadcast to
    [n, *out_sp]). A sampler sums the terms; RoiAlign's max mode takes their maximum."""
    n, ch = x.shape[0], x.shape[1]
    sizes = [int(d) for d in x.shape[2:]]
    strides = [int(np.prod(sizes[a + 1:])) for a in range(len(sizes))]
    flat_x = b.reshape(x, shape=[n, ch, int(np.prod(sizes))])
    q: Dim = 1
    for d in out_sp:
        q = q * d
    full = [n, *out_sp]
    terms: list[Value] = []
    for combo in itertools.product(*per_axis):
        flat: Value | None = None
        weight: Value | None = None
        valid: Value | None = None
        for (idx, w, ok), stride in zip(combo, strides, strict=True):
            term = b.mul(idx, scalar(b, stride, DType.i64)) if stride != 1 else idx
            flat = term if flat is None else b.add(flat, term)
            if w is not None:
                weight = w if weight is None else b.mul(weight, w)
            if ok is not None:
                valid = ok if valid is None else b.logical_and(valid, ok)
        assert flat is not None
        flat = b.reshape(_broadcast_to(b, flat, full), shape=[n, 1, q])
        gathered = b.gather_elements(flat_x, b.expand(flat, shape=[n, ch, q]), axis=2)
        vals = b.reshape(gathered, shape=[n, ch, *out_sp])
        if valid is not None:
            valid = b.reshape(_broadcast_to(b, valid, full), shape=[n, 1, *out_sp])
            vals = b.where(valid, vals, scalar(b, 0.0, x.dtype))
        if weight is not None:
            weight = b.reshape(_broadcast_to(b, cast_to(b, weight, x.dtype), full), shape=[n, 1, *out_sp])
            vals = b.mul(vals, weight)
        terms.append(vals)
    return terms


def _sum(b: Builder, terms: Sequence[Value]) -> Value:
    total = terms[0]
    for t in terms[1:]:
        total = b.add(total, t)
    return total


def _max(b: Builder, terms: Sequence[Value]) -> Value:
    top = terms[0]
    for t in terms[1:]:
        top = b.max(top, t)
    return top


def _coord_dtype(dtype: DType) -> DType:
    """Sampling coordinates are computed in f64 for f64 data and in f32 otherwise (f16 and bf16
    cannot hold pixel positions of larger images exactly)."""
    return DType.f64 if dtype is DType.f64 else DType.f32


@onnx_op("GridSample", emits=("gather", "gather_elements", "mul", "add", "sub", "div", "floor", "round", "clip",
                              "less", "greater", "greater_equal", "where", "mod", "equal", "cast", "reshape",
                              "expand", "logical_and", "logical_or"))
def grid_sample(ctx: NodeCtx) -> Value:
    """Sample x at the grid's normalized coordinates (nearest, linear or cubic; zeros, border or
    reflection padding). Nearest rounds half to even; a reflected coordinate is folded at the
    bounds as many times as it takes."""
    b = ctx.b
    x, grid = ctx.input(0), ctx.input(1)
    mode = ctx.attr_str("mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = ctx.attr_str("padding_mode", "zeros")
    align = bool(ctx.attr_int("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"mode {mode!r} with padding_mode {padding!r}")
    sizes = static_dims(x, ctx, "GridSample")[2:]
    rank = len(sizes)
    if rank < 1 or grid.shape[-1] != rank:
        raise ctx.unsupported(f"grid {grid.type} does not match the {rank} spatial dims of {x.type}")
    ar = _Arith(b, grid.dtype)
    per_axis: list[list[Tap]] = []
    for a, size in enumerate(sizes):
        g = take(b, grid, grid.type.rank - 1, rank - 1 - a)  # the grid lists x (innermost axis) first
        pos = ar.mul(ar.add(g, 1.0), (size - 1) / 2.0) if align else ar.mul(ar.sub(ar.mul(ar.add(g, 1.0), size),
                                                                                     1.0), 0.5)
        per_axis.append(_axis_taps(ar, pos, size, mode, padding, align))
    return _sum(b, _gather_taps(b, x, per_axis, list(grid.shape[1:-1])))


_ROI_EMITS = ("cast", "gather", "gather_elements", "reshape", "expand", "mul", "add", "sub", "div", "max", "floor",
              "clip", "less", "greater", "less_equal", "greater_equal", "logical_and", "logical_or", "where",
              "reduce_sum", "reduce_max")


def _roi_grid(ctx: NodeCtx, scale: float, half_pixel: bool, out_hw: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Each ROI's adaptive sample count per bin along y and x (sampling_ratio 0): the ceiling of
    its bin size. It sizes the graph, so the ROI values are needed at compile time (a graph input
    raises StaticInputRequired: the backend then imports the model per value of rois)."""
    rois = np.asarray(ctx.static(1))
    if rois.dtype.kind != "f" or rois.ndim != 2 or rois.shape[1] != 4:
        raise ctx.unsupported(f"rois {rois.dtype}{list(rois.shape)} with sampling_ratio 0")
    f = rois.dtype.type  # the reference evaluator computes in the rois' own precision
    corners = rois * f(scale) - f(0.5 if half_pixel else 0.0)
    extents = [corners[:, 3] - corners[:, 1], corners[:, 2] - corners[:, 0]]
    if not half_pixel:
        extents = [np.maximum(e, f(1.0)) for e in extents]
    return tuple(np.ceil(e / f(n)).astype(np.int64) for e, n in zip(extents, out_hw, strict=True))


def _roi_coords(ar: _Arith, start: Value, bins: Value, count: Value, out: int, samples: int, axis: int) -> Value:
    """start + p * bin + (i + 0.5) * bin / count (the reference's order of operations) for bin p
    and sample i, laid out along ``axis`` (1 for y, 3 for x) of [R, out_h, samples_h, out_w, samples_w]."""
    shape = [1] * 5
    shape[axis] = out
    bin_pos = ar.b.const(np.arange(out, dtype=ar.dt.np).reshape(shape))
    shape[axis], shape[axis + 1] = 1, samples
    sample_pos = ar.b.const((np.arange(samples) + 0.5).astype(ar.dt.np).reshape(shape))
    return ar.add(ar.add(start, ar.mul(bin_pos, bins)), ar.b.div(ar.mul(sample_pos, bins), count))


@onnx_op("RoiAlign", emits=_ROI_EMITS)
def roi_align(ctx: NodeCtx) -> Value:
    """Average (or max) of bilinear samples on a regular grid in each output bin of each ROI,
    read from the ROI's batch image. Samples beyond one pixel outside the image count as 0; the
    others clamp to the border. Max mode keeps, per sample, the largest of its four weighted
    corner values, then the largest over the bin (as the ONNX reference evaluator does)."""
    b = ctx.b
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    mode = ctx.attr_str("mode", "avg")
    # opset 10 has no coordinate_transformation_mode: its behaviour is output_half_pixel
    transform = ctx.attr_str("coordinate_transformation_mode", "half_pixel") if ctx.opset >= 16 \
        else "output_half_pixel"
    out_hw = (ctx.attr_int("output_height", 1), ctx.attr_int("output_width", 1))
    ratio = ctx.attr_int("sampling_ratio", 0)
    scale = ctx.attr_float("spatial_scale", 1.0)
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        raise ctx.unsupported(f"mode {mode!r} with coordinate_transformation_mode {transform!r}")
    if x.type.rank != 4 or rois.type.rank != 2 or rois.shape[1] != 4 or min(out_hw) < 1 or ratio < 0:
        raise ctx.unsupported(f"X {x.type}, rois {rois.type}, output {out_hw[0]} x {out_hw[1]}, "
                              f"sampling_ratio {ratio}")
    height, width = x.shape[2:]
    if not isinstance(height, int) or not isinstance(width, int):
        raise ctx.unsupported(f"RoiAlign needs static spatial dims, got {x.type}")
    half_pixel = transform == "half_pixel"
    # samples per bin along y and x, and (where ROIs differ) each ROI's own counts below them
    grid = _roi_grid(ctx, scale, half_pixel, out_hw) if ratio == 0 else None
    if grid is not None and all(g.size and g.min() == g.max() > 0 for g in grid):
        samples, grid = (int(grid[0][0]), int(grid[1][0])), None
    elif grid is not None:
        samples = (max(1, int(grid[0].max(initial=0))), max(1, int(grid[1].max(initial=0))))
    else:
        samples = (ratio, ratio)

    ar = _Arith(b, _coord_dtype(rois.dtype))
    r = rois.shape[0]
    per_roi = [r, 1, 1, 1, 1]
    shift = 0.5 if half_pixel else 0.0
    boxes = cast_to(b, rois, ar.dt)
    x1, y1, x2, y2 = (b.reshape(ar.sub(ar.mul(take(b, boxes, 1, k), scale), shift), shape=per_roi) for k in range(4))
    coords: list[Value] = []
    for axis, lo, hi in ((0, y1, y2), (1, x1, x2)):
        extent = ar.sub(hi, lo)
        if not half_pixel:
            extent = b.max(extent, ar.c(1.0))  # malformed ROIs become 1 x 1
        bins = b.div(extent, ar.c(float(out_hw[axis])))
        count = ar.c(float(samples[axis])) if grid is None else \
            b.const(np.maximum(grid[axis], 1).astype(ar.dt.np).reshape(per_roi))
        coords.append(_roi_coords(ar, lo, bins, count, out_hw[axis], samples[axis], 1 + 2 * axis))
    ys, xs = coords
    inside = b.logical_and(
        b.logical_and(b.greater_equal(ys, ar.c(-1.0)), b.less_equal(ys, ar.c(float(height)))),
        b.logical_and(b.greater_equal(xs, ar.c(-1.0)), b.less_equal(xs, ar.c(float(width)))))
    # the reference's clamping (below 0 to 0, from size - 1 on to size - 1) is border padding
    taps = [_axis_taps(ar, ys, height, "linear", "border", True), _axis_taps(ar, xs, width, "linear", "border", True)]
    out_sp = [out_hw[0], samples[0], out_hw[1], samples[1]]
    terms = _gather_taps(b, b.gather(x, batch, axis=0), taps, out_sp)  # from each ROI's image [R, C, H, W]
    sampled = _sum(b, terms) if mode == "avg" else _max(b, terms)
    sampled = b.where(b.reshape(inside, shape=[r, 1, *out_sp]), sampled, scalar(b, 0.0, x.dtype))
    return _pool_samples(b, sampled, mode, grid, samples)


def _pool_samples(b: Builder, sampled: Value, mode: str, grid: Sequence[np.ndarray] | None,
                  counts: tuple[int, int]) -> Value:
    """Reduce the [R, C, out_h, samples_h, out_w, samples_w] samples over each bin. ``grid``
    gives per-ROI sample counts below the padded ``counts``: the extra samples are left out
    (a ROI without samples gives 0)."""
    dtype = sampled.dtype
    if grid is None:
        if mode == "avg":
            total = b.reduce_sum(sampled, axes=[3, 5])
            return b.div(total, scalar(b, float(counts[0] * counts[1]), dtype))
        return b.reduce_max(sampled, axes=[3, 5])
    gh, gw = grid
    used = (np.arange(counts[0])[None, :, None] < gh[:, None, None]) & \
        (np.arange(counts[1])[None, None, :] < gw[:, None, None])  # [R, samples_h, samples_w]
    used_c = b.const(used.reshape(len(gh), 1, 1, counts[0], 1, counts[1]))
    if mode == "avg":
        total = b.reduce_sum(b.where(used_c, sampled, scalar(b, 0.0, dtype)), axes=[3, 5])
        count = np.maximum(gh * gw, 1).astype(dtype.np).reshape(-1, 1, 1, 1)
        return b.div(total, b.const(count))
    top = b.reduce_max(b.where(used_c, sampled, scalar(b, -np.inf, dtype)), axes=[3, 5])
    empty = ~used.reshape(len(gh), -1).any(axis=1)
    if empty.any():
        top = b.where(b.const(empty.reshape(-1, 1, 1, 1)), scalar(b, 0.0, dtype), top)
    return top


@dataclass(frozen=True)
class _DeformGeometry:
    """A 2-D DeformConv's kernel, window attributes, groups and output size."""

    kernel: tuple[int, int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]
    group: int
    offset_group: int
    out: tuple[int, int]

    def base(self, axis: int) -> np.ndarray:
        """Each kernel tap's undeformed position along ``axis``: output index * stride - pad +
        tap index * dilation, shaped to broadcast over [N, offset_group, kh, kw, oh, ow]."""
        taps, outs = [1] * 6, [1] * 6
        taps[2 + axis], outs[4 + axis] = self.kernel[axis], self.out[axis]
        tap_pos = (np.arange(self.kernel[axis]) * self.dilations[axis]).reshape(taps)
        out_pos = (np.arange(self.out[axis]) * self.strides[axis] - self.pads[axis]).reshape(outs)
        return (tap_pos + out_pos).astype(np.float64)


def _deform_geometry(ctx: NodeCtx, x: Value, w: Value, offset: Value) -> _DeformGeometry:
    """DeformConv's attributes, checked against the input, weight and offset shapes."""
    if x.type.rank != 4 or w.type.rank != 4 or not all(isinstance(d, int) for d in [*x.shape[1:], *w.shape]):
        raise ctx.unsupported(f"X {x.type} with W {w.type}: only 2-D DeformConv with static channel, spatial "
                              "and weight dims is supported")
    ch, height, width = (int(d) for d in x.shape[1:])
    oc, icg, kh, kw = (int(d) for d in w.shape)
    kernel = ctx.attr_ints("kernel_shape", [kh, kw])
    strides, dilations = ctx.attr_ints("strides", [1, 1]), ctx.attr_ints("dilations", [1, 1])
    pads = ctx.attr_ints("pads", [0, 0, 0, 0])
    group, og = ctx.attr_int("group", 1), ctx.attr_int("offset_group", 1)
    if kernel != [kh, kw] or len(strides) != 2 or len(dilations) != 2 or len(pads) != 4 \
            or min(strides + dilations) < 1:
        raise ctx.unsupported(f"kernel_shape {kernel} with W {w.type}, strides {strides}, dilations {dilations}, "
                              f"pads {pads}")
    if group < 1 or og < 1 or ch != icg * group or oc % group or ch % og:
        raise ctx.unsupported(f"group {group}, offset_group {og} with X {x.type} and W {w.type}")
    out = tuple((size + pads[a] + pads[a + 2] - (k - 1) * dilations[a] - 1) // strides[a] + 1
                for a, (size, k) in enumerate(((height, kh), (width, kw))))
    if min(out) < 1 or list(offset.shape[1:]) != [og * kh * kw * 2, *out]:
        raise ctx.unsupported(f"offset {offset.type} for output {list(out)}, offset_group {og} and kernel "
                              f"{kh} x {kw}")
    return _DeformGeometry((kh, kw), strides, dilations, pads, group, og, (out[0], out[1]))


@onnx_op("DeformConv", emits=("cast", "gather", "gather_elements", "reshape", "expand", "mul", "add", "sub",
                              "floor", "clip", "less", "greater_equal", "logical_and", "where", "matmul"))
def deform_conv(ctx: NodeCtx) -> Value:
    """Convolution whose kernel taps sit at learned offsets: each tap of each offset group is a
    bilinear sample (zero outside the image) at its shifted position, scaled by the mask; the
    samples then meet the weights in one matmul per group. Positions are computed in f64, as
    the reference evaluator does."""
    b = ctx.b
    x, w, offset = ctx.input(0), ctx.input(1), ctx.input(2)
    geo = _deform_geometry(ctx, x, w, offset)
    (kh, kw), out, og, group = geo.kernel, list(geo.out), geo.offset_group, geo.group
    n = x.shape[0]
    ch, height, width = (int(d) for d in x.shape[1:])
    oc = int(w.shape[0])
    ar = _Arith(b, DType.f64)
    shifts = b.reshape(cast_to(b, offset, ar.dt), shape=[n, og, kh, kw, 2, *out])
    per_axis: list[list[Tap]] = []
    for axis, size in enumerate((height, width)):
        pos = b.add(b.const(geo.base(axis)), take(b, shifts, 4, axis))
        per_axis.append(_axis_taps(ar, b.reshape(pos, shape=[n * og, kh, kw, *out]), size, "linear", "zeros", True))
    images = b.reshape(x, shape=[n * og, ch // og, height, width])
    cols = _sum(b, _gather_taps(b, images, per_axis, [kh, kw, *out]))  # [N * og, C / og, kh, kw, oh, ow]
    if ctx.has_input(4):
        mask = ctx.input(4)
        if list(mask.shape[1:]) != [og * kh * kw, *out]:
            raise ctx.unsupported(f"mask {mask.type} for output {out}, offset_group {og} and kernel {kh} x {kw}")
        cols = b.mul(cols, b.reshape(mask, shape=[n * og, 1, kh, kw, *out]))
    depth = ch // group * kh * kw
    cols = b.reshape(cols, shape=[n, group, depth, out[0] * out[1]])
    weights = b.reshape(w, shape=[group, oc // group, depth])
    y = b.reshape(b.matmul(weights, cols), shape=[n, oc, *out])
    if ctx.has_input(3):
        bias = ctx.input(3)
        if list(bias.shape) != [oc]:
            raise ctx.unsupported(f"bias {bias.type} for {oc} output channels")
        y = b.add(y, b.reshape(bias, shape=[1, oc, 1, 1]))
    return y


@onnx_op("Col2Im", emits=("reshape", "fill", "expand", "scatter_elements", "slice"))
def col2im(ctx: NodeCtx) -> Value:
    """Sum each column entry into the image position its block offset and location give (a
    scatter-add through a constant index table), then crop the padding."""
    b = ctx.b
    x = ctx.input(0)
    image = [int(d) for d in np.asarray(ctx.static(1)).tolist()]
    block = [int(d) for d in np.asarray(ctx.static(2)).tolist()]
    r = len(image)
    strides = ctx.attr_ints("strides", [1] * r)
    dilations = ctx.attr_ints("dilations", [1] * r)
    pads = ctx.attr_ints("pads", [0] * (2 * r))
    n, cb, length = x.shape
    if len(block) != r or any(v <= 0 for v in [*image, *block, *strides, *dilations]) or not isinstance(cb, int):
        raise ctx.unsupported(f"image_shape {image}, block_shape {block}, strides {strides}, dilations {dilations}")
    padded = [image[a] + pads[a] + pads[a + r] for a in range(r)]
    counts = [(padded[a] - dilations[a] * (block[a] - 1) - 1) // strides[a] + 1 for a in range(r)]
    blocks, locations = int(np.prod(block)), int(np.prod(counts))
    if cb % blocks or length != locations:
        raise ctx.unsupported(f"input {x.type} does not hold {blocks} offsets x {locations} locations")
    channels = cb // blocks
    offs = np.stack(np.unravel_index(np.arange(blocks), block), axis=-1)  # [B, r]
    locs = np.stack(np.unravel_index(np.arange(locations), counts), axis=-1)  # [L, r]
    pos = offs[:, None, :] * np.array(dilations) + locs[None, :, :] * np.array(strides)  # [B, L, r]
    flat = np.ravel_multi_index(tuple(pos.reshape(-1, r).T), padded).astype(np.int64)  # [B*L]
    total = int(np.prod(padded))
    updates = b.reshape(x, shape=[n, channels, blocks * locations])
    idx = b.expand(b.const(flat.reshape(1, 1, -1)), shape=[n, channels, blocks * locations])
    out = b.scatter_elements(fill(b, [n, channels, total], 0.0, x.dtype), idx, updates, axis=2, reduction="add")
    out = b.reshape(out, shape=[n, channels, *padded])
    if any(pads):
        rank = 2 + r
        out = b.slice(out, starts=[0, 0, *pads[:r]], ends=[n, channels, *(pads[a] + image[a] for a in range(r))],
                      steps=[1] * rank)
    return out
