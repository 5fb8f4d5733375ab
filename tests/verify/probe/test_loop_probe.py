"""The overflow prober through loops: a loop has no element rule, so the prober analyses its iterations
unrolled (at a concrete trip count, within a budget), and an FP16 compile of a loop model plans and
runs every iteration's ops. The same LSTM imported at a static length (unrolled by the importer) and at
a symbolic one (a loop) gets the same sites and verdicts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import cuvil
from cuvil.errors import UnsupportedOpError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.ir.specialize import specialize_dims
from tests.frontend.test_onnx_recurrent_loops import _feeds, _model
from verify.probe.probe import ProbeOptions, probe

RANGES = {"X": (-1.0, 1.0), "lens": (1, 5)}


def _static(model: onnx.ModelProto, trips: int, batch: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                value = {"T": trips, "N": batch}[d.dim_param]
                d.ClearField("dim_param")
                d.dim_value = value
    return out


def _verdicts(module: cuvil.ir.module.Module) -> list[str]:
    report = probe(module, RANGES, ProbeOptions(precision="fp16", search=False, boundary=False))
    return sorted(f"{s.verdict}" for s in report.sites)


@pytest.mark.parametrize("op, direction", [("LSTM", "bidirectional"), ("GRU", "forward")])
def test_a_loop_is_probed_like_the_recurrence_the_importer_unrolls(op: str, direction: str) -> None:
    model = _model(op, direction, True, seed=1)
    looped = import_onnx(model)
    assert any(v.op == "loop" for v in looped.main.values())
    looped = looped.replace(functions=[specialize_dims(looped.main, {"T": 5, "N": 3})])
    unrolled = import_onnx(_static(model, 5, 3))
    assert not any(v.op == "loop" for v in unrolled.main.values())
    assert _verdicts(looped) == _verdicts(unrolled)


def test_a_symbolic_trip_count_is_refused_with_what_to_give() -> None:
    with pytest.raises(UnsupportedOpError, match="unrolled"):
        probe(import_onnx(_model("RNN", "forward", False)), RANGES, ProbeOptions(precision="fp16"))


def test_an_fp16_compile_of_a_loop_model_runs_every_iteration_planned() -> None:
    model = _model("LSTM", "forward", True, seed=2)
    wide = cuvil.compile(model.SerializeToString(), cache=False)
    narrow = cuvil.compile(model.SerializeToString(), cache=False, fp16=True, ranges=RANGES)
    rng = np.random.default_rng(0)
    for trips in (3, 7):
        for _ in range(20):
            feeds = _feeds(trips, True, int(rng.integers(1 << 30)))
            got, want = narrow(**feeds), wide(**feeds)
            for g, w in zip(got, want, strict=True):
                assert np.all(np.isfinite(g))
                np.testing.assert_allclose(g, w, atol=2e-2)
    manifest = narrow.manifest
    assert manifest is not None and manifest["precision"]["fp16_ops"] > 0
