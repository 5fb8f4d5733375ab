"""ONNX models as adapter bases: modules named by the exporter's initializer names, or by the model
the adapter was trained on (weights matched by content) where the exporter renamed them; a merge
written back to ONNX holds the proved merged weights, checked against ONNX Runtime as an oracle."""

from __future__ import annotations

import copy
import io
import json

import numpy as np
import onnx
import pytest
import torch
from lora_models import save_adapter

import cuvil
from cuvil.cli import main
from cuvil.interp import run_reference
from lora import AdapterError, BaseModel
from lora.merge import merge_adapters, site_weights
from lora.onnx_base import base_from_onnx, write_merged

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")


def _export(model: torch.nn.Module, example: torch.Tensor, path) -> None:
    buf = io.BytesIO()
    torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=17, input_names=["x"])
    path.write_bytes(buf.getvalue())


def _mlp() -> torch.nn.Module:
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()


def _peft_forward(model: torch.nn.Module, adapter_dir, x: np.ndarray) -> np.ndarray:
    import peft

    with torch.no_grad():
        return peft.PeftModel.from_pretrained(copy.deepcopy(model), adapter_dir).eval()(torch.from_numpy(x)).numpy()


def test_an_onnx_base_is_checked_and_merged_to_onnx(tmp_path, capsys):
    model = _mlp()
    _export(model, torch.zeros(4, 16), tmp_path / "m.onnx")
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=4, lora_alpha=8, target_modules=["0", "2"])
    base = base_from_onnx(tmp_path / "m.onnx")
    assert {n: m.kind for n, m in base.modules.items()} == {"0": "linear", "2": "linear"}
    for name, module in base.modules.items():  # PyTorch's layout, whatever the exporter stored
        np.testing.assert_array_equal(module.weight, saved.base.modules[name].weight)
    assert main(["lora", "check", "--base", str(tmp_path / "m.onnx"), "--adapter", str(saved.directory), "-q"]) == 0
    out, cert = tmp_path / "merged.onnx", tmp_path / "cert.json"
    code = main(["lora", "merge", "--base", str(tmp_path / "m.onnx"), "--adapter", str(saved.directory), "-o",
                 str(out), "--certificate", str(cert), "--range", "x=-1:1"])
    assert code == 0, capsys.readouterr().err
    x = np.random.default_rng(0).uniform(-1, 1, (4, 16)).astype(np.float32)
    want = _peft_forward(model, saved.directory, x)
    got = run_reference(cuvil.import_model(str(out)), [x])[0]
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    oracle = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(oracle, want, rtol=1e-5, atol=1e-6)
    replaced = {t.name for t, o in zip(onnx.load(str(out)).graph.initializer,
                                       onnx.load(str(tmp_path / "m.onnx")).graph.initializer, strict=True)
                if t.raw_data != o.raw_data}
    assert replaced == {"0.weight", "2.weight"}
    certificate = json.loads(cert.read_text())
    assert certificate["summary"]["proved"] == certificate["summary"]["obligations"] >= 2


def test_a_convolutional_onnx_base_is_merged_to_onnx(tmp_path, capsys):
    """Conv weights keep their names in the export: the modules are found, the convolution adapters merged
    and written back, and ONNX Runtime on the merged file computes PEFT's unmerged forward."""
    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(6, 4, 3, 2, 1)).eval()
    _export(model, torch.zeros(1, 3, 8, 8), tmp_path / "m.onnx")
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=4, target_modules=["0", "2"])
    base = base_from_onnx(tmp_path / "m.onnx")
    assert {n: m.kind for n, m in base.modules.items()} == {"0": "conv", "2": "conv"}
    out = tmp_path / "merged.onnx"
    code = main(["lora", "merge", "--base", str(tmp_path / "m.onnx"), "--adapter", str(saved.directory), "-o",
                 str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    want = _peft_forward(model, saved.directory, x)
    oracle = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(oracle, want, rtol=1e-5, atol=1e-6)


def test_renamed_weights_are_named_by_the_trained_model(tmp_path):
    """An exporter that transposes a weight for MatMul renames it (onnx::MatMul_N): the module names
    come from the model the adapter was trained on, its weights found in the ONNX model by content."""
    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 6)).eval()
    ids = torch.randint(0, 20, (2, 5))
    _export(model, ids, tmp_path / "m.onnx")
    assert "1" not in base_from_onnx(tmp_path / "m.onnx").modules  # the linear weight lost its name
    saved = save_adapter(copy.deepcopy(model), tmp_path / "a", r=2, lora_alpha=4, target_modules=["0", "1"])
    module = cuvil.import_model(str(tmp_path / "m.onnx"))
    result = merge_adapters(module, BaseModel.from_torch(model), saved.load())
    assert result.verification.proved
    write_merged(tmp_path / "m.onnx", site_weights(result, BaseModel.from_torch(model), saved.load()),
                 tmp_path / "merged.onnx")
    want = _peft_forward(model, saved.directory, ids.numpy())
    got = ort.InferenceSession(str(tmp_path / "merged.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"x": ids.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_initializer_shared_with_an_unadapted_op_is_not_overwritten(tmp_path):
    """Tied weights: an embedding table the output layer reads too. Adapting the embedding changes the
    lookup only; the ONNX initializer cannot hold both, so the ONNX merge is refused by name."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(3).standard_normal((20, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb.weight", "ids"], ["h"], axis=0),
         helper.make_node("Transpose", ["emb.weight"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["h", "wt"], ["y"])],
        "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 20])],
        [numpy_helper.from_array(table, "emb.weight")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "t.onnx"))
    torch.manual_seed(13)
    twin = torch.nn.ModuleDict({"emb": torch.nn.Embedding(20, 8)})
    with torch.no_grad():
        twin["emb"].weight.copy_(torch.from_numpy(table))
    saved = save_adapter(copy.deepcopy(twin), tmp_path / "a", r=2, lora_alpha=2, target_modules=["emb"])
    base = base_from_onnx(tmp_path / "t.onnx")
    assert base.modules["emb"].kind == "embedding"
    module = cuvil.import_model(str(tmp_path / "t.onnx"))
    result = merge_adapters(module, base, saved.load())
    assert result.verification.proved
    with pytest.raises(AdapterError, match=r"'emb\.weight' is read by 2 ops, 1 of them adapted"):
        write_merged(tmp_path / "t.onnx", site_weights(result, base, saved.load()), tmp_path / "merged.onnx")
    assert not (tmp_path / "merged.onnx").exists()
