"""ONNX Runtime's contrib ops (``com.microsoft``, and ``SimplifiedLayerNormalization``), which its graph optimizer
writes into the files it saves: each imported as Cuvil's own ops, run on the interpreter (and, for a network of
them, as a compiled library), and compared with ONNX Runtime, the oracle, over the ops' input forms and
optional inputs and outputs; a BERT that ``onnxruntime.transformers`` optimized compiles and agrees with it."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_testing import CONTRIB_OPSETS, contrib_model, ort_agrees

import cuvil
from cuvil.errors import ShapeError, UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.interp import run_reference
from tests.oracles import oracle_int8_weights, ort_sums_u8s8_exactly

OPSETS = CONTRIB_OPSETS

CASES: list[tuple[str, bool, dict[str, Any], list[str]]] = [
    ("Gelu", False, {}, ["gelu"]),
    ("BiasGelu", True, {}, ["add", "gelu"]),
    ("FastGelu", False, {}, ["gelu"]),
    ("FastGelu", True, {}, ["add", "gelu"]),
    ("QuickGelu", False, {}, ["mul", "sigmoid", "mul"]),
    ("QuickGelu", False, {"alpha": 1.0}, ["silu"]),
]


def _model(op: str, bias: bool, attrs: dict[str, Any]) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8])]
    if bias:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]))
    node = helper.make_node(op, [i.name for i in inputs], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


@pytest.mark.parametrize(("op", "bias", "attrs", "ops"), CASES, ids=[f"{c[0]}{'-bias' if c[1] else ''}"
                                                                      f"{'-alpha' if c[2] else ''}" for c in CASES])
def test_contrib_gelu_matches_onnxruntime(op: str, bias: bool, attrs: dict[str, Any], ops: list[str]) -> None:
    model = _model(op, bias, attrs)
    rng = np.random.default_rng(len(op))
    feeds = {"x": (rng.standard_normal((2, 3, 8)) * 3).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(8).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    module = import_onnx(model)
    assert [v.op for v in module.main.ops() if v.op != "const"] == ops
    (got,) = run_reference(module, list(feeds.values()))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    library = cuvil.compile(model, cache=False)
    np.testing.assert_allclose(np.asarray(library(*feeds.values())), want, rtol=2e-6, atol=2e-6)


def test_other_contrib_ops_are_refused_by_name() -> None:
    node = helper.make_node("MatMulNBits", ["x", "x"], ["y"], domain="com.microsoft", K=8, N=8, bits=4,
                            block_size=16)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=8)
    with pytest.raises(UnsupportedOpError, match="MatMulNBits"):
        import_onnx(model)


# -- the fusions: normalizations, products, embeddings, attention ------------------------------------------------

def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("beta", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("skip_shape", [(2, 3, 16), (3, 16)], ids=["skip-full", "skip-no-batch"])
@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv_std", "sum"], ["y", "", "", "sum"]],
                         ids=["y", "all", "sum"])
def test_skip_layer_normalization(beta: bool, bias: bool, skip_shape: tuple[int, ...], outputs: list[str]) -> None:
    rng = np.random.default_rng(len(outputs) + 2 * beta + 4 * bias + len(skip_shape))
    feeds = {"x": _f32(rng, 2, 3, 16, scale=3), "skip": _f32(rng, *skip_shape), "gamma": _f32(rng, 16),
             "beta": _f32(rng, 16) if beta else None, "bias": _f32(rng, 16) if bias else None}
    ort_agrees(contrib_model("SkipLayerNormalization", feeds, outputs, epsilon=1e-5), feeds, tol=1e-5)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_contrib_normalizations_default_epsilon(op: str) -> None:
    """Rows of tiny spread, where an epsilon of 1e-5 instead of the schemas' 1e-12 would flatten them."""
    rng = np.random.default_rng(13)
    feeds = {"x": _f32(rng, 2, 3, 16, scale=1e-4), "skip": _f32(rng, 2, 3, 16, scale=1e-4),
             "gamma": _f32(rng, 16)}
    ort_agrees(contrib_model(op, feeds, ["y"]), feeds, tol=1e-4)


def test_skip_layer_normalization_in_half_sums_and_normalizes_in_single() -> None:
    """A sum of halves rounded to half before normalizing would lose the skip's low bits: the op sums in f32."""
    rng = np.random.default_rng(5)
    feeds = {"x": _f32(rng, 2, 4, 32, scale=20).astype(np.float16), "skip": _f32(rng, 2, 4, 32).astype(np.float16),
             "gamma": _f32(rng, 32).astype(np.float16), "beta": _f32(rng, 32).astype(np.float16)}
    ort_agrees(contrib_model("SkipLayerNormalization", feeds, ["y", "", "", "sum"]), feeds, tol=2e-3)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [["y"], ["y", "", "inv_rms", "sum"]], ids=["y", "all"])
def test_skip_simplified_layer_normalization(bias: bool, outputs: list[str]) -> None:
    rng = np.random.default_rng(11 + bias)
    feeds = {"x": _f32(rng, 2, 3, 16, scale=3), "skip": _f32(rng, 2, 3, 16), "gamma": _f32(rng, 16),
             "bias": _f32(rng, 16) if bias else None}
    ort_agrees(contrib_model("SkipSimplifiedLayerNormalization", feeds, outputs, epsilon=1e-6), feeds, tol=1e-5)


def test_skip_simplified_layer_normalization_refuses_the_mean_output() -> None:
    rng = np.random.default_rng(0)
    feeds = {"x": _f32(rng, 2, 8), "skip": _f32(rng, 2, 8), "gamma": _f32(rng, 8)}
    with pytest.raises(UnsupportedOpError, match="mean"):
        import_onnx(contrib_model("SkipSimplifiedLayerNormalization", feeds, ["y", "mean"]))


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("outputs", [["y"], ["y", "inv_rms"]], ids=["y", "inv-rms"])
def test_simplified_layer_normalization(axis: int, outputs: list[str]) -> None:
    rng = np.random.default_rng(17 - axis)
    feeds = {"x": _f32(rng, 2, 3, 8, scale=4), "scale": _f32(rng, *((3, 8) if axis == 1 else (8,)))}
    ort_agrees(contrib_model("SimplifiedLayerNormalization", feeds, outputs, domain="", axis=axis), feeds, tol=1e-5)


@pytest.mark.parametrize(("a_shape", "b_shape", "attrs"), [
    ((3, 4), (4, 5), {}),
    ((4, 3), (4, 5), {"transA": 1}),
    ((3, 4), (5, 4), {"transB": 1, "alpha": 0.125}),
    ((2, 4, 3), (2, 5, 4), {"transA": 1, "transB": 1, "alpha": -2.0}),
    ((2, 3, 4), (4, 5), {"alpha": 0.5}),
], ids=["plain", "transA", "transB-alpha", "batched-both", "broadcast-alpha"])
def test_fused_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(len(a_shape) * 7 + len(attrs))
    feeds = {"a": _f32(rng, *a_shape), "b": _f32(rng, *b_shape)}
    ort_agrees(contrib_model("FusedMatMul", feeds, ["y"], **attrs), feeds, tol=1e-5)


def test_fused_matmul_refuses_batch_transposes() -> None:
    rng = np.random.default_rng(0)
    feeds = {"a": _f32(rng, 2, 3, 4), "b": _f32(rng, 2, 4, 5)}
    with pytest.raises(UnsupportedOpError, match="transBatchA"):
        import_onnx(contrib_model("FusedMatMul", feeds, ["y"], transBatchA=1))


def test_bias_add() -> None:
    """ONNX Runtime runs BiasAdd on GPUs only: the oracle is its definition, ``(X + bias) + skip``, in f32."""
    rng = np.random.default_rng(1)
    x, bias, skip = _f32(rng, 2, 3, 8), _f32(rng, 8), _f32(rng, 2, 3, 8)
    (got,) = run_reference(import_onnx(contrib_model("BiasAdd", {"x": x, "bias": bias, "skip": skip}, ["y"])),
                           [x, bias, skip])
    np.testing.assert_array_equal(got, (x + bias) + skip)


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [None, [[1, 1, 1, 0, 0], [1, 2, 0, 1, 1]], [[0, 1, 1, 1, 1], [-1, 3, 1, 1, 0]]],
                         ids=["no-mask", "mask", "mask-odd-values"])
@pytest.mark.parametrize("position_ids", [None, (1, 5), (2, 5)], ids=["positions", "pos-ids-shared", "pos-ids"])
def test_embed_layer_normalization(segments: bool, mask: list[list[int]] | None,
                                   position_ids: tuple[int, int] | None) -> None:
    """``mask_index`` counts the entries equal to 1 (ONNX Runtime's kernel), not the non-zero ones."""
    rng = np.random.default_rng(3 * segments + (0 if mask is None else len(mask[1])))
    feeds: dict[str, np.ndarray | None] = {
        "ids": rng.integers(0, 10, (2, 5)).astype(np.int32),
        "seg": rng.integers(0, 2, (2, 5)).astype(np.int32) if segments else None,
        "word": _f32(rng, 10, 16), "pos": _f32(rng, 7, 16),
        "segment": _f32(rng, 2, 16) if segments else None,
        "gamma": _f32(rng, 16), "beta": _f32(rng, 16),
        "mask": None if mask is None else np.asarray(mask, dtype=np.int32),
        "pos_ids": None if position_ids is None else rng.integers(0, 7, position_ids).astype(np.int32),
    }
    got = ort_agrees(contrib_model("EmbedLayerNormalization", feeds, ["y", "mask_index", "sum"]), feeds, tol=1e-5)
    if mask is not None:
        assert got[1].tolist() == [sum(v == 1 for v in row) for row in mask]


_B, _S, _HIN, _HEADS = 2, 5, 8, 2


def _attention_feeds(rng: np.random.Generator, sizes: tuple[int, int, int]) -> dict[str, np.ndarray | None]:
    return {"x": _f32(rng, _B, _S, _HIN), "w": _f32(rng, _HIN, sum(sizes), scale=0.5), "bias": _f32(rng, sum(sizes))}


_MASKS: dict[str, np.ndarray] = {
    "end": np.array([3, 1], np.int32),
    "end-start": np.array([4, 5, 1, 0], np.int32),
    "keys": np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1]], np.int32),
    "keys-none-left": np.array([[0, 0, 0, 0, 0], [2, 0, -1, 0, 1]], np.int32),
    "queries-keys": (np.random.default_rng(9).random((_B, _S, _S)) > 0.4).astype(np.int32),
}


@pytest.mark.parametrize("mask", [None, *_MASKS], ids=lambda m: m or "no-mask")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_attention_masks(mask: str | None, causal: bool) -> None:
    """Each ``mask_index`` form, alone and with a causal mask: a hidden key's score is offset by
    ``mask_filter_value`` (a row with every key hidden attends over them all), a later key is removed."""
    rng = np.random.default_rng(23 + causal)
    sizes = (8, 8, 8)
    feeds = {**_attention_feeds(rng, sizes), "mask": None if mask is None else _MASKS[mask]}
    ort_agrees(contrib_model("Attention", feeds, ["y"], num_heads=_HEADS, unidirectional=int(causal)), feeds, tol=2e-5)


@pytest.mark.parametrize(("sizes", "attrs"), [
    ((8, 8, 6), {"qkv_hidden_sizes": [8, 8, 6]}),
    ((8, 8, 8), {"scale": 0.3, "mask_filter_value": -50.0}),
], ids=["qkv-sizes", "scale-filter"])
def test_attention_attributes(sizes: tuple[int, int, int], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(31)
    feeds = {**_attention_feeds(rng, sizes), "mask": _MASKS["keys"]}
    ort_agrees(contrib_model("Attention", feeds, ["y"], num_heads=_HEADS, **attrs), feeds, tol=2e-5)


def test_attention_bias_input() -> None:
    rng = np.random.default_rng(37)
    feeds = {**_attention_feeds(rng, (8, 8, 8)), "mask": None, "past": None,
             "attention_bias": _f32(rng, 1, _HEADS, _S, _S)}
    ort_agrees(contrib_model("Attention", feeds, ["y"], num_heads=_HEADS), feeds, tol=2e-5)


def test_attention_refuses_a_cache_and_bad_sizes() -> None:
    rng = np.random.default_rng(0)
    feeds = {**_attention_feeds(rng, (8, 8, 8)), "mask": None, "past": _f32(rng, 2, _B, _HEADS, 3, 4)}
    with pytest.raises(UnsupportedOpError, match="past"):
        import_onnx(contrib_model("Attention", feeds, ["y"], num_heads=_HEADS))
    feeds = _attention_feeds(rng, (8, 8, 8))
    for heads in (0, -2):
        with pytest.raises(ShapeError, match="num_heads"):
            import_onnx(contrib_model("Attention", feeds, ["y"], num_heads=heads))
    with pytest.raises(ShapeError, match="qkv_hidden_sizes"):
        import_onnx(contrib_model("Attention", feeds, ["y"], num_heads=_HEADS, qkv_hidden_sizes=[8, 6, 10]))


# -- a network ONNX Runtime's transformer optimizer rewrote ------------------------------------------------------


def _optimized_bert(tmp_path: Any) -> tuple[str, set[str]]:
    """A two-layer BERT built from its config, exported with dynamic batch and sequence axes, then fused by
    ``onnxruntime.transformers.optimizer`` (EmbedLayerNormalization, Attention, SkipLayerNormalization,
    BiasGelu); returns the file and the contrib ops in it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(vocab_size=100, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        bert = transformers.BertModel(config).eval()
        for p in bert.parameters():  # no ones and zeros: every gamma and beta its own
            p.data.add_(torch.randn_like(p) * 0.05)
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    example = tuple(torch.ones(2, 8, dtype=torch.int64) for _ in names)
    exported = str(tmp_path / "bert.onnx")
    with warnings.catch_warnings():  # the TorchScript exporter's notices (deprecation, tracing)
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(), example, exported, input_names=names, output_names=["hidden"], opset_version=17,
                          dynamo=False, dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "hidden"]})
    optimized = optimizer.optimize_model(exported, model_type="bert", num_heads=4, hidden_size=32)
    path = str(tmp_path / "bert_optimized.onnx")
    optimized.save_model_to_file(path)
    return path, {n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft"}


@pytest.mark.parametrize("quantized", [False, True], ids=["fused", "fused-quantized"])
def test_bert_optimized_by_onnxruntime_compiles_and_agrees(tmp_path: Any, quantized: bool) -> None:
    """The fused BERT, and the same quantized dynamically (QAttention, QEmbedLayerNormalization, integer
    products), as ONNX Runtime's BERT quantization recipe makes it."""
    path, contrib = _optimized_bert(tmp_path)
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"} <= contrib
    if quantized:
        quantization = pytest.importorskip("onnxruntime.quantization")
        quantized_path = str(tmp_path / "bert_quantized.onnx")
        quantization.quantize_dynamic(path, quantized_path, weight_type=quantization.QuantType.QInt8,
                                      reduce_range=not ort_sums_u8s8_exactly(),
                                      extra_options={"DefaultTensorType": TensorProto.FLOAT})
        path = quantized_path
        assert {"QAttention", "QEmbedLayerNormalization"} <= {
            n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft"}
    library = cuvil.compile(path, cache=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq in ((2, 8), (3, 13)):
        ids = rng.integers(0, 100, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[1, seq // 2:] = 0  # a right-padded row: its keys past the end are hidden
        types = rng.integers(0, 2, (batch, seq)).astype(np.int64)
        (want,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        got = np.asarray(library(ids, mask, types))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


_CONV_ACTIVATIONS: list[tuple[str, list[float]]] = [
    ("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 1.5]),
    ("HardSigmoid", [0.3, 0.4]),
]


@pytest.mark.parametrize(("activation", "params"), _CONV_ACTIVATIONS, ids=[a for a, _ in _CONV_ACTIVATIONS])
@pytest.mark.parametrize("with_sum", [False, True], ids=["", "sum"])
def test_fused_conv(activation: str, params: list[float], with_sum: bool) -> None:
    rng = np.random.default_rng(len(activation) + with_sum)
    feeds = {"x": _f32(rng, 1, 3, 7, 7), "w": _f32(rng, 4, 3, 3, 3), "b": _f32(rng, 4),
             "z": _f32(rng, 1, 4, 4, 4) if with_sum else None}
    attrs: dict[str, Any] = {"activation": activation, "pads": [1, 1, 1, 1], "strides": [2, 2]}
    if params:
        attrs["activation_params"] = params
    ort_agrees(contrib_model("FusedConv", feeds, ["y"], **attrs), feeds, tol=1e-5)


@pytest.mark.parametrize(("activation", "params"), [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {"activation_alpha": 0.3}),
], ids=["Relu", "Sigmoid", "Tanh", "LeakyRelu"])
def test_fused_gemm(activation: str, params: dict[str, float]) -> None:
    rng = np.random.default_rng(len(activation))
    feeds = {"a": _f32(rng, 3, 5), "b": _f32(rng, 4, 3), "c": _f32(rng, 4)}  # A and B stored transposed
    ort_agrees(contrib_model("FusedGemm", feeds, ["y"], activation=activation, transA=1, transB=1, alpha=0.5, beta=2.0,
                        **params), feeds, tol=1e-5)


def test_an_unknown_fused_activation_is_refused_by_name() -> None:
    rng = np.random.default_rng(0)
    feeds = {"x": _f32(rng, 1, 3, 5, 5), "w": _f32(rng, 4, 3, 3, 3)}
    with pytest.raises(UnsupportedOpError, match="Swoosh"):
        import_onnx(contrib_model("FusedConv", feeds, ["y"], activation="Swoosh"))


def test_layout_ops_of_a_model_saved_at_onnxruntimes_top_level_get_a_hint() -> None:
    rng = np.random.default_rng(0)
    feeds = {"x": _f32(rng, 1, 8, 5, 5), "w": _f32(rng, 8, 8, 3, 3)}
    with pytest.raises(UnsupportedOpError, match="ORT_ENABLE_EXTENDED"):
        import_onnx(contrib_model("Conv", feeds, ["y"], domain="com.microsoft.nchwc"))


def test_zoo_models_saved_by_an_onnxruntime_session_compile_and_agree(tmp_path: Any) -> None:
    """A session at ORT_ENABLE_EXTENDED saves FusedConv (ResNet), FusedGemm (the MLP), FusedMatMul, Gelu and
    SkipLayerNormalization (BERT) into its optimized model."""
    pytest.importorskip("torch")
    from bench.models import ZOO_SMALL

    seen: set[str] = set()
    for name in ("resnet18", "mlp", "bert"):
        zoo = ZOO_SMALL[name]
        source, saved = tmp_path / f"{name}.onnx", tmp_path / f"{name}.saved.onnx"
        onnx.save(zoo.to_onnx(), str(source))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(saved)
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        seen |= {n.op_type for n in onnx.load(str(saved)).graph.node if n.domain == "com.microsoft"}
        inputs = zoo.example_inputs_numpy()
        want = session.run(None, dict(zip(zoo.input_names, inputs, strict=True)))[0]
        got = cuvil.compile(str(saved), cache=False)(*inputs)
        np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, tuple) else got), want, rtol=1e-4, atol=1e-4)
    assert {"FusedConv", "FusedGemm", "FusedMatMul", "SkipLayerNormalization"} <= seen


_MHA_FORMS = ["separate", "separate-bias", "cross", "heads-first-kv", "packed-qkv"]


@pytest.mark.parametrize("form", _MHA_FORMS)
@pytest.mark.parametrize("mask", [None, "keys", "end"], ids=lambda m: m or "no-mask")
def test_multi_head_attention(form: str, mask: str | None) -> None:
    """Each input layout, with and without a key padding mask ([batch, keys] or end positions)."""
    rng = np.random.default_rng(len(form) * 3 + (0 if mask is None else len(mask)))
    heads, head, queries = 2, 4, 5
    keys = 7 if form in ("cross", "heads-first-kv") else queries
    feeds: dict[str, np.ndarray | None]
    if form == "packed-qkv":
        feeds = {"q": _f32(rng, _B, queries, heads, 3, head)}
    elif form == "heads-first-kv":
        feeds = {"q": _f32(rng, _B, queries, heads * head), "k": _f32(rng, _B, heads, keys, head),
                 "v": _f32(rng, _B, heads, keys, head)}
    else:
        feeds = {"q": _f32(rng, _B, queries, heads * head), "k": _f32(rng, _B, keys, heads * head),
                 "v": _f32(rng, _B, keys, heads * head),
                 "bias": _f32(rng, 3 * heads * head) if form == "separate-bias" else None}
    if mask is not None:
        feeds = {**{n: feeds.get(n) for n in ("q", "k", "v", "bias")},
                 "mask": (rng.random((_B, keys)) > 0.3).astype(np.int32) if mask == "keys"
                 else np.array([keys - 2, 3], np.int32)}
    model = contrib_model("MultiHeadAttention", feeds, ["y"], num_heads=heads)
    if form != "packed-qkv":
        ort_agrees(model, feeds, tol=2e-5)
        return
    # ONNX Runtime's CPU kernel has no packed form: the oracle is its run of the same Q, K and V unpacked
    packed = feeds["q"]
    assert packed is not None
    parts = {n: np.ascontiguousarray(packed[:, :, :, i, :].reshape(_B, queries, heads * head))
             for i, n in enumerate("qkv")}
    unpacked = {**parts, "bias": None, **({"mask": feeds["mask"]} if mask is not None else {})}
    (want,) = ort.InferenceSession(contrib_model("MultiHeadAttention", unpacked, ["y"], num_heads=heads)
                                   .SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {n: a for n, a in unpacked.items() if a is not None})
    (got,) = run_reference(import_onnx(model), [a for a in feeds.values() if a is not None])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_multi_head_attention_causal_scaled_with_bias() -> None:
    rng = np.random.default_rng(41)
    feeds = {"q": _f32(rng, _B, 5, 8), "k": _f32(rng, _B, 5, 8), "v": _f32(rng, _B, 5, 6), "bias": None,
             "mask": None, "attention_bias": _f32(rng, 1, 2, 5, 5)}
    ort_agrees(contrib_model("MultiHeadAttention", feeds, ["y"], num_heads=2, unidirectional=1, scale=0.4), feeds,
               tol=2e-5)


@pytest.mark.parametrize("layout", ["bnsh", "bsd"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("positions", ["rows", "start"])
@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_ms_rotary_embedding(layout: str, interleaved: int, positions: str, partial: bool) -> None:
    """ONNX Runtime's rotary embedding: heads-first or [B, S, N*H] input (num_heads), halves or interleaved
    pairs, per-row positions or one start position, all or the first half of each head rotated."""
    rng = np.random.default_rng(interleaved * 5 + len(layout) + partial)
    heads, head, seq, cache = 2, 8, 5, 16
    rot = head // 2 if partial else head
    x = _f32(rng, _B, heads, seq, head) if layout == "bnsh" else _f32(rng, _B, seq, heads * head)
    angles = rng.random((cache, rot // 2)) * 3
    pos = (rng.integers(0, cache - seq, (_B, seq)) if positions == "rows" else np.array([3])).astype(np.int64)
    feeds = {"x": x, "pos": pos, "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    attrs: dict[str, Any] = {"interleaved": interleaved}
    if layout == "bsd" or partial:
        attrs["num_heads"] = heads
    if partial:
        attrs["rotary_embedding_dim"] = rot
    ort_agrees(contrib_model("RotaryEmbedding", feeds, ["y"], **attrs), feeds, tol=1e-5)


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
@pytest.mark.parametrize("mask", [None, "keys"], ids=lambda m: m or "no-mask")
def test_q_attention(per_column: bool, mask: str | None) -> None:
    """An integer projection (uint8 input, int8 weights) scaled back to float, then Attention."""
    rng = np.random.default_rng(7 + per_column)
    width = 24
    feeds: dict[str, np.ndarray | None] = {
        "x": rng.integers(0, 256, (_B, _S, _HIN)).astype(np.uint8),
        "w": oracle_int8_weights(rng, _HIN, width), "bias": _f32(rng, width),
        "x_scale": np.array(0.02, np.float32),
        "w_scale": (rng.random(width) * 0.01 + 0.005).astype(np.float32) if per_column
        else np.array(0.01, np.float32),
        "mask": None if mask is None else _MASKS["keys"], "x_zp": np.array(128, np.uint8),
        "w_zp": np.zeros(width, np.int8) if per_column else np.array(0, np.int8)}
    ort_agrees(contrib_model("QAttention", feeds, ["y"], num_heads=_HEADS), feeds, tol=2e-5)
