"""Small building blocks over catalogue ops shared by the composite ONNX converters."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from cuvil.frontend.onnx_node import NodeCtx, SymbolicValueRequired
from cuvil.frontend.onnx_ops.fold import Scalar, is_symbolic
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.ops.control import INDEX
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, param

# the most iterations an unrolled Loop/Scan/recurrence may have before import refuses it
MAX_UNROLL = 4096


def scalar(b: Builder, value: float | int | bool, dtype: DType) -> Value:
    return b.const(np.array(value, dtype=dtype.np))


def index_const(b: Builder, i: int) -> Value:
    return b.const(np.array(i, dtype=np.int64))


def reshape_to(b: Builder, x: Value, shape: Sequence[Dim]) -> Value:
    return x if tuple(shape) == tuple(x.shape) else b.reshape(x, shape=list(shape))


def unsqueeze(b: Builder, x: Value, axis: int) -> Value:
    shape = list(x.shape)
    shape.insert(axis % (len(shape) + 1), 1)
    return b.reshape(x, shape=shape)


def take(b: Builder, x: Value, axis: int, i: int) -> Value:
    """x[..., i, ...] along ``axis`` (the axis is dropped)."""
    return b.gather(x, index_const(b, i), axis=axis)


def stack(b: Builder, xs: Sequence[Value], axis: int) -> Value:
    parts = [unsqueeze(b, x, axis) for x in xs]
    return parts[0] if len(parts) == 1 else b.concat(*parts, axis=axis)


def concat(b: Builder, xs: Sequence[Value], axis: int) -> Value:
    return xs[0] if len(xs) == 1 else b.concat(*xs, axis=axis)


def slice_along(b: Builder, x: Value, axis: int, start: int, end: int, step: int = 1) -> Value:
    """x[start:end:step] along one (static) axis; bounds already within the dim."""
    rank = x.type.rank
    axis = norm_axis(axis, rank)
    starts = [0] * rank
    ends = [d for d in x.shape]
    steps = [1] * rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    return b.slice(x, starts=starts, ends=ends, steps=steps)


def split_equal(b: Builder, x: Value, axis: int, parts: int) -> list[Value]:
    """Equal pieces along a static axis."""
    n = x.shape[axis]
    if not isinstance(n, int) or n % parts:
        raise ValueError(f"cannot split dim {n} into {parts} equal parts")
    sizes = [n // parts] * parts
    return [b.split(x, axis=axis, sizes=sizes, index=k) for k in range(parts)]


def fill(b: Builder, shape: Sequence[Dim], value: float | int | bool, dtype: DType) -> Value:
    return b.fill(shape=list(shape), value=value, dtype=dtype)


def positions(b: Builder, shape: Sequence[Dim], dtype: DType = DType.i64) -> Value:
    """0, 1, ..., n-1 along the one axis of ``shape`` that is not 1 (a broadcastable index ramp)."""
    return b.iota(shape=list(shape), start=0, step=1, dtype=dtype)


def static_dims(x: Value, ctx: NodeCtx, what: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in x.shape):
        raise ctx.unsupported(f"{what} needs static dims, got {x.type}")
    return tuple(int(d) for d in x.shape)


@overload
def static_scalar(ctx: NodeCtx, i: int, symbolic: Literal[False] = ...) -> float | int | bool: ...


@overload
def static_scalar(ctx: NodeCtx, i: int, symbolic: Literal[True]) -> Scalar | bool: ...


def static_scalar(ctx: NodeCtx, i: int, symbolic: bool = False) -> Any:
    """The one compile-time value of input ``i``: a number, or (where ``symbolic``) a symbolic dim."""
    v = np.asarray(ctx.static(i))
    if v.size != 1:
        raise ctx.unsupported(f"input {i} must hold one value, got shape {v.shape}")
    item = v.reshape(()).item()
    if is_symbolic(item) and not symbolic:
        raise SymbolicValueRequired(f"{ctx.op_name} input {i} ({item})", ctx.location)
    return item


def cast_to(b: Builder, v: Value, dtype: DType) -> Value:
    return v if v.dtype is dtype else b.cast(v, to=dtype)


_FRESH = itertools.count()


def block_args(types: Sequence[TensorType]) -> tuple[Value, list[Value]]:
    """Fresh arguments for a loop body being built: the iteration index, then one per type (named so
    that no graph input can share a name, so hash-consing never merges them with one)."""
    tag = f"%body{next(_FRESH)}"
    return param(f"{tag}.t", INDEX), [param(f"{tag}.{k}", t) for k, t in enumerate(types)]
