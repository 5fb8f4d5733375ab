"""``cuvil lora check`` end to end: a saved Hugging Face base and a PEFT adapter, exit codes, the
report files, and a coded error for a base it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def _peft_logits(base: Path, adapter: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(base, attn_implementation="eager").eval()
    with torch.no_grad():
        return peft.PeftModel.from_pretrained(model, adapter).eval()(ids, use_cache=False).logits


def test_merge_writes_the_proved_merged_model_and_its_certificate(tmp_path, capsys):
    import numpy as np

    from cuvil import import_model
    from cuvil.interp import run_reference

    base, adapter = _saved_pair(tmp_path)
    out, cert = tmp_path / "merged.cir", tmp_path / "cert.json"
    code = main(["lora", "merge", "--base", str(base), "--adapter", str(adapter), "-o", str(out),
                 "--certificate", str(cert), "--shape", "input_ids=1x6", "--range", "input_ids=0:63"])
    assert code == 0, capsys.readouterr()
    assert "merged 2 adapted module(s)" in capsys.readouterr().err
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    got = run_reference(import_model(str(out)), [ids.numpy()])[0]
    want = _peft_logits(base, adapter, ids).numpy()
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    certificate = json.loads(cert.read_text())
    assert certificate["summary"]["proved"] == certificate["summary"]["obligations"] >= 2
    assert certificate["pipeline"] == ["merge-low-rank", "fold-constants"]
    sites = certificate["lora"]["error_bound"]["sites"]
    assert len(sites) == 2 and all(s["absolute_in_box"] is not None for s in sites)


def test_merge_refuses_what_the_checks_refuse_with_exit_1(tmp_path, capsys):
    base, adapter = _saved_pair(tmp_path, scale_b=1e6)
    out = tmp_path / "merged.cir"
    code = main(["lora", "merge", "--base", str(base), "--adapter", str(adapter), "-o", str(out), "--dtype", "fp16"])
    assert code == 1
    err = capsys.readouterr().err
    assert "CUVIL-LORA-REFUSED" in err and "q_proj" in err
    assert not out.exists()
    assert main(["lora", "merge", "--base", str(base), "--adapter", str(adapter), "--adapter", str(adapter),
                 "--weight", "1", "-o", str(out)]) == 2  # two adapters, one weight


def test_a_stamped_adapter_is_checked_against_the_base_by_content(tmp_path, capsys):
    """The base weights' digests recorded in the adapter (safetensors metadata, which PEFT ignores): the
    base it was stamped with passes, a base with one weight changed is named, as an error under
    --identity error and a warning otherwise; PEFT still loads the stamped adapter."""
    base, adapter = _saved_pair(tmp_path)
    assert main(["lora", "stamp", "--base", str(base), "--adapter", str(adapter), "-q"]) == 0
    assert "cuvil.base_tensors" in SafetensorsFile(adapter / "adapter_model.safetensors").metadata
    assert main(["lora", "check", "--base", str(base), "--adapter", str(adapter), "--identity", "error", "-q"]) == 0
    ids = torch.randint(0, 64, (1, 4))
    _peft_logits(base, adapter, ids)  # still a PEFT adapter
    changed = tmp_path / "changed"
    import shutil

    shutil.copytree(base, changed)
    weights = next(changed.glob("*.safetensors"))
    f = SafetensorsFile(weights)
    tensors = {k: np.array(f.array(k)) for k in f}
    key = "model.layers.0.self_attn.q_proj.weight"
    tensors[key][0, 0] += 1e-3
    write_safetensors(weights, tensors, f.metadata)
    out = tmp_path / "r.json"
    assert main(["lora", "check", "--base", str(changed), "--adapter", str(adapter), "--identity", "error",
                 "--json", str(out), "-q"]) == 1
    failed = [r for r in json.loads(out.read_text())["results"] if r["kind"] == "fail"]
    assert [r["rule"] for r in failed] == ["lora-base-content"] and "q_proj" in failed[0]["message"]
    assert main(["lora", "check", "--base", str(changed), "--adapter", str(adapter), "-q"]) == 0  # warn
