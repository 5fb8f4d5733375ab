"""bf16: float32 matmuls and convs by constant weights become bfloat16 products summed in float32; everything else,
the signature and each product's float32 result stay; what stays float32 says why; the library computes
the lowered module's rule bit for bit, fused epilogues included, and the pipeline after it is proved."""

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from llvmlite import binding as llvm
from pass_testing import assert_same_results, assert_unchanged, ops

from cuvil import cli
from cuvil.compiler import compile
from cuvil.compiler.bf16_plan import plan_bf16
from cuvil.errors import CuvilError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.printer import export_ir
from cuvil.passes import run_pipeline
from cuvil.passes.base import Contract
from cuvil.passes.bf16 import Bf16
from verify import make_gate

RNG = np.random.default_rng(23)
RTOL, ATOL = Bf16.tolerance
HAS_BF16 = bool(llvm.get_host_cpu_features().get("avx512bf16", False))


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _mlp() -> Module:
    """Two linear layers (the second's weights stored transposed, as an ONNX Gemm's) with bias and GELU."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 5, 24])
    h = b.gelu(b.add(b.matmul(x, b.const(_f(24, 40, scale=0.2))), b.const(_f(40))))
    out = b.add(b.matmul(h, b.const(_f(16, 40, scale=0.15)), transpose_b=True), b.const(_f(16)))
    return b.module(b.function("main", [x], [out]))


def _bits(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32).copy()
    bits[np.isnan(x)] = 0x7FC00000
    return bits


def test_products_by_constant_weights_run_in_bfloat16_and_nothing_else_changes():
    before = _mlp()
    after = run_pipeline(before, [Bf16(), "fold-constants", "dce"]).module
    assert ops(after) == ["cast", "bf16_matmul", "add", "gelu", "cast", "bf16_matmul", "add"]
    assert [v.dtype for v in after.main.ops() if v.op == "bf16_matmul"] == [DType.f32, DType.f32]
    assert [v.dtype for v in after.main.ops() if v.op in ("add", "gelu")] == [DType.f32] * 3
    assert after.main.param_types == before.main.param_types
    assert after.main.result_types == before.main.result_types
    for v in after.main.ops():
        if v.op == "bf16_matmul":  # the weights: bfloat16 constants, the layout kept (transpose_b)
            assert after.constants[v.operands[1].const_hash].dtype == ml_dtypes.bfloat16
    assert [bool(v.attr("transpose_b")) for v in after.main.ops() if v.op == "bf16_matmul"] == [False, True]
    assert_same_results(before, after, exact=False, rtol=RTOL, atol=ATOL, trials=3)
    assert Bf16.contract is Contract.BOUNDED


def test_the_error_is_the_operands_rounding_not_more():
    """A product is the bfloat16-rounded operands' exact product up to the float32 sum's rounding (``γ_K``
    of the magnitudes): the operands' rounding is the only new error."""
    w = _f(24, 6)
    m = _single(w)
    x = _f(2, 5, 24)
    (got,) = run_reference(Bf16().run(m).module, [x])
    xr, wr = (a.astype(ml_dtypes.bfloat16).astype(np.float64) for a in (x, w))
    k, u = 24, 2.0 ** -24
    bound = k * u / (1 - k * u) * (np.abs(xr) @ np.abs(wr))
    assert np.all(np.abs(got - xr @ wr) <= bound)
    assert not np.array_equal(got, run_reference(m, [x])[0])  # (it did round)


def _single(w: np.ndarray) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [2, 5, w.shape[0]])
    return b.module(b.function("main", [x], [b.matmul(x, b.const(w))]))


@pytest.mark.parametrize("case,reason", [
    ("runtime_rhs", "depends on an input"),
    ("odd_k", "K = 7 is odd"),
    ("transpose_a", "read transposed"),
    ("f16", None),
])
def test_what_keeps_float32_products_stays_and_says_why(case: str, reason: str | None):
    b = Builder()
    if case == "runtime_rhs":  # attention's Q @ K^T: both operands computed from the input
        x = b.param("x", DType.f32, [4, 8])
        out = b.matmul(x, x, transpose_b=True)
    elif case == "odd_k":
        x = b.param("x", DType.f32, [4, 7])
        out = b.matmul(x, b.const(_f(7, 6)))
    elif case == "transpose_a":
        x = b.param("x", DType.f32, [8, 4])
        out = b.matmul(x, b.const(_f(8, 6)), transpose_a=True)
    else:  # a float16 product is not a float32 one: nothing to do, nothing reported
        x = b.param("x", DType.f16, [4, 8])
        out = b.matmul(x, b.const(_f(8, 6).astype(np.float16)))
    m = b.module(b.function("main", [x], [out]))
    assert_unchanged(Bf16(), m)
    plan = plan_bf16(m)
    assert plan.products == 0 and plan.module is m
    if reason is None:
        assert plan.kept == ()
    else:
        ((name, op, why),) = plan.kept
        assert reason in why and name.startswith("%") and op == "matmul"
        assert plan.manifest()["kept_fp32"] == [{"op": "matmul", "value": name, "reason": why}]


def test_a_weight_past_bfloat16s_range_keeps_its_product_float32():
    b = Builder()
    x = b.param("x", DType.f32, [2, 4])
    w = _f(4, 3)
    w[1, 2] = 3.4e38  # finite in float32, past bfloat16's largest (3.39e38): it would round to infinity
    m = b.module(b.function("main", [x], [b.matmul(x, b.const(w))]))
    assert_unchanged(Bf16(), m)
    assert "range" in plan_bf16(m).kept[0][2]


def test_the_library_is_the_lowered_rule_bit_for_bit_with_its_epilogues():
    """The compiled library against the interpreter on the lowered module: bias and GELU fused into the
    products (paired kernels with AVX512-BF16, the generic lowering of the rule without it)."""
    before = _mlp()
    model = compile(before, bf16=True, cache=False)
    assert model.manifest is not None
    entry = model.manifest["precision"]
    assert entry["mode"] == "bf16" and entry["bf16_products"] == 2 and entry["fp32_products"] == 0
    paired = [k for k in model.manifest["kernels"] if k.endswith(".bf16x2")]
    assert len(paired) == (2 if HAS_BF16 else 0)
    lowered = plan_bf16(before).module
    for scale in (1.0, 1e-30, 1e30):  # ordinary, subnormal products (flushed), huge values
        x = _f(2, 5, 24, scale=scale)
        np.testing.assert_array_equal(_bits(model.run({"x": x})[0]), _bits(run_reference(lowered, [x])[0]))


def test_the_pipeline_after_it_is_proved():
    """The lowering is declared (bounded); everything O3 does to the lowered module (folding the weights'
    casts, fusing the epilogues into the products) goes through the strict gate."""
    lowered = plan_bf16(_mlp()).module
    gate = make_gate("strict", timeout=20)
    out = run_pipeline(lowered, "O3", gate=gate).module
    assert [v.op for v in out.main.ops()].count("fused") == 2
    report = gate.report()
    assert report.obligations and report.proved


def test_bf16_and_fp16_together_are_refused():
    with pytest.raises(CuvilError, match="choose one"):
        compile(_mlp(), bf16=True, fp16=True, ranges={"x": (-1.0, 1.0)}, cache=False)


def test_cli_precision_bf16_builds_and_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = export_ir(_mlp(), tmp_path / "mlp.cir")
    lib = tmp_path / "libmlp.so"
    assert int(cli.main(["compile", str(model), "--precision", "bf16", "-o", str(lib)])) == 0
    out = capsys.readouterr().out
    assert "bf16      2 products by constant weights" in out and "0 kept float32" in out
    assert json.loads((tmp_path / "mlp.json").read_text())["precision"]["bf16_products"] == 2
    other = tmp_path / "libother.so"
    code = int(cli.main(["compile", str(model), "--precision", "bf16", "--enable-fp16", "--range", "x=-1:1",
                         "-o", str(other)]))
    assert code == 2 and "--precision" in capsys.readouterr().err and not other.exists()


def _cnn(groups: int = 1) -> Module:
    """conv (odd channel count) + bias + ReLU, a grouped or plain conv, global mean, a linear layer."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 10, 10])
    h = b.relu(b.add(b.conv(x, b.const(_f(8, 3, 3, 3, scale=0.3)), pads=(1, 1, 1, 1)), b.const(_f(1, 8, 1, 1))))
    h = b.relu(b.conv(h, b.const(_f(8, 8 // groups, 3, 3, scale=0.2)), strides=(2, 2), pads=(1, 1, 1, 1),
                      groups=groups))
    pooled = b.reshape(b.reduce_mean(h, axes=(2, 3), keepdims=False), shape=(2, 8))
    return b.module(b.function("main", [x], [b.matmul(pooled, b.const(_f(8, 4, scale=0.5)))]))


def test_convolutions_by_constant_weights_run_in_bfloat16_and_a_grouped_one_says_why_not():
    before = _cnn()
    plan = plan_bf16(before)
    assert plan.products == 3 and plan.kept == ()
    assert [v.op for v in plan.module.main.ops() if v.op.startswith("bf16")] == ["bf16_conv", "bf16_conv",
                                                                                  "bf16_matmul"]
    conv = next(v for v in plan.module.main.ops() if v.op == "bf16_conv" and v.attr("strides") == (2, 2))
    assert conv.attr("pads") == (1, 1, 1, 1) and conv.dtype is DType.f32
    assert_same_results(before, plan.module, exact=False, rtol=RTOL, atol=ATOL, trials=3)
    grouped = plan_bf16(_cnn(groups=2))
    assert grouped.products == 2
    ((_, op, why),) = grouped.kept
    assert op == "conv" and "grouped" in why


def test_the_cnn_library_is_the_lowered_rule_bit_for_bit():
    before = _cnn()
    model = compile(before, bf16=True, cache=False)
    assert model.manifest is not None and model.manifest["precision"]["bf16_products"] == 3
    assert set(model.manifest["precision"]["semantics"]) == {"bf16_matmul", "bf16_conv"}
    paired = [k for k in model.manifest["kernels"] if k.endswith(".bf16x2")]
    assert len(paired) == (3 if HAS_BF16 else 0)
    lowered = plan_bf16(before).module
    x = _f(2, 3, 10, 10)
    np.testing.assert_array_equal(_bits(model.run({"x": x})[0]), _bits(run_reference(lowered, [x])[0]))


def test_a_shape_known_only_at_run_time_keeps_float32_products_and_says_why():
    """A library for a whole shape class (symbolic batch): the paired kernels are built per shape, so the
    products stay float32; a specialization of the same model pairs them."""
    b = Builder()
    x = b.param("x", DType.f32, ["N", 24])
    m = b.module(b.function("main", [x], [b.matmul(x, b.const(_f(24, 8)))]))
    plan = plan_bf16(m)
    assert plan.products == 0 and "run time" in plan.kept[0][2]
    model = compile(m, bf16=True, cache=False, input_shapes={"x": (3, 24)})
    assert model.manifest is not None and model.manifest["precision"]["bf16_products"] == 1


def test_batch_norms_after_products_are_folded_before_the_weights_are_rounded():
    """A torch export keeps its batch norms: folded afterwards they could not reach bfloat16 weights, so the
    plan folds them first (the manifest counts them) and no batch norm is left to run on its own."""
    b = Builder()
    x = b.param("x", DType.f32, [1, 4, 8, 8])
    y = b.conv(x, b.const(_f(6, 4, 3, 3, scale=0.3)), pads=(1, 1, 1, 1))
    params = [b.const(np.abs(_f(6)) + 0.5), b.const(_f(6)), b.const(_f(6)), b.const(np.abs(_f(6)) + 0.5)]
    m = b.module(b.function("main", [x], [b.relu(b.batch_norm(y, *params))]))
    plan = plan_bf16(m)
    assert plan.products == 1 and plan.folded_batch_norms == 1 and plan.manifest()["folded_batch_norms"] == 1
    assert "batch_norm" not in ops(plan.module) and "bf16_conv" in ops(plan.module)
    assert_same_results(m, plan.module, exact=False, rtol=RTOL, atol=ATOL, trials=3)
    assert plan_bf16(_mlp()).folded_batch_norms == 0
