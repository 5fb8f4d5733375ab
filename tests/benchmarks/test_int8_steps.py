"""``python -m bench.int8_steps``: the zoo's INT8 models quantized with a reduced range, Cuvil's two AVX2 step
kinds against ONNX Runtime."""

from __future__ import annotations

import pytest

from bench.int8_steps import main, measure
from cuvil.codegen.target import codegen_target


@pytest.mark.skipif(not codegen_target().has("avx2"), reason="the AVX2 int8 steps need AVX2")
def test_both_step_kinds_run_the_reduced_range_mlp_to_the_same_bits(capsys) -> None:
    assert main(["--models", "mlp_int8", "--small", "--repeat", "3", "--rounds", "1"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split("|")
    assert row[1].strip() == "mlp_int8" and row[8].strip() == "True", row  # the two libraries' outputs agree
    assert all(float(row[k]) > 0 for k in (3, 4, 5))


@pytest.mark.skipif(not codegen_target().has("avx2"), reason="the AVX2 int8 steps need AVX2")
def test_seven_bit_weights_take_the_pairs_and_the_other_library_the_widened_steps() -> None:
    row = measure("mlp_int8", None, 2, 1, small=True)
    assert row["kernels"] == {"avx2": ["avx2"], "pairs": ["pairs"]} and row["bit_equal"]


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        main(["--models", "mlp"])
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])
