"""Layout ops: index remaps that move elements without computing on them."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import REQUIRED, broadcast_shapes, define
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType


def _reshape_type(types: list[TensorType], shape: tuple[Dim, ...]) -> TensorType:
    x = types[0]
    out = x.with_shape(shape)
    if out.numel() != x.numel() and x.is_static and out.is_static:
        raise ValueError(f"cannot reshape {x} to {list(shape)}: element counts differ")
    return out


def _reshape_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    flat: R.Ix = R.Ix.lit(0)
    for i, d in zip(c.out, c.out_type.shape, strict=True):
        flat = flat * d + i
    idx: list[R.Ix] = []
    for d in reversed(x.shape):
        idx.append(flat % d)
        flat = flat // d
    return x.at(*reversed(idx))


define("reshape", ("x",), attrs={"shape": ("dims", REQUIRED)}, shape=_reshape_type, rule=_reshape_rule,
       numpy=lambda xs, out, shape: xs[0].reshape(out.shape), family="layout",
       doc="row-major reshape; `shape` is the result shape (symbolic dims allowed)",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"shape": (4, 6)})])


def _transpose_type(types: list[TensorType], perm: tuple[int, ...]) -> TensorType:
    x = types[0]
    if sorted(perm) != list(range(x.rank)):
        raise ValueError(f"perm {list(perm)} is not a permutation of rank {x.rank}")
    return x.with_shape([x.shape[p] for p in perm])


def _transpose_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    perm = c.attrs["perm"]
    idx: list[Any] = [None] * x.rank
    for o, p in enumerate(perm):
        idx[p] = c.out[o]
    return x.at(*idx)


define("transpose", ("x",), attrs={"perm": ("ints", REQUIRED)}, shape=_transpose_type, rule=_transpose_rule,
       numpy=lambda xs, out, perm: np.transpose(xs[0], perm), family="layout",
       doc="out dim k is x dim perm[k]",
       examples=lambda rng: [([rng.standard_normal((2, 3, 4)).astype(np.float32)], {"perm": (2, 0, 1)})])


# --------------------------------------------------------------------------------------
# shared helpers


def _static_mismatch(a: Dim, b: Dim) -> bool:
    """Two dims that are provably different (both known)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _dim_scalar(d: Dim) -> R.Expr:
    """A dim as an i64 scalar (symbolic dims stay symbolic)."""
    return R.IndexValue(DType.i64, R.Ix.lit(d))


def _ix_scalar(i: R.Ix) -> R.Expr:
    return R.IndexValue(DType.i64, i)


# --------------------------------------------------------------------------------------
# expand


def _expand_type(types: list[TensorType], shape: tuple[Dim, ...]) -> TensorType:
    x = types[0]
    return x.with_shape(broadcast_shapes(x.shape, shape))


def _expand_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    return x.at(*R.broadcast_index(c.out, x.shape, c.out_type.shape))


define("expand", ("x",), attrs={"shape": ("dims", REQUIRED)}, shape=_expand_type, rule=_expand_rule,
       numpy=lambda xs, out, shape: np.array(np.broadcast_to(xs[0], out.shape)), family="layout",
       doc="broadcast x against `shape` in both directions (ONNX Expand); symbolic dims allowed",
       examples=lambda rng: [
           ([rng.standard_normal((3, 1)).astype(np.float32)], {"shape": (2, 3, 4)}),
           ([rng.standard_normal((2, 3)).astype(np.float32)], {"shape": (1, 3)})])


# --------------------------------------------------------------------------------------
# concat


def _concat_type(types: list[TensorType], axis: int) -> TensorType:
    first = types[0]
    ax = _axis(axis, first.rank)
    total: Dim = 0
    for t in types:
        if t.dtype is not first.dtype:
            raise TypeError(f"operand dtypes differ: {first.dtype} vs {t.dtype}")
        if t.rank != first.rank:
            raise ValueError(f"operand ranks differ: {first} vs {t}")
        for k, (a, b) in enumerate(zip(first.shape, t.shape, strict=True)):
            if k != ax and _static_mismatch(a, b):
                raise ValueError(f"dim {k} differs: {first} vs {t}")
        total = total + t.shape[ax]
    return first.with_shape([total if k == ax else d for k, d in enumerate(first.shape)])


def _concat_rule(c: R.RuleCtx) -> R.Expr:
    """Nested selects on the concat axis; each operand's load is masked on its own atom."""
    ax = _axis(c.attrs["axis"], c.out_type.rank)
    pos = _ix_scalar(c.out[ax])
    offsets: list[Dim] = [0]
    for t in c.inputs:
        offsets.append(offsets[-1] + t.shape[ax])
    expr: R.Expr | None = None
    for k in reversed(range(len(c.inputs))):
        t = c.inputs[k]
        idx = [o - offsets[k] if j == ax else o for j, o in enumerate(c.out)]
        load = t.at(*idx, oob=0)
        expr = load if expr is None else R.select(pos < _dim_scalar(offsets[k + 1]), load, expr)
    assert expr is not None
    return expr


define("concat", ("*xs",), attrs={"axis": ("int", REQUIRED)}, shape=_concat_type, rule=_concat_rule,
       numpy=lambda xs, out, axis: np.concatenate(xs, axis=axis), family="layout",
       doc="join operands along `axis`; other dims must agree",
       examples=lambda rng: [
           ([rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32),
             rng.standard_normal((2, 2)).astype(np.float32)], {"axis": 1}),
           ([np.arange(6, dtype=np.int64).reshape(3, 2), np.arange(4, dtype=np.int64).reshape(2, 2)], {"axis": -2}),
           ([rng.standard_normal((2, 3)) > 0], {"axis": 0})])


# --------------------------------------------------------------------------------------
# split


def _split_offset(sizes: tuple[Dim, ...], index: int) -> Dim:
    off: Dim = 0
    for s in sizes[:index]:
        off = off + s
    return off


def _split_type(types: list[TensorType], axis: int, sizes: tuple[Dim, ...], index: int) -> TensorType:
    x = types[0]
    ax = _axis(axis, x.rank)
    if not 0 <= index < len(sizes):
        raise ValueError(f"piece {index} out of range for {len(sizes)} pieces")
    if any(isinstance(s, int) and s < 0 for s in sizes):
        raise ValueError(f"negative split size in {list(sizes)}")
    total = _split_offset(sizes, len(sizes))
    if _static_mismatch(total, x.shape[ax]):
        raise ValueError(f"split sizes {list(sizes)} do not add up to dim {ax} of {x}")
    return x.with_shape([sizes[index] if k == ax else d for k, d in enumerate(x.shape)])


def _split_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    ax = _axis(c.attrs["axis"], x.rank)
    off = _split_offset(c.attrs["sizes"], c.attrs["index"])
    return x.at(*[o + off if k == ax else o for k, o in enumerate(c.out)])


def _split_numpy(xs: list[np.ndarray], out: TensorType, axis: int, sizes: tuple[int, ...], index: int) -> np.ndarray:
    x = xs[0]
    ax = _axis(axis, x.ndim)
    off = int(_split_offset(sizes, index))
    return x[(slice(None),) * ax + (slice(off, off + int(sizes[index])),)]


define("split", ("x",), attrs={"axis": ("int", 0), "sizes": ("dims", REQUIRED), "index": ("int", REQUIRED)},
       shape=_split_type, rule=_split_rule, numpy=_split_numpy, family="layout",
       doc="piece `index` of x cut along `axis` into consecutive pieces of `sizes`",
       examples=lambda rng: [
           ([rng.standard_normal((2, 7)).astype(np.float32)], {"axis": 1, "sizes": (2, 3, 2), "index": 1}),
           ([rng.standard_normal((5, 3)).astype(np.float32)], {"axis": -2, "sizes": (3, 2), "index": 1})])


# --------------------------------------------------------------------------------------
# slice


def _slice_len(d: Dim, start: Dim, end: Dim, step: int) -> Dim:
    if step > 0:
        n = (end - start + (step - 1)) // step
    else:
        n = (start - end + (-step - 1)) // -step
    return max(n, 0) if isinstance(n, int) else n


def _slice_type(types: list[TensorType], starts: tuple[Dim, ...], ends: tuple[Dim, ...],
                steps: tuple[int, ...]) -> TensorType:
    x = types[0]
    if not len(starts) == len(ends) == len(steps) == x.rank:
        raise ValueError(f"slice needs one start/end/step per axis of {x}")
    shape: list[Dim] = []
    for k, (d, s, e, st) in enumerate(zip(x.shape, starts, ends, steps, strict=True)):
        if st == 0:
            raise ValueError(f"step of axis {k} is 0")
        if isinstance(d, int) and isinstance(s, int) and isinstance(e, int):
            ok = (0 <= s <= d and s <= e <= d) if st > 0 else (-1 <= e <= s <= d - 1 or (d == 0 and s == e == -1))
            if not ok:
                raise ValueError(f"axis {k}: bounds start={s}, end={e}, step={st} do not lie within dim {d} (a "
                                 "bound on a symbolic axis is taken to lie within it at every size)")
        shape.append(_slice_len(d, s, e, st))
    return x.with_shape(shape)


def _slice_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    a = c.attrs
    return x.at(*[R.as_ix(s) + o * st for o, s, st in zip(c.out, a["starts"], a["steps"], strict=True)])


def _slice_numpy(xs: list[np.ndarray], out: TensorType, starts: tuple[int, ...], ends: tuple[int, ...],
                 steps: tuple[int, ...]) -> np.ndarray:
    idx = tuple(slice(int(s), (int(e) if int(e) >= 0 else None), int(st))
                for s, e, st in zip(starts, ends, steps, strict=True))
    return xs[0][idx]


define("slice", ("x",), attrs={"starts": ("dims", REQUIRED), "ends": ("dims", REQUIRED), "steps": ("ints", REQUIRED)},
       shape=_slice_type, rule=_slice_rule, numpy=_slice_numpy, family="layout",
       doc="x[start:end:step] per axis, bounds normalized: 0 <= start <= end <= dim for steps > 0, "
           "-1 <= end <= start < dim for steps < 0 (end -1: through index 0)",
       examples=lambda rng: [
           ([rng.standard_normal((4, 5, 3)).astype(np.float32)], {"starts": (1, 0, 0), "ends": (3, 5, 3),
                                                                  "steps": (1, 2, 1)}),
           ([rng.standard_normal((4, 6)).astype(np.float32)], {"starts": (3, 5), "ends": (-1, 0), "steps": (-1, -2)}),
           ([np.arange(10, dtype=np.int64).reshape(2, 5)], {"starts": (0, 4), "ends": (2, 1), "steps": (1, -3)})])


# --------------------------------------------------------------------------------------
# pad

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_parts(d: Dim, b: int, e: int) -> tuple[int, int, Dim]:
    """(crop at the start, padding at the start, kept length): negative pads crop first."""
    cb, ce = max(-b, 0), max(-e, 0)
    return cb, max(b, 0), d - cb - ce


def _pad_type(types: list[TensorType], pads: tuple[int, ...], mode: str, value: float) -> TensorType:
    x = types[0]
    if mode not in PAD_MODES:
        raise ValueError(f"unknown pad mode {mode!r} (expected one of {', '.join(PAD_MODES)})")
    if len(pads) != 2 * x.rank:
        raise ValueError(f"pads needs {2 * x.rank} entries (begins then ends), got {len(pads)}")
    shape: list[Dim] = []
    for k, d in enumerate(x.shape):
        b, e = pads[k], pads[k + x.rank]
        n = d + b + e
        if isinstance(n, int) and n < 0:
            raise ValueError(f"pads {b}, {e} crop more than dim {k} ({d}) holds")
        kept = _pad_parts(d, b, e)[2]
        if mode != "constant" and (b > 0 or e > 0) and isinstance(kept, int) and kept <= 0:
            raise ValueError(f"{mode} padding of an empty axis {k}")
        shape.append(n)
    return x.with_shape(shape)


def pad_source_index(o: R.Ix, d: Dim, b: int, e: int, mode: str) -> R.Ix:
    """The input index output position ``o`` reads along one axis (before the bounds check)."""
    if b == 0 and e == 0:
        return o
    cb, pb, kept = _pad_parts(d, b, e)
    j = o - pb
    if mode == "constant" or (b <= 0 and e <= 0):
        return j + cb
    if mode == "edge":
        return R.ix_min(R.ix_max(j, 0), kept - 1) + cb
    if mode == "wrap":
        return j % kept + cb
    if isinstance(kept, int) and kept == 1:
        return R.Ix.lit(cb)
    last = R.Ix.lit(kept - 1)  # an index expression even where the length is a symbolic dim
    m = j % (last * 2)
    return last - R.ix_max(m - last, last - m) + cb


def _pad_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    pads, mode = c.attrs["pads"], c.attrs["mode"]
    idx = [pad_source_index(o, d, pads[k], pads[k + x.rank], mode) for k, (o, d) in enumerate(zip(c.out, x.shape,
                                                                                                    strict=True))]
    if mode == "constant":
        return x.at(*idx, oob=_pad_value(c.attrs["value"], x.dtype))
    return x.at(*idx)


def _pad_value(value: float, dtype: DType) -> float | int | bool:
    if dtype is DType.bool:
        return bool(value)
    return int(value) if dtype.is_int else value


_NUMPY_PAD_MODES: dict[str, Literal["reflect", "edge", "wrap"]] = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad_numpy(xs: list[np.ndarray], out: TensorType, pads: tuple[int, ...], mode: str, value: float) -> np.ndarray:
    x = xs[0]
    r = x.ndim
    crop = tuple(slice(max(-pads[k], 0), x.shape[k] - max(-pads[k + r], 0)) for k in range(r))
    widths = [(max(pads[k], 0), max(pads[k + r], 0)) for k in range(r)]
    x = x[crop]
    if mode == "constant":
        return np.pad(x, widths, mode="constant",
                      constant_values=np.array(_pad_value(value, out.dtype), dtype=x.dtype))
    return np.pad(x, widths, mode=_NUMPY_PAD_MODES[mode])


define("pad", ("x",), attrs={"pads": ("ints", REQUIRED), "mode": ("str", "constant"), "value": ("float", 0.0)},
       shape=_pad_type, rule=_pad_rule, numpy=_pad_numpy, family="layout",
       doc="pad each axis by pads[k] before and pads[k + rank] after (negative crops first); "
           "mode constant (fill `value`), reflect (mirror without the edge), edge (repeat it) or wrap",
       examples=lambda rng: [
           ([rng.standard_normal((2, 3)).astype(np.float32)], {"pads": (1, 2, 0, 3), "value": 1.5}),
           ([rng.standard_normal((3, 4)).astype(np.float32)], {"pads": (2, 5, 2, 1), "mode": "reflect"}),
           ([rng.standard_normal((3, 4)).astype(np.float32)], {"pads": (-1, 3, 2, -2), "mode": "edge"}),
           ([np.arange(12, dtype=np.int32).reshape(3, 4)], {"pads": (4, -1, 0, 6), "mode": "wrap"}),
           ([np.arange(12, dtype=np.int32).reshape(3, 4)], {"pads": (-1, 2, 1, -1), "mode": "reflect"})])


# --------------------------------------------------------------------------------------
# tile


def _tile_type(types: list[TensorType], repeats: tuple[int, ...]) -> TensorType:
    x = types[0]
    if len(repeats) != x.rank or any(r < 0 for r in repeats):
        raise ValueError(f"repeats {list(repeats)} must be {x.rank} non-negative counts")
    return x.with_shape([d * r for d, r in zip(x.shape, repeats, strict=True)])


def _tile_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    return x.at(*[o % d if r != 1 else o for o, d, r in zip(c.out, x.shape, c.attrs["repeats"], strict=True)])


define("tile", ("x",), attrs={"repeats": ("ints", REQUIRED)}, shape=_tile_type, rule=_tile_rule,
       numpy=lambda xs, out, repeats: np.tile(xs[0], repeats), family="layout",
       doc="repeat x `repeats[k]` times along axis k",
       examples=lambda rng: [([rng.standard_normal((2, 3)).astype(np.float32)], {"repeats": (3, 2)}),
                             ([np.arange(6, dtype=np.int64).reshape(3, 2)], {"repeats": (1, 4)})])


# --------------------------------------------------------------------------------------
# resize
#
# The source coordinate and the taps of each resized axis are written once, over a small
# math namespace, and read twice: as rule expressions and as numpy arrays (the fast path).
# They follow ONNX Resize: per axis, a source coordinate from the output index, then
# nearest rounding or 2/4-tap (linear/cubic) interpolation with edge clamping, in float64.

RESIZE_MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# The scalar math a resize coordinate needs, in both readings of the op: (name, rule primitive,
# numpy function). _RULE_MATH builds rule expressions (float64), _NUMPY_MATH computes on float64 arrays.
_SCALAR_MATH = (("floor", "floor", np.floor), ("ceil", "ceil", np.ceil), ("abs", "abs", np.abs),
                ("eq", "eq", np.equal), ("lt", "lt", np.less), ("gt", "gt", np.greater),
                ("le", "le", np.less_equal), ("ge", "ge", np.greater_equal), ("either", "or", np.logical_or))

_RULE_MATH = SimpleNamespace(const=lambda v: R.lit(v, DType.f64), select=R.select, maximum=R.smax, minimum=R.smin,
                             **{name: partial(R.call, prim) for name, prim, _ in _SCALAR_MATH})
_NUMPY_MATH = SimpleNamespace(const=np.float64, select=np.where, maximum=np.maximum, minimum=np.minimum,
                              **{name: fn for name, _, fn in _SCALAR_MATH})


def _source_coord(m: Any, o: Any, in_w: Any, out_w: Any, scale: float, mode: str,
                  roi: tuple[float, float]) -> tuple[Any, Any]:
    """(source coordinate, extrapolated mask or None) of output position ``o`` along one axis.

    ``length_resized`` in the specification's formulas is ``in_w * scale`` (it defines ``scale = length_resized /
    length_original``), fractional where a scale factor gives it, as onnx's reference and its test data read it;
    ONNX Runtime and PyTorch divide by the whole output length instead, and differ where ``in_w * scale`` is not
    whole (``align_corners`` at scale 0.6 on 4: a source step of 3 / 1.4, theirs 3). ``pytorch_half_pixel`` at a
    length of 1 reads position 0, as the formula says (onnx's reference evaluator reads -0.5)."""
    width = in_w * scale
    one = m.eq(width, 1.0)
    if mode == "align_corners":
        return m.select(one, m.const(0.0), o * (in_w - 1.0) / (width - 1.0)), None
    if mode == "asymmetric":
        return o / scale, None
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return m.select(one, m.const(0.0), (o + 0.5) / scale - 0.5), None
    if mode == "half_pixel_symmetric":
        offset = in_w / 2.0 * (1.0 - out_w / width)
        return offset + (o + 0.5) / scale - 0.5, None
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale, None
    lo, hi = roi
    x = m.select(one, (hi - lo) * (in_w - 1.0) / 2.0 + 0.0 * o,
                 o * (hi - lo) * (in_w - 1.0) / (width - 1.0)) + lo * (in_w - 1.0)
    return x, m.either(m.lt(x, 0.0), m.gt(x, in_w - 1.0))


def _nearest_index(m: Any, x: Any, nearest_mode: str) -> Any:
    if nearest_mode == "round_prefer_floor":
        return m.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return m.floor(x + 0.5)
    if nearest_mode == "floor":
        return m.floor(x)
    return m.ceil(x)


def _cubic_coeffs(r: Any, a: float) -> list[Any]:
    return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a]


def _antialias_coeffs(m: Any, r: Any, scale: float, mode: str, a: float) -> list[Any]:
    """Downsampling filters widened by 1/scale and normalized to sum 1."""
    s = min(scale, 1.0)
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        n = 2 - 2 * start
        raw = [m.minimum(m.maximum(1.0 - m.abs((start + t - r) * s), 0.0), 1.0) for t in range(n)]
    else:
        start = int(np.floor(-2 / s) + 1)
        n = 2 - 2 * start
        raw = []
        for t in range(n):
            x = m.abs(s * (start + t - r))
            x2 = x * x
            x3 = x * x2
            near = (a + 2) * x3 - (a + 3) * x2 + 1
            far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
            raw.append(m.select(m.le(x, 1.0), near, m.select(m.lt(x, 2.0), far, m.const(0.0) + 0.0 * x)))
    total = raw[0]
    for c in raw[1:]:
        total = total + c
    return [c / total for c in raw]


def _axis_taps(m: Any, x: Any, in_w: Any, scale: float, attrs: dict[str, Any]) -> tuple[Any, list[Any]]:
    """(index of the first tap as float, tap weights) for linear/cubic interpolation at ``x``.
    An integral ``x`` is taken as the right end of the cell left of it (ratio 1), as ONNX does."""
    mode = attrs["mode"]
    f = m.floor(x)
    whole = m.eq(x, f)
    base = m.select(whole, f - 1.0, f)
    r = m.select(whole, m.const(1.0), x - f)
    if attrs["antialias"]:
        coeffs = _antialias_coeffs(m, r, scale, mode, attrs["cubic_coeff_a"])
    elif mode == "linear":
        coeffs = [1.0 - r, r]
    else:
        coeffs = _cubic_coeffs(r, attrs["cubic_coeff_a"])
    first = base - (len(coeffs) // 2 - 1)
    if attrs["exclude_outside"]:
        kept = [m.select(m.either(m.lt(first + t, 0.0), m.ge(first + t, in_w)), m.const(0.0) + 0.0 * c, c)
                for t, c in enumerate(coeffs)]
        total = kept[0]
        for c in kept[1:]:
            total = total + c
        total = m.select(m.eq(total, 0.0), m.const(1.0), total)
        coeffs = [c / total for c in kept]
    return first, coeffs


def _resize_axes(x: TensorType | tuple, out_shape: tuple, attrs: dict[str, Any]) -> list[int]:
    """Axes that actually change (an axis with scale 1, same size and full roi is left alone)."""
    in_shape = x.shape if isinstance(x, TensorType) else x
    roi = attrs["roi"]
    r = len(in_shape)
    axes = []
    for k in range(r):
        full_roi = not roi or attrs["coordinate_transformation_mode"] != "tf_crop_and_resize" or \
            (abs(roi[k]) < 1e-9 and abs(roi[k + r] - 1.0) < 1e-9)
        if abs(attrs["scales"][k] - 1.0) < 1e-9 and in_shape[k] == out_shape[k] and full_roi:
            continue
        axes.append(k)
    return axes


def _resize_type(types: list[TensorType], sizes: tuple[Dim, ...], scales: tuple[float, ...], mode: str,
                 coordinate_transformation_mode: str, nearest_mode: str, roi: tuple[float, ...],
                 cubic_coeff_a: float, exclude_outside: bool, extrapolation_value: float,
                 antialias: bool) -> TensorType:
    x = types[0]
    if mode not in RESIZE_MODES:
        raise ValueError(f"unknown resize mode {mode!r}")
    if coordinate_transformation_mode not in COORD_MODES:
        raise ValueError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    if nearest_mode not in NEAREST_MODES:
        raise ValueError(f"unknown nearest_mode {nearest_mode!r}")
    if len(sizes) != x.rank or len(scales) != x.rank:
        raise ValueError(f"sizes and scales need one entry per axis of {x}")
    if roi and len(roi) != 2 * x.rank:
        raise ValueError(f"roi needs {2 * x.rank} entries (starts then ends)")
    if coordinate_transformation_mode == "tf_crop_and_resize" and not roi:
        raise ValueError("tf_crop_and_resize needs a roi")
    if any(s <= 0 for s in scales):
        raise ValueError(f"scales must be positive, got {list(scales)}")
    if antialias and mode == "nearest":
        raise ValueError("antialias applies to linear and cubic modes only")
    if x.dtype is DType.bool:
        raise TypeError("resize takes numeric tensors")
    return x.with_shape(sizes)


def _roi(attrs: dict[str, Any], k: int, rank: int) -> tuple[float, float]:
    roi = attrs["roi"]
    return (roi[k], roi[k + rank]) if roi else (0.0, 1.0)


def _finish(v: Any, dtype: DType, m: Any) -> Any:
    """float64 result -> the tensor's dtype (integers round half to even and saturate)."""
    if dtype.is_float:
        return R.cast(v, dtype) if m is _RULE_MATH else v.astype(dtype.np)
    info = np.iinfo(dtype.np)
    lo, hi = float(info.min), float(info.max)
    if m is _RULE_MATH:
        return R.cast(R.smin(R.smax(R.call("round_even", v), lo), hi), dtype)
    return np.clip(np.round(v), lo, hi).astype(dtype.np)


def _resize_rule(c: R.RuleCtx) -> R.Expr:
    (x,) = c.inputs
    a = dict(c.attrs)
    m = _RULE_MATH
    axes = _resize_axes(x.type, c.out_type.shape, a)
    rank = x.rank

    def f64(d: Dim | R.Ix) -> R.Expr:
        return R.cast(R.IndexValue(DType.i64, R.as_ix(d)), DType.f64)

    coords = {k: _source_coord(m, f64(c.out[k]), f64(x.shape[k]), f64(c.out_type.shape[k]), a["scales"][k],
                               a["coordinate_transformation_mode"], _roi(a, k, rank)) for k in axes}

    def clamp(v: R.Expr, k: int) -> R.Ix:
        return R.ix_min(R.ix_max(R.Ix.dyn(R.cast(v, DType.i64)), 0), x.shape[k] - 1)

    extrap = a["extrapolation_value"]
    if a["mode"] == "nearest":
        idx: list[R.Ix] = list(c.out)
        for k in axes:
            idx[k] = clamp(_nearest_index(m, coords[k][0], a["nearest_mode"]), k)
        out = x.at(*idx)
        masks = [coords[k][1] for k in axes if coords[k][1] is not None]
        if masks:
            cond = masks[0]
            for mk in masks[1:]:
                cond = R.call("or", cond, mk)
            out = R.select(cond, R.cast(R.lit(extrap, DType.f64), x.dtype) if x.dtype.is_float
                           else R.lit(round(extrap), x.dtype), out)
        return out

    taps = {k: _axis_taps(m, coords[k][0], f64(x.shape[k]), a["scales"][k], a) for k in axes}

    def interp(level: int, idx: list[R.Ix]) -> R.Expr:
        """Separable interpolation: the last resized axis outermost, the first innermost."""
        if level < 0:
            return R.cast(x.at(*idx), DType.f64)
        k = axes[level]
        first, weights = taps[k]
        acc: R.Expr | None = None
        for t, w in enumerate(weights):
            sub = list(idx)
            sub[k] = clamp(first + float(t), k)
            term = interp(level - 1, sub) * w
            acc = term if acc is None else acc + term
        assert acc is not None
        mask = coords[k][1]
        return acc if mask is None else R.select(mask, R.lit(extrap, DType.f64), acc)

    return _finish(interp(len(axes) - 1, list(c.out)), x.dtype, m)


def _resize_numpy(xs: list[np.ndarray], out: TensorType, **a: Any) -> np.ndarray:
    x = xs[0]
    m = _NUMPY_MATH
    axes = _resize_axes(x.shape, out.shape, a)
    nearest = a["mode"] == "nearest"
    res: np.ndarray = x if nearest else x.astype(np.float64)
    for k in axes:
        in_w, out_n = x.shape[k], int(out.shape[k])
        o = np.arange(out_n, dtype=np.float64)
        coord, mask = _source_coord(m, o, float(in_w), float(out_n), a["scales"][k],
                                    a["coordinate_transformation_mode"], _roi(a, k, x.ndim))
        view = (1,) * k + (out_n,) + (1,) * (x.ndim - k - 1)
        if nearest:
            idx = np.clip(_nearest_index(m, coord, a["nearest_mode"]).astype(np.int64), 0, in_w - 1)
            res = np.take(res, idx, axis=k)
            if mask is not None:
                fill = a["extrapolation_value"] if x.dtype.kind == "f" else round(a["extrapolation_value"])
                res = np.where(mask.reshape(view), np.array(fill).astype(x.dtype), res)
            continue
        first, weights = _axis_taps(m, coord, float(in_w), a["scales"][k], a)
        acc: np.ndarray | None = None
        for t, w in enumerate(weights):
            idx = np.clip((first + float(t)).astype(np.int64), 0, in_w - 1)
            term = np.take(res, idx, axis=k) * np.broadcast_to(w, (out_n,)).reshape(view)
            acc = term if acc is None else acc + term
        assert acc is not None
        res = acc if mask is None else np.where(mask.reshape(view), a["extrapolation_value"], acc)
    if nearest:
        return np.array(res)
    return _finish(res, out.dtype, m)


def _resize_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    up = {"sizes": (2, 3, 7, 8), "scales": (1.0, 1.0, 7 / 4, 8 / 5)}
    down = {"sizes": (2, 3, 3, 2), "scales": (1.0, 1.0, 0.75, 0.4)}
    return [
        ([x], {**up, "mode": "nearest"}),
        ([x], {**down, "mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "ceil"}),
        ([x], {**up, "mode": "linear", "coordinate_transformation_mode": "align_corners"}),
        ([x], {**down, "mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
        ([x], {**up, "mode": "cubic", "exclude_outside": True}),
        ([x], {"sizes": (2, 3, 3, 5), "scales": (1.0, 1.0, 0.75, 1.0), "mode": "cubic", "antialias": True,
               "coordinate_transformation_mode": "half_pixel_symmetric"}),
        ([x], {**down, "mode": "linear", "antialias": True}),
        ([x], {**up, "mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
               "roi": (0.0, 0.0, 0.2, 0.3, 1.0, 1.0, 0.9, 1.2), "extrapolation_value": 9.0}),
        ([(x * 50).astype(np.int32)], {**up, "mode": "cubic"}),
        ([np.arange(20, dtype=np.uint8).reshape(1, 1, 4, 5)], {"sizes": (1, 1, 6, 3), "scales": (1.0, 1.0, 1.5, 0.6),
                                                               "mode": "nearest", "nearest_mode": "round_prefer_ceil",
                                                               "coordinate_transformation_mode": "tf_crop_and_resize",
                                                               "roi": (0, 0, -0.2, 0.1, 1, 1, 1.1, 0.9),
                                                               "extrapolation_value": 3.0})]


define("resize", ("x",),
       attrs={"sizes": ("dims", REQUIRED), "scales": ("floats", REQUIRED), "mode": ("str", "nearest"),
              "coordinate_transformation_mode": ("str", "half_pixel"), "nearest_mode": ("str", "round_prefer_floor"),
              "roi": ("floats", ()), "cubic_coeff_a": ("float", -0.75), "exclude_outside": ("bool", False),
              "extrapolation_value": ("float", 0.0), "antialias": ("bool", False)},
       shape=_resize_type, rule=_resize_rule, numpy=_resize_numpy, family="layout",
       doc="ONNX Resize: output shape `sizes`; `scales` drive the coordinate mapping; nearest, linear or cubic "
           "interpolation computed in float64 (integers round half to even and saturate)",
       examples=_resize_examples)
