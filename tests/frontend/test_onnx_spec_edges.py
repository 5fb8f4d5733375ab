"""ONNX ops at the edges of their specification, on the interpreter and a compiled library, against ONNX Runtime.

Each case was a disagreement found by random single-op graphs: defaults of float attributes (float32 in ONNX, so
a float64 LeakyRelu's default slope is 0.01f), empty axes (Hardmax's empty result, ArgMax over nothing),
infinities in a log-sum-exp, Resize's source position for a single output, and
symbolic dims whose run-time value decides a shape (Split into ``num_outputs``, Squeeze without axes, an input
no result reads).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import compile
from cuvil.errors import CuvilError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

ort = pytest.importorskip("onnxruntime")


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[Any]]], outputs: list[str],
           opset: int = 18, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _onnx_runtime(model: onnx.ModelProto, xs: list[np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), xs, strict=True)})


def _both(model: onnx.ModelProto, xs: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The interpreter's results and a compiled library's."""
    return run_reference(import_onnx(model), xs), compile(model, cache=False).run(xs)


def _as_onnx_runtime(model: onnx.ModelProto, xs: list[np.ndarray]) -> None:
    want = _onnx_runtime(model, xs)
    for got in _both(model, xs):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(("op", "attr", "x"), [
    ("LeakyRelu", "alpha", [-3.3184299832906032, -1.0, -100.0, 2.0]),
    ("HardSigmoid", "alpha", [-1.0, 0.3, 2.0, -3.0]),
    ("HardSigmoid", "beta", [-1.0, 0.3, 2.0, -3.0]),
    ("Elu", "alpha", [-1.0, -0.25, 2.0, -30.0])])
def test_a_float64_activation_reads_its_default_attribute_as_the_float32_onnx_holds(op: str, attr: str,
                                                                                   x: list[float]) -> None:
    """A left-out float attribute means its default as an ONNX float attribute holds it (LeakyRelu's 0.01f =
    0.0099999997764825821), as ONNX Runtime reads it and as the same value written out reads."""
    defaults = {("LeakyRelu", "alpha"): 0.01, ("HardSigmoid", "alpha"): 0.2, ("HardSigmoid", "beta"): 0.5,
                ("Elu", "alpha"): 1.0}
    xs = [np.array(x, dtype=np.float64)]
    io = {"x": (TensorProto.DOUBLE, [len(x)])}
    implicit = _model([helper.make_node(op, ["x"], ["y"])], io, ["y"])
    written = _model([helper.make_node(op, ["x"], ["y"], **{attr: defaults[op, attr]})], io, ["y"])
    _as_onnx_runtime(implicit, xs)
    for a, b in zip(_both(implicit, xs), _both(written, xs), strict=True):
        np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize(("shape", "axis", "opset"), [([0], -1, 13), ([0, 5, 1, 4], 0, 13), ([2, 0], 1, 11),
                                                      ([0, 3], 1, 13)])
def test_hardmax_of_an_empty_tensor_is_empty(shape: list[int], axis: int, opset: int) -> None:
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], {"x": (TensorProto.FLOAT, shape)}, ["y"],
                   opset=opset)
    _as_onnx_runtime(model, [np.zeros(shape, np.float32)])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_an_extreme_along_an_empty_axis_is_refused_with_a_shape_error(op: str) -> None:
    """ONNX Runtime fails at run time; there is no position to give."""
    model = _model([helper.make_node(op, ["x"], ["y"], axis=1)], {"x": (TensorProto.FLOAT, [2, 0])}, ["y"])
    with pytest.raises(CuvilError) as refused:
        import_onnx(model)
    assert refused.value.code == "CUVIL-SHAPE" and "empty" in str(refused.value)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_log_sum_exp_of_infinities(opset: int, keepdims: int) -> None:
    """All -inf gives -inf (log 0), a +inf gives +inf, a NaN NaN: shifting by an infinite max gave inf - inf."""
    inf, nan = np.inf, np.nan
    x = np.array([[-inf, -inf, -inf], [0.1, 0.2, 0.3], [1.0, inf, 2.0], [-inf, 0.5, -inf], [inf, -inf, 1.0],
                  [nan, 1.0, 2.0], [-inf, nan, 0.0]], np.float32)
    if opset >= 18:
        node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=keepdims)
        inits = {"axes": np.array([1], np.int64)}
    else:
        node, inits = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=keepdims), {}
    model = _model([node], {"x": (TensorProto.FLOAT, list(x.shape))}, ["y"], opset=opset, inits=inits)
    want = _onnx_runtime(model, [x])[0]
    for got in _both(model, [x]):
        np.testing.assert_allclose(got[0], want, rtol=1e-6)


@pytest.mark.parametrize(("mode", "transform", "x", "sizes"), [
    ("cubic", "pytorch_half_pixel", [1.0, 2.0, 4.0, 8.0], 1),  # one output: its source is 0 (the formula), not -0.5
    ("linear", "pytorch_half_pixel", [1.0, 2.0, 4.0, 8.0], 1),
    ("cubic", "align_corners", [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], 4),
    ("linear", "tf_crop_and_resize", [1.0, 2.0, 4.0, 8.0, 16.0], 3),
    ("linear", "tf_crop_and_resize", [1.0, 2.0, 4.0, 8.0, 16.0], 1)])
def test_resize_to_sizes_at_the_formulas_edges(mode: str, transform: str, x: list[float], sizes: int) -> None:
    """Output sizes given, so ``length_resized`` is whole and every reading of the formulas agrees with ONNX
    Runtime's (where a scale factor makes it fractional, ONNX's test data and ONNX Runtime differ: the node
    conformance suite holds those cases)."""
    data = np.array(x, np.float32).reshape(1, 1, 1, -1)
    inits = {"sizes": np.array([1, 1, 1, sizes], np.int64)}
    if transform == "tf_crop_and_resize":
        inits["roi"] = np.array([0, 0, 0, 0.1, 1, 1, 1, 0.9], np.float32)
    node = helper.make_node("Resize", ["x", "roi" if "roi" in inits else "", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode=transform)
    model = _model([node], {"x": (TensorProto.FLOAT, list(data.shape))}, ["y"], inits=inits)
    want = _onnx_runtime(model, [data])[0]
    for got in _both(model, [data]):
        assert got[0].shape == want.shape  # cubic weights: ONNX Runtime sums them in float32
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


# -- symbolic dims decided at run time ----------------------------------------------------------------------


def test_split_into_num_outputs_on_a_symbolic_axis_follows_its_length() -> None:
    """Pieces of ceil(N / 4), the rest last, at each N the library and the interpreter are run at."""
    outs = ["y0", "y1", "y2", "y3"]
    model = _model([helper.make_node("Split", ["x"], outs, axis=0, num_outputs=4)],
                   {"x": (TensorProto.INT32, ["N", 3])}, outs)
    for n in (8, 7, 6):
        _as_onnx_runtime(model, [np.arange(n * 3, dtype=np.int32).reshape(n, 3)])
    static = _model([helper.make_node("Split", ["x"], outs, axis=0, num_outputs=4)],
                    {"x": (TensorProto.INT32, [5, 3])}, outs)
    x5 = np.arange(15, dtype=np.int32).reshape(5, 3)
    for a, b in zip(_both(model, [x5]), _both(static, [x5]), strict=True):  # as the static split: 2, 2, 1, 0
        assert [p.shape[0] for p in a] == [p.shape[0] for p in b] == [2, 2, 1, 0]


def test_an_equal_split_of_a_symbolic_axis_that_does_not_divide_is_refused_at_run_time() -> None:
    model = _model([helper.make_node("Split", ["x"], ["a", "b"], axis=0)], {"x": (TensorProto.INT32, ["N", 2])},
                   ["a", "b"], opset=13)
    _as_onnx_runtime(model, [np.zeros((6, 2), np.int32)])
    x = np.zeros((5, 2), np.int32)
    with pytest.raises(CuvilError, match="do not add up") as interpreted:
        run_reference(import_onnx(model), [x])
    with pytest.raises(CuvilError, match="do not add up") as compiled:
        compile(model, cache=False).run([x])
    assert interpreted.value.code == compiled.value.code == "CUVIL-SHAPE"


def test_squeeze_without_axes_of_a_symbolic_dim_follows_its_run_time_size() -> None:
    """ONNX drops every dim that is 1, so whether a symbolic dim stays depends on its size: the model is
    imported per shape signature (N = 1 squeezed away, as ONNX Runtime does), and refused as one shape class
    unless the dims' declared ranges decide it; a dim that can never be 1 (2N) stays with no question asked."""
    model = _model([helper.make_node("Squeeze", ["x"], ["y"])], {"x": (TensorProto.FLOAT, ["N", 3, 1])}, ["y"],
                   opset=13)
    library = compile(model, cache=False)
    for n in (4, 1):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3, 1)
        (got,), (want,) = library.run([x]), _onnx_runtime(model, [x])
        assert got.shape == want.shape and np.array_equal(got, want)
    with pytest.raises(CuvilError) as refused:
        import_onnx(model)
    assert refused.value.code == "CUVIL-DYNAMIC-INPUT"
    ranged = import_onnx(model, dim_ranges={"N": (2, 64)})
    assert [str(d) for d in ranged.main.results[0].type.shape] == ["N", "3"]
    doubled = _model([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Squeeze", ["r"], ["y"])],
                     {"x": (TensorProto.FLOAT, ["N", 4, 1])}, ["y"], inits={"s": np.array([-1, 2, 1], np.int64)})
    _as_onnx_runtime(doubled, [np.ones((1, 4, 1), np.float32)])


@pytest.mark.parametrize(("op", "shape"), [("EyeLike", ["N", 3]), ("Size", ["N", 0, 5]), ("Shape", ["N", 2])])
def test_a_symbolic_input_that_no_result_reads_still_binds(op: str, shape: list[Any]) -> None:
    """The library specialized at the call's shapes keeps every parameter, read or not."""
    model = _model([helper.make_node(op, ["x"], ["y"])], {"x": (TensorProto.FLOAT, shape)}, ["y"])
    _as_onnx_runtime(model, [np.ones([2 if d == "N" else d for d in shape], np.float32)])


def test_a_constant_slice_bound_past_a_symbolic_axis_is_a_shape_error_on_both_paths() -> None:
    """Bounds on a symbolic axis are imported as lying within it; where they do not, both refuse alike."""
    model = _model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], {"x": (TensorProto.FLOAT, ["N", 4])},
                   ["y"], inits={"s": np.array([0], np.int64), "e": np.array([6], np.int64),
                                 "a": np.array([0], np.int64)})
    _as_onnx_runtime(model, [np.ones((7, 4), np.float32)])
    x = [np.ones((3, 4), np.float32)]
    for run in (lambda: run_reference(import_onnx(model), x), lambda: compile(model, cache=False).run(x)):
        with pytest.raises(CuvilError, match="do not lie within") as refused:
            run()
        assert refused.value.code == "CUVIL-SHAPE"
