"""Verdicts are types, not booleans: Proved, Refuted (with a replayed counterexample) or
Unknown (with the reason). Unknown never counts as proved."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.ir.types import TensorType


@dataclass(frozen=True)
class TensorInput:
    """One concrete input of a counterexample: a cut leaf and the tensor it was given."""

    label: str
    type: TensorType
    kind: str
    value: np.ndarray


def _fmt_scalar(x: Any) -> str:
    if isinstance(x, str):  # a structural difference names what differs
        return x
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    f = float(x)
    if math.isnan(f):
        return "nan"
    if f == 0.0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    return f"{f:.9g}"


def _fmt_tensor(a: np.ndarray, limit: int = 8) -> str:
    flat = np.asarray(a).reshape(-1)
    shown = ", ".join(_fmt_scalar(x) for x in flat[:limit])
    if flat.size > limit:
        return f"[{shown}, ...] ({flat.size} elements)"
    return f"[{shown}]" if np.asarray(a).ndim else shown


@dataclass
class Counterexample:
    """Concrete cut tensors and an output index where the two sides differ, as replayed on the
    reference interpreter at the model's dtypes."""

    output: str
    index: tuple[int, ...]
    dtype: str
    before: Any
    after: Any
    inputs: list[TensorInput]
    found_by: str
    replayed: bool = True
    model_constants: bool = True
    note: str = ""
    function_inputs: dict[str, np.ndarray] | None = None
    """The whole function's inputs (by parameter name) the cut tensors were computed from, when
    the search started from them: the counterexample replays on the complete model too."""

    def table(self) -> str:
        """An aligned table: inputs, then the two values at the index."""
        rows = [("input", "type", "value")]
        for t in self.inputs:
            rows.append((t.label, str(t.type), _fmt_tensor(t.value)))
        rows.append(("", "", ""))
        rows.append((f"before {self.output}{list(self.index)}", self.dtype, _fmt_scalar(self.before)))
        rows.append((f"after  {self.output}{list(self.index)}", self.dtype, _fmt_scalar(self.after)))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"  {a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
        lines.insert(1, "  " + "-" * (w0 + w1 + 12))
        replay = "replayed on the reference interpreter" if self.replayed else "a structural difference"
        head = f"counterexample (found by {self.found_by}; {replay})"
        if not self.model_constants:
            head += "; constants were free in this search"
        if self.note:
            head += f"\n  {self.note}"
        return head + "\n" + "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "index": list(self.index), "dtype": self.dtype,
                "before": _fmt_scalar(self.before), "after": _fmt_scalar(self.after), "found_by": self.found_by,
                "model_constants": self.model_constants, "note": self.note,
                "inputs": [{"label": t.label, "type": str(t.type), "kind": t.kind,
                            "values": np.asarray(t.value, dtype=np.float64).reshape(-1)[:64].tolist()
                            if t.value.dtype.kind in "fiub" else []} for t in self.inputs]}


@dataclass(frozen=True)
class Proved:
    encoder: str
    shapes: tuple[str, ...]
    seconds: float
    axioms: tuple[str, ...] = ()
    note: str = ""

    kind = "proved"

    def __str__(self) -> str:
        return f"proved ({self.encoder}, {', '.join(self.shapes)}, {self.seconds:.3f} s)"


@dataclass(frozen=True)
class Refuted:
    counterexample: Counterexample

    kind = "refuted"

    def __str__(self) -> str:
        return "refuted\n" + self.counterexample.table()


@dataclass(frozen=True)
class Unknown:
    reason: str
    details: tuple[str, ...] = field(default=())

    kind = "unknown"

    def __str__(self) -> str:
        return f"unknown: {self.reason}"


Verdict = Proved | Refuted | Unknown
