"""ONNX AffineGrid and GridSample: constant coordinate grids, per-axis taps and gathers."""

from __future__ import annotations

import itertools

import numpy as np

from cuvil.frontend.onnx_node import ONNX_DTYPES, NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import cast_to, fill, reshape_to, scalar, static_dims, static_scalar, take
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
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


@onnx_op("ArrayFeatureExtractor", domain="ai.onnx.ml", emits=("gather", "reshape"))
def array_feature_extractor(ctx: NodeCtx) -> Value:
    """x[..., indices] along the last axis, indices flattened; a vector input gives one row."""
    b = ctx.b
    x, idx = ctx.input(0), ctx.input(1)
    count = 1
    for d in idx.shape:
        count = count * d
    flat = reshape_to(b, idx, [count])
    out = b.gather(x, flat, axis=x.type.rank - 1)
    return reshape_to(b, out, [1, count]) if x.type.rank == 1 else out


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
    n, ch = x.shape[0], x.shape[1]
    out_sp = list(grid.shape[1:-1])
    ar = _Arith(b, grid.dtype)

    # per spatial axis: the taps as (index i64, weight or None, in-bounds mask or None)
    per_axis: list[list[tuple[Value, Value | None, Value | None]]] = []
    for a, size in enumerate(sizes):
        g = take(b, grid, grid.type.rank - 1, rank - 1 - a)  # the grid lists x (innermost axis) first
        pos = ar.mul(ar.add(g, 1.0), (size - 1) / 2.0) if align else ar.mul(ar.sub(ar.mul(ar.add(g, 1.0), size),
                                                                                     1.0), 0.5)
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
        taps = []
        for tap, w in zip(starts, weights, strict=True):
            valid = None
            if padding == "zeros":
                valid = b.logical_and(b.greater_equal(tap, ar.c(0.0)), b.less(tap, ar.c(size - 0.5)))
            elif padding == "reflection":
                tap = ar.reflect(tap, lo, hi)
            idx = b.cast(b.clip(tap, min=0.0, max=size - 1.0), to=DType.i64)
            taps.append((idx, w, valid))
        per_axis.append(taps)

    strides = [int(np.prod(sizes[a + 1:])) for a in range(rank)]
    flat_x = b.reshape(x, shape=[n, ch, int(np.prod(sizes))])
    q = 1
    for d in out_sp:
        q = q * d
    total: Value | None = None
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
        gathered = b.gather_elements(flat_x, b.expand(b.reshape(flat, shape=[n, 1, q]), shape=[n, ch, q]), axis=2)
        vals = b.reshape(gathered, shape=[n, ch, *out_sp])
        if valid is not None:
            vals = b.where(b.reshape(valid, shape=[n, 1, *out_sp]), vals, scalar(b, 0.0, x.dtype))
        if weight is not None:
            vals = b.mul(vals, b.reshape(cast_to(b, weight, x.dtype), shape=[n, 1, *out_sp]))
        total = vals if total is None else b.add(total, vals)
    assert total is not None
    return total


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
