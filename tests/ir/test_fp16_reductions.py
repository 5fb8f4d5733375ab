"""Reductions of halves accumulate in f32 and round once: reduce_sum, reduce_mean and avg_pool (sum and
divide in f32), layer_norm's two means and softmax's denominator. Checked against PyTorch's and ONNX Runtime's
FP16 results on CPU (both accumulate half reductions in f32), the overflow prober (no false alarm
at a mean of squares; a real overflow still confirmed) and the compiled library (bit for bit).

Where engines differ, Cuvil implements: a reduction op's own result is rounded to the half type
(a sum of squares above 65504 is inf, as torch.sum and ORT ReduceSumSquare give), the elementwise
ops around it round every step (a decomposed graph's square overflows above 256, as in PyTorch's
decomposed FP16 graph), and layer_norm on halves is its decomposition (both means in f32, the
deviations and squares in the half type), whereas the layer_norm op on halves normalizes in f32
and rounds once, as PyTorch's fused F.layer_norm and ORT's LayerNormalization do (eps = 1e-12 keeps
its f32 value instead of flushing to zero in a half; a constant row gives the bias, not NaN).
ONNX ReduceL2 is imported as sqrt(reduce_sum(x * x)), so its squares and sum are halves, while ORT
computes ReduceL2 in f32 (finite for inputs whose sum of squares exceeds 65504).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, Module
from cuvil.ir.evaluate import evaluate_op, evaluate_rule
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType
from verify.probe.probe import EXIT_OVERFLOW, OVERFLOW, SAFE, ProbeOptions, ProbeReport, probe

F16 = np.float16
FEATURES = 32
HALVES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def _uniform(lo: float, hi: float, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


# --------------------------------------------------------------------------------------
# the rule, and the fast paths that must equal it


def _rule_and_fast(name: str, arrays: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    op = get_op(name)
    full = op.check_attrs(attrs)
    out = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
    return evaluate_rule(op, arrays, full, out), evaluate_op(op, arrays, full, out)


CASES = {
    "reduce_sum": lambda x: ([x], {"axes": (1,)}),
    "reduce_sum all": lambda x: ([x], {}),
    "reduce_mean": lambda x: ([x], {"axes": (0, 2), "keepdims": True}),
    "layer_norm": lambda x: ([x, np.ones(x.shape[-1], x.dtype), np.zeros(x.shape[-1], x.dtype)], {"axis": 1}),
}


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_paths_equal_the_rules_for_halves(case: str, dtype: np.dtype) -> None:
    x = (_uniform(-1, 1, (3, 300, 5)) * 500).astype(dtype)
    arrays, attrs = CASES[case](x)
    rule, fast = _rule_and_fast(case.split()[0], arrays, attrs)
    assert rule.dtype == fast.dtype == dtype
    np.testing.assert_array_equal(_bits(rule), _bits(fast))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_sum_and_mean_are_the_f32_left_fold_rounded_once(dtype: np.dtype) -> None:
    x = (_uniform(-1, 1, (2, 4096)) + 1).astype(dtype)
    wide = x.astype(np.float32)
    fold = np.add.accumulate(wide, axis=1, dtype=np.float32)[:, -1]
    total, _ = _rule_and_fast("reduce_sum", [x], {"axes": (1,)})
    mean, _ = _rule_and_fast("reduce_mean", [x], {"axes": (1,)})
    np.testing.assert_array_equal(_bits(total), _bits(fold.astype(dtype)))
    np.testing.assert_array_equal(_bits(mean), _bits((fold / np.float32(4096)).astype(dtype)))


def test_a_mean_of_halves_whose_sum_exceeds_the_half_range_is_finite() -> None:
    x = np.full((1, 64), 2000.0, F16)  # the sum, 128000, is not a half; the mean is
    mean, _ = _rule_and_fast("reduce_mean", [x], {"axes": (1,)})
    assert mean.dtype == F16 and float(mean[0]) == 2000.0
    total, _ = _rule_and_fast("reduce_sum", [x], {"axes": (1,)})
    assert np.isinf(total[0])  # the op's own result is a half: torch.sum and ORT ReduceSum overflow too


def test_integer_and_f32_rules_have_no_casts() -> None:
    """Only halves are widened: an f32 or integer reduction reads exactly as before."""
    for dt in (DType.f32, DType.i32):
        op = get_op("reduce_mean")
        rule = op.make_rule([TensorType(dt, (3, 4))], op.check_attrs({"axes": (1,)}), TensorType(dt, (3,)))
        assert "cast" not in repr(rule)


# --------------------------------------------------------------------------------------
# models: the decomposed layer norm, a mean, softmax and an L2 norm


def _decomposed_layer_norm(b: Builder, x):  # type: ignore[no-untyped-def]
    mean = b.reduce_mean(x, axes=(-1,), keepdims=True)
    dev = b.sub(x, mean)
    var = b.reduce_mean(b.mul(dev, dev), axes=(-1,), keepdims=True)
    return b.mul(dev, b.rsqrt(b.add(var, b.scalar(1e-5, x.dtype))))


def _decomposed_softmax(b: Builder, x):  # type: ignore[no-untyped-def]
    e = b.exp(b.sub(x, b.reduce_max(x, axes=(-1,), keepdims=True)))
    return b.div(e, b.reduce_sum(e, axes=(-1,), keepdims=True))


def _l2(b: Builder, x):  # type: ignore[no-untyped-def]
    return b.sqrt(b.reduce_sum(b.mul(x, x), axes=(-1,)))


def _mean(b: Builder, x):  # type: ignore[no-untyped-def]
    return b.reduce_mean(x, axes=(-1,))


MODELS = {"layer_norm": _decomposed_layer_norm, "softmax": _decomposed_softmax, "l2": _l2, "mean": _mean}


def _module(build, shape: tuple[int, ...], dtype: DType) -> Module:  # type: ignore[no-untyped-def]
    b = Builder()
    x = b.param("x", dtype, list(shape))
    return b.module(b.function("main", [x], [build(b, x)]))


def _torch(name: str, x: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.astype(F16))
    out = {"layer_norm": lambda: torch.nn.functional.layer_norm(t, (t.shape[-1],)),
           "softmax": lambda: torch.softmax(t, -1),
           "l2": lambda: torch.linalg.vector_norm(t, dim=-1),
           "mean": lambda: t.mean(-1)}[name]()
    assert out.dtype == torch.float16
    return out.numpy()


def _ort(name: str, x: np.ndarray) -> np.ndarray:
    """The same computation as an ONNX graph in FP16 on ONNX Runtime's CPU provider (which runs
    FP16 LayerNormalization, Softmax, ReduceL2 and ReduceMean)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    n = x.shape[-1]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    ones = helper.make_tensor("one", TensorProto.FLOAT16, [n], [1.0] * n)
    zeros = helper.make_tensor("zero", TensorProto.FLOAT16, [n], [0.0] * n)
    node, inits = {
        "layer_norm": (helper.make_node("LayerNormalization", ["x", "one", "zero"], ["y"], axis=-1, epsilon=1e-5),
                       [ones, zeros]),
        "softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=-1), []),
        "l2": (helper.make_node("ReduceL2", ["x", "axes"], ["y"], keepdims=0), [axes]),
        "mean": (helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0), [axes]),
    }[name]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(F16)})[0]


# inputs in a box where every engine's FP16 result is finite; the f16 left fold of the same sums
# overflows (layer norm, mean) or stalls at 2048 (softmax and L2 over 4096 terms)
AGREE = {
    "layer_norm": ((4, FEATURES), 100.0, 2e-3, 2e-3),
    "mean": ((4, 64), 2000.0, 1e-3, 1.0),
    "softmax": ((2, 4096), 0.01, 2e-3, 1e-6),
    "l2": ((2, 4096), 1.0, 2e-3, 1e-3),
}


def _agree_inputs(name: str) -> np.ndarray:
    shape, r, _, _ = AGREE[name]
    x = _uniform(-r, r, shape).astype(F16)
    if name == "mean":
        x[0] = F16(r)  # a row whose f16 sum would be 128000
    return x


@pytest.mark.parametrize("name", sorted(AGREE))
def test_interpreter_matches_pytorch_and_onnx_runtime_fp16(name: str) -> None:
    x = _agree_inputs(name)
    shape, _, rtol, atol = AGREE[name]
    (got,) = run_reference(_module(MODELS[name], shape, DType.f16), [x])
    assert got.dtype == F16 and np.isfinite(got).all()
    for engine in (_torch, _ort):
        want = engine(name, x)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=atol,
                                   err_msg=engine.__name__)


def test_the_f16_left_fold_would_be_wrong_on_those_inputs() -> None:
    """What the old semantics computed: the sums of the agreeing cases do not survive an f16 fold."""
    ln = _agree_inputs("layer_norm").astype(np.float32)
    dev = (ln - ln.mean(-1, keepdims=True)).astype(F16)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.add.accumulate(dev * dev, axis=-1, dtype=F16)[:, -1]).all()
    ones = np.ones(4096, F16)
    assert float(np.add.accumulate(ones, dtype=F16)[-1]) == 2048.0


# --------------------------------------------------------------------------------------
# the prober: proved where every engine is finite, confirmed where PyTorch's FP16 graph overflows too


def _probe(name: str, shape: tuple[int, ...], r: float, z3_witness: bool = True) -> ProbeReport:
    return probe(_module(MODELS[name], shape, DType.f32), {"x": (-r, r)},
                 ProbeOptions(precision="fp16", time_limit=30, boundary=False, z3_witness=z3_witness))


def _sites(rep: ProbeReport, op: str) -> list:  # type: ignore[type-arg]
    return [s for s in rep.sites if s.op == op]


PROVED = {  # model, shape, box radius, the reduction whose site must be proved safe
    "layer_norm": ((4, FEATURES), 100.0, "reduce_mean"),
    "mean": ((4, 64), 2000.0, "reduce_mean"),
    "softmax": ((2, 64), 3.0, "reduce_sum"),  # intervals lose x - max across ops: exp(x - max) <= e^6
    "l2": ((2, 16), 60.0, "reduce_sum"),
}


@pytest.mark.parametrize("name", sorted(PROVED))
def test_probe_proves_the_reductions_safe_where_engines_are_finite(name: str) -> None:
    shape, r, op = PROVED[name]
    rep = _probe(name, shape, r)
    assert rep.exit_code != EXIT_OVERFLOW and not [s for s in rep.sites if s.verdict == OVERFLOW]
    reductions = _sites(rep, op)
    assert reductions and all(s.verdict == SAFE for s in reductions), [(s.name, s.verdict) for s in reductions]


def test_probe_proves_the_mean_of_squares_where_the_f16_sum_overflows() -> None:
    """32 squares up to 40,000 sum past 65504; their f32 sum divided by 32 does not."""
    rep = _probe("layer_norm", (4, FEATURES), 100.0)
    means = _sites(rep, "reduce_mean")
    assert len(means) == 2 and all(s.verdict == SAFE for s in means)
    assert max(s.bound_hi for s in means) <= 65504.0


def test_probe_confirms_the_square_overflow_pytorch_fp16_has_too() -> None:
    """In [-1000, 1000] a deviation above 256 squares past 65504: the square overflows in PyTorch's
    decomposed FP16 graph as in Cuvil's (PyTorch's fused F.layer_norm computes in f32 and stays finite)."""
    torch = pytest.importorskip("torch")
    # the gradient search finds the square's witness; z3's stage would only spend its query limits on the
    # sites after it, which stay open either way (five queries, 28 s on a 2-core Zen 3)
    rep = _probe("layer_norm", (4, FEATURES), 1000.0, z3_witness=False)
    assert rep.exit_code == EXIT_OVERFLOW
    squares = [s for s in _sites(rep, "mul") if s.verdict == OVERFLOW]
    assert squares and all(s.op != "reduce_mean" for s in rep.sites if s.verdict == OVERFLOW)
    x = torch.from_numpy(_uniform(-1000, 1000, (4, FEATURES)).astype(F16))
    dev = x - x.mean(-1, keepdim=True)
    assert not torch.isfinite(dev * dev).all()
    assert torch.isfinite(torch.nn.functional.layer_norm(x, (FEATURES,))).all()


def test_probe_confirms_an_input_beyond_the_half_range_before_a_mean() -> None:
    rep = _probe("mean", (1, 8), 70000.0)
    assert rep.exit_code == EXIT_OVERFLOW
    assert [s for s in rep.sites if s.verdict == OVERFLOW and s.op == "cast"]


def test_probe_confirms_the_unshifted_softmax_exp_overflow() -> None:
    torch = pytest.importorskip("torch")
    b = Builder()
    x = b.param("x", DType.f32, [2, 16])
    e = b.exp(x)
    m = b.module(b.function("main", [x], [b.div(e, b.reduce_sum(e, axes=(-1,), keepdims=True))]))
    rep = probe(m, {"x": (-20.0, 20.0)}, ProbeOptions(precision="fp16", time_limit=30, boundary=False))
    assert [s for s in _sites(rep, "exp") if s.verdict == OVERFLOW]
    assert not torch.isfinite(torch.exp(torch.tensor([20.0], dtype=torch.float16))).all()


# --------------------------------------------------------------------------------------
# the compiled library


def test_compiled_fp16_reductions_equal_the_interpreter_bit_for_bit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cuvil.compiler import compile

    b = Builder()
    x = b.param("x", DType.f16, [4, 256])
    outs = [b.reduce_sum(x, axes=(1,)), b.reduce_mean(x, axes=(0, 1)), _decomposed_layer_norm(b, x),
            _decomposed_softmax(b, x), _l2(b, x),
            b.layer_norm(x, b.const(np.ones(256, F16)), b.const(np.zeros(256, F16)))]
    m = b.module(b.function("main", [x], outs))
    xs = (_uniform(-1, 1, (4, 256)) * 100).astype(F16)
    got = compile(m, output_dir=tmp_path).run([xs])
    want = run_reference(m, [xs])
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype == F16
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"output {k}")


def _layer_norm_op(dtype: DType, eps: float, features: int = FEATURES, params: DType | None = None) -> Module:
    """A layer_norm in ``dtype`` whose scale and bias are halves (``params``) held in ``dtype``."""
    b = Builder()
    x = b.param("x", dtype, [4, features])
    rng = np.random.default_rng(5)
    held = (params or dtype).np
    scale, bias = (b.const(rng.standard_normal(features).astype(held).astype(dtype.np)) for _ in range(2))
    return b.module(b.function("main", [x], [b.layer_norm(x, scale, bias, epsilon=eps)]))


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_the_layer_norm_op_on_halves_is_the_f32_layer_norm_rounded_once(dtype: DType) -> None:
    half = _layer_norm_op(dtype, 1e-12)
    wide = _layer_norm_op(DType.f32, 1e-12, params=dtype)
    x = (_uniform(-1, 1, (4, FEATURES)) * 50).astype(dtype.np)
    x[1] = x[1, 0]  # a constant row: variance 0, eps alone keeps it finite
    (got,) = run_reference(half, [x])
    (want,) = run_reference(wide, [x.astype(np.float32)])
    np.testing.assert_array_equal(_bits(got), _bits(want.astype(dtype.np)))
    assert np.isfinite(got.astype(np.float32)).all()


def test_the_layer_norm_op_on_halves_matches_pytorch_and_onnx_runtime_with_a_bert_epsilon() -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    m = _layer_norm_op(DType.f16, 1e-12)
    scale, bias = (np.asarray(m.constant(v)) for v in m.main.results[0].operands[1:])
    x = (_uniform(-1, 1, (4, FEATURES)) * 50).astype(F16)
    x[1] = x[1, 0]
    (got,) = run_reference(m, [x])
    t = torch.nn.functional.layer_norm(torch.from_numpy(x), (FEATURES,), torch.from_numpy(scale),
                                       torch.from_numpy(bias), eps=1e-12).numpy()
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-12)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    o = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for want in (t, o):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(got[1], bias)  # the constant row: (x - mean) is 0 exactly


def test_probe_proves_the_layer_norm_op_on_halves_for_any_input_in_the_half_range() -> None:
    """Normalized in f32 with eps = 1e-12 kept: |x - mean| / sqrt(var + eps) <= sqrt(n) for every row,
    so the op is proved finite whatever its input (the old half semantics flushed eps and could be NaN)."""
    rep = probe(_layer_norm_op(DType.f32, 1e-12), {"x": (-60000.0, 60000.0)},
                ProbeOptions(precision="fp16", boundary=False))
    (site,) = _sites(rep, "layer_norm")
    assert site.verdict == SAFE and not site.may_nan


def test_layer_norm_on_halves_equals_its_decomposition_bit_for_bit() -> None:
    """decompose-layer-norm widens a half layer_norm to f32 and rounds once, so it stays exact on halves."""
    from cuvil.passes.decompose import Decompose

    b = Builder()
    x = b.param("x", DType.f16, [3, FEATURES])
    rng = np.random.default_rng(4)
    m = b.module(b.function("main", [x], [b.layer_norm(x, b.const(rng.standard_normal(FEATURES).astype(F16)),
                                                         b.const(rng.standard_normal(FEATURES).astype(F16)))]))
    down = Decompose().run(m).module
    xs = (_uniform(-1, 1, (3, FEATURES)) * 100).astype(F16)
    np.testing.assert_array_equal(_bits(run_reference(m, [xs])[0]), _bits(run_reference(down, [xs])[0]))


# --------------------------------------------------------------------------------------
# average pooling


_POOL = {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("include_pad", [False, True])
def test_avg_pool_of_halves_is_the_f32_mean_rounded_once(dtype: np.dtype, include_pad: bool) -> None:
    """The window's f32 sum over its count, rounded once: the fast path equals the rule bit for bit, and a
    corner window of four 60,000s (an f16 sum of 240,000) averages to 60,000, as PyTorch's FP16 avg_pool2d gives."""
    x = (_uniform(-1, 1, (2, 3, 9, 8)) * 500).astype(dtype)
    x[0, 0, :3, :3] = 60000 if dtype == np.float16 else 300  # (bfloat16 has float32's range)
    attrs = {**_POOL, "count_include_pad": include_pad}
    rule, fast = _rule_and_fast("avg_pool", [x], attrs)
    assert rule.dtype == fast.dtype == dtype
    np.testing.assert_array_equal(_bits(rule), _bits(fast))
    wide = x.astype(np.float32)
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(wide), 3, 2, 1, count_include_pad=include_pad).numpy()
    np.testing.assert_allclose(rule.astype(np.float32), want, rtol=8e-3 if dtype != np.float16 else 1e-3, atol=1e-3)
    if dtype == np.float16:
        # the corner window holds four 60,000s (an f16 sum of 240,000)
        assert np.isfinite(rule[0, 0, 0, 0].astype(np.float32))
        if not include_pad:
            assert float(rule[0, 0, 0, 0]) == 60000
        t16 = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 3, 2, 1, count_include_pad=include_pad).numpy()
        np.testing.assert_allclose(rule.astype(np.float32), t16.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_compiled_avg_pool_of_halves_equals_the_interpreter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cuvil.compiler import compile

    b = Builder()
    x = b.param("x", DType.f16, [1, 4, 10, 10])
    m = b.module(b.function("main", [x], [b.avg_pool(x, **_POOL)]))
    xs = (_uniform(-1, 1, (1, 4, 10, 10)) * 30000).astype(F16)
    got = compile(m, output_dir=tmp_path).run([xs])[0]
    want = run_reference(m, [xs])[0]
    assert np.isfinite(want.astype(np.float32)).all()
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("attrs", [{}, {"exclusive": True}, {"reverse": True}, {"exclusive": True, "reverse": True}])
def test_cumsum_of_halves_is_the_f32_running_sum_rounded_once(dtype: np.dtype, attrs: dict) -> None:
    """Each output is the f32 running sum rounded once: the fast path equals the rule bit for bit, a running
    sum of 4,096 values near 1 keeps counting past 2,048 (where an f16 running sum stalls), and PyTorch's
    FP16 cumsum agrees within an ulp."""
    x = (_uniform(0.5, 1.5, (2, 4096))).astype(dtype)
    full = {"axis": 1, **attrs}
    rule, fast = _rule_and_fast("cumsum", [x], full)
    assert rule.dtype == fast.dtype == dtype
    np.testing.assert_array_equal(_bits(rule), _bits(fast))
    wide = np.cumsum(x.astype(np.float32)[:, ::-1] if attrs.get("reverse") else x.astype(np.float32), axis=1)
    top = float(wide[0, -1])
    got = float(rule[0, 0] if attrs.get("reverse") else rule[0, -1])
    if not attrs.get("exclusive"):
        assert abs(got - top) <= 0.01 * top and top > 3000  # an f16 running sum would stop near 2,048
    if dtype == np.float16 and not attrs:
        torch = pytest.importorskip("torch")
        want = torch.cumsum(torch.from_numpy(x), dim=1).numpy()
        np.testing.assert_allclose(rule.astype(np.float32), want.astype(np.float32), rtol=1e-3)


def test_compiled_cumsum_of_halves_equals_the_interpreter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cuvil.compiler import compile

    b = Builder()
    x = b.param("x", DType.f16, [3, 300])
    m = b.module(b.function("main", [x], [b.cumsum(x, axis=1), b.cumsum(x, axis=0, reverse=True, exclusive=True)]))
    xs = _uniform(0, 100, (3, 300)).astype(F16)
    got = compile(m, output_dir=tmp_path).run([xs])
    for g, w in zip(got, run_reference(m, [xs]), strict=True):
        np.testing.assert_array_equal(_bits(g), _bits(w))
