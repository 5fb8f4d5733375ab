"""`cuvil opt`: runs a pipeline over a model file, prints/saves CIR, reports unknown passes."""

from pathlib import Path

from cuvil.cli import main
from cuvil.ir.parser import load_ir

EXAMPLE = Path(__file__).parents[1] / "bench" / "examples" / "tiny_cnn.onnx"


def test_opt_writes_optimized_cir(tmp_path, capsys):
    out = tmp_path / "o.cir"
    assert main(["opt", str(EXAMPLE), "-p", "O2", "-o", str(out), "--timing"]) == 0
    module = load_ir(out)
    ops = [v.op for v in module.main.ops()]
    assert "batch_norm" not in ops and "fused" in ops
    assert "fold-batchnorm" in capsys.readouterr().err


def test_opt_prints_after_a_pass(capsys):
    assert main(["opt", str(EXAMPLE), "-p", "canonicalize,fold-batchnorm", "--print-after", "fold-batchnorm"]) == 0
    captured = capsys.readouterr()
    assert "// ----- IR after fold-batchnorm -----" in captured.err
    assert captured.out.startswith("module")


def test_opt_unknown_pass_is_a_usage_error(capsys):
    assert main(["opt", str(EXAMPLE), "-p", "no-such-pass"]) == 2
    assert "CUVIL-PIPELINE" in capsys.readouterr().err


def test_opt_lists_passes(capsys):
    assert main(["opt", "--list-passes"]) == 0
    assert "fuse-elementwise" in capsys.readouterr().out
