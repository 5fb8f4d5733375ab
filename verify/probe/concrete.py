"""The concrete numpy reader of rules: the interpreter's semantics (every node in its own type),
with hoisting, and a hook that records what watched nodes computed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.interp import NUMPY_PRIMITIVES
from cuvil.ir.numpy_prims import cast as _cast
from cuvil.ir.numpy_prims import reduce_axes
from cuvil.ir.rules import Call, Expr, IndexValue, Lit, Load, Reduce
from verify.probe.rulewalk import IxVal, RuleInfo, RuleWalker, read_masked


@dataclass
class Observed:
    """What one watched node computed: its extremes and whether anything was not finite."""

    lo: float = np.inf
    hi: float = -np.inf
    nonfinite: bool = False

    def add(self, a: np.ndarray) -> None:
        x = np.asarray(a, dtype=np.float64)
        if not x.size:
            return
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite = True
        if finite.any():
            self.lo = min(self.lo, float(np.min(x[finite])))
            self.hi = max(self.hi, float(np.max(x[finite])))
        if np.isposinf(x).any():
            self.hi = np.inf
        if np.isneginf(x).any():
            self.lo = -np.inf


class NumpyWalker(RuleWalker[np.ndarray]):
    """Evaluates a rule on concrete operands as the reference interpreter does."""

    def __init__(self, info: RuleInfo, operands: Sequence[np.ndarray | None],
                 watch: Mapping[int, object] | None = None, chunk: tuple[int, int, int] | None = None) -> None:
        super().__init__(info, chunk)
        self.operands = operands
        self.watch = watch or {}
        self.observed: dict[int, Observed] = {}

    def load(self, e: Load, idx: list[IxVal]) -> np.ndarray:
        arr = self.operands[e.operand]
        assert arr is not None, "the rule read an operand that was not given"
        return self.lift_array(read_masked(arr, [i.lo for i in idx], e.oob))

    def literal(self, e: Lit) -> np.ndarray:
        return self.lift_array(np.array(e.value, dtype=e.dtype.np))

    def index_value(self, e: IndexValue, ix: IxVal) -> np.ndarray:
        return ix.lo

    def dyn_index(self, e: Expr) -> IxVal:
        return IxVal.exact(self.expr(e).astype(np.int64))

    def call(self, e: Call, args: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            if e.fn == "cast":
                out = _cast(args[0], dict(e.attrs)["to"])
            else:
                out = NUMPY_PRIMITIVES[e.fn](*args)
        return self.lift_array(np.asarray(out).astype(e.dtype.np, copy=False))

    def reduce(self, e: Reduce, body: np.ndarray, axes: tuple[int, ...], extents: list[int]) -> np.ndarray:
        shape = list(np.broadcast_shapes(body.shape, (1,) * self.depth))
        for ax, n in zip(axes, extents, strict=True):
            shape[ax] = n
        full = np.broadcast_to(body, shape)
        with np.errstate(all="ignore"):
            return np.asarray(reduce_axes(e.kind, full, axes), dtype=body.dtype)

    def observe(self, e: Expr, value: np.ndarray) -> None:
        k = self.info.index.get(id(e))
        if k is None or k not in self.watch:
            return
        self.observed.setdefault(k, Observed()).add(value)


def evaluate_watched(info: RuleInfo, operands: Sequence[np.ndarray], watch: Mapping[int, object],
                     budget: int = 1 << 22) -> tuple[np.ndarray, dict[int, Observed]]:
    """The op's result and what its watched nodes computed (chunked over large grids)."""
    from verify.probe.rulewalk import chunks

    observed: dict[int, Observed] = {}
    parts = []
    axis = 0
    for ch in chunks(info, budget):
        w = NumpyWalker(info, operands, watch, ch)
        out = w.expr(info.rule)
        parts.append(np.broadcast_to(out, w.block_shape))
        if ch is not None:
            axis = ch[0]
        for k, o in w.observed.items():
            acc = observed.setdefault(k, Observed())
            acc.lo, acc.hi = min(acc.lo, o.lo), max(acc.hi, o.hi)
            acc.nonfinite = acc.nonfinite or o.nonfinite
    result = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
    return np.array(np.broadcast_to(result, info.out_shape)), observed
