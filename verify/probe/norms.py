"""Row norms: facts about attention that per-element intervals cannot see.

Intervals bound ``q·k = Σ_d q_d k_d`` by ``Σ_d |q_d|·|k_d|`` from each element's own range, as if every
``q_d`` could take its extreme at once. After a layer norm that cannot happen: its output row has the
ℓ2 norm ``√n`` (up to rounding), a linear layer multiplies a row norm by at most its weight's largest
singular value, and Cauchy–Schwarz bounds the dot product by the product of the two norms. So a bound on
each row's ℓ2 norm along one axis travels with the values (:class:`RowNorms`):

* ``layer_norm``: ``‖y‖ <= max|γ|·√n·(1 + δ) + ‖β‖`` along its last axis (``δ`` the rounding of the
  normalized value, as in :func:`verify.probe.bounds.normalized_bound`);
* ``matmul`` by a constant ``W``: ``‖x·W‖ <= ‖x‖·(σ(W) + γ_{K+1}·σ(|W|))``, the accumulation's rounding
  included (``σ``: the largest singular value, or the Frobenius norm for large ``W``);
* adding a constant (``+ ‖c‖``), scaling by a constant scalar, casts, a ``reshape`` that splits the last
  axis (a piece of a row is no longer than the row) and a ``transpose`` (the axis moves with it);
* anything else: the norm of its interval magnitudes along the axis (always sound).

Two facts use them at a ``matmul`` of two values (every output element, before and after its rounding):
``|a_i·b_j| <= ‖a_i‖·‖b_j‖·(1 + γ_{K+1})`` along the contracted axis, and when ``a`` is a ``softmax`` over the
contracted axis (nonnegative rows summing to at most ``1 + ε``) ``|p·v_j| <= (1 + ε)(1 + γ_{K+1})·max_k |v_kj|``.
Every factor accounts for the float program's own rounding, so the facts hold for the values it computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.values import Value
from verify.probe import interval as I
from verify.probe.interval import Interval

SVD_MAX = 1 << 22
"""Largest constant matrix whose spectral norm is computed exactly; larger ones use the Frobenius norm."""

SLACK = 1.0 + 2.0 ** -40
"""The float64 rounding of the bounds' own arithmetic."""


def _u(dtype: DType) -> float:
    return I.unit_roundoff(dtype) if dtype.is_float else 0.0


def _acc(dtype: DType) -> float:
    """Unit roundoff of the type a sum of ``dtype`` terms accumulates in (halves in float32)."""
    return _u(DType.f32) if dtype in (DType.f16, DType.bf16) else _u(dtype)


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape)


class RowNorms:
    """Row-norm bounds of one interval pass (``values``: the intervals so far; constants by value)."""

    def __init__(self, constant_value, live: set[Value], sigmas: dict[str, tuple[float, float]]) -> None:  # type: ignore[no-untyped-def]
        self.constant_value = constant_value
        self.live = live
        self.sigmas = sigmas  # per constant, (σ(W), σ(|W|)), shared across passes
        self.memo: dict[tuple[Value, int], np.ndarray | None] = {}

    # -- norms -----------------------------------------------------------------------------------------------
    def norm(self, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """A bound on the ℓ2 norm of ``v`` along ``axis`` (keepdims), or None where nothing finite is known."""
        axis = norm_axis(axis, len(v.shape))
        key = (v, axis)
        if key not in self.memo:
            self.memo[key] = None  # no cycles in SSA, but keep recursion honest
            ruled = self._rule(v, axis, values) if v in self.live and not v.is_param else None
            plain = self._from_interval(v, axis, values)
            self.memo[key] = plain if ruled is None else (ruled if plain is None else np.minimum(ruled, plain))
        return self.memo[key]

    def _from_interval(self, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        iv = values.get(v)
        if iv is None or (iv.nan.any() if iv.nan.ndim else bool(iv.nan)):
            return None
        mag = np.broadcast_to(iv.magnitude(), _shape(v))
        if not np.all(np.isfinite(mag)):
            return None
        return np.sqrt(np.sum(mag * mag, axis=axis, keepdims=True)) * SLACK

    def _rule(self, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        op, rank = v.op, len(v.shape)
        last = axis == rank - 1
        u = _u(v.dtype)
        if op == "layer_norm" and last:
            return self._layer_norm(v)
        if op == "matmul" and last and not v.attr("transpose_a") and v.operands[1] not in self.live:
            return self._linear(v, values)
        if op in ("add", "sub"):
            return self._sum(v, axis, values)
        if op in ("mul", "div"):
            return self._scaled(v, axis, values)
        if op == "cast" and v.dtype.is_float and v.operands[0].dtype.is_float:
            inner = self.norm(v.operands[0], axis, values)
            return None if inner is None else inner * (1 + u) * SLACK
        if op == "transpose":
            perm = tuple(int(p) for p in v.attr("perm"))
            inner = self.norm(v.operands[0], perm[axis], values)
            return None if inner is None else np.transpose(np.broadcast_to(inner, _keep(v.operands[0], perm[axis])),
                                                           perm)
        if op == "reshape" and last:
            return self._split(v, values)
        return None

    def _layer_norm(self, v: Value) -> np.ndarray | None:
        x, scale, bias = v.operands
        if scale in self.live or bias in self.live:
            return None
        ax = norm_axis(int(v.attr("axis")), len(x.shape))
        n = math.prod(_shape(x)[ax:])
        acc = _acc(x.dtype)
        normalized = math.sqrt(n) * (1.0 + 8.0 * acc + (n + 2) * acc + 1e-12)
        g = float(np.max(np.abs(np.asarray(self.constant_value(scale), dtype=np.float64)), initial=0.0))
        beta = np.broadcast_to(np.asarray(self.constant_value(bias), dtype=np.float64), _shape(v))
        b = float(np.max(np.sqrt(np.sum(beta * beta, axis=-1)), initial=0.0))
        u = _u(v.dtype)
        bound = (g * normalized * (1 + acc) + b) * (1 + acc) * (1 + u) * SLACK
        keep = _keep(v, len(v.shape) - 1)
        return np.full(keep, bound)

    def _linear(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        x, w = v.operands
        if len(w.shape) != 2:
            return None
        inner = self.norm(x, len(x.shape) - 1, values)
        if inner is None:
            return None
        k = _shape(w)[0] if not v.attr("transpose_b") else _shape(w)[1]
        sigma, sigma_abs = self._sigma(w)
        acc, u = _acc(x.dtype), _u(v.dtype)
        return inner * (sigma + I.gamma(k + 1, acc) * sigma_abs) * (1 + u) * SLACK

    def _sigma(self, w: Value) -> tuple[float, float]:
        key = w.const_hash if w.is_const else str(id(w))
        hit = self.sigmas.get(key)
        if hit is None:
            m = np.asarray(self.constant_value(w), dtype=np.float64)
            if m.size <= SVD_MAX:
                hit = (float(np.linalg.norm(m, 2)), float(np.linalg.norm(np.abs(m), 2)))
            else:
                f = float(np.linalg.norm(m))
                hit = (f, f)
            hit = (hit[0] * (1 + 1e-12), hit[1] * (1 + 1e-12))  # the SVD's own accuracy
            self.sigmas[key] = hit
        return hit

    def _sum(self, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        total: np.ndarray | None = None
        for o in v.operands:
            part = self._operand_norm(o, v, axis, values)
            if part is None:
                return None
            total = part if total is None else total + part
        return None if total is None else total * (1 + _u(v.dtype)) * SLACK

    def _scaled(self, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        a, c = v.operands
        if c in self.live or math.prod(_shape(c)) != 1:
            return None
        factor = float(np.abs(np.asarray(self.constant_value(c), dtype=np.float64)).reshape(-1)[0])
        if v.op == "div":
            if factor == 0:
                return None
            factor = 1.0 / factor
        inner = self._operand_norm(a, v, axis, values)
        return None if inner is None else inner * factor * (1 + _u(v.dtype)) * SLACK

    def _operand_norm(self, o: Value, v: Value, axis: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """An operand's norm along ``v``'s ``axis`` (operands broadcast from the right)."""
        lead = len(v.shape) - len(o.shape)
        if o not in self.live:  # a constant: its row norms, broadcast
            data = np.broadcast_to(np.asarray(self.constant_value(o), dtype=np.float64), _shape(v))
            return np.sqrt(np.sum(data * data, axis=axis, keepdims=True)) * SLACK
        if axis - lead < 0 or _shape(o)[axis - lead] != _shape(v)[axis]:
            return None
        inner = self.norm(o, axis - lead, values)
        return None if inner is None else inner.reshape((1,) * lead + inner.shape)

    def _split(self, v: Value, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """A reshape keeping the leading axes and splitting the last: each piece is at most the row."""
        x = v.operands[0]
        old, new = _shape(x), _shape(v)
        lead = len(old) - 1
        if len(new) < len(old) or new[:lead] != old[:lead] or math.prod(new[lead:]) != old[-1]:
            return None
        inner = self.norm(x, lead, values)
        if inner is None:
            return None
        return np.broadcast_to(inner.reshape(inner.shape[:lead] + (1,) * (len(new) - lead)), _keep(v, len(new) - 1))

    # -- facts -----------------------------------------------------------------------------------------------
    def product_bound(self, v: Value, values: Mapping[Value, Interval]) -> tuple[np.ndarray, np.ndarray] | None:
        """For a ``matmul`` of two values: a bound on ``|out|`` per element before its rounding, and after."""
        if v.op != "matmul" or v.operands[1] not in self.live or v.operands[0] not in self.live:
            return None
        a, b = v.operands
        if len(a.shape) < 2 or len(b.shape) < 2:
            return None
        ka = len(a.shape) - 2 if v.attr("transpose_a") else len(a.shape) - 1
        kb = len(b.shape) - 1 if v.attr("transpose_b") else len(b.shape) - 2
        k = _shape(a)[ka]
        acc = I.gamma(k + 1, _acc(a.dtype))  # products (exact for halves widened to float32) and the sum
        before = self._convex(v, a, b, kb, values)
        if before is None:
            na, nb = self.norm(a, ka, values), self.norm(b, kb, values)
            if na is None or nb is None:
                return None
            if v.attr("transpose_a"):
                na = np.swapaxes(na, -1, -2)
            if v.attr("transpose_b"):
                nb = np.swapaxes(nb, -1, -2)
            before = na * nb
        before = before * (1 + acc) * SLACK
        after = before * (1 + _u(v.dtype)) * SLACK
        shape = _shape(v)
        return np.broadcast_to(before, shape), np.broadcast_to(after, shape)

    def _convex(self, v: Value, p: Value, w: Value, kb: int, values: Mapping[Value, Interval]) -> np.ndarray | None:
        """``p`` a softmax over the contracted axis: every output is a (near-)convex combination of a column."""
        if p.op != "softmax" or v.attr("transpose_a") or norm_axis(int(p.attr("axis")), len(p.shape)) != len(
                p.shape) - 1:
            return None
        iv = values.get(w)
        if iv is None:
            return None
        mag = np.broadcast_to(iv.magnitude(), _shape(w))
        if not np.all(np.isfinite(mag)):
            return None
        n = _shape(p)[-1]
        eps = I.gamma(n + 4, _acc(p.dtype)) * 2 + _u(p.dtype)  # each p rounded up by at most that much
        col = np.max(mag, axis=kb, keepdims=True)
        if v.attr("transpose_b"):
            col = np.swapaxes(col, -1, -2)
        return col * (1 + eps)


def _keep(v: Value, axis: int) -> tuple[int, ...]:
    shape = list(_shape(v))
    shape[axis] = 1
    return tuple(shape)
