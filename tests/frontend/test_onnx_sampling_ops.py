"""ONNX RoiAlign and DeformConv, imported as composites of gathers and arithmetic: single-node
models run on the interpreter (and once each compiled), with onnx's reference evaluator as the
oracle, on shapes and attributes beyond the node conformance cases."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.frontend.onnx_node import StaticInputRequired, converters
from cuvil.interp import run_reference
from cuvil.onnx_backend import CuvilBackend

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.int64): TensorProto.INT64}


def _model(op: str, order: list[str], feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
           opset: int = 22, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, order, ["y"], name="n", **attrs)
    ins = [helper.make_tensor_value_info(n, _TYPES[a.dtype], list(a.shape)) for n, a in feeds.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in (consts or {}).items()]
    graph = helper.make_graph([node], "g", ins, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _emitted_ops(model: onnx.ModelProto) -> set[str]:
    return {v.op for v in import_onnx(model).main.ops()}


def _oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    outs = cast(list[np.ndarray], list(ReferenceEvaluator(model).run(None, feeds)))
    return outs[0]


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> np.ndarray:
    """Interpreter vs the reference evaluator; the converter emits only the CIR ops it declares."""
    op = model.graph.node[0].op_type
    assert _emitted_ops(model) <= set(converters()[("", op)].cir_ops)
    want = _oracle(model, feeds)
    (got,) = run_reference(import_onnx(model), feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return want


def _compiled_matches(model: onnx.ModelProto, feeds: dict[str, np.ndarray], want: np.ndarray) -> None:
    rep = CuvilBackend.prepare(model, mode="compiled", opt_level=1, passes="O0")
    (got,) = rep.run(feeds)
    (interp,) = rep.run_reference(feeds)
    np.testing.assert_allclose(got, interp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------
# RoiAlign


def _rois(rng: np.random.Generator, count: int, height: int, width: int, scale: float) -> np.ndarray:
    """Boxes in input coordinates (before spatial_scale) reaching past the image, one of them degenerate."""
    x1 = rng.uniform(-2.0, width, count) / scale
    y1 = rng.uniform(-2.0, height, count) / scale
    boxes = np.stack([x1, y1, x1 + rng.uniform(0.2, width, count) / scale,
                      y1 + rng.uniform(0.2, height, count) / scale], axis=1)
    boxes[0, 2] = boxes[0, 0] - 0.3 / scale  # x2 < x1
    return boxes.astype(np.float32)


ROI_CASES = [
    pytest.param(dict(mode="avg", coordinate_transformation_mode="half_pixel", output_height=3, output_width=4,
                      sampling_ratio=2, spatial_scale=0.5), 3, id="avg-half_pixel-3x4"),
    pytest.param(dict(mode="max", coordinate_transformation_mode="half_pixel", output_height=2, output_width=2,
                      sampling_ratio=3, spatial_scale=1.0), 4, id="max-half_pixel-2x2"),
    pytest.param(dict(mode="avg", coordinate_transformation_mode="output_half_pixel", output_height=4,
                      output_width=2, sampling_ratio=1, spatial_scale=0.25), 5, id="avg-output_half_pixel-4x2"),
    pytest.param(dict(mode="max", coordinate_transformation_mode="output_half_pixel", output_height=1,
                      output_width=3, sampling_ratio=2, spatial_scale=1.0), 1, id="max-output_half_pixel-1x3"),
]


@pytest.mark.parametrize(("attrs", "count"), ROI_CASES)
def test_roi_align_matches_the_reference(attrs: dict[str, Any], count: int) -> None:
    rng = np.random.default_rng(count)
    height, width = 6, 8
    x = rng.standard_normal((2, 3, height, width)).astype(np.float32)
    feeds = {"x": x, "rois": _rois(rng, count, height, width, attrs["spatial_scale"]),
             "batch": rng.integers(0, 2, count).astype(np.int64)}
    _check(_model("RoiAlign", ["x", "rois", "batch"], feeds, **attrs), feeds)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
def test_roi_align_adaptive_sampling_with_constant_rois(mode: str, transform: str) -> None:
    """sampling_ratio 0: each ROI gets its own sample grid (here of different sizes, one empty
    under half_pixel), sized at import from the constant rois."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 9, 7)).astype(np.float32)
    rois = np.array([[0.0, 0.0, 6.0, 8.0], [1.0, 2.0, 2.5, 3.0], [3.0, 1.0, 3.0, 1.0], [-1.0, 4.0, 8.0, 12.0]],
                    dtype=np.float32)
    feeds = {"x": x, "batch": np.zeros(4, dtype=np.int64)}
    model = _model("RoiAlign", ["x", "rois", "batch"], feeds, {"rois": rois}, mode=mode,
                   coordinate_transformation_mode=transform, output_height=2, output_width=3, sampling_ratio=0)
    _check(model, feeds)


def test_roi_align_adaptive_sampling_specializes_on_runtime_rois() -> None:
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 2, 5, 6)).astype(np.float32),
             "rois": np.array([[0.0, 0.0, 5.0, 4.0], [1.0, 1.0, 2.0, 3.5]], dtype=np.float32),
             "batch": np.array([1, 0], dtype=np.int64)}
    model = _model("RoiAlign", ["x", "rois", "batch"], feeds, output_height=2, output_width=2)
    with pytest.raises(StaticInputRequired):
        import_onnx(model)
    want = _oracle(model, feeds)
    (got,) = CuvilBackend.prepare(model).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_opset_10_uses_output_half_pixel() -> None:
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32),
             "rois": np.array([[0.5, 0.5, 3.0, 4.0], [1.0, 1.0, 1.2, 1.1]], dtype=np.float32),
             "batch": np.zeros(2, dtype=np.int64)}
    m10 = _model("RoiAlign", ["x", "rois", "batch"], feeds, opset=10, output_height=2, output_width=2,
                 sampling_ratio=2)
    m16 = _model("RoiAlign", ["x", "rois", "batch"], feeds, opset=16, output_height=2, output_width=2,
                 sampling_ratio=2, coordinate_transformation_mode="output_half_pixel")
    np.testing.assert_array_equal(run_reference(import_onnx(m10), feeds)[0], _check(m16, feeds))


def test_roi_align_in_f64() -> None:
    rng = np.random.default_rng(11)
    feeds = {"x": rng.standard_normal((1, 1, 4, 6)), "rois": _rois(rng, 3, 4, 6, 1.0).astype(np.float64),
             "batch": np.zeros(3, dtype=np.int64)}
    _check(_model("RoiAlign", ["x", "rois", "batch"], feeds, output_height=2, output_width=3, sampling_ratio=2),
           feeds, tol=1e-12)


@pytest.mark.usefixtures("private_cache")
def test_roi_align_compiled_matches_the_interpreter() -> None:
    rng = np.random.default_rng(13)
    feeds = {"x": rng.standard_normal((2, 2, 6, 5)).astype(np.float32), "rois": _rois(rng, 3, 6, 5, 1.0),
             "batch": np.array([1, 0, 1], dtype=np.int64)}
    model = _model("RoiAlign", ["x", "rois", "batch"], feeds, mode="max", output_height=2, output_width=3,
                   sampling_ratio=2)
    _compiled_matches(model, feeds, _check(model, feeds))


def test_roi_align_refuses_unknown_modes() -> None:
    feeds = {"x": np.zeros((1, 1, 4, 4), np.float32), "rois": np.zeros((1, 4), np.float32),
             "batch": np.zeros(1, np.int64)}
    with pytest.raises(UnsupportedOpError, match="mode 'min'"):
        import_onnx(_model("RoiAlign", ["x", "rois", "batch"], feeds, mode="min", sampling_ratio=1))


# --------------------------------------------------------------------------------------
# DeformConv


def _deform_feeds(rng: np.random.Generator, n: int, ch: int, size: tuple[int, int], oc: int, group: int,
                  kernel: tuple[int, int], out: tuple[int, int], og: int, mask: bool, bias: bool
                  ) -> dict[str, np.ndarray]:
    taps = kernel[0] * kernel[1]
    feeds = {"x": rng.standard_normal((n, ch, *size)).astype(np.float32),
             "w": rng.standard_normal((oc, ch // group, *kernel)).astype(np.float32),
             "offset": (rng.standard_normal((n, og * taps * 2, *out)) * 1.5).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(oc).astype(np.float32)
    if mask:
        feeds["mask"] = rng.uniform(0.0, 1.0, (n, og * taps, *out)).astype(np.float32)
    return feeds


DEFORM_CASES = [
    # n, ch, size, oc, group, kernel, out, og, mask, bias, attrs
    pytest.param(2, 4, (5, 6), 4, 2, (3, 3), (2, 3), 2, True, True,
                 dict(strides=[2, 2], pads=[1, 0, 0, 1]), id="groups-offset_groups-stride-pads-mask-bias"),
    pytest.param(1, 2, (6, 5), 3, 1, (2, 3), (6, 4), 1, False, False,
                 dict(dilations=[2, 1], pads=[1, 1, 1, 0]), id="dilation-nonsquare-kernel"),
    pytest.param(1, 4, (4, 4), 2, 1, (2, 2), (3, 3), 4, True, False, {}, id="offset_groups-mask"),
    pytest.param(2, 3, (4, 5), 6, 3, (3, 2), (2, 2), 1, False, True,
                 dict(strides=[1, 2]), id="depthwise-bias-stride"),
]


@pytest.mark.parametrize(("n", "ch", "size", "oc", "group", "kernel", "out", "og", "mask", "bias", "attrs"),
                         DEFORM_CASES)
def test_deform_conv_matches_the_reference(n: int, ch: int, size: tuple[int, int], oc: int, group: int,
                                           kernel: tuple[int, int], out: tuple[int, int], og: int, mask: bool,
                                           bias: bool, attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(n * 100 + ch * 10 + oc)
    feeds = _deform_feeds(rng, n, ch, size, oc, group, kernel, out, og, mask, bias)
    order = ["x", "w", "offset", "b" if bias else "", "mask" if mask else ""]
    while not order[-1]:
        order.pop()
    model = _model("DeformConv", order, feeds, group=group, offset_group=og, kernel_shape=list(kernel), **attrs)
    _check(model, feeds, tol=1e-4)


@pytest.mark.usefixtures("private_cache")
def test_deform_conv_compiled_matches_the_interpreter() -> None:
    rng = np.random.default_rng(17)
    feeds = _deform_feeds(rng, 1, 2, (4, 5), 2, 2, (2, 2), (3, 4), 2, True, True)
    model = _model("DeformConv", ["x", "w", "offset", "b", "mask"], feeds, group=2, offset_group=2)
    _compiled_matches(model, feeds, _check(model, feeds, tol=1e-4))


def test_deform_conv_refuses_other_than_two_spatial_dims() -> None:
    feeds = {"x": np.zeros((1, 1, 5), np.float32), "w": np.zeros((1, 1, 2), np.float32),
             "offset": np.zeros((1, 2, 4), np.float32)}
    with pytest.raises(UnsupportedOpError, match="only 2-D DeformConv"):
        import_onnx(_model("DeformConv", ["x", "w", "offset"], feeds))
