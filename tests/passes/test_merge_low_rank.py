"""merge-low-rank: every form a low-rank update takes beside a constant weight (either operand order,
the scale on either side, fan_in_fan_out layouts, DoRA's per-output scale, embedding and gather
lookups, convolutions) merges and is proved over the reals; look-alikes that are not such an update stay;
a merge with a seeded mistake is refuted."""

import numpy as np
import pytest

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.passes.merge_low_rank import MergeLowRank
from verify import check_pass, check_rewrite

RNG = np.random.default_rng(5)
N, IN, OUT, R, VOCAB = 3, 10, 6, 2, 12


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


W, A, B, C, T, EA, EB = _f(OUT, IN), _f(R, IN), _f(OUT, R), RNG.uniform(0.5, 2, OUT).astype(np.float32), \
    _f(VOCAB, IN), _f(R, VOCAB), _f(IN, R)


def _update(b, x, s_first=False, a=None):
    low = b.matmul(b.matmul(x, b.const(A if a is None else a), transpose_b=True), b.const(B), transpose_b=True)
    s = b.scalar(0.5, DType.f32)
    return b.mul(s, low) if s_first else b.mul(low, s)


def _linear(b, x, order="base-first", s_first=False, fan_in_fan_out=False):
    base = b.matmul(x, b.const(np.ascontiguousarray(W.T))) if fan_in_fan_out else b.matmul(x, b.const(W),
                                                                                             transpose_b=True)
    low = _update(b, x, s_first)
    return b.add(base, low) if order == "base-first" else b.add(low, base)


def _lookup(b, ids, kind):
    attrs = {"axis": 0} if kind == "gather" else {}
    low = b.matmul(b.op(kind, b.const(np.ascontiguousarray(EA.T)), ids, **attrs), b.const(EB), transpose_b=True)
    return b.add(b.op(kind, b.const(T), ids, **attrs), b.mul(low, b.scalar(2.0, DType.f32)))


def _module(build, ids=False):
    b = Builder()
    x = b.param("ids", DType.i64, [2, N]) if ids else b.param("x", DType.f32, [2, N, IN])
    return b.module(b.function("main", [x], [build(b, x)]))


MERGING = {
    "linear": lambda b, x: _linear(b, x),
    "update first": lambda b, x: _linear(b, x, order="update-first"),
    "scale first": lambda b, x: _linear(b, x, s_first=True),
    "fan_in_fan_out": lambda b, x: _linear(b, x, fan_in_fan_out=True),
    "dora": lambda b, x: b.mul(_linear(b, x), b.const(C)),
    "two adapters": lambda b, x: b.add(_linear(b, x), _update(b, x, a=_f(R, IN))),
    "with bias": lambda b, x: b.add(_linear(b, x), b.const(_f(OUT))),
}


@pytest.mark.parametrize("case", sorted(MERGING))
def test_low_rank_updates_merge_and_are_proved(case):
    module = _module(MERGING[case])
    out = MergeLowRank().run(module).module
    live = [v for v in out.main.ops() if v.op == "matmul" and v.operands[0].is_param]
    assert len(live) == 1, [v.op for v in out.main.ops()]  # one product with the input: the merged one
    x = RNG.standard_normal((2, N, IN)).astype(np.float32)
    np.testing.assert_allclose(run_reference(out, [x])[0], run_reference(module, [x])[0], rtol=1e-5, atol=1e-5)
    report = check_pass(MergeLowRank(), module, timeout=60)
    assert report.obligations and report.proved, report.summary()


@pytest.mark.parametrize("kind", ["embedding", "gather"])
def test_lookup_updates_merge_into_the_table(kind):
    module = _module(lambda b, ids: _lookup(b, ids, kind), ids=True)
    out = MergeLowRank().run(module).module
    assert [v.op for v in out.main.ops() if v.operands and v.operands[-1].is_param] == [kind]
    ids = RNG.integers(0, VOCAB, (2, N))
    np.testing.assert_allclose(run_reference(out, [ids])[0], run_reference(module, [ids])[0], rtol=1e-5, atol=1e-5)
    report = check_pass(MergeLowRank(), module, timeout=60)
    assert report.obligations and report.proved, report.summary()


def _other_input(b, x):
    y = b.mul(x, b.scalar(2.0, DType.f32))
    return b.add(b.matmul(x, b.const(W), transpose_b=True), _update(b, y))


def _factor_from_input(b, x):
    a = b.reshape(b.slice(x, starts=(0, 0, 0), ends=(1, R, IN), steps=(1, 1, 1)), shape=(R, IN))
    low = b.matmul(b.matmul(x, a, transpose_b=True), b.const(B), transpose_b=True)
    return b.add(b.matmul(x, b.const(W), transpose_b=True), b.mul(low, b.scalar(0.5, DType.f32)))


def _scale_not_per_column(b, x):
    return b.mul(b.matmul(x, b.const(W), transpose_b=True), b.const(_f(N, OUT)))


def _product_used_twice(b, x):
    mm = b.matmul(x, b.const(W), transpose_b=True)
    return b.add(b.mul(mm, b.const(C)), mm)


LOOK_ALIKES = {
    "update of another input": _other_input,
    "factor computed from the input": _factor_from_input,
    "scale varies along rows": _scale_not_per_column,
    "scaled product also used unscaled": _product_used_twice,
}


@pytest.mark.parametrize("case", sorted(LOOK_ALIKES))
def test_look_alikes_stay(case):
    module = _module(LOOK_ALIKES[case])
    assert MergeLowRank().run(module).module.main == module.main


@pytest.mark.parametrize("mistake", ["scale dropped", "scale applied twice"])
def test_a_wrong_merge_is_refuted(mistake):
    before = _module(MERGING["linear"])

    def wrong(b, x):
        update = b.matmul(b.const(B), b.const(A))
        if mistake == "scale dropped":
            merged = b.add(b.const(W), update)
        else:
            s = b.scalar(0.5, DType.f32)
            merged = b.add(b.const(W), b.mul(b.mul(update, s), s))
        return b.matmul(x, merged, transpose_b=True)

    report = check_rewrite(before, _module(wrong), "real", name="merge-low-rank", timeout=60)
    assert report.count("refuted") == 1, report.summary()


# -- convolutions: conv(x, W) + s·conv(conv(x, A), B) with A on W's kernel, strides and padding, B 1x1 -------------

CW, CA, CB = _f(4, 3, 3, 3), _f(R, 3, 3, 3), _f(4, R, 1, 1)


def _conv_update(b, x, *, strides=(2, 2), pads=(1, 1, 1, 1), outer_kernel=1, outer_strides=(1, 1),
                 inner_dilations=(1, 1), s=0.5):
    outer = CB if outer_kernel == 1 else _f(4, R, outer_kernel, outer_kernel)
    inner = b.conv(x, b.const(CA), strides=strides, pads=pads, dilations=inner_dilations)
    low = b.conv(inner, b.const(outer), strides=outer_strides,
                 pads=(0,) * 4 if outer_kernel == 1 else (1, 1, 1, 1), dilations=(1, 1))
    return b.mul(low, b.scalar(s, DType.f32))


def _conv(b, x, order="base-first", **update):
    base = b.conv(x, b.const(CW), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))
    low = _conv_update(b, x, **update)
    return b.add(base, low) if order == "base-first" else b.add(low, base)


def _image_module(build):
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 7, 7])
    return b.module(b.function("main", [x], [build(b, x)]))


@pytest.mark.parametrize("order", ["base-first", "update-first"])
def test_convolution_updates_merge_and_are_proved(order):
    module = _image_module(lambda b, x: _conv(b, x, order))
    out = MergeLowRank().run(module).module
    assert [v.op for v in out.main.ops() if v.operands and v.operands[0].is_param] == ["conv"]
    x = RNG.standard_normal((2, 3, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(run_reference(out, [x])[0], run_reference(module, [x])[0], rtol=1e-5, atol=1e-5)
    report = check_pass(MergeLowRank(), module, timeout=60)
    assert report.obligations and report.proved, report.summary()


CONV_LOOK_ALIKES = {  # each of the base's output shape, none of the form PEFT writes (A on the base's windows)
    "A on shifted padding": {"pads": (0, 0, 2, 2)},
    "A's stride on B": {"strides": (1, 1), "outer_strides": (2, 2)},
    "A dilated": {"inner_dilations": (2, 2), "pads": (2, 2, 2, 2)},
    "B not 1x1": {"outer_kernel": 3},
}


@pytest.mark.parametrize("case", sorted(CONV_LOOK_ALIKES))
def test_convolution_look_alikes_stay(case):
    """An update of the base's output shape in another form than A on the base's windows and B 1x1 at stride
    1: left alone (shifted padding or dilation would merge wrongly; a stride moved to B is merely not
    recognized)."""
    module = _image_module(lambda b, x: _conv(b, x, **CONV_LOOK_ALIKES[case]))
    assert MergeLowRank().run(module).module.main == module.main


@pytest.mark.parametrize("mistake", ["rank contracted the wrong way", "kernel flipped"])
def test_a_wrong_convolution_merge_is_refuted(mistake):
    before = _image_module(_conv)

    def wrong(b, x):
        a = CA[:, :, ::-1, ::-1].copy() if mistake == "kernel flipped" else CA
        update = np.einsum("or,rikl->oikl", CB[:, :, 0, 0], a)
        if mistake == "rank contracted the wrong way":
            update = np.einsum("or,rikl->oikl", CB[:, ::-1, 0, 0], CA)
        merged = b.add(b.const(CW), b.mul(b.const(update.astype(np.float32)), b.scalar(0.5, DType.f32)))
        return b.conv(x, merged, strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))

    report = check_rewrite(before, _image_module(wrong), "real", name="merge-low-rank", timeout=60)
    assert report.count("refuted") == 1, report.summary()
