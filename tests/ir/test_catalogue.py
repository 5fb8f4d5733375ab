"""Walk the op catalogue: every op has examples, and its fast path equals its rule bit for bit
(signed zeros distinct, any NaN equal to any NaN) on the examples, on the same shapes filled
with edge values (NaN, +-0, +-inf, subnormals, huge, tiny), and on long reductions where a
summation order would show."""

import ml_dtypes
import numpy as np
import pytest

from cuvil.interp import evaluate_op, evaluate_rule
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import all_ops, get_op
from cuvil.ir.types import TensorType

OPS = all_ops()

EDGE_POOL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40, 1e-45, 3e38, -3e38,
                      0.5, 2.5, -2.5, 1e-7, 65504.0, 7.0, -3.25, 1e30, 2.0 ** -24])


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16


def _edge_variants(arrays: list[np.ndarray], rng: np.random.Generator, count: int = 4) -> list[list[np.ndarray]]:
    """The example's float operands refilled with edge values mixed with wide-ranging normals;
    integer operands (often indices) stay as they are."""
    out = []
    for _ in range(count):
        case = []
        for a in arrays:
            if not _is_float(a):
                case.append(a)
                continue
            edges = EDGE_POOL[rng.integers(0, len(EDGE_POOL), a.shape)]
            normals = rng.standard_normal(a.shape) * 10.0 ** rng.integers(-3, 4, a.shape)
            with np.errstate(all="ignore"):
                case.append(np.where(rng.random(a.shape) < 0.5, edges, normals).astype(a.dtype))
        out.append(case)
    return out


def _bits_equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if not _is_float(x):
        return x == y
    with np.errstate(invalid="ignore"):  # widening a signaling NaN quiets it
        xf, yf = x.astype(np.float64), y.astype(np.float64)
    return (np.isnan(xf) & np.isnan(yf)) | ((xf == yf) & (np.signbit(xf) == np.signbit(yf)))


def _check(op, arrays: list[np.ndarray], attrs: dict) -> None:
    full = op.check_attrs(attrs)
    out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
    # a structured op's reference reading runs its region's ops by their rules
    by_rule = evaluate_op(op, arrays, full, out_type, use_fast_path=False) if op.structured \
        else evaluate_rule(op, arrays, full, out_type)
    assert by_rule.shape == tuple(out_type.shape)
    assert by_rule.dtype == out_type.dtype.np
    if op.numpy is None:
        return
    fast = evaluate_op(op, arrays, full, out_type)
    assert fast.dtype == by_rule.dtype and fast.shape == by_rule.shape
    same = _bits_equal(fast, by_rule)
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (f"{op.name} {attrs}: fast path differs from the rule at {bad.size} elements, e.g. "
                           f"rule {by_rule.reshape(-1)[bad[:3]]} fast {fast.reshape(-1)[bad[:3]]}")


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_op_has_examples_and_rule_matches_fast_path_bit_for_bit(op):
    assert op.examples is not None, f"{op.name} defines no examples"
    rng = np.random.default_rng(0)
    cases = op.examples(rng)
    assert cases, f"{op.name} has an empty example list"
    for arrays, attrs in cases:
        for variant in [arrays, *_edge_variants(arrays, rng)]:
            _check(op, variant, attrs)


def _f(rng: np.random.Generator, *shape: int, dtype=np.float32) -> np.ndarray:
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-2, 3, shape)).astype(dtype)


LONG_REDUCTIONS = {
    "reduce_sum": lambda r: ([_f(r, 3, 300)], {"axes": (1,)}),
    "reduce_mean": lambda r: ([_f(r, 40, 7, 9)], {"axes": (0, 2)}),
    "reduce_prod": lambda r: ([(1 + 0.01 * r.standard_normal((2, 200))).astype(np.float32)], {"axes": (1,)}),
    "matmul": lambda r: ([_f(r, 3, 200), _f(r, 200, 5)], {}),
    "conv": lambda r: ([_f(r, 1, 24, 6, 6), _f(r, 4, 24, 3, 3)], {"pads": (1, 1, 1, 1)}),
    "softmax": lambda r: ([_f(r, 2, 333)], {"axis": 1}),
    "log_softmax": lambda r: ([_f(r, 2, 333, dtype=np.float16)], {"axis": 1}),
    "layer_norm": lambda r: ([_f(r, 2, 257), _f(r, 257), _f(r, 257)], {}),
    "cumsum": lambda r: ([_f(r, 2, 300)], {"axis": 1, "reverse": True}),
    "avg_pool": lambda r: ([_f(r, 1, 2, 12, 12)], {"kernel": (5, 5)}),
}


@pytest.mark.parametrize("name", sorted(LONG_REDUCTIONS))
def test_long_reductions_follow_the_rules_order(name):
    """A fast path that sums pairwise or blocked (BLAS) differs from the rule's left fold here."""
    rng = np.random.default_rng(1)
    arrays, attrs = LONG_REDUCTIONS[name](rng)
    _check(get_op(name), arrays, attrs)
    for variant in _edge_variants(arrays, rng, count=2):
        _check(get_op(name), variant, attrs)


def test_a_pairwise_sum_would_be_caught():
    """The comparison above can fail: numpy's own (pairwise) sum differs from the left fold."""
    x = _f(np.random.default_rng(2), 4, 1000)
    pairwise = np.sum(x, axis=1, dtype=np.float32)
    op = get_op("reduce_sum")
    full = op.check_attrs({"axes": (1,)})
    rule = evaluate_rule(op, [x], full, op.infer([TensorType(DType.f32, x.shape)], full))
    assert not np.all(_bits_equal(pairwise, rule))
