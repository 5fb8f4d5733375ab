"""The probe on the reference zoo (inputs in [-1, 1], ids within the vocabulary): it ends within its
work budget with a verdict per site, and the FP16 build its decisions give never produces inf/NaN
on random inputs in the box."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from bench.models import ZOO, ZOO_SMALL
from cuvil.frontend.dispatch import import_model
from cuvil.interp import evaluate_values
from cuvil.ir.module import Module
from verify.probe.fp16_policy import fp16_module, fp16_safe_ops
from verify.probe.probe import OPEN, OVERFLOW, SAFE, ProbeOptions, probe


@functools.cache
def _module(name: str, small: bool) -> Module:
    return import_model((ZOO_SMALL if small else ZOO)[name].to_onnx())


def _ranges(module: Module, small: bool) -> dict[str, tuple[float, float]]:
    vocab = 128 if small else 8192
    return {p.name: ((-1.0, 1.0) if p.dtype.is_float else (0.0, float(vocab - 1))) for p in module.main.params}


def _inputs(module: Module, ranges: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for p in module.main.params:
        lo, hi = ranges[p.name]
        shape = tuple(int(d) for d in p.shape)
        if p.dtype.is_float:
            out[p.name] = rng.uniform(lo, hi, shape).astype(p.dtype.np)
        else:
            out[p.name] = rng.integers(int(lo), int(hi) + 1, shape).astype(p.dtype.np)
    return out


def _check_probe(name: str, small: bool) -> None:
    module = _module(name, small)
    precision = "int8" if name.endswith("int8") else "fp16"
    rep = probe(module, _ranges(module, small), ProbeOptions(precision=precision))
    assert rep.budget is not None and not rep.budget.cut  # the work budget, not the wall-clock guard, ended it
    assert rep.budget.spent <= 1.25 * rep.budget.limit
    assert rep.sites and all(s.verdict in (SAFE, OVERFLOW, OPEN) for s in rep.sites)
    assert rep.exit_code in (0, 1, 3)
    if rep.count(OVERFLOW):
        assert rep.witnesses


def test_mlp_is_proved_safe_in_fp16() -> None:
    module = _module("mlp", True)
    rep = probe(module, _ranges(module, True), ProbeOptions(effort=5_000))
    assert rep.exit_code == 0 and rep.count(SAFE) == len(rep.sites)
    assert rep.boundary.safe_scale is not None and rep.boundary.safe_scale >= 1


def test_qdq_resnet_sites_are_all_decided() -> None:
    """onnxruntime's static QDQ quantization of the reduced ResNet-18 (calibrated on N(0, 1) images): in
    [-1, 1] every saturation and accumulator site is proved or has a confirmed witness."""
    module = _module("resnet18_int8", True)
    rep = probe(module, _ranges(module, True), ProbeOptions(precision="int8", boundary=False))
    assert rep.sites and rep.count(OPEN) == 0
    assert rep.count(SAFE) > 0 and rep.count(OVERFLOW) > 0
    assert all(s.witness is not None and s.rule == "int8-saturation" for s in rep.sites if s.verdict == OVERFLOW)
    assert all(s.rule == "int-overflow" for s in rep.sites if s.op in ("conv", "matmul"))
    assert all(s.verdict == SAFE for s in rep.sites if s.rule == "int-overflow")  # int32 accumulators are safe


def test_mlp_int8_saturation_is_confirmed_beyond_the_calibration() -> None:
    """Calibrated on N(0, 1) data, the INT8 MLP's requantized outputs saturate at box corners of [-1, 1]."""
    module = _module("mlp_int8", True)
    rep = probe(module, _ranges(module, True), ProbeOptions(precision="int8", effort=5_000, boundary=False))
    assert rep.count(OVERFLOW) >= 1
    for s in rep.sites:
        if s.verdict == OVERFLOW:
            assert s.rule == "int8-saturation"


def test_fp16_build_of_the_small_mlp_is_finite() -> None:
    module = _module("mlp", True)
    ranges = _ranges(module, True)
    kept, decisions = fp16_safe_ops(module, ranges)
    assert not kept and all(d.precision == "fp16" for d in decisions if d.op != "cast")
    built = fp16_module(module, kept)
    rng = np.random.default_rng(0)
    for _ in range(100):
        values = evaluate_values(built.main, built.constants, _inputs(module, ranges, rng))
        assert all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in values.values())


# each model spends up to the default budget (under a minute on two cores): the whole zoo at the small profile
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "mlp_b64", "resnet18", "mobilenet_v1", "bert", "mlp_int8", "resnet18_int8"])
def test_zoo_small_probe_ends_within_its_budget(name: str) -> None:
    _check_probe(name, True)


# full-size models: up to a minute each
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "mlp_b64", "resnet18", "mobilenet_v1", "bert", "mlp_int8", "resnet18_int8"])
def test_zoo_full_probe_ends_within_its_budget(name: str) -> None:
    _check_probe(name, False)


# 1,000 reference runs per model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v1", "bert"])
def test_fp16_build_of_zoo_models_is_finite_on_1000_inputs(name: str) -> None:
    module = _module(name, True)
    ranges = _ranges(module, True)
    kept, _ = fp16_safe_ops(module, ranges)
    built = fp16_module(module, kept)
    rng = np.random.default_rng(1)
    for _ in range(1000):
        values = evaluate_values(built.main, built.constants, _inputs(module, ranges, rng))
        assert all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for v, a in values.items()
                   if v.dtype.is_float)


@pytest.mark.slow
def test_resnet18_is_proved_safe_beyond_its_box() -> None:
    """The full ResNet-18 in [-1, 1] with the default budget: every site proved (its last residual sums bounded
    two blocks at a time), and the boundary proves a larger box too (about a minute)."""
    module = _module("resnet18", False)
    rep = probe(module, _ranges(module, False))
    assert rep.sites and rep.count(SAFE) == len(rep.sites)
    assert rep.boundary.safe_scale is not None and rep.boundary.safe_scale > 1
