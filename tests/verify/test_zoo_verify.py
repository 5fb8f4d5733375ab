"""The O3 pipeline on the zoo models, every pass application gated: nothing is refuted, and at
the reduced sizes everything is proved."""

import pytest

from bench.models import ZOO, ZOO_SMALL
from cuvil.errors import UnsupportedOpError
from cuvil.passes import run_pipeline
from verify import make_gate


def _import(zm, frontend):
    if frontend == "torch":
        from cuvil.frontend.torch_import import import_torch

        return import_torch(zm.build(), zm.example_inputs())
    from cuvil.frontend.onnx_import import import_onnx

    try:
        return import_onnx(zm.to_onnx())
    except UnsupportedOpError as e:  # the frontend's coverage is tested elsewhere
        pytest.skip(f"ONNX frontend: {e.message}")


def _cases(table):
    return [pytest.param(name, fe, id=f"{name}-{fe}") for name, zm in table.items()
            for fe in (("onnx", "torch") if zm.has_torch_reference else ("onnx",))]


@pytest.mark.parametrize(("name", "frontend"), _cases(ZOO_SMALL))
def test_o3_on_the_small_zoo_is_proved(name, frontend):
    gate = make_gate("degrade")
    run_pipeline(_import(ZOO_SMALL[name], frontend), "O3", gate=gate)
    report = gate.report()
    assert report.count("refuted") == 0
    assert report.obligations and report.proved, report.summary()
    assert not gate.rolled_back


@pytest.mark.slow  # full-size models: the interpreter and the Z_p reader run at benchmark shapes (minutes)
@pytest.mark.parametrize(("name", "frontend"), _cases(ZOO))
def test_o3_on_the_full_zoo_refutes_nothing(name, frontend):
    gate = make_gate("degrade")
    run_pipeline(_import(ZOO[name], frontend), "O3", gate=gate)
    assert gate.report().count("refuted") == 0
