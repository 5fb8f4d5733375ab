"""Elementwise ops against independent oracles (PyTorch in f64, Python scalar arithmetic) on random
and edge inputs (+-0, +-inf, NaN, huge, tiny, integer min/max). Each op is run through the
interpreter twice: its numpy fast path (via a built module) and its compute rule."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cuvil.errors import OpDefinitionError, ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType
from tests.ir.op_testing import run_op

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
SIGNED = [np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)]
UNSIGNED = [np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64)]
TOL = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-12, 1e-300),
       np.dtype(np.float16): (2e-3, 1e-4), BF16: (1.6e-2, 1e-3)}

EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -3.0,
         1e-30, -1e-30, 1e30, -1e30, 1e-40, 88.0, -88.0, 20.0, -20.0, 1e-7, -1e-7, 100.0, -100.0, 0.999, -1.001]


def float_inputs(dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Random values followed by every edge value, as ``dtype`` (huge values overflow to inf in f16)."""
    with np.errstate(all="ignore"):
        vals = np.concatenate([rng.standard_normal(31) * 3, np.array(EDGES)])
        return vals.astype(dtype).reshape(4, 15)


def int_inputs(dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [0, 1, 2, 7, 100 % (int(info.max) + 1), int(info.max), int(info.max) - 1, int(info.min), int(info.min) + 1]
    if info.min < 0:
        edges += [-1, -2, -7]
    rand = rng.integers(max(int(info.min), -1000), min(int(info.max), 1000), size=24 - len(edges) % 24)
    return np.concatenate([np.array(edges, dtype=dtype), rand.astype(dtype)])[:24].reshape(4, 6)


def assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype in TOL:
        rtol, atol = TOL[got.dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check(name: str, arrays: list[np.ndarray], want: np.ndarray, **attrs: Any) -> None:
    fast, rule = run_op(name, arrays, **attrs)
    assert_matches(fast, want, f"{name} fast path {attrs}")
    assert_matches(rule, want, f"{name} rule {attrs}")


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype.kind == "f" or a.dtype == BF16:
        return torch.from_numpy(a.astype(np.float64))
    return torch.from_numpy(np.ascontiguousarray(a))


def from_torch(t: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """Round a (typically f64) oracle result to ``dtype`` the way a cast does."""
    arr = t.detach().numpy()
    with np.errstate(all="ignore"):
        return arr.astype(dtype)


def pyfunc(fn: Callable[..., Any], out: np.dtype) -> Callable[..., np.ndarray]:
    """An elementwise oracle from Python scalar arithmetic (exceptions read as NaN)."""

    def safe(*xs: Any) -> Any:
        try:
            return fn(*xs)
        except (ZeroDivisionError, ValueError, OverflowError):
            return math.nan

    vec = np.frompyfunc(safe, 2, 1)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return vec(a.astype(np.float64), b.astype(np.float64)).astype(np.float64).astype(out)

    return run


# --------------------------------------------------------------------------------------
# unary float ops

UNARY_TORCH: dict[str, tuple[Callable[..., torch.Tensor], dict[str, Any]]] = {
    "neg": (torch.neg, {}), "abs": (torch.abs, {}), "exp": (torch.exp, {}), "log": (torch.log, {}),
    "sqrt": (torch.sqrt, {}), "rsqrt": (torch.rsqrt, {}), "reciprocal": (torch.reciprocal, {}),
    "tanh": (torch.tanh, {}), "sigmoid": (torch.sigmoid, {}), "erf": (torch.erf, {}), "relu": (torch.relu, {}),
    "sin": (torch.sin, {}), "cos": (torch.cos, {}), "tan": (torch.tan, {}), "asin": (torch.asin, {}),
    "acos": (torch.acos, {}), "atan": (torch.atan, {}), "sinh": (torch.sinh, {}), "cosh": (torch.cosh, {}),
    "asinh": (torch.asinh, {}), "acosh": (torch.acosh, {}), "atanh": (torch.atanh, {}),
    "floor": (torch.floor, {}), "ceil": (torch.ceil, {}), "round": (torch.round, {}),
    "silu": (F.silu, {}), "mish": (F.mish, {}), "softsign": (F.softsign, {}), "hardswish": (F.hardswish, {}),
    "softplus": (lambda x: F.softplus(x, threshold=1000.0), {}),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), {"alpha": 0.1}),
    "elu": (lambda x: F.elu(x, 0.7), {"alpha": 0.7}),
    "selu": (torch.selu, {"alpha": 1.6732632423543772848170429916717, "gamma": 1.0507009873554804934193349852946}),
    "celu": (lambda x: F.celu(x, 1.5), {"alpha": 1.5}),
    # not F.threshold: it passes NaN through, ONNX ThresholdedRelu maps it to 0 like any x <= alpha
    "thresholded_relu": (lambda x: torch.where(x > 0.8, x, 0.0), {"alpha": 0.8}),
    "sign": (lambda x: torch.where(torch.isnan(x), x, torch.sign(x)), {}),
    "isnan": (torch.isnan, {}),
    "isinf": (torch.isinf, {}),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY_TORCH))
def test_unary_float_ops_match_torch(name: str, dtype: np.dtype) -> None:
    fn, attrs = UNARY_TORCH[name]
    x = float_inputs(dtype, np.random.default_rng(1))
    want = fn(to_torch(x))
    out_dtype = np.dtype(bool) if want.dtype == torch.bool else dtype
    check(name, [x], from_torch(want, out_dtype), **attrs)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_its_formula_in_f64(approximate: str, dtype: np.dtype) -> None:
    x = float_inputs(dtype, np.random.default_rng(2))
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            want = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        else:
            want = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    # torch agrees on finite inputs (it gives NaN for gelu(+inf), the formula +inf)
    finite = np.isfinite(v)
    torch_want = F.gelu(to_torch(x), approximate=approximate).numpy()
    np.testing.assert_allclose(torch_want[finite], want[finite], rtol=1e-7, atol=1e-300)
    check("gelu", [x], want.astype(dtype), approximate=approximate)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_hardsigmoid_matches_onnx_formula(dtype: np.dtype) -> None:
    x = float_inputs(dtype, np.random.default_rng(3))
    v = x.astype(np.float64)
    want = np.where(np.isnan(v), np.nan, np.minimum(np.maximum(0.3 * v + 0.4, 0.0), 1.0))
    check("hardsigmoid", [x], want.astype(dtype), alpha=0.3, beta=0.4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=str)
@pytest.mark.parametrize(("pos", "neg"), [(True, True), (True, False), (False, True), (False, False)])
def test_isinf_detect_flags(dtype: Any, pos: bool, neg: bool) -> None:
    x = to_torch(float_inputs(np.dtype(dtype), np.random.default_rng(4)))
    want = (torch.isposinf(x) & pos) | (torch.isneginf(x) & neg)
    check("isinf", [x.numpy().astype(dtype)], want.numpy(), detect_positive=pos, detect_negative=neg)


def test_accurate_small_and_large_arguments() -> None:
    """expm1/log1p-based rules keep tiny results (elu, softplus) and do not overflow (softplus)."""
    x = np.array([-1e-10, 1e-10, -1e-30, -50.0, 50.0, 1e4, -1e4, 0.0], dtype=np.float32)
    for name, fn in [("elu", F.elu), ("softplus", lambda t: F.softplus(t, threshold=1000.0)), ("celu", F.celu),
                     ("mish", F.mish)]:
        want = fn(torch.from_numpy(x.astype(np.float64))).numpy().astype(np.float32)
        fast, rule = run_op(name, [x])
        for got in (fast, rule):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=name)


# --------------------------------------------------------------------------------------
# unary integer ops


INT_UNARY: dict[str, Callable[[int, int], int]] = {
    "neg": lambda v, bits: -v, "abs": lambda v, bits: abs(v), "relu": lambda v, bits: max(v, 0),
    "sign": lambda v, bits: (v > 0) - (v < 0), "bitwise_not": lambda v, bits: ~v,
}


def wrap(v: int, dtype: np.dtype) -> int:
    """``v`` reduced modulo 2**bits into ``dtype``'s range (two's complement)."""
    bits = dtype.itemsize * 8
    v &= (1 << bits) - 1
    return v - (1 << bits) if dtype.kind == "i" and v >= 1 << (bits - 1) else v


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=str)
@pytest.mark.parametrize("name", sorted(INT_UNARY))
def test_unary_int_ops_match_python_ints(name: str, dtype: np.dtype) -> None:
    if dtype.kind == "u" and name == "neg":
        pytest.skip("neg of unsigned types is not an ONNX case")
    x = int_inputs(dtype, np.random.default_rng(5))
    want = np.array([wrap(INT_UNARY[name](int(v), dtype.itemsize * 8), dtype) for v in x.ravel()],
                    dtype=dtype).reshape(x.shape)
    check(name, [x], want)


def test_logical_not() -> None:
    x = np.random.default_rng(6).standard_normal((3, 4)) > 0
    check("logical_not", [x], torch.logical_not(torch.from_numpy(x)).numpy())


# --------------------------------------------------------------------------------------
# binary ops


def float_pairs(dtype: np.dtype) -> list[np.ndarray]:
    """Every edge value against every edge value, plus a random broadcast block."""
    with np.errstate(all="ignore"):
        e = np.array(EDGES).astype(dtype)
    return [e.reshape(-1, 1), e[:-1]]


FLOAT_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "min": torch.minimum, "max": torch.maximum, "prelu": lambda x, s: torch.where(x < 0, x * s, x),
    "equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge,
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(FLOAT_BINARY))
def test_binary_float_ops_match_torch(name: str, dtype: np.dtype) -> None:
    for a, b in (float_pairs(dtype), [float_inputs(dtype, np.random.default_rng(7)).reshape(4, 1, 15),
                                      float_inputs(dtype, np.random.default_rng(8))[:3, :]]):
        want = FLOAT_BINARY[name](to_torch(a), to_torch(b))
        check(name, [a, b], from_torch(want, np.dtype(bool) if want.dtype == torch.bool else dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("fmod", [False, True])
def test_float_mod_matches_python(fmod: bool, dtype: np.dtype) -> None:
    """Floored mod has Python's float % semantics (sign of the divisor, x % inf for x < 0 is inf);
    fmod is C fmod (math.fmod)."""
    a, b = float_pairs(dtype)
    want = pyfunc(math.fmod if fmod else operator.mod, dtype)(a, b)
    check("mod", [a, b], want, fmod=fmod)


INT_BINARY: dict[str, Callable[[int, int], int | bool]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "div": lambda a, b: int(a / b) if abs(a) < 2 ** 52 and abs(b) < 2 ** 52 else
    (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1),
    "mod": lambda a, b: a % b, "min": min, "max": max,
    "bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor,
    "prelu": lambda x, s: x * s if x < 0 else x,
    "equal": operator.eq, "less": operator.lt, "greater_equal": operator.ge,
}


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=str)
@pytest.mark.parametrize("name", sorted(INT_BINARY))
def test_binary_int_ops_match_python_ints(name: str, dtype: np.dtype) -> None:
    x = int_inputs(dtype, np.random.default_rng(9)).ravel()
    a, b = x.reshape(-1, 1), x[:-1]
    if name in ("div", "mod"):
        b = b[b != 0]  # integer division by zero is undefined in ONNX (CIR gives 0; tested below)
    fn = INT_BINARY[name]
    res = [[fn(int(p), int(q)) for q in b] for p in a.ravel()]
    if isinstance(res[0][0], bool):
        want = np.array(res, dtype=bool)
    else:
        want = np.array([[wrap(v, dtype) for v in row] for row in res], dtype=dtype)
    check(name, [a, b], want)


@pytest.mark.parametrize("dtype", SIGNED, ids=str)
def test_int_div_and_fmod_truncate_toward_zero(dtype: np.dtype) -> None:
    a = np.array([7, -7, 7, -7, 0, 5], dtype=dtype).reshape(2, 3)
    b = np.array([2, 2, -2, -2, 3, -5], dtype=dtype).reshape(2, 3)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    check("div", [a, b], torch.div(ta, tb, rounding_mode="trunc").numpy())
    check("mod", [a, b], torch.fmod(ta, tb).numpy(), fmod=True)
    check("mod", [a, b], torch.remainder(ta, tb).numpy(), fmod=False)


def test_int_division_by_zero_is_zero() -> None:
    """ONNX leaves it undefined; CIR defines it (a crash-free value the verifier can reason about)."""
    a = np.array([[5, -5, 0]], dtype=np.int32)
    b = np.zeros((2, 3), dtype=np.int32)
    for name, attrs in [("div", {}), ("mod", {"fmod": False}), ("mod", {"fmod": True})]:
        for got in run_op(name, [a, b], **attrs):
            assert not got.any()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float32, np.float64], ids=str)
def test_pow_matches_torch(dtype: Any) -> None:
    base = np.array([0, 1, 2, 3, 5, 10], dtype=dtype).reshape(-1, 1)
    if np.dtype(dtype).kind == "i":
        base = np.concatenate([base, -base[1:]])
    exp = np.array([0, 1, 2, 3, 4], dtype=dtype)
    check("pow", [base, exp], torch.pow(torch.from_numpy(base), torch.from_numpy(exp)).numpy())


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, *UNSIGNED], ids=str)
@pytest.mark.parametrize("direction", ["left", "right"])
def test_bit_shift_matches_python_ints(dtype: Any, direction: str) -> None:
    dtype = np.dtype(dtype)
    x = int_inputs(dtype, np.random.default_rng(10)).reshape(-1, 1)
    s = np.array([0, 1, 3, dtype.itemsize * 8 - 1], dtype=dtype)
    want = np.array([[wrap(int(v) << int(k) if direction == "left" else int(v) >> int(k), dtype) for k in s]
                     for v in x.ravel()], dtype=dtype)
    check("bit_shift", [x, s], want, direction=direction)


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical_binary(name: str) -> None:
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((3, 1)) > 0, rng.standard_normal((4,)) > 0
    fn = {"logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor}[name]
    check(name, [a, b], fn(torch.from_numpy(a), torch.from_numpy(b)).numpy())


def test_bool_equality() -> None:
    a = np.array([[True], [False]])
    b = np.array([True, False, True])
    check("equal", [a, b], a == b)
    check("not_equal", [a, b], a != b)


# --------------------------------------------------------------------------------------
# clip, cast, where


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("lo", "hi"), [(-0.5, 0.5), (1.0, -1.0), (0.0, None), (None, 2.5), (None, None),
                                        (-math.inf, math.inf)])
def test_clip_float_matches_torch_clamp(dtype: np.dtype, lo: float | None, hi: float | None) -> None:
    x = float_inputs(dtype, np.random.default_rng(12))
    with np.errstate(all="ignore"):  # bounds are rounded to the operand type, as a cast does
        lo_t = None if lo is None else float(np.array(lo).astype(dtype))
        hi_t = None if hi is None else float(np.array(hi).astype(dtype))
    want = torch.clamp(to_torch(x), lo_t, hi_t) if (lo, hi) != (None, None) else to_torch(x)
    check("clip", [x], from_torch(want, dtype), min=lo, max=hi)


@pytest.mark.parametrize("dtype", [*SIGNED, np.dtype(np.uint8)], ids=str)
def test_clip_int_clamps_bounds_to_the_type(dtype: np.dtype) -> None:
    x = int_inputs(dtype, np.random.default_rng(13))
    info = np.iinfo(dtype)
    for lo, hi in [(-5.0, 7.0), (-1e30, 1e30), (-math.inf, 3.0), (9.0, 2.0)]:
        blo, bhi = max(int(info.min), int(max(lo, -2.0 ** 70))), min(int(info.max), int(min(hi, 2.0 ** 70)))
        want = np.array([min(max(int(v), blo), bhi) for v in x.ravel()], dtype=dtype).reshape(x.shape)
        check("clip", [x], want, min=lo, max=hi)


def test_clip_rejects_fractional_int_bounds() -> None:
    b = Builder()
    x = b.param("x", DType.i32, [3])
    with pytest.raises(OpDefinitionError, match="not an integer"):
        b.clip(x, min=0.5)


CASTS = [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i8, DType.i16, DType.i32, DType.i64, DType.u8,
         DType.bool]
TORCH_DTYPES = {DType.f32: torch.float32, DType.f64: torch.float64, DType.f16: torch.float16,
                DType.bf16: torch.bfloat16, DType.i8: torch.int8, DType.i16: torch.int16, DType.i32: torch.int32,
                DType.i64: torch.int64, DType.u8: torch.uint8, DType.bool: torch.bool}


def _torch_of(a: np.ndarray) -> torch.Tensor:
    if a.dtype == BF16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a)


def _numpy_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy()


@pytest.mark.parametrize("src", CASTS, ids=str)
@pytest.mark.parametrize("to", CASTS, ids=str)
def test_cast_matches_torch(src: DType, to: DType) -> None:
    rng = np.random.default_rng(14)
    if src.is_float:
        x = float_inputs(src.np, rng)
        if to.is_int:  # out-of-range and non-finite float->int conversions are undefined in ONNX
            info = np.iinfo(to.np)
            v = x.astype(np.float64)
            x = x[np.isfinite(v) & (np.trunc(v) >= info.min) & (np.trunc(v) <= info.max)]
    elif src is DType.bool:
        x = rng.standard_normal((3, 4)) > 0
    else:
        x = int_inputs(src.np, rng)
    want = _numpy_of(_torch_of(x).to(TORCH_DTYPES[to]))
    check("cast", [x], want, to=to)


def test_cast_nonfinite_float_to_int_is_zero() -> None:
    x = np.array([np.nan, np.inf, -np.inf, -2.7, 2.7], dtype=np.float32)
    for got in run_op("cast", [x], to=DType.i32):
        np.testing.assert_array_equal(got, np.trunc(np.nan_to_num(x, nan=0, posinf=0, neginf=0)).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_], ids=str)
def test_where_broadcasts(dtype: Any) -> None:
    rng = np.random.default_rng(15)
    c = rng.standard_normal((2, 1, 4)) > 0
    a = (rng.standard_normal((3, 1)) * 10).astype(dtype)
    b = (rng.standard_normal((4,)) * 10).astype(dtype)
    want = torch.where(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b)).numpy()
    check("where", [c, a, b], want)


# --------------------------------------------------------------------------------------
# signatures: element types and attributes are checked when a value is built


@pytest.mark.parametrize(("name", "dtype", "attrs"), [
    ("exp", DType.i32, {}), ("sigmoid", DType.i64, {}), ("bitwise_and", DType.f32, {}),
    ("logical_and", DType.f32, {}), ("add", DType.bool, {}), ("isnan", DType.i8, {}),
])
def test_element_type_is_checked(name: str, dtype: DType, attrs: dict[str, Any]) -> None:
    b = Builder()
    x = b.param("x", dtype, [2, 3])
    operands = [x] * (len(get_op(name).operands))
    with pytest.raises(ShapeError, match="element type"):
        b.op(name, *operands, **attrs)


def test_binary_operands_must_share_a_type_and_broadcast() -> None:
    b = Builder()
    x, y = b.param("x", DType.f32, [2, 3]), b.param("y", DType.f16, [2, 3])
    with pytest.raises(ShapeError, match="differ"):
        b.mul(x, y)
    with pytest.raises(ShapeError):
        b.add(x, b.param("z", DType.f32, [4]))
    assert b.less(x, b.param("w", DType.f32, [5, 1, 3])).type == TensorType(DType.bool, (5, 2, 3))


@pytest.mark.parametrize(("name", "attrs"), [("bit_shift", {"direction": "up"}), ("gelu", {"approximate": "erf"})])
def test_bad_attribute_values_are_rejected(name: str, attrs: dict[str, Any]) -> None:
    b = Builder()
    x = b.param("x", DType.u8 if name == "bit_shift" else DType.f32, [4])
    with pytest.raises(OpDefinitionError):
        b.op(name, *([x] * len(get_op(name).operands)), **attrs)


def test_symbolic_shapes_broadcast() -> None:
    b = Builder()
    x = b.param("x", DType.f32, ["N", 1, 4])
    y = b.param("y", DType.f32, [3, 1])
    out = b.where(b.greater(x, y), b.silu(x), b.clip(y, min=0.0))
    assert [str(d) for d in out.shape] == ["N", "3", "4"]
    xv = np.random.default_rng(16).standard_normal((2, 1, 4)).astype(np.float32)
    yv = np.random.default_rng(17).standard_normal((3, 1)).astype(np.float32)
    [got] = run_reference(b.module(b.function("main", [x, y], [out])), [xv, yv])
    tx, ty = torch.from_numpy(xv), torch.from_numpy(yv)
    want = torch.where(tx > ty, F.silu(tx), torch.clamp(ty, min=0.0)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _rank0_unary_ops() -> list[str]:
    """Every one-operand op that maps a rank-0 float tensor to a rank-0 tensor and a 1-element vector
    to a 1-element vector with its default attributes (the elementwise ones, whatever their family)."""
    from cuvil.errors import CuvilError
    from cuvil.ir.opdef import all_ops

    names = []
    for op in all_ops():
        if len(op.operands) != 1:
            continue
        b = Builder()
        try:
            scalar, vector = b.op(op.name, b.param("x", DType.f32, [])), b.op(op.name, b.param("v", DType.f32, [1]))
        except (CuvilError, TypeError, ValueError):
            continue
        if scalar.type.shape == () and vector.type.shape == (1,):
            names.append(op.name)
    return sorted(names)


RANK0_UNARY = _rank0_unary_ops()


def test_rank0_unary_ops_cover_the_elementwise_family():
    assert {"erf", "gelu", "exp", "tanh", "relu", "sqrt"} <= set(RANK0_UNARY) and len(RANK0_UNARY) >= 30


@pytest.mark.parametrize("name", RANK0_UNARY)
def test_rank0_tensor_gives_the_rank1_element(name):
    """A 0-d tensor is one element: the fast path and the rule agree with the op on a 1-element vector."""
    x = np.float32(0.375)
    fast0, rule0 = run_op(name, [np.asarray(x)])
    fast1, _ = run_op(name, [np.asarray([x])])
    for got in (fast0, rule0):
        assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == fast1.dtype
        np.testing.assert_array_equal(got.reshape(-1), fast1.reshape(-1))
