"""``cuvil lora check`` end to end: a saved Hugging Face base and a PEFT adapter, exit codes, the
report files, and a coded error for a base it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft", reason="peft comes with the dev extra")
transformers = pytest.importorskip("transformers", reason="transformers comes with the dev extra")

from cuvil.cli import main  # noqa: E402
from lora.safetensors_file import SafetensorsFile, write_safetensors  # noqa: E402


def _saved_pair(tmp_path: Path, scale_b: float = 1.0) -> tuple[Path, Path]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base_dir, safe_serialization=True)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(model, lora).save_pretrained(adapter_dir)
    if scale_b != 1.0:
        path = adapter_dir / "adapter_model.safetensors"
        f = SafetensorsFile(path)
        tensors = {k: f.array(k) * (scale_b if ".lora_B." in k else 1.0) for k in f}
        write_safetensors(path, {k: v.astype("float32") for k, v in tensors.items()})
    return base_dir, adapter_dir


def test_a_correct_adapter_passes_and_reports(tmp_path, capsys):
    base, adapter = _saved_pair(tmp_path)
    out = tmp_path / "r.json"
    code = main(["lora", "check", "--base", str(base), "--adapter", str(adapter), "--json", str(out),
                 "--sarif", str(tmp_path / "r.sarif")])
    assert code == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    measured = [r for r in report["results"] if r["rule"] == "lora-module-measured"]
    assert len(measured) == 2 and all(r["kind"] == "pass" for r in report["results"])
    assert {r["location"]["component"] for r in measured} == {"model.layers.0.self_attn.q_proj",
                                                              "model.layers.0.self_attn.v_proj"}
    assert json.loads((tmp_path / "r.sarif").read_text())["version"] == "2.1.0"


def test_an_fp16_overflowing_merge_exits_1_and_names_the_module(tmp_path, capsys):
    base, adapter = _saved_pair(tmp_path, scale_b=1e6)
    assert main(["lora", "check", "--base", str(base), "--adapter", str(adapter), "--dtype", "fp32", "-q"]) == 0
    code = main(["lora", "check", "--base", str(base), "--adapter", str(adapter), "--dtype", "fp16",
                 "--json", str(tmp_path / "r.json"), "-q"])
    assert code == 1
    failed = [r for r in json.loads((tmp_path / "r.json").read_text())["results"] if r["kind"] == "fail"]
    assert failed and {r["rule"] for r in failed} == {"lora-merge-overflow"}
    assert any("q_proj" in r["message"] and "fp16" in r["message"] for r in failed)


def test_unreadable_inputs_are_usage_errors(tmp_path, capsys):
    base, adapter = _saved_pair(tmp_path)
    assert main(["lora", "check", "--base", str(tmp_path / "nope"), "--adapter", str(adapter)]) == 2
    assert "CUVIL-INPUT" in capsys.readouterr().err
    assert main(["lora", "check", "--base", str(base), "--adapter", str(tmp_path)]) == 2
    assert "CUVIL-LORA" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["lora"])
    assert exit_info.value.code == 2 and "CUVIL-USAGE" in capsys.readouterr().err


def test_progress_reports_every_adapted_module_once(tmp_path):
    from lora import Adapter, BaseModel, check_adapter

    base, adapter_dir = _saved_pair(tmp_path)
    adapter = Adapter(adapter_dir)
    seen: list[tuple[int, int, str]] = []
    check_adapter(adapter, BaseModel.from_directory(base), progress=lambda *a: seen.append(a))
    assert [d for d, _, _ in seen] == list(range(1, len(adapter.lora_modules) + 1))
    assert {t for _, t, _ in seen} == {len(adapter.lora_modules)}
    assert [m for _, _, m in seen] == [m.module for m in adapter.lora_modules]  # in module order
