"""compile(): models end to end, the artifact (library, manifest, header), the checked ABI,
and the scalar semantics the lowering must share with the interpreter."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess

import numpy as np
import pytest

from cuvil.codegen import abi
from cuvil.compiler import compile
from cuvil.errors import CodegenError, InputError, RuntimeEvalError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.runtime.loader import CompiledModel, CTensor

RNG = np.random.default_rng(7)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(np.abs(want[np.isfinite(want)]).max(initial=0.0))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * scale, equal_nan=True)


def _one_op_module(op: str, arrays: list[np.ndarray], **attrs):
    b = Builder()
    ps = [b.param(f"x{i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(arrays)]
    return b.module(b.function("main", ps, [b.op(op, *ps, **attrs)]))


def _mlp_module():
    b = Builder()
    x = b.param("x", DType.f32, [8, 32])
    h = b.relu(b.add(b.matmul(x, b.const(_f32(32, 64, scale=0.2))), b.const(_f32(64))))
    h = b.gelu(b.add(b.matmul(h, b.const(_f32(64, 48, scale=0.2))), b.const(_f32(48))))
    out = b.softmax(b.matmul(h, b.const(_f32(48, 10, scale=0.2))), axis=-1)
    return b.module(b.function("mlp", [x], [out], ["probs"]))


# --------------------------------------------------------------------------------------
# models end to end


def test_mlp_matches_interpreter(tmp_path):
    m = _mlp_module()
    model = compile(m, output_dir=tmp_path)
    x = _f32(8, 32)
    _assert_close(model(x), run_reference(m, [x])[0])
    np.testing.assert_allclose(model(x).sum(axis=-1), 1.0, rtol=1e-5)


def test_onnx_conv_net_matches_interpreter_and_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    init = {"w1": _f32(8, 3, 3, 3, scale=0.3), "b1": _f32(8), "scale": (RNG.random(8) + 0.5).astype(np.float32),
            "shift": _f32(8), "mean": _f32(8, scale=0.2), "var": (RNG.random(8) + 0.5).astype(np.float32),
            "w2": _f32(6, 8, 3, 3, scale=0.3), "wf": _f32(6, 5, scale=0.5), "bf": _f32(5)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["n1"], epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(v, k) for k, v in init.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _f32(2, 3, 12, 10)
    model = compile(proto, output_dir=tmp_path)
    got = model(x)
    import cuvil

    _assert_close(got, cuvil.run_reference(cuvil.import_model(proto), [x])[0])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    ops = set(model.manifest["ops"])
    assert {"max_pool", "softmax"} <= ops and {"conv", "fused"} & ops  # O3 fuses conv with its epilogue


# torch.export of the model dominates this test (about 25 s on two busy cores)
@pytest.mark.slow
def test_conv_net_from_torch_matches_interpreter_and_torch(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 6, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 5)).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 12, 10)
    model = compile(net, example_inputs=(x,), output_dir=tmp_path)
    got = model(x.numpy())
    import cuvil

    ref = cuvil.run_reference(cuvil.import_model(net, (x,)), [x.numpy()])[0]
    _assert_close(got, ref)
    with torch.no_grad():
        eager = net(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-5)


def test_onnx_mlp_matches_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    w1, b1, w2 = _f32(16, 24, scale=0.3), _f32(24), _f32(24, 4, scale=0.3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Tanh", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _f32(3, 16)
    got = compile(proto, output_dir=tmp_path)(x)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert onnx.checker.check_model(proto) is None


def test_symbolic_dims_need_specialization(tmp_path):
    b = Builder()
    x = b.param("x", DType.f32, ["N", 6])
    m = b.module(b.function("main", [x], [b.exp(x)]))
    with pytest.raises(CodegenError, match="symbolic"):
        compile(m, output_dir=tmp_path / "a")
    xs = _f32(5, 6)
    model = compile(m, example_inputs=[xs], output_dir=tmp_path / "b")
    assert model.manifest["specialized_dims"] == {"N": 5}
    assert model.manifest["inputs"][0]["shape"] == [5, 6]
    _assert_close(model(xs), np.exp(xs))
    with pytest.raises(InputError):
        model(_f32(4, 6))


def test_results_that_are_inputs_constants_or_repeated(tmp_path):
    b = Builder()
    x = b.param("x", DType.f32, [3])
    c = b.const(np.arange(4, dtype=np.int32))
    y = b.neg(x)
    m = b.module(b.function("main", [x], [y, x, c, y], ["y", "x_again", "c", "y_again"]))
    model = compile(m, output_dir=tmp_path)
    xs = _f32(3)
    y1, x1, c1, y2 = model(xs)
    np.testing.assert_array_equal(y1, -xs)
    np.testing.assert_array_equal(y2, -xs)
    np.testing.assert_array_equal(x1, xs)
    np.testing.assert_array_equal(c1, np.arange(4, dtype=np.int32))


def test_arena_is_reused_across_dead_intermediates(tmp_path):
    b = Builder()
    x = b.param("x", DType.f32, [64, 64])
    h = x
    for _ in range(6):
        h = b.tanh(b.add(h, x))
    m = b.module(b.function("main", [x], [h]))
    model = compile(m, output_dir=tmp_path)
    xs = _f32(64, 64)
    _assert_close(model(xs), run_reference(m, [xs])[0])
    one = 64 * 64 * 4
    assert model.manifest["arena_bytes"] <= 2 * one  # 11 intermediates, at most two alive at once


# --------------------------------------------------------------------------------------
# the artifact


def test_manifest_library_and_dependencies(tmp_path):
    model = compile(_mlp_module(), output_dir=tmp_path, name="mlp small")
    man = model.manifest
    assert man["symbol_prefix"] == "cuvil_mlp_small"
    assert man["inputs"] == [{"name": "x", "dtype": "f32", "dtype_code": abi.DTYPE_CODES[DType.f32],
                              "shape": [8, 32]}]
    assert man["outputs"][0]["name"] == "probs" and man["outputs"][0]["shape"] == [8, 10]
    assert man["target"]["triple"] and man["target"]["cpu"] and man["target"]["features"]
    assert man["function_hash"].startswith("f") and len(man["library_sha256"]) == 64
    assert json.loads((tmp_path / "cuvil_mlp_small.json").read_text()) == man
    header = (tmp_path / "cuvil_mlp_small.h").read_text()
    assert "int32_t cuvil_mlp_small_run_checked(" in header
    assert model.library_path == tmp_path / "libcuvil_mlp_small.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(model.library_path)], capture_output=True, text=True)
    if syms.returncode == 0:
        exported = {line.split()[-1] for line in syms.stdout.splitlines() if line.strip()}
        assert {"cuvil_mlp_small_create", "cuvil_mlp_small_run", "cuvil_mlp_small_run_checked",
                "cuvil_mlp_small_destroy"} <= exported
        assert all(s.startswith("cuvil_mlp_small_") or s.startswith("_") for s in exported), exported
    ldd = subprocess.run(["ldd", str(model.library_path)], capture_output=True, text=True)
    if ldd.returncode == 0:
        libs = [line.split()[0] for line in ldd.stdout.splitlines() if line.strip()]
        allowed = ("linux-vdso", "libc.so", "libm.so", "ld-linux", "/lib64/ld-linux")
        assert all(lib.startswith(allowed) for lib in libs), libs


def test_tampered_library_is_refused(tmp_path):
    model = compile(_one_op_module("exp", [_f32(4)]), output_dir=tmp_path)
    path, man = model.library_path, model.manifest
    model.close()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    # a new file in its place: the loaded library's pages stay the ones the process mapped
    tampered = path.with_suffix(".tampered")
    tampered.write_bytes(bytes(data))
    os.replace(tampered, path)
    with pytest.raises(CodegenError, match="hash"):
        CompiledModel(path, man)


def test_contiguous_loop_is_vectorized(tmp_path):
    m = _one_op_module("add", [_f32(256, 64), _f32(64)])
    compile(m, output_dir=tmp_path, keep_ir=True)
    ir_text = (tmp_path / "cuvil_main.ll").read_text()
    assert " x float>" in ir_text, "the broadcast add's inner loop was not vectorized"


# --------------------------------------------------------------------------------------
# the checked entry point


def test_python_side_rejects_bad_inputs_before_native_code(tmp_path, monkeypatch):
    model = compile(_one_op_module("add", [_f32(2, 3), _f32(3)]), output_dir=tmp_path)

    def never(*args):
        raise AssertionError("native code was called with bad inputs")

    monkeypatch.setattr(model, "_run_checked", never)
    with pytest.raises(InputError, match="shape"):
        model(_f32(3, 2), _f32(3))
    with pytest.raises(InputError, match="dtype"):
        model(_f32(2, 3).astype(np.float64), _f32(3))
    with pytest.raises(InputError, match="takes 2 inputs"):
        model(_f32(2, 3))
    with pytest.raises(InputError, match="missing"):
        model(x0=_f32(2, 3))


def _descriptor(a: np.ndarray, keep: list, shape=None, rank=None, dtype=None, data=True) -> CTensor:
    dims = tuple(a.shape) if shape is None else tuple(shape)
    arr = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    keep.append(arr)
    return CTensor(a.ctypes.data if data else None, ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64)),
                   len(dims) if rank is None else rank,
                   abi.DTYPE_CODES[DType.from_numpy(a.dtype)] if dtype is None else dtype)


def test_checked_entry_point_returns_error_codes_without_writing(tmp_path):
    assert ctypes.sizeof(CTensor) == 24  # the layout the header declares
    model = compile(_one_op_module("mul", [_f32(2, 3), _f32(2, 3)]), output_dir=tmp_path)
    lib = ctypes.CDLL(str(model.library_path))
    prefix = model.manifest["symbol_prefix"]
    run = getattr(lib, f"{prefix}_run_checked")
    run.restype = ctypes.c_int32
    run.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.c_int64, ctypes.POINTER(CTensor),
                    ctypes.c_int64]
    create = getattr(lib, f"{prefix}_create")
    create.restype = ctypes.c_void_p
    destroy = getattr(lib, f"{prefix}_destroy")
    destroy.argtypes = [ctypes.c_void_p]
    ctx = create()
    a, b = _f32(2, 3), _f32(2, 3)
    out = np.full((2, 3), 12345.0, np.float32)
    keep: list = []

    def call(ins, outs, n_in=None, n_out=None) -> int:
        tin = (CTensor * len(ins))(*ins)
        tout = (CTensor * len(outs))(*outs)
        return run(ctx, tin, len(ins) if n_in is None else n_in, tout, len(outs) if n_out is None else n_out)

    good_a, good_b, good_out = (_descriptor(t, keep) for t in (a, b, out))
    cases = {
        abi.ERR_SHAPE: ([good_a, _descriptor(b, keep, shape=(3, 2))], [good_out]),
        abi.ERR_RANK: ([good_a, _descriptor(b, keep, shape=(6,))], [good_out]),
        abi.ERR_DTYPE: ([good_a, _descriptor(b, keep, dtype=abi.DTYPE_CODES[DType.f64])], [good_out]),
        abi.ERR_NULL: ([good_a, _descriptor(b, keep, data=False)], [good_out]),
    }
    for code, (ins, outs) in cases.items():
        assert call(ins, outs) == code, abi.ERROR_NAMES[code]
    assert call([good_a, good_b], [_descriptor(out, keep, shape=(2, 4))]) == abi.ERR_SHAPE
    assert call([good_a, good_b], [good_out], n_in=1) == abi.ERR_ARITY
    np.testing.assert_array_equal(out, 12345.0)  # nothing was written
    assert call([good_a, good_b], [good_out]) == abi.OK
    np.testing.assert_array_equal(out, a * b)
    destroy(ctx)


def test_out_of_range_gather_index_is_an_error_not_a_read(tmp_path):
    x = _f32(5, 3)
    idx = np.array([0, 4, 2], np.int64)
    model = compile(_one_op_module("gather", [x, idx], axis=0), output_dir=tmp_path)
    np.testing.assert_array_equal(model(x, idx), x[idx])
    np.testing.assert_array_equal(model(x, np.array([-1, 0, -5], np.int64)), x[[-1, 0, -5]])
    for bad in ([0, 5, 1], [0, -6, 1], [2**40, 0, 0]):
        with pytest.raises(RuntimeEvalError):
            model(x, np.array(bad, np.int64))
        with pytest.raises(RuntimeEvalError):  # the interpreter refuses the same input
            run_reference(_one_op_module("gather", [x, idx], axis=0), [x, np.array(bad, np.int64)])


# --------------------------------------------------------------------------------------
# scalar semantics at the edges (differential against the interpreter)

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.5, 3.5, 1e-30, -1e-30, 3e38, -3e38, np.inf, -np.inf,
                    np.nan, 65504.0, 70000.0, 3e9, -3e9, 1e20, 127.9, -128.9, 255.5, 300.7], np.float32)


def _compare_with_interpreter(m, inputs, tmp_path, rtol=1e-5) -> None:
    got = compile(m, output_dir=tmp_path).run(inputs)
    want = run_reference(m, inputs)
    for g, w in zip(got, want, strict=True):
        if np.dtype(w.dtype).kind == "f" or w.dtype == DType.bf16.np:
            _assert_close(g.astype(np.float64), w.astype(np.float64), rtol)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("to", [DType.i8, DType.u8, DType.i16, DType.u16, DType.i32, DType.u32, DType.i64,
                                DType.u64, DType.bool, DType.f16, DType.bf16, DType.f64])
def test_float_casts_at_special_values(to, tmp_path):
    _compare_with_interpreter(_one_op_module("cast", [SPECIAL], to=to), [SPECIAL], tmp_path)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_integer_division_modulo_and_shifts_at_the_edges(dtype, tmp_path):
    info = np.iinfo(dtype)
    vals = np.array([info.min, info.min + 1, -7 if info.min < 0 else 7, 0, 1, 7, info.max], dtype)
    a = np.repeat(vals, len(vals))
    b = np.tile(np.array([0, 1, 2, 3, info.max, info.min if info.min < 0 else 5, -1 if info.min < 0 else 9],
                         dtype), len(vals))
    bb = Builder()
    x, y = bb.param("a", DType.from_numpy(a.dtype), a.shape), bb.param("b", DType.from_numpy(b.dtype), b.shape)
    outs = [bb.div(x, y), bb.mod(x, y), bb.mod(x, y, fmod=True), bb.min(x, y), bb.max(x, y), bb.mul(x, y),
            bb.bit_shift(x, y, direction="left"), bb.bit_shift(x, y, direction="right"), bb.abs(x), bb.neg(x)]
    m = bb.module(bb.function("main", [x, y], outs))
    _compare_with_interpreter(m, [a, b], tmp_path)


def test_float_binary_ops_at_special_values(tmp_path):
    a = np.repeat(SPECIAL[:15], 15)
    b = np.tile(SPECIAL[:15], 15)
    bb = Builder()
    x, y = bb.param("a", DType.f32, a.shape), bb.param("b", DType.f32, b.shape)
    outs = [bb.min(x, y), bb.max(x, y), bb.mod(x, y), bb.mod(x, y, fmod=True), bb.div(x, y), bb.pow(x, y),
            bb.equal(x, y), bb.not_equal(x, y), bb.less(x, y), bb.greater_equal(x, y)]
    m = bb.module(bb.function("main", [x, y], outs))
    _compare_with_interpreter(m, [a, b], tmp_path)


def test_unary_float_ops_at_special_values(tmp_path):
    bb = Builder()
    x = bb.param("x", DType.f32, SPECIAL.shape)
    outs = [getattr(bb, op)(x) for op in ("abs", "neg", "floor", "ceil", "round", "sqrt", "exp", "log", "tanh",
                                          "erf", "sigmoid", "relu", "isnan", "sign")]
    m = bb.module(bb.function("main", [x], outs))
    _compare_with_interpreter(m, [SPECIAL], tmp_path)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_precision_rounds_after_every_primitive(dtype, tmp_path):
    # chains whose f32 result differs from the f16/bf16-per-step result: only per-step rounding matches
    a = (RNG.standard_normal(257) * 3).astype(dtype.np)
    b = (RNG.standard_normal(257) * 3).astype(dtype.np)
    bb = Builder()
    x, y = bb.param("x", dtype, a.shape), bb.param("y", dtype, b.shape)
    out = bb.div(bb.mul(bb.add(x, y), bb.sub(x, y)), bb.add(bb.abs(y), bb.const(np.array(0.1, dtype.np))))
    m = bb.module(bb.function("main", [x, y], [out, bb.exp(bb.neg(bb.mul(x, x)))]))
    got = compile(m, output_dir=tmp_path).run([a, b])
    want = run_reference(m, [a, b])
    np.testing.assert_array_equal(got[0].view(np.uint16), want[0].view(np.uint16))
    np.testing.assert_allclose(got[1].astype(np.float32), want[1].astype(np.float32), rtol=1e-2, atol=1e-3)


def test_max_and_min_reductions_propagate_nan(tmp_path):
    x = _f32(4, 7)
    x[1, 3] = np.nan
    x[3, 0] = np.nan
    bb = Builder()
    p = bb.param("x", DType.f32, x.shape)
    outs = [bb.reduce_max(p, axes=(1,)), bb.reduce_min(p, axes=(0,)), bb.reduce_sum(p, axes=(1,)),
            bb.reduce_prod(p, axes=(0,))]
    m = bb.module(bb.function("main", [p], outs))
    got = compile(m, output_dir=tmp_path).run([x])
    assert np.isnan(got[0][[1, 3]]).all() and not np.isnan(got[0][[0, 2]]).any()
    _compare_with_interpreter(m, [x], tmp_path / "again")


# --------------------------------------------------------------------------------------
# the reference zoo (reduced profile), through ONNX


# compiling the whole reduced zoo takes about a minute on two cores
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v1", "bert"])
def test_zoo_model_compiles_and_matches_interpreter(name, tmp_path):
    pytest.importorskip("torch")
    import cuvil
    from bench.models import ZOO_SMALL

    entry = ZOO_SMALL[name]
    m = cuvil.import_model(entry.to_onnx())
    xs = entry.example_inputs_numpy()
    got = compile(m, output_dir=tmp_path).run(xs)
    for g, w in zip(got, run_reference(m, xs), strict=True):
        _assert_close(g, w, rtol=1e-4)


def test_compiling_twice_gives_the_same_bytes(tmp_path):
    """Generated code depends on the function only (no process-wide counters): the same model
    compiled twice in one process is the same library, bit for bit."""
    b = Builder()
    x = b.param("x", DType.f32, [64, 64])
    m = b.module(b.function("main", [x], [b.relu(b.matmul(x, b.const(np.ones((64, 64), np.float32))))]))
    digests = [compile(m, cache=False, output_dir=tmp_path / str(k)).manifest["library_sha256"] for k in range(2)]
    assert digests[0] == digests[1]
