"""The O3 pipeline on the zoo models, every pass application gated: nothing is refuted, and at
the reduced sizes everything is proved."""

import pytest

from bench.models import ZOO, ZOO_SMALL
from cuvil.passes import run_pipeline
from tests.zoo_cases import import_zoo, zoo_cases
from verify import make_gate

LOADED_MACHINE_TIMEOUT = 60.0




@pytest.mark.parametrize(("name", "frontend"), zoo_cases(ZOO_SMALL))
def test_o3_on_the_small_zoo_is_proved(name, frontend):
    # a generous per-query limit: the verdict under test must not depend on how loaded the machine is
    gate = make_gate("degrade", timeout=LOADED_MACHINE_TIMEOUT)
    run_pipeline(import_zoo(ZOO_SMALL[name], frontend), "O3", gate=gate)
    report = gate.report()
    assert report.count("refuted") == 0
    assert report.obligations and report.proved, report.summary()
    assert not gate.rolled_back


@pytest.mark.slow  # full-size models: the interpreter runs at benchmark shapes (5-30 s per model, 2 min in all)
@pytest.mark.parametrize(("name", "frontend"), zoo_cases(ZOO))
def test_o3_on_the_full_zoo_refutes_nothing(name, frontend):
    gate = make_gate("degrade")
    run_pipeline(import_zoo(ZOO[name], frontend), "O3", gate=gate)
    assert gate.report().count("refuted") == 0


_FP16 = ("canonicalize,cse,fold-batchnorm,eliminate-layout-ops,fold-constants,fp16,fold-constants,canonicalize,cse,"
         "fuse-elementwise,dce")
_INT8 = "canonicalize,cse,eliminate-layout-ops,quantize-int8,fold-constants,canonicalize,cse,fuse-elementwise,dce"


@pytest.mark.parametrize(("name", "pipeline"), [("mlp_int8", _INT8), ("mlp", _FP16), ("resnet18", _FP16)],
                         ids=["int8", "fp16-mlp", "fp16-resnet18"])
def test_reduced_precision_pipelines_prove_every_exact_application(name, pipeline):
    """fp16 and quantize-int8 are ``bounded`` (left to the overflow prober); the exact passes after
    them must still be proved, folded quantized biases equal to an existing constant included."""
    from verify import check_pipeline

    report = check_pipeline(import_zoo(ZOO_SMALL[name], "onnx"), pipeline, timeout=LOADED_MACHINE_TIMEOUT)
    obligations = [o for a in report.applications for o in a.obligations]
    assert report.count("refuted") == 0
    assert any(o.pass_name in ("fp16", "quantize-int8") for o in obligations)
    assert all(o.status == "proved" for o in obligations if o.contract != "bounded"), report.summary()
