"""An element over its row's ℓ2 norm (:mod:`verify.probe.normalized`): the bound ±1.25 holds on hostile
rows in float32, float16 and bfloat16 (zeros, one survivor, squares in the subnormal range, huge and tiny
together); the guard, floor and positive-norm forms are recognized and look-alikes are not; and a
float16 ONNX LpNormalization / ``F.normalize`` export over [-100, 100] is proved safe where PyTorch's and
ONNX Runtime's float16 results are finite."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil import import_model
from cuvil.interp import evaluate_values
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from verify.probe.bounds import BoundsEngine
from verify.probe.normalized import RATIO
from verify.probe.probe import OVERFLOW, SAFE, ProbeOptions, probe

N = 8


def _row_norm(b: Builder, a: object, widen: bool) -> object:
    sq = b.cast(a, to=DType.f32) if widen else a
    return b.sqrt(b.reduce_sum(b.mul(sq, sq), axes=(-1,), keepdims=True))


def _normalized(dtype: DType, form: str, widen: bool = False) -> Module:
    b = Builder()
    x = b.param("x", dtype, (4, N))
    norm = _row_norm(b, x, widen)
    if widen:
        norm = b.cast(norm, to=dtype)
    if form == "guard":
        zero = b.scalar(0, dtype)
        out = b.where(b.equal(norm, zero), zero, b.div(x, norm))
    elif form == "clip":
        out = b.div(x, b.clip(norm, min=1e-3))
    elif form == "max":
        out = b.div(x, b.max(norm, b.scalar(1e-3, dtype)))
    else:  # a bare quotient: needs a norm whose interval is positive
        out = b.div(x, norm)
    return b.module(b.function("main", [x], [out]))


def _hostile_rows(dtype: DType, rng: np.random.Generator) -> np.ndarray:
    info = np.finfo(dtype.np) if dtype is not DType.bf16 else None
    tiny = float(info.smallest_subnormal) if info is not None else 9.2e-41
    edge = np.sqrt(tiny)  # squares around the smallest subnormal
    rows = [np.zeros(N), np.eye(N)[0] * edge, np.eye(N)[3] * edge * 0.7, np.full(N, edge * 0.9),
            np.r_[edge * 1.3, np.full(N - 1, edge * 0.6)], np.r_[100.0, np.full(N - 1, edge)],
            rng.uniform(-100, 100, N), np.sign(rng.standard_normal(N)) * 100, rng.uniform(-1, 1, N) * edge * 3]
    return np.stack(rows)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.bf16])
@pytest.mark.parametrize("form", ["guard", "clip", "max"])
def test_the_ratio_bound_holds_on_hostile_rows(dtype: DType, form: str) -> None:
    module = _normalized(dtype, form)
    rng = np.random.default_rng(0)
    rows = _hostile_rows(dtype, rng)
    bounds = BoundsEngine(module.main, module.constants).run({"x": (np.full((4, N), -100.0), np.full((4, N), 100.0))})
    out = module.main.results[0]
    assert float(np.max(bounds.values[out].magnitude())) <= RATIO + 1e-12  # the fact gave the bound
    for start in range(0, len(rows), 4):
        batch = np.resize(rows[start:start + 4], (4, N)).astype(dtype.np)
        got = np.asarray(evaluate_values(module.main, module.constants, {"x": batch})[out], dtype=np.float64)
        assert np.all(np.isfinite(got)) and np.all(np.abs(got) <= RATIO)


def test_squares_of_a_widened_half_and_a_positive_norm() -> None:
    for module, lo in ((_normalized(DType.f16, "guard", widen=True), -1e3), (_normalized(DType.f32, "bare"), 1.0)):
        bounds = BoundsEngine(module.main, module.constants).run({"x": (np.full((4, N), lo), np.full((4, N), 1e3))})
        assert float(np.max(bounds.values[module.main.results[0]].magnitude())) <= RATIO + 1e-12
    # the bare quotient over a box that reaches zero may divide by zero: no fact
    module = _normalized(DType.f32, "bare")
    bounds = BoundsEngine(module.main, module.constants).run({"x": (np.full((4, N), -1.0), np.full((4, N), 1.0))})
    assert float(np.max(bounds.values[module.main.results[0]].magnitude())) > 1e30


def test_look_alikes_get_no_fact() -> None:
    """Another row's norm, a norm without keepdims' row alignment of the same value, and a floor of zero."""
    b = Builder()
    x = b.param("x", DType.f32, (4, N))
    y = b.param("y", DType.f32, (4, N))
    other = b.div(x, b.clip(_row_norm(b, y, False), min=1e-3))
    unfloored = b.div(x, b.clip(_row_norm(b, x, False), min=0.0))
    module = b.module(b.function("main", [x, y], [other, unfloored]))
    box = (np.full((4, N), -1.0), np.full((4, N), 1.0))
    bounds = BoundsEngine(module.main, module.constants).run({"x": box, "y": box})
    for r in module.main.results:
        assert float(np.max(bounds.values[r].hi)) > 10 * RATIO


def _onnx_normalize(op: str) -> bytes:
    """float16 rows normalized as exporters write it: LpNormalization, or F.normalize's ReduceL2 + Clip + Div."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    if op == "LpNormalization":
        nodes, inits = [helper.make_node(op, ["x"], ["y"], axis=1, p=2)], []
    else:
        inits = [numpy_helper.from_array(np.array(1e-4, np.float16), "eps")]
        nodes = [helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
                 helper.make_node("Clip", ["n", "eps"], ["c"]), helper.make_node("Div", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("op", ["LpNormalization", "normalize"])
def test_float16_normalization_is_proved_where_engines_are_finite(op: str) -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    model = _onnx_normalize(op)
    corner = np.full((2, 32), 100, np.float16)
    assert np.all(np.isfinite(torch.nn.functional.normalize(torch.from_numpy(corner), dim=1).numpy()))
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": corner})[0]
    assert np.all(np.isfinite(got)) and float(np.square(corner.astype(np.float32)).sum(axis=1).min()) > 65504
    rep = probe(import_model(model), {"x": (-100.0, 100.0)}, ProbeOptions(effort=5_000, boundary=False))
    assert rep.sites and all(s.verdict == SAFE for s in rep.sites)


def test_a_sum_of_half_squares_still_overflows() -> None:
    """ReduceSumSquare rounds its sum into float16, as ONNX Runtime's does: past 65504 it is inf, and the
    probe confirms it."""
    graph = helper.make_graph([helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[1], keepdims=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    rep = probe(import_model(model), {"x": (-100.0, 100.0)}, ProbeOptions(effort=5_000, boundary=False))
    assert any(s.verdict == OVERFLOW for s in rep.sites)
