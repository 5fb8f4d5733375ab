"""ONNX layout and indexing converters: small models built in-process, imported into CIR and run on the
reference interpreter, compared with ONNX Runtime as the oracle (ONNX's reference evaluator where Runtime
lacks the op). Shape-like operands are initializers unless a case says otherwise."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_testing import NodeCase as Case

from cuvil.errors import CuvilError, RuntimeEvalError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference
from cuvil.onnx_backend import CuvilBackend


def randn(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def i64(*v: Any) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e) and "not implemented" not in str(e).lower():
            raise
        from onnx.reference import ReferenceEvaluator

        return cast(list[np.ndarray], list(ReferenceEvaluator(model).run(None, feeds)))
    return cast(list[np.ndarray], list(sess.run(None, feeds)))  # a single-node model returns tensors only


def ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    module = import_onnx(model)
    return run_reference(module, {p.name: feeds[p.name] for p in module.main.params})


def compare(got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _cases() -> dict[str, Case]:
    x = randn(2, 3, 4)
    x4 = randn(2, 8, 3, 4, seed=1)
    img = randn(1, 2, 4, 5, seed=2)
    c: dict[str, Case] = {}
    # shapes
    c["Shape"] = Case("Shape", {"x": x})
    c["Shape-start-end"] = Case("Shape", {"x": x}, attrs={"start": -2, "end": 10}, opset=15)
    c["Size"] = Case("Size", {"x": x})
    for axis in (0, 2, -1):
        c[f"Flatten-{axis}"] = Case("Flatten", {"x": x}, attrs={"axis": axis})
    c["Squeeze-11"] = Case("Squeeze", {"x": randn(2, 1, 3, 1)}, attrs={"axes": [1, -1]}, opset=11)
    c["Squeeze-13"] = Case("Squeeze", {"x": randn(2, 1, 3, 1)}, {"axes": i64(3)}, opset=13)
    c["Squeeze-all"] = Case("Squeeze", {"x": randn(1, 3, 1)}, opset=13)
    c["Unsqueeze-11"] = Case("Unsqueeze", {"x": x}, attrs={"axes": [0, -1]}, opset=11)
    c["Unsqueeze-13"] = Case("Unsqueeze", {"x": x}, {"axes": i64(4, 1)}, opset=13)
    c["Expand"] = Case("Expand", {"x": randn(3, 1)}, {"shape": i64(2, 1, 4)})
    c["Concat"] = Case("Concat", {"a": x, "b": randn(2, 1, 4, seed=3)}, attrs={"axis": -2})
    c["Tile"] = Case("Tile", {"x": x}, {"r": i64(2, 1, 3)})
    # split, slice
    c["Split-11-attr"] = Case("Split", {"x": randn(2, 7)}, attrs={"axis": 1, "split": [3, 4]}, opset=11, outputs=2)
    c["Split-13-input"] = Case("Split", {"x": randn(6, 2)}, {"s": i64(1, 2, 3)}, opset=13, outputs=3)
    c["Split-13-equal"] = Case("Split", {"x": randn(6, 2)}, opset=13, outputs=3)
    c["Split-18-num-outputs"] = Case("Split", {"x": randn(2, 7)}, attrs={"axis": 1, "num_outputs": 3}, opset=18,
                                     outputs=3)
    c["Slice-9-attrs"] = Case("Slice", {"x": x}, attrs={"starts": [1, -3], "ends": [1000, -1], "axes": [1, 2]},
                              opset=9)
    c["Slice-13"] = Case("Slice", {"x": x}, {"s": i64(0, 3), "e": i64(-1, 0), "a": i64(0, -1), "st": i64(1, -2)})
    c["Slice-13-int-max"] = Case("Slice", {"x": x}, {"s": i64(-1), "e": i64(np.iinfo(np.int64).min), "a": i64(1),
                                                     "st": i64(-1)})
    c["Slice-13-clamp"] = Case("Slice", {"x": x}, {"s": i64(-100, 2), "e": i64(100, 2**62)}, inputs=["x", "s", "e"])
    c["Slice-13-empty"] = Case("Slice", {"x": x}, {"s": i64(3), "e": i64(1), "a": i64(2)})
    # pad
    c["Pad-2-attrs"] = Case("Pad", {"x": x}, attrs={"pads": [0, 1, 2, 1, 0, 1], "value": 1.5}, opset=7)
    c["Pad-11-reflect"] = Case("Pad", {"x": x}, {"p": i64(0, 2, 3, 0, 1, 2)}, attrs={"mode": "reflect"}, opset=11)
    c["Pad-11-edge-value"] = Case("Pad", {"x": x}, {"p": i64(1, 0, 0, 0, 2, 1), "v": np.array(9.0, np.float32)},
                                  attrs={"mode": "edge"}, opset=11)
    c["Pad-13-negative"] = Case("Pad", {"x": x}, {"p": i64(0, -1, 2, 1, 1, -3), "v": np.array(-2.0, np.float32)},
                                opset=13)
    c["Pad-18-axes"] = Case("Pad", {"x": x}, {"p": i64(2, 1, 0, 3), "v": np.array(0.5, np.float32),
                                              "a": i64(0, -1)}, opset=18)
    c["Pad-19-wrap"] = Case("Pad", {"x": x}, {"p": i64(0, 2, 5, 0, 1, 1)}, attrs={"mode": "wrap"}, opset=19)
    # rearrangements
    c["DepthToSpace-DCR"] = Case("DepthToSpace", {"x": x4}, attrs={"blocksize": 2})
    c["DepthToSpace-CRD"] = Case("DepthToSpace", {"x": x4}, attrs={"blocksize": 2, "mode": "CRD"})
    c["SpaceToDepth"] = Case("SpaceToDepth", {"x": randn(2, 3, 4, 6)}, attrs={"blocksize": 2})
    c["CenterCropPad"] = Case("CenterCropPad", {"x": randn(5, 3, 4)}, {"s": i64(3, 6)}, attrs={"axes": [0, -1]},
                              opset=18)
    # resize
    for mode, coord, extra in [("nearest", "asymmetric", {"nearest_mode": "floor"}),
                               ("nearest", "half_pixel", {"nearest_mode": "round_prefer_ceil"}),
                               ("linear", "half_pixel", {}), ("linear", "align_corners", {}),
                               ("linear", "pytorch_half_pixel", {}), ("cubic", "half_pixel", {"exclude_outside": 1}),
                               ("cubic", "asymmetric", {"cubic_coeff_a": -0.5})]:
        attrs = {"mode": mode, "coordinate_transformation_mode": coord, **extra}
        c[f"Resize-scales-{mode}-{coord}"] = Case("Resize", {"x": img}, {"sc": np.array([1, 1, 1.5, 0.6], np.float32)},
                                                   attrs=attrs, inputs=["x", "", "sc"], opset=13)
        c[f"Resize-sizes-{mode}-{coord}"] = Case("Resize", {"x": img}, {"sz": i64(1, 2, 7, 3)}, attrs=attrs,
                                                  inputs=["x", "", "", "sz"], opset=13)
    c["Resize-crop"] = Case("Resize", {"x": img}, {"roi": np.array([0, 0, 0.1, -0.2, 1, 1, 0.8, 1.1], np.float32),
                                                   "sz": i64(1, 2, 3, 4)},
                            attrs={"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                                   "extrapolation_value": 5.0}, inputs=["x", "roi", "", "sz"], opset=13)
    c["Resize-axes"] = Case("Resize", {"x": img}, {"sz": i64(6, 2)}, attrs={"mode": "linear", "axes": [3, 2]},
                            inputs=["x", "", "", "sz"], opset=18)
    c["Resize-keep-aspect"] = Case("Resize", {"x": img}, {"sz": i64(8, 8)},
                                   attrs={"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
                                   inputs=["x", "", "", "sz"], opset=18)
    c["Resize-antialias"] = Case("Resize", {"x": randn(1, 1, 8, 9)}, {"sz": i64(1, 1, 3, 4)},
                                 attrs={"mode": "linear", "antialias": 1}, inputs=["x", "", "", "sz"], opset=18)
    c["Resize-10-up"] = Case("Resize", {"x": img}, {"sc": np.array([1, 1, 2, 3], np.float32)}, opset=10)
    c["Resize-10-down"] = Case("Resize", {"x": randn(1, 1, 6, 7)}, {"sc": np.array([1, 1, 0.5, 0.4], np.float32)},
                               opset=10)
    c["Upsample-9"] = Case("Upsample", {"x": img}, {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=9)
    c["Upsample-7-linear"] = Case("Upsample", {"x": img}, attrs={"scales": [1.0, 1.0, 2.0, 1.5], "mode": "linear"},
                                  opset=7)
    # gathers and scatters
    ind = i64([2, -1], [0, 1])
    c["Gather"] = Case("Gather", {"x": x}, {"i": ind}, attrs={"axis": 1})
    c["Gather-i32-scalar"] = Case("Gather", {"x": x}, {"i": np.array(-1, np.int32)}, attrs={"axis": 2})
    c["GatherElements"] = Case("GatherElements", {"x": x}, {"i": i64([[1, -3]], [[0, 2]])}, attrs={"axis": 1})
    c["GatherND"] = Case("GatherND", {"x": x}, {"i": i64([1, 2], [0, -1])})
    c["GatherND-batch"] = Case("GatherND", {"x": x}, {"i": i64([[2], [0]], [[1], [1]])}, attrs={"batch_dims": 1},
                               opset=13)
    upd = randn(2, 2, 4, seed=4)
    c["Scatter-9"] = Case("Scatter", {"x": randn(3, 4)}, {"i": i64([2, 0], [1, 3]), "u": randn(2, 2, seed=5)},
                          attrs={"axis": 1}, opset=9)
    for red in ("none", "add", "mul", "max", "min"):
        c[f"ScatterElements-{red}"] = Case("ScatterElements", {"x": randn(3, 4)},
                                           {"i": i64([2, 0, 1], [1, 1, 3]), "u": randn(2, 3, seed=6)},
                                           attrs={"axis": 1, "reduction": red}, opset=18)
        c[f"ScatterND-{red}"] = Case("ScatterND", {"x": x}, {"i": i64([[1, 0]], [[0, 2]]), "u": upd[:, :1]},
                                     attrs={"reduction": red}, opset=18)
    c["ScatterND-repeated-add"] = Case("ScatterND", {"x": x}, {"i": i64([[1]], [[1]]), "u": randn(2, 1, 3, 4)},
                                       attrs={"reduction": "add"}, opset=16)
    c["OneHot"] = Case("OneHot", {"i": i64([1, -1], [0, 5])}, {"d": i64(4), "v": np.array([-1.0, 2.0], np.float32)},
                       attrs={"axis": 1}, opset=11)
    c["OneHot-float-indices"] = Case("OneHot", {"i": np.array([0.0, 2.0, 1.0], np.float32)},
                                     {"d": np.array(3.0, np.float32), "v": i64(0, 7)}, opset=11)
    c["EyeLike"] = Case("EyeLike", {"x": randn(3, 5)}, attrs={"k": 1, "dtype": TensorProto.INT32})
    c["Trilu-lower"] = Case("Trilu", {"x": x}, {"k": i64(-1)}, attrs={"upper": 0}, opset=14)
    c["Trilu-upper"] = Case("Trilu", {"x": x}, opset=14)
    c["Range-int"] = Case("Range", {}, {"a": np.array(3), "b": np.array(-7), "c": np.array(-3)},
                       opset=11, out=TensorProto.INT64)
    c["Range-float"] = Case("Range", {}, {"a": np.array(0.5, np.float32), "b": np.array(3.0, np.float32),
                                          "c": np.array(0.75, np.float32)}, opset=11,
                         out=TensorProto.FLOAT)
    c["ConstantOfShape"] = Case("ConstantOfShape", {}, {"s": i64(2, 3)},
                                attrs={"value": numpy_helper.from_array(np.array([7], np.int32))}, opset=11)
    c["ReverseSequence"] = Case("ReverseSequence", {"x": randn(4, 3, 2)}, {"l": i64(4, 1, 2)},
                                attrs={"time_axis": 0, "batch_axis": 1}, opset=10)
    c["ReverseSequence-batch-first"] = Case("ReverseSequence", {"x": randn(3, 4)}, {"l": i64(2, 4, 3)},
                                            attrs={"time_axis": 1, "batch_axis": 0}, opset=10)
    c["Compress-axis"] = Case("Compress", {"x": x}, {"c": np.array([True, False, True])}, attrs={"axis": 1})
    c["Compress-flat"] = Case("Compress", {"x": randn(2, 3)}, {"c": np.array([0, 1, 1, 0, 1], bool)})
    return c


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_converter_matches_onnxruntime(name):
    case = CASES[name]
    model = case.model()
    compare(ours(model, case.feeds), oracle(model, case.feeds))


def _symbolic_model() -> onnx.ModelProto:
    """Shape arithmetic on a dynamic batch: x[N, 3, 4] -> reshape to [N, 12], sliced, padded, expanded, split;
    Size, Range and ConstantOfShape driven by the symbolic batch."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "twelve"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Slice", ["flat", "sl_s", "sl_e", "sl_a", "sl_st"], ["sliced"]),
        helper.make_node("Pad", ["sliced", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Concat", ["n1", "one", "three"], ["big"], axis=0),
        helper.make_node("Expand", ["col", "big"], ["expanded"]),
        helper.make_node("Split", ["flat"], ["left", "right"], axis=1, num_outputs=2),
        helper.make_node("Size", ["x"], ["count"]),
        helper.make_node("Range", ["zero", "n", "step"], ["positions"]),
        helper.make_node("ConstantOfShape", ["s"], ["filled"], value=numpy_helper.from_array(np.array([2.5],
                                                                                                      np.float32))),
    ]
    inits = {"zero": np.array(0, np.int64), "step": np.array(2, np.int64), "ax0": i64(0), "twelve": i64(12),
             "one": i64(1), "three": i64(3),
             "sl_s": i64(-1, 1), "sl_e": i64(-2**63, 11), "sl_a": i64(0, 1), "sl_st": i64(-1, 3),
             "pads": i64(1, 0, 0, 2), "col": randn(1, 1, 3, seed=7)}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
         for n in ("padded", "expanded", "left", "right", "count", "positions", "filled")],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_symbolic_batch_shape_arithmetic_matches_onnxruntime():
    model = _symbolic_model()
    module = import_onnx(model)  # imported once, run at several batch sizes
    assert [str(d) for d in module.main.params[0].type.shape] == ["N", "3", "4"]
    for n in (2, 5):
        feeds = {"x": randn(n, 3, 4, seed=n)}
        compare(run_reference(module, feeds), oracle(model, feeds))


def test_slice_bounds_fed_as_graph_inputs_are_bound_at_run_time():
    """Bounds that are graph inputs make the backend specialize the model on their values."""
    case = Case("Slice", {"x": randn(4, 5), "s": i64(1), "e": i64(-1)}, {"a": i64(1)})
    model = case.model()
    rep = CuvilBackend.prepare(model)
    for s, e in ((1, -1), (0, 3)):
        feeds = {"x": case.feeds["x"], "s": i64(s), "e": i64(e)}
        compare(list(rep.run(feeds)), oracle(model, feeds))


def test_gather_out_of_range_index_is_an_evaluation_error():
    model = Case("Gather", {"x": randn(3, 4), "i": i64(0, 3)}, attrs={"axis": 0}).model()
    module = import_onnx(model)
    with pytest.raises(RuntimeEvalError):
        run_reference(module, {"x": randn(3, 4), "i": i64(0, 3)})


@pytest.mark.parametrize(("case", "what"), [
    (Case("Pad", {"x": randn(2, 3)}, {"p": i64(0, 0, 1, 1)}, attrs={"mode": "symmetric"}, opset=11), "mode"),
    (Case("Resize", {"x": randn(1, 1, 2, 2)}, {"sc": np.array([1, 1, 2, 2], np.float32)}, attrs={"mode": "area"},
          inputs=["x", "", "sc"], opset=13), "mode"),
    (Case("Squeeze", {"x": randn(2, 3)}, {"a": i64(1)}, opset=13), "squeeze"),
    (Case("Unsqueeze", {"x": randn(2, 3)}, {"a": i64(5)}, opset=13), "out of range"),
    (Case("Split", {"x": randn(2, 7)}, attrs={"axis": 1}, opset=13, outputs=2), "split"),
])
def test_bad_nodes_raise_cuvil_errors(case, what):
    with pytest.raises(CuvilError) as info:
        import_onnx(case.model())
    assert what in str(info.value).lower()
    assert info.value.location
