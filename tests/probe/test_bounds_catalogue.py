"""Interval bounds of every catalogue op are sound: random points, box corners and a
hill-climbing adversary on the op's examples never leave the bound (or produce an
unflagged NaN), for the fast path and the rule alike."""

from __future__ import annotations

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


def _cases() -> list[tuple[OpDef, int]]:
    rng = np.random.default_rng(0)
    out = []
    for op in all_ops():
        if op.examples is None:
            continue
        for k, _ in enumerate(op.examples(rng)):
            out.append((op, k))
    return out


def _violations(y: np.ndarray, bound: Interval) -> np.ndarray:
    y = y.astype(np.float64)
    nan = np.isnan(y)
    shape = y.shape
    flagged = np.broadcast_to(bound.nan, np.broadcast_shapes(bound.nan.shape, shape)) if bound.nan.ndim \
        else np.full(shape, bool(bound.nan))
    inside = (y >= bound.lo) & (y <= bound.hi)
    return np.where(nan, ~flagged, ~inside)


def check_op(op: OpDef, arrays: list[np.ndarray], attrs: dict, rng: np.random.Generator, trials: int = 60,
             climb: int = 40) -> None:
    if any(a.dtype.kind in "iu" and a.size and float(np.abs(a.astype(np.float64)).max()) > 2 ** 53 for a in arrays):
        pytest.skip("integer bounds are exact below 2**53 only")
    in_types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    full = op.check_attrs(attrs)
    out_t = op.infer(in_types, full)
    boxes = [(_box(a) if _is_float(a) else Interval(a.astype(np.float64))) for a in arrays]
    varying = [k for k, a in enumerate(arrays) if _is_float(a)]
    ctx = OpContext.make(op.name, in_types, full, out_t)
    bound = op_bounds(ctx, boxes, [k not in varying for k in range(len(arrays))]).value

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
    y = run(xs, True).astype(np.float64)
    slack = np.minimum(y - bound.lo, bound.hi - y)
    slack = np.where(np.isfinite(slack), slack, np.inf)
    target = np.unravel_index(int(np.argmin(slack)), slack.shape) if slack.size else ()
    best = float(slack[target]) if slack.size else np.inf
    for _ in range(climb):
        cand = []
        for k, a in enumerate(xs):
            if k not in varying:
                cand.append(a)
                continue
            b = boxes[k]
            step = (b.hi - b.lo) * 0.25 * rng.standard_normal(a.shape)
            moved = np.clip(a.astype(np.float64) + np.where(np.isfinite(step), step, 0), b.lo, b.hi)
            cand.append(np.where(b.nan, np.nan, moved).astype(a.dtype))
        yc = run(cand, True)
        assert not _violations(yc, bound).any(), f"{op.name}: an adversarial input left the bound"
        if slack.size:
            s = float(min(yc.astype(np.float64)[target] - bound.lo[target], bound.hi[target] - yc[target]))
            if s < best:
                best, xs = s, cand


@pytest.mark.parametrize("op,case", _cases(), ids=lambda x: x.name if isinstance(x, OpDef) else str(x))
def test_bounds_hold_on_catalogue_examples(op: OpDef, case: int) -> None:
    rng = np.random.default_rng(1234 + case)
    arrays, attrs = op.examples(np.random.default_rng(0))[case] if False else _example(op, case)
    check_op(op, arrays, attrs, rng)


def _example(op: OpDef, case: int) -> tuple[list[np.ndarray], dict]:
    rng = np.random.default_rng(0)
    # examples are drawn in catalogue order from one generator; replay that order
    for other in all_ops():
        if other.examples is None:
            continue
        cases = other.examples(rng)
        if other is op:
            return cases[case]
    raise AssertionError(op.name)
