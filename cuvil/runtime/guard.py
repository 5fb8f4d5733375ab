"""What a guarded library's refusal means: the fault that fired and the fail-safe policy's response.

A library compiled with a policy (``compile(..., failsafe=POLICY)``) returns a guard code when an
input element is outside its box or not finite, or an output element is not finite
(:mod:`cuvil.codegen.guard`). The loader turns that code into a :class:`GuardFault` carrying the
policy's fault name and the mode and parameters its table gives for the scenario with exactly that
fault active, all read from the manifest (the policy module is not needed to run a library).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.abi import element_bounds
from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType


class GuardFault(CuvilError):
    """A guarded library refused its inputs (outside the verified box, or not finite) or its outputs
    (not finite). ``fault``: the policy's name for it; ``mode``/``parameters``: what the policy's table
    says to run with exactly that fault active (None when it has no such scenario); ``tensor`` and
    ``index``: the first offending element; ``return_code``: the library's ``CUVIL_ERR_*`` code."""

    code = "CUVIL-FAILSAFE-GUARD"
    default_hint = "switch to the policy's mode for this fault (GuardFault.mode, .parameters) until it clears"

    def __init__(self, message: str, *, return_code: int, fault: str | None = None, mode: str | None = None,
                 parameters: Mapping[str, float] | None = None, tensor: str | None = None,
                 index: int | None = None, location: str | None = None, hint: str | None = None) -> None:
        self.return_code = return_code
        self.fault = fault
        self.mode = mode
        self.parameters = dict(parameters) if parameters is not None else None
        self.tensor = tensor
        self.index = index
        super().__init__(message, location=location, hint=hint)

    @property
    def check(self) -> str:
        """The failed check's code by name: ``ERR_INPUT_BOX``, ``ERR_INPUT_NONFINITE`` or ``ERR_OUTPUT_NONFINITE``."""
        return abi.ERROR_NAMES.get(self.return_code, str(self.return_code))


def policy_response(failsafe: Any, fault: str | None) -> tuple[str | None, dict[str, float] | None]:
    """The mode and parameters of the policy's table row whose scenario is exactly ``{fault}``."""
    table = failsafe.get("table") if isinstance(failsafe, Mapping) else None
    if fault is None or not isinstance(table, list):
        return None, None
    for row in table:
        if isinstance(row, Mapping) and row.get("faults") == [fault]:
            mode = row.get("mode")
            params = row.get("parameters")
            return (mode if isinstance(mode, str) else None,
                    {str(k): float(v) for k, v in params.items()} if isinstance(params, Mapping) else None)
    return None, None


def guard_fault(manifest: Mapping[str, Any], rc: int, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                location: str) -> GuardFault:
    """The :class:`GuardFault` for a guard code ``rc`` returned by the library of ``manifest``."""
    guard = manifest.get("guard")
    guard = guard if isinstance(guard, Mapping) else {}
    side = "output" if rc == abi.ERR_OUTPUT_NONFINITE else "input"
    fault = guard.get(f"{side}_fault")
    fault = fault if isinstance(fault, str) else None
    mode, parameters = policy_response(manifest.get("failsafe"), fault)
    tensor, index = _culprit(guard.get("checks"), side, inputs if side == "input" else outputs)
    where = f" ({side} {tensor!r}, element {index})" if tensor is not None else ""
    response = (f"; the policy's mode for {fault!r} alone is {mode!r} with {parameters}" if mode is not None
                else f"; the policy has no scenario with only {fault!r} active" if fault is not None
                else "; the policy names no fault for it")
    hint = None if mode is not None else "the policy gives no mode for this fault alone: do not use the outputs"
    return GuardFault(f"{manifest.get('function')}: {abi.ERROR_TEXT.get(rc, f'code {rc}')}{where}{response}",
                      return_code=rc, fault=fault, mode=mode, parameters=parameters, tensor=tensor, index=index,
                      location=location, hint=hint)


def _culprit(checks: Any, side: str, arrays: Sequence[np.ndarray]) -> tuple[str | None, int | None]:
    """The first tensor of ``side``, in the guard's order, with an element failing its check, and the
    element's flat index (None, None when the checks cannot be read)."""
    if not isinstance(checks, list):
        return None, None
    for c in checks:
        if not (isinstance(c, Mapping) and c.get("side") == side and isinstance(c.get("index"), int)
                and 0 <= c["index"] < len(arrays)):
            continue
        a = arrays[c["index"]]
        bad = np.flatnonzero(~_passes(a, c))
        if bad.size:
            return str(c.get("tensor")), int(bad[0])
    return None, None


def _passes(a: np.ndarray, check: Mapping[str, Any]) -> np.ndarray:
    """Which elements of ``a`` pass ``check`` (the native test, element by element)."""
    dt = DType.from_numpy(a.dtype)
    if check.get("check") != "box":
        return np.isfinite(a.astype(np.float64)) if dt.is_float else np.ones(a.shape, bool)
    bounds = element_bounds(dt, float(check["lo"]), float(check["hi"]))
    if bounds is None:
        return np.zeros(a.shape, bool)
    values = a.astype(np.float64) if dt.is_float else a
    return (values >= bounds[0]) & (values <= bounds[1])
