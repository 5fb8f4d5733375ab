"""Op properties live on the op: the passes and kernels that used to list op names read them from
the catalogue, and the sets they get are the lists they had."""

import pytest

from cuvil.errors import OpDefinitionError
from cuvil.ir import opdef
from cuvil.ir import rules as R
from cuvil.ir.opdef import contraction_ops, define, epilogue_fusible_ops, get_op, ops_with_precision

CONTRACTIONS = {"matmul", "conv", "bf16_matmul", "bf16_conv"}  # (the bf16 ones: their paired kernels take epilogues)
EPILOGUE = {"add", "sub", "mul", "div", "relu", "clip", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "hardswish",
            "hardsigmoid", "elu", "cast", "round", "erf"}  # erf: a GELU written out joins its product
KEEP_FP32 = {"softmax", "log_softmax", "exp", "log", "pow", "layer_norm", "batch_norm", "reduce_sum", "reduce_mean",
             "reduce_prod", "erf", "cumsum", "lrn", "lp_pool", "softplus", "mish", "sinh", "cosh", "cast", "loop",
             "bitcast", "cond", "bf16_matmul", "bf16_conv"}


def test_catalogue_queries_give_the_former_lists() -> None:
    assert contraction_ops() == CONTRACTIONS
    assert epilogue_fusible_ops() == EPILOGUE
    assert ops_with_precision("keep-fp32", "as-declared") == KEEP_FP32
    assert ops_with_precision("as-declared") == {"cast", "bitcast", "bf16_matmul", "bf16_conv"}


def test_readers_use_the_catalogue() -> None:
    from cuvil.codegen.kernels import KERNELS
    from cuvil.passes.fp16 import KEEP_FP32 as PASS_KEEP
    from cuvil.passes.fuse_elementwise import EPILOGUE_ANCHORS, EPILOGUE_OPS, FuseElementwise
    from verify.probe.program import DEFAULT_KEEP

    assert set(EPILOGUE_ANCHORS) == CONTRACTIONS and set(EPILOGUE_OPS) == EPILOGUE
    assert set(FuseElementwise().anchors) == CONTRACTIONS and set(FuseElementwise().epilogue_ops) == EPILOGUE
    assert set(PASS_KEEP) == KEEP_FP32
    assert DEFAULT_KEEP == ("bf16_conv", "bf16_matmul", "bitcast", "cast")
    assert set(KERNELS) <= contraction_ops()  # a tuned kernel computes a contraction


def test_properties_default_to_none_of_them() -> None:
    op = get_op("transpose")
    assert not op.contraction and not op.epilogue_fusible and op.precision_policy == "narrow"
    assert not hasattr(op, "extra")


def test_a_contraction_contracts_its_first_two_operands() -> None:
    for name in contraction_ops():
        assert len(get_op(name).operands) >= 2


def _first_type(types, **_):
    return types[0]


def test_queries_see_ops_defined_later(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opdef, "OPS", dict(opdef.OPS))
    monkeypatch.setattr(opdef, "_NAMES", {})
    assert "my_dot" not in contraction_ops()
    define("my_dot", ("a", "b"), shape=_first_type, rule=R.elementwise(lambda a, b: a * b), contraction=True)
    assert "my_dot" in contraction_ops()


def test_unknown_precision_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opdef, "OPS", dict(opdef.OPS))
    monkeypatch.setattr(opdef, "_NAMES", {})
    with pytest.raises(OpDefinitionError, match="precision policy"):
        define("my_op", ("x",), shape=_first_type, rule=R.elementwise(lambda x: x),
               precision_policy="fp8")  # type: ignore[arg-type]
