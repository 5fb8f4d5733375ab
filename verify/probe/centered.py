"""Centered window norms: each value as its value at the box's center plus a deviation.

The window norms of :mod:`.windows` bound a value's magnitude, so every constant a network adds (biases,
batch-norm shifts) travels through every later operator norm together with the input: through ResNet-18
the shifts alone reach ~3e5 at the last convolutions, and no input box, however small, is proved. Here
each value ``v`` is split into ``ĉ``, what it is at the center of the box (computed once in float64), and
``v - ĉ``, whose norm over a window travels through the same rules with the shifts gone:

* a convolution maps it by at most ``σ(W)``, a product or quotient by a constant by its largest factor,
  a batch norm by ``max|a|``, an average pool by ``√(overlap / divisor)``, a max pool by ``√(overlap)``
  (or, after a convolution, by that convolution's norms on the inputs each repeats: its outputs thinned,
  or all of them weighted by the windows each lies in);
  ReLU, clip, max and min with a constant, and a float cast never grow it; a sum adds its operands';
  a residual block by its own norm over every slope pattern of its ReLU;
* the float program's own rounding is added from the magnitude bounds (it is relative to what the
  program computes, not to the deviation), and ``ĉ``'s float64 rounding from ``ĉ``'s own norms;
* a value without a rule (or whose rule finds no bound): its interval's distance from ``ĉ``.

An element is then at most ``|ĉ|`` plus its deviation's bound: exact at the center, growing linearly with
the box, so the boundary scale of a deep network with biases is finite and the bounds at scale 1 lose
the shifts' share.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.numpy_prims import float64_sums_in_any_order
from cuvil.ir.opdef import get_op
from cuvil.ir.specialize import bind_attr
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from verify.probe import interval as I
from verify.probe.block_pairs import PairAllowance, pair_units, relu_pair_sigma
from verify.probe.interval import Interval
from verify.probe.windows import (
    EPS64,
    SLACK,
    Thinned,
    Weighted,
    Window,
    WindowNorms,
    acc_type,
    block_units,
    cached,
    cells,
    channel_squares,
    clamp_window,
    conv_input_window,
    conv_sigma,
    kernel_taps,
    max_window,
    offset_products,
    phase_stacked,
    pool_levels,
    pool_weights,
    relu_block_sigma,
    relu_halving_sigma,
    shape_of,
    sigma_units,
    underflow,
    unit,
    weighted_kernel,
)

BLAS_UNIT = 0.1
"""Work units per million multiply-adds of the matrix products composing two kernels (one BLAS call each:
measured about ten times the element rate the work units are counted in)."""

Block = tuple[Value, Value, Value, Value, Value, Value | None]
"""A residual block: ``(x, conv₁, conv₁ + b₁, conv₂, conv₂ + b₂, skip)`` (see :meth:`CenteredWindows._block`)."""

PAIR_SHARE = 0.5
"""Largest share of the product of the two blocks' chains (``‖P‖ + σσ`` each) a pair's bound may be and be used:
a block's own bound is about 0.7 of its chain (ResNet-18), so two of them about half; a pair's certificate
with its multipliers lands at 0.30-0.39 (ResNet-18's pairs, and kernels of gains 6 to 10), and one above half
is taken for multipliers far from their best, the blocks' own bounds being used instead."""

PAIR_WIDTH_MAX = 1024
"""Widest matrices (per frequency) of two blocks bounded at once (:func:`relu_pair_sigma`): ResNet-18's last pair,
2,048 wide on 40 frequencies, takes 27 s (its two blocks' own bounds 16 s), the three before it 3-10 s."""

CENTER64 = 2.0 * EPS64
"""A bound on ``|exact - ĉ| / |ĉ|`` for one float64 operation (a sum, a product, a quotient)."""

BATCH_NORM64 = 16 * EPS64
"""A bound on the float64 center's error, relative to ``|a·x| + |a·m| + |b|``, of ``a·(x - m) + b`` with
``a = s / sqrt(var + ε)`` (six roundings and a square root's)."""


class Centers:
    """Every float value of a function at one input point, in float64 (computed on first use, so a probe
    that bisects on the box's scale around the same center computes them once)."""

    def __init__(self, constant_value: Callable[[Value], np.ndarray], live: set[Value],
                 inputs: Mapping[Value, np.ndarray]) -> None:
        self.constant_value = constant_value
        self.live = live
        self.arrays: dict[Value, np.ndarray | None] = {p: np.asarray(a, dtype=np.float64) for p, a in inputs.items()}
        self.squares: dict[Value, np.ndarray | None] = {}
        self.windows: dict[tuple[Value, Window], float | None] = {}
        self.magnitudes: dict[Value, np.ndarray] = {}

    def window(self, v: Value, win: Window) -> float | None:
        """The norm of ``v``'s center over the worst ``win`` window (``win`` within its extents)."""
        key = (v, win)
        if key not in self.windows:
            if v not in self.squares:
                c = self.get(v)
                self.squares[v] = None if c is None else channel_squares(np.abs(np.broadcast_to(c, shape_of(v))))
            sq = self.squares[v]
            self.windows[key] = None if sq is None else max_window(sq, win)
        return self.windows[key]

    def magnitude(self, v: Value) -> np.ndarray | None:
        """``|ĉ|`` at every element of ``v``."""
        if v not in self.magnitudes:
            c = self.get(v)
            if c is None:
                return None
            self.magnitudes[v] = np.abs(np.broadcast_to(c, shape_of(v)))
        return self.magnitudes[v]

    def get(self, v: Value) -> np.ndarray | None:
        """``v`` at the center (None: not a float value, or an op the float64 evaluation does not take)."""
        if v not in self.live:
            return np.asarray(self.constant_value(v), dtype=np.float64)
        if v not in self.arrays:
            self.arrays[v] = None  # SSA has no cycles; keep recursion honest anyway
            self.arrays[v] = self._evaluate(v)
        return self.arrays[v]

    def _evaluate(self, v: Value) -> np.ndarray | None:
        if not v.dtype.is_float or v.is_param:
            return None
        operands = []
        for o in v.operands:
            if o in self.live and not o.dtype.is_float:
                return None
            c = self.get(o)
            if c is None:
                return None
            operands.append(c)
        shape = shape_of(v)
        if v.op == "cast":
            out = np.broadcast_to(operands[0], shape)
        elif v.op == "batch_norm":
            out = batch_norm_center(v, operands)
        else:
            attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
            try:
                with np.errstate(all="ignore"), float64_sums_in_any_order():  # (γ_n holds for any order)
                    out = evaluate_op(get_op(v.op), operands, attrs, TensorType(DType.f64, shape))
            except (CuvilError, ValueError, TypeError):
                return None  # no float64 reading: the value has no center, its bounds do without one
        out = np.asarray(out, dtype=np.float64)
        return out if out.shape == shape and bool(np.all(np.isfinite(out))) else None


def batch_norm_params(v: Value, consts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``a = s / sqrt(var + ε)``, the mean and the bias of a batch norm as float64 per-channel vectors, with
    ``ε`` in the value's type as the program reads it (None: not finite)."""
    scale, bias, mean, var = (np.asarray(c, dtype=np.float64).reshape(-1) for c in consts)
    eps = float(np.asarray(float(v.attr("epsilon")), dtype=v.dtype.np))
    with np.errstate(all="ignore"):
        a = scale / np.sqrt(var + eps)
    ok = all(bool(np.all(np.isfinite(t))) for t in (a, mean, bias))
    return (a, mean, bias) if ok else None


def _per_channel(t: np.ndarray, rank: int) -> np.ndarray:
    return t.reshape((1, -1) + (1,) * (rank - 2))


def batch_norm_center(v: Value, operands: list[np.ndarray]) -> np.ndarray | None:
    """``a·(x - m) + b`` in float64 (within :data:`BATCH_NORM64` of the exact value, relative)."""
    params = batch_norm_params(v, operands[1:])
    if params is None:
        return None
    rank = len(shape_of(v))
    a, mean, bias = (_per_channel(t, rank) for t in params)
    return a * (operands[0] - mean) + bias


class CenteredWindows(WindowNorms):
    """Window norms (:class:`WindowNorms`) that also bound each value as its center plus a deviation."""

    def __init__(self, constant_value: Callable[[Value], np.ndarray], live: set[Value],
                 sigmas: dict[Any, tuple[float, float]], centers: Centers,
                 block_norms: dict[Any, float] | None = None, composed: dict[Any, np.ndarray] | None = None,
                 users: Mapping[Value, list[Value]] | None = None, pairs: PairAllowance | None = None) -> None:
        super().__init__(constant_value, live, sigmas)
        self.users = users or {}
        self.leading: dict[Value, bool] = {}  # per block sum: whether it leads a pair (:meth:`_leads_pair`)
        self.pairs = PairAllowance() if pairs is None else pairs
        self.centers = centers
        self.deviations: dict[tuple[Value, Window], float | None] = {}
        self.centered: dict[tuple[Value, Window], float | None] = {}
        self.distance_squares: dict[Value, np.ndarray | None] = {}
        self.clip_moved: dict[Value, np.ndarray | None] = {}
        self.blocks: dict[Value, tuple[Value, Value, Value, Value, Value, Value | None] | None] = {}
        self.block_norms: dict[Any, float] = {} if block_norms is None else block_norms  # (charged once each)
        self.composed: dict[Any, np.ndarray] = {} if composed is None else composed  # (charged once each)
        self.restricted: dict[tuple[Value, Window, Thinned | Weighted], float | None] = {}

    # -- magnitudes: the plain rules' bound or the center's norm plus the deviation's -----------------------
    def window(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        plain = super().window(v, win, values)
        clamped = clamp_window(v, win)
        if clamped is None:
            return plain
        key = (v, clamped)
        if key not in self.centered:
            self.centered[key] = None
            c, d = self.center_window(v, clamped), self.deviation(v, clamped, values)
            self.centered[key] = None if c is None or d is None else (c + d) * SLACK
        found = [b for b in (plain, self.centered[key]) if b is not None and math.isfinite(b)]
        return min(found) if found else None

    def center_window(self, v: Value, win: Window) -> float | None:
        """The norm of ``ĉ`` over the worst ``win`` window."""
        clamped = clamp_window(v, win)
        return None if clamped is None else self.centers.window(v, clamped)

    # -- deviations ------------------------------------------------------------------------------------------
    def deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """A bound on the ℓ2 norm of ``v - ĉ`` over any ``win`` window (all channels of one sample)."""
        if v not in self.live:
            return 0.0  # a constant is its own center
        clamped = clamp_window(v, win)
        if clamped is None:
            return None
        key = (v, clamped)
        if key not in self.deviations:
            self.deviations[key] = None
            ruled = None
            if not v.is_param and self.centers.get(v) is not None:
                ruled = self._deviation_rule(v, clamped, values)
            plain = self._interval_distance(v, clamped, values) if ruled is None else None
            found = [b for b in (ruled, plain) if b is not None and math.isfinite(b)]
            self.deviations[key] = min(found) if found else None
        return self.deviations[key]

    def _interval_distance(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """The norm over the worst window of ``max(hi - ĉ, ĉ - lo)`` (v's interval around its center)."""
        if v not in self.distance_squares:
            iv, c = values.get(v), self.centers.get(v)
            if iv is None or c is None:
                return None  # (not yet bounded: v's own pass)
            with np.errstate(all="ignore"):
                far = np.maximum(iv.hi - c, c - iv.lo) * (1 + 2 * EPS64)
            far = np.broadcast_to(far, shape_of(v))
            ok = not bool(np.any(iv.nan)) and bool(np.all(np.isfinite(far)))
            self.distance_squares[v] = channel_squares(far) if ok else None
        sq = self.distance_squares[v]
        return None if sq is None else max_window(sq, win)

    def _deviation_rule(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        op = v.op
        if op == "conv":
            return self._conv_deviation(v, win, values)
        if op in ("relu", "clip") or (op in ("max", "min") and len(v.operands) == 2):
            return self._lipschitz(v, win, values)
        if op == "cast" and v.operands[0].dtype.is_float:
            return self._cast_deviation(v, win, values)
        if op in ("add", "sub"):
            return self._sum_deviation(v, win, values)
        if op in ("mul", "div"):
            return self._scaled_deviation(v, win, values)
        if op == "max_pool" and v.attr("output") in (None, "values"):
            return self._max_pool_deviation(v, win, values)
        if op == "avg_pool":
            return self._avg_pool_deviation(v, win, values)
        if op == "batch_norm":
            return self._batch_norm_deviation(v, win, values)
        return None

    def _with_magnitude(self, x: Value, win: Window, values: Mapping[Value, Interval]) -> tuple[float, float] | None:
        """The deviation's and the magnitude's norms of ``x`` over ``win``."""
        d, m = self.deviation(x, win, values), self.window(x, win, values)
        return None if d is None or m is None else (d, m)

    def _lipschitz(self, v: Value, win: Window, values: Mapping[Value, Interval],
                   inner: Callable[[Value], float | None] | None = None) -> float | None:
        """ReLU, clip, and max/min with a constant move no output further than their input moved; a clip's
        bounds may be read in the value's type, which moves its center by at most their rounding. ``inner``:
        how far the input moved (default: its deviation over ``win``)."""
        live = [o for o in v.operands if o in self.live]
        if len(live) != 1 or shape_of(live[0]) != shape_of(v):
            return None
        moved_in = (inner or (lambda o: self.deviation(o, win, values)))(live[0])
        if moved_in is None or v.op != "clip":
            return moved_in
        moved = self._clip_moved(v)
        return None if moved is None else (moved_in + max_window(moved, win)) * SLACK

    def _cast_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval],
                        inner: Callable[[Value], float | None] | None = None) -> float | None:
        """A float cast moves by its input's move plus its rounding (``u`` times the input's magnitude, and
        what underflows). ``inner`` as in :meth:`_lipschitz`."""
        x = v.operands[0]
        moved_in = (inner or (lambda o: self.deviation(o, win, values)))(x)
        mag = self.window(x, win, values)
        return None if moved_in is None or mag is None else \
            (moved_in + unit(v.dtype) * mag + underflow(v, win)) * SLACK

    def _clip_moved(self, v: Value) -> np.ndarray | None:
        """``Σ_c |clip(ĉ_x)(bounds in v's type) - ĉ|²`` per position: a program in a narrow type clips its
        values to the bounds rounded into it (for a value of that type the same as clipping to the bounds
        and rounding), the center to the bounds themselves."""
        if v not in self.clip_moved:
            cx, c = self.centers.get(v.operands[0]), self.centers.get(v)
            self.clip_moved[v] = None
            if cx is not None and c is not None:
                with np.errstate(over="ignore"):
                    lo, hi = (None if b is None else float(np.asarray(float(b), dtype=v.dtype.np))
                              for b in (v.attr("min"), v.attr("max")))
                y = cx if lo is None else np.maximum(cx, lo)
                y = y if hi is None else np.minimum(y, hi)  # lo > hi gives hi, as the rule
                self.clip_moved[v] = channel_squares(np.abs(np.broadcast_to(y, shape_of(v)) - c))
        return self.clip_moved[v]

    def _sum_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``(a ± b) - (ĉ_a ± ĉ_b)`` plus the program's rounding (``u·|a ± b|``; a sum's subnormal results
        are exact) and the center's; for the sum that closes a residual block, also the block's own bound
        (:meth:`_residual_deviation`), where it is smaller."""
        terms = self._sum_terms(v, win, values)
        plain = None if terms is None else (terms[0] + terms[1]) * SLACK * SLACK
        block = self._residual_deviation(v, win, values)
        found = [b for b in (plain, block) if b is not None and math.isfinite(b)]
        return min(found) if found else None

    def _sum_terms(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> tuple[float, float] | None:
        """A sum's deviation as its operands' deviations and what its rounding (the program's and the
        center's) adds."""
        dev = mag = 0.0
        for o in v.operands:
            if o in self.live:
                if shape_of(o) != shape_of(v):
                    return None
                parts = self._with_magnitude(o, win, values)
                if parts is None:
                    return None
                dev, mag = dev + parts[0], mag + parts[1]
            else:
                part = self._operand(o, v, win, values)
                if part is None:
                    return None
                mag += part
        c = self.center_window(v, win)
        if c is None:
            return None
        return dev, unit(v.dtype) * mag + CENTER64 * c

    # -- residual blocks -------------------------------------------------------------------------------------
    def _residual_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``v = P·x + W₂·relu(W₁·x + b₁) + b₂`` (``P`` the identity, or a stride-2 1x1 projection plus its bias
        where ``W₁`` halves the grid): ``v - ĉ = (P + W₂ D W₁)(x - ĉ_x) + W₂ D ρ₁ + ρ₂`` with ``D`` the ReLU's
        slopes (diagonal, each in [0, 1]) and ``ρ`` the rounding (the program's and the center's). The chain of
        per-op bounds pays ``‖P‖ + σ₂σ₁`` for ``‖P + W₂ D W₁‖``; the block bounds it over every ``D`` at once, on
        tori that hold every window read without wrapping: ``D = ½ + E`` (``|E| <= ½``), the part in ``E``
        coupled with the rest (:func:`relu_block_sigma`, :func:`relu_halving_sigma`). Where ``x`` is the ReLU of
        another block's sum, both blocks are bounded at once instead (:meth:`_pair_deviation`)."""
        paired = self._pair_deviation(v, win, values)
        block = self._block(v)
        if paired is not None and not self._overlaps(v):
            return paired
        if paired is None and block is not None and self._leads_pair(v):
            return None  # (its own bound would cost about what the pair's does, and the pair does not need it)
        terms = None if block is None else self._block_terms(v, block, win, values)
        comp = None if block is None else self._block_norm(block[1], block[3], block[5])
        if terms is None or comp is None:
            return paired
        own = (comp * terms[0] + terms[1]) * SLACK ** 4
        return own if paired is None else min(own, paired)

    def _block_terms(self, v: Value, block: Block, win: Window,
                     values: Mapping[Value, Interval]) -> tuple[float, float, Window] | None:
        """A block's ``x``'s deviation over the window the block reads for ``win`` (and that window), and the
        norm over ``win`` of what its rounding adds (``W₂Dρ₁ + ρ₂``, the bias sums' and the projection's)."""
        _, c1, t, c2, s, skip = block
        w2 = self._conv_parts(c2)
        if w2 is None:
            return None
        win1 = conv_input_window(w2[1], w2[2], w2[4], win)
        second, first = self._conv_terms(c2, win, values), self._conv_terms(c1, win1, values)
        bias1 = (0.0, 0.0) if t is c1 else self._sum_terms(t, win1, values)
        bias2 = (0.0, 0.0) if s is c2 else self._sum_terms(s, win, values)
        closing = self._sum_terms(v, win, values)
        projected = (0.0, 0.0)
        if skip is not None:
            cd = self._biased_conv(skip, 2)
            own = None if cd is None else self._conv_terms(cd, win, values)
            biased = (0.0, 0.0) if cd is skip else self._sum_terms(skip, win, values)
            if own is None or biased is None:
                return None
            projected = (own[2], biased[1])
        w1 = self._conv_parts(c1)
        if second is None or first is None or bias1 is None or bias2 is None or closing is None or w1 is None:
            return None
        carried = second[0] * (first[2] + bias1[1]) * SLACK * SLACK
        rounding = second[2] + bias2[1] + closing[1] + projected[0] + projected[1]
        return first[1], (carried + rounding) * SLACK, conv_input_window(w1[1], w1[2], w1[4], win1)

    # -- two residual blocks at once -------------------------------------------------------------------------
    def _pair(self, v: Value) -> tuple[Block, Block] | None:
        """The blocks ``v`` closes where its input is the ReLU of another block's sum (a stride-1 second
        block), first block first; None otherwise."""
        second = self._block(v)
        if second is None or second[5] is not None or second[0].op != "relu":
            return None
        first = self._block(second[0].operands[0])
        return None if first is None else (first, second)

    def _leads_pair(self, v: Value) -> bool:
        """Whether ``v`` closes the first of two blocks bounded at once (then its own site takes the sum's rule)."""
        if v not in self.leading:
            self.leading[v] = any(pair is not None and pair[1][0] is r and self._pair_norm(*pair) is not None
                                  for r in self.users.get(v, ()) if r.op == "relu"
                                  for pair in map(self._pair, self.users.get(r, ())))
        return self.leading[v]

    def _overlaps(self, v: Value) -> bool:
        """Whether the pair ``v`` closes starts with the second block of another pair (three or more blocks in a
        row): its first block's input then took the sum's rule, and the block's own bound after the other pair
        may be the tighter one."""
        pair = self._pair(v)
        return pair is not None and self._pair(pair[1][0].operands[0]) is not None

    def _pair_width(self, first: Block, second: Block) -> int:
        """The width of :func:`relu_pair_sigma`'s matrices for two blocks: ``2·C2`` plus the first's input phases."""
        c1 = first[1]
        return 2 * int(shape_of(first[3])[1]) + (4 if first[5] is not None else 1) * int(shape_of(c1.operands[0])[1])

    def _pair_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``v = B₂(D·(B₁(x - ĉ_x) + r₁)) + r₂`` for blocks ``B₁``, ``B₂`` (their slope patterns), ``D`` the ReLU
        between them and ``r`` what each block's rounding adds: ``‖B₂DB₁‖`` is bounded at once
        (:func:`relu_pair_sigma`), ``‖B₂D‖`` by the chain ``1 + σσ`` (it carries only rounding)."""
        pair = self._pair(v)
        if pair is None:
            return None
        first, second = pair
        joint = self._pair_norm(first, second)
        sigmas = [self._sigma(c) for c in (second[1], second[3])]
        late = None if joint is None else self._block_terms(v, second, win, values)
        early = None if late is None else self._block_terms(second[0].operands[0], first, late[2], values)
        if joint is None or late is None or early is None or sigmas[0] is None or sigmas[1] is None:
            return None
        chain = 1 + sigmas[0][0] * sigmas[1][0] * SLACK
        return (joint * early[0] + chain * early[1] + late[1]) * SLACK ** 4

    def _pair_norm(self, first: Block, second: Block) -> float | None:
        """:func:`relu_pair_sigma` for two blocks (None where it is not certified), on the first block's torus,
        which must also hold every read of the second."""
        (_, c11, _, c12, _, skip), (_, c21, _, c22, _, _) = first, second
        parts = [self._conv_parts(c) for c in (c11, c12, c21, c22)]
        cd = None if skip is None else self._biased_conv(skip, 2)
        pd = None if cd is None else self._conv_parts(cd)
        sigmas = [self._sigma(c) for c in (c11, c12, c21, c22)]
        if any(p is None for p in parts) or any(s is None for s in sigmas) or (skip is not None and pd is None):
            return None
        width = self._pair_width(first, second)
        if width > PAIR_WIDTH_MAX:
            return None
        (_, w11, *_), (_, w12, _, pads12, *_), (_, w21, _, pads21, *_), (_, w22, _, pads22, *_) = parts  # type: ignore[misc]
        if skip is None:
            torus = self.torus(c11)
            if any(self.torus(c) != torus for c in (c12, c21, c22)):
                return None
        else:  # the halving block's torus, grown where the second block reads further past the grid
            reach = [max(q, k - 1 - q) for p in parts[2:] for q, k in zip(p[3], p[1].shape[2:], strict=True)]  # type: ignore[index]
            torus = tuple(max(t, n + max(reach)) for t, n in zip(self._halving_torus(parts[0], parts[1]),  # type: ignore[arg-type]
                                                                   shape_of(c21)[2:], strict=True))
        key = ("pair", *(self.weight_key(c) for c in (c11, c12, c21, c22, *([cd] if cd is not None else []))), torus,
               *(tuple(p[3]) for p in parts))  # type: ignore[index]
        projection = 1.0 if pd is None else float(np.linalg.norm(pd[1][:, :, 0, 0], 2))
        start = (projection + sigmas[0][0] * sigmas[1][0]) * (1 + sigmas[2][0] * sigmas[3][0])  # type: ignore[index]
        hit = self.block_norms.get(key)
        if hit is None:
            units = pair_units(width, torus)  # type: ignore[arg-type]
            if not self.pairs.take(units):
                return None
            wd = None if pd is None else pd[1]

            def compute() -> float:
                with np.errstate(all="ignore"):
                    try:
                        found = relu_pair_sigma((w11, w12, wd), (tuple(parts[0][3]), tuple(pads12)), (w21, w22),  # type: ignore[index]
                                                (tuple(pads21), tuple(pads22)), torus,  # type: ignore[arg-type]
                                                tuple(s[0] for s in sigmas), start)  # type: ignore[index,arg-type]
                    except (np.linalg.LinAlgError, ValueError, ArithmeticError):
                        found = None
                return math.inf if found is None else found

            hit = self.block_norms[key] = cached(key, compute)
            self.units += units
        return hit * SLACK if hit <= PAIR_SHARE * start else None

    def _block(self, v: Value) -> tuple[Value, Value, Value, Value, Value, Value | None] | None:
        """``(x, conv₁, conv₁ + b₁, conv₂, conv₂ + b₂, skip)`` where ``v = skip + conv₂(relu(conv₁(x) + b₁)) + b₂``
        (each bias optional) with undilated, ungrouped 2-d convolutions, ``conv₂`` of stride 1; ``skip`` None
        for ``x`` itself (``conv₁`` of stride 1), else a stride-2 1x1 convolution of ``x`` (plus a bias) where
        ``conv₁`` has stride 2; None otherwise."""
        if v not in self.blocks:
            self.blocks[v] = None
            if v.op == "add" and len(v.operands) == 2 and all(o in self.live for o in v.operands):
                for s, other in (v.operands, v.operands[::-1]):
                    found = self._block_from(other, s)
                    if found is not None:
                        self.blocks[v] = found
                        break
        return self.blocks[v]

    def _block_from(self, other: Value, s: Value) -> tuple[Value, Value, Value, Value, Value, Value | None] | None:
        c2 = self._biased_conv(s, 1)
        if c2 is None or c2.operands[0].op != "relu" or shape_of(other) != shape_of(s):
            return None
        t = c2.operands[0].operands[0]
        for stride in (1, 2):
            c1 = self._biased_conv(t, stride)
            if c1 is None:
                continue
            x = c1.operands[0]
            if stride == 1 and other is x:
                return x, c1, t, c2, s, None
            cd = self._biased_conv(other, 2) if stride == 2 else None
            if cd is not None and cd.operands[0] is x and self._halving_reads_fit(c1, c2, cd):
                return x, c1, t, c2, s, other
        return None

    def _halving_reads_fit(self, c1: Value, c2: Value, cd: Value) -> bool:
        """A halving block's reads stay within one place of the grid (kernels of at most 3 taps, leading pads
        of at most 1, the projection a 1x1 one without), which the tori of :meth:`_block_norm` hold."""
        parts = [self._conv_parts(c) for c in (c1, c2, cd)]
        if any(p is None for p in parts):
            return False
        (_, w1, _, pads1, _, _), (_, w2, _, pads2, _, _), (_, wd, _, padsd, _, _) = parts  # type: ignore[misc]
        small = all(int(k) <= 3 for k in (*w1.shape[2:], *w2.shape[2:])) and all(0 <= p <= 1 for p in (*pads1, *pads2))
        return small and tuple(wd.shape[2:]) == (1, 1) and all(p == 0 for p in padsd)

    def _biased_conv(self, u: Value, stride: int) -> Value | None:
        """The convolution ``u`` is, or adds a constant to (None: neither, or not an undilated, ungrouped 2-d
        conv of ``stride`` whose output has ``ceil(input / stride)`` places along each axis)."""
        if u.op == "add" and len(u.operands) == 2:
            live = [o for o in u.operands if o in self.live]
            u = live[0] if len(live) == 1 and shape_of(live[0]) == shape_of(u) else u
        parts = self._conv_parts(u) if u.op == "conv" else None
        if parts is None:
            return None
        x, w, st, _, d, groups = parts
        plain = groups == 1 and w.ndim == 4 and all(k == stride for k in st) and all(k == 1 for k in d)
        fits = all(o == -(-n // stride) for o, n in zip(shape_of(u)[2:], shape_of(x)[2:], strict=True))
        return u if plain and fits else None

    def _block_norm(self, c1: Value, c2: Value, skip: Value | None) -> float | None:
        """A bound on ``‖P + C₂DC₁‖`` over every slope pattern ``D`` (:meth:`_compute_block_norm`) on tori where
        no window read wraps: a stride-1 block's convolutions' own torus; a halving block's output torus just
        large enough that the second convolution's reads past the grid land off it (where the ReLU's zeros
        stand for its padding), and twice it for the input, just as large for the first convolution's, ``σ``s
        computed there."""
        p1, p2 = self._conv_parts(c1), self._conv_parts(c2)
        cd = None if skip is None else self._biased_conv(skip, 2)
        pd = None if cd is None else self._conv_parts(cd)
        if p1 is None or p2 is None or (skip is not None and pd is None):
            return None
        if skip is None:
            torus, other = self.torus(c1), self.torus(c2)
            s1, s2 = self._sigma(c1), self._sigma(c2)
            if torus != other or s1 is None or s2 is None:
                return None
        else:
            torus = self._halving_torus(p1, p2)
        key = ("block", *(self.weight_key(c) for c in (c1, c2, *([cd] if cd is not None else []))), torus,
               tuple(p1[3]), tuple(p2[3]))  # the weights' values: a program that rounds them is another block
        hit = self.block_norms.get(key)
        if hit is None:  # (charged whether or not an earlier probe computed it: the same work, the same report)
            hit = self.block_norms[key] = cached(key, lambda: self._compute_block_norm(
                p1, p2, pd, torus, None if skip is not None else (s1[0], s2[0])))  # type: ignore[arg-type,index]
            width = int(p2[1].shape[0]) + (4 if skip is not None else 1) * int(p1[1].shape[1])
            self.units += block_units(width, torus)  # type: ignore[arg-type]
            if skip is not None:
                self.units += sigma_units(p1[1].shape, tuple(2 * t for t in torus), 1, (2, 2)) + \
                    sigma_units(p2[1].shape, torus, 1, (1, 1))
        return hit * SLACK

    @staticmethod
    def _halving_torus(p1: tuple, p2: tuple) -> tuple[int, ...]:
        """A halving block's output torus on which no read of either convolution wraps onto the grid: of the
        second's, and of the first's on twice it."""
        return tuple(max(m + max(q2, k2 - 1 - q2), -(-max(n + q1, 2 * (m - 1) + k1 - q1) // 2))
                     for m, n, q1, q2, k1, k2 in zip(shape_of(p2[0])[2:], shape_of(p1[0])[2:], p1[3], p2[3],
                                                     p1[1].shape[2:], p2[1].shape[2:], strict=True))

    @staticmethod
    def _compute_block_norm(p1: tuple, p2: tuple, pd: tuple | None, torus: tuple[int, int],
                            sigmas: tuple[float, float] | None) -> float:
        """The block's norm over every ReLU slope pattern: :func:`relu_block_sigma` for a stride-1 block,
        :func:`relu_halving_sigma` for a halving one (its ``σ``s on its own tori)."""
        with np.errstate(all="ignore"):
            try:
                if sigmas is not None:
                    return relu_block_sigma(p1[1], p2[1], torus, tuple(p1[3]), tuple(p2[3]),  # type: ignore[arg-type]
                                            *sigmas)  # type: ignore[misc]
                big = (2 * torus[0], 2 * torus[1])
                s1 = conv_sigma(p1[1], big, (1, 1), 1, (2, 2))
                s2 = conv_sigma(p2[1], torus, (1, 1), 1, (1, 1))
                return relu_halving_sigma(p1[1], p2[1], pd[1], torus, tuple(p1[3]), tuple(p2[3]), s1, s2)  # type: ignore[arg-type]
            except (np.linalg.LinAlgError, ValueError, ArithmeticError):
                return math.inf

    def _scaled_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """A product or quotient by a constant: the deviation scales by its largest factor."""
        scaled = self.scaling(v)
        if scaled is None:
            return None
        a, factor = scaled[0], scaled[1] * SLACK
        parts = self._with_magnitude(a, win, values)
        center = self.center_window(v, win)
        if parts is None or center is None:
            return None
        dev, mag = parts
        return (factor * dev + unit(v.dtype) * factor * mag + underflow(v, win) + CENTER64 * center) * SLACK * SLACK

    def _max_pool_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """Each output moves by at most the largest move in its window, so the outputs' squares sum to at most
        each input's square times the windows it lies in: ``√(overlap)`` times the input's deviation, or, by
        :func:`pool_levels`, the root of the sum over level sets (one per axis) of the input's deviation on
        that set, which a convolution below bounds by its norm restricted to the set's outputs (a 3x3 pool of
        stride 2 after ResNet's stem: 1.65x the stem's norm instead of 2x); or the input's deviation weighted
        by how many windows each place lies in (:func:`pool_weights`), which a convolution below bounds by
        one norm, of its outputs so weighted (the same stem: 1.56x)."""
        geometry = self._pool_geometry(v, win)
        if geometry is None:
            return None
        inw, overlap, ks, strides, pads, dilations = geometry
        x = v.operands[0]
        inner = self.deviation(x, inw, values)
        if inner is None:
            return None
        plain = inner * math.sqrt(overlap)
        levels = pool_levels(ks, strides, dilations)
        if levels is not None:
            total = 0.0
            for thin in itertools.product(*levels):
                part = self._restricted_deviation(x, inw, Thinned(tuple(thin)), values)
                total += (inner if part is None else min(part, inner)) ** 2
            plain = min(plain, math.sqrt(total * SLACK) * SLACK)
        weighted = self._restricted_deviation(x, inw, Weighted(pool_weights(ks, strides, pads, dilations)), values)
        if weighted is not None:
            plain = min(plain, weighted)
        return plain * SLACK * SLACK

    def _restricted_deviation(self, v: Value, win: Window, how: Thinned | Weighted,
                              values: Mapping[Value, Interval]) -> float | None:
        """A bound on the norm of ``v - ĉ`` over any ``win`` window, restricted (:class:`Thinned`) or weighted
        (:class:`Weighted`) per place: through element-wise ops (ReLU, clip, a cast, a sum) as the whole
        deviation goes, and at a convolution by the norm of its outputs so restricted or weighted, on a
        torus that is a multiple of the stride times the period. The rounding terms are the whole window's
        (times the largest weight). None: no such rule (the whole deviation, times the largest weight,
        bounds it)."""
        if v not in self.live:
            return 0.0
        if how.trivial:
            return self.deviation(v, win, values)
        clamped = clamp_window(v, win)
        if clamped is None or len(how.period) != len(shape_of(v)) - 2:
            return None
        key = (v, clamped, how)
        if key in self.restricted:
            return self.restricted[key]
        self.restricted[key] = None
        op, found = v.op, None
        live = [o for o in v.operands if o in self.live]

        def inner(o: Value) -> float | None:
            return self._restricted_deviation(o, clamped, how, values)

        if op == "conv":
            terms, sigma = self._conv_terms(v, clamped, values), self._restricted_sigma(v, how)
            if terms is not None and sigma is not None:
                found = (sigma * terms[1] + how.largest * terms[2]) * SLACK * SLACK
        elif op == "relu" or (isinstance(how, Thinned) and (op == "clip" or (op in ("max", "min")
                                                                             and len(v.operands) == 2))):
            found = self._lipschitz(v, clamped, values, inner)  # (a clip adds its bounds' move: thinned only)
        elif op == "cast" and v.operands[0].dtype.is_float and isinstance(how, Thinned):
            found = self._cast_deviation(v, clamped, values, inner)
        elif op in ("add", "sub") and all(shape_of(o) == shape_of(v) for o in live):
            parts = [inner(o) for o in live]
            terms = self._sum_terms(v, clamped, values)
            if terms is not None and all(p is not None for p in parts):
                found = (sum(parts) + how.largest * terms[1]) * SLACK * SLACK  # type: ignore[arg-type]
        self.restricted[key] = found
        return found

    def _restricted_sigma(self, v: Value, how: Thinned | Weighted) -> float | None:
        """The norm of convolution ``v`` keeping one output in ``thin`` per axis, or with its outputs weighted."""
        parts = self._conv_parts(v)
        if parts is None:
            return None
        _, w, s, _, d, groups = parts
        if isinstance(how, Weighted) and groups != 1:
            return None
        strides = tuple(sj * t for sj, t in zip(s, how.period, strict=True))
        torus = tuple(-(-t // st) * st for t, st in zip(self.torus(v), strides, strict=True))
        key = (how.tag, self.weight_key(v), torus, tuple(d), groups, strides, how.weights)
        hit = self.sigmas.get(key)
        if hit is None:  # (charged once per engine, whether or not another engine computed it)
            kernel, on, dil, step = w, torus, tuple(d), strides
            if isinstance(how, Weighted):  # one output block per residue, its input read as phases
                kernel = phase_stacked(weighted_kernel(w, s, d, how.weights), strides)
                on = tuple(t // st for t, st in zip(torus, strides, strict=True))
                dil = step = (1,) * len(strides)

            def compute() -> tuple[float, float]:
                with np.errstate(all="ignore"):
                    try:
                        return conv_sigma(kernel, on, dil, groups, step), 0.0
                    except (np.linalg.LinAlgError, ValueError):
                        return math.inf, 0.0

            hit = self.sigmas[key] = cached(("sigma", *key), compute)
            self.units += sigma_units(kernel.shape, on, groups, step)
        return hit[0] * SLACK if math.isfinite(hit[0]) else None

    def _avg_pool_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """An average pool is linear: the deviation's norm by ``√(overlap / divisor)``, plus the program's
        and the center's rounding of the window sums and the division."""
        geometry = self._pool_geometry(v, win)
        if geometry is None:
            return None
        inw, overlap, ks, s, pb, d = geometry
        factor = self.avg_factor(v, overlap, ks, s, pb, d)
        x = v.operands[0]
        mag = self.window(x, inw, values)
        dev, center = self.deviation(x, inw, values), self.center_window(x, inw)
        if factor is None or dev is None or center is None or mag is None:
            return None
        taps = math.prod(ks) + 2
        rounding = I.gamma(taps, unit(v.dtype)) * mag + I.gamma(taps, EPS64) * center
        return (factor * (dev + rounding * SLACK) + underflow(v, win)) * SLACK * SLACK

    def _batch_norm_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``a·(x - m) + b``: the deviation by ``max|a|``; the program's rounding is within ``8u`` and the
        center's within :data:`BATCH_NORM64` of ``|a|·|x| + |a·m| + |b|``."""
        x, *consts = v.operands
        if any(c in self.live for c in consts) or shape_of(x) != shape_of(v):
            return None
        params = batch_norm_params(v, [self.constant_value(c) for c in consts])
        if params is None:
            return None
        a, mean, bias = params
        top = float(np.max(np.abs(a), initial=0.0)) * SLACK
        shape = shape_of(v)
        shift = _per_channel(np.abs(a * mean) + np.abs(bias), len(shape))
        shift_norm = max_window(channel_squares(np.broadcast_to(shift, shape)), win) * SLACK
        parts = self._with_magnitude(x, win, values)
        center = self.center_window(x, win)
        if parts is None or center is None:
            return None
        dev, mag = parts
        program = 8 * unit(v.dtype) * (top * mag + shift_norm) + 4 * underflow(v, win)
        return (top * dev + program + BATCH_NORM64 * (top * center + shift_norm)) * SLACK * SLACK

    def _conv_deviation(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> float | None:
        """``W(x - ĉ_x)`` by ``σ(W)``; the program's accumulation within ``γ_{n+1}·σ(|W|)·‖x‖``, its rounding
        into ``v``'s type within ``u·‖y‖``, and the center's float64 sums within ``γ_{n+1}·σ(|W|)·‖ĉ_x‖``."""
        terms = self._conv_terms(v, win, values)
        return None if terms is None else (terms[0] * terms[1] + terms[2]) * SLACK * SLACK

    def _conv_terms(self, v: Value, win: Window, values: Mapping[Value, Interval]) -> tuple[float, float, float] | None:
        """A convolution's deviation as ``σ(W)``, its input's deviation over the window read, and what the
        rounding (the program's and the center's) adds."""
        parts, sig = self._conv_parts(v), self._sigma(v)
        if parts is None or sig is None:
            return None
        x, w, s, _, d, _ = parts
        inw = conv_input_window(w, s, d, win)
        found = self._with_magnitude(x, inw, values)
        center = self.center_window(x, inw)
        if found is None or center is None:
            return None
        dev, mag = found
        sigma, sigma_abs = sig
        n = math.prod(int(k) for k in w.shape[1:])
        acc = acc_type(x.dtype)
        tiny = n * I.smallest_subnormal(acc) * math.sqrt(cells(v, win))
        accumulated = I.gamma(n + 1, unit(acc)) * sigma_abs * mag + tiny
        rounded = unit(v.dtype) * ((sigma + I.gamma(n + 1, unit(acc)) * sigma_abs) * mag + tiny) + underflow(v, win)
        own = I.gamma(n + 1, EPS64) * sigma_abs * center
        return sigma, dev, accumulated + rounded + own

    # -- facts per element -----------------------------------------------------------------------------------
    def element_bound(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        plain = super().element_bound(v, values)
        centered = self._centered_elements(v, values) if v in self.live and v.dtype.is_float else None
        if centered is None:
            return plain
        if plain is None:
            return centered
        return np.minimum(plain[0], centered[0]), np.minimum(plain[1], centered[1])

    def _centered_elements(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        """``|v| <= |ĉ| + ‖v - ĉ‖`` per element, before and after its rounding into ``v``'s type."""
        c, d = self.centers.magnitude(v), self._element_deviation(v, values)
        if c is None or d is None:
            return None
        before = (c + d) * SLACK
        after = before
        if v.op in ("conv", "reduce_mean", "matmul"):  # the accumulated value's deviation: round into v's type
            after = (before * (1 + unit(v.dtype)) + I.smallest_subnormal(v.dtype)) * SLACK
        shape = shape_of(v)
        return np.broadcast_to(before, shape), np.broadcast_to(after, shape)

    def element_span(self, v: Value, values: Mapping[Value, Interval]) -> tuple[Interval, Interval] | None:
        """``ĉ ± ‖v - ĉ‖`` per element, before and after its rounding into ``v``'s type: the center's sign and
        place, which a magnitude loses, for the intervals of ``v``'s consumers."""
        if v not in self.live or not v.dtype.is_float:
            return None
        c, d = self.centers.get(v), self._element_deviation(v, values)
        if c is None or d is None:
            return None
        reach = d * SLACK + np.abs(c) * 2.0 ** -50  # (the float64 sum's rounding)
        shape = shape_of(v)
        before = Interval(np.broadcast_to(c - reach, shape).copy(), np.broadcast_to(c + reach, shape).copy())
        after = I.round_to(before, v.dtype, 1.0) if v.op in ("conv", "reduce_mean", "matmul") else before
        return before, after

    def _element_deviation(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """A bound on ``|v - ĉ|`` per element (broadcast to ``v``): before the rounding into ``v``'s type for a
        convolution and a global mean, after it (and so before it too) for the others."""
        if v not in self.live or v.is_param or self.centers.get(v) is None:
            return None
        shape = shape_of(v)
        if v.op == "conv" and len(shape) >= 3:
            return self._conv_element_deviation(v, values)
        if v.op == "reduce_mean":
            return self._mean_deviation(v, values)
        if v.op == "matmul" and len(shape) == 2:
            return self._product_deviation(v, values)
        if len(shape) >= 3 and v.op in ("add", "sub", "relu", "max_pool", "avg_pool", "cast", "mul", "div",
                                        "clip", "max", "min", "batch_norm"):
            d = self.deviation(v, (1,) * (len(shape) - 2), values)
            return None if d is None else np.asarray(d)
        return None

    def _conv_element_deviation(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """Per output channel: ``‖w_o‖₂`` times the receptive field's deviation (Cauchy–Schwarz), plus the
        accumulation's rounding and the center's, before the rounding into ``v``'s type."""
        parts = self._conv_parts(v)
        if parts is None:
            return None
        x, w, s, _, d, _ = parts
        field = conv_input_window(w, [1] * len(s), d, (1,) * len(s))
        found = self._with_magnitude(x, field, values)
        center = self.center_window(x, field)
        if found is None or center is None:
            return None
        dev, mag = found
        n = math.prod(int(k) for k in w.shape[1:])
        acc = acc_type(x.dtype)
        rows = np.sqrt(np.sum(w.reshape(w.shape[0], -1) ** 2, axis=1)) * SLACK
        rounding = I.gamma(n + 1, unit(acc)) * mag + I.gamma(n + 1, EPS64) * center
        linear = rows * dev
        through = self._through_relu(v, field, rows, values)
        if through is not None:
            linear = np.minimum(linear, through)
        out = ((linear + rows * rounding) * SLACK + n * I.smallest_subnormal(acc)) * SLACK
        return out.reshape((1, w.shape[0]) + (1,) * (len(shape_of(v)) - 2))

    def _through_relu(self, v: Value, field: Window, rows: np.ndarray,
                      values: Mapping[Value, Interval]) -> np.ndarray | None:
        """For ``v = W₂·relu(W₁·x + b₁)`` (stride-1 convolutions): output channel ``o`` moves by
        ``w₂ₒ·D(W₁(x - ĉ_x) + ρ₁)``, and ``‖W₁ᵀDw₂ₒ‖ <= ½‖W₁ᵀw₂ₒ‖ + ½σ₁‖w₂ₒ‖`` (``D = ½ + E``, ``|E| <= ½``), where
        ``W₁ᵀw₂ₒ`` is one filter, the two kernels composed (its norm, not an operator's): per channel, that
        times the deviation of ``x`` over the field both read, plus ``‖w₂ₒ‖`` times ``ρ₁``'s bound."""
        r = v.operands[0]
        if r.op != "relu" or self._biased_conv(v, 1) is not v:
            return None
        t = r.operands[0]
        c1 = self._biased_conv(t, 1)
        p1 = None if c1 is None else self._conv_parts(c1)
        p2 = self._conv_parts(v)
        if c1 is None or p1 is None or p2 is None:
            return None
        sig = self._sigma(c1)
        first = self._conv_terms(c1, field, values)
        bias = (0.0, 0.0) if t is c1 else self._sum_terms(t, field, values)
        if sig is None or first is None or bias is None:
            return None
        composed = self._composed_rows(c1, v, p1[1], p2[1])
        return 0.5 * (composed + sig[0] * rows) * first[1] * SLACK + rows * (first[2] + bias[1]) * SLACK * SLACK

    def _composed_rows(self, c1: Value, c2: Value, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
        """``‖W₁ᵀw₂ₒ‖`` per output channel ``o`` of ``c2`` (weights ``w2``) after ``c1`` (``w1``): the composed kernel's
        filters, float64, plus its error bound; charged once per engine, computed once per process."""
        key = ("composed", self.weight_key(c1), self.weight_key(c2))
        hit = self.composed.get(key)
        if hit is None:
            hit = self.composed[key] = cached(key, lambda: self._compose(w1, w2))
            pairs = w1.shape[2] * w1.shape[3] * w2.shape[2] * w2.shape[3]
            self.units += BLAS_UNIT * 2 * pairs * w2.shape[0] * w2.shape[1] * w1.shape[1] / 1e6
        return hit

    @staticmethod
    def _compose(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
        _, comp, terms = offset_products(kernel_taps(w2, (0, 0)), kernel_taps(w1, (0, 0)))
        _, size, _ = offset_products(kernel_taps(np.abs(w2), (0, 0)), kernel_taps(np.abs(w1), (0, 0)))
        rows = int(w2.shape[0])  # [D, O, C] -> per output channel, over every offset and input channel
        norms = np.sqrt(np.sum(np.swapaxes(comp, 0, 1).reshape(rows, -1) ** 2, axis=1))
        err = I.gamma(terms + 2, EPS64) * np.sqrt(np.sum(np.swapaxes(size, 0, 1).reshape(rows, -1) ** 2, axis=1))
        return (norms * (1 + 4 * EPS64) + err) * SLACK

    def _row_deviation(self, x: Value, values: Mapping[Value, Interval]) -> float | None:
        """A bound on each row's ℓ2 norm of ``x - ĉ`` for ``x`` the [N, C] reshape of a global mean (a CNN's
        classifier input): the means' deviation over the channels, after their rounding into ``x``'s type."""
        if x.op != "reshape" or x.operands[0].op != "reduce_mean":
            return None
        mean = x.operands[0]
        ms = shape_of(mean)
        if len(shape_of(x)) != 2 or shape_of(x) != (ms[0], math.prod(ms[1:])) or math.prod(ms[2:]) != 1:
            return None
        d, c = self._mean_deviation(mean, values), self.centers.get(mean)
        if d is None or c is None:
            return None
        dev = float(np.max(d))  # (each channel's bound is also the channels' ℓ2 bound: see _mean_deviation)
        center = float(np.max(np.sqrt(np.sum(c.reshape(ms[0], -1) ** 2, axis=1)))) * SLACK
        rounded = unit(mean.dtype) * (center + dev) + I.smallest_subnormal(mean.dtype) * math.sqrt(ms[1])
        return (dev + rounded) * SLACK

    def _product_deviation(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """``x·B`` by a constant matrix, ``x`` a row whose ℓ2 deviation is known (:meth:`_row_deviation`):
        ``|y_ij - ĉ_ij| <= ‖B_j‖₂·‖x_i - ĉ_i‖₂`` (Cauchy–Schwarz), plus the accumulation's rounding
        (``γ_{K+1}·‖B_j‖₂·‖x_i‖₂``) and the center's, before the rounding into ``v``'s type."""
        if len(v.operands) != 2 or v.attr("transpose_a"):
            return None
        x, b = v.operands
        if b in self.live or x not in self.live:
            return None
        dev = self._row_deviation(x, values)
        cx = self.centers.get(x)
        if dev is None or cx is None:
            return None
        k = int(shape_of(x)[1])
        cols = _column_norms(self.constant_value(b), bool(v.attr("transpose_b")))
        center = float(np.max(np.sqrt(np.sum(cx * cx, axis=1)))) * SLACK
        acc = acc_type(x.dtype)
        spread = dev + I.gamma(k + 1, unit(acc)) * (center + dev) + I.gamma(k + 1, EPS64) * center
        return ((cols * spread) * SLACK + k * I.smallest_subnormal(acc)).reshape(1, -1) * SLACK

    def _mean_deviation(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """A global average pool: each channel's mean moves by at most the image's deviation over
        ``√(positions)``, plus the program's and the center's rounding of the sums."""
        x = v.operands[0]
        rank = len(shape_of(x))
        axes = sorted(int(a) % rank for a in (v.attr("axes") or ()))
        if rank < 3 or axes != list(range(2, rank)):
            return None
        whole = shape_of(x)[2:]
        found = self._with_magnitude(x, whole, values)
        center = self.center_window(x, whole)
        if found is None or center is None:
            return None
        dev, mag = found
        cells = math.prod(whole)
        acc = acc_type(x.dtype)
        spread = dev + I.gamma(cells + 2, unit(acc)) * mag + I.gamma(cells + 2, EPS64) * center
        return np.asarray(spread / math.sqrt(cells) * SLACK + I.smallest_subnormal(acc))


def _column_norms(b: np.ndarray, transposed: bool) -> np.ndarray:
    """``‖B[:, j]‖₂`` per column of the matrix a product reads (``B[j, :]`` when it reads ``B`` transposed),
    rounded up."""
    b = np.asarray(b, dtype=np.float64)
    sq = np.sum(b * b, axis=1 if transposed else 0)
    return np.sqrt(sq * (1 + I.gamma(b.shape[1 if transposed else 0] + 2, EPS64))) * SLACK
