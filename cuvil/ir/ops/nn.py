"""Neural-network ops: convolution, pooling, normalization, softmax, LRN.

Layout is NC* (batch, channel, spatial...). Window parameters follow ONNX: ``pads`` lists
the begin paddings of every spatial axis, then the end paddings; an empty ``strides``,
``pads`` or ``dilations`` means 1, 0 and 1 on every axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import exp, log, maximum, pow_, reduce_axes, sequential_dot, sequential_matmul
from cuvil.ir.opdef import REQUIRED, define, norm_axis
from cuvil.ir.ops.reduce import mean_numpy, round_once, wide_array
from cuvil.ir.symbolic import Dim, sym_min
from cuvil.ir.types import TensorType

# --------------------------------------------------------------------------------------
# window parameters shared by convolution and pooling


WindowParams = tuple[list[int], list[int], list[int], list[int]]
"""Per-axis strides, begin pads, end pads and dilations."""


def window_params(nsp: int, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int]) -> WindowParams:
    """Expand (possibly empty) strides/pads/dilations to per-axis lists: strides, begins, ends, dilations."""
    s = list(strides) or [1] * nsp
    d = list(dilations) or [1] * nsp
    p = list(pads) or [0] * (2 * nsp)
    if len(s) != nsp or len(d) != nsp or len(p) != 2 * nsp:
        raise ValueError(f"{nsp} spatial axes need {nsp} strides, {nsp} dilations and {2 * nsp} pads, "
                         f"got {len(s)}, {len(d)} and {len(p)}")
    if any(v < 1 for v in s) or any(v < 1 for v in d):
        raise ValueError(f"strides {s} and dilations {d} must be >= 1")
    return s, p[:nsp], p[nsp:], d


def _rule_window(c: R.RuleCtx) -> tuple[int, WindowParams]:
    """The number of spatial axes of a windowed op's first operand (NC* layout) and its window parameters."""
    nsp = c.inputs[0].rank - 2
    return nsp, window_params(nsp, c.attrs["strides"], c.attrs["pads"], c.attrs.get("dilations", ()))


def window_out_dim(size: Dim, k: int, s: int, pb: int, pe: int, d: int, ceil_mode: bool = False) -> Dim:
    """Number of windows along one axis; with ``ceil_mode`` the last partial window counts
    if it starts inside the input or its begin padding."""
    span = size + pb + pe - (d * (k - 1) + 1)
    if not ceil_mode:
        out = span // s + 1
    else:
        out = sym_min((span + s - 1) // s + 1, (size + pb - 1) // s + 1)
    if isinstance(out, int) and out < 1:
        raise ValueError(f"window of {k} (dilation {d}) does not fit an axis of {size} with pads ({pb}, {pe})")
    return out


def _index_in(ix: R.Ix, lo: Dim, hi: Dim) -> R.Expr:
    """``lo <= ix < hi`` as a bool scalar."""
    v = R.IndexValue(DType.i64, ix)
    return R.call("and", v >= R.IndexValue(DType.i64, R.as_ix(lo)), v < R.IndexValue(DType.i64, R.as_ix(hi)))


def _all(conds: Sequence[R.Expr]) -> R.Expr | None:
    out: R.Expr | None = None
    for cnd in conds:
        out = cnd if out is None else R.call("and", out, cnd)
    return out


def _acc_dtype(dt: np.dtype) -> np.dtype:
    """Half types are computed in f32 by the fast paths (numpy has no fast f16 GEMM)."""
    return np.dtype(np.float32) if (dt.kind == "f" and dt.itemsize < 4) or dt == DType.bf16.np else dt


def _pad_spatial(x: np.ndarray, begins: Sequence[int], ends: Sequence[int], value: Any) -> np.ndarray:
    """Pad (positive) or crop (negative) the spatial axes of an NC* array."""
    crop = tuple(slice(max(-b, 0), x.shape[2 + j] - max(-e, 0)) for j, (b, e) in enumerate(zip(begins, ends,
                                                                                             strict=True)))
    x = x[(slice(None), slice(None), *crop)]
    widths = [(0, 0), (0, 0)] + [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends, strict=True)]
    if any(w != (0, 0) for w in widths):
        x = np.pad(x, widths, mode="constant", constant_values=value)
    return x


def _tap_slices(taps: Sequence[int], out_sp: Sequence[int], s: Sequence[int], d: Sequence[int]) -> tuple:
    return (slice(None), slice(None), *(slice(t * dj, t * dj + (o - 1) * sj + 1, sj)
                                        for t, o, sj, dj in zip(taps, out_sp, s, d, strict=True)))


def _window_input(x: np.ndarray, out_sp: Sequence[int], k: Sequence[int], s: Sequence[int], pb: Sequence[int],
                  d: Sequence[int], value: Any) -> np.ndarray:
    """``x`` padded (or cropped) to exactly the extent the windows read."""
    need = [(o - 1) * sj + (kj - 1) * dj + 1 for o, kj, sj, dj in zip(out_sp, k, s, d, strict=True)]
    ends = [n - size - b for n, size, b in zip(need, x.shape[2:], pb, strict=True)]
    return _pad_spatial(x, pb, ends, value)


def _spatial_examples(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------
# conv


def _conv_operands(op: str, types: list[TensorType], strides: Sequence[int], pads: Sequence[int],
                   dilations: Sequence[int]) -> tuple[TensorType, TensorType, int, WindowParams]:
    """x, w, the number of spatial axes and the window parameters of a convolution, checked:
    one dtype, x of rank >= 3 and w of the same rank."""
    x, w = types
    if x.dtype is not w.dtype:
        raise TypeError(f"operand dtypes differ: {x.dtype} vs {w.dtype}")
    if x.rank < 3 or w.rank != x.rank:
        raise ValueError(f"{op} needs x of rank >= 3 and w of the same rank, got {x} and {w}")
    nsp = x.rank - 2
    return x, w, nsp, window_params(nsp, strides, pads, dilations)


def _check_groups(groups: int) -> None:
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")


def _static_kernel(w: TensorType) -> list[int]:
    """The spatial extents of a convolution's weight, which must be static."""
    ks = w.shape[2:]
    static = [k for k in ks if isinstance(k, int)]
    if len(static) != len(ks):
        raise ValueError(f"kernel dims must be static, got {list(map(str, ks))}")
    return static


def _conv_type(types: list[TensorType], strides: tuple[int, ...], pads: tuple[int, ...],
               dilations: tuple[int, ...], groups: int) -> TensorType:
    x, w, nsp, (s, pb, pe, d) = _conv_operands("conv", types, strides, pads, dilations)
    _check_groups(groups)
    c_in, c_out = x.shape[1], w.shape[0]
    if isinstance(c_out, int) and c_out % groups:
        raise ValueError(f"{c_out} output channels do not split into {groups} groups")
    if isinstance(c_in, int) and isinstance(w.shape[1], int) and c_in != w.shape[1] * groups:
        raise ValueError(f"x has {c_in} channels, w expects {w.shape[1]} per group x {groups} groups")
    ks = _static_kernel(w)
    out = [window_out_dim(x.shape[2 + j], ks[j], s[j], pb[j], pe[j], d[j]) for j in range(nsp)]
    return TensorType(x.dtype, (x.shape[0], c_out, *out))


def _conv_rule(c: R.RuleCtx) -> R.Expr:
    x, w = c.inputs
    nsp, (s, pb, _, d) = _rule_window(c)
    groups = c.attrs["groups"]
    n, o, *sp = c.out
    cg = w.shape[1]
    base = (o // (w.shape[0] // groups)) * cg if groups > 1 else R.Ix.lit(0)

    def body(ci: R.Ix, *ks: R.Ix) -> R.Expr:
        pos = [sp[j] * s[j] + ks[j] * d[j] - pb[j] for j in range(nsp)]
        return R.widen(x.at(n, base + ci, *pos, oob=0)) * R.widen(w.at(o, ci, *ks))

    return R.cast(R.reduce("sum", [cg, *w.shape[2:]], body), c.out_type.dtype)


def _windows_view(x: np.ndarray, out_sp: Sequence[int], k: Sequence[int], s: Sequence[int], pb: Sequence[int],
                  d: Sequence[int]) -> np.ndarray:
    """``[N, C, *k, *out_sp]``: every window a convolution reads, as a strided view of the zero-padded input
    (im2col without the copy)."""
    nsp = x.ndim - 2
    xp = np.ascontiguousarray(_window_input(x, out_sp, k, s, pb, d, 0))
    st = xp.strides
    return as_strided(xp, shape=(*x.shape[:2], *k, *out_sp),
                      strides=(st[0], st[1], *(st[2 + j] * d[j] for j in range(nsp)),
                               *(st[2 + j] * s[j] for j in range(nsp))), writeable=False)


def _conv_numpy(xs: list[np.ndarray], out: TensorType, strides: tuple[int, ...], pads: tuple[int, ...],
                dilations: tuple[int, ...], groups: int) -> np.ndarray:
    """im2col as a strided view, then one batched product per group, summed over (channel, taps)
    in the rule's order (``sequential_matmul``)."""
    x, w = xs
    acc = _acc_dtype(x.dtype)
    x, w = x.astype(acc, copy=False), w.astype(acc, copy=False)
    nsp = x.ndim - 2
    s, pb, _, d = window_params(nsp, strides, pads, dilations)
    out_sp = [int(v) for v in out.shape[2:]]
    k = w.shape[2:]
    view = _windows_view(x, out_sp, k, s, pb, d)
    n, c_in = x.shape[:2]
    c_out = w.shape[0]
    taps = math.prod(k)
    cols = view.reshape(n, groups, (c_in // groups) * taps, math.prod(out_sp))
    wm = w.reshape(groups, c_out // groups, (c_in // groups) * taps)
    y = sequential_matmul(wm, cols)
    return y.reshape(n, c_out, *out_sp).astype(out.dtype.np, copy=False)


def _conv_examples(rng: np.random.Generator) -> list:
    f = lambda *sh: _spatial_examples(rng, *sh)
    return [
        ([f(2, 3, 5), f(4, 3, 2)], {}),
        ([f(2, 3, 6, 5), f(4, 3, 3, 2)], {"strides": (2, 1), "pads": (1, 0, 2, 1)}),
        ([f(2, 4, 7, 6), f(6, 2, 3, 3)], {"groups": 2, "dilations": (2, 1), "pads": (1, 1, 1, 1)}),
        ([f(2, 3, 6, 5), f(3, 1, 3, 3)], {"groups": 3, "strides": (2, 2), "pads": (1, 1, 1, 1)}),
        ([f(2, 2, 4, 5, 3), f(3, 2, 2, 3, 2)], {"strides": (1, 2, 1), "pads": (0, 1, 1, 1, 0, 0)}),
    ]


define("conv", ("x", "w"),
       attrs={"strides": ("ints", ()), "pads": ("ints", ()), "dilations": ("ints", ()), "groups": ("int", 1)},
       shape=_conv_type, rule=_conv_rule, numpy=_conv_numpy, family="nn", examples=_conv_examples, contraction=True,
       doc="N-d grouped convolution (cross-correlation), NC* layout, w: [O, C/groups, *k]; zero padding; no bias")


# --------------------------------------------------------------------------------------
# bf16_conv: bfloat16 products accumulated in float32 over channel pairs, as x86's vdpbf16ps


def _bf16_conv_type(types: list[TensorType], strides: tuple[int, ...], pads: tuple[int, ...],
                    dilations: tuple[int, ...]) -> TensorType:
    if any(t.dtype is not DType.bf16 for t in types):
        raise TypeError(f"bf16_conv convolves bfloat16 operands, not {types[0].dtype} and {types[1].dtype}")
    t = _conv_type(types, strides, pads, dilations, 1)
    return TensorType(DType.f32, t.shape)


def _bf16_conv_rule(c: R.RuleCtx) -> R.Expr:
    x, w = c.inputs
    nsp, (s, pb, _, d) = _rule_window(c)
    n, o, *sp = c.out
    pairs = (w.shape[1] + 1) // 2

    def factors(j: R.Ix, *rest: R.Ix) -> tuple[R.Expr, R.Expr]:
        *ks, e = rest
        ci = j * 2 + 1 - e  # each pair's odd channel first; an odd count's last pair reads a zero past the end
        pos = [sp[k] * s[k] + ks[k] * d[k] - pb[k] for k in range(nsp)]
        return R.cast(x.at(n, ci, *pos, oob=0), DType.f32), R.cast(w.at(o, ci, *ks, oob=0), DType.f32)

    return R.dot("dot_ftz", [pairs, *w.shape[2:], 2], factors)


def _bf16_conv_numpy(xs: list[np.ndarray], out: TensorType, strides: tuple[int, ...], pads: tuple[int, ...],
                     dilations: tuple[int, ...]) -> np.ndarray:
    """im2col as a strided view, channels completed to pairs by a zero, then the rule's fused
    multiply-adds in its order (pair, taps, odd channel first)."""
    x, w = (a.astype(np.float32) for a in xs)
    nsp = x.ndim - 2
    s, pb, _, d = window_params(nsp, strides, pads, dilations)
    out_sp = [int(v) for v in out.shape[2:]]
    k = w.shape[2:]
    if x.shape[1] % 2:
        x = np.concatenate([x, np.zeros((x.shape[0], 1, *x.shape[2:]), np.float32)], axis=1)
        w = np.concatenate([w, np.zeros((w.shape[0], 1, *k), np.float32)], axis=1)
    view = _windows_view(x, out_sp, k, s, pb, d)
    n, c = x.shape[:2]
    taps = math.prod(k)
    cols = view.reshape(n, c // 2, 2, taps, math.prod(out_sp))[:, :, ::-1].transpose(0, 4, 1, 3, 2)
    wm = w.reshape(w.shape[0], c // 2, 2, taps)[:, :, ::-1].transpose(0, 1, 3, 2)
    x_seq = cols.reshape(n, 1, math.prod(out_sp), c * taps)  # [n, 1, P, (pair, tap, odd first)]
    w_seq = wm.reshape(1, w.shape[0], 1, c * taps)
    y = sequential_dot("dot_ftz", x_seq, w_seq, 3)
    return y.reshape(n, w.shape[0], *out_sp)


def _bf16_conv_examples(rng: np.random.Generator) -> list:
    import ml_dtypes

    f = lambda *sh: _spatial_examples(rng, *sh).astype(ml_dtypes.bfloat16)
    return [
        ([f(2, 4, 5), f(3, 4, 2)], {}),
        ([f(2, 3, 6, 5), f(4, 3, 3, 2)], {"strides": (2, 1), "pads": (1, 0, 2, 1)}),  # odd channels
        ([f(1, 2, 7, 6), f(2, 2, 3, 3)], {"dilations": (2, 1), "pads": (1, 1, 1, 1)}),
    ]


define("bf16_conv", ("x", "w"),
       attrs={"strides": ("ints", ()), "pads": ("ints", ()), "dilations": ("ints", ())},
       shape=_bf16_conv_type, rule=_bf16_conv_rule, numpy=_bf16_conv_numpy, family="nn", contraction=True,
       precision_policy="as-declared", examples=_bf16_conv_examples,
       doc="N-d convolution (cross-correlation, NC* layout, zero padding, no groups) of bfloat16 operands into "
           "float32: along channel pairs (each pair's odd channel first) and taps, pair outermost, every term a "
           "fused multiply-add with subnormal factors and sums flushed to zero (x86 vdpbf16ps); an odd channel "
           "count's last pair completed by a zero")


# --------------------------------------------------------------------------------------
# conv_transpose


def _conv_transpose_type(types: list[TensorType], strides: tuple[int, ...], pads: tuple[int, ...],
                         dilations: tuple[int, ...], groups: int, output_padding: tuple[int, ...]) -> TensorType:
    x, w, nsp, (s, pb, pe, d) = _conv_operands("conv_transpose", types, strides, pads, dilations)
    op = list(output_padding) or [0] * nsp
    if len(op) != nsp:
        raise ValueError(f"output_padding needs {nsp} entries, got {len(op)}")
    _check_groups(groups)
    if isinstance(x.shape[1], int) and isinstance(w.shape[0], int) and x.shape[1] != w.shape[0]:
        raise ValueError(f"x has {x.shape[1]} channels, w has {w.shape[0]} input channels")
    if isinstance(w.shape[0], int) and w.shape[0] % groups:
        raise ValueError(f"{w.shape[0]} input channels do not split into {groups} groups")
    ks = _static_kernel(w)
    out = [(x.shape[2 + j] - 1) * s[j] + (ks[j] - 1) * d[j] + 1 - pb[j] - pe[j] + op[j] for j in range(nsp)]
    if any(isinstance(v, int) and v < 1 for v in out):
        raise ValueError(f"output spatial shape {out} is empty")
    return TensorType(x.dtype, (x.shape[0], w.shape[1] * groups, *out))


def _conv_transpose_rule(c: R.RuleCtx) -> R.Expr:
    """out[n, o, h] = sum over c, k of x[n, c, (h + p - k*d) / s] * w[c, o, k], where the division is exact."""
    x, w = c.inputs
    nsp, (s, pb, _, d) = _rule_window(c)
    groups = c.attrs["groups"]
    n, o, *sp = c.out
    og = w.shape[1]
    cg = w.shape[0] // groups if groups > 1 else w.shape[0]
    base = (o // og) * cg if groups > 1 else R.Ix.lit(0)
    oo = o % og if groups > 1 else o

    def body(ci: R.Ix, *ks: R.Ix) -> R.Expr:
        num = [sp[j] + pb[j] - ks[j] * d[j] for j in range(nsp)]
        pos = [num[j] // s[j] for j in range(nsp)]
        term = R.widen(x.at(n, base + ci, *pos, oob=0)) * R.widen(w.at(base + ci, oo, *ks))
        # a tap that no input position reaches contributes nothing (-0.0 leaves any sum as it is)
        hits = [_index_in(pos[j], 0, x.shape[2 + j]) for j in range(nsp)]
        hits += [R.call("eq", R.IndexValue(DType.i64, num[j] % s[j]), 0) for j in range(nsp) if s[j] > 1]
        reached = _all(hits)
        assert reached is not None
        return R.select(reached, term, R.lit(-0.0, term.dtype))

    return R.cast(R.reduce("sum", [cg, *w.shape[2:]], body), c.out_type.dtype)


def _conv_transpose_examples(rng: np.random.Generator) -> list:
    f = lambda *sh: _spatial_examples(rng, *sh)
    return [
        ([f(2, 3, 4), f(3, 2, 3)], {"strides": (2,)}),
        ([f(2, 3, 3, 4), f(3, 2, 3, 2)], {"strides": (2, 3), "pads": (1, 0, 0, 1), "output_padding": (1, 2)}),
        ([f(2, 4, 3, 3), f(4, 3, 2, 3)], {"groups": 2, "dilations": (2, 1), "strides": (1, 2), "pads": (0, 1, 1, 1)}),
        ([f(2, 2, 2, 3, 2), f(2, 3, 2, 2, 3)], {"strides": (2, 1, 2)}),
    ]


define("conv_transpose", ("x", "w"),
       attrs={"strides": ("ints", ()), "pads": ("ints", ()), "dilations": ("ints", ()), "groups": ("int", 1),
              "output_padding": ("ints", ())},
       shape=_conv_transpose_type, rule=_conv_transpose_rule, numpy=None, family="nn",
       examples=_conv_transpose_examples,
       doc="N-d grouped transposed convolution (the gradient of conv), w: [C, O/groups, *k]; no bias")


# --------------------------------------------------------------------------------------
# pooling


def _pool_dims(x: TensorType, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
               dilations: Sequence[int], ceil_mode: bool) -> tuple[Dim, ...]:
    if x.rank < 3:
        raise ValueError(f"pooling needs rank >= 3 (N, C, spatial...), got {x}")
    nsp = x.rank - 2
    if len(kernel) != nsp or any(k < 1 for k in kernel):
        raise ValueError(f"kernel {list(kernel)} does not fit {nsp} spatial axes")
    s, pb, pe, d = window_params(nsp, strides, pads, dilations)
    out = [window_out_dim(x.shape[2 + j], kernel[j], s[j], pb[j], pe[j], d[j], ceil_mode) for j in range(nsp)]
    return (x.shape[0], x.shape[1], *out)


def _pool_type(types: list[TensorType], kernel: tuple[int, ...], strides: tuple[int, ...] = (),
               pads: tuple[int, ...] = (), dilations: tuple[int, ...] = (), ceil_mode: bool = False,
               **_: Any) -> TensorType:
    return types[0].with_shape(_pool_dims(types[0], kernel, strides, pads, dilations, ceil_mode))


def _window_positions(c: R.RuleCtx, taps: Sequence[R.Ix]) -> list[R.Ix]:
    nsp, (s, pb, _, d) = _rule_window(c)
    return [c.out[2 + j] * s[j] + taps[j] * d[j] - pb[j] for j in range(nsp)]


def _max_pool_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    n, ch = c.out[:2]
    low = R.lowest(x.dtype)
    best = R.reduce("max", c.attrs["kernel"], lambda *ks: x.at(n, ch, *_window_positions(c, ks), oob=low))
    if c.attrs["output"] == "values":
        return best
    return _max_pool_index(c, best)


def _max_pool_index(c: R.RuleCtx, best: R.Expr) -> R.Expr:
    """The flat input index of the window's first maximum (first NaN if any). Row-major spatial
    order grows with the row-major tap order, so the first hit is the smallest row-major index."""
    (x,) = c.inputs
    n, ch = c.out[:2]
    spatial = x.shape[2:]
    nsp = len(spatial)

    def hit_index(*ks: R.Ix) -> R.Expr:
        pos = _window_positions(c, ks)
        v = x.at(n, ch, *pos, oob=R.lowest(x.dtype))
        hit = R.call("eq", v, best)
        if x.dtype.is_float:
            hit = R.call("or", hit, R.call("isnan", v))
        inside = _all([_index_in(pos[j], 0, spatial[j]) for j in range(nsp)])
        assert inside is not None
        lin: R.Ix = R.Ix.lit(0)
        for j in range(nsp):
            lin = lin * spatial[j] + pos[j]
        none = R.dim_scalar(_prod(spatial), DType.i64)
        return R.select(R.call("and", inside, hit), R.IndexValue(DType.i64, lin), none)

    first = R.Ix.dyn(R.reduce("min", c.attrs["kernel"], hit_index))
    if c.attrs["storage_order"] == 0:
        spatial_index = first
    else:  # column-major: the first spatial axis varies fastest
        rows: list[R.Ix] = []
        rest = first
        for d in reversed(spatial):
            rows.append(rest % d)
            rest = rest // d
        coords = list(reversed(rows))
        spatial_index = R.Ix.lit(0)
        for j in reversed(range(nsp)):
            spatial_index = spatial_index * spatial[j] + coords[j]
    return R.IndexValue(DType.i64, (n * x.shape[1] + ch) * _prod(spatial) + spatial_index)


def _tap_reduce(x: np.ndarray, out: TensorType, kernel: Sequence[int], strides: Sequence[int],
                pads: Sequence[int], dilations: Sequence[int], pad_value: Any,
                combine: Callable[[np.ndarray, np.ndarray], np.ndarray],
                pre: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Combine the kernel taps of every window, one vectorized step per tap."""
    nsp = x.ndim - 2
    s, pb, _, d = window_params(nsp, strides, pads, dilations)
    out_sp = [int(v) for v in out.shape[2:]]
    xp = _window_input(x, out_sp, kernel, s, pb, d, pad_value)
    if pre is not None:
        xp = pre(xp)
    acc: np.ndarray | None = None
    for tap in np.ndindex(*kernel):
        v = xp[_tap_slices(tap, out_sp, s, d)]
        acc = np.array(v, copy=True) if acc is None else combine(acc, v)
    assert acc is not None
    return acc


def _max_pool_numpy(xs: list[np.ndarray], out: TensorType, kernel: tuple[int, ...], strides: tuple[int, ...],
                    pads: tuple[int, ...], dilations: tuple[int, ...], ceil_mode: bool, output: str,
                    storage_order: int) -> np.ndarray:
    x = xs[0]
    low = R.lowest(DType.from_numpy(x.dtype))
    if output == "values":
        return _tap_reduce(x, out, kernel, strides, pads, dilations, low, maximum)
    return _max_pool_indices_numpy(x, out, kernel, strides, pads, dilations, low, storage_order)


def _max_pool_indices_numpy(x: np.ndarray, out: TensorType, kernel: Sequence[int], strides: Sequence[int],
                            pads: Sequence[int], dilations: Sequence[int], low: Any, storage_order: int) -> np.ndarray:
    """Scan the taps in row-major order keeping the first maximum (a NaN beats any number)."""
    nsp = x.ndim - 2
    s, pb, _, d = window_params(nsp, strides, pads, dilations)
    out_sp = [int(v) for v in out.shape[2:]]
    spatial = x.shape[2:]
    xp = _window_input(x, out_sp, kernel, s, pb, d, low)
    best = np.zeros(x.shape[:2] + tuple(out_sp), dtype=x.dtype)
    index = np.full(best.shape, -1, dtype=np.int64)
    order = list(range(nsp)) if storage_order == 0 else list(reversed(range(nsp)))
    for tap in np.ndindex(*kernel):
        v = xp[_tap_slices(tap, out_sp, s, d)]
        pos = np.ix_(*[np.arange(o) * s[j] + tap[j] * d[j] - pb[j] for j, o in enumerate(out_sp)])
        inside = np.ones((1,) * nsp, dtype=bool)
        lin = np.zeros((1,) * nsp, dtype=np.int64)
        for j in order:
            inside = inside & (pos[j] >= 0) & (pos[j] < spatial[j])
            lin = lin * spatial[j] + pos[j]
        better = (index < 0) | (v > best)
        if x.dtype.kind == "f":
            better |= np.isnan(v) & ~np.isnan(best)
        take = inside & better
        best = np.where(take, v, best)
        index = np.where(take, lin, index)
    planes = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * nsp)
    return planes * math.prod(spatial) + index


def _pool_examples(extra: dict[str, Any]) -> Callable[[np.random.Generator], list]:
    def examples(rng: np.random.Generator) -> list:
        f = lambda *sh: _spatial_examples(rng, *sh)
        return [
            ([f(2, 3, 7)], {"kernel": (3,), "strides": (2,), **extra}),
            ([f(2, 3, 5, 6)], {"kernel": (2, 3), "strides": (2, 1), "pads": (1, 0, 1, 2), **extra}),
            ([f(2, 3, 6, 5)], {"kernel": (3, 2), "strides": (2, 2), "pads": (1, 1, 0, 1), "ceil_mode": True, **extra}),
            ([f(2, 2, 7, 6)], {"kernel": (2, 2), "dilations": (2, 3), "strides": (2, 1), "ceil_mode": True, **extra}),
            ([f(2, 2, 4, 5, 3)], {"kernel": (2, 3, 2), "strides": (2, 1, 1), "pads": (1, 1, 0, 0, 1, 1), **extra}),
        ]

    return examples


_POOL_ATTRS = {"kernel": ("ints", REQUIRED), "strides": ("ints", ()), "pads": ("ints", ()),
               "dilations": ("ints", ()), "ceil_mode": ("bool", False)}


def _max_pool_examples(rng: np.random.Generator) -> list:
    cases = _pool_examples({})(rng)
    cases.append(([rng.integers(0, 255, (2, 3, 5, 4)).astype(np.uint8)], {"kernel": (2, 2), "pads": (1, 1, 1, 1)}))
    ties = rng.integers(0, 3, (2, 3, 5, 6)).astype(np.float32)
    ties[0, 1, 2, 3] = np.nan
    for order in (0, 1):
        cases.append(([ties], {"kernel": (2, 3), "strides": (2, 1), "pads": (1, 1, 0, 1), "ceil_mode": True,
                               "output": "indices", "storage_order": order}))
    cases.append(([_spatial_examples(rng, 2, 2, 3, 4, 5)], {"kernel": (2, 2, 3), "dilations": (1, 2, 1),
                                                            "output": "indices", "storage_order": 1}))
    return cases


def _max_pool_type(types: list[TensorType], output: str, storage_order: int, **attrs: Any) -> TensorType:
    if output not in ("values", "indices"):
        raise ValueError(f"output must be 'values' or 'indices', got {output!r}")
    if storage_order not in (0, 1):
        raise ValueError(f"storage_order must be 0 (row-major) or 1 (column-major), got {storage_order}")
    t = _pool_type(types, **attrs)
    return t if output == "values" else t.with_dtype(DType.i64)


define("max_pool", ("x",), attrs={**_POOL_ATTRS, "output": ("str", "values"), "storage_order": ("int", 0)},
       shape=_max_pool_type, rule=_max_pool_rule, numpy=_max_pool_numpy, family="nn", examples=_max_pool_examples,
       doc="max over each (dilated) window; padding reads -inf (the type's lowest value for integers); "
           "output='indices' gives the i64 flat input index of the first maximum instead "
           "(storage_order 1: column-major spatial order)")


def _avg_count(c: R.RuleCtx, taps: Sequence[R.Ix], dtype: DType) -> R.Expr:
    """How many taps of the window at ``c.out`` the average divides by (as a ``dtype`` sum)."""
    (x,) = c.inputs
    nsp, (_, pb, pe, _) = _rule_window(c)
    pos = _window_positions(c, taps)
    if c.attrs["count_include_pad"]:
        inside = [_index_in(pos[j], -pb[j], x.shape[2 + j] + pe[j]) for j in range(nsp)]
    else:
        inside = [_index_in(pos[j], 0, x.shape[2 + j]) for j in range(nsp)]
    cond = _all(inside)
    assert cond is not None
    return R.select(cond, R.lit(1, dtype), R.lit(0, dtype))


def _avg_pool_rule(c: R.RuleCtx) -> R.Expr:
    """The window's sum over its count; halves are summed and divided in f32 and rounded once, as
    ``reduce_mean`` (and PyTorch's and ONNX Runtime's pooling) do."""
    (x,) = c.inputs
    n, ch = c.out[:2]
    kernel = c.attrs["kernel"]
    total = R.reduce("sum", kernel, lambda *ks: R.widen(x.at(n, ch, *_window_positions(c, ks), oob=0)))
    count = R.reduce("sum", kernel, lambda *ks: _avg_count(c, ks, total.dtype))
    mean = total / count
    return mean if mean.dtype is x.dtype else R.cast(mean, x.dtype)


def _axis_counts(size: int, out: int, k: int, s: int, pb: int, d: int, lo: int, hi: int) -> np.ndarray:
    pos = np.arange(out)[:, None] * s - pb + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _avg_pool_numpy(xs: list[np.ndarray], out: TensorType, kernel: tuple[int, ...], strides: tuple[int, ...],
                    pads: tuple[int, ...], dilations: tuple[int, ...], ceil_mode: bool,
                    count_include_pad: bool) -> np.ndarray:
    x = xs[0]
    wide = wide_array(x)  # halves sum and divide in f32, rounded once (the rule)
    nsp = x.ndim - 2
    s, pb, pe, d = window_params(nsp, strides, pads, dilations)
    total = _tap_reduce(wide, out, kernel, strides, pads, dilations, 0, np.add)
    count = np.ones((), dtype=np.int64)
    for j in range(nsp):
        size, o = x.shape[2 + j], int(out.shape[2 + j])
        lo, hi = (-pb[j], size + pe[j]) if count_include_pad else (0, size)
        cj = _axis_counts(size, o, kernel[j], s[j], pb[j], d[j], lo, hi)
        count = np.multiply.outer(count, cj)
    return round_once(total / count.astype(wide.dtype), x.dtype)


define("avg_pool", ("x",), attrs={**_POOL_ATTRS, "count_include_pad": ("bool", False)},
       shape=_pool_type, rule=_avg_pool_rule, numpy=_avg_pool_numpy, family="nn",
       examples=lambda rng: _pool_examples({})(rng) + _pool_examples({"count_include_pad": True})(rng)[1:4],
       doc="mean over each window; padding is excluded from the count unless count_include_pad "
           "(the overhang of ceil_mode windows never counts)")


def _lp_pool_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    n, ch = c.out[:2]
    p = c.attrs["p"]
    total = R.reduce("sum", c.attrs["kernel"],
                     lambda *ks: R.call("pow", R.call("abs", x.at(n, ch, *_window_positions(c, ks), oob=0)), p))
    return R.call("pow", total, 1.0 / p)


def _lp_pool_numpy(xs: list[np.ndarray], out: TensorType, kernel: tuple[int, ...], strides: tuple[int, ...],
                   pads: tuple[int, ...], dilations: tuple[int, ...], ceil_mode: bool, p: float) -> np.ndarray:
    x = xs[0]
    pw = np.asarray(p, dtype=x.dtype)
    total = _tap_reduce(x, out, kernel, strides, pads, dilations, 0, np.add,
                        pre=lambda a: pow_(np.abs(a), pw))
    return pow_(total, np.asarray(1.0 / p, dtype=x.dtype))


define("lp_pool", ("x",), attrs={**_POOL_ATTRS, "p": ("float", 2.0)},
       shape=_pool_type, rule=_lp_pool_rule, numpy=_lp_pool_numpy, family="nn", precision_policy="keep-fp32",
       examples=lambda rng: _pool_examples({})(rng)[:3] + _pool_examples({"p": 3.0})(rng)[3:],
       doc="(sum over each window of |x|^p)^(1/p); padding reads 0")


# --------------------------------------------------------------------------------------
# normalization


def _batch_norm_type(types: list[TensorType], epsilon: float) -> TensorType:
    x = types[0]
    if x.rank < 2:
        raise ValueError(f"batch_norm needs rank >= 2 (N, C, ...), got {x}")
    for name, t in zip(("scale", "bias", "mean", "var"), types[1:], strict=True):
        if t.dtype is not x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, x has {x.dtype}")
        if t.rank != 1 or (isinstance(t.shape[0], int) and isinstance(x.shape[1], int) and t.shape[0] != x.shape[1]):
            raise ValueError(f"{name} must be [{x.shape[1]}], got {t}")
    return x


def _batch_norm_rule(c: R.RuleCtx) -> R.Expr:
    x, scale, bias, mean, var = c.inputs
    ch = c.out[1]
    eps = c.attrs["epsilon"]
    return (x.at(*c.out) - mean.at(ch)) / R.sqrt(var.at(ch) + eps) * scale.at(ch) + bias.at(ch)


def _batch_norm_numpy(xs: list[np.ndarray], out: TensorType, epsilon: float) -> np.ndarray:
    x, scale, bias, mean, var = xs
    shape = (-1,) + (1,) * (x.ndim - 2)
    eps = np.asarray(epsilon, dtype=x.dtype)
    r = lambda a: a.reshape(shape)
    return (x - r(mean)) / np.sqrt(r(var) + eps) * r(scale) + r(bias)


def _batch_norm_examples(rng: np.random.Generator) -> list:
    def case(*shape: int) -> list[np.ndarray]:
        ch = shape[1]
        f = lambda: rng.standard_normal(ch).astype(np.float32)
        return [rng.standard_normal(shape).astype(np.float32), f(), f(), f(),
                rng.uniform(0.5, 2.0, ch).astype(np.float32)]

    return [(case(2, 3, 4, 5), {}), (case(3, 4), {"epsilon": 1e-3}), (case(2, 3, 4), {})]


define("batch_norm", ("x", "scale", "bias", "mean", "var"), attrs={"epsilon": ("float", 1e-5)},
       shape=_batch_norm_type, rule=_batch_norm_rule, numpy=_batch_norm_numpy, family="nn",
       examples=_batch_norm_examples, precision_policy="keep-fp32",
       doc="inference batch norm over channel axis 1: (x - mean) / sqrt(var + eps) * scale + bias")


def _layer_norm_type(types: list[TensorType], axis: int, epsilon: float) -> TensorType:
    x, scale, bias = types
    ax = norm_axis(axis, x.rank)
    tail = x.shape[ax:]
    for name, t in (("scale", scale), ("bias", bias)):
        if t.dtype is not x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, x has {x.dtype}")
        if t.rank > len(tail):
            raise ValueError(f"{name} {t} has more dims than the normalized shape {list(map(str, tail))}")
        for d, n in zip(reversed(t.shape), reversed(tail), strict=False):
            if d != 1 and d != n and isinstance(d, int) and isinstance(n, int):
                raise ValueError(f"{name} {t} does not broadcast to the normalized shape {list(tail)}")
    return x


def _layer_norm_rule(c: R.RuleCtx) -> R.Expr:
    """Float16/bfloat16 inputs are normalized in float32 and the result rounded once, as PyTorch and ONNX
    Runtime compute it (ONNX's ``stash_type`` float32): ``eps`` keeps its float32 value instead of
    flushing to zero in a half, and no intermediate overflows where the result does not."""
    x, scale, bias = c.inputs
    ax = norm_axis(c.attrs["axis"], x.rank)
    tail = x.shape[ax:]
    outer = c.out[:ax]
    acc = DType.f32 if x.dtype in R.HALF_DTYPES else x.dtype
    mean = R.wide_mean(tail, lambda *ks: R.widen(x.at(*outer, *ks)), acc)

    def sq_dev(*ks: R.Ix) -> R.Expr:
        dev = R.widen(x.at(*outer, *ks)) - mean
        return dev * dev

    var = R.wide_mean(tail, sq_dev, acc)
    norm = (R.widen(x.at(*c.out)) - mean) / R.sqrt(var + c.attrs["epsilon"])
    inner = c.out[ax:]
    out = (norm * R.widen(scale.at(*R.broadcast_index(inner, scale.shape, tail)))
           + R.widen(bias.at(*R.broadcast_index(inner, bias.shape, tail))))
    return R.cast(out, x.dtype)


def _prod(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def _layer_norm_numpy(xs: list[np.ndarray], out: TensorType, axis: int, epsilon: float) -> np.ndarray:
    x, scale, bias = xs
    if out.dtype in R.HALF_DTYPES:  # normalized in float32, rounded once (the rule)
        wide = [a.astype(np.float32) for a in xs]
        return _layer_norm_numpy(wide, TensorType(DType.f32, out.shape), axis, epsilon).astype(x.dtype)
    axes = tuple(range(norm_axis(axis, x.ndim), x.ndim))
    mean = mean_numpy(x, axes, keepdims=True)
    dev = x - mean
    var = mean_numpy(dev * dev, axes, keepdims=True)
    return dev / np.sqrt(var + np.asarray(epsilon, dtype=x.dtype)) * scale + bias


def _layer_norm_examples(rng: np.random.Generator) -> list:
    f = lambda *sh: rng.standard_normal(sh).astype(np.float32)
    return [([f(2, 3, 4), f(4), f(4)], {}),
            ([f(2, 3, 4), f(3, 4), f(1)], {"axis": 1, "epsilon": 1e-3}),
            ([f(3, 2, 4, 5), f(4, 1), f(5)], {"axis": -2})]


define("layer_norm", ("x", "scale", "bias"), attrs={"axis": ("int", -1), "epsilon": ("float", 1e-5)},
       shape=_layer_norm_type, rule=_layer_norm_rule, numpy=_layer_norm_numpy, family="nn",
       examples=_layer_norm_examples, precision_policy="keep-fp32",
       doc="normalize over axes [axis, rank) with the biased variance; scale and bias broadcast to those axes")


# --------------------------------------------------------------------------------------
# softmax


def _axis_type(types: list[TensorType], axis: int) -> TensorType:
    norm_axis(axis, types[0].rank)
    if not types[0].dtype.is_float:
        raise TypeError(f"needs a float tensor, got {types[0]}")
    return types[0]


def _softmax_parts(c: R.RuleCtx) -> tuple[R.Expr, R.Expr, R.Expr]:
    """x[i], the max along the axis, and the sum of exp(x - max) along it (max subtraction
    keeps exp from overflowing; a prover cancels it symbolically)."""
    (x,) = c.inputs
    ax = norm_axis(c.attrs["axis"], x.rank)

    def at(k: R.Ix) -> R.Expr:
        idx = list(c.out)
        idx[ax] = k
        return R.widen(x.at(*idx))

    top = R.reduce("max", [x.shape[ax]], at)
    total = R.reduce("sum", [x.shape[ax]], lambda k: R.exp(at(k) - top))
    return R.widen(x.at(*c.out)), top, total


def _softmax_rule(c: R.RuleCtx) -> R.Expr:
    """Halves are computed in f32 and rounded once (a sum of many halves rounded at every step
    loses the small terms)."""
    xi, top, total = _softmax_parts(c)
    return R.cast(R.exp(xi - top) / total, c.out_type.dtype)


def _log_softmax_rule(c: R.RuleCtx) -> R.Expr:
    xi, top, total = _softmax_parts(c)
    return R.cast(xi - top - R.log(total), c.out_type.dtype)


def _softmax_numpy(xs: list[np.ndarray], out: TensorType, axis: int) -> np.ndarray:
    x = xs[0].astype(_acc_dtype(xs[0].dtype), copy=False)
    e = exp(x - reduce_axes("max", x, [axis], keepdims=True))
    return (e / reduce_axes("sum", e, [axis], keepdims=True)).astype(xs[0].dtype, copy=False)


def _log_softmax_numpy(xs: list[np.ndarray], out: TensorType, axis: int) -> np.ndarray:
    x = xs[0].astype(_acc_dtype(xs[0].dtype), copy=False)
    top = reduce_axes("max", x, [axis], keepdims=True)
    out_ = x - top - log(reduce_axes("sum", exp(x - top), [axis], keepdims=True))
    return out_.astype(xs[0].dtype, copy=False)


def _softmax_examples(rng: np.random.Generator) -> list:
    big = (rng.standard_normal((2, 5)) * 30 + 500).astype(np.float32)
    return [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"axis": 1}),
            ([rng.standard_normal((3, 4)).astype(np.float64)], {"axis": -1}),
            ([big], {"axis": 1})]


define("softmax", ("x",), attrs={"axis": ("int", -1)}, shape=_axis_type, rule=_softmax_rule,
       numpy=_softmax_numpy, family="nn", examples=_softmax_examples, precision_policy="keep-fp32",
       doc="exp(x - max) / sum(exp(x - max)) along one axis")

define("log_softmax", ("x",), attrs={"axis": ("int", -1)}, shape=_axis_type, rule=_log_softmax_rule,
       numpy=_log_softmax_numpy, family="nn", examples=_softmax_examples, precision_policy="keep-fp32",
       doc="x - max - log(sum(exp(x - max))) along one axis")


# --------------------------------------------------------------------------------------
# local response normalization


def _lrn_type(types: list[TensorType], size: int, alpha: float, beta: float, bias: float) -> TensorType:
    x = types[0]
    if x.rank < 3:
        raise ValueError(f"lrn needs rank >= 3 (N, C, spatial...), got {x}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return x


def _lrn_rule(c: R.RuleCtx) -> R.Expr:
    """x / (bias + alpha/size * sum of x^2 over channels [c - (size-1)//2, c + size//2]) ^ beta."""
    (x,) = c.inputs
    size = c.attrs["size"]
    n, ch, *sp = c.out

    def sq(k: R.Ix) -> R.Expr:
        v = x.at(n, ch - (size - 1) // 2 + k, *sp, oob=0)
        return v * v

    total = R.reduce("sum", [size], sq)
    scale = c.attrs["bias"] + total * (c.attrs["alpha"] / size)
    return x.at(*c.out) / R.call("pow", scale, c.attrs["beta"])


def _lrn_numpy(xs: list[np.ndarray], out: TensorType, size: int, alpha: float, beta: float,
               bias: float) -> np.ndarray:
    x = xs[0]
    sq = np.pad(x * x, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
    ch = x.shape[1]
    total = sq[:, 0:ch].copy()
    for k in range(1, size):
        total += sq[:, k:k + ch]
    dt = x.dtype
    scale = np.asarray(bias, dt) + total * np.asarray(alpha / size, dt)
    return x / pow_(scale, np.asarray(beta, dt))


define("lrn", ("x",), attrs={"size": ("int", REQUIRED), "alpha": ("float", 1e-4), "beta": ("float", 0.75),
                             "bias": ("float", 1.0)},
       shape=_lrn_type, rule=_lrn_rule, numpy=_lrn_numpy, family="nn", precision_policy="keep-fp32",
       examples=lambda rng: [([rng.standard_normal((2, 5, 3, 4)).astype(np.float32)], {"size": 3}),
                             ([rng.standard_normal((2, 6, 3)).astype(np.float32)],
                              {"size": 4, "alpha": 0.01, "beta": 0.5, "bias": 2.0})],
       doc="local response normalization across channels (AlexNet)")
