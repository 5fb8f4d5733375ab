"""The reduced-precision program the probe analyses is the one the compiler builds."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.rulewalk import RuleInfo
from cuvil.passes.fp16 import KEEP_FP32, Fp16
from verify.probe.program import SiteWatch, reduced_program, site_values


def _model():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, [2, 8])
    h = b.relu(b.add(b.matmul(x, b.const(rng.standard_normal((8, 16)).astype(np.float32))),
                     b.const(rng.standard_normal(16).astype(np.float32))))
    s = b.softmax(b.matmul(h, b.const(rng.standard_normal((16, 4)).astype(np.float32))))
    big = b.mul(s, b.const(np.float32(1e6)))  # a constant beyond float16: this op stays float32
    return b.module(b.function("main", [x], [b.exp(big)]))


def test_default_keep_list_matches_the_fp16_pass() -> None:
    m = _model()
    ours = reduced_program(m, "fp16", keep_ops="default").module
    theirs = Fp16().run(m).module
    assert ours == theirs


def test_custom_keep_list_matches_the_fp16_pass() -> None:
    m = _model()
    ours = reduced_program(m, "fp16", keep_ops=("relu",)).module
    theirs = Fp16(keep_fp32=("cast", "relu")).run(m).module
    assert ours == theirs


def test_probe_default_runs_everything_narrow_but_casts() -> None:
    m = _model()
    prog = reduced_program(m, "fp16")
    ops = {v.op: v.dtype for v in prog.function.ops() if v.op != "cast"}
    assert ops["softmax"] is DType.f16 and ops["exp"] is DType.f16  # in KEEP_FP32, still narrow here
    assert ops["mul"] is DType.f32  # its constant does not fit float16
    assert "softmax" in KEEP_FP32
    assert all(prog.origin[v].op == v.op for v in prog.function.ops() if v.op != "cast")


def test_bf16_program() -> None:
    prog = reduced_program(_model(), "bf16")
    dtypes = {v.dtype for v in prog.function.ops()}
    assert DType.bf16 in dtypes and DType.f16 not in dtypes
    # 1e6 fits bfloat16's range: the multiply is narrow too
    assert next(v for v in prog.function.ops() if v.op == "mul").dtype is DType.bf16


def test_sites_are_the_narrow_values() -> None:
    prog = reduced_program(_model(), "fp16")
    sites = site_values(prog)
    assert sites and all(v.dtype is DType.f16 for v in sites)
    watch = SiteWatch(prog)
    mm = next(v for v in sites if v.op == "matmul")
    nodes = watch(mm, RuleInfo.of(mm))
    assert 0 in nodes and len(nodes) == 1  # the rounded result: products of halves accumulate in f32


def test_unknown_precision_is_an_input_error() -> None:
    from cuvil.errors import InputError

    with pytest.raises(InputError):
        reduced_program(_model(), "fp8")
