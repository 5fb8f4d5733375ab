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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from cuvil.errors import CuvilError
from failsafe.spec import FAULT_KINDS, Spec, scenario_label

if TYPE_CHECKING:
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
class Entry:
    """A scenario's row of the table: the mode chosen (None when undecided) and its proved parameters."""

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
    return {"scenario": e.scenario, "faults": list(e.faults), "mode": e.mode, "parameters": _floats(e.parameters),
            "verdict": e.verdict, "seconds": float(e.seconds), "candidates_rejected": e.candidates_rejected,
            "counterexamples": [_counterexample_dict(c) for c in e.counterexamples], "reason": e.reason,
            "optimum": [_optimum_dict(o) for o in e.optimum]}


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
    return tuple(entries)


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

def check_policy(spec: Spec, policy: Policy, *, rlimit: int | None = None) -> list[Verdict]:
    """Prove every claim of ``policy`` again under ``spec``: one verdict per scenario of the spec, then one
    error per entry that names no scenario of it (unknown faults, duplicates)."""
    # synth builds policies, so it imports this module; the prover is imported when a check runs
    from failsafe.synth import DEFAULT_RLIMIT, Prover

    prover = Prover(spec, rlimit=rlimit if rlimit is not None else DEFAULT_RLIMIT)
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
