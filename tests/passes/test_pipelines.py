"""The O0..O3 pipelines: what they contain, that fold-constants follows every pass emitting
constant expressions, and that each level keeps the interpreter's results."""

import json

import numpy as np
import pytest
from pass_testing import assert_same_results, ops

import cuvil.passes.catalogue  # noqa: F401  (defines the O-level pipelines)
from cuvil.ir import Builder, DType
from cuvil.passes import parse_pipeline, run_pipeline
from cuvil.passes.base import Contract
from cuvil.passes.manager import PIPELINES

RNG = np.random.default_rng(23)


def _f(*shape: int, scale: float = 0.2) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _cnn_with_bn():
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 8, 8])
    h = b.conv(x, b.const(_f(16, 3, 3, 3)), pads=[1, 1, 1, 1])
    h = b.relu(b.batch_norm(h, b.const(_f(16) + 1), b.const(_f(16)), b.const(_f(16)),
                            b.const(RNG.uniform(0.5, 1.5, 16).astype(np.float32))))
    h = b.add(b.conv(h, b.const(_f(16, 16, 3, 3)), pads=[1, 1, 1, 1]), h)
    pooled = b.reshape(b.reduce_mean(h, axes=[2, 3], keepdims=True), shape=[2, 16])
    logits = b.matmul(pooled, b.transpose(b.const(_f(10, 16)), perm=[1, 0]))
    return b.module(b.function("main", [x], [b.gelu(b.add(logits, b.const(_f(10))))]))


def test_levels():
    assert PIPELINES["O0"] == ()
    assert PIPELINES["O1"] == ("canonicalize", "cse", "dce")
    o2 = PIPELINES["O2"]
    assert set(PIPELINES["O1"]) <= set(o2)
    assert {"fold-batchnorm", "eliminate-layout-ops", "fold-constants", "fuse-elementwise"} <= set(o2)
    o3 = PIPELINES["O3"]
    assert o3[:len(o2)] == o2 and o3[-1] == "layout-nchwc"


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_fold_constants_follows_constant_expression_passes(level):
    names = list(PIPELINES[level])
    for emitter in ("fold-batchnorm", "eliminate-layout-ops"):
        assert "fold-constants" in names[names.index(emitter):]
    assert names.index("fold-constants") < names.index("fuse-elementwise")


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_levels_keep_results(level):
    before = _cnn_with_bn()
    res = run_pipeline(before, level)
    exact = all(p.contract is Contract.EXACT for p in parse_pipeline(level))
    assert_same_results(before, res.module, exact=exact, rtol=1e-5)


def test_o3_output():
    before = _cnn_with_bn()
    res = run_pipeline(before, "O3")
    assert ops(res.module) == ["fused", "fused", "reduce_mean", "reshape", "fused"]
    fired = [n for r in res.records if r.name == "fuse-elementwise" for n in r.notes]
    assert fired == ["epilogue: conv+add+relu", "epilogue: conv+add", "epilogue: matmul+add+gelu"]
    assert len(json.loads(res.module.metadata["layout-nchwc"])["functions"]["main"]["sites"]) == 2
    changed = {r.name for r in res.records if r.changed}
    assert {"fold-batchnorm", "fold-constants", "fuse-elementwise", "layout-nchwc"} <= changed
