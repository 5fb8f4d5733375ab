"""Layout ops (expand, concat, split, slice, pad, tile, resize) against numpy and PyTorch.
Each case runs through the fast path and through the compute rule; symbolic dims run at several sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cuvil.errors import ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from tests.ir.op_testing import check, randn, run_op, t

# --------------------------------------------------------------------------------------
# expand, concat, split, tile


@pytest.mark.parametrize(("shape", "target"), [((3, 1), (2, 3, 4)), ((2, 1, 4), (3, 1, 5, 1)), ((4,), (1,))])
def test_expand_is_bidirectional_broadcast(shape, target):
    x = randn(*shape)
    check("expand", [x], x * np.ones(target, np.float32), shape=target)


def test_concat_matches_torch_cat():
    xs = [randn(2, 3, 4, seed=1), randn(2, 1, 4, seed=2), randn(2, 5, 4, seed=3)]
    check("concat", xs, t_cat(xs, 1), axis=1)
    check("concat", xs[:1] + xs[:1], t_cat(xs[:1] * 2, -1), axis=-1)
    ints = [np.arange(6).reshape(2, 3), np.arange(9).reshape(3, 3)]
    check("concat", ints, np.concatenate(ints, 0), axis=0)
    bools = [np.eye(2, dtype=bool), np.ones((2, 3), bool)]
    check("concat", bools, np.concatenate(bools, 1), axis=1)


def t_cat(xs: list[np.ndarray], axis: int) -> np.ndarray:
    return torch.cat([t(x) for x in xs], dim=axis).numpy()


def test_concat_keeps_signed_zero_and_nan():
    a = np.array([[-0.0, np.nan]], np.float32)
    b = np.array([[np.inf, -0.0]], np.float32)
    fast, rule = run_op("concat", [a, b], axis=0)
    for got in (fast, rule):
        assert np.signbit(got[0, 0]) and np.isnan(got[0, 1]) and np.signbit(got[1, 1])


def test_split_matches_torch_split():
    x = randn(3, 9, 2)
    sizes = (2, 4, 3)
    pieces = torch.split(t(x), list(sizes), dim=1)
    for k, p in enumerate(pieces):
        check("split", [x], p.numpy(), axis=1, sizes=sizes, index=k)


@pytest.mark.parametrize("repeats", [(2, 3), (1, 1), (3, 1)])
def test_tile_matches_torch(repeats):
    x = randn(2, 3)
    check("tile", [x], t(x).tile(repeats).numpy(), repeats=repeats)


def test_tile_zero_repeats_gives_empty():
    check("tile", [randn(2, 3)], np.zeros((0, 3), np.float32), repeats=(0, 1))


# --------------------------------------------------------------------------------------
# slice


@pytest.mark.parametrize(("starts", "ends", "steps"), [
    ((1, 0, 0), (3, 5, 2), (1, 2, 1)),
    ((3, 4, 1), (-1, 0, 2), (-1, -2, 1)),
    ((2, 2, 0), (2, 5, 2), (1, 3, 1)),   # an empty axis
    ((0, 4, 1), (4, -1, 0), (3, -4, -1)),
])
def test_slice_matches_numpy(starts, ends, steps):
    x = randn(4, 5, 2)
    idx = tuple(slice(s, None if e < 0 else e, st) for s, e, st in zip(starts, ends, steps, strict=True))
    check("slice", [x], x[idx], starts=starts, ends=ends, steps=steps)


def test_slice_rejects_unnormalized_bounds():
    b = Builder()
    x = b.param("x", DType.f32, [4])
    with pytest.raises(ShapeError):
        b.slice(x, starts=[-1], ends=[4], steps=[1])
    with pytest.raises(ShapeError):
        b.slice(x, starts=[0], ends=[5], steps=[1])
    with pytest.raises(ShapeError):
        b.slice(x, starts=[0], ends=[4], steps=[0])


# --------------------------------------------------------------------------------------
# pad


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(1, 2, 0, 3), (0, 5, 4, 0), (2, 0, 1, 1)])
def test_pad_matches_numpy(mode, pads):
    x = randn(3, 4)
    widths = [(pads[0], pads[2]), (pads[1], pads[3])]
    kw = {"constant_values": 2.5} if mode == "constant" else {}
    check("pad", [x], np.pad(x, widths, mode=mode, **kw), pads=pads, mode=mode, value=2.5)


def test_negative_pads_crop_like_torch():
    x = randn(2, 3, 5, 6)
    # torch's pad lists the last axis first: (left, right, top, bottom)
    expected = F.pad(t(x), (2, -3, -1, 2), value=-1.0).numpy()
    check("pad", [x], expected, pads=(0, 0, -1, 2, 0, 0, 2, -3), value=-1.0)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_negative_pads_crop_before_non_constant_padding(mode):
    x = randn(5, 6)
    expected = np.pad(x[1:, :4], [(0, 3), (2, 0)], mode=mode)
    check("pad", [x], expected, pads=(-1, 2, 3, -2), mode=mode)


def test_reflect_pad_matches_torch():
    x = randn(2, 3, 5)
    check("pad", [x], F.pad(t(x), (4, 2), mode="reflect").numpy(), pads=(0, 0, 4, 0, 0, 2), mode="reflect")


def test_pad_int_tensor_with_constant():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    check("pad", [x], np.pad(x, [(1, 0), (0, 2)], constant_values=7), pads=(1, 0, 0, 2), value=7.0)


def test_pad_rejects_bad_input():
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    with pytest.raises(ShapeError):
        b.pad(x, pads=[0, -4, 0, 0])
    with pytest.raises(ShapeError):
        b.pad(x, pads=[0, 1])
    with pytest.raises(ShapeError):
        b.pad(x, pads=[1, 0, 0, 0], mode="symmetric")
    with pytest.raises(ShapeError):
        b.pad(x, pads=[0, 1, 0, -3], mode="edge")


# --------------------------------------------------------------------------------------
# resize (PyTorch's interpolate as the oracle for the modes it shares with ONNX)


def _resize(x: np.ndarray, out_hw: tuple[int, int], **attrs: Any) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    scales = (1.0, 1.0, out_hw[0] / h, out_hw[1] / w)
    return run_op("resize", [x], sizes=(n, c, *out_hw), scales=scales, **attrs)


@pytest.mark.parametrize("out_hw", [(7, 9), (3, 2), (4, 10)])
@pytest.mark.parametrize(("attrs", "torch_kw"), [
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
     {"mode": "nearest"}),
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil"},
     {"mode": "nearest-exact"}),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     {"mode": "bilinear", "align_corners": False}),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"},
     {"mode": "bilinear", "align_corners": True}),
    ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel"},
     {"mode": "bicubic", "align_corners": False}),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
     {"mode": "bicubic", "align_corners": True}),
])
def test_resize_matches_torch_interpolate(out_hw, attrs, torch_kw):
    x = randn(2, 3, 4, 5)
    expected = F.interpolate(t(x).double(), size=out_hw, **torch_kw).float().numpy()
    for got in _resize(x, out_hw, **attrs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=str(attrs))


@pytest.mark.parametrize(("mode", "a"), [("linear", -0.75), ("cubic", -0.5)])
def test_resize_antialias_matches_torch_when_shrinking(mode, a):
    """PyTorch's antialiased filters skip taps outside the image (exclude_outside) and its bicubic uses a = -0.5.
    Only the fast path is compared here: the rule of a 12-tap filter is slow to evaluate literally; the
    catalogue test checks rule and fast path agree on smaller antialiased cases."""
    x = randn(1, 2, 8, 9)
    expected = F.interpolate(t(x).double(), size=(3, 4), mode="bilinear" if mode == "linear" else "bicubic",
                             antialias=True, align_corners=False).float().numpy()
    b = Builder()
    p = b.param("x", DType.f32, x.shape)
    y = b.resize(p, sizes=[1, 2, 3, 4], scales=[1.0, 1.0, 3 / 8, 4 / 9], mode=mode, antialias=True,
                 exclude_outside=True, cubic_coeff_a=a)
    [got] = run_reference(b.module(b.function("main", [p], [y])), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_resize_integer_input_rounds_and_saturates():
    x = np.array([[[[0, 251], [93, 17]]]], dtype=np.uint8)
    fast, rule = _resize(x, (3, 5), mode="cubic")
    ref = F.interpolate(t(x.astype(np.float64)), size=(3, 5), mode="bicubic", align_corners=False).numpy()
    assert np.abs(ref - np.round(ref)).min() > 1e-6  # no ties: rounding is then unambiguous
    expected = np.clip(np.round(ref), 0, 255).astype(np.uint8)
    assert expected.max() == 255  # some values overshoot and saturate
    np.testing.assert_array_equal(fast, expected)
    np.testing.assert_array_equal(rule, expected)


def test_resize_tf_crop_and_resize_extrapolates():
    x = randn(1, 1, 4, 4)
    roi = (0.0, 0.0, -0.5, 0.25, 1.0, 1.0, 0.75, 1.5)
    fast, rule = _resize(x, (3, 3), mode="linear", coordinate_transformation_mode="tf_crop_and_resize", roi=roi,
                         extrapolation_value=-7.0)
    # source coordinates by the tf_crop_and_resize formula; outside [0, 3] reads the extrapolation value
    ys = -0.5 * 3 + np.arange(3) * (0.75 + 0.5) * 3 / 2
    xs = 0.25 * 3 + np.arange(3) * (1.5 - 0.25) * 3 / 2
    expected = np.empty((3, 3))
    img = x[0, 0].astype(np.float64)
    for i, yy in enumerate(ys):
        for j, xx in enumerate(xs):
            if not (0 <= yy <= 3 and 0 <= xx <= 3):
                expected[i, j] = -7.0
                continue
            y0, x0 = int(np.floor(yy)), int(np.floor(xx))
            y1, x1 = min(y0 + 1, 3), min(x0 + 1, 3)
            fy, fx = yy - y0, xx - x0
            expected[i, j] = ((1 - fy) * ((1 - fx) * img[y0, x0] + fx * img[y0, x1])
                              + fy * ((1 - fx) * img[y1, x0] + fx * img[y1, x1]))
    for got in (fast, rule):
        np.testing.assert_allclose(got[0, 0], expected, rtol=1e-5, atol=1e-6)


def test_resize_rejects_bad_attributes():
    b = Builder()
    x = b.param("x", DType.f32, [1, 1, 2, 2])
    base = {"sizes": [1, 1, 4, 4], "scales": [1.0, 1.0, 2.0, 2.0]}
    with pytest.raises(ShapeError):
        b.resize(x, mode="area", **base)
    with pytest.raises(ShapeError):
        b.resize(x, coordinate_transformation_mode="tf_crop_and_resize", **base)
    with pytest.raises(ShapeError):
        b.resize(x, mode="nearest", antialias=True, **base)


# --------------------------------------------------------------------------------------
# symbolic dims


def test_layout_ops_with_symbolic_dims_run_at_several_sizes():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 3])
    head = b.slice(x, starts=[1, 0], ends=[n, 3], steps=[1, 2])        # x[1:, ::2]
    tail = b.slice(x, starts=[n - 1, 2], ends=[-1, 0], steps=[-1, -1])  # x[::-1, 2:0:-1]
    joined = b.concat(head, tail, axis=0)
    padded = b.pad(joined, pads=[1, 0, 0, 1], mode="edge")
    wide = b.expand(b.reshape(x, shape=[n, 1, 3]), shape=[n, 2, 3])
    piece = b.split(x, axis=0, sizes=[1, n - 1], index=1)
    m = b.module(b.function("main", [x], [padded, wide, piece]))
    for rows in (2, 5):
        xv = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        want = np.pad(np.concatenate([xv[1:, ::2], xv[::-1, 2:0:-1]]), [(1, 0), (0, 1)], mode="edge")
        got_pad, got_wide, got_piece = run_reference(m, [xv])
        np.testing.assert_array_equal(got_pad, want)
        np.testing.assert_array_equal(got_wide, np.broadcast_to(xv[:, None], (rows, 2, 3)))
        np.testing.assert_array_equal(got_piece, xv[1:])


def test_concat_shape_rule_checks_other_dims():
    b = Builder()
    with pytest.raises(ShapeError):
        b.concat(b.param("a", DType.f32, [2, 3]), b.param("c", DType.f32, [3, 3]), axis=1)
    with pytest.raises(ShapeError):
        b.concat(b.param("a", DType.f32, [2, 3]), b.param("c", DType.i32, [2, 3]), axis=1)
    with pytest.raises(ShapeError):
        b.split(b.param("a", DType.f32, [2, 5]), axis=1, sizes=[2, 2], index=0)
