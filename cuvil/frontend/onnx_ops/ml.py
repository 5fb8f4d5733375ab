"""ONNX-ML (``ai.onnx.ml``) ops: the classical models that scikit-learn, XGBoost and LightGBM exporters write
(linear models, support vector regression, tree ensembles) and the feature preparation of their pipelines
(imputation, scaling, normalization, numeric encodings), spelled out in Cuvil's tensor ops.

A tree ensemble runs every tree at once, one level per step: each row's current node in each tree is an index
into the forest's flattened node tables (feature, threshold, mode, children), a leaf's children are itself,
so after as many steps as the deepest tree every row sits on a leaf; the leaves' weights are then gathered
and summed over the trees. Labels are the ints of ``classlabels_ints`` / ``classlabels_int64s`` (string labels
are refused: Cuvil's tensors hold numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil.errors import ShapeError
from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import cast_to, reshape_to, scalar
from cuvil.frontend.onnx_ops.nn import dims_product
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

ML = "ai.onnx.ml"

MAX_TREE_DEPTH = 512
"""The deepest tree a tree ensemble may hold (its evaluation takes one step per level)."""

_POST_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX")


def _features(ctx: NodeCtx, x: Value, dtype: DType = DType.f32) -> Value:
    """The input as rows of features, [N, F] in ``dtype`` (a vector is one row): f32 for the ops whose outputs
    the specification types float whatever the input's type."""
    b = ctx.b
    if x.type.rank == 1:
        x = b.reshape(x, shape=[1, x.shape[0]])
    elif x.type.rank != 2:
        raise ShapeError(f"{ctx.op_name} takes [rows, features], got {x.type}", location=ctx.location,
                         hint="reshape the input to two dimensions")
    return cast_to(b, x, dtype)


def _post_transform(ctx: NodeCtx, scores: Value) -> Value:
    how = ctx.attr_str("post_transform", "NONE")
    if how not in _POST_TRANSFORMS:
        raise ctx.unsupported(f"post_transform {how} (supported: {', '.join(_POST_TRANSFORMS)})")
    if how == "LOGISTIC":
        return ctx.b.sigmoid(scores)
    if how == "SOFTMAX":
        return ctx.b.softmax(scores, axis=1)
    return scores


def _int_labels(ctx: NodeCtx, count: int) -> np.ndarray:
    """The class labels (``classlabels_ints`` / ``_int64s``), one per score column."""
    if ctx.has_attr("classlabels_strings"):
        raise ctx.unsupported("string class labels (classlabels_strings); export integer labels")
    name = "classlabels_int64s" if ctx.has_attr("classlabels_int64s") else "classlabels_ints"
    labels = np.asarray(ctx.attr_ints(name), dtype=np.int64)
    if labels.size != count:
        raise ShapeError(f"{labels.size} class labels for {count} score columns", location=ctx.location,
                         hint="give one label per class")
    return labels


def _labelled(ctx: NodeCtx, scores: Value, labels: np.ndarray) -> Value:
    """Each row's label: that of its first highest raw score (before ``post_transform``, which a saturating
    sigmoid could tie)."""
    b = ctx.b
    best = b.argmax(scores, axis=1, keepdims=False)
    return b.gather(b.const(labels), best, axis=0)


def _floats(ctx: NodeCtx, name: str) -> np.ndarray | None:
    """A float list attribute, or its ``_as_tensor`` form (absent: None)."""
    if ctx.has_attr(name + "_as_tensor"):
        return np.asarray(ctx.attr(name + "_as_tensor"), dtype=np.float64).reshape(-1)
    return np.asarray(ctx.attr_floats(name), dtype=np.float64) if ctx.has_attr(name) else None


# --------------------------------------------------------------------------------------
# linear models, scalers, normalizers


@onnx_op("LinearRegressor", domain=ML, emits=("cast", "reshape", "matmul", "add", "sigmoid", "softmax"))
def linear_regressor(ctx: NodeCtx) -> Value:
    """``X @ coefficients^T + intercepts`` per target, then ``post_transform``."""
    x = _features(ctx, ctx.input(0))
    targets = ctx.attr_int("targets", 1)
    coef = np.asarray(ctx.attr_floats("coefficients"), dtype=np.float32)
    if targets < 1 or coef.size % targets:
        raise ShapeError(f"{coef.size} coefficients for {targets} targets", location=ctx.location,
                         hint="give features x targets coefficients")
    return _post_transform(ctx, _linear_scores(ctx, x, coef, targets))


def _linear_scores(ctx: NodeCtx, x: Value, coef: np.ndarray, outputs: int) -> Value:
    """``x @ coefficients^T + intercepts``, the coefficients one row of features per output."""
    b = ctx.b
    scores = b.matmul(x, b.const(coef.reshape(outputs, -1).T.astype(x.dtype.np)))
    if ctx.has_attr("intercepts"):
        scores = b.add(scores, b.const(np.asarray(ctx.attr_floats("intercepts"), dtype=x.dtype.np)))
    return scores


@onnx_op("LinearClassifier", domain=ML, emits=("cast", "reshape", "matmul", "add", "sub", "sigmoid", "softmax",
                                               "concat", "argmax", "gather", "greater", "where"))
def linear_classifier(ctx: NodeCtx) -> list[Value]:
    """Scores ``X @ coefficients^T + intercepts`` (then ``post_transform``) and each row's label. One row of
    coefficients for two labels is a binary model: its score s gives the scores ``[1 - s, s]`` (the transform
    applied to s first) and the second label where s > 0 (0.5 after LOGISTIC), as ONNX Runtime reads it."""
    b = ctx.b
    x = _features(ctx, ctx.input(0))
    coef = np.asarray(ctx.attr_floats("coefficients"), dtype=np.float32)
    features = x.shape[1]
    if not isinstance(features, int) or features == 0 or coef.size % features:
        raise ShapeError(f"{coef.size} coefficients for {features} features", location=ctx.location,
                         hint="give classes x features coefficients")
    classes = coef.size // features
    scores = _linear_scores(ctx, x, coef, classes)
    if classes > 1:
        return [_labelled(ctx, scores, _int_labels(ctx, classes)), _post_transform(ctx, scores)]
    labels = _int_labels(ctx, 2)
    how = ctx.attr_str("post_transform", "NONE")
    if how not in ("NONE", "LOGISTIC"):
        raise ctx.unsupported(f"post_transform {how} for a binary model of one coefficient row")
    s = b.sigmoid(scores) if how == "LOGISTIC" else scores
    positive = b.greater(s, scalar(b, 0.5 if how == "LOGISTIC" else 0.0, s.dtype))
    label = b.where(reshape_to(b, positive, [positive.shape[0]]), b.const(labels[1]), b.const(labels[0]))
    return [label, b.concat(b.sub(scalar(b, 1.0, s.dtype), s), s, axis=1)]


@onnx_op("Scaler", domain=ML, emits=("cast", "reshape", "sub", "mul"))
def scaler(ctx: NodeCtx) -> Value:
    """``(X - offset) * scale``, each one value or one per feature."""
    b = ctx.b
    x = _features(ctx, ctx.input(0))
    offset = np.asarray(ctx.attr_floats("offset", [0.0]), dtype=x.dtype.np)
    scale = np.asarray(ctx.attr_floats("scale", [1.0]), dtype=x.dtype.np)
    return b.mul(b.sub(x, b.const(offset)), b.const(scale))


@onnx_op("Normalizer", domain=ML, emits=("cast", "reshape", "abs", "mul", "reduce_max", "reduce_sum", "sqrt", "div",
                                         "equal", "where"))
def normalizer(ctx: NodeCtx) -> Value:
    """Each row divided by its largest value (MAX: signed, as the specification writes ``X / max(X)``), the sum
    of its magnitudes (L1) or its length (L2); a row whose divisor is 0 stays as it is."""
    b = ctx.b
    x = _features(ctx, ctx.input(0))
    norm = ctx.attr_str("norm", "MAX")
    if norm == "MAX":
        size = b.reduce_max(x, axes=[1], keepdims=True)
    elif norm == "L1":
        size = b.reduce_sum(b.abs(x), axes=[1], keepdims=True)
    elif norm == "L2":
        size = b.sqrt(b.reduce_sum(b.mul(x, x), axes=[1], keepdims=True))
    else:
        raise ctx.unsupported(f"norm {norm!r} (MAX, L1 or L2)")
    return b.where(b.equal(size, scalar(b, 0.0, x.dtype)), x, b.div(x, size))


@onnx_op("Binarizer", domain=ML, emits=("greater", "where", "cast"))
def binarizer(ctx: NodeCtx) -> Value:
    """x > threshold ? 1 : 0; integer x is compared in f64 so a fractional threshold is not rounded."""
    x = ctx.input(0)
    work = x if x.dtype.is_float else ctx.b.cast(x, to=DType.f64)
    above = ctx.b.greater(work, ctx.b.scalar(ctx.attr_float("threshold", 0.0), work.dtype))
    return ctx.b.where(above, ctx.b.scalar(1, x.dtype), ctx.b.scalar(0, x.dtype))


@onnx_op("ArrayFeatureExtractor", domain=ML, emits=("gather", "reshape"))
def array_feature_extractor(ctx: NodeCtx) -> Value:
    """x[..., indices] along the last axis, indices flattened; a vector input gives one row."""
    b = ctx.b
    x, idx = ctx.input(0), ctx.input(1)
    count = dims_product(idx.shape)
    flat = reshape_to(b, idx, [count])
    out = b.gather(x, flat, axis=x.type.rank - 1)
    return reshape_to(b, out, [1, count]) if x.type.rank == 1 else out


# --------------------------------------------------------------------------------------
# tree ensembles

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")
_COMPARE = {"BRANCH_LEQ": "less_equal", "BRANCH_LT": "less", "BRANCH_GTE": "greater_equal",
            "BRANCH_GT": "greater", "BRANCH_EQ": "equal", "BRANCH_NEQ": "not_equal"}
_TREE_EMITS = ("cast", "reshape", "expand", "gather", "gather_elements", "less_equal", "less", "greater_equal",
               "greater", "equal", "not_equal", "isnan", "logical_and", "logical_or", "where", "reduce_sum", "div",
               "add", "sigmoid", "softmax", "argmax")


@dataclass(frozen=True)
class Forest:
    """A tree ensemble's nodes, flattened: node ``g`` of the forest tests ``feature[g]`` against
    ``threshold[g]`` by ``mode[g]`` (an index into the modes) and moves to ``true_next[g]`` or ``false_next[g]``
    (a leaf to itself); ``roots[t]`` is tree ``t``'s first node, ``depth`` its deepest level."""

    feature: np.ndarray
    threshold: np.ndarray
    mode: np.ndarray
    true_next: np.ndarray
    false_next: np.ndarray
    tracks_true: np.ndarray
    roots: np.ndarray
    depth: int
    index: dict[tuple[int, int], int]


def read_forest(ctx: NodeCtx) -> Forest:
    """The node tables from the ``nodes_*`` attributes, checked: one entry per node in each, unique
    (tree, node) ids, children inside their tree, one root per tree, no cycle."""
    trees = ctx.attr_ints("nodes_treeids")
    ids = ctx.attr_ints("nodes_nodeids")
    modes = ctx.attr("nodes_modes")
    values = _floats(ctx, "nodes_values")
    columns = {"nodes_nodeids": ids, "nodes_featureids": ctx.attr_ints("nodes_featureids"), "nodes_modes": modes,
               "nodes_values": values if values is not None else [],
               "nodes_truenodeids": ctx.attr_ints("nodes_truenodeids"),
               "nodes_falsenodeids": ctx.attr_ints("nodes_falsenodeids")}
    tracks = ctx.attr_ints("nodes_missing_value_tracks_true", [0] * len(trees))
    columns["nodes_missing_value_tracks_true"] = tracks
    for name, column in columns.items():
        if len(column) != len(trees):
            raise ShapeError(f"{name} has {len(column)} entries for {len(trees)} nodes", location=ctx.location,
                             hint="every nodes_* attribute has one entry per node")
    unknown = sorted(set(modes) - {*_MODES, "LEAF"})
    if unknown:
        raise ctx.unsupported(f"node modes {unknown}")
    index: dict[tuple[int, int], int] = {}
    for g, key in enumerate(zip(trees, ids, strict=True)):
        if key in index:
            raise ShapeError(f"tree {key[0]} has node {key[1]} twice", location=ctx.location,
                             hint="node ids are unique within a tree")
        index[key] = g
    n = len(trees)
    true_next, false_next = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    children: set[int] = set()
    for g, (t, mode) in enumerate(zip(trees, modes, strict=True)):
        if mode == "LEAF":
            continue
        for table, child in ((true_next, columns["nodes_truenodeids"][g]),
                             (false_next, columns["nodes_falsenodeids"][g])):
            if (t, child) not in index:
                raise ShapeError(f"node {ids[g]} of tree {t} branches to node {child}, which the tree lacks",
                                 location=ctx.location, hint="check nodes_truenodeids and nodes_falsenodeids")
            table[g] = index[(t, child)]
            if table[g] == g:
                raise ShapeError(f"node {ids[g]} of tree {t} branches to itself: the tree is cyclic",
                                 location=ctx.location, hint="each node's children must be new nodes")
            children.add(table[g])
    order = list(dict.fromkeys(trees))
    roots = []
    for t in order:
        heads = [g for g in range(n) if trees[g] == t and g not in children]
        if len(heads) != 1:
            raise ShapeError(f"tree {t} has {len(heads)} roots", location=ctx.location,
                             hint="each tree's nodes form one tree")
        roots.append(heads[0])
    depth = _depth(ctx, roots, true_next, false_next)
    mode_index = np.asarray([_MODES.index(m) if m != "LEAF" else 0 for m in modes], dtype=np.int64)
    return Forest(np.asarray(columns["nodes_featureids"], dtype=np.int64),
                  np.asarray(values if values is not None else [], dtype=np.float64), mode_index, true_next,
                  false_next, np.asarray(tracks, dtype=bool) & (np.asarray(modes) != "LEAF"),
                  np.asarray(roots, dtype=np.int64), depth, index)


def _depth(ctx: NodeCtx, roots: list[int], true_next: np.ndarray, false_next: np.ndarray) -> int:
    """The most branches from a root to a leaf (a cycle or a tree deeper than MAX_TREE_DEPTH is refused)."""
    deepest = 0
    for root in roots:
        level, frontier = 0, {root}
        while True:  # (a shared subtree is visited once per level; a cycle never ends, and exceeds the bound)
            nxt = {int(c) for g in frontier for c in (true_next[g], false_next[g]) if c != g}
            if not nxt:
                break
            level += 1
            if level > MAX_TREE_DEPTH:
                raise ShapeError(f"a tree is cyclic or deeper than {MAX_TREE_DEPTH} levels", location=ctx.location,
                                 hint="each node's children must be new nodes")
            frontier = nxt
        deepest = max(deepest, level)
    return deepest


def leaf_weights(ctx: NodeCtx, forest: Forest, prefix: str, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    """[nodes, outputs]: the weights the ``{prefix}_*`` attributes give each leaf for each target or class
    (float64, summed where a leaf lists one twice), and whether they list one at all (1.0 or 0.0)."""
    trees = ctx.attr_ints(f"{prefix}_treeids")
    nodes = ctx.attr_ints(f"{prefix}_nodeids")
    ids = ctx.attr_ints(f"{prefix}_ids")
    weights = _floats(ctx, f"{prefix}_weights")
    if weights is None or not len(trees) == len(nodes) == len(ids) == len(weights):
        raise ShapeError(f"the {prefix}_* attributes disagree in length", location=ctx.location,
                         hint=f"give one {prefix}_treeids, _nodeids, _ids and _weights entry per weight")
    table = np.zeros((len(forest.feature), outputs), dtype=np.float64)
    listed = np.zeros_like(table)
    for t, node, k, w in zip(trees, nodes, ids, weights, strict=True):
        if (t, node) not in forest.index or not 0 <= k < outputs:
            raise ShapeError(f"a weight for node {node} of tree {t}, output {k}, which the model lacks",
                             location=ctx.location, hint=f"check the {prefix}_* attributes")
        table[forest.index[(t, node)], k] += w
        listed[forest.index[(t, node)], k] = 1.0
    return table, listed


def run_forest(ctx: NodeCtx, x: Value, forest: Forest, tables: list[np.ndarray]) -> list[Value]:
    """Each per-leaf table [nodes, outputs] summed over the leaves each row of ``x`` [N, F] reaches, one in
    every tree: [N, outputs] per table."""
    b = ctx.b
    branches = forest.feature[forest.true_next != np.arange(len(forest.feature))]
    features = x.shape[1]
    if branches.size and (branches.min() < 0 or (isinstance(features, int) and branches.max() >= features)):
        raise ShapeError(f"a node tests feature {int(branches.min() if branches.min() < 0 else branches.max())} "
                         f"of rows of {features} features", location=ctx.location,
                         hint="nodes_featureids index the input's last axis")
    dt = x.dtype
    rows, trees = x.shape[0], len(forest.roots)
    table = {name: b.const(arr) for name, arr in (("feature", forest.feature), ("true", forest.true_next),
                                                   ("false", forest.false_next))}
    threshold = b.const(forest.threshold.astype(dt.np))
    used = sorted(set(forest.mode[forest.true_next != np.arange(len(forest.feature))].tolist()))
    mode = b.const(forest.mode) if len(used) > 1 else None
    tracks = b.const(forest.tracks_true) if forest.tracks_true.any() else None
    node = b.expand(b.const(forest.roots.reshape(1, trees)), shape=[rows, trees])
    for _ in range(forest.depth):
        value = b.gather_elements(x, b.gather(table["feature"], node, axis=0), axis=1)
        bound = b.gather(threshold, node, axis=0)
        goes_true = _compare(b, used, mode, node, value, bound)
        if tracks is not None:
            goes_true = b.logical_or(goes_true, b.logical_and(b.isnan(value), b.gather(tracks, node, axis=0)))
        node = b.where(goes_true, b.gather(table["true"], node, axis=0), b.gather(table["false"], node, axis=0))
    return [b.reduce_sum(b.gather(b.const(t.astype(dt.np)), node, axis=0), axes=[1], keepdims=False)
            for t in tables]  # gathered: [N, T, outputs]


def _compare(b: Builder, used: list[int], mode: Value | None, node: Value, value: Value, bound: Value) -> Value:
    """Whether each row goes to the true child: the node's comparison (one op where every branch shares it)."""
    results = [b.op(_COMPARE[_MODES[k]], value, bound) for k in used or [0]]
    if mode is None:
        return results[0]
    mine = b.gather(mode, node, axis=0)
    out = results[-1]
    for k, r in zip(used[:-1], results[:-1], strict=True):
        out = b.where(b.equal(mine, b.const(np.array(k, dtype=np.int64))), r, out)
    return out


def _tree_features(ctx: NodeCtx) -> Value:
    """A tree ensemble's input rows: floats as they are, integers in f64 (exact up to 2^53, where f32 would
    round an id above 2^24 onto its neighbour's threshold)."""
    x = ctx.input(0)
    return _features(ctx, x, x.dtype if x.dtype in (DType.f32, DType.f64) else DType.f64)


def _base_values(ctx: NodeCtx, outputs: int) -> np.ndarray | None:
    base = _floats(ctx, "base_values")
    if base is None or not base.size:
        return None
    if base.size != outputs:
        raise ShapeError(f"{base.size} base values for {outputs} outputs", location=ctx.location,
                         hint="give one base value per target or class")
    return base


def _summed(ctx: NodeCtx, scores: Value, trees: int, how: str) -> Value:
    """The summed leaf weights as the aggregate function ``how`` says: kept (SUM) or divided by the trees
    (AVERAGE)."""
    if how not in ("SUM", "AVERAGE"):
        raise ctx.unsupported(f"aggregate_function {how} (supported: SUM, AVERAGE)")
    return ctx.b.div(scores, scalar(ctx.b, float(trees), scores.dtype)) if how == "AVERAGE" else scores


@onnx_op("TreeEnsembleRegressor", domain=ML, emits=_TREE_EMITS)
def tree_ensemble_regressor(ctx: NodeCtx) -> Value:
    """Per target, the leaf weights each row reaches summed (or averaged) over the trees, plus the base value,
    then ``post_transform`` (of several targets: a single target's LOGISTIC or SOFTMAX is refused, which the
    specification applies and ONNX Runtime ignores)."""
    b = ctx.b
    x = _tree_features(ctx)
    forest = read_forest(ctx)
    targets = ctx.attr_int("n_targets", 1)
    if targets == 1 and ctx.attr_str("post_transform", "NONE") != "NONE":
        raise ctx.unsupported(f"post_transform {ctx.attr_str('post_transform')} of a single target (the "
                              "specification applies it, ONNX Runtime does not)")
    weights, _ = leaf_weights(ctx, forest, "target", targets)
    (scores,) = run_forest(ctx, x, forest, [weights])
    scores = _summed(ctx, scores, len(forest.roots), ctx.attr_str("aggregate_function", "SUM"))
    base = _base_values(ctx, targets)
    if base is not None:
        scores = b.add(scores, b.const(base.astype(scores.dtype.np)))
    out = _post_transform(ctx, scores)
    return cast_to(b, out, DType.f32)  # the op's Y is float


@onnx_op("TreeEnsembleClassifier", domain=ML, emits=_TREE_EMITS)
def tree_ensemble_classifier(ctx: NodeCtx) -> list[Value]:
    """Per class, the summed leaf weights plus the base value; the label of each row's first highest score among
    the classes that have one (a weight in a leaf the row reached, or a base value); scores of the others 0;
    then ``post_transform``. Two classes are refused: ONNX Runtime reads a two-class ensemble by rules of its
    own (one score made two, labels by its sign or by 0.5, base values used in part) that the specification
    does not state."""
    b = ctx.b
    x = _tree_features(ctx)
    forest = read_forest(ctx)
    name = "classlabels_int64s" if ctx.has_attr("classlabels_int64s") else "classlabels_ints"
    classes = len(ctx.attr_ints(name, [])) or len(ctx.attr("classlabels_strings", []))
    labels = _int_labels(ctx, classes)
    if classes <= 2:
        raise ctx.unsupported(f"a tree classifier of {classes} classes (ONNX Runtime's two-class rules are its "
                              "own; export the score as a TreeEnsembleRegressor)")
    weights, listed = leaf_weights(ctx, forest, "class", classes)
    scores, reached = run_forest(ctx, x, forest, [weights, listed])
    scores = _summed(ctx, scores, len(forest.roots), ctx.attr_str("aggregate_function", "SUM"))
    base = _base_values(ctx, classes)
    if base is not None:
        scores = b.add(scores, b.const(base.astype(scores.dtype.np)))
        return [_labelled(ctx, scores, labels), cast_to(b, _post_transform(ctx, scores), DType.f32)]
    has = b.greater(reached, scalar(b, 0.0, reached.dtype))
    scored = b.where(has, scores, scalar(b, 0.0, scores.dtype))
    ranked = b.where(has, scores, scalar(b, -np.inf, scores.dtype))
    return [_labelled(ctx, ranked, labels), cast_to(b, _post_transform(ctx, scored), DType.f32)]


# --------------------------------------------------------------------------------------
# feature preparation: imputation, encodings, concatenation


@onnx_op("Imputer", domain=ML, emits=("isnan", "equal", "where", "reshape"))
def imputer(ctx: NodeCtx) -> Value:
    """Each element equal to the replaced value (NaN: each NaN) becomes the imputed value of its feature (one
    value, or one per feature along the last axis)."""
    b = ctx.b
    x = ctx.input(0)
    if x.dtype.is_float:
        imputed = np.asarray(ctx.attr_floats("imputed_value_floats", []), dtype=x.dtype.np)
        replaced = ctx.attr_float("replaced_value_float", 0.0)
        hit = b.isnan(x) if np.isnan(replaced) else b.equal(x, scalar(b, replaced, x.dtype))
    else:
        imputed = np.asarray(ctx.attr_ints("imputed_value_int64s", []), dtype=x.dtype.np)
        hit = b.equal(x, scalar(b, ctx.attr_int("replaced_value_int64", 0), x.dtype))
    features = x.shape[-1] if x.type.rank else 1
    if imputed.size not in (1, features):
        raise ShapeError(f"{imputed.size} imputed values for {features} features", location=ctx.location,
                         hint="give one imputed value, or one per feature")
    return b.where(hit, b.const(imputed if imputed.size > 1 else imputed.reshape(())), x)


def _number_list(ctx: NodeCtx, stem: str) -> np.ndarray | None:
    """``{stem}_int64s`` or ``{stem}_floats`` (or ``{stem}_tensor``) as an array; string forms are refused."""
    if ctx.has_attr(f"{stem}_strings"):
        raise ctx.unsupported(f"string {stem} ({stem}_strings): Cuvil's tensors hold numbers")
    if ctx.has_attr(f"{stem}_tensor"):
        return np.asarray(ctx.attr(f"{stem}_tensor")).reshape(-1)
    if ctx.has_attr(f"{stem}_int64s"):
        return np.asarray(ctx.attr_ints(f"{stem}_int64s"), dtype=np.int64)
    if ctx.has_attr(f"{stem}_floats"):
        return np.asarray(ctx.attr_floats(f"{stem}_floats"), dtype=np.float32)
    return None


@onnx_op("LabelEncoder", domain=ML, emits=("reshape", "equal", "reduce_max", "argmax", "gather", "where"))
def label_encoder(ctx: NodeCtx) -> Value:
    """Each element's value at its key (``keys_*`` -> ``values_*``), the default where no key equals it."""
    b = ctx.b
    x = ctx.input(0)
    keys, values = _number_list(ctx, "keys"), _number_list(ctx, "values")
    if keys is None or values is None or keys.size != values.size or not keys.size:
        raise ShapeError("LabelEncoder needs as many numeric values as keys", location=ctx.location,
                         hint="give keys_int64s / keys_floats and values_int64s / values_floats of one length")
    if ctx.has_attr("default_tensor"):
        default = np.asarray(ctx.attr("default_tensor")).reshape(()).astype(values.dtype)
    elif values.dtype == np.int64:
        default = np.asarray(ctx.attr_int("default_int64", -1), dtype=np.int64)
    else:
        default = np.asarray(ctx.attr_float("default_float", -0.0), dtype=values.dtype)
    key_dtype = DType.from_numpy(keys.dtype)
    if key_dtype is not x.dtype:
        raise ShapeError(f"keys of {key_dtype.value} for an input of {x.dtype.value}", location=ctx.location,
                         hint="the keys' type is the input's")
    rank = x.type.rank
    matches = b.equal(b.reshape(x, shape=[*x.shape, 1]), b.const(keys))  # [..., K]
    found = b.reduce_max(b.cast(matches, to=DType.i32), axes=[rank], keepdims=False)
    index = b.argmax(b.cast(matches, to=DType.i32), axis=rank, keepdims=False)
    mapped = b.gather(b.const(values), index, axis=0)
    return b.where(b.equal(found, scalar(b, 1, DType.i32)), mapped, b.const(default))


@onnx_op("OneHotEncoder", domain=ML, emits=("reshape", "equal", "cast"))
def one_hot_encoder(ctx: NodeCtx) -> Value:
    """One float column per category (``cats_int64s``), 1.0 where the element equals it; an element of no
    category is a row of zeros (``zeros=1``; ``zeros=0``, an error at run time, is refused)."""
    b = ctx.b
    x = ctx.input(0)
    if ctx.has_attr("cats_strings"):
        raise ctx.unsupported("string categories (cats_strings): Cuvil's tensors hold numbers")
    if not ctx.attr_int("zeros", 1):
        raise ctx.unsupported("zeros=0 (an unknown category is an error at run time)")
    cats = np.asarray(ctx.attr_ints("cats_int64s"), dtype=np.int64)
    work = cast_to(b, x, DType.i64)  # a float input is truncated, as ONNX Runtime does
    hot = b.equal(b.reshape(work, shape=[*x.shape, 1]), b.const(cats))
    return b.cast(hot, to=DType.f32)


@onnx_op("FeatureVectorizer", domain=ML, emits=("cast", "reshape", "concat", "slice", "pad"))
def feature_vectorizer(ctx: NodeCtx) -> Value:
    """The inputs' features side by side as floats, each cut or zero-padded to its ``inputdimensions`` entry."""
    b = ctx.b
    sizes = ctx.attr_ints("inputdimensions")
    count = len(ctx.node.input)
    if len(sizes) != count:
        raise ShapeError(f"{len(sizes)} input dimensions for {count} inputs", location=ctx.location,
                         hint="give one inputdimensions entry per input")
    parts = []
    for i, size in enumerate(sizes):
        x = ctx.input(i)
        x = b.reshape(x, shape=[1, x.shape[0]]) if x.type.rank == 1 else x
        x = cast_to(b, x, DType.f32)
        width = x.shape[-1]
        if not isinstance(width, int):
            raise ctx.unsupported("a symbolic feature count")
        if width > size:
            x = b.slice(x, starts=[0] * x.type.rank, ends=[*x.shape[:-1], size], steps=[1] * x.type.rank)
        elif width < size:
            x = b.pad(x, pads=[0] * (2 * x.type.rank - 1) + [size - width], mode="constant", value=0.0)
        parts.append(x)
    return parts[0] if len(parts) == 1 else b.concat(*parts, axis=-1)


# --------------------------------------------------------------------------------------
# support vector regression

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


@onnx_op("SVMRegressor", domain=ML, emits=("cast", "reshape", "matmul", "mul", "add", "sub", "pow", "exp", "tanh",
                                           "reduce_sum", "greater", "where"))
def svm_regressor(ctx: NodeCtx) -> Value:
    """``sum_j coefficients_j K(x, sv_j) + rho`` over the support vectors (with none: ``x . coefficients +
    rho``), K the LINEAR, POLY ``(gamma x.sv + coef0)^degree``, RBF ``exp(-gamma |x - sv|^2)`` or SIGMOID
    ``tanh(gamma x.sv + coef0)`` kernel; a one-class model gives 1 where that is positive, else -1."""
    b = ctx.b
    x = _features(ctx, ctx.input(0))
    dt = x.dtype
    features = x.shape[1]
    if not isinstance(features, int):
        raise ctx.unsupported("a symbolic feature count")
    coef = np.asarray(ctx.attr_floats("coefficients"), dtype=dt.np)
    rho = np.asarray(ctx.attr_floats("rho", [0.0]), dtype=dt.np)
    supports = ctx.attr_int("n_supports", 0)
    if ctx.attr_str("post_transform", "NONE") != "NONE":
        raise ctx.unsupported(f"post_transform {ctx.attr_str('post_transform')} of an SVM regressor")
    if supports == 0:
        if coef.size != features:
            raise ShapeError(f"{coef.size} coefficients for {features} features", location=ctx.location,
                             hint="a linear SVM has one coefficient per feature")
        score = b.matmul(x, b.const(coef.reshape(features, 1)))
    else:
        vectors = np.asarray(ctx.attr_floats("support_vectors"), dtype=dt.np)
        if vectors.size != supports * features or coef.size != supports:
            raise ShapeError(f"{vectors.size} support vector values and {coef.size} coefficients for "
                             f"{supports} support vectors of {features} features", location=ctx.location,
                             hint="give n_supports x features support_vectors and n_supports coefficients")
        kernel = _kernel(ctx, x, vectors.reshape(supports, features))  # [N, S]
        score = b.matmul(kernel, b.const(coef.reshape(supports, 1)))
    score = b.add(score, b.const(rho.reshape(())))
    if ctx.attr_int("one_class", 0):
        return b.where(b.greater(score, scalar(b, 0.0, dt)), scalar(b, 1.0, dt), scalar(b, -1.0, dt))
    return score


def _kernel(ctx: NodeCtx, x: Value, vectors: np.ndarray) -> Value:
    """K(x_i, sv_j) for every row and support vector: [N, S]."""
    b = ctx.b
    dt = x.dtype
    kind = ctx.attr_str("kernel_type", "LINEAR")
    if kind not in _KERNELS:
        raise ctx.unsupported(f"kernel_type {kind} (supported: {', '.join(_KERNELS)})")
    params = ctx.attr_floats("kernel_params", [])
    gamma, coef0, degree = (params + [0.0, 0.0, 0.0][len(params):])[:3]
    if kind == "RBF":
        diff = b.sub(b.reshape(x, shape=[x.shape[0], 1, vectors.shape[1]]), b.const(vectors[None]))
        distance = b.reduce_sum(b.mul(diff, diff), axes=[2], keepdims=False)
        return b.exp(b.mul(distance, scalar(b, -gamma, dt)))
    dot = b.matmul(x, b.const(np.ascontiguousarray(vectors.T)))
    if kind == "LINEAR":
        return dot
    affine = b.add(b.mul(dot, scalar(b, gamma, dt)), scalar(b, coef0, dt))
    if kind == "POLY":
        return b.pow(affine, scalar(b, degree, dt))
    return b.tanh(affine)


# --------------------------------------------------------------------------------------
# TreeEnsemble (ai.onnx.ml 5): interior nodes and leaves in tables of their own

_V5_AGGREGATES = {0: "AVERAGE", 1: "SUM"}


def _int_array(ctx: NodeCtx, name: str) -> np.ndarray:
    """An integer list or tensor attribute (``nodes_modes`` is a uint8 tensor) as a flat int64 array."""
    return np.asarray(ctx.attr(name), dtype=np.int64).reshape(-1)


@onnx_op("TreeEnsemble", domain=ML, emits=_TREE_EMITS)
def tree_ensemble(ctx: NodeCtx) -> Value:
    """The regressor of ONNX-ML 5, its interior nodes (``nodes_*``, children flagged as leaves or not) and its
    leaves (``leaf_*``) in separate tables: read into the same flattened forest, the leaves placed after the
    interior nodes. Set-membership splits (BRANCH_MEMBER), MIN/MAX aggregation and every post_transform but
    NONE are refused by name."""
    x = ctx.input(0)
    if not x.dtype.is_float:
        raise ShapeError(f"TreeEnsemble takes float rows, got {x.dtype.value}", location=ctx.location,
                         hint="cast the input to float")
    x = _features(ctx, x, x.dtype)
    features = _int_array(ctx, "nodes_featureids")
    modes = _int_array(ctx, "nodes_modes")
    splits = np.asarray(ctx.attr("nodes_splits"), dtype=np.float64).reshape(-1)
    true_ids, false_ids = _int_array(ctx, "nodes_truenodeids"), _int_array(ctx, "nodes_falsenodeids")
    true_leaf, false_leaf = _int_array(ctx, "nodes_trueleafs"), _int_array(ctx, "nodes_falseleafs")
    interior = features.size
    tracks = (_int_array(ctx, "nodes_missing_value_tracks_true")
              if ctx.has_attr("nodes_missing_value_tracks_true") else np.zeros(interior, dtype=np.int64))
    columns = {"nodes_modes": modes, "nodes_splits": splits, "nodes_truenodeids": true_ids,
               "nodes_falsenodeids": false_ids, "nodes_trueleafs": true_leaf, "nodes_falseleafs": false_leaf,
               "nodes_missing_value_tracks_true": tracks}
    for name, column in columns.items():
        if column.size != interior:
            raise ShapeError(f"{name} has {column.size} entries for {interior} nodes", location=ctx.location,
                             hint="every nodes_* attribute has one entry per interior node")
    if (modes == 6).any():
        raise ctx.unsupported("BRANCH_MEMBER (set-membership) splits")
    if ((modes < 0) | (modes > 5)).any():
        raise ctx.unsupported(f"node modes {sorted(set(modes.tolist()) - set(range(6)))}")
    targets_of = _int_array(ctx, "leaf_targetids")
    weights = np.asarray(ctx.attr("leaf_weights"), dtype=np.float64).reshape(-1)
    leaves = targets_of.size
    if weights.size != leaves:
        raise ShapeError(f"{weights.size} leaf weights for {leaves} leaf targets", location=ctx.location,
                         hint="give one leaf_weights entry per leaf")
    targets = ctx.attr_int("n_targets")
    how = ctx.attr_int("aggregate_function", 1)
    post = ctx.attr_int("post_transform", 0)
    if how not in _V5_AGGREGATES:
        raise ctx.unsupported(f"aggregate_function {how} (supported: 0 AVERAGE, 1 SUM)")
    if post:
        raise ctx.unsupported(f"post_transform {post} (the specification numbers SOFTMAX 1 and LOGISTIC 2, ONNX "
                              "Runtime applies LOGISTIC for 1 and SOFTMAX for 2; only 0, NONE, means one thing)")
    if targets < 1 or ((targets_of < 0) | (targets_of >= targets)).any():
        raise ShapeError(f"leaf_targetids outside [0, {targets})", location=ctx.location,
                         hint="each leaf's target is below n_targets")
    total = interior + leaves

    def child(ids: np.ndarray, to_leaf: np.ndarray) -> np.ndarray:
        out = np.where(to_leaf != 0, interior + ids, ids)
        bad = (out < 0) | (out >= total) | ((to_leaf == 0) & (ids >= interior))
        if bad.any():
            raise ShapeError(f"node {int(np.argmax(bad))} branches outside the model", location=ctx.location,
                             hint="children index nodes_* (or leaf_* where flagged a leaf)")
        return out

    true_next = np.concatenate([child(true_ids, true_leaf), np.arange(interior, total)]).astype(np.int64)
    false_next = np.concatenate([child(false_ids, false_leaf), np.arange(interior, total)]).astype(np.int64)
    if (true_next[:interior] == np.arange(interior)).any() or (false_next[:interior] == np.arange(interior)).any():
        raise ShapeError("a node branches to itself: the tree is cyclic", location=ctx.location,
                         hint="each node's children must be new nodes")
    roots = _int_array(ctx, "tree_roots")
    if ((roots < 0) | (roots >= interior)).any() or not roots.size:
        raise ShapeError("tree_roots must index interior nodes", location=ctx.location,
                         hint="give one interior node per tree")
    forest = Forest(np.concatenate([features, np.zeros(leaves, dtype=np.int64)]),
                    np.concatenate([splits, np.zeros(leaves)]), np.concatenate([modes, np.zeros(leaves, np.int64)]),
                    true_next, false_next, np.concatenate([tracks != 0, np.zeros(leaves, bool)]),
                    roots, _depth(ctx, roots.tolist(), true_next, false_next), {})
    table = np.zeros((total, targets), dtype=np.float64)
    np.add.at(table, (interior + np.arange(leaves), targets_of), weights)
    (scores,) = run_forest(ctx, x, forest, [table])
    return _summed(ctx, scores, roots.size, _V5_AGGREGATES[how])
