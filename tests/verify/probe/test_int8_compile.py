"""QDQ models at O3: their quantized matmuls and convs run in int8 x int8 -> int32 (quantize-int8, on
the VNNI kernels where the host has them) when the prober proves no int32 accumulator wraps for any
input; the decision is in the manifest; the library is bit for bit the lowered program's rule and
within one output quantization step of ONNX Runtime's integer run; an accumulator that could wrap,
or int8=False, keeps the float QDQ graph."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from bench.models import ZOO_SMALL
from cuvil.codegen.kernels.vnni import host_int8_dot
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.oracles import rule_reference
from verify.probe.int8_policy import plan_int8

pytestmark = pytest.mark.usefixtures("private_cache")


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that produces the graph's output (one quantization step)."""
    out = model.graph.output[0].name
    node = next(n for n in model.graph.node if out in n.output)
    assert node.op_type == "DequantizeLinear"
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(inits[node.input[1]])


def _ort(model: onnx.ModelProto, xs: list[np.ndarray]) -> np.ndarray:
    """ONNX Runtime's reading of the QDQ graph as written (DequantizeLinear, the float op, QuantizeLinear). Its
    fused int8 kernels depend on the CPU: without VNNI they multiply pairs of bytes with ``vpmaddubsw``, whose
    16-bit sums saturate (seen on a Zen 3: the zoo's int8 MLP six steps off the exact sums)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: x for i, x in zip(s.get_inputs(), xs, strict=True)})[0]


@pytest.mark.parametrize("name", ["mlp_int8", "resnet18_int8"])
def test_qdq_model_runs_integer_products_within_a_step_of_onnxruntime(name: str) -> None:
    zm = ZOO_SMALL[name]
    model = zm.to_onnx()
    compiled = cuvil.compile(model)
    entry = compiled.manifest["int8"]
    assert entry["applied"] and entry["integer_products"] > 0
    assert entry["int32_sites"] == entry["int32_sites_proved"] > 0
    if host_int8_dot() is not None:
        kernels = compiled.manifest["kernels"]
        steps = {"avx2", "pairs"} if host_int8_dot() == "avx2" else {host_int8_dot()}  # (pairs: vnni.pairs_fit)
        assert any(k.startswith("int8.") and k.split(".")[1] in steps for k in kernels), kernels
    step = _output_step(model)
    plan = plan_int8(cuvil.import_model(model))
    rng = np.random.default_rng(5)
    for _ in range(3):
        xs = [rng.standard_normal(x.shape).astype(np.float32) for x in zm.example_inputs_numpy()]
        got = np.asarray(compiled(*xs))
        assert np.array_equal(got, rule_reference(plan.module, xs)[0])  # the lowered program, bit for bit
        assert np.max(np.abs(got - _ort(model, xs))) <= step * (1 + 1e-6)


def test_int8_false_compiles_the_float_qdq_graph() -> None:
    compiled = cuvil.compile(ZOO_SMALL["mlp_int8"].to_onnx(), int8=False)
    assert "int8" not in compiled.manifest
    assert not any(k.startswith("int8.") for k in compiled.manifest["kernels"])


def _qdq_dot(k: int) -> onnx.ModelProto:
    """x[1, k] . w[k, 1] in QDQ form, every weight 127 and x's zero point -128: an int32 accumulator of k
    products of up to 255 * 127 (it can wrap once k > 66,311)."""
    w = np.full((k, 1), 127, dtype=np.int8)
    f32 = TensorProto.FLOAT
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (np.float32(0.02), "sx"), (np.int8(-128), "zx"), (w, "wq"), (np.float32(0.01), "sw"), (np.int8(0), "zw"),
        (np.float32(50.0), "sy"), (np.int8(0), "zy")]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"])]
    graph = helper.make_graph(nodes, "dot", [helper.make_tensor_value_info("x", f32, [1, k])],
                              [helper.make_tensor_value_info("out", f32, [1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_accumulator_that_could_wrap_keeps_the_float_graph() -> None:
    small, large = (cuvil.import_model(_qdq_dot(k)) for k in (1000, 70_000))  # 255 * 128 * 70,000 > 2^31
    assert plan_int8(small).applied
    plan = plan_int8(large)
    assert not plan.applied and plan.proved < plan.accumulators and "not proved" in plan.reason
    assert plan.module is large


def test_a_model_without_qdq_is_not_planned() -> None:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    module = b.module(b.function("main", [x], [b.relu(x)]))
    assert not plan_int8(module).applied
    assert "int8" not in cuvil.compile(module).manifest


def test_cli_reports_the_int8_decision(tmp_path: Path) -> None:
    path = tmp_path / "dot.onnx"
    onnx.save(_qdq_dot(64), path)
    run = subprocess.run([sys.executable, "-m", "cuvil", "compile", str(path), "-o", str(tmp_path / "libdot.so")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "int8      1 quantized products" in run.stdout
    assert json.loads((tmp_path / "dot.json").read_text())["int8"]["applied"]
    off = subprocess.run([sys.executable, "-m", "cuvil", "compile", str(path), "-o", str(tmp_path / "libf.so"),
                          "--no-int8"], capture_output=True, text=True, timeout=300)
    assert off.returncode == 0, off.stderr
    assert "int8" not in json.loads((tmp_path / "f.json").read_text())
