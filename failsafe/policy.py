"""A synthesized degraded-mode policy: per scenario the mode chosen and its parameters, the scenarios
no mode makes safe, and what the runtime guard needs; written as JSON (``cuvil-failsafe-policy/1``),
read back with every field and the consistency of the whole checked (a hand-edited file fails with the
JSON path at fault), and re-checked against a spec by proving every entry again (:func:`check_policy`).
This is the one reader of the format: the guard a compiled library carries (:mod:`failsafe.guard`) is
built from what it reads.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from cuvil.errors import CuvilError
from failsafe.network import REGION_FORMAT, VERDICTS, Cell, TrustedRegion
from failsafe.network import Counterexample as CellCounterexample
from failsafe.spec import FAULT_KINDS, Mode, Spec, scenario_label

if TYPE_CHECKING:
    from failsafe.network import DecisionNetwork
    from failsafe.synth import Prover

FORMAT = "cuvil-failsafe-policy/1"
ENTRY_VERDICTS = ("proved", "unknown")
CHECKS = ("numeric", "exact", "model")
"""How a counterexample was confirmed: float evaluation (``Expr.evaluate``) of the reported state, exact
rational evaluation of the reported floats, or the z3 model's exact values (the floats are rounded)."""
TOP_LEVEL = ("format", "spec", "state", "faults", "modes", "table", "unrealizable", "guard", "digest")
GUARD_FIELDS = ("inputs", "input_fault", "output_fault")
GUARD_FAULT_KINDS = {"input_fault": "input-box", "output_fault": "non-finite"}
"""The kind of fault each guard field names: the guard raises it on an input outside its box, on a
non-finite output."""
NETWORK_FIELDS = ("fallback", "fallback_parameters", "region")
REGION_FIELDS = ("format", "inputs", "outputs", "scenario", "faults", "mode", "parameters", "margin", "counts",
                 "coverage", "cells")
CELL_FIELDS = ("lo", "hi", "verdict", "method", "depth", "margin", "phases", "counterexample", "reason", "seconds")
FAULT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
NAME_LIMIT = 256

T = TypeVar("T")


class PolicyError(CuvilError):
    """A policy file that cannot be read as a ``cuvil-failsafe-policy/1`` document."""

    code = "CUVIL-FAILSAFE-POLICY"
    default_hint = "a policy file is written by `synthesize`; re-synthesize it rather than editing it by hand"


@dataclass(frozen=True)
class Counterexample:
    """A state that defeats ``mode`` with ``parameters``: in the scenario's region, the mode's assumptions
    hold and the invariants in ``violated`` do not."""

    mode: str
    state: dict[str, float]
    parameters: dict[str, float] = field(default_factory=dict)
    check: str = "numeric"
    violated: tuple[str, ...] = ()


@dataclass(frozen=True)
class Optimum:
    """How far a parameter's objective was pushed: ``value`` is proved safe; ``bound`` is the closest
    value tried beyond it that is not (None when ``value`` is the end of the range). ``exact`` when no
    float between them is left; ``monotone`` when every value tried beyond ``value`` was refuted rather
    than left undecided (the unsafe end really is unsafe)."""

    parameter: str
    objective: str
    value: float
    bound: float | None
    exact: bool
    width: float
    monotone: bool
    probes: int


@dataclass(frozen=True)
class NetworkUse:
    """How a mode that relies on the decision network is made safe (Simplex): in the proved cells of
    ``region`` the network acts, everywhere else ``fallback`` (a later mode that does not rely on it,
    proved safe in the scenario with ``fallback_parameters``). No fallback (None) only when the region's
    cells prove the whole scenario."""

    fallback: str | None
    fallback_parameters: dict[str, float]
    region: TrustedRegion


@dataclass(frozen=True)
class Entry:
    """A scenario's row of the table: the mode chosen (None when undecided) and its proved parameters;
    ``network`` when the mode relies on the decision network."""

    scenario: str
    faults: tuple[str, ...]
    mode: str | None
    parameters: dict[str, float]
    verdict: str
    seconds: float = 0.0
    candidates_rejected: int = 0
    counterexamples: tuple[Counterexample, ...] = ()
    reason: str = ""
    optimum: tuple[Optimum, ...] = ()
    network: NetworkUse | None = None


@dataclass(frozen=True)
class ModeFailure:
    """Why one mode is not safe in an unrealizable scenario (``refuted``, ``vacuous`` or ``unavailable``)."""

    mode: str
    verdict: str
    state: dict[str, float] | None = None
    parameters: dict[str, float] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True)
class Unrealizable:
    """A scenario no mode makes safe. ``state``, when found, defeats every available mode for every
    parameter value (``found_by`` says how it was found); otherwise ``per_mode`` alone says why."""

    scenario: str
    faults: tuple[str, ...]
    state: dict[str, float] | None
    per_mode: tuple[ModeFailure, ...]
    found_by: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Guard:
    """What the runtime guard watches: the decision model's input box, and the faults it raises itself."""

    inputs: dict[str, tuple[float, float]] = field(default_factory=dict)
    input_fault: str | None = None
    output_fault: str | None = None


@dataclass(frozen=True)
class StateRange:
    lo: float
    hi: float
    unit: str = ""


@dataclass(frozen=True)
class Policy:
    spec_name: str
    spec_digest: str
    spec_source: str
    state: dict[str, StateRange]
    faults: tuple[tuple[str, str], ...]  # (name, kind) in declaration order
    modes: tuple[str, ...]
    table: tuple[Entry, ...]
    unrealizable: tuple[Unrealizable, ...] = ()
    guard: Guard = field(default_factory=Guard)
    synthesis: dict[str, Any] = field(default_factory=dict, compare=False)
    """The run's settings, query count and seconds: for reports, not part of the file format."""
    digest: str = field(default="", compare=False)
    """The digest of the file it was read from, checked against that file's content ("" for a policy
    synthesized here or read with ``check_digest=False``): what a compiled library records."""

    def entry(self, faults: frozenset[str]) -> Entry | None:
        return next((e for e in self.table if frozenset(e.faults) == faults), None)

    def to_dict(self) -> dict[str, Any]:
        data = _policy_dict(self)
        data["digest"] = digest_of(data)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @staticmethod
    def from_json(text: str | bytes | Mapping[str, Any], *, source: str = "", check_digest: bool = True) -> Policy:
        """Read a policy; ``check_digest=False`` accepts a file edited after synthesis (to re-check it)."""
        return from_json(text, source=source, check_digest=check_digest)


@dataclass(frozen=True)
class Verdict:
    """The re-check of one scenario's claim (``mode``: that mode is safe; ``unrealizable``; ``unknown``):
    ``proved``, ``refuted`` (with a counterexample when a state shows it), ``unknown`` or ``error`` (the
    entry does not fit the spec)."""

    scenario: str
    faults: tuple[str, ...]
    claim: str
    mode: str | None
    status: str
    reason: str = ""
    counterexample: Counterexample | None = None
    seconds: float = 0.0


def guard_for(spec: Spec) -> Guard:
    """The guard section: the model's input box (state ranges of its inputs) and the fault names the
    guard raises on an input outside the box and on a non-finite output."""
    inputs = {name: (float(spec.state_var(name).lo), float(spec.state_var(name).hi))
              for name in (spec.model.inputs if spec.model else ())}
    return Guard(inputs, _fault_of_kind(spec, "input-box"), _fault_of_kind(spec, "non-finite"))


def relies_on_network(spec: Spec, mode: Mode) -> bool:
    """Whether ``mode`` reads an output of the spec's decision network that neither it nor the spec defines:
    the network then acts in that mode."""
    if spec.model is None:
        return False
    defined = set(spec.define) | set(mode.define)
    return any(o not in defined for o in spec.model.outputs)


def _fault_of_kind(spec: Spec, kind: str) -> str | None:
    return next((f.name for f in spec.faults if f.kind == kind), None)


def digest_of(data: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of ``data`` without its ``digest`` field."""
    body = {k: v for k, v in data.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --- writing ---------------------------------------------------------------------------------------------------

def _floats(values: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()}


def _counterexample_dict(c: Counterexample) -> dict[str, Any]:
    return {"mode": c.mode, "state": _floats(c.state), "parameters": _floats(c.parameters), "check": c.check,
            "violated": list(c.violated)}


def _optimum_dict(o: Optimum) -> dict[str, Any]:
    return {"parameter": o.parameter, "objective": o.objective, "value": float(o.value),
            "bound": None if o.bound is None else float(o.bound), "exact": o.exact, "width": float(o.width),
            "monotone": o.monotone, "probes": o.probes}


def _entry_dict(e: Entry) -> dict[str, Any]:
    data = {"scenario": e.scenario, "faults": list(e.faults), "mode": e.mode, "parameters": _floats(e.parameters),
            "verdict": e.verdict, "seconds": float(e.seconds), "candidates_rejected": e.candidates_rejected,
            "counterexamples": [_counterexample_dict(c) for c in e.counterexamples], "reason": e.reason,
            "optimum": [_optimum_dict(o) for o in e.optimum]}
    if e.network is not None:
        data["network"] = {"fallback": e.network.fallback,
                           "fallback_parameters": _floats(e.network.fallback_parameters),
                           "region": _region_dict(e.network.region)}
    return data


def _region_dict(region: TrustedRegion) -> dict[str, Any]:
    """The region as :meth:`TrustedRegion.to_json` writes it, its numbers as JSON floats (counts stay integers)."""
    data = region.to_json()
    data["parameters"] = _floats(data["parameters"])
    data["coverage"] = float(data["coverage"])
    for cell in data["cells"]:
        for key in ("lo", "hi", "margin"):
            cell[key] = [float(x) for x in cell[key]]
        cell["seconds"] = float(cell["seconds"])
        cex = cell["counterexample"]
        if cex is not None:
            cell["counterexample"] = {"state": _floats(cex["state"]), "outputs": _floats(cex["outputs"])}
    return data


def _failure_dict(m: ModeFailure) -> dict[str, Any]:
    return {"mode": m.mode, "verdict": m.verdict, "state": None if m.state is None else _floats(m.state),
            "parameters": _floats(m.parameters), "reason": m.reason}


def _unrealizable_dict(u: Unrealizable) -> dict[str, Any]:
    return {"scenario": u.scenario, "faults": list(u.faults), "state": None if u.state is None else _floats(u.state),
            "found_by": u.found_by, "per_mode": [_failure_dict(m) for m in u.per_mode], "seconds": float(u.seconds)}


def _policy_dict(p: Policy) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "spec": {"name": p.spec_name, "digest": p.spec_digest, "source": p.spec_source},
        "state": {k: {"lo": float(r.lo), "hi": float(r.hi), "unit": r.unit} for k, r in p.state.items()},
        "faults": [{"name": n, "kind": k} for n, k in p.faults],
        "modes": list(p.modes),
        "table": [_entry_dict(e) for e in p.table],
        "unrealizable": [_unrealizable_dict(u) for u in p.unrealizable],
        "guard": {"inputs": {k: [float(lo), float(hi)] for k, (lo, hi) in p.guard.inputs.items()},
                  "input_fault": p.guard.input_fault, "output_fault": p.guard.output_fault},
    }


# --- reading ---------------------------------------------------------------------------------------------------

class _Reader:
    """Reads JSON values with the path of each (``$.table[0].parameters.cap``) for the error messages."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> PolicyError:
        return PolicyError(f"{path}: {message}", location=f"{self.source} {path}".strip())

    def plain(self, value: Any, path: str) -> None:
        """Refuse, anywhere in a parsed document, what JSON data cannot be (a non-finite number, a key that is
        not a string, another Python object): the digest covers every field, read or not."""
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise self.fail(path, f"the key {k!r:.80} is not a string")
                self.plain(v, f"{path}.{k}")
        elif isinstance(value, list):
            for k, v in enumerate(value):
                self.plain(v, f"{path}[{k}]")
        elif isinstance(value, float) and not math.isfinite(value):
            raise self.fail(path, "numbers must be finite")
        elif value is not None and not isinstance(value, (str, int, float)):
            raise self.fail(path, f"expected JSON data, found {type(value).__name__}")

    def obj(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, found {_json_type(value)}")
        return value

    def known(self, data: Mapping[str, Any], path: str, fields: tuple[str, ...]) -> None:
        """Refuse a field the format does not have where a misspelt one would change what is guarded."""
        unknown = sorted(k for k in data if k not in fields)
        if unknown:
            raise self.fail(path, f"unknown fields {', '.join(unknown)} (the format has {', '.join(fields)})")

    def get(self, data: Mapping[str, Any], key: str, path: str, read: Callable[[Any, str], T]) -> T:
        if key not in data:
            raise self.fail(path, f"missing field {key!r}")
        return read(data[key], f"{path}.{key}")

    def opt(self, data: Mapping[str, Any], key: str, path: str, read: Callable[[Any, str], T], default: T) -> T:
        return read(data[key], f"{path}.{key}") if key in data else default

    def text(self, value: Any, path: str) -> str:
        """A string without NUL: names reach the C strings of a guarded library."""
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, found {_json_type(value)}")
        if "\0" in value:
            raise self.fail(path, f"{value!r:.80} contains a NUL character")
        return value

    def text_or_none(self, value: Any, path: str) -> str | None:
        return None if value is None else self.text(value, path)

    def name(self, value: Any, path: str, pattern: re.Pattern[str] | None = None) -> str:
        """A non-empty string of at most NAME_LIMIT characters, matching ``pattern`` whole when given."""
        text = self.text(value, path)
        if not 0 < len(text) <= NAME_LIMIT:
            raise self.fail(path, f"expected a name of 1 to {NAME_LIMIT} characters, found {len(text)}")
        if pattern is not None and not pattern.fullmatch(text):
            raise self.fail(path, f"{text!r:.80} is not a name (letters, digits and _, not starting with a digit)")
        return text

    def sha256(self, value: Any, path: str) -> str:
        text = self.text(value, path)
        if not SHA256_HEX.fullmatch(text):
            raise self.fail(path, f"{text!r:.80} is not a sha256 hex digest")
        return text

    def number(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected a number, found {_json_type(value)}")
        if not math.isfinite(value):
            raise self.fail(path, "numbers must be finite")
        return float(value)

    def seconds(self, value: Any, path: str) -> float:
        seconds = self.number(value, path)
        if seconds < 0:
            raise self.fail(path, f"expected a duration (a non-negative number), found {seconds!r}")
        return seconds

    def interval(self, lo: float, hi: float, path: str) -> tuple[float, float]:
        if lo > hi:
            raise self.fail(path, f"expected [lo, hi] with lo <= hi, found lo {lo!r} > hi {hi!r} (an empty range)")
        return lo, hi

    def box(self, value: Any, path: str) -> tuple[float, float]:
        bounds = self.items(value, path, self.number)
        if len(bounds) != 2:
            raise self.fail(path, f"expected a pair [lo, hi], found {len(bounds)} values")
        return self.interval(bounds[0], bounds[1], path)

    def count(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(path, f"expected a count (a non-negative integer), found {_json_type(value)}")
        return value

    def flag(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, found {_json_type(value)}")
        return value

    def items(self, value: Any, path: str, read: Callable[[Any, str], T]) -> list[T]:
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, found {_json_type(value)}")
        return [read(v, f"{path}[{k}]") for k, v in enumerate(value)]

    def named(self, value: Any, path: str, read: Callable[[Any, str], T]) -> dict[str, T]:
        """An object whose keys are names (state variables, guarded inputs)."""
        return {self.name(k, f"{path}.{k}"): read(v, f"{path}.{k}") for k, v in self.obj(value, path).items()}

    def names(self, value: Any, path: str) -> tuple[str, ...]:
        return tuple(self.items(value, path, self.text))

    def values(self, value: Any, path: str) -> dict[str, float]:
        return {k: self.number(v, f"{path}.{k}") for k, v in self.obj(value, path).items()}

    def values_or_none(self, value: Any, path: str) -> dict[str, float] | None:
        return None if value is None else self.values(value, path)

    def choice(self, allowed: tuple[str, ...]) -> Callable[[Any, str], str]:
        def read(value: Any, path: str) -> str:
            text = self.text(value, path)
            if text not in allowed:
                raise self.fail(path, f"{text!r:.80} is not one of {', '.join(allowed)}")
            return text
        return read


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "true/false", str: "a string", dict: "an object", list: "a list", int: "a number",
             float: "a number"}
    return names.get(type(value), type(value).__name__)


def from_json(text: str | bytes | Mapping[str, Any], *, source: str = "", check_digest: bool = True) -> Policy:
    """Read a ``cuvil-failsafe-policy/1`` document (UTF-8 text or parsed), checking every field's type, the
    consistency of the whole (faults, modes and scenarios each declared once and referred to by name, every
    row's label that of its faults, the guard's faults of the right kind) and, last, the digest; a
    :class:`PolicyError` names the JSON path at fault."""
    r = _Reader(source)
    data = r.obj(_parse(text, r) if isinstance(text, (str, bytes)) else _copy(text), "$")
    r.plain(data, "$")
    fmt = r.get(data, "format", "$", r.text)
    if fmt != FORMAT:
        raise r.fail("$.format", f"{fmt!r:.80} is not a policy format this version reads ({FORMAT})")
    r.known(data, "$", TOP_LEVEL)
    policy = _read_policy(r, data)
    return replace(policy, digest=_read_digest(r, data)) if check_digest else policy


def _copy(doc: Any) -> Any:
    """A parsed document's top level as the dict JSON parses to, whatever mapping type it was given in."""
    return dict(doc) if isinstance(doc, Mapping) else doc


def _read_digest(r: _Reader, data: Mapping[str, Any]) -> str:
    """The stated digest, once it matches the content (checked last: a malformed field is named first)."""
    stated = r.get(data, "digest", "$", r.sha256)
    if stated != digest_of(data):
        raise r.fail("$.digest", "does not match the content: the file was changed after it was written (re-check "
                                 "an edited policy with check_policy, reading it with check_digest=False)")
    return stated


def _parse(text: str | bytes, r: _Reader) -> Any:
    """Strict JSON in UTF-8: no NaN or Infinity, no key given twice in one object."""
    def refuse(name: str) -> Any:
        raise r.fail("$", f"{name} is not a JSON number")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise r.fail("$", f"the key {twice[0]!r} is given twice in one object")
        return dict(items)

    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text, parse_constant=refuse,
                          object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise r.fail("$", f"not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise r.fail("$", f"not UTF-8 text: {e.reason}") from None
    except RecursionError:
        raise r.fail("$", "not JSON this reader takes: nested too deeply") from None


def _read_policy(r: _Reader, data: dict[str, Any]) -> Policy:
    name, spec_digest, spec_source = r.get(data, "spec", "$", lambda v, p: _read_spec(r, v, p))
    state = r.get(data, "state", "$", lambda v, p: r.named(v, p, lambda s, q: _read_range(r, s, q)))
    faults = r.get(data, "faults", "$", lambda v, p: _read_faults(r, v, p))
    modes = r.get(data, "modes", "$", lambda v, p: _read_modes(r, v, p))
    order = tuple(n for n, _ in faults)
    return Policy(
        spec_name=name, spec_digest=spec_digest, spec_source=spec_source, state=state, faults=faults, modes=modes,
        table=r.get(data, "table", "$", lambda v, p: _read_table(r, v, p, order, modes)),
        unrealizable=tuple(r.get(data, "unrealizable", "$",
                                 lambda v, p: r.items(v, p, lambda u, q: _read_unrealizable(r, u, q, order)))),
        guard=r.get(data, "guard", "$", lambda v, p: _read_guard(r, v, p, dict(faults))),
    )


def _read_spec(r: _Reader, value: Any, path: str) -> tuple[str, str, str]:
    """The spec's name, digest (empty for a spec not read from a file) and source."""
    d = r.obj(value, path)
    return (r.get(d, "name", path, r.name), r.get(d, "digest", path, lambda v, p: "" if v == "" else r.sha256(v, p)),
            r.get(d, "source", path, r.text))


def _read_range(r: _Reader, value: Any, path: str) -> StateRange:
    d = r.obj(value, path)
    lo, hi = r.interval(r.get(d, "lo", path, r.number), r.get(d, "hi", path, r.number), path)
    return StateRange(lo, hi, r.opt(d, "unit", path, r.text, ""))


def _read_fault(r: _Reader, value: Any, path: str) -> tuple[str, str]:
    d = r.obj(value, path)
    return r.get(d, "name", path, lambda v, p: r.name(v, p, FAULT_NAME)), r.get(d, "kind", path, r.choice(FAULT_KINDS))


def _read_faults(r: _Reader, value: Any, path: str) -> tuple[tuple[str, str], ...]:
    faults = r.items(value, path, lambda f, q: _read_fault(r, f, q))
    _declared_once(r, [n for n, _ in faults], path)
    return tuple(faults)


def _read_modes(r: _Reader, value: Any, path: str) -> tuple[str, ...]:
    modes = r.items(value, path, r.name)
    if not modes:
        raise r.fail(path, "expected at least one mode")
    _declared_once(r, modes, path)
    return tuple(modes)


def _declared_once(r: _Reader, names: list[str], path: str) -> None:
    seen: set[str] = set()
    for k, name in enumerate(names):
        if name in seen:
            raise r.fail(f"{path}[{k}]", f"{name!r} is declared twice")
        seen.add(name)


def _check_scenario(r: _Reader, label: str, faults: tuple[str, ...], path: str, order: tuple[str, ...]) -> None:
    """A scenario names declared faults, each once, and is labelled as :func:`scenario_label` labels them."""
    for k, fault in enumerate(faults):
        if fault not in order:
            raise r.fail(f"{path}.faults[{k}]", f"{fault!r:.80} is not one of the policy's faults")
        if fault in faults[:k]:
            raise r.fail(f"{path}.faults[{k}]", f"{fault!r} is given twice")
    want = scenario_label(frozenset(faults), order)
    if label != want:
        raise r.fail(f"{path}.scenario", f"{label!r:.80} is not the label of its faults ({want!r})")


def _read_table(r: _Reader, value: Any, path: str, order: tuple[str, ...], modes: tuple[str, ...]
                ) -> tuple[Entry, ...]:
    """The rows, each for a scenario of the policy's faults, one row per scenario, choosing one of its modes."""
    entries = r.items(value, path, lambda e, q: _read_entry(r, e, q))
    seen: set[str] = set()
    for k, e in enumerate(entries):
        row = f"{path}[{k}]"
        _check_scenario(r, e.scenario, e.faults, row, order)
        if e.scenario in seen:
            raise r.fail(f"{row}.scenario", f"{e.scenario!r} has two rows")
        seen.add(e.scenario)
        if e.mode is not None and e.mode not in modes:
            raise r.fail(f"{row}.mode", f"{e.mode!r:.80} is not one of the policy's modes")
        if e.network is not None:
            _check_network(r, e, e.network, f"{row}.network", modes)
    return tuple(entries)


def _check_network(r: _Reader, e: Entry, use: NetworkUse, path: str, modes: tuple[str, ...]) -> None:
    """The fallback is a later mode of the policy; the region is the entry's: same scenario, mode, parameters."""
    if e.mode is None:
        raise r.fail(path, "an entry without a mode has no network to use")
    if use.fallback is not None and (use.fallback not in modes or modes.index(use.fallback) <= modes.index(e.mode)):
        raise r.fail(f"{path}.fallback", f"{use.fallback!r:.80} is not a mode of the policy after {e.mode!r}")
    region = use.region
    for key, found, want in (("scenario", region.label, e.scenario), ("faults", region.faults, e.faults),
                             ("mode", region.mode, e.mode), ("parameters", dict(region.parameters), e.parameters)):
        if found != want:
            raise r.fail(f"{path}.region.{key}", f"{found!r:.80} is not the entry's {key} ({want!r:.80})")


def _read_network(r: _Reader, value: Any, path: str) -> NetworkUse:
    d = r.obj(value, path)
    r.known(d, path, NETWORK_FIELDS)
    return NetworkUse(r.get(d, "fallback", path, _or_none(r.name)), r.get(d, "fallback_parameters", path, r.values),
                      r.get(d, "region", path, lambda v, p: _read_region(r, v, p)))


def _read_region(r: _Reader, value: Any, path: str) -> TrustedRegion:
    """A trusted region as :meth:`TrustedRegion.to_json` writes it; its counts and coverage agree with its cells."""
    d = r.obj(value, path)
    r.known(d, path, REGION_FIELDS)
    fmt = r.get(d, "format", path, r.text)
    if fmt != REGION_FORMAT:
        raise r.fail(f"{path}.format", f"{fmt!r:.80} is not {REGION_FORMAT!r}")
    r.get(d, "margin", path, r.text)
    inputs = r.get(d, "inputs", path, lambda v, p: tuple(r.items(v, p, r.name)))
    region = TrustedRegion(
        inputs, r.get(d, "outputs", path, lambda v, p: tuple(r.items(v, p, r.name))),
        tuple(r.get(d, "cells", path, lambda v, p: r.items(v, p, lambda c, q: _read_cell(r, c, q, len(inputs))))),
        r.get(d, "faults", path, r.names), r.get(d, "scenario", path, r.text), r.get(d, "mode", path, r.text_or_none),
        r.get(d, "parameters", path, r.values))
    if r.get(d, "counts", path, lambda v, p: r.named(v, p, r.count)) != region.counts():
        raise r.fail(f"{path}.counts", f"do not count the cells' verdicts ({region.counts()})")
    if r.get(d, "coverage", path, r.number) != region.coverage():
        raise r.fail(f"{path}.coverage", f"is not the proved cells' share of the box ({region.coverage()!r})")
    return region


def _read_cell(r: _Reader, value: Any, path: str, dims: int) -> Cell:
    d = r.obj(value, path)
    r.known(d, path, CELL_FIELDS)

    def corner(v: Any, p: str) -> tuple[float, ...]:
        xs = r.items(v, p, r.number)
        if len(xs) != dims:
            raise r.fail(p, f"expected {dims} numbers (one per network input), found {len(xs)}")
        return tuple(xs)

    lo, hi = r.get(d, "lo", path, corner), r.get(d, "hi", path, corner)
    for k, (a, b) in enumerate(zip(lo, hi, strict=True)):
        r.interval(a, b, f"{path}.lo[{k}]")
    phases = r.get(d, "phases", path, lambda v, p: r.items(v, p, r.count))
    if len(phases) != 2:
        raise r.fail(f"{path}.phases", f"expected a pair [fixed, total], found {len(phases)} values")
    return Cell(lo, hi, r.get(d, "verdict", path, r.choice(VERDICTS)), r.get(d, "method", path, r.text),
                r.get(d, "depth", path, r.count), tuple(r.get(d, "margin", path, lambda v, p: r.items(v, p, r.number))),
                (phases[0], phases[1]), r.get(d, "counterexample", path, _or_none(lambda v, p: _read_replay(r, v, p))),
                r.get(d, "reason", path, r.text), r.get(d, "seconds", path, r.seconds))


def _read_replay(r: _Reader, value: Any, path: str) -> CellCounterexample:
    d = r.obj(value, path)
    r.known(d, path, ("state", "outputs"))
    return CellCounterexample(r.get(d, "state", path, r.values), r.get(d, "outputs", path, r.values))


def _read_guard(r: _Reader, value: Any, path: str, kinds: Mapping[str, str]) -> Guard:
    d = r.obj(value, path)
    r.known(d, path, GUARD_FIELDS)

    def fault(key: str) -> str | None:
        return r.get(d, key, path, lambda v, p: _guard_fault(r, v, p, GUARD_FAULT_KINDS[key], kinds))

    return Guard(r.get(d, "inputs", path, lambda v, p: r.named(v, p, r.box)), fault("input_fault"),
                 fault("output_fault"))


def _guard_fault(r: _Reader, value: Any, path: str, kind: str, kinds: Mapping[str, str]) -> str | None:
    """A fault the guard raises: none, or a fault of the policy of the kind it stands for."""
    name = r.text_or_none(value, path)
    if name is not None and kinds.get(name) != kind:
        found = f"its kind is {kinds[name]!r}" if name in kinds else "it is not declared"
        raise r.fail(path, f"{name!r:.80} is not a fault of kind {kind!r} in the policy's faults ({found})")
    return name


def _read_counterexample(r: _Reader, value: Any, path: str) -> Counterexample:
    d = r.obj(value, path)
    return Counterexample(r.get(d, "mode", path, r.text), r.get(d, "state", path, r.values),
                          r.opt(d, "parameters", path, r.values, {}),
                          r.opt(d, "check", path, r.choice(CHECKS), "numeric"), r.opt(d, "violated", path, r.names, ()))


def _read_optimum(r: _Reader, value: Any, path: str) -> Optimum:
    d = r.obj(value, path)
    return Optimum(r.get(d, "parameter", path, r.text), r.get(d, "objective", path, r.choice(("maximize", "minimize"))),
                   r.get(d, "value", path, r.number), r.get(d, "bound", path, _or_none(r.number)),
                   r.get(d, "exact", path, r.flag), r.get(d, "width", path, r.number),
                   r.get(d, "monotone", path, r.flag), r.get(d, "probes", path, r.count))


def _or_none(read: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    return lambda value, path: None if value is None else read(value, path)


def _read_entry(r: _Reader, value: Any, path: str) -> Entry:
    d = r.obj(value, path)
    verdict = r.get(d, "verdict", path, r.choice(ENTRY_VERDICTS))
    mode = r.get(d, "mode", path, r.text_or_none)
    if verdict == "proved" and mode is None:
        raise r.fail(f"{path}.mode", "a proved entry names its mode")
    return Entry(
        scenario=r.get(d, "scenario", path, r.text),
        faults=r.get(d, "faults", path, r.names),
        mode=mode,
        parameters=r.get(d, "parameters", path, r.values),
        verdict=verdict,
        seconds=r.opt(d, "seconds", path, r.seconds, 0.0),
        candidates_rejected=r.opt(d, "candidates_rejected", path, r.count, 0),
        counterexamples=tuple(r.opt(d, "counterexamples", path,
                                    lambda v, p: r.items(v, p, lambda c, q: _read_counterexample(r, c, q)), [])),
        reason=r.opt(d, "reason", path, r.text, ""),
        optimum=tuple(r.opt(d, "optimum", path, lambda v, p: r.items(v, p, lambda o, q: _read_optimum(r, o, q)), [])),
        network=r.opt(d, "network", path, _or_none(lambda v, p: _read_network(r, v, p)), None),
    )


def _read_failure(r: _Reader, value: Any, path: str) -> ModeFailure:
    d = r.obj(value, path)
    return ModeFailure(r.get(d, "mode", path, r.text), r.get(d, "verdict", path, r.text),
                       r.opt(d, "state", path, r.values_or_none, None), r.opt(d, "parameters", path, r.values, {}),
                       r.opt(d, "reason", path, r.text, ""))


def _read_unrealizable(r: _Reader, value: Any, path: str, order: tuple[str, ...]) -> Unrealizable:
    d = r.obj(value, path)
    claim = Unrealizable(
        scenario=r.get(d, "scenario", path, r.text),
        faults=r.get(d, "faults", path, r.names),
        state=r.opt(d, "state", path, r.values_or_none, None),
        per_mode=tuple(r.opt(d, "per_mode", path, lambda v, p: r.items(v, p, lambda m, q: _read_failure(r, m, q)),
                             [])),
        found_by=r.opt(d, "found_by", path, r.text_or_none, None),
        seconds=r.opt(d, "seconds", path, r.seconds, 0.0),
    )
    _check_scenario(r, claim.scenario, claim.faults, path, order)
    return claim


# --- re-checking -----------------------------------------------------------------------------------------------

def check_policy(spec: Spec, policy: Policy, *, rlimit: int | None = None,
                 network: DecisionNetwork | None = None) -> list[Verdict]:
    """Prove every claim of ``policy`` again under ``spec``: one verdict per scenario of the spec, then one
    error per entry that names no scenario of it (unknown faults, duplicates). An entry that uses the
    decision network has its fallback proved and its region's cells decided again on ``network`` (by
    default the spec's model, loaded when such an entry is met)."""
    # synth builds policies, so it imports this module; the prover is imported when a check runs
    from failsafe.synth import DEFAULT_RLIMIT, Prover

    prover = Prover(spec, rlimit=rlimit if rlimit is not None else DEFAULT_RLIMIT,
                    network=network if network is not None else _spec_network(spec))
    order = [f.name for f in spec.faults]
    claims: dict[frozenset[str], Entry | Unrealizable] = {}
    stray: list[Verdict] = []
    for claim in (*policy.table, *policy.unrealizable):
        key = frozenset(claim.faults)
        if key in claims or not key <= set(order):
            why = ("a second entry for this scenario" if key in claims
                   else f"names faults the spec does not have: {', '.join(sorted(key - set(order)))}")
            stray.append(Verdict(claim.scenario, claim.faults, _claim_kind(claim), _claim_mode(claim), "error", why))
            continue
        claims[key] = claim
    verdicts = []
    for faults in spec.scenarios():
        label, ordered = scenario_label(faults, order), tuple(f for f in order if f in faults)
        claim = claims.get(faults)
        if claim is None:
            verdicts.append(Verdict(label, ordered, "unknown", None, "error",
                                    "the policy has no entry for this scenario"))
        elif isinstance(claim, Entry):
            verdicts.append(_check_entry(prover, spec, faults, label, ordered, claim))
        else:
            verdicts.append(_check_unrealizable(prover, faults, label, ordered, claim))
    return verdicts + stray


def _spec_network(spec: Spec) -> Callable[[], DecisionNetwork] | None:
    """The spec's decision network, loaded on first use (None when the spec names none)."""
    from failsafe.network import load_decision_model

    model = spec.model
    return None if model is None else lambda: load_decision_model(model, spec)


def _claim_kind(claim: Entry | Unrealizable) -> str:
    if isinstance(claim, Unrealizable):
        return "unrealizable"
    return "mode" if claim.mode is not None and claim.verdict == "proved" else "unknown"


def _claim_mode(claim: Entry | Unrealizable) -> str | None:
    return claim.mode if isinstance(claim, Entry) else None


def _entry_error(spec: Spec, faults: frozenset[str], entry: Entry, prover: Prover) -> str:
    """Why the entry does not fit the spec ("" when it does): unknown or unavailable mode, wrong parameters."""
    assert entry.mode is not None
    if entry.mode not in {m.name for m in spec.modes}:
        return f"mode {entry.mode!r} is not a mode of the spec"
    mode = spec.mode(entry.mode)
    if not prover.available(faults, mode):
        return f"mode {entry.mode!r} is not available in this scenario (its requires is false)"
    names = {p.name for p in mode.parameters}
    if set(entry.parameters) != names:
        extra, missing = sorted(set(entry.parameters) - names), sorted(names - set(entry.parameters))
        parts = ([f"unknown parameter(s) {', '.join(extra)}"] if extra else []) + (
            [f"missing parameter(s) {', '.join(missing)}"] if missing else [])
        return f"mode {entry.mode!r}: " + "; ".join(parts)
    for p in mode.parameters:
        v = entry.parameters[p.name]
        if not (math.isfinite(v) and float(p.lo) <= v <= float(p.hi)):
            return f"parameter {p.name} = {v!r} is outside its range [{p.lo}, {p.hi}]"
    return ""


def _check_entry(prover: Prover, spec: Spec, faults: frozenset[str], label: str, ordered: tuple[str, ...],
                 entry: Entry) -> Verdict:
    if entry.mode is None or entry.verdict != "proved":
        return Verdict(label, ordered, "unknown", entry.mode, "unknown",
                       f"the policy leaves this scenario undecided: {entry.reason or 'no reason given'}")
    error = _entry_error(spec, faults, entry, prover)
    if error:
        return Verdict(label, ordered, "mode", entry.mode, "error", error)
    if entry.network is not None:
        return _check_simplex(prover, spec, faults, label, ordered, entry, entry.network)
    proof = prover.prove(faults, spec.mode(entry.mode), entry.parameters)
    status = "refuted" if proof.status == "vacuous" else proof.status
    return Verdict(label, ordered, "mode", entry.mode, status, proof.reason, proof.counterexample, proof.seconds)


def _check_unrealizable(prover: Prover, faults: frozenset[str], label: str, ordered: tuple[str, ...],
                        claim: Unrealizable) -> Verdict:
    outcome = prover.scenario(faults)
    if outcome.chosen is not None:
        params = ", ".join(f"{k} = {v!r}" for k, v in outcome.chosen.parameters.items())
        return Verdict(label, ordered, "unrealizable", None, "refuted",
                       f"mode {outcome.chosen.mode} is safe" + (f" with {params}" if params else ""),
                       seconds=outcome.seconds)
    if outcome.undecided:
        why = "; ".join([f"{m.mode}: {m.reason}" for m in outcome.modes if m.status == "unknown"]
                        + ([outcome.reason] if outcome.reason else []))
        return Verdict(label, ordered, "unrealizable", None, "unknown", why, seconds=outcome.seconds)
    if claim.state is not None:
        why = prover.defeats(faults, claim.state)
        if why:
            return Verdict(label, ordered, "unrealizable", None, "refuted", f"the policy's state: {why}",
                           seconds=outcome.seconds)
    return Verdict(label, ordered, "unrealizable", None, "proved", "no available mode has safe parameters",
                   seconds=outcome.seconds)


def _check_simplex(prover: Prover, spec: Spec, faults: frozenset[str], label: str, ordered: tuple[str, ...],
                   entry: Entry, use: NetworkUse) -> Verdict:
    """The network's cells decided again (proved cells must prove, and without a fallback every other cell
    must be empty and the cells must tile the box), then the fallback proved."""
    assert entry.mode is not None
    verdict = partial(Verdict, label, ordered, "mode", entry.mode)
    error = _network_error(spec, faults, entry, use, prover)
    if error:
        return verdict("error", error)
    cells = prover.recheck(use.region, ("proved", "empty") if use.fallback is None else ("proved",))
    for old, new in cells:
        if new.verdict != old.verdict:
            cex = new.counterexample
            found = None if cex is None else Counterexample(entry.mode, dict(cex.state), dict(entry.parameters),
                                                            "numeric", tuple(_violated(spec, cex)))
            return verdict("refuted" if new.verdict == "refuted" else "unknown",
                           f"the {old.verdict} cell {list(old.lo)}..{list(old.hi)} is {new.verdict} when decided "
                           f"again{': ' + new.reason if new.reason else ''}", found, sum(c.seconds for _, c in cells))
    seconds = sum(c.seconds for _, c in cells)
    if use.fallback is None:
        if not _tiles(use.region, [spec.state_var(n) for n in use.region.inputs]):
            return verdict("refuted", "there is no fallback and the region's cells do not cover the state box",
                           seconds=seconds)
        return verdict("proved", f"the network is proved on every cell ({len(cells)})", seconds=seconds)
    proof = prover.prove(faults, spec.mode(use.fallback), use.fallback_parameters)
    status = "refuted" if proof.status == "vacuous" else proof.status
    reason = f"{len(cells)} proved cells decided again; fallback {use.fallback}: {proof.status}" + (
        f" ({proof.reason})" if proof.reason else "")
    return verdict(status, reason, proof.counterexample, seconds + proof.seconds)


def _network_error(spec: Spec, faults: frozenset[str], entry: Entry, use: NetworkUse, prover: Prover) -> str:
    """Why the entry's use of the network does not fit the spec ("" when it does)."""
    assert entry.mode is not None
    if spec.model is None or not relies_on_network(spec, spec.mode(entry.mode)):
        return f"mode {entry.mode!r} does not rely on a decision network of the spec"
    if (use.region.inputs, use.region.outputs) != (spec.model.inputs, spec.model.outputs):
        return (f"the region's inputs {list(use.region.inputs)} and outputs {list(use.region.outputs)} are not the "
                f"model's ({list(spec.model.inputs)}, {list(spec.model.outputs)})")
    if use.fallback is None:
        return ""
    names = [m.name for m in spec.modes]
    if use.fallback not in names or names.index(use.fallback) <= names.index(entry.mode):
        return f"fallback {use.fallback!r} is not a mode of the spec after {entry.mode!r}"
    if relies_on_network(spec, spec.mode(use.fallback)):
        return f"fallback {use.fallback!r} relies on the decision network itself"
    fallback = replace(entry, mode=use.fallback, parameters=use.fallback_parameters, network=None)
    error = _entry_error(spec, faults, fallback, prover)
    return f"fallback: {error}" if error else ""


def _violated(spec: Spec, cex: CellCounterexample) -> list[str]:
    """The invariants a replayed state breaks, by name (those reading definitions are not re-evaluated here)."""
    env: dict[str, Any] = {**spec.constants, **cex.state, **cex.outputs}
    return [i.name for i in spec.invariants if i.expr.names <= env.keys() and not bool(i.expr.evaluate(env))]


def _tiles(region: TrustedRegion, box: Sequence[Any]) -> bool:
    """Whether the cells cover the box of the inputs: inside it, no two overlapping, their exact volumes
    adding up to the box's (closed cells of full measure cover the closed box)."""
    if not region.cells:
        return False
    lo = np.array([c.lo for c in region.cells], dtype=np.float64)
    hi = np.array([c.hi for c in region.cells], dtype=np.float64)
    if np.any(lo < [v.lo for v in box]) or np.any(hi > [v.hi for v in box]):
        return False
    for k in range(len(lo)):
        overlap = np.all(np.minimum(hi[k], hi[k + 1:]) > np.maximum(lo[k], lo[k + 1:]), axis=1)
        if overlap.any():
            return False
    volume = sum((math.prod(Fraction(b) - Fraction(a) for a, b in zip(c.lo, c.hi, strict=True))
                  for c in region.cells), Fraction(0))
    return volume == math.prod(Fraction(float(v.hi)) - Fraction(float(v.lo)) for v in box)
