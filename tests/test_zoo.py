"""The reference model zoo through both frontends: torch.export -> CIR and torch -> ONNX -> CIR,
run on the reference interpreter and compared with PyTorch eager (ONNX Runtime for the INT8 model).

Default tests use the reduced profile; the full-size models are @slow."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import cuvil  # noqa: E402
from bench.models import ZOO, ZOO_SMALL, ZooModel, agreement  # noqa: E402
from cuvil.ir.parser import parse_module  # noqa: E402
from tests.oracles import assert_agrees, ort_sums_u8s8_exactly  # noqa: E402

TORCH_MODELS = [n for n, m in ZOO.items() if m.has_torch_reference]
QUANTIZED_MODELS = [n for n, m in ZOO.items() if not m.has_torch_reference]


@cache
def _model(name: str, small: bool) -> tuple[ZooModel, Any, tuple]:
    entry = (ZOO_SMALL if small else ZOO)[name]
    return entry, entry.build(), entry.example_inputs()


@cache
def _onnx(name: str, small: bool) -> Any:
    return (ZOO_SMALL if small else ZOO)[name].to_onnx()


def _eager(model: Any, inputs: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*inputs)
    return [t.numpy() for t in torch.utils._pytree.tree_leaves(out)]


def _through_torch(name: str, small: bool) -> None:
    _entry, model, inputs = _model(name, small)
    module = cuvil.import_model(model, inputs)
    assert [p.name for p in module.main.params] and len(module.main.params) == len(inputs)
    assert parse_module(str(module)) == module  # the text form round-trips
    outs = cuvil.run_reference(module, [t.numpy() for t in inputs])
    assert_agrees(outs, _eager(model, inputs))


def _through_onnx(name: str, small: bool) -> None:
    entry, model, inputs = _model(name, small)
    module = cuvil.import_model(_onnx(name, small))
    assert [p.name for p in module.main.params] == list(entry.input_names)
    assert parse_module(str(module)) == module
    outs = cuvil.run_reference(module, [t.numpy() for t in inputs])
    assert_agrees(outs, _eager(model, inputs))


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_small_model_through_torch_export(name: str) -> None:
    _through_torch(name, small=True)


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_small_model_through_onnx(name: str) -> None:
    _through_onnx(name, small=True)


# full size: ResNet-18 and MobileNet at 224x224 and BERT at seq 128 take tens of seconds on the interpreter
@pytest.mark.slow
@pytest.mark.parametrize("name", TORCH_MODELS)
def test_full_model_through_torch_export(name: str) -> None:
    _through_torch(name, small=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCH_MODELS)
def test_full_model_through_onnx(name: str) -> None:
    _through_onnx(name, small=False)


# --------------------------------------------------------------------------------------
# INT8 (QDQ): ONNX Runtime is the oracle


def _output_step(proto: Any) -> float:
    """The quantization step of the graph output: the scale of the DequantizeLinear producing it."""
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    out = proto.graph.output[0].name
    producer = next(n for n in proto.graph.node if out in n.output)
    assert producer.op_type == "DequantizeLinear", producer.op_type
    return float(np.max(inits[producer.input[1]]))


SHALLOW_PRODUCTS = 3
"""Quantized products a model may chain before its outputs are compared element by element."""


def _with_activations(proto: Any) -> tuple[Any, int]:
    """``proto`` with its first quantized activations as extra outputs (after the model's own), and the
    number of quantized products (Conv, MatMul, Gemm) it chains."""
    from onnx import TensorProto, helper

    model = type(proto)()
    model.CopyFrom(proto)
    weights = {t.name for t in model.graph.initializer}
    acts = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in weights]
    for name in acts[:4]:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.INT8, None))
    products = sum(n.op_type in ("Conv", "MatMul", "Gemm") for n in model.graph.node)
    return model, products


def _int8_check(name: str, small: bool) -> None:
    entry = (ZOO_SMALL if small else ZOO)[name]
    proto, products = _with_activations(_onnx(name, small))
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    step = _output_step(proto)
    module = cuvil.import_model(proto)
    for batch_seed in range(3):
        x = [a * (1 + batch_seed) for a in entry.example_inputs_numpy()]
        got = cuvil.run_reference(module, x)
        # ONNX Runtime's fused int8 products are an oracle only where it sums them exactly (not on x86 without
        # VNNI: its pairs of products saturate in 16 bits); its unfused reading of the graph always is
        fused = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL,) if ort_sums_u8s8_exactly() else ()
        for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, *fused):
            opts = ort.SessionOptions()
            opts.graph_optimization_level = level
            sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            want = sess.run(None, dict(zip(entry.input_names, x, strict=True)))
            assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
            diff = float(np.max(np.abs(got[0].astype(np.float64) - want[0])))
            assert diff <= step * 1.0001, f"{diff} > one step {step} at {level}"
            if level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
                # The unfused graph computes what the QDQ semantics say, its float sums in another order:
                # ties aside, each quantized activation is bit-identical given identical inputs. So the
                # first activations are, and so is the output of a shallow model; through a deep one each
                # flipped step feeds the next layers' sums (ResNet-18: at most 7e-5 of the first block's
                # activations differ, 1.6 % after its fourth block, 14.5 % of the logits, by one step).
                for k, (g, w) in enumerate(zip(got[1:], want[1:], strict=True)):
                    assert np.mean(g == w) >= 0.999, f"quantized activation {k}: {np.mean(g == w)} identical"
                if products <= SHALLOW_PRODUCTS:
                    assert np.mean(got[0] == want[0]) >= 0.9


@pytest.mark.parametrize("name", QUANTIZED_MODELS)
def test_small_int8_model_matches_onnxruntime(name: str) -> None:
    _int8_check(name, small=True)


@pytest.mark.slow  # the full 784-512-512-10 model is quantized and calibrated on every run
@pytest.mark.parametrize("name", QUANTIZED_MODELS)
def test_full_int8_model_matches_onnxruntime(name: str) -> None:
    _int8_check(name, small=False)


def test_int8_model_stays_close_to_its_float_source() -> None:
    _entry, model, inputs = _model("mlp_int8", True)
    got = cuvil.run_reference(cuvil.import_model(_onnx("mlp_int8", True)), [t.numpy() for t in inputs])[0]
    assert agreement(got, _eager(model, inputs)[0]).cosine > 0.99


# --------------------------------------------------------------------------------------
# dynamic dims


def test_dynamic_batch_through_torch_export() -> None:
    entry, model, _ = _model("mlp", True)
    batch = torch.export.Dim("batch", min=1, max=128)
    module = cuvil.import_model(model, entry.example_inputs(batch=4), dynamic_shapes=({0: batch},))
    fn = module.main
    assert str(fn.params[0].shape[0]) == "batch"
    assert (fn.constraint("batch").lo, fn.constraint("batch").hi) == (1, 128)
    for b in (1, 64):
        inputs = entry.example_inputs(batch=b)
        assert_agrees(cuvil.run_reference(module, [t.numpy() for t in inputs]), _eager(model, inputs))


def test_dynamic_batch_and_sequence_in_the_encoder() -> None:
    from bench.models.bert import bert_inputs

    _entry, model, _ = _model("bert", True)
    Dim = torch.export.Dim
    module = cuvil.import_model(model, bert_inputs(True, 2, 16),
                                dynamic_shapes=({0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=32)},))
    assert [str(d) for d in module.main.params[0].shape] == ["batch", "seq"]
    assert module.main.constraint("seq").hi == 32
    assert parse_module(str(module)) == module
    for b, s in ((1, 7), (3, 32)):
        inputs = bert_inputs(True, b, s)
        assert_agrees(cuvil.run_reference(module, [t.numpy() for t in inputs]), _eager(model, inputs))


def test_dynamic_batch_through_onnx() -> None:
    entry, model, _ = _model("mlp", True)
    module = cuvil.import_model(entry.to_onnx(dynamic_batch=True))
    assert str(module.main.params[0].shape[0]) == "batch"
    for b in (2, 9):
        inputs = entry.example_inputs(batch=b)
        assert_agrees(cuvil.run_reference(module, [t.numpy() for t in inputs]), _eager(model, inputs))


# --------------------------------------------------------------------------------------
# the zoo itself


def test_registry_profiles() -> None:
    assert set(ZOO) == set(ZOO_SMALL)
    assert {"mlp", "mlp_b64", "resnet18", "mobilenet_v1", "bert", "mlp_int8"} <= set(ZOO)
    assert all(not m.small for m in ZOO.values()) and all(m.small for m in ZOO_SMALL.values())
    assert ZOO["mlp_b64"].example_inputs()[0].shape == (64, 784)
    assert ZOO["mlp"].example_inputs()[0].shape == (1, 784)
    assert ZOO["resnet18"].example_inputs()[0].shape == (1, 3, 224, 224)
    assert ZOO["mobilenet_v1"].example_inputs()[0].shape == (1, 3, 224, 224)
    ids = ZOO["bert"].example_inputs()[0]
    assert ids.shape == (1, 128) and ids.dtype == torch.int64


def test_builds_are_deterministic() -> None:
    entry = ZOO_SMALL["resnet18"]
    a, b = entry.build().state_dict(), entry.build().state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(entry.example_inputs()[0], entry.example_inputs()[0])


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_batchnorm_is_not_the_identity(name: str) -> None:
    _, model, _ = _model(name, True)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns
    for bn in bns:
        assert float(bn.running_mean.abs().max()) > 0.01
        assert float((bn.running_var - 1).abs().max()) > 0.01


def test_mobilenet_uses_depthwise_convolutions_and_relu6() -> None:
    _, model, _ = _model("mobilenet_v1", True)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert any(c.groups == c.in_channels > 1 for c in convs)
    assert any(isinstance(m, torch.nn.ReLU6) for m in model.modules())


def test_encoder_exported_to_onnx_keeps_gelu_in_its_product() -> None:
    """ONNX opsets before 20 have no Gelu: the export writes ``((erf(y / sqrt 2) + 1) * y) * 0.5``, reading the
    product ``y`` twice. At O3 each layer's erf still runs inside its feed-forward product's epilogue (no pass
    over the activation of its own), and the compiled library agrees with PyTorch eager."""
    from cuvil.passes.manager import run_pipeline

    _, model, inputs = _model("bert", True)
    module = cuvil.import_model(_onnx("bert", True))
    optimized = run_pipeline(module, "O3").module
    erf_homes = [v for v in optimized.main.ops() if v.op == "erf" or (v.op == "fused" and any(
        u.op == "erf" for u in v.attr("body").ops()))]
    layers = sum(isinstance(m, torch.nn.GELU) for m in model.modules())
    assert layers >= 2 and len(erf_homes) == layers
    assert all(v.attr("kind") == "epilogue" and next(iter(v.attr("body").ops())).op == "matmul"
               for v in erf_homes)
    compiled = cuvil.compile(module, cache=False)
    assert_agrees(compiled.run([t.numpy() for t in inputs]), _eager(model, inputs))
