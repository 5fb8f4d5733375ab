"""Ops evaluated on concrete arrays: the reading of the rule language every other reading is
tested against.

:func:`evaluate_rule` is the numpy instance of the rule kit's walker
(:class:`cuvil.ir.rulewalk.RuleWalker`): a rule evaluated for every output index at once, each
``Reduce`` a left fold in the row-major order of its axes (``sequential_reduce``; a ``dot`` kind one
fused multiply-add per term, ``sequential_dot``).
:func:`evaluate_op` runs an op's numpy fast path when it has one (a schedule of the rule that the
catalogue tests compare with it bit for bit), else its rule. Function-level evaluation (inputs
bound to a signature, whole modules) is :mod:`cuvil.interp`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.errors import IRError, RuntimeEvalError
from cuvil.ir.dtypes import DType
from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES, bitcast, cast, sequential_dot, sequential_reduce
from cuvil.ir.opdef import OpDef, get_op
from cuvil.ir.region import Region
from cuvil.ir.rules import Call, Load, Reduce
from cuvil.ir.rulewalk import ArrayWalker, IxVal, RuleInfo
from cuvil.ir.specialize import bind_attr
from cuvil.ir.types import TensorType, bind_symbols
from cuvil.ir.values import Value, walk


class NumpyWalker(ArrayWalker):
    """The rule read with numpy arrays; with ``strict`` (the interpreter) a read out of range
    without a padding value is an evaluation error (an index taken from the data)."""

    def __init__(self, info: RuleInfo, arrays: Sequence[np.ndarray | None], op: str = "",
                 chunk: tuple[int, int, int] | None = None, *, strict: bool = True) -> None:
        super().__init__(info, arrays, chunk)
        self.op = op
        self.strict = strict

    def lift(self, v: np.ndarray) -> np.ndarray:
        return self.lift_array(np.asarray(v))

    def load(self, e: Load, idx: list[IxVal]) -> np.ndarray:
        if not (self.strict and e.oob is None and idx):
            return super().load(e, idx)
        arr = self.operand(e)
        ix = [i.lo for i in idx]
        inb = np.ones((1,) * self.depth, dtype=bool)
        for k, i in enumerate(ix):
            inb = inb & (i >= 0) & (i < arr.shape[k])
        if not inb.all():
            raise RuntimeEvalError(f"{self.op}: index out of range for operand {e.operand} of shape "
                                   f"{arr.shape}", location=self.op or None, hint="check gather/index inputs")
        return self.lift(arr[tuple(ix)])

    def call(self, e: Call, args: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            if e.fn == "cast":
                return self.lift(cast(args[0], dict(e.attrs)["to"]))
            if e.fn == "bitcast":
                return self.lift(bitcast(args[0], dict(e.attrs)["to"]))
            out = NUMPY_PRIMITIVES[e.fn](*args)
            return self.lift(np.asarray(out).astype(e.dtype.np, copy=False))

    def reduce(self, e: Reduce, body: np.ndarray, axes: tuple[int, ...], extents: list[int]) -> np.ndarray:
        base = axes[0]
        full = np.broadcast_to(body, body.shape[:base] + tuple(extents))
        with np.errstate(all="ignore"):
            return sequential_reduce(e.kind, full, base)

    def reduce_dot(self, e: Reduce, x: np.ndarray, y: np.ndarray, axes: tuple[int, ...],
                   extents: list[int]) -> np.ndarray:
        base = axes[0]
        shape = np.broadcast_shapes(x.shape, y.shape, (1,) * base + tuple(extents))
        shape = shape[:base] + tuple(extents)
        return sequential_dot(e.kind, np.broadcast_to(x, shape), np.broadcast_to(y, shape), base)


def evaluate_rule(opdef: OpDef, arrays: Sequence[np.ndarray], attrs: Mapping[str, Any],
                  out_type: TensorType) -> np.ndarray:
    """Evaluate ``opdef``'s compute rule on concrete arrays (the slow, literal reading)."""
    in_types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    rule = opdef.make_rule(in_types, attrs, out_type)
    shape = tuple(int(d) for d in out_type.shape)
    walker = NumpyWalker(RuleInfo.build(rule, shape), arrays, opdef.name)
    with np.errstate(all="ignore"):
        out = walker.expr(rule)
    return np.ascontiguousarray(np.broadcast_to(out, shape)).reshape(shape).astype(out_type.dtype.np, copy=False)


def evaluate_op(opdef: OpDef, arrays: Sequence[np.ndarray], attrs: Mapping[str, Any],
                out_type: TensorType, *, use_fast_path: bool = True) -> np.ndarray:
    """One op on concrete arrays: the numpy fast path when there is one, else the rule (a structured
    op's region is run by its ops' fast paths or rules as ``use_fast_path`` says)."""
    if opdef.structured and opdef.numpy is not None:
        with np.errstate(all="ignore"):
            out = np.asarray(opdef.numpy(list(arrays), out_type, **attrs, use_fast_path=use_fast_path))
    elif use_fast_path and opdef.numpy is not None:
        with np.errstate(all="ignore"):
            out = np.asarray(opdef.numpy(list(arrays), out_type, **attrs))
        if out.dtype != out_type.dtype.np:
            out = out.astype(out_type.dtype.np)
    else:
        out = evaluate_rule(opdef, arrays, attrs, out_type)
    if tuple(out.shape) != tuple(out_type.shape):
        raise IRError(f"{opdef.name} produced shape {out.shape}, its shape rule says {out_type}",
                      location=opdef.name, hint="this is a bug in the op's definition")
    return out


def evaluate_region(region: Region, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """A region's result on concrete arguments (its symbolic dims bound from their shapes)."""
    return evaluate_region_results(region, arrays)[0]


def evaluate_region_results(region: Region, arrays: Sequence[np.ndarray], *,
                            use_fast_path: bool = True) -> list[np.ndarray]:
    """Every value a region yields, on concrete arguments (its symbolic dims bound from their shapes)."""
    env = bind_symbols([p.type for p in region.params], [a.shape for a in arrays])
    memo: dict[Value, np.ndarray] = dict(zip(region.params, arrays, strict=True))
    for v in walk(region.results):
        if v in memo:
            continue
        if v.is_param or v.is_const:
            raise IRError(f"a region reads {v} that is not one of its arguments", location="fused")
        out_type = TensorType(v.dtype, v.type.concrete(env))
        attrs = {k: bind_attr(a, env) for k, a in v.attrs}
        memo[v] = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], attrs, out_type,
                              use_fast_path=use_fast_path)
    return [memo[r] for r in region.results]
