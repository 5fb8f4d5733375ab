"""Interval bounds of every catalogue op are sound: random points, box corners and a
hill-climbing adversary on the op's examples never leave the bound (or produce an
unflagged NaN), for the fast path and the rule alike."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from cuvil.interp import evaluate_op
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import OpDef, all_ops
from cuvil.ir.types import TensorType
from verify.probe.bounds import OpContext, op_bounds
from verify.probe.interval import Interval

RELATIVE = 0.1
ABSOLUTE = 0.05


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype == DType.bf16.np


def _box(a: np.ndarray) -> Interval:
    """A box around a float example: finite elements widened, NaN and infinities kept as they are."""
    x = a.astype(np.float64)
    finite = np.isfinite(x)
    nan = np.isnan(x)
    d = RELATIVE * np.abs(np.where(finite, x, 0)) + ABSOLUTE
    lo = np.where(finite, x - d, np.where(nan, 0.0, x))
    hi = np.where(finite, x + d, np.where(nan, 0.0, x))
    # box ends are values of the operand's own type
    with np.errstate(over="ignore"):
        lo = lo.astype(a.dtype).astype(np.float64)
        hi = hi.astype(a.dtype).astype(np.float64)
    return Interval(lo, hi, nan)


def _sample(iv: Interval, dtype: np.dtype, rng: np.random.Generator, corner: bool) -> np.ndarray:
    r = (rng.random(iv.lo.shape) < 0.5).astype(np.float64) if corner else rng.random(iv.lo.shape)
    with np.errstate(invalid="ignore"):
        x = np.where(iv.lo == iv.hi, iv.lo, iv.lo + (iv.hi - iv.lo) * r)
    x = np.where(iv.nan, np.nan, x)
    out = x.astype(dtype)
    # rounding to the operand type may step outside; pull back inside
    back = out.astype(np.float64)
    bad = (back < iv.lo) | (back > iv.hi)
    return np.where(bad, iv.lo.astype(dtype), out)


@functools.cache
def _table() -> dict[tuple[str, int], tuple[list[np.ndarray], dict]]:
    """Every op's examples, drawn in catalogue order from one seeded generator."""
    rng = np.random.default_rng(0)
    out = {}
    for op in all_ops():
        if op.examples is None or op.structured:  # a loop is probed unrolled (test_loop_probe.py)
            continue
        for k, case in enumerate(op.examples(rng)):
            out[(op.name, k)] = case
    return out


def _cases() -> list[tuple[OpDef, int]]:
    ops = {op.name: op for op in all_ops()}
    return [(ops[name], k) for name, k in _table()]


def _example(op: OpDef, case: int) -> tuple[list[np.ndarray], dict]:
    return _table()[(op.name, case)]


def _violations(y: np.ndarray, bound: Interval) -> np.ndarray:
    y = y.astype(np.float64)
    nan = np.isnan(y)
    shape = y.shape
    flagged = np.broadcast_to(bound.nan, np.broadcast_shapes(bound.nan.shape, shape)) if bound.nan.ndim \
        else np.full(shape, bool(bound.nan))
    inside = (y >= bound.lo) & (y <= bound.hi)
    return np.where(nan, ~flagged, ~inside)


def check_op(op: OpDef, arrays: list[np.ndarray], attrs: dict, rng: np.random.Generator, trials: int = 24,
             climb: int = 16, fast_path_min: int | None = None) -> None:
    if any(a.dtype.kind in "iu" and a.size and float(np.abs(a.astype(np.float64)).max()) > 2 ** 53 for a in arrays):
        pytest.skip("integer bounds are exact below 2**53 only")
    in_types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    full = op.check_attrs(attrs)
    out_t = op.infer(in_types, full)
    boxes = [(_box(a) if _is_float(a) else Interval(a.astype(np.float64))) for a in arrays]
    varying = [k for k, a in enumerate(arrays) if _is_float(a)]
    ctx = OpContext.make(op.name, in_types, full, out_t)
    constant = [k not in varying for k in range(len(arrays))]
    if fast_path_min is None:
        bound = op_bounds(ctx, boxes, constant).value
    else:
        result = op_bounds(ctx, boxes, constant, fast_path_min=fast_path_min)
        assert result.method == "bilinear", f"{op.name}: the fast path was not taken"
        bound = result.value

    def run(xs: list[np.ndarray], fast: bool) -> np.ndarray:
        return evaluate_op(op, xs, full, out_t, use_fast_path=fast)

    def draw(corner: bool) -> list[np.ndarray]:
        return [(_sample(boxes[k], a.dtype, rng, corner) if k in varying else a) for k, a in enumerate(arrays)]

    for t in range(trials):
        xs = draw(corner=t % 3 == 0)
        for fast in (True, False):
            bad = _violations(run(xs, fast), bound)
            assert not bad.any(), (f"{op.name} ({'fast path' if fast else 'rule'}) left its bound at "
                                   f"{tuple(np.argwhere(bad)[0])}")
    if not varying:
        return
    # hill climbing: push the element with the least slack towards its bound
    xs = draw(corner=False)
    shape = tuple(int(d) for d in out_t.shape)
    lo, hi = (np.broadcast_to(b, shape).reshape(-1) for b in (bound.lo, bound.hi))
    y = run(xs, True).astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        slack = np.minimum(y - lo, hi - y)
    slack = np.where(np.isfinite(slack), slack, np.inf)
    target = int(np.argmin(slack)) if slack.size else 0
    best = float(slack[target]) if slack.size else np.inf
    for _ in range(climb):
        cand = []
        for k, a in enumerate(xs):
            if k not in varying:
                cand.append(a)
                continue
            b = boxes[k]
            with np.errstate(invalid="ignore"):  # infinite box ends (kept as they are)
                step = (b.hi - b.lo) * 0.25 * rng.standard_normal(a.shape)
            moved = np.clip(a.astype(np.float64) + np.where(np.isfinite(step), step, 0), b.lo, b.hi)
            cand.append(np.where(b.nan, np.nan, moved).astype(a.dtype))
        yc = run(cand, True)
        assert not _violations(yc, bound).any(), f"{op.name}: an adversarial input left the bound"
        if slack.size:
            yt = float(yc.astype(np.float64).reshape(-1)[target])
            with np.errstate(invalid="ignore"):
                s = min(yt - lo[target], hi[target] - yt)
            if s < best:
                best, xs = s, cand


@pytest.mark.parametrize("op,case", _cases(), ids=lambda x: x.name if isinstance(x, OpDef) else str(x))
def test_bounds_hold_on_catalogue_examples(op: OpDef, case: int) -> None:
    arrays, attrs = _example(op, case)
    check_op(op, arrays, attrs, np.random.default_rng(1234 + case), trials=6, climb=6)


# ~4 minutes: 120 samples and a 60-step climb per example of every op
@pytest.mark.slow
@pytest.mark.parametrize("op,case", _cases(), ids=lambda x: x.name if isinstance(x, OpDef) else str(x))
def test_bounds_hold_on_catalogue_examples_thoroughly(op: OpDef, case: int) -> None:
    arrays, attrs = _example(op, case)
    check_op(op, arrays, attrs, np.random.default_rng(4321 + case), trials=120, climb=60)


def _bilinear_cases() -> list[tuple[OpDef, int]]:
    out = []
    for op, case in _cases():
        arrays, attrs = _example(op, case)
        if len(arrays) != 2 or not all(_is_float(a) for a in arrays):
            continue
        in_types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
        full = op.check_attrs(attrs)
        if OpContext.make(op.name, in_types, full, op.infer(in_types, full)).pair is not None:
            out.append((op, case))
    return out


@pytest.mark.parametrize("op,case", _bilinear_cases(), ids=lambda x: x.name if isinstance(x, OpDef) else str(x))
def test_bilinear_fast_path_bounds_hold(op: OpDef, case: int) -> None:
    """Sums of products take the midpoint-radius path through the op's fast path: also sound."""
    arrays, attrs = _example(op, case)
    check_op(op, arrays, attrs, np.random.default_rng(99 + case), fast_path_min=0)


def test_bilinear_cases_cover_matmul_and_conv() -> None:
    names = {op.name for op, _ in _bilinear_cases()}
    assert {"matmul", "conv"} <= names


