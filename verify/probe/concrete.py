"""The interpreter's reading of rules with a hook that records what watched nodes computed
(the witness search's view of a site)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.ir.evaluate import NumpyWalker
from cuvil.ir.rules import Expr
from cuvil.ir.rulewalk import RuleInfo


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


class WatchingWalker(NumpyWalker):
    """The interpreter's reading of a rule (reads out of range do not raise: a search point may
    take any index) that records what the watched nodes computed."""

    def __init__(self, info: RuleInfo, operands: Sequence[np.ndarray | None],
                 watch: Mapping[int, object] | None = None, chunk: tuple[int, int, int] | None = None) -> None:
        super().__init__(info, operands, chunk=chunk, strict=False)
        self.watch = watch or {}
        self.observed: dict[int, Observed] = {}

    def observe(self, e: Expr, value: np.ndarray) -> None:
        k = self.info.index.get(id(e))
        if k is None or k not in self.watch:
            return
        self.observed.setdefault(k, Observed()).add(value)
