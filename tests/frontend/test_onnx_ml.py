"""ONNX-ML models (``ai.onnx.ml``): linear models, scalers, normalizers and tree ensembles, as scikit-learn,
XGBoost and LightGBM exporters write them. Random forests of random shapes (depths, comparison modes, missing
values, several targets or classes, averaged or summed, transformed) against ONNX Runtime, on the interpreter
and compiled; malformed forests refused with their reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.errors import ShapeError, UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _graph_model(op: str, inputs: list[tuple[str, int, list[Any]]], outputs: list[str],
                 **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, [n for n, _, _ in inputs], outputs, domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


def _model(op: str, features: int, outputs: list[str], dtype: int = TensorProto.FLOAT, **attrs: Any) -> onnx.ModelProto:
    return _graph_model(op, [("x", dtype, ["n", features])], outputs, **attrs)


def _agree_feeds(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-5,
                 compiled: bool = False) -> list[np.ndarray]:
    """The interpreter's results (and the compiled library's) against ONNX Runtime's; returns the first."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    runs = [run_reference(import_onnx(model), list(feeds.values()))]
    if compiled:
        out = cuvil.compile(model, cache=False)(*feeds.values())
        runs.append([np.asarray(v) for v in (out if isinstance(out, tuple) else (out,))])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return runs[0]


def _agree(model: onnx.ModelProto, x: np.ndarray, tol: float = 1e-5, compiled: bool = False) -> list[np.ndarray]:
    return _agree_feeds(model, {"x": x}, tol, compiled)


def _forest(rng: np.random.Generator, trees: int, features: int, outputs: int, depth: int, modes: list[str],
            missing: bool, prefix: str, values: np.ndarray) -> dict[str, Any]:
    """Random trees: each node a leaf with chance growing with its depth, thresholds drawn from the data's
    values (so that equality modes are met), node ids shuffled within each tree (0 to its size - 1, as ONNX
    Runtime requires)."""
    attrs: dict[str, list[Any]] = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                                                   "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                                                   "nodes_missing_value_tracks_true", f"{prefix}_treeids",
                                                   f"{prefix}_nodeids", f"{prefix}_ids", f"{prefix}_weights")}
    for t in range(trees):
        shape: list[tuple[int, int]] = []  # (depth, parent slot) in creation order
        kids: dict[int, tuple[int, int]] = {}
        pending = [(0, 0)]
        while pending:
            level, slot = pending.pop()
            if level < depth and (level == 0 or rng.random() > 0.3 + 0.1 * level):
                kids[slot] = (len(shape) + len(pending) + 1, len(shape) + len(pending) + 2)
                pending += [(level + 1, kids[slot][0]), (level + 1, kids[slot][1])]
            shape.append((level, slot))
        ids = rng.permutation(len(shape))
        for _, slot in shape:
            attrs["nodes_treeids"].append(t)
            attrs["nodes_nodeids"].append(int(ids[slot]))
            if slot in kids:
                attrs["nodes_featureids"].append(int(rng.integers(features)))
                attrs["nodes_modes"].append(modes[rng.integers(len(modes))])
                attrs["nodes_values"].append(float(rng.choice(values)))
                attrs["nodes_truenodeids"].append(int(ids[kids[slot][0]]))
                attrs["nodes_falsenodeids"].append(int(ids[kids[slot][1]]))
                attrs["nodes_missing_value_tracks_true"].append(int(missing and rng.random() < 0.5))
            else:
                attrs["nodes_featureids"].append(0)
                attrs["nodes_modes"].append("LEAF")
                attrs["nodes_values"].append(0.0)
                attrs["nodes_truenodeids"].append(0)
                attrs["nodes_falsenodeids"].append(0)
                attrs["nodes_missing_value_tracks_true"].append(0)
                for k in rng.choice(outputs, size=int(rng.integers(1, outputs + 1)), replace=False):
                    attrs[f"{prefix}_treeids"].append(t)
                    attrs[f"{prefix}_nodeids"].append(int(ids[slot]))
                    attrs[f"{prefix}_ids"].append(int(k))
                    attrs[f"{prefix}_weights"].append(float(rng.standard_normal()))
    return attrs


def _data(rng: np.random.Generator, rows: int, features: int, missing: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows of values from a small set (so that thresholds and equalities are hit), NaNs where ``missing``."""
    values = np.round(rng.standard_normal(12), 2).astype(np.float32)
    x = rng.choice(values, size=(rows, features)).astype(np.float32)
    if missing:
        x[rng.random(x.shape) < 0.15] = np.nan
    return x, values


CASES = [  # trees, depth, modes, missing values, outputs, aggregate, post transform
    (1, 1, ["BRANCH_LEQ"], False, 1, "SUM", "NONE"),
    (7, 4, ["BRANCH_LEQ"], False, 1, "SUM", "NONE"),
    (5, 6, ["BRANCH_LT"], True, 1, "AVERAGE", "NONE"),
    (9, 3, MODES, True, 3, "AVERAGE", "LOGISTIC"),
    (4, 5, ["BRANCH_GTE", "BRANCH_GT"], False, 2, "SUM", "SOFTMAX"),
]


@pytest.mark.parametrize(("trees", "depth", "modes", "missing", "targets", "aggregate", "post"), CASES)
def test_tree_ensemble_regressor(trees: int, depth: int, modes: list[str], missing: bool, targets: int,
                                 aggregate: str, post: str) -> None:
    rng = np.random.default_rng(trees * 31 + depth)
    x, values = _data(rng, 40, 5, missing)
    attrs = _forest(rng, trees, 5, targets, depth, modes, missing, "target", values)
    base = {"base_values": rng.standard_normal(targets).tolist()} if trees % 2 else {}
    model = _model("TreeEnsembleRegressor", 5, ["y"], n_targets=targets, aggregate_function=aggregate,
                   post_transform=post, **base, **attrs)
    _agree(model, x, compiled=trees == 7)


@pytest.mark.parametrize(("trees", "depth", "modes", "missing", "classes", "post", "base"), [
    (6, 4, ["BRANCH_LEQ"], False, 3, "NONE", True),
    (8, 5, MODES, True, 4, "SOFTMAX", True),
    (5, 3, ["BRANCH_LT"], False, 5, "LOGISTIC", False),
    (3, 2, ["BRANCH_LEQ"], False, 3, "NONE", False),
])
def test_tree_ensemble_classifier(trees: int, depth: int, modes: list[str], missing: bool, classes: int,
                                  post: str, base: bool) -> None:
    """Without base values a class no reached leaf weighs has score 0 and no part in the label."""
    rng = np.random.default_rng(trees * 17 + classes)
    x, values = _data(rng, 40, 4, missing)
    attrs = _forest(rng, trees, 4, classes, depth, modes, missing, "class", values)
    extra = {"base_values": rng.standard_normal(classes).tolist()} if base else {}
    model = _model("TreeEnsembleClassifier", 4, ["label", "scores"], post_transform=post,
                   classlabels_int64s=[10 * k + 3 for k in range(classes)], **extra, **attrs)
    labels, _ = _agree(model, x, compiled=classes == 4)
    assert set(labels.tolist()) <= {10 * k + 3 for k in range(classes)}


@pytest.mark.parametrize(("dtype", "offset"), [(np.int64, 1 << 40), (np.int32, 0)])
def test_tree_ensemble_in_double_and_integer_inputs(dtype: type, offset: int) -> None:
    """Integer rows (ONNX Runtime has no kernel for them) read as the same values in double do, beyond f32's
    exact integers too."""
    rng = np.random.default_rng(3)
    x, _ = _data(rng, 20, 3, False)
    ids = np.round(x * 1e4).astype(np.int64) + offset
    attrs = _forest(rng, 4, 3, 1, 3, ["BRANCH_LEQ", "BRANCH_EQ"], False, "target", np.unique(ids).astype(np.float64))
    (want,) = _agree(_model("TreeEnsembleRegressor", 3, ["y"], dtype=TensorProto.DOUBLE, n_targets=1, **attrs),
                     ids.astype(np.float64))
    onnx_type = TensorProto.INT64 if dtype is np.int64 else TensorProto.INT32
    model = _model("TreeEnsembleRegressor", 3, ["y"], dtype=onnx_type, n_targets=1, **attrs)
    (got,) = run_reference(import_onnx(model), [ids.astype(dtype)])
    np.testing.assert_array_equal(got, want)


def _stump(**extra: Any) -> dict[str, Any]:
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.0, 0.0, 0.0],
                 nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                 target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    attrs.update(extra)
    return attrs


@pytest.mark.parametrize(("extra", "error", "match"), [
    ({"nodes_truenodeids": [5, 0, 0]}, ShapeError, "lacks"),
    ({"nodes_truenodeids": [0, 0, 0]}, ShapeError, "cyclic"),
    ({"nodes_values": [0.0, 0.0]}, ShapeError, "entries"),
    ({"nodes_nodeids": [0, 1, 1]}, ShapeError, "twice"),
    ({"target_ids": [0, 3]}, ShapeError, "lacks"),
    ({"nodes_modes": ["BRANCH_XX", "LEAF", "LEAF"]}, UnsupportedOpError, "BRANCH_XX"),
    ({"nodes_featureids": [3, 0, 0]}, ShapeError, "feature 3"),
    ({"nodes_featureids": [-1, 0, 0]}, ShapeError, "feature -1"),
    ({"aggregate_function": "MAX"}, UnsupportedOpError, "aggregate_function"),
    ({"post_transform": "PROBIT"}, UnsupportedOpError, "PROBIT"),
])
def test_malformed_or_unsupported_forests_are_refused(extra: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        import_onnx(_model("TreeEnsembleRegressor", 1, ["y"], **_stump(**extra)))


def test_ambiguous_forms_are_refused_by_reason() -> None:
    """Where ONNX Runtime's reading departs from the specification's: two classes, a single target's transform."""
    attrs = {k.replace("target_", "class_"): v for k, v in _stump().items()}
    with pytest.raises(UnsupportedOpError, match="2 classes"):
        import_onnx(_model("TreeEnsembleClassifier", 1, ["label", "scores"], classlabels_int64s=[0, 1], **attrs))
    with pytest.raises(UnsupportedOpError, match="single target"):
        import_onnx(_model("TreeEnsembleRegressor", 1, ["y"], post_transform="LOGISTIC", **_stump()))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("classes", [1, 3])
def test_linear_classifier(post: str, classes: int) -> None:
    """One coefficient row for two labels is ONNX Runtime's binary form: scores [1 - s, s]."""
    rng = np.random.default_rng(classes)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    model = _model("LinearClassifier", 4, ["label", "scores"], coefficients=rng.standard_normal(4 * classes).tolist(),
                   intercepts=rng.standard_normal(classes).tolist(), post_transform=post,
                   classlabels_ints=[5, 9] if classes == 1 else [1, 2, 3])
    if classes == 1 and post == "SOFTMAX":  # ONNX Runtime leaves it untransformed: refused, not guessed
        with pytest.raises(UnsupportedOpError, match="SOFTMAX"):
            import_onnx(model)
        return
    _agree(model, x)


def test_a_linear_regressor_of_no_targets_is_refused() -> None:
    with pytest.raises(ShapeError, match="0 targets"):
        import_onnx(_model("LinearRegressor", 2, ["y"], coefficients=[1.0, 2.0], targets=0))


def test_linear_regressor_scaler_normalizer() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    _agree(_model("LinearRegressor", 4, ["y"], coefficients=rng.standard_normal(8).tolist(), intercepts=[0.5, -1.0],
                  targets=2), x)
    _agree(_model("Scaler", 4, ["y"], offset=rng.standard_normal(4).tolist(), scale=rng.random(4).tolist()), x)
    _agree(_model("Scaler", 4, ["y"], offset=[0.5], scale=[2.0]), x)
    x[2] = 0.0  # a row of zeros stays zeros
    x[3] = -np.abs(x[3])  # a row whose largest value is negative
    for norm in ("MAX", "L1", "L2"):
        _agree(_model("Normalizer", 4, ["y"], norm=norm), x)


def test_a_class_no_reached_leaf_weighs_takes_no_part_in_the_label() -> None:
    """Classes 1 and 2 score below 0 and class 0 has no weight anywhere: the label is class 1's or 2's, and
    class 0's score reads 0 (without base values)."""
    stump = _stump(target_treeids=[0, 0, 0, 0], target_nodeids=[1, 1, 2, 2], target_ids=[1, 2, 1, 2],
                   target_weights=[-1.0, -2.0, -3.0, -0.5])
    attrs = {k.replace("target_", "class_"): v for k, v in stump.items()}
    model = _model("TreeEnsembleClassifier", 1, ["label", "scores"], classlabels_int64s=[7, 8, 9], **attrs)
    labels, scores = _agree(model, np.array([[-1.0], [1.0]], np.float32))
    assert labels.tolist() == [8, 9] and scores[:, 0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("replaced", "imputed"), [(float("nan"), [1.5]), (float("nan"), [1.0, 2.0, 3.0]),
                                                   (-1.0, [9.0])], ids=["nan", "nan-per-feature", "value"])
def test_imputer_floats(replaced: float, imputed: list[float]) -> None:
    x = np.array([[np.nan, 1.0, -1.0], [2.0, np.nan, np.nan], [-1.0, -1.0, 4.0]], np.float32)
    _agree_feeds(_graph_model("Imputer", [("x", TensorProto.FLOAT, [3, 3])], ["y"], replaced_value_float=replaced,
                              imputed_value_floats=imputed), {"x": x})


def test_imputer_ints() -> None:
    x = np.array([[0, 5, 0], [7, 0, 1]], np.int64)
    _agree_feeds(_graph_model("Imputer", [("x", TensorProto.INT64, [2, 3])], ["y"], replaced_value_int64=0,
                              imputed_value_int64s=[4, 5, 6]), {"x": x})


@pytest.mark.parametrize(("keys", "values", "x"), [
    ({"keys_int64s": [3, 1, 7]}, {"values_int64s": [10, 20, 30], "default_int64": -5}, np.array([[1, 2, 7, 3]])),
    ({"keys_int64s": [3, 1, 7]}, {"values_floats": [0.5, 1.5, 2.5], "default_float": 9.0}, np.array([1, 4, 7, 7])),
    ({"keys_floats": [0.5, -1.0]}, {"values_int64s": [1, 2]}, np.array([[0.5, 0.25], [-1.0, 0.5]], np.float32)),
], ids=["int-int", "int-float", "float-int"])
def test_label_encoder(keys: dict[str, Any], values: dict[str, Any], x: np.ndarray) -> None:
    kind = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.INT64
    model = _graph_model("LabelEncoder", [("x", kind, list(x.shape))], ["y"], **keys, **values)
    model.opset_import[1].version = 2
    _agree_feeds(model, {"x": x.astype(np.float32 if kind == TensorProto.FLOAT else np.int64)})


def test_one_hot_encoder_and_feature_vectorizer() -> None:
    x = np.array([[2, 5], [9, 2]], np.int64)
    _agree_feeds(_graph_model("OneHotEncoder", [("x", TensorProto.INT64, [2, 2])], ["y"], cats_int64s=[2, 5, 7]),
                 {"x": x})
    xf = np.array([[2.7, 5.0], [-1.5, 7.2]], np.float32)  # truncated to integers first
    _agree_feeds(_graph_model("OneHotEncoder", [("x", TensorProto.FLOAT, [2, 2])], ["y"], cats_int64s=[-1, 2, 7]),
                 {"x": xf})
    a, c = np.arange(6, dtype=np.int64).reshape(2, 3), np.array([[7], [8]], np.int64)
    _agree_feeds(_graph_model("FeatureVectorizer", [("a", TensorProto.INT64, [2, 3]), ("c", TensorProto.INT64, [2, 1])],
                              ["y"], inputdimensions=[2, 3]), {"a": a, "c": c})


@pytest.mark.parametrize(("kernel", "params"), [("LINEAR", [0.0, 0.0, 0.0]), ("POLY", [0.3, 1.0, 3.0]),
                                                ("RBF", [0.2, 0.0, 0.0]), ("SIGMOID", [0.1, -0.5, 0.0])])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(kernel: str, params: list[float], one_class: int) -> None:
    rng = np.random.default_rng(len(kernel) + one_class)
    supports, features = 5, 3
    x = rng.standard_normal((8, features)).astype(np.float32)
    model = _model("SVMRegressor", features, ["y"], kernel_type=kernel, kernel_params=params, n_supports=supports,
                   support_vectors=rng.standard_normal(supports * features).tolist(),
                   coefficients=rng.standard_normal(supports).tolist(), rho=[0.25], one_class=one_class)
    _agree(model, x, tol=1e-4)


def test_linear_svm_regressor() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    _agree(_model("SVMRegressor", 4, ["y"], coefficients=rng.standard_normal(4).tolist(), rho=[-0.5],
                  kernel_type="LINEAR", kernel_params=[0.0, 0.0, 0.0], n_supports=0), x)


def _as_v5(attrs: dict[str, Any], targets: int) -> dict[str, Any]:
    """A random v3 regressor's attributes in ONNX-ML 5's TreeEnsemble form: interior nodes and leaves apart, a
    leaf keeping the first of its weights (a v5 leaf weighs one target)."""
    key = list(zip(attrs["nodes_treeids"], attrs["nodes_nodeids"], strict=True))
    is_leaf = [m == "LEAF" for m in attrs["nodes_modes"]]
    inner = [g for g in range(len(key)) if not is_leaf[g]]
    position = {key[g]: i for i, g in enumerate(inner)}
    first_weight: dict[tuple[int, int], tuple[int, float]] = {}
    for t, n, k, w in zip(attrs["target_treeids"], attrs["target_nodeids"], attrs["target_ids"],
                          attrs["target_weights"], strict=True):
        first_weight.setdefault((t, n), (k, w))
    leaf_of = {key[g]: j for j, g in enumerate(g for g in range(len(key)) if is_leaf[g])}
    children: set[tuple[int, int]] = set()
    v5: dict[str, list[Any]] = {k: [] for k in ("nodes_featureids", "nodes_modes", "nodes_splits",
                                                "nodes_truenodeids", "nodes_falsenodeids", "nodes_trueleafs",
                                                "nodes_falseleafs", "nodes_missing_value_tracks_true")}
    for g in inner:
        t = key[g][0]
        v5["nodes_featureids"].append(attrs["nodes_featureids"][g])
        v5["nodes_modes"].append(MODES.index(attrs["nodes_modes"][g]))
        v5["nodes_splits"].append(attrs["nodes_values"][g])
        v5["nodes_missing_value_tracks_true"].append(attrs["nodes_missing_value_tracks_true"][g])
        for side in ("true", "false"):
            child = (t, attrs[f"nodes_{side}nodeids"][g])
            children.add(child)
            v5[f"nodes_{side}leafs"].append(int(child in leaf_of))
            v5[f"nodes_{side}nodeids"].append(leaf_of[child] if child in leaf_of else position[child])
    leaves = [first_weight[k] for k in leaf_of]
    return {**{k: v for k, v in v5.items() if k not in ("nodes_modes", "nodes_splits")},
            "nodes_modes": numpy_helper.from_array(np.asarray(v5["nodes_modes"], np.uint8)),
            "nodes_splits": numpy_helper.from_array(np.asarray(v5["nodes_splits"], np.float32)),
            "leaf_targetids": [k for k, _ in leaves],
            "leaf_weights": numpy_helper.from_array(np.asarray([w for _, w in leaves], np.float32)),
            "tree_roots": [position[k] for k in position if k not in children], "n_targets": targets}


@pytest.mark.parametrize(("trees", "depth", "modes", "missing", "targets", "aggregate"), [
    (6, 4, ["BRANCH_LEQ"], False, 1, 1),
    (8, 5, MODES, True, 3, 0),
    (5, 3, ["BRANCH_LT", "BRANCH_GTE"], True, 2, 1),
])
def test_tree_ensemble_v5(trees: int, depth: int, modes: list[str], missing: bool, targets: int,
                          aggregate: int) -> None:
    """ONNX-ML 5's TreeEnsemble (aggregate 0 AVERAGE, 1 SUM); a transform is refused, the specification and
    ONNX Runtime numbering SOFTMAX and LOGISTIC the other way round."""
    rng = np.random.default_rng(trees * 13 + depth)
    x, values = _data(rng, 40, 4, missing)
    attrs = _forest(rng, trees, 4, targets, depth, modes, missing, "target", values)
    model = _model("TreeEnsemble", 4, ["y"], aggregate_function=aggregate, **_as_v5(attrs, targets))
    model.opset_import[1].version = 5
    _agree(model, x, compiled=trees == 8)
    for post in (1, 2):
        refused = _model("TreeEnsemble", 4, ["y"], post_transform=post, **_as_v5(attrs, targets))
        refused.opset_import[1].version = 5
        with pytest.raises(UnsupportedOpError, match="post_transform"):
            import_onnx(refused)


def _v5_stump(**extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = dict(
        nodes_featureids=[0], nodes_modes=numpy_helper.from_array(np.array([0], np.uint8)),
        nodes_splits=numpy_helper.from_array(np.array([0.0], np.float32)), nodes_truenodeids=[0],
        nodes_falsenodeids=[1], nodes_trueleafs=[1], nodes_falseleafs=[1], leaf_targetids=[0, 0],
        leaf_weights=numpy_helper.from_array(np.array([1.0, 2.0], np.float32)), tree_roots=[0], n_targets=1)
    attrs.update(extra)
    return attrs


@pytest.mark.parametrize(("extra", "error", "match"), [
    ({"tree_roots": [3]}, ShapeError, "tree_roots"),
    ({"nodes_falsenodeids": [5]}, ShapeError, "outside"),
    ({"nodes_falseleafs": [0], "nodes_falsenodeids": [0]}, ShapeError, "itself"),
    ({"leaf_targetids": [0, 1]}, ShapeError, "leaf_targetids"),
    ({"nodes_modes": numpy_helper.from_array(np.array([6], np.uint8))}, UnsupportedOpError, "BRANCH_MEMBER"),
    ({"aggregate_function": 3}, UnsupportedOpError, "aggregate_function"),
])
def test_malformed_or_unsupported_v5_forests_are_refused(extra: dict[str, Any], error: type, match: str) -> None:
    model = _model("TreeEnsemble", 1, ["y"], **_v5_stump(**extra))
    model.opset_import[1].version = 5
    with pytest.raises(error, match=match):
        import_onnx(model)


def test_double_inputs_give_the_float_outputs_the_specification_types() -> None:
    """Scaler, Normalizer and LinearClassifier type their outputs float whatever the input's type."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 3))
    for model in (_model("Scaler", 3, ["y"], dtype=TensorProto.DOUBLE, offset=[0.5], scale=[2.0]),
                  _model("Normalizer", 3, ["y"], dtype=TensorProto.DOUBLE, norm="L2"),
                  _model("LinearClassifier", 3, ["label", "scores"], dtype=TensorProto.DOUBLE,
                         coefficients=rng.standard_normal(9).tolist(), intercepts=[0.1, 0.2, 0.3],
                         classlabels_ints=[1, 2, 3])):
        _agree(model, x)
