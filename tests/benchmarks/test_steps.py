"""``python -m bench.steps``: each engine's time per op, from Cuvil's profiled library and ONNX Runtime's
profiler, run interleaved."""

from __future__ import annotations

import json

import pytest

from bench.steps import main, render


def test_the_command_lists_both_engines_steps(tmp_path, capsys) -> None:
    out = tmp_path / "steps.json"
    assert main(["--models", "mlp", "--repeat", "5", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["runs"] == 5 and row["threads"] == 1 and row["frontend"] == "torch"  # as python -m bench compiles
    # the MLP's three products are Cuvil's three steps that take time, each named by its kernel and type
    assert len(row["cuvil"]) == 3 and all(label.startswith("gemm.") for label, _ in row["cuvil"])
    assert [label.split()[-1] for label, _ in row["cuvil"]] == ["512]", "512]", "10]"]
    assert all(ms > 0 for _, ms in row["cuvil"]) and all(ms >= 0 for _, ms in row["ort"]) and row["ort"]
    assert row["cuvil_ms"] == pytest.approx(sum(ms for _, ms in row["cuvil"]))
    text = capsys.readouterr().out
    assert "5 interleaved runs" in text and "onnxruntime node" in text


def test_rows_pair_by_position_and_the_longer_list_is_kept() -> None:
    text = render({"model": "m", "threads": 2, "frontend": "onnx", "runs": 3, "cuvil": [("a", 1.0)],
                   "ort": [("x", 0.5), ("y", 0.25)], "cuvil_ms": 1.0, "ort_ms": 0.75})
    lines = text.splitlines()
    assert "(1.33x)" in lines[0] and "(Cuvil from onnx)" in lines[0] and len(lines) == 4
    assert lines[2].startswith("a") and "x" in lines[2] and lines[3].strip().startswith("y")


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        main(["--models", "no_such_model"])
    with pytest.raises(SystemExit):
        main(["--repeat", "0"])
