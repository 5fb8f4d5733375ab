"""fuse-elementwise: maximal elementwise chains become one fused op, elementwise epilogues join
their matmul / conv; a value joins a body only when every reader it has is in it; results are
bit-identical."""

import numpy as np
import pytest
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil.codegen.plan import ordered_steps
from cuvil.ir import Builder, DType
from cuvil.ir.parser import parse_module
from cuvil.passes.fuse_elementwise import INLINED_PATHS_MAX, FuseElementwise

RNG = np.random.default_rng(3)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _fused(m):
    return [v for v in m.main.ops() if v.op == "fused"]


def _body_ops(v):
    return [u.op for u in v.attr("body").ops()]


def _conv_attrs(v):
    (conv,) = [u for u in v.attr("body").ops() if u.op == "conv"]
    return list(conv.attr("strides")), list(conv.attr("pads"))


def test_chain_becomes_one_fused_op_with_external_inputs():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    y = b.param("y", DType.f32, [4])
    c = b.const(_f(4))
    out = b.relu(b.mul(b.add(x, y), c))
    before = b.module(b.function("main", [x, y], [out]))
    res = FuseElementwise().run(before)
    assert res.changed and ops(res.module) == ["fused"]
    (f,) = _fused(res.module)
    assert f.attr("kind") == "elementwise"
    assert _body_ops(f) == ["add", "mul", "relu"]
    assert list(f.operands) == [x, y, c]  # the constant is an operand, not inside the body
    assert res.notes == ("elementwise: add+mul+relu",)
    assert_same_results(before, res.module)


def test_tree_of_single_use_values_fuses_whole():
    b = Builder()
    x = b.param("x", DType.f32, [2, 5])
    y = b.param("y", DType.f32, [2, 5])
    out = b.sub(b.exp(x), b.tanh(b.mul(y, y)))
    before = b.module(b.function("main", [x, y], [out]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused"]
    assert sorted(_body_ops(_fused(res.module)[0])) == ["exp", "mul", "sub", "tanh"]
    assert_same_results(before, res.module)


def test_broadcasting_and_dtype_changes_inside_a_chain():
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 4])
    i = b.param("i", DType.i32, [4])
    out = b.where(b.greater(x, b.cast(i, to=DType.f32)), b.neg(x), b.scalar(0.5, DType.f32))
    before = b.module(b.function("main", [x, i], [out]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused"]
    assert_same_results(before, res.module)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "clip"])
def test_matmul_epilogue(activation):
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.add(b.matmul(x, b.const(_f(5, 4))), b.const(_f(4)))
    y = b.clip(y, min=0.0, max=6.0) if activation == "clip" else b.op(activation, y)
    before = b.module(b.function("main", [x], [y]))
    res = FuseElementwise().run(before)
    (f,) = _fused(res.module)
    assert ops(res.module) == ["fused"]
    assert f.attr("kind") == "epilogue"
    assert _body_ops(f) == ["matmul", "add", activation]
    assert_same_results(before, res.module)


def test_conv_epilogue_with_residual_add():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 5, 6])
    y = b.add(b.conv(x, b.const(_f(4, 4, 3, 3)), pads=[1, 1, 1, 1]), b.const(_f(4, 1, 1)))
    out = b.relu(b.add(y, x))
    before = b.module(b.function("main", [x], [out]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused"]
    (f,) = _fused(res.module)
    assert f.attr("kind") == "epilogue" and _body_ops(f) == ["conv", "add", "add", "relu"]
    assert res.notes == ("epilogue: conv+add+add+relu",)
    assert_same_results(before, res.module)


@pytest.mark.parametrize("down_first", [False, True])
@pytest.mark.parametrize("residual_left", [False, True])
def test_residual_add_of_two_convolutions_joins_the_one_with_the_later_input(down_first, residual_left):
    """A downsampling block's add reads two convolutions' results; it joins the block's last convolution
    (whose input is computed later), whatever the operand and program order, so the downsampling one runs
    before it, while the block's input is still in cache."""
    b = Builder()
    x = b.param("x", DType.f32, [1, 4, 6, 6])

    def down():
        return b.add(b.conv(x, b.const(_f(8, 4, 1, 1)), strides=[2, 2]), b.const(_f(8, 1, 1)))

    d = down() if down_first else None
    h = b.relu(b.conv(x, b.const(_f(8, 4, 3, 3)), strides=[2, 2], pads=[1, 1, 1, 1]))
    last = b.add(b.conv(h, b.const(_f(8, 8, 3, 3)), pads=[1, 1, 1, 1]), b.const(_f(8, 1, 1)))
    d = d if down_first else down()
    out = b.relu(b.add(d, last) if residual_left else b.add(last, d))
    before = b.module(b.function("main", [x], [out]))
    res = FuseElementwise().run(before)
    steps = ordered_steps(res.module.main)
    assert [v.op for v in steps] == ["fused"] * 3
    first, downsampling, block_last = steps
    assert _body_ops(first) == ["conv", "relu"] and _body_ops(downsampling) == ["conv", "add"]
    assert sorted(_body_ops(block_last)) == ["add", "add", "conv", "relu"]
    assert downsampling in block_last.operands and first in block_last.operands
    assert [_conv_attrs(f) for f in steps] == [([2, 2], [1, 1, 1, 1]), ([2, 2], []), ([], [1, 1, 1, 1])]
    assert_same_results(before, res.module)


def test_epilogue_stops_at_a_non_epilogue_op_which_starts_a_chain():
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.relu(b.matmul(x, b.const(_f(5, 4))))
    out = b.log(b.abs(b.exp(y)))
    before = b.module(b.function("main", [x], [out]))
    res = FuseElementwise().run(before)
    kinds = [f.attr("kind") for f in _fused(res.module)]
    assert kinds == ["epilogue", "elementwise"]
    assert _body_ops(_fused(res.module)[1]) == ["exp", "abs", "log"]
    assert_same_results(before, res.module)


def test_value_read_twice_inside_one_body_joins_it():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    t = b.add(b.mul(x, x), x)  # read twice below, both times by the consumer tree
    out1 = b.relu(b.neg(t))
    out2 = b.exp(b.abs(t))
    before = b.module(b.function("main", [x], [b.add(out1, out2)]))
    res = FuseElementwise().run(before)
    (f,) = _fused(res.module)
    assert ops(res.module) == ["fused"] and list(f.operands) == [x]
    assert sorted(_body_ops(f)) == ["abs", "add", "add", "exp", "mul", "neg", "relu"]
    assert_same_results(before, res.module)


def test_value_read_outside_the_body_stays_materialized():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    t = b.add(b.mul(x, x), x)
    inside = b.relu(b.neg(t))
    elsewhere = b.matmul(t, b.const(_f(4, 2)))  # not elementwise: t is computed once, for both
    before = b.module(b.function("main", [x], [inside, elsewhere]))
    res = FuseElementwise(epilogues=False).run(before)
    first, second = _fused(res.module)
    assert _body_ops(first) == ["mul", "add"] and _body_ops(second) == ["neg", "relu"]
    assert list(second.operands) == [first]
    assert_same_results(before, res.module)


def _written_out_gelu(b: Builder, y):
    """GELU as exporters without a Gelu op write it: ((erf(y / sqrt 2) + 1) * y) * 0.5 (y read twice)."""
    e = b.op("erf", b.div(y, b.scalar(float(np.sqrt(2.0)), DType.f32)))
    return b.mul(b.mul(b.add(e, b.scalar(1.0, DType.f32)), y), b.scalar(0.5, DType.f32))


def test_written_out_gelu_joins_the_matmul_epilogue():
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    y = b.add(b.matmul(x, b.const(_f(5, 4))), b.const(_f(4)))
    before = b.module(b.function("main", [x], [_written_out_gelu(b, y)]))
    res = FuseElementwise().run(before)
    (f,) = _fused(res.module)
    assert ops(res.module) == ["fused"] and f.attr("kind") == "epilogue"
    assert _body_ops(f) == ["matmul", "add", "div", "erf", "add", "mul", "mul"]
    assert_same_results(before, res.module)


def test_product_read_twice_by_its_epilogue_joins_it():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 5, 6])
    p = b.conv(x, b.const(_f(3, 4, 3, 3)), pads=[1, 1, 1, 1])
    before = b.module(b.function("main", [x], [b.mul(p, b.sigmoid(p))]))  # SiLU written out
    res = FuseElementwise().run(before)
    (f,) = _fused(res.module)
    assert ops(res.module) == ["fused"] and _body_ops(f) == ["conv", "sigmoid", "mul"]
    assert_same_results(before, res.module)


def test_epilogue_stops_before_a_value_that_also_feeds_a_non_epilogue_op():
    # p feeds a reduction whose result the subtraction reads: pulling the subtraction into p's epilogue
    # would make the fused op read a value computed from its own result
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    p = b.relu(b.add(b.matmul(x, b.const(_f(5, 4))), b.const(_f(4))))
    s = b.reduce_sum(p, axes=[1], keepdims=True)
    before = b.module(b.function("main", [x], [b.sub(p, s)]))
    res = FuseElementwise().run(before)
    epilogue = [f for f in _fused(res.module) if f.attr("kind") == "epilogue"]
    assert [_body_ops(f) for f in epilogue] == [["matmul", "add", "relu"]]
    assert "sub" in ops(res.module)
    assert_same_results(before, res.module)


def test_stacked_diamonds_stay_within_the_inlining_bound():
    # each level reads the one below twice: fused whole, the body's expression tree would double per level
    b = Builder()
    x = b.param("x", DType.f32, [4, 3])
    t = x
    for _ in range(24):
        t = b.add(b.mul(t, t), b.scalar(0.25, DType.f32))
        t = b.tanh(t)
    before = b.module(b.function("main", [x], [t]))
    res = FuseElementwise().run(before)
    groups = _fused(res.module)
    assert len(groups) > 1
    for f in groups:
        body = f.attr("body")
        members = list(body.ops())
        paths = {body.result: 1}
        for u in reversed(members):
            for o in u.operands:
                paths[o] = paths.get(o, 0) + paths[u]
        assert max(paths[u] for u in members) <= INLINED_PATHS_MAX  # the values it computes; the loads of
        # its operands are leaves, at most an op's arity times as many
    assert_same_results(before, res.module)


def test_function_result_is_not_fused_into_its_consumer():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    mid = b.relu(b.neg(x))
    before = b.module(b.function("main", [x], [mid, b.exp(mid)]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused", "exp"]
    assert res.module.main.results[0].op == "fused"
    assert_same_results(before, res.module)


def test_epilogue_not_formed_when_the_product_has_another_user():
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    p = b.matmul(x, b.const(_f(5, 4)))
    before = b.module(b.function("main", [x], [b.relu(p), p]))
    assert_unchanged(FuseElementwise(), before)


def test_epilogue_that_broadcasts_beyond_the_product_is_not_formed():
    b = Builder()
    x = b.param("x", DType.f32, [3, 5])
    r = b.param("r", DType.f32, [2, 3, 4])
    before = b.module(b.function("main", [x, r], [b.add(b.matmul(x, b.const(_f(5, 4))), r)]))
    assert FuseElementwise().run(before).changed is False


def test_single_op_and_constant_only_chains_are_left_alone():
    b = Builder()
    x = b.param("x", DType.f32, [4])
    folded_later = b.mul(b.add(b.const(_f(4)), b.const(_f(4))), b.const(_f(4)))
    before = b.module(b.function("main", [x], [b.relu(b.matmul(b.reshape(x, shape=[1, 4]),
                                                               b.reshape(folded_later, shape=[4, 1])))]))
    res = FuseElementwise(epilogues=False).run(before)
    assert not res.changed


def test_idempotent():
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    before = b.module(b.function("main", [x], [b.relu(b.add(b.mul(x, x), x))]))
    once = FuseElementwise().run(before).module
    again = FuseElementwise().run(once)
    assert not again.changed


def test_fused_module_round_trips_through_text():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4, 5, 6])
    y = b.relu(b.add(b.conv(x, b.const(_f(3, 4, 3, 3))), b.const(_f(3, 1, 1))))
    before = b.module(b.function("main", [x], [b.exp(b.neg(y))]))
    after = FuseElementwise().run(before).module
    assert parse_module(str(after)) == after


def test_integer_product_takes_its_requantization_as_epilogue():
    b = Builder()
    x = b.param("x", DType.i32, [3, 6])
    acc = b.matmul(x, b.const(RNG.integers(-128, 128, (6, 5)).astype(np.int32)))
    y = b.round(b.mul(b.cast(b.add(acc, b.const(np.arange(5, dtype=np.int32))), to=DType.f32),
                      b.scalar(0.01, DType.f32)))
    out = b.cast(b.clip(y, min=-128.0, max=127.0), to=DType.i8)
    before = b.module(b.function("main", [x], [out]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused"]
    assert res.notes == ("epilogue: matmul+add+cast+mul+round+clip+cast",)
    assert_same_results(before, res.module)


def _residual(b: Builder, axis_scale: bool, block_size: int = 0):
    """A QDQ model's residual join: dequantize two int8 tensors, add, requantize, center for the next product."""
    a, r = b.param("a", DType.i8, [1, 4, 3, 3]), b.param("r", DType.i8, [1, 4, 3, 3])
    scale = b.const(np.array([0.5, 0.25, 0.125, 2.0], np.float32)) if axis_scale else b.scalar(0.02, DType.f32)
    zero = b.const(np.array([1, -2, 0, 3], np.int8)) if axis_scale else b.const(np.int8(-3))
    attrs = {"axis": 1, "block_size": block_size} if block_size else {}
    s = b.add(b.op("dequantize_linear", a, scale, zero, **attrs), b.op("dequantize_linear", r, scale, zero, **attrs))
    q = b.op("quantize_linear", s, b.scalar(0.05, DType.f32), b.const(np.int8(4)))
    return [a, r], b.sub(b.cast(q, to=DType.i32), b.const(np.int32(4)))


@pytest.mark.parametrize("axis_scale", [False, True], ids=["per-tensor", "per-axis"])
def test_quantize_and_dequantize_join_an_elementwise_chain(axis_scale: bool) -> None:
    b = Builder()
    params, out = _residual(b, axis_scale)
    before = b.module(b.function("main", params, [out]))
    res = FuseElementwise().run(before)
    assert ops(res.module) == ["fused"]
    (f,) = _fused(res.module)
    assert sorted(_body_ops(f)) == sorted(["dequantize_linear", "dequantize_linear", "add", "quantize_linear", "cast",
                                           "sub"])
    assert_same_results(before, res.module)


def test_block_quantized_values_stay_unfused() -> None:
    b = Builder()
    x = b.param("x", DType.i8, [2, 8])
    dq = b.op("dequantize_linear", x, b.const(np.full((2, 2), 0.5, np.float32)), b.const(np.zeros((2, 2), np.int8)),
              axis=1, block_size=4)
    before = b.module(b.function("main", [x], [b.relu(b.add(dq, b.scalar(1.0, DType.f32)))]))
    res = FuseElementwise().run(before)
    assert "dequantize_linear" in ops(res.module)
