"""Every zoo model, imported through each frontend, keeps the interpreter's results through O3
(within the ``real`` tolerance: batch-norm folding reassociates), and the passes the zoo is
meant to exercise fire on it."""

import collections
import functools

import numpy as np
import pytest

from bench.models import ZOO, ZOO_SMALL
from cuvil.interp import run_reference
from cuvil.passes import run_pipeline
from cuvil.passes.fp16 import Fp16
from cuvil.passes.quantize_int8 import QuantizeInt8
from tests.zoo_cases import import_zoo, zoo_cases


@functools.cache
def _import_small(name, frontend):
    """Reduced-size models are imported once per session (several tests read them; modules are immutable)."""
    return import_zoo(ZOO_SMALL[name], frontend)






def _check(zm, frontend):
    before = _import_small(zm.name, frontend) if zm.small else import_zoo(zm, frontend)
    xs = zm.example_inputs_numpy()
    res = run_pipeline(before, "O3")
    ref, got = run_reference(before, xs), run_reference(res.module, xs)
    for r, g in zip(ref, got, strict=True):
        assert r.dtype == g.dtype and r.shape == g.shape
        if r.dtype.kind != "f":
            np.testing.assert_array_equal(g, r)
            continue
        r64 = r.astype(np.float64)
        np.testing.assert_allclose(g.astype(np.float64), r64, rtol=1e-5, atol=1e-5 * max(np.abs(r64).max(), 1.0))
    assert len(res.module.main.ops()) < len(before.main.ops())
    return before, res


def _fired(res, name):
    return collections.Counter(n for r in res.records if r.name == name for n in r.notes)


@pytest.mark.parametrize(("name", "frontend"), zoo_cases(ZOO_SMALL))
def test_zoo_model_through_o3_matches_the_interpreter(name, frontend):
    zm = ZOO_SMALL[name]
    before, res = _check(zm, frontend)
    ops = collections.Counter(v.op for v in before.main.ops())
    if ops["matmul"] or ops["conv"]:
        assert any(k.startswith("epilogue:") for k in _fired(res, "fuse-elementwise"))
    if ops["batch_norm"]:
        after = collections.Counter(v.op for v in res.module.main.ops())
        assert after["batch_norm"] == 0 and _fired(res, "fold-batchnorm")


@pytest.mark.slow  # full-size models: the interpreter runs ResNet-18 / BERT at benchmark shapes (minutes)
@pytest.mark.parametrize(("name", "frontend"), zoo_cases(ZOO))
def test_full_size_zoo_model_through_o3(name, frontend):
    _check(ZOO[name], frontend)


def test_int8_zoo_model_lowers_to_integer_arithmetic():
    zm = ZOO_SMALL["mlp_int8"]
    before = _import_small("mlp_int8", "onnx")
    res = run_pipeline(before, ["quantize-int8", "fold-constants", "dce"])
    assert res.records[0].changed
    assert any(v.op == "matmul" and v.dtype.is_int for v in res.module.main.ops())
    xs = zm.example_inputs_numpy()
    for r, g in zip(run_reference(before, xs), run_reference(res.module, xs), strict=True):
        assert r.shape == g.shape and r.dtype == g.dtype
        if r.dtype.kind == "f":  # dequantized output: at most one output quantization step apart
            assert np.max(np.abs(r - g)) <= QuantizeInt8.tolerance * _output_step(before) * (1 + 1e-6)
        else:
            assert np.max(np.abs(r.astype(np.int64) - g.astype(np.int64))) <= QuantizeInt8.tolerance


@pytest.mark.parametrize("name", ["mlp", "resnet18", "bert"])
def test_zoo_model_in_fp16_stays_within_the_declared_tolerance(name):
    zm = ZOO_SMALL[name]
    before = _import_small(name, "onnx")
    after = run_pipeline(before, ["fp16", "O3"]).module
    assert any(v.dtype.name == "f16" for v in after.main.ops())
    xs = zm.example_inputs_numpy()
    rtol, atol = Fp16.tolerance
    for r, g in zip(run_reference(before, xs), run_reference(after, xs), strict=True):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * max(float(np.abs(r).max()), 1.0))


def _output_step(module) -> float:
    """The scale of the last quantize_linear before the output (one quantization step)."""
    from cuvil.ir.values import walk

    q = [v for v in walk(list(module.main.results)) if v.op == "quantize_linear"][-1]
    return float(np.max(module.constants[q.operand("scale").const_hash]))


def _edge_inputs(zm):
    """Zeros and large magnitudes for float inputs; integer inputs (token ids) stay valid."""
    xs = zm.example_inputs_numpy()
    zeros = [np.zeros_like(x) if x.dtype.kind == "f" else x for x in xs]
    large = [(x * np.asarray(1e3, x.dtype)) if x.dtype.kind == "f" else x for x in xs]
    return {"zeros": zeros, "large": large}


@pytest.mark.parametrize(("name", "frontend"), zoo_cases(ZOO_SMALL))
def test_zoo_model_through_o3_on_edge_inputs(name, frontend):
    zm = ZOO_SMALL[name]
    before = _import_small(name, frontend)
    after = run_pipeline(before, "O3").module
    for kind, xs in _edge_inputs(zm).items():
        for r, g in zip(run_reference(before, xs), run_reference(after, xs), strict=True):
            assert r.dtype == g.dtype and r.shape == g.shape, kind
            if r.dtype.kind != "f":
                np.testing.assert_array_equal(g, r, err_msg=kind)
                continue
            r64 = r.astype(np.float64)
            assert np.array_equal(np.isnan(r64), np.isnan(g.astype(np.float64))), kind
            np.testing.assert_allclose(g.astype(np.float64), r64, rtol=1e-5,
                                       atol=1e-5 * max(float(np.nanmax(np.abs(r64), initial=0.0)), 1.0),
                                       equal_nan=True, err_msg=kind)
