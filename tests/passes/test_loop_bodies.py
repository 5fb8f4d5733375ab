"""The optimization pipeline reaches inside loop bodies: each pass runs on a body as a function of its
arguments, work that depends on no argument leaves the body as a loop invariant, and the strict gate
proves every rewritten body (its obligations are in the certificate) before the library is built."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.frontend.onnx_import import import_onnx
from cuvil.ir import Builder, DType
from cuvil.ir.ops.control import INDEX
from cuvil.ir.region import close_body
from cuvil.ir.specialize import specialize_dims
from cuvil.ir.types import TensorType
from cuvil.ir.values import param
from cuvil.passes.manager import PassManager, parse_pipeline
from tests.frontend.test_onnx_recurrent_loops import _feeds, _model
from verify import check_pipeline

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")


def _body_ops(module: cuvil.ir.module.Module) -> list[str]:
    return [u.op for v in module.main.values() if v.op == "loop" for u in v.attr("body").ops()]


def test_o3_fuses_inside_an_lstm_body_and_the_gate_proves_every_body() -> None:
    model = _model("LSTM", "forward", True, seed=5)
    mod = import_onnx(model)
    mod = mod.replace(functions=[specialize_dims(mod.main, {"T": 6, "N": 3})])
    before = _body_ops(mod)
    report = check_pipeline(mod, "O3", policy="strict")
    cert = report.certificate()
    assert cert["summary"]["refuted"] == 0 and cert["summary"]["unknown"] == 0
    bodies = [o for a in cert["applications"] for o in a["obligations"] if o["function"] == "main/loop_body"]
    assert bodies and all(o["verdict"] == "proved" for o in bodies)
    after = _body_ops(PassManager(parse_pipeline("O3")).run(mod).module)
    assert "fused" in after and len(after) < len(before)


def test_the_optimized_loop_still_matches_onnxruntime() -> None:
    model = _model("GRU", "bidirectional", True, seed=6, linear_before_reset=1)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = cuvil.compile(model.SerializeToString(), cache=False, opt_level=3)
    for trips in (2, 11):
        feeds = _feeds(trips, True, trips)
        for g, w in zip(compiled(**feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _scaled_sum(scale: float) -> cuvil.ir.module.Module:
    """h' = h + x_t * scale, the scale a constant the body reads as a loop invariant."""
    b = Builder()
    xs = b.param("xs", DType.f32, [5, 3])
    h0 = b.param("h0", DType.f32, [3])
    row = TensorType(DType.f32, (3,))
    t, h, x = param("%h.t", INDEX), param("%h.h", row), param("%h.x", row)
    body, captured = close_body([t, h, x], [b.add(h, b.mul(x, b.const(np.full(3, scale, np.float32))))])
    loop = b.loop(h0, xs, *captured, body=body, carried=1, scanned=1, trips=[5])
    return b.module(b.function("main", [h0, xs], [loop]))


def test_a_pass_sees_the_constants_a_body_reads_and_the_gate_proves_the_result() -> None:
    """The scale enters the body as an argument; the pass sees it as the constant it is, drops the
    multiplication by one, and the loop loses the invariant. The strict gate proves the new body."""
    from cuvil.interp import run_reference

    mod = _scaled_sum(1.0)
    out = PassManager(parse_pipeline("canonicalize")).run(mod).module
    (loop,) = [v for v in out.main.values() if v.op == "loop"]
    assert [u.op for u in loop.attr("body").ops()] == ["add"]
    assert not any(o.is_const for o in loop.operands)
    cert = check_pipeline(mod, "canonicalize", policy="strict").certificate()
    assert cert["summary"]["proved"] == cert["summary"]["obligations"] >= 2
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(3).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)]
    np.testing.assert_array_equal(run_reference(out, args)[0], run_reference(mod, args)[0])
    kept = PassManager(parse_pipeline("canonicalize")).run(_scaled_sum(2.0)).module
    assert kept == _scaled_sum(2.0), "a pass that changes nothing in a body leaves the loop as it was"
