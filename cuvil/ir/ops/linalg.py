"""Contractions: matmul (batched, optional transposes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import sequential_dot, sequential_matmul
from cuvil.ir.opdef import REQUIRED, broadcast_shapes, define
from cuvil.ir.types import TensorType


def _matmul_type(types: list[TensorType], transpose_a: bool, transpose_b: bool) -> TensorType:
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise ValueError("matmul operands need rank >= 2 (the frontends lift vectors)")
    if a.dtype is not b.dtype:
        raise TypeError(f"operand dtypes differ: {a.dtype} vs {b.dtype}")
    m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    k2, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if k != k2 and isinstance(k, int) and isinstance(k2, int):
        raise ValueError(f"contraction dims differ: {k} vs {k2}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(a.dtype, (*batch, m, n))


def _matmul_terms(c: R.RuleCtx, oob: float | None = None) -> tuple[Any, Callable[[R.Ix], tuple[R.Load, R.Load]]]:
    """A batched product's reduction extent and its two operands' elements at step ``k`` (batch dims
    broadcast; ``oob``: what a step past the end reads)."""
    a, b = c.inputs
    ta, tb = c.attrs["transpose_a"], c.attrs["transpose_b"]
    *batch, i, j = c.out
    out_batch = c.out_type.shape[:-2]
    ab = R.broadcast_index(batch, a.shape[:-2], out_batch)
    bb = R.broadcast_index(batch, b.shape[:-2], out_batch)

    def at(k: R.Ix) -> tuple[R.Load, R.Load]:
        x = a.at(*ab, k, i, oob=oob) if ta else a.at(*ab, i, k, oob=oob)
        y = b.at(*bb, j, k, oob=oob) if tb else b.at(*bb, k, j, oob=oob)
        return x, y

    return (a.shape[-2] if ta else a.shape[-1]), at


def _matmul_rule(c: R.RuleCtx) -> R.Expr:
    k_ext, at = _matmul_terms(c)

    def body(k: R.Ix) -> R.Expr:
        x, y = at(k)
        return R.widen(x) * R.widen(y)

    return R.cast(R.reduce("sum", [k_ext], body), c.out_type.dtype)


def _matmul_numpy(xs: list[np.ndarray], out: TensorType, transpose_a: bool, transpose_b: bool) -> np.ndarray:
    a, b = xs
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return sequential_matmul(a, b)


define("matmul", ("lhs", "rhs"), attrs={"transpose_a": ("bool", False), "transpose_b": ("bool", False)},
       shape=_matmul_type, rule=_matmul_rule, numpy=_matmul_numpy, family="linalg", contraction=True,
       examples=lambda rng: [
           ([rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)], {}),
           ([rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((2, 5, 4)).astype(np.float32)],
            {"transpose_a": True, "transpose_b": True})],
       doc="batched matrix product sum_k lhs[..., i, k] * rhs[..., k, j]; batch dims broadcast")


# --------------------------------------------------------------------------------------
# bf16_matmul: bfloat16 products accumulated in float32, in pairs, as x86's vdpbf16ps


def _bf16_matmul_type(types: list[TensorType], transpose_a: bool, transpose_b: bool) -> TensorType:
    if any(t.dtype is not DType.bf16 for t in types):
        raise TypeError(f"bf16_matmul multiplies bfloat16 operands, not {types[0].dtype} and {types[1].dtype}")
    t = _matmul_type(types, transpose_a, transpose_b)
    return TensorType(DType.f32, t.shape)


def pair_order(k: R.Ix) -> R.Ix:
    """The step ``k`` of a paired reduction reads term ``k ^ 1``: each pair's odd term first."""
    return k + 1 - 2 * (k % 2)


def _bf16_matmul_rule(c: R.RuleCtx) -> R.Expr:
    k_ext, at = _matmul_terms(c, oob=0.0)  # an odd K's last pair reads a zero past the end

    def factors(k: R.Ix) -> tuple[R.Expr, R.Expr]:
        x, y = at(pair_order(k))
        return R.cast(x, DType.f32), R.cast(y, DType.f32)

    return R.dot("dot_ftz", [(k_ext + 1) // 2 * 2], factors)


def _bf16_matmul_numpy(xs: list[np.ndarray], out: TensorType, transpose_a: bool, transpose_b: bool) -> np.ndarray:
    a, b = (x.astype(np.float32) for x in xs)
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    k = a.shape[-1]
    if k % 2:  # the last pair's missing term is a zero
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), np.float32)], axis=-1)
        b = np.concatenate([b, np.zeros((*b.shape[:-2], 1, b.shape[-1]), np.float32)], axis=-2)
    order = np.arange(a.shape[-1]) ^ 1
    x = a[..., order][..., :, None, :]  # [..., m, 1, k]
    y = np.swapaxes(b[..., order, :], -1, -2)[..., None, :, :]  # [..., 1, n, k]
    return sequential_dot("dot_ftz", x, y, x.ndim - 1 if x.ndim >= y.ndim else y.ndim - 1)


def _bf16_examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    import ml_dtypes

    def bf16(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)

    # subnormal factors (2^-130, -2^-127) and products under float32's normals (2^-64 * 2^-64 + ...)
    tiny_a = np.array([[2.0 ** -130, -(2.0 ** -127), 1.5], [2.0 ** -64, 2.0 ** -70, -2.0]], dtype=np.float32)
    tiny_b = np.array([[2.0 ** -64, 1.0], [2.0 ** -60, 2.0 ** -127], [0.5, 2.0 ** -66]], dtype=np.float32)
    return [([bf16(2, 3, 4), bf16(4, 5)], {}),
            ([bf16(3, 5), bf16(5, 2)], {}),  # odd K: a zero completes the last pair
            ([bf16(4, 3), bf16(2, 5, 4)], {"transpose_a": True, "transpose_b": True}),
            ([tiny_a.astype(ml_dtypes.bfloat16), tiny_b.astype(ml_dtypes.bfloat16)], {})]


define("bf16_matmul", ("lhs", "rhs"), attrs={"transpose_a": ("bool", False), "transpose_b": ("bool", False)},
       shape=_bf16_matmul_type, rule=_bf16_matmul_rule, numpy=_bf16_matmul_numpy, family="linalg",
       contraction=True, precision_policy="as-declared", examples=_bf16_examples,
       doc="batched product of bfloat16 matrices into float32: along K in pairs, each pair's odd term first, "
           "every term a fused multiply-add with subnormal factors and sums flushed to zero (x86 vdpbf16ps); "
           "an odd K's last pair completed by a zero")


# --------------------------------------------------------------------------------------
# einsum

_ELLIPSIS = "..."


def _parse_term(term: str, rank: int, ell_rank: int, where: str) -> list[str]:
    """Labels of one operand; '...' expands to the trailing ``rank - letters`` of ``ell_rank``
    broadcast labels (named by a digit, which no einsum letter can be)."""
    if term.count(_ELLIPSIS) > 1:
        raise ValueError(f"{where}: '...' appears more than once in {term!r}")
    head, dots, tail = term.partition(_ELLIPSIS)
    for ch in head + tail:
        if not ch.isalpha():
            raise ValueError(f"{where}: invalid label {ch!r} in {term!r}")
    if not dots:
        if len(head) != rank:
            raise ValueError(f"{where}: {term!r} has {len(head)} labels for an operand of rank {rank}")
        return list(head)
    n = rank - len(head) - len(tail)
    if n < 0:
        raise ValueError(f"{where}: {term!r} has more labels than the operand's rank {rank}")
    return [*head, *(str(ell_rank - n + k) for k in range(n)), *tail]


def parse_einsum(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Labels per operand and for the output (implicit output: broadcast dims, then the letters
    that appear once, alphabetically)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands, got {len(ranks)}")
    ell_rank = max((r - len(t.replace(_ELLIPSIS, "")) for t, r in zip(terms, ranks, strict=True)
                    if _ELLIPSIS in t), default=0)
    ins = [_parse_term(t, r, ell_rank, "einsum") for t, r in zip(terms, ranks, strict=True)]
    if arrow:
        out = _parse_term(rhs, len(rhs.replace(_ELLIPSIS, "")) + (ell_rank if _ELLIPSIS in rhs else 0),
                          ell_rank, "einsum output")
        if len(set(out)) != len(out):
            raise ValueError(f"output {rhs!r} repeats a label")
        missing = [ch for ch in out if not any(ch in t for t in ins)]
        if missing:
            raise ValueError(f"output labels {missing} appear in no operand")
    else:
        counts: dict[str, int] = {}
        for t in ins:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = [str(k) for k in range(ell_rank)] + sorted(ch for ch, n in counts.items() if n == 1 and ch.isalpha())
    return ins, out


def _label_dims(ins: list[list[str]], types: list[TensorType]) -> dict[str, Any]:
    """The size of every label; letters must agree, broadcast ('...') labels may be 1."""
    dims: dict[str, Any] = {}
    for labels, t in zip(ins, types, strict=True):
        for ch, d in zip(labels, t.shape, strict=True):
            prev = dims.get(ch)
            if prev is None or (prev == 1 and not ch.isalpha()):
                dims[ch] = d
            elif d == prev or (d == 1 and not ch.isalpha()):
                continue
            elif isinstance(d, int) and isinstance(prev, int):
                raise ValueError(f"label {ch!r} has sizes {prev} and {d}")
    return dims


def _einsum_type(types: list[TensorType], equation: str) -> TensorType:
    dt = types[0].dtype
    if any(t.dtype is not dt for t in types):
        raise TypeError(f"operand dtypes differ: {[str(t.dtype) for t in types]}")
    ins, out = parse_einsum(equation, [t.rank for t in types])
    dims = _label_dims(ins, types)
    return TensorType(dt, tuple(dims[ch] for ch in out))


def _einsum_rule(c: R.RuleCtx) -> R.Expr:
    """out[labels] = sum over the labels missing from the output of the product of the operands."""
    ins, out = parse_einsum(c.attrs["equation"], [t.rank for t in c.inputs])
    dims = _label_dims(ins, [t.type for t in c.inputs])
    summed = [ch for ch in dict.fromkeys(ch for t in ins for ch in t) if ch not in out]

    def body(*ks: R.Ix) -> R.Expr:
        env = dict(zip(out, c.out, strict=True)) | dict(zip(summed, ks, strict=True))
        prod: R.Expr | None = None
        for labels, t in zip(ins, c.inputs, strict=True):
            idx = [R.Ix.lit(0) if (d == 1 and dims[ch] != 1) else env[ch]
                   for ch, d in zip(labels, t.shape, strict=True)]
            v = R.widen(t.at(*idx))
            prod = v if prod is None else prod * v
        assert prod is not None
        return prod

    if not summed:
        return R.cast(body(), c.out_type.dtype)
    return R.cast(R.reduce("sum", [dims[ch] for ch in summed], body), c.out_type.dtype)


def _einsum_examples(rng: np.random.Generator) -> list:
    f = lambda *sh: rng.standard_normal(sh).astype(np.float32)
    return [([f(2, 3), f(3, 4)], {"equation": "ij,jk->ik"}),
            ([f(2, 3, 4), f(2, 4, 5)], {"equation": "bij,bjk->bik"}),
            ([f(3, 3)], {"equation": "ii->i"}),
            ([f(2, 3, 4)], {"equation": "ijk->kij"}),
            ([f(5, 2, 3, 3)], {"equation": "...ii->...i"}),
            ([f(3, 2, 4), f(4, 5)], {"equation": "...j,jk"}),
            ([f(2, 3), f(4)], {"equation": "ij,k->"}),
            ([f(2, 1, 3, 4), f(4, 4, 5)], {"equation": "...ij,...jk->...ik"})]


define("einsum", ("*xs",), attrs={"equation": ("str", REQUIRED)}, shape=_einsum_type, rule=_einsum_rule,
       numpy=None, family="linalg", examples=_einsum_examples,
       doc="Einstein summation (numpy/ONNX equation syntax, '...' broadcasts, implicit output allowed)")
