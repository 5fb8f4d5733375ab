"""layout-nchwc: a blocked-layout plan for convs is recorded in the module metadata (the conv
op has no blocked form that sums in the same order, so values do not change)."""

import json

import numpy as np
from pass_testing import assert_same_results, assert_unchanged

from cuvil.ir import Builder, DType
from cuvil.passes import run_pipeline
from cuvil.passes.layout_nchwc import METADATA_KEY, LayoutNchwc

RNG = np.random.default_rng(19)


def _f(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def _cnn(c_in: int = 3, width: int = 16, depthwise: bool = True):
    """conv(3->16) + bias + relu -> depthwise conv + residual -> conv(16->32) -> global pool -> linear."""
    b = Builder()
    x = b.param("x", DType.f32, [1, c_in, 8, 8])
    h = b.relu(b.add(b.conv(x, b.const(_f(width, c_in, 3, 3)), pads=[1, 1, 1, 1]), b.const(_f(width, 1, 1))))
    if depthwise:
        h = b.add(b.conv(h, b.const(_f(width, 1, 3, 3)), pads=[1, 1, 1, 1], groups=width), h)
    h = b.max_pool(h, kernel=[2, 2], strides=[2, 2])
    h = b.conv(h, b.const(_f(2 * width, width, 1, 1)))
    pooled = b.reshape(b.reduce_mean(h, axes=[2, 3], keepdims=True), shape=[1, 2 * width])
    out = b.matmul(pooled, b.const(_f(2 * width, 10)))
    return b.module(b.function("main", [x], [out]))


def _plan(m):
    return json.loads(m.metadata[METADATA_KEY])


def test_plan_records_sites_blocked_regions_and_reorders():
    before = _cnn()
    res = LayoutNchwc().run(before)
    assert res.changed
    assert res.module.functions == before.functions  # no value changes
    plan = _plan(res.module)
    assert plan["block"] == 16
    fn = plan["functions"]["main"]
    values = before.main.values()
    sites = fn["sites"]
    assert [s["groups"] for s in sites] == [1, 16, 1]
    assert sites[0]["input"] == "plain" and sites[0]["weights"] == "OIHW16o"  # 3 input channels stay plain
    assert sites[1]["input"] == "NCHW16c" and sites[1]["weights"] == "OIHW16i16o"
    blocked_ops = sorted(values[i].op for i in fn["blocked"])
    assert blocked_ops == ["add", "add", "conv", "conv", "conv", "max_pool", "relu"]
    # one exit: the last conv feeds reduce_mean, which is not channel-preserving here
    exits = [r for r in fn["reorders"] if r["to"] == "plain"]
    assert [values[r["value"]].op for r in exits] == ["conv"]
    assert [values[u].op for u in exits[0]["users"]] == ["reduce_mean"]
    assert not [r for r in fn["reorders"] if r["to"] == "blocked"]
    assert_same_results(before, res.module)


def test_blocked_input_of_a_plain_producer_gets_an_entry_reorder():
    b = Builder()
    x = b.param("x", DType.f32, [1, 16, 6, 6])
    out = b.conv(b.neg(x), b.const(_f(16, 16, 3, 3)))
    before = b.module(b.function("main", [x], [out]))
    fn = _plan(LayoutNchwc().run(before).module)["functions"]["main"]
    values = before.main.values()
    entries = [r for r in fn["reorders"] if r["to"] == "blocked"]
    assert [values[r["value"]].op for r in entries] == ["neg"]
    exits = [r for r in fn["reorders"] if r["to"] == "plain"]
    assert exits and exits[0]["result"] is True


def test_fused_conv_epilogues_are_sites():
    before = _cnn()
    after = run_pipeline(before, "O2").module
    res = LayoutNchwc(block=8).run(after)
    sites = _plan(res.module)["functions"]["main"]["sites"]
    assert [s["op"] for s in sites] == ["fused", "fused", "conv"]  # two epilogues, then a bare 1x1 conv
    assert sites[0]["output"] == "NCHW8c"
    assert_same_results(before, res.module, exact=False, rtol=1e-5)


def test_channels_not_divisible_by_the_block_are_not_planned():
    before = _cnn(width=12)
    assert_unchanged(LayoutNchwc(), before)


def test_module_without_conv_is_unchanged():
    b = Builder()
    x = b.param("x", DType.f32, [2, 16, 4, 4])
    before = b.module(b.function("main", [x], [b.relu(x)]))
    assert LayoutNchwc().run(before).changed is False


def test_grouped_conv_with_partial_blocks_is_not_a_site():
    b = Builder()
    x = b.param("x", DType.f32, [1, 32, 4, 4])
    before = b.module(b.function("main", [x], [b.conv(x, b.const(_f(32, 8, 1, 1)), groups=4)]))
    assert LayoutNchwc().run(before).changed is False
    assert LayoutNchwc(block=8).run(before).changed is True
