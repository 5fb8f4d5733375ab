"""Shared pieces of the aten converters: axes, reshapes, slices and python scalars."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cuvil.frontend.aten_node import INT64_MAX, AtenCtx
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.values import Value


def axis_of(ctx: AtenCtx, d: int, rank: int) -> int:
    return norm_axis(int(d), max(rank, 1), ctx.op_name)


def reshape_to(ctx: AtenCtx, x: Value, shape: Sequence[Dim]) -> Value:
    if tuple(x.shape) == tuple(shape):
        return x
    return ctx.b.reshape(x, shape=tuple(shape))


def as_vector(ctx: AtenCtx, x: Value) -> Value:
    """torch reads dim 0 (or -1) of a rank-0 tensor as the axis of a one-element vector: an op along a dim
    runs on that vector, and :func:`like_input` turns its results back to rank 0."""
    return reshape_to(ctx, x, (1,)) if x.type.rank == 0 else x


def like_input(ctx: AtenCtx, y: Value, x: Value) -> Value:
    """``y``, computed along a dim of :func:`as_vector`'s ``x``, at ``x``'s rank 0 where ``x`` had it."""
    return reshape_to(ctx, y, ()) if x.type.rank == 0 else y


def slice_axis(b: Builder, x: Value, axis: int, start: Dim, end: Dim, step: int = 1) -> Value:
    starts: list[Dim] = [0] * x.type.rank
    ends = list(x.shape)
    steps = [1] * x.type.rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    return b.slice(x, starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


def clamp_index(i: Any, size: Dim, default: Dim) -> Dim:
    """A python slice bound made concrete against a (possibly symbolic) size, as torch does."""
    if i is None:
        return default
    if isinstance(i, Sym):
        return i
    i = int(i)
    if isinstance(size, int):
        if i < 0:
            i += size
        return max(0, min(i, size))
    if i >= INT64_MAX // 2:
        return size
    return size + i if i < 0 else i


def binary_operands(ctx: AtenCtx, a: Any, b: Any, dtype: DType) -> tuple[Value, Value]:
    return ctx.imp.as_value(a, dtype, ctx.location), ctx.imp.as_value(b, dtype, ctx.location)


def first_two(ctx: AtenCtx) -> tuple[Any, Any]:
    names = ctx.arg_names()
    return ctx[names[0]], ctx[names[1]]


def python_scalar(value: Any, dtype: DType) -> bool | int | float:
    if dtype is DType.bool:
        return bool(value)
    return float(value) if dtype.is_float else int(value)
