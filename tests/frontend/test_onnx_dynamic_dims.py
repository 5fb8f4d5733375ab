"""ONNX models with dynamic dims, as exporters write them: every spelling of a dynamic dim, and shape
subgraphs (Shape -> Gather -> arithmetic -> Reshape/Range/Slice/Pad/Resize/...) that must fold to
symbolic dims at import. Each model is imported once, its result shape checked to be symbolic, and run
on the reference interpreter at three input shapes against ONNX Runtime (the oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_shape import compare, oracle

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontend.onnx_ops.fold import SymFrac, fold_symbolic
from cuvil.interp import run_reference
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.symbolic import Sym, dim_bounds, exact_ratio, quotient, sym_max, sym_min
from cuvil.ir.types import TensorType

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
INT64_MAX = 2**63 - 1
node = helper.make_node


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def f32(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


@dataclass
class Graph:
    """A model: float graph inputs (name -> declared shape, None for no shape), nodes, initializers."""

    nodes: list[onnx.NodeProto]
    inputs: dict[str, Any]
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: tuple[str, ...] = ("y",)
    opset: int = 17

    def model(self) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(n, FLOAT, s) for n, s in self.inputs.items()]
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in self.outputs]
        graph = helper.make_graph(self.nodes, "g", ins, outs,
                                  [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        return onnx.shape_inference.infer_shapes(model)  # output element types, for ONNX Runtime


def feeds_for(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def matches_onnxruntime(model: onnx.ModelProto, runs: list[dict[str, tuple[int, ...]]]) -> Module:
    """Import once; at each run's input shapes the interpreter agrees with ONNX Runtime."""
    module = cuvil.import_model(model)
    for k, shapes in enumerate(runs):
        feeds = feeds_for(shapes, k)
        compare(run_reference(module, feeds), oracle(model, feeds))
    return module


def shape_text(module: Module, k: int = 0) -> list[str]:
    return [str(d) for d in module.main.results[k].type.shape]


def symbolic(module: Module, k: int = 0) -> bool:
    return any(isinstance(d, Sym) for d in module.main.results[k].type.shape)


# --------------------------------------------------------------------------------------
# dim spellings


def _shape_prefix() -> list[onnx.NodeProto]:
    """x -> 1x1 Conv -> flatten to [batch, -1] by a Shape -> Gather -> Concat -> Reshape chain."""
    return [node("Conv", ["x", "w"], ["c"]),
            node("Shape", ["c"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
            node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Concat", ["n1", "minus1"], ["target"], axis=0),
            node("Reshape", ["c", "target"], ["y"])]


SPELLINGS: dict[str, Any] = {
    "minus-one": [-1, 3, "H", 4],
    "named": ["batch", 3, "H", 4],
    "absent-dim": ["", 3, "H", 4],
    "absent-shape": None,
}


def _spelled(dims: Any) -> onnx.ModelProto:
    g = Graph(_shape_prefix(), {"x": dims},
              {"w": np.random.default_rng(1).standard_normal((2, 3, 1, 1)).astype(np.float32),
               "zero": np.array(0, np.int64), "ax0": i64(0), "minus1": i64(-1)})
    model = g.model()
    if dims is not None and "" in dims:  # helper.make_tensor_value_info writes "" as a dim_param
        model.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_param")
    return model


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_dynamic_dim_spellings_import_and_run_at_three_shapes(spelling):
    model = _spelled(SPELLINGS[spelling])
    module = matches_onnxruntime(model, [{"x": (2, 3, 5, 4)}, {"x": (1, 3, 7, 4)}, {"x": (4, 3, 2, 4)}])
    declared = [str(d) for d in module.main.params[0].type.shape]
    first = {"named": "batch"}.get(spelling, "x_dim0")
    if spelling == "absent-shape":
        assert declared == ["x_dim0", "x_dim1", "x_dim2", "x_dim3"]
    else:
        assert declared == [first, "3", "H", "4"]
    assert shape_text(module)[0] == first and symbolic(module)


def test_zero_dim_value_is_a_literal_empty_dim_as_in_onnxruntime():
    """dim_value 0 is a zero-size dim (ONNX IR; Runtime refuses any other size there), not "dynamic"."""
    model = Graph([node("Conv", ["x", "w"], ["y"])], {"x": [0, 3, "H", 4]},
                  {"w": np.ones((2, 3, 1, 1), np.float32)}).model()
    module = matches_onnxruntime(model, [{"x": (0, 3, 5, 4)}, {"x": (0, 3, 1, 4)}, {"x": (0, 3, 6, 4)}])
    assert [str(d) for d in module.main.params[0].type.shape] == ["0", "3", "H", "4"]
    x = feeds_for({"x": (2, 3, 5, 4)}, 0)
    with pytest.raises(CuvilError) as ours:
        run_reference(module, x)
    assert ours.value.code == "CUVIL-INPUT"
    with pytest.raises(Exception, match="Expected: 0"):
        oracle(model, x)


def test_other_negative_dim_values_are_still_refused():
    with pytest.raises(CuvilError) as info:
        cuvil.import_model(_spelled([-2, 3, "H", 4]))
    assert info.value.code == "CUVIL-LOAD"


def test_fresh_dim_names_never_clash_with_declared_ones():
    g = Graph([node("Add", ["x", "z"], ["y"])], {"x": [-1, 3], "z": ["x_dim0", 1]})
    module = cuvil.import_model(g.model())
    assert [str(p.type.shape[0]) for p in module.main.params] == ["x_dim0_1", "x_dim0"]


@pytest.mark.parametrize("mark", ["?", "*", "??", " "])
def test_anonymous_dim_params_are_each_their_own_dim(mark):
    """Paddle2ONNX names every unknown dim "?": each is a fresh dim (ONNX Runtime runs such a model
    with H != W), while a real name repeated still ties its dims together."""
    model = Graph([node("Conv", ["x", "w"], ["y"])], {"x": [-1, 3, mark, mark]},
                  {"w": np.random.default_rng(2).standard_normal((2, 3, 1, 1)).astype(np.float32)}).model()
    module = matches_onnxruntime(model, [{"x": (1, 3, 48, 192)}, {"x": (2, 3, 5, 4)}, {"x": (1, 3, 7, 7)}])
    assert [str(d) for d in module.main.params[0].type.shape] == ["x_dim0", "3", "x_dim2", "x_dim3"]
    tied = Graph([node("Conv", ["x", "w"], ["y"])], {"x": [-1, 3, "S", "S"]},
                 {"w": np.ones((2, 3, 1, 1), np.float32)}).model()
    assert [str(d) for d in cuvil.import_model(tied).main.params[0].type.shape] == ["x_dim0", "3", "S", "S"]


@pytest.mark.parametrize("end", [10**9, 2**31 - 1, 2**20])
@pytest.mark.parametrize("step", [1, -1])
def test_a_large_constant_slice_bound_on_a_symbolic_axis_means_the_end(end, step):
    """tf2onnx writes ``x[0:]`` as ends=1e9: the slice runs to the end for every admitted size, and the
    dim is constrained to at most the bound (a longer axis is refused, not cut short)."""
    from cuvil.frontend.onnx_ops.shape import PAST_THE_END

    assert end >= PAST_THE_END
    starts, ends = ([1], [end]) if step > 0 else ([end], [0])
    g = Graph([node("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": ["N", 3]},
              {"s": i64(*starts), "e": i64(*ends), "a": i64(0), "st": i64(step)})
    module = matches_onnxruntime(g.model(), [{"x": (5, 3)}, {"x": (1, 3)}, {"x": (9, 3)}])
    # bounds from 2**30 up are past any axis (no constraint); smaller ones constrain the dim
    assert [(c.symbol, c.hi) for c in module.main.constraints] == [("N", end if end < 2**30 else None)]
    if end == PAST_THE_END:
        with pytest.raises(CuvilError) as info:
            run_reference(module, {"x": np.zeros((end + 1, 3), np.float32)})
        assert info.value.code == "CUVIL-DIM-CONSTRAINT" and "N" in str(info.value)
    assert str(module.main.results[0].type.shape[0]) != str(end)


def test_absent_shape_without_a_use_fixing_its_rank_is_a_coded_error():
    with pytest.raises(CuvilError) as info:
        cuvil.import_model(Graph([node("Relu", ["x"], ["y"])], {"x": None}).model())
    assert info.value.code == "CUVIL-UNSUPPORTED-OP"
    assert "rank" in str(info.value) and info.value.hint


# --------------------------------------------------------------------------------------
# shape arithmetic: x[N, 6, W] with the dims read by Shape -> Gather


def _dims() -> list[onnx.NodeProto]:
    """s = Shape(x); n, c, w = its entries as scalars; n1, w1 as 1-vectors."""
    return [node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "zero"], ["n"], axis=0), node("Gather", ["s", "one"], ["c"], axis=0),
            node("Gather", ["s", "two"], ["w"], axis=0),
            node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Unsqueeze", ["w", "ax0"], ["w1"])]


DIM_INITS = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "two": np.array(2, np.int64),
             "ax0": i64(0), "i2": i64(2), "i3": i64(3), "i4": i64(4), "m1": i64(-1), "big": i64(INT64_MAX),
             "f2": np.array(2.0, np.float32), "i0v": i64(0)}


def _arith(nodes: list[onnx.NodeProto], **inits: np.ndarray) -> onnx.ModelProto:
    return Graph(_dims() + nodes, {"x": ["N", 6, "W"]}, {**DIM_INITS, **inits}).model()


def _slice_w(end: str) -> list[onnx.NodeProto]:
    """x[:, :, :end] with ``end`` a 1-vector computed from the dims."""
    return [node("Slice", ["x", "i0v", end, "i2"], ["y"])]


ARITHMETIC: dict[str, tuple[onnx.ModelProto, list[int]]] = {
    # Reshape to [N, 6, W / 2, 2]: integer Div of a dim
    "div": (_arith([node("Div", ["w1", "i2"], ["h1"]),
                    node("Concat", ["n1", "c6", "h1", "i2"], ["t"], axis=0),
                    node("Reshape", ["x", "t"], ["y"])], c6=i64(6)), [4, 6, 10]),
    # ConstantOfShape([N, W + 2]): Add of dims
    "add": (_arith([node("Add", ["w1", "i2"], ["w2"]), node("Concat", ["n1", "w2"], ["t"], axis=0),
                    node("ConstantOfShape", ["t"], ["y"], value=numpy_helper.from_array(f32(0.5)))]), [1, 4, 6]),
    # Reshape to [N * 6, W]: Mul of dims
    "mul": (_arith([node("Mul", ["n1", "c6"], ["nc"]),
                    node("Concat", ["nc", "w1"], ["t"], axis=0), node("Reshape", ["x", "t"], ["y"])],
                   c6=i64(6)), [3, 5, 7]),
    # x[:, :, :W - W % 4]: Mod and Sub
    "mod-sub": (_arith([node("Mod", ["w1", "i4"], ["r"]), node("Sub", ["w1", "r"], ["e"]), *_slice_w("e")]),
                [5, 8, 11]),
    # x[:, :, :min(W, 4)] and max(W - 6, 1): Min / Max of a dim and a number
    "min": (_arith([node("Min", ["w1", "i4"], ["e"]), *_slice_w("e")]), [2, 4, 9]),
    "max": (_arith([node("Sub", ["w1", "c6"], ["d"]), node("Max", ["d", "one1"], ["e"]), *_slice_w("e")],
                   c6=i64(6), one1=i64(1)), [3, 7, 12]),
    # x[:, :, :ceil(W / 2)] through float: Cast, Div 2.0, Ceil, Cast back (and Floor)
    "cast-ceil": (_arith([node("Cast", ["w1"], ["wf"], to=FLOAT), node("Div", ["wf", "f2"], ["h"]),
                          node("Ceil", ["h"], ["hc"]), node("Cast", ["hc"], ["e"], to=INT64), *_slice_w("e")]),
                  [5, 6, 9]),
    "cast-floor": (_arith([node("Cast", ["w1"], ["wf"], to=FLOAT), node("Mul", ["wf", "half"], ["h"]),
                           node("Floor", ["h"], ["hc"]), node("Cast", ["hc"], ["e"], to=INT64), *_slice_w("e")],
                          half=f32(0.5)), [5, 6, 9]),
    # the exporter's "0 copies the dim": Where(Equal(t, 0), Shape(x), t) with t = [0, 3, -1]
    "equal-where": (_arith([node("Equal", ["t0", "i0v"], ["is0"]), node("Where", ["is0", "s", "t0"], ["t"]),
                            node("Reshape", ["x", "t"], ["y"])], t0=i64(0, 3, -1)), [2, 3, 5]),
    # Where(Less(s, lim), lim, s) with lim = [1, 7, 1]: dims are at least 1, so the bounds decide it
    "less-where": (_arith([node("Less", ["s", "lim"], ["small"]), node("Where", ["small", "lim", "s"], ["t"]),
                           node("ConstantOfShape", ["t"], ["y"], value=numpy_helper.from_array(f32(1.5)))],
                          lim=i64(1, 7, 1)), [2, 3, 5]),
}


@pytest.mark.parametrize("name", list(ARITHMETIC))
def test_shape_arithmetic_folds_to_symbolic_dims(name):
    model, widths = ARITHMETIC[name]
    module = matches_onnxruntime(model, [{"x": (n, 6, w)} for n, w in zip((2, 1, 3), widths, strict=True)])
    assert symbolic(module)


def test_integer_division_of_a_dim_keeps_a_readable_dim():
    module = cuvil.import_model(ARITHMETIC["div"][0])
    assert shape_text(module) == ["N", "6", "(W)//2", "2"]


# --------------------------------------------------------------------------------------
# Range, ConstantOfShape, Expand, Tile, Slice, Pad, Resize driven by dims


SHAPE_OPS: dict[str, tuple[onnx.ModelProto, list[tuple[int, ...]], list[str]]] = {
    # Range over a float limit cast from a dim, added to x's last axis
    "range-float-limit": (_arith([node("Cast", ["w"], ["wf"], to=FLOAT),
                                      node("Range", ["f0", "wf", "f1"], ["r"]), node("Add", ["x", "r"], ["y"])],
                                     f0=np.array(0.0, np.float32), f1=np.array(1.0, np.float32)),
                          [(2, 6, 3), (1, 6, 5), (3, 6, 8)], ["N", "6", "W"]),
    # Range(W - 1, -1, -1): a symbolic start, a negative step (added to x: ONNX Runtime's full
    # optimization level turns a Gather by such a range into an empty slice)
    "range-reversed": (_arith([node("Sub", ["w", "one"], ["last"]), node("Range", ["last", "neg1", "neg1"], ["r"]),
                                   node("Cast", ["r"], ["rf"], to=FLOAT), node("Add", ["x", "rf"], ["y"])],
                                  neg1=np.array(-1, np.int64)),
                       [(2, 6, 3), (1, 6, 5), (3, 6, 8)], ["N", "6", "W"]),
    # Range(0, N, 2): an integer limit and a step that does not divide it
    "range-step": (_arith([node("Range", ["zero", "n", "two"], ["r"]), node("Cast", ["r"], ["y"], to=FLOAT)]),
                   [(2, 6, 3), (5, 6, 3), (6, 6, 3)], ["(N + 1)//2"]),
    "constant-of-shape": (_arith([node("ConstantOfShape", ["s"], ["z"],
                                           value=numpy_helper.from_array(f32(2.5))),
                                      node("Mul", ["x", "z"], ["y"])]),
                          [(2, 6, 3), (1, 6, 5), (3, 6, 8)], ["N", "6", "W"]),
    # Expand a [1, 6, 1] column to [N, 6, W]
    "expand": (_arith([node("Concat", ["n1", "c6", "w1"], ["t"], axis=0), node("Expand", ["col", "t"], ["y"])],
                          c6=i64(6), col=np.arange(6, dtype=np.float32).reshape(1, 6, 1)),
               [(2, 6, 3), (1, 6, 5), (3, 6, 8)], ["N", "6", "W"]),
    # Tile a [2, 3] constant N times along axis 0 and W times along axis 1
    "tile": (_arith([node("Concat", ["n1", "w1"], ["reps"], axis=0), node("Tile", ["small", "reps"], ["y"])],
                        small=np.arange(6, dtype=np.float32).reshape(2, 3)),
             [(2, 6, 3), (1, 6, 5), (3, 6, 8)], ["2*N", "3*W"]),
    # x[:, :, W // 2 : INT64_MAX] and x[:, :, 1 : -1] with a step of 2: bounds from shapes
    "slice": (_arith([node("Div", ["w1", "i2"], ["mid"]), node("Slice", ["x", "mid", "big", "i2"], ["a"]),
                          node("Slice", ["x", "one1", "m1", "i2", "i2"], ["b"]),
                          node("Concat", ["a", "b"], ["y"], axis=2)], one1=i64(1)),
              [(2, 6, 3), (1, 6, 6), (3, 6, 9)], ["N", "6", "W - (W)//2 + (W - 1)//2"]),
    # pad W up to a multiple of 4: pads = (4 - W % 4) % 4 at the end of axis 2
    "pad-to-multiple": (_arith([node("Mod", ["w1", "i4"], ["r"]), node("Sub", ["i4", "r"], ["p"]),
                                    node("Mod", ["p", "i4"], ["pw"]),
                                    node("Concat", ["z2", "pw"], ["tail"], axis=0),
                                    node("Concat", ["z3", "tail"], ["pads"], axis=0),
                                    node("Pad", ["x", "pads", "fill"], ["y"], mode="constant")],
                                   z2=i64(0, 0), z3=i64(0, 0, 0), fill=np.array(-1.0, np.float32)),
                        [(2, 6, 3), (1, 6, 4), (3, 6, 9)], ["N", "6", "W + (-(W)%4 + 4)%4"]),
}


@pytest.mark.parametrize("name", list(SHAPE_OPS))
def test_shape_driven_ops_stay_symbolic(name):
    model, runs, want = SHAPE_OPS[name]
    module = matches_onnxruntime(model, [{"x": s} for s in runs])
    got = shape_text(module)
    assert got == want, got


def _resize(mode: str, chain: str) -> onnx.ModelProto:
    """x[N, C, H, W] resized to [N, C, 2H, 2W] by sizes computed from its shape: Shape -> Slice -> Mul,
    or Shape -> Gather -> Mul -> Unsqueeze per axis, then Concat."""
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "i0v", "i2"], ["nc"])]
    if chain == "slice":
        nodes += [node("Slice", ["s", "i2", "i4"], ["hw"]), node("Mul", ["hw", "i2"], ["hw2"])]
    else:
        for k, name in ((2, "h"), (3, "w")):
            nodes += [node("Gather", ["s", f"at{k}"], [name], axis=0), node("Mul", [name, "two"], [f"{name}2"]),
                      node("Unsqueeze", [f"{name}2", "i0v"], [f"{name}21"])]
        nodes.append(node("Concat", ["h21", "w21"], ["hw2"], axis=0))
    nodes += [node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
              node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode)]
    inits = {"i0v": i64(0), "i2": i64(2), "i4": i64(4), "two": np.array(2, np.int64),
             "at2": np.array(2, np.int64), "at3": np.array(3, np.int64)}
    return Graph(nodes, {"x": ["N", 2, "H", "W"]}, inits, opset=13).model()


@pytest.mark.parametrize(("mode", "chain"), [("nearest", "slice"), ("linear", "slice"), ("nearest", "gather")])
def test_resize_to_sizes_computed_from_the_shape(mode, chain):
    module = matches_onnxruntime(_resize(mode, chain), [{"x": (1, 2, 3, 4)}, {"x": (2, 2, 5, 2)}, {"x": (1, 2, 4, 6)}])
    assert shape_text(module) == ["N", "2", "2*H", "2*W"]


def test_resize_by_scales_of_a_symbolic_dim():
    g = Graph([node("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": ["N", 2, "H", "W"]},
              {"sc": f32(1, 1, 0.5, 2)}, opset=13)
    module = matches_onnxruntime(g.model(), [{"x": (1, 2, 4, 3)}, {"x": (2, 2, 5, 2)}, {"x": (1, 2, 7, 1)}])
    assert shape_text(module) == ["N", "2", "(H)//2", "2*W"]


# --------------------------------------------------------------------------------------
# weights in Constant nodes


CONSTANTS: dict[str, Any] = {
    "value": numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4) / 8, "v"),
    "value_float": 0.25,
    "value_floats": [0.5, -1.0, 2.0, 0.0],
    "value_int": 3,
    "value_ints": [1, 2, 3, 4],
    "sparse_value": helper.make_sparse_tensor(numpy_helper.from_array(f32(1.5, -2.0), "v"),
                                              numpy_helper.from_array(i64(1, 3), "i"), [4]),
    "sparse_value_coords": helper.make_sparse_tensor(numpy_helper.from_array(f32(1.5, -2.0), "v"),
                                                     numpy_helper.from_array(np.array([[0, 1], [0, 3]], np.int64),
                                                                             "i"), [1, 4]),
}


@pytest.mark.parametrize("kind", list(CONSTANTS))
def test_weights_in_constant_nodes(kind):
    attr = "sparse_value" if kind.startswith("sparse") else kind
    nodes = [node("Constant", [], ["k"], **{attr: CONSTANTS[kind]})]
    if kind.startswith("value_int"):
        nodes.append(node("Cast", ["k"], ["kf"], to=FLOAT))
    nodes.append(node("Add", ["x", "kf" if kind.startswith("value_int") else "k"], ["y"]))
    matches_onnxruntime(Graph(nodes, {"x": ["N", 4]}).model(), [{"x": (2, 4)}, {"x": (1, 4)}, {"x": (5, 4)}])


def test_initializer_weights_with_a_dynamic_batch():
    g = Graph([node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])], {"x": [-1, 3]},
              {"w": np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32), "b": f32(0.5, -0.5)})
    module = matches_onnxruntime(g.model(), [{"x": (2, 3)}, {"x": (1, 3)}, {"x": (7, 3)}])
    assert shape_text(module) == ["x_dim0", "2"]


# --------------------------------------------------------------------------------------
# what cannot be folded: coded errors naming the node


def test_reshape_to_a_shape_read_from_data_is_a_coded_error():
    g = Graph([node("Cast", ["v"], ["t"], to=INT64), node("Reshape", ["x", "t"], ["y"], name="by_data")],
              {"x": ["N", 6], "v": [2]})
    with pytest.raises(CuvilError) as info:
        cuvil.import_model(g.model())
    assert info.value.code == "CUVIL-DYNAMIC-INPUT"
    assert "by_data" in (info.value.location or "") and info.value.hint


@pytest.mark.parametrize("nodes", [
    # N == 1 decides the target: only the run-time batch knows
    [node("Equal", ["n1", "one1"], ["is1"]), node("Where", ["is1", "one1", "n1"], ["m"]),
     node("Concat", ["m", "m1"], ["t"], axis=0), node("Reshape", ["x", "t"], ["y"], name="undecided")],
    # N / W is no constant: a float scale between two unrelated dims
    [node("Cast", ["n1"], ["nf"], to=FLOAT), node("Cast", ["w1"], ["wf"], to=FLOAT),
     node("Div", ["nf", "wf"], ["q"]), node("Concat", ["q", "q", "q"], ["sc"], axis=0),
     node("Resize", ["x", "", "sc"], ["y"], name="undecided")],
    # a Range step read from a dim
    [node("Range", ["zero", "n", "w"], ["y"], name="undecided")],
    # a converter that needs plain numbers (AffineGrid's size) meets a dim
    [node("AffineGrid", ["theta", "s"], ["y"], name="undecided")],
], ids=["equal-one", "ratio-of-dims", "range-step", "number-needed"])
def test_values_that_depend_on_run_time_dims_are_coded_errors(nodes):
    model = Graph(_dims() + nodes, {"x": ["N", 6, "W"]},
                  {**DIM_INITS, "one1": i64(1), "theta": np.zeros((1, 2, 3), np.float32)}, opset=20).model()
    with pytest.raises(CuvilError) as info:
        cuvil.import_model(model)
    assert info.value.code == "CUVIL-DYNAMIC-INPUT", info.value
    assert "undecided" in (info.value.location or "") and info.value.hint


# --------------------------------------------------------------------------------------
# compiled


def test_compiled_model_specializes_folded_dims_per_shape(private_cache):
    """Native code is built per shape signature: the folded dims (W // 2) are bound at each call."""
    model, _ = ARITHMETIC["div"]
    compiled = cuvil.compile(model, cache=False)
    for n, w in ((2, 4), (3, 10)):
        feeds = feeds_for({"x": (n, 6, w)}, n)
        compare([compiled(feeds["x"])], oracle(model, feeds))
    assert sorted(compiled.specializations) == [(("N", 2), ("W", 4)), (("N", 3), ("W", 10))]


# --------------------------------------------------------------------------------------
# the fold itself: ops on values holding symbolic dims


W, M = Sym.symbol("W"), Sym.symbol("M")


def fold(op: str, *operands: list[Any], dtype: DType = DType.i64, out: DType | None = None,
         **attrs: Any) -> list[Any]:
    arrays = [np.array(v, dtype=object) for v in operands]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    result = fold_symbolic(op, arrays, [dtype] * len(arrays), TensorType(out or dtype, shape), attrs, "here")
    return result.tolist()


@pytest.mark.parametrize(("got", "want"), [
    (lambda: fold("div", [W, -W, 2 * W], [2, 2, W]), [W // 2, -(W // 2), 2]),  # truncating, toward zero
    (lambda: fold("floor", fold("div", [W], [2.0], dtype=DType.f32), dtype=DType.f32), [W // 2]),
    (lambda: fold("ceil", fold("mul", [W], [0.5], dtype=DType.f32), dtype=DType.f32), [(W + 1) // 2]),
    (lambda: fold("cast", fold("div", [W], [4.0], dtype=DType.f32), dtype=DType.f32, to=DType.i64), [W // 4]),
    (lambda: fold("round", fold("div", [W], [3.0], dtype=DType.f32), dtype=DType.f32), [(2 * W + 3) // 6]),
    (lambda: fold("div", [2 * W], [W], dtype=DType.f32), [2]),
    (lambda: fold("mod", [W % 4, W], [4, 4], fmod=True), [W % 4, W % 4]),
    (lambda: fold("max", [W, W, W - 1], [1, 3, 0]), [W, sym_max(W, 3), W - 1]),
    (lambda: fold("min", [W, W - 1], [M, 0]), [sym_min(W, M), 0]),
    (lambda: fold("abs", [-W, W]), [W, W]),
    (lambda: fold("clip", [W - 1], min=0.0, max=None), [W - 1]),
    (lambda: fold("equal", [W, W, 3], [0, W, 3], out=DType.bool), [False, True, True]),
    (lambda: fold("greater_equal", [W, W // 2], [1, 0], out=DType.bool), [True, True]),
    (lambda: fold("cast", [W], to=DType.bool, out=DType.bool), [True]),
    (lambda: fold("add", [W, 3], [1, 2]), [W + 1, 5]),
])
def test_fold_rules(got, want):
    assert got() == want


def test_fold_settles_to_numbers_once_no_dim_is_left():
    out = fold_symbolic("sub", [np.array([W, 5], dtype=object), np.array([W, 2], dtype=object)],
                        [DType.i64, DType.i64], TensorType(DType.i64, (2,)), {}, "here")
    assert out.dtype == np.int64 and out.tolist() == [0, 3]


@pytest.mark.parametrize(("op", "operands", "attrs"), [
    ("equal", ([W], [1]), {}),  # W may be 1
    ("div", ([W - 3], [2]), {}),  # truncation needs the sign
    ("div", ([W], [M]), {"out": DType.f32, "dtype": DType.f32}),  # no constant ratio
    ("round", ([SymFrac(W, 2)],), {"dtype": DType.f32}),  # W / 2 is a tie at every odd W
])
def test_fold_refuses_what_only_run_time_dims_decide(op, operands, attrs):
    with pytest.raises(CuvilError) as info:
        fold(op, *operands, **attrs)
    assert info.value.code == "CUVIL-DYNAMIC-INPUT" and info.value.location == "here"


def test_dim_algebra_used_by_the_fold():
    assert dim_bounds(W - W % 4) == (0, None) and dim_bounds(W // 2 - W) == (None, -1)
    assert dim_bounds((4 - W % 4) % 4) == (0, 3) and dim_bounds(W - 1) == (0, None)
    assert exact_ratio(3 * W + 3, W + 1) == 3 and exact_ratio(W, M) is None
    assert quotient(3 * M * W, 6 * M) == W // 2
