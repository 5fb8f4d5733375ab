"""Every built-in rewrite pass, on small models at several shapes (distinct dims >= 2, so an
axis mix-up cannot hide behind a size-1 dim), is proved under its contract's encoder."""

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.passes.canonicalize import Canonicalize
from cuvil.passes.cse import CommonSubexpressionElimination
from cuvil.passes.decompose import Decompose
from cuvil.passes.eliminate_layout import EliminateLayoutOps
from cuvil.passes.fold_batchnorm import FoldBatchNorm
from cuvil.passes.fold_constants import FoldConstants
from cuvil.passes.fuse_elementwise import FuseElementwise
from verify import check_pass

RNG = np.random.default_rng(5)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _proved(pass_, module: Module, encoder: str | None = None) -> None:
    report = check_pass(pass_, module)
    assert report.obligations, f"{pass_.name} did not change the module"
    for o in report.obligations:
        assert o.status == "proved", f"{o.output}: {o.verdict}"
        if encoder is not None:
            assert o.encoder == encoder


def _module(build, shape, dtype=DType.f32):
    b = Builder()
    x = b.param("x", dtype, shape)
    return b.module(b.function("main", [x], [build(b, x)]))


SHAPES = [(3, 5), (5, 2, 3)]

CANONICAL = {
    "mul-by-one": lambda b, x: b.exp(b.mul(x, b.scalar(1.0, DType.f32))),
    "mul-by-one-lhs": lambda b, x: b.exp(b.mul(b.scalar(1.0, DType.f32), x)),
    "div-by-one": lambda b, x: b.exp(b.div(x, b.const(np.ones(x.type.shape[-1:], np.float32)))),
    "sub-zero": lambda b, x: b.tanh(b.sub(x, b.scalar(0.0, DType.f32))),
    "add-negative-zero": lambda b, x: b.tanh(b.add(x, b.scalar(-0.0, DType.f32))),
    "double-transpose": lambda b, x: b.exp(b.transpose(b.transpose(x, perm=list(range(x.type.rank))[::-1]),
                                                       perm=list(range(x.type.rank))[::-1])),
    "double-transpose-composed": lambda b, x: b.exp(b.transpose(b.transpose(x, perm=_rot(x.type.rank)),
                                                                perm=_rot(x.type.rank))),
    "reshape-chain": lambda b, x: b.exp(b.reshape(b.reshape(x, shape=(int(np.prod(x.type.shape)),)),
                                                  shape=tuple(reversed(x.type.shape)))),
    "identity-reshape": lambda b, x: b.exp(b.reshape(x, shape=x.type.shape)),
    "double-negation": lambda b, x: b.exp(b.neg(b.neg(x))),
    "relu-idempotent": lambda b, x: b.exp(b.relu(b.relu(x))),
}


def _rot(rank: int) -> list[int]:
    return [*range(1, rank), 0]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rule", sorted(CANONICAL))
def test_canonicalize_rule_proves(rule, shape):
    _proved(Canonicalize(), _module(CANONICAL[rule], shape), "abstract-fp")


@pytest.mark.parametrize("shape", SHAPES)
def test_canonicalize_widening_cast_round_trip_proves(shape):
    _proved(Canonicalize(), _module(lambda b, x: b.cast(b.cast(x, to=DType.f32), to=DType.f16), shape, DType.f16))


@pytest.mark.parametrize("shape", SHAPES)
def test_cse_of_commuted_operands_proves(shape):
    def build(b, x):
        y = b.exp(x)
        return b.sub(b.mul(x, y), b.mul(y, x))

    _proved(CommonSubexpressionElimination(), _module(build, shape), "abstract-fp")


@pytest.mark.parametrize("k", [4, 5])
def test_a_rewrite_around_bfloat16_dot_products_proves(k):
    """``bf16_matmul`` of a double transpose, minus 0, canonicalized: the proof reads the product's ``dot_ftz``
    rule (each step one fused multiply-add of the two factors, not their rounded product) on both sides."""
    import ml_dtypes

    b = Builder()
    x = b.param("x", DType.bf16, [3, k])
    w = b.const(_f(k, 2).astype(ml_dtypes.bfloat16))
    xt = b.transpose(b.transpose(x, perm=[1, 0]), perm=[1, 0])
    y = b.exp(b.sub(b.op("bf16_matmul", xt, w), b.scalar(0.0, DType.f32)))
    _proved(Canonicalize(), b.module(b.function("main", [x], [y])), "abstract-fp")


def _conv_bn(cin: int, cout: int, bias: str = "", groups: int = 1) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, cin, 5, 4])
    y = b.conv(x, b.const(_f(cout, cin // groups, 3, 3)), pads=[1, 1, 1, 1], groups=groups)
    if bias:
        c = b.const(_f(cout, 1, 1))
        y = b.add(y, c) if bias == "rhs" else b.add(c, y)
    params = [b.const(RNG.uniform(0.5, 2, cout).astype(np.float32)), b.const(_f(cout)), b.const(_f(cout)),
              b.const(RNG.uniform(0.5, 2, cout).astype(np.float32))]
    return b.module(b.function("main", [x], [b.relu(b.batch_norm(y, *params, epsilon=1e-3))]))


def _matmul_bn(k: int, n: int, transpose_b: bool = False) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [3, k])
    y = b.matmul(x, b.const(_f(n, k) if transpose_b else _f(k, n)), transpose_b=transpose_b)
    params = [b.const(RNG.uniform(0.5, 2, n).astype(np.float32)), b.const(_f(n)), b.const(_f(n)),
              b.const(RNG.uniform(0.5, 2, n).astype(np.float32))]
    return b.module(b.function("main", [x], [b.batch_norm(y, *params)]))


BN_MODELS = {
    "conv 3->5": lambda: _conv_bn(3, 5),
    "conv 5->3": lambda: _conv_bn(5, 3),
    "conv bias rhs": lambda: _conv_bn(3, 5, bias="rhs"),
    "conv bias lhs": lambda: _conv_bn(5, 3, bias="lhs"),
    "grouped conv": lambda: _conv_bn(4, 6, groups=2),
    "matmul": lambda: _matmul_bn(5, 3),
    "matmul transpose_b": lambda: _matmul_bn(3, 5, transpose_b=True),
}


@pytest.mark.parametrize("model", sorted(BN_MODELS))
def test_fold_batchnorm_proves_over_the_reals(model):
    _proved(FoldBatchNorm(), BN_MODELS[model](), "real")


@pytest.mark.parametrize("model", ["conv 3->5", "matmul transpose_b"])
def test_fold_constants_after_batchnorm_folding_proves(model):
    folded = FoldBatchNorm().run(BN_MODELS[model]()).module
    _proved(FoldConstants(), folded, "abstract-fp")


def _linear_relu(b, x):
    return b.relu(b.add(b.matmul(x, b.const(_f(int(x.type.shape[-1]), 4))), b.const(_f(4))))


def _conv_bias_relu(b, x):
    y = b.conv(x, b.const(_f(5, int(x.type.shape[1]), 3, 3)), pads=[1, 1, 1, 1])
    return b.relu(b.add(y, b.const(_f(5, 1, 1))))


def _chain(b, x):
    return b.add(b.mul(b.exp(x), b.tanh(x)), b.sigmoid(x))


@pytest.mark.parametrize(("build", "shape"), [
    (_linear_relu, (3, 5)), (_linear_relu, (2, 3, 5)), (_conv_bias_relu, (2, 3, 5, 4)), (_conv_bias_relu, (1, 5, 4, 3)),
    (_chain, (3, 5)), (_chain, (5, 2, 3))])
def test_fuse_elementwise_proves(build, shape):
    _proved(FuseElementwise(), _module(build, shape), "abstract-fp")


LAYOUT = {
    "transpose into matmul lhs": (lambda b, x: b.matmul(b.transpose(x, perm=[1, 0]), b.const(_f(3, 4))), (3, 5)),
    "transpose into matmul rhs": (lambda b, x: b.matmul(b.const(_f(4, 5)), b.transpose(x, perm=[1, 0])), (3, 5)),
    "transpose as reshape": (lambda b, x: b.exp(b.transpose(x, perm=[1, 0, 2])), (1, 3, 5)),
    "reshape around elementwise": (lambda b, x: b.reshape(b.exp(b.reshape(x, shape=(1, 3, 5))), shape=(3, 5)),
                                   (3, 5)),
    "sink unsqueeze": (lambda b, x: b.add(b.reshape(x, shape=(1, 5, 3)), b.const(_f(3))), (5, 3)),
    "transpose through unary": (lambda b, x: b.transpose(b.exp(b.transpose(x, perm=[2, 0, 1])), perm=[1, 2, 0]),
                                (2, 3, 5)),
}


@pytest.mark.parametrize("case", sorted(LAYOUT))
def test_eliminate_layout_ops_proves(case):
    build, shape = LAYOUT[case]
    _proved(EliminateLayoutOps(), _module(build, shape), "abstract-fp")


DECOMPOSED = {
    "softmax": (lambda b, x: b.softmax(x, axis=-1), (3, 5)),
    "softmax axis 0": (lambda b, x: b.softmax(x, axis=0), (5, 3)),
    "log_softmax": (lambda b, x: b.log_softmax(x, axis=1), (2, 5, 3)),
    "layer_norm": (lambda b, x: b.layer_norm(x, b.const(_f(5)), b.const(_f(5)), axis=-1), (3, 5)),
    "layer_norm two axes": (lambda b, x: b.layer_norm(x, b.const(_f(3, 4)), b.const(_f(4)), axis=1), (2, 3, 4)),
    "gelu": (lambda b, x: b.gelu(x), (3, 5)),
    "gelu tanh": (lambda b, x: b.gelu(x, approximate="tanh"), (5, 3)),
    "silu": (lambda b, x: b.silu(x), (3, 5)),
}


@pytest.mark.parametrize("case", sorted(DECOMPOSED))
def test_decompose_proves(case):
    build, shape = DECOMPOSED[case]
    _proved(Decompose(), _module(build, shape), "real")


@pytest.mark.parametrize("case", ["softmax", "log_softmax", "gelu", "silu", "layer_norm"])
def test_recognizing_decomposed_forms_proves(case):
    build, shape = DECOMPOSED[case]
    decomposed = Decompose().run(_module(build, shape)).module
    _proved(Decompose(reverse=True), decomposed, "real")
