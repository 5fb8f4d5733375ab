"""ONNX elementwise converters: one-node models built in-process, imported into CIR and run on the
reference interpreter, compared with ONNX Runtime as the oracle (ONNX's reference evaluator where
Runtime lacks the op)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.errors import CuvilError, UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference

BF16 = np.dtype(ml_dtypes.bfloat16)
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 0.5, -0.5, 2.5]


def floats(shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0, edges: bool = True,
           scale: float = 3.0) -> np.ndarray:
    """Random values; with ``edges`` the first elements are +-0, +-inf, NaN, huge and tiny values."""
    vals = np.random.default_rng(seed).standard_normal(shape).ravel() * scale
    if edges:
        n = min(len(EDGES), vals.size)
        vals[:n] = EDGES[:n]
    with np.errstate(all="ignore"):
        return vals.astype(dtype).reshape(shape)


def ints(shape: tuple[int, ...], dtype: Any = np.int32, seed: int = 0, low: int = -20, high: int = 20,
         nonzero: bool = False) -> np.ndarray:
    vals = np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)
    if nonzero:
        vals[vals == 0] = 3
    return vals


def bools(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape) > 0


@dataclass
class Case:
    op: str
    feeds: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: list[str] | None = None  # node input names, in order ("" for a missing optional input)
    out: Any = None  # output element type (numpy); default: the first input's
    domain: str = ""
    tol: tuple[float, float] | None = None
    reference: bool = False  # ONNX Runtime's python API cannot pass bf16 arrays: use ONNX's evaluator

    def model(self) -> onnx.ModelProto:
        names = self.inputs if self.inputs is not None else [*self.feeds, *self.consts]
        node = helper.make_node(self.op, names, ["y"], domain=self.domain, **self.attrs)
        first = next(iter(self.feeds.values()))
        out = np.dtype(self.out) if self.out is not None else first.dtype
        graph = helper.make_graph(
            [node], "g",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.feeds.items()],
            [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out), None)],
            [numpy_helper.from_array(a, n) for n, a in self.consts.items()])
        opsets = [helper.make_opsetid("", self.opset)]
        if self.domain:
            opsets.append(helper.make_opsetid(self.domain, 1))
        return helper.make_model(graph, opset_imports=opsets)


def oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: bool = False) -> np.ndarray:
    if reference:
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)[0]
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e) and "not implemented" not in str(e).lower():
            raise
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)[0]
    return sess.run(None, feeds)[0]


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    return {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-12, 1e-300),
            np.dtype(np.float16): (2e-3, 1e-4), BF16: (1.6e-2, 1e-3)}.get(np.dtype(dtype), (0.0, 0.0))


def check_case(case: Case) -> None:
    model = case.model()
    want = np.asarray(oracle(model, case.feeds, case.reference))
    module = import_onnx(model)
    [got] = run_reference(module, {p.name: case.feeds[p.name] for p in module.main.params})
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    rtol, atol = case.tol or tolerance(want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


def _cases() -> list[Any]:
    with np.errstate(over="ignore"):  # edge values overflow to inf in f16, as intended
        return _build_cases()


def _build_cases() -> list[Any]:
    x, y = floats((3, 4), seed=1), floats((4,), seed=2, edges=False)
    xf = floats((3, 4), seed=3, edges=False)  # finite inputs for ops Runtime approximates
    c: dict[str, Case] = {}
    # binary arithmetic and comparisons, with broadcasting
    for op in ["Add", "Sub", "Mul", "Div", "Min", "Max", "PRelu"]:
        c[f"{op}-f32"] = Case(op, {"a": x, "b": y}, opset=13 if op in ("Min", "Max") else 17)
    c["Pow-f32"] = Case("Pow", {"a": np.abs(xf) + 0.5, "b": y})
    c["Pow-f32-edges"] = Case("Pow", {"a": x, "b": np.array([0.0, 1.0, 2.0, -1.0], np.float32)})
    for op in ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]:
        c[f"{op}-f32"] = Case(op, {"a": x, "b": x[1]}, out=bool)
        c[f"{op}-i64"] = Case(op, {"a": ints((3, 4), np.int64), "b": ints((4,), np.int64, seed=5)}, out=bool)
    c["Equal-bool"] = Case("Equal", {"a": bools((3, 1)), "b": bools((4,), seed=6)}, out=bool)
    c["Add-f64"] = Case("Add", {"a": x.astype(np.float64), "b": y.astype(np.float64)})
    c["Mul-f16"] = Case("Mul", {"a": x.astype(np.float16), "b": y.astype(np.float16)})
    for op in ["Add", "Sub", "Mul", "Div"]:
        c[f"{op}-i32"] = Case(op, {"a": ints((3, 4)), "b": ints((4,), seed=7, nonzero=True)})
    c["Div-i64-trunc"] = Case("Div", {"a": np.array([7, -7, 7, -7], np.int64),
                                      "b": np.array([2, 2, -2, -2], np.int64)})
    c["Mod-i32-floor"] = Case("Mod", {"a": ints((3, 4)), "b": ints((4,), seed=8, nonzero=True)})
    c["Mod-i64-fmod"] = Case("Mod", {"a": ints((3, 4), np.int64), "b": ints((4,), np.int64, 9, nonzero=True)},
                             attrs={"fmod": 1})
    c["Mod-f32-fmod"] = Case("Mod", {"a": xf, "b": np.array([1.5, -2.0, 0.7, -0.3], np.float32)},
                             attrs={"fmod": 1})
    c["Mod-u8"] = Case("Mod", {"a": ints((3, 4), np.uint8, 0, 0, 250), "b": ints((4,), np.uint8, 1, 1, 9)})
    c["Min-i64"] = Case("Min", {"a": ints((3, 4), np.int64), "b": ints((4,), np.int64, seed=2)}, opset=13)
    c["Max-i32"] = Case("Max", {"a": ints((3, 4)), "b": ints((4,), seed=2)}, opset=13)
    c["PRelu-channel"] = Case("PRelu", {"x": floats((2, 3, 4), seed=4)},
                              consts={"slope": np.array([0.1, -0.5, 2.0], np.float32).reshape(3, 1)})
    c["PRelu-i32"] = Case("PRelu", {"x": ints((3, 4))}, consts={"slope": ints((4,), seed=3)}, opset=16)
    # mixed-type Pow
    c["Pow-f32^i64"] = Case("Pow", {"a": xf, "b": np.array([0, 1, 2, 3], np.int64)}, opset=15)
    c["Pow-i32^f32"] = Case("Pow", {"a": ints((3, 4), low=0, high=6), "b": np.array([0.0, 1.0, 2.0, 0.5], np.float32)},
                            opset=15)
    c["Pow-i64^i64"] = Case("Pow", {"a": ints((3, 4), np.int64, low=-5, high=6),
                                    "b": np.array([0, 1, 2, 3], np.int64)}, opset=15)
    c["Pow-f64^f32"] = Case("Pow", {"a": np.abs(xf).astype(np.float64), "b": y}, opset=15)
    # bitwise
    for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]:
        c[f"{op}-i32"] = Case(op, {"a": ints((3, 4), low=-1000, high=1000), "b": ints((4,), seed=3, high=1000)},
                              opset=18)
    c["BitwiseNot-u8"] = Case("BitwiseNot", {"x": ints((3, 4), np.uint8, low=0, high=255)}, opset=18)
    c["BitwiseNot-i16"] = Case("BitwiseNot", {"x": ints((3, 4), np.int16, low=-300, high=300)}, opset=18)
    for dt in (np.uint8, np.uint32, np.uint64):
        for d in ("LEFT", "RIGHT"):
            c[f"BitShift-{np.dtype(dt)}-{d}"] = Case(
                "BitShift", {"a": ints((3, 4), dt, low=0, high=200), "b": np.array([0, 1, 3, 7], dt)},
                attrs={"direction": d}, opset=11)
    # logic
    for op in ["And", "Or", "Xor"]:
        c[op] = Case(op, {"a": bools((3, 1)), "b": bools((4,), seed=1)})
    c["Not"] = Case("Not", {"a": bools((3, 4))})
    # variadic
    z = floats((2, 1, 4), seed=9, edges=False)
    for op in ["Sum", "Mean", "Min", "Max"]:
        c[f"{op}-3"] = Case(op, {"a": x, "b": y, "c": z}, opset=13)
        c[f"{op}-1"] = Case(op, {"a": x}, opset=13)
    c["Max-3-i32"] = Case("Max", {"a": ints((3, 4)), "b": ints((4,), seed=1), "c": ints((2, 1, 4), seed=2)},
                          opset=13)
    # unary float ops
    for op in ["Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Relu", "Floor", "Ceil", "Round", "Sign",
               "IsNaN", "Softsign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
               "Acosh", "Atanh"]:
        c[f"{op}-f32"] = Case(op, {"x": x}, out=bool if op == "IsNaN" else None)
    c["Round-halves"] = Case("Round", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 1e8 + 0.5], np.float32)})
    c["Sqrt-f64"] = Case("Sqrt", {"x": x.astype(np.float64)})
    c["Exp-f16"] = Case("Exp", {"x": x.astype(np.float16)})
    # ops Runtime evaluates with polynomial approximations: finite inputs, a looser tolerance
    approx = (2e-5, 2e-6)
    for op in ["Tanh", "Sigmoid", "Erf", "Softplus", "Mish", "HardSwish", "HardSigmoid"]:
        c[f"{op}-f32"] = Case(op, {"x": xf * 3}, opset=18, tol=approx)
    c["Gelu-none"] = Case("Gelu", {"x": xf * 3}, opset=20, tol=approx)
    c["Gelu-tanh"] = Case("Gelu", {"x": xf * 3}, attrs={"approximate": "tanh"}, opset=20, tol=approx)
    c["Softplus-large"] = Case("Softplus", {"x": np.array([-100.0, -30.0, 30.0, 100.0, 1e4], np.float32)})
    c["LeakyRelu"] = Case("LeakyRelu", {"x": x}, attrs={"alpha": 0.2})
    c["LeakyRelu-default"] = Case("LeakyRelu", {"x": x})
    c["Elu"] = Case("Elu", {"x": xf}, attrs={"alpha": 0.5}, tol=approx)
    c["Selu-default"] = Case("Selu", {"x": xf}, tol=approx)
    c["Selu"] = Case("Selu", {"x": xf}, attrs={"alpha": 2.0, "gamma": 3.0}, tol=approx)
    c["Celu"] = Case("Celu", {"x": xf}, attrs={"alpha": 2.0}, opset=12, tol=approx)
    c["HardSigmoid-attrs"] = Case("HardSigmoid", {"x": x}, attrs={"alpha": 0.3, "beta": 0.4})
    c["ThresholdedRelu"] = Case("ThresholdedRelu", {"x": x}, attrs={"alpha": 0.5}, opset=10)
    c["Swish"] = Case("Swish", {"x": xf}, opset=24, tol=approx)
    c["Swish-alpha"] = Case("Swish", {"x": xf}, attrs={"alpha": 0.5}, opset=24, tol=approx)
    c["SwiGLU"] = Case("SwiGLU", {"a": xf, "b": floats((3, 4), seed=11, edges=False)}, attrs={"alpha": 1.5},
                       opset=28, tol=approx)
    for pos, neg in [(1, 1), (1, 0), (0, 1), (0, 0)]:
        c[f"IsInf-{pos}{neg}"] = Case("IsInf", {"x": x}, attrs={"detect_positive": pos, "detect_negative": neg},
                                      opset=20, out=bool)
    # unary integer ops
    c["Relu-i32"] = Case("Relu", {"x": ints((3, 4))}, opset=14)
    c["Neg-i64"] = Case("Neg", {"x": ints((3, 4), np.int64)})
    c["Abs-i8"] = Case("Abs", {"x": ints((3, 4), np.int8)})
    c["Sign-i32"] = Case("Sign", {"x": ints((3, 4))})
    # clip: attributes before opset 11, optional inputs after
    c["Clip-10-attrs"] = Case("Clip", {"x": x}, attrs={"min": -0.5, "max": 0.5}, opset=10)
    c["Clip-10-min-only"] = Case("Clip", {"x": x}, attrs={"min": -0.5}, opset=10)
    c["Clip-13-consts"] = Case("Clip", {"x": x}, consts={"lo": np.array(-1.0, np.float32),
                                                         "hi": np.array(1.5, np.float32)}, opset=13)
    c["Clip-13-min>max"] = Case("Clip", {"x": x}, consts={"lo": np.array(1.0, np.float32),
                                                          "hi": np.array(-1.0, np.float32)}, opset=13)
    c["Clip-13-min-only"] = Case("Clip", {"x": x}, consts={"lo": np.array(0.0, np.float32)}, opset=13)
    c["Clip-13-max-only"] = Case("Clip", {"x": x}, consts={"hi": np.array(0.0, np.float32)},
                                 inputs=["x", "", "hi"], opset=13)
    c["Clip-13-none"] = Case("Clip", {"x": x}, opset=13)
    c["Clip-13-graph-inputs"] = Case("Clip", {"x": x, "lo": np.array(-0.25, np.float32),
                                              "hi": np.array(2.0, np.float32)}, opset=13)
    c["Clip-13-i32"] = Case("Clip", {"x": ints((3, 4))}, consts={"lo": np.array(-5, np.int32),
                                                                 "hi": np.array(7, np.int32)}, opset=13)
    big = np.iinfo(np.int64).max // 2 + 1
    c["Clip-13-i64-inexact"] = Case("Clip", {"x": np.array([-(2 ** 62) - 7, big + 5, 3, big - 1], np.int64)},
                                    consts={"lo": np.array(-(2 ** 62) - 3, np.int64), "hi": np.array(big, np.int64)},
                                    opset=13)
    # cast
    fin = floats((3, 4), seed=12, edges=False, scale=50.0)
    for src, dst in [(np.float32, np.int32), (np.float32, np.int64), (np.float32, np.uint8), (np.float64, np.int8)]:
        vals = np.clip(fin, np.iinfo(dst).min, np.iinfo(dst).max).astype(src)
        c[f"Cast-{np.dtype(src)}-{np.dtype(dst)}"] = Case(
            "Cast", {"x": vals}, attrs={"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, out=dst)
    for src, dst in [(np.float32, np.float16), (np.float32, np.float64), (np.float64, np.float32),
                     (np.float16, np.float32), (np.float32, np.bool_), (np.float32, BF16), (BF16, np.float32)]:
        c[f"Cast-{np.dtype(src)}-{np.dtype(dst)}"] = Case(
            "Cast", {"x": x.astype(src)}, attrs={"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, out=dst,
            reference=BF16 in (np.dtype(src), np.dtype(dst)))
    for src, dst in [(np.int64, np.float32), (np.int32, np.int8), (np.int64, np.uint16), (np.int32, np.bool_),
                     (np.bool_, np.float32), (np.uint8, np.int64)]:
        vals = bools((3, 4)) if src is np.bool_ else ints((3, 4), src, low=0 if src is np.uint8 else -70000,
                                                         high=250 if src is np.uint8 else 70000)
        c[f"Cast-{np.dtype(src)}-{np.dtype(dst)}"] = Case(
            "Cast", {"x": vals}, attrs={"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, out=dst)
    c["CastLike"] = Case("CastLike", {"x": fin}, consts={"like": np.zeros((1,), np.int64)}, opset=15, out=np.int64)
    c["Cast-same"] = Case("Cast", {"x": x}, attrs={"to": TensorProto.FLOAT})
    # where, shrink, binarizer
    c["Where-f32"] = Case("Where", {"c": bools((2, 1, 4)), "a": x, "b": y}, out=np.float32)
    c["Where-i64"] = Case("Where", {"c": bools((3, 4)), "a": ints((3, 4), np.int64), "b": ints((1,), np.int64)},
                          out=np.int64)
    c["Shrink"] = Case("Shrink", {"x": x}, opset=9)
    c["Shrink-bias"] = Case("Shrink", {"x": x}, attrs={"bias": 1.5, "lambd": 1.0}, opset=9)
    c["Shrink-i32"] = Case("Shrink", {"x": ints((3, 4))}, attrs={"bias": 2.0, "lambd": 3.0}, opset=9)
    c["Binarizer"] = Case("Binarizer", {"x": xf}, attrs={"threshold": 0.5}, domain="ai.onnx.ml")
    c["Binarizer-i64"] = Case("Binarizer", {"x": ints((3, 4), np.int64, low=-3, high=3)}, attrs={"threshold": -0.5},
                              domain="ai.onnx.ml")
    return [pytest.param(v, id=k) for k, v in c.items()]


@pytest.mark.parametrize("case", _cases())
def test_converter_matches_onnxruntime(case: Case) -> None:
    check_case(case)


def test_symbolic_batch_dim() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Clip", ["s", "lo"], ["y"])]
    graph = helper.make_graph(nodes, "g", [a, b], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(0.3, np.float32), "lo")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = import_onnx(model)
    assert [str(d) for d in module.main.results[0].shape] == ["N", "4"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 5):
        feeds = {"a": floats((n, 4), seed=n, edges=False), "b": floats((4,), seed=9, edges=False)}
        np.testing.assert_allclose(run_reference(module, feeds)[0], sess.run(None, feeds)[0], rtol=2e-5, atol=2e-6)


def _one_node(op: str, dtype: int, attrs: dict[str, Any], opset: int = 17) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="n0", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, [2])],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_float_only_op_on_ints_is_a_located_error() -> None:
    with pytest.raises(CuvilError, match="element type") as info:
        import_onnx(_one_node("Erf", TensorProto.INT32, {}))
    assert "n0" in str(info.value.location)


def test_unsupported_variants_are_reported() -> None:
    with pytest.raises(UnsupportedOpError, match="approximate"):
        import_onnx(_one_node("Gelu", TensorProto.FLOAT, {"approximate": "fast"}, opset=20))
    with pytest.raises(UnsupportedOpError, match="STRING"):
        import_onnx(_one_node("Cast", TensorProto.FLOAT, {"to": TensorProto.STRING}))
