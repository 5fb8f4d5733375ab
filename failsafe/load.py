"""Reading a fail-safe spec from YAML into a checked :class:`failsafe.spec.Spec`.

The file is composed into YAML nodes (never constructed into Python objects from tags, so no
tag can run code), bounded in size, nesting and node count (aliases expanded), converted with
the position of every node kept, validated against ``spec.schema.json`` and then checked for
what a schema cannot say: names unique across sections, ranges, and every expression parsed
with the names in scope and the kind its place needs. Every problem the user can cause is a
:class:`SpecError` located at ``file:line:column`` of the YAML node at fault (inside an
expression, the column of the part refused).

Scalars are read as YAML 1.2 core scalars: ``yes``/``no``/``on``/``off`` are text, ``1e3`` is a
number. Anchors, aliases and merge keys (``<<: *base``) work; other tags are refused.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import keyword
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, cast

import jsonschema
import yaml
from yaml.composer import ComposerError
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cuvil.errors import CuvilError
from failsafe.expr import Expr, ExprError, parse_expr
from failsafe.spec import DecisionModel, Fault, Invariant, Mode, Parameter, Spec, StateVar

MAX_BYTES = 1 << 20  # 1 MB: a spec is a page of text; more is a mistake or an attack
MAX_NODES = 10_000  # YAML nodes once aliases are expanded (an alias bomb expands exponentially)
MAX_DEPTH = 64  # YAML nesting, aliases expanded

YamlPath = tuple[str | int, ...]

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL, _MERGE = (_TAG + t for t in ("str", "int", "float", "bool", "null", "merge"))
_SEQ, _MAP = _TAG + "seq", _TAG + "map"
_CORE_SCALARS = (  # YAML 1.2 core schema, in resolution order
    (_NULL, re.compile(r"~|null|Null|NULL|")),
    (_BOOL, re.compile(r"true|True|TRUE|false|False|FALSE")),
    (_INT, re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")),
    (_FLOAT, re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")),
    (_MERGE, re.compile(r"<<")),
)
_RESERVED = frozenset(keyword.kwlist) | {"true", "false", "min", "max", "abs"}
_NAME_RULE = "(ASCII letters, digits and _, not starting with a digit)"
_TYPE_WORDS = {"string": "text", "number": "a number", "integer": "an integer", "boolean": "true/false",
               "object": "a mapping", "array": "a list", "null": "null"}


class SpecError(CuvilError):
    """A spec file that cannot be read as a fail-safe spec (YAML, schema, names, ranges, expressions)."""

    code = "CUVIL-FAILSAFE-SPEC"
    default_hint = "failsafe/spec.schema.json documents every key; failsafe/examples/ has complete specs"


def load_spec(spec: str | os.PathLike[str] | bytes, *, source: str | None = None) -> Spec:
    """Read and check a spec: ``spec`` is a path (a ``Path``, or a one-line string that names a file,
    ends in .yaml/.yml/.json or has no ``:``), YAML text, or the file's bytes. ``source`` names text
    in locations."""
    raw, label, origin = _read(spec, source)
    doc = _parse(_decode(raw, label), label)
    error = _schema_error(doc)
    if error is not None:
        raise error
    return _Builder(doc).spec(origin, hashlib.sha256(raw).hexdigest())


def spec_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) a spec's YAML is validated against (a fresh copy)."""
    text = resources.files("failsafe").joinpath("spec.schema.json").read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


# ---- reading the bytes ----------------------------------------------------------------------

def _read(spec: str | os.PathLike[str] | bytes, source: str | None) -> tuple[bytes, str, str]:
    """The file's bytes, the label locations use, and the source the Spec records."""
    if isinstance(spec, bytes):
        raw, label, origin = spec, source or "<spec>", source or ""
    elif isinstance(spec, str) and not _names_a_file(spec):
        raw, label, origin = spec.encode("utf-8", "surrogatepass"), source or "<spec>", source or ""
    else:
        path = Path(spec)
        label = origin = source or str(path)
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError as e:
            raise SpecError(f"cannot read the spec: {e.strerror or e}", location=label,
                            hint="check the path and its permissions") from None
    if len(raw) > MAX_BYTES:
        raise SpecError(f"the spec is larger than {MAX_BYTES:,} bytes", location=f"{label}:1:1",
                        hint="a spec is a page of YAML; split generated content out of it")
    return raw, label, origin


def _names_a_file(text: str) -> bool:
    """A one-line string is a path unless it reads as a YAML mapping (a spec needs a ``:``)."""
    if "\n" in text or "\0" in text or not text.strip() or len(text) > 4096:
        return False
    if text.endswith((".yaml", ".yml", ".json")) or ":" not in text:
        return True
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def _decode(raw: bytes, label: str) -> str:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = raw.rfind(b"\n", 0, e.start) + 1
        line = raw.count(b"\n", 0, e.start) + 1
        column = len(raw[start:e.start].decode("utf-8", "replace")) + 1
        raise SpecError(f"the spec is not UTF-8 text (byte 0x{raw[e.start]:02x})",
                        location=f"{label}:{line}:{column}", hint="save the file as UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ---- YAML nodes with their positions ----------------------------------------------------------

class _LimitError(ComposerError):
    """A document over the node or nesting limit (valid YAML, refused for its size)."""


class _Loader(yaml.SafeLoader):
    """Composes nodes only (no tag constructs anything), with YAML 1.2 core scalars, refusing
    too many or too deeply nested nodes while it reads so a hostile file costs little."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.composed = 0
        self.depth = 0

    def resolve(self, kind: type[Node], value: Any, implicit: Any) -> str:
        if kind is ScalarNode:
            if implicit[0]:
                return next((tag for tag, pattern in _CORE_SCALARS if pattern.fullmatch(value)), _STR)
            return _STR
        return super().resolve(kind, value, implicit)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.composed += 1
        self.depth += 1
        try:
            if self.composed > MAX_NODES:
                raise _LimitError(None, None, f"the spec has more than {MAX_NODES:,} YAML nodes",
                                    self.peek_event().start_mark)
            if self.depth > MAX_DEPTH:
                raise _LimitError(None, None, f"the spec nests deeper than {MAX_DEPTH} levels",
                                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


@dataclass
class _Document:
    """The converted YAML with the node at each path (values) and the key node of each mapping entry."""

    label: str
    text: str
    data: Any = None
    nodes: dict[YamlPath, Node] = field(default_factory=dict)
    keys: dict[YamlPath, Node] = field(default_factory=dict)

    def mark(self, path: YamlPath, *, key: bool = False) -> Mark:
        """The start of the node at ``path`` (its key with ``key``), or of its nearest ancestor."""
        if key and path in self.keys:
            return self.keys[path].start_mark
        while path not in self.nodes:
            path = path[:-1]
        return self.nodes[path].start_mark

    def where(self, path: YamlPath, *, key: bool = False) -> str:
        mark = self.mark(path, key=key)
        return _location(self.label, mark.line, mark.column)

    def error(self, path: YamlPath, message: str, *, key: bool = False, hint: str | None = None) -> SpecError:
        return SpecError(message, location=self.where(path, key=key), hint=hint)

    def node_error(self, node: Node, message: str, hint: str | None = None) -> SpecError:
        return SpecError(message, location=_location(self.label, node.start_mark.line, node.start_mark.column),
                         hint=hint)

    def get(self, path: YamlPath) -> Any:
        value = self.data
        for part in path:
            value = value[part]
        return value

    def line(self, path: YamlPath, *, key: bool = False) -> int:
        return self.mark(path, key=key).line + 1


def _location(label: str, line: int, column: int) -> str:
    """``label:line:column``, 1-based, from YAML's 0-based line and column."""
    return f"{label}:{line + 1}:{column + 1}"


def _parse(text: str, label: str) -> _Document:
    doc = _Document(label, text)
    root = _compose(text, label)
    if root is None:
        raise SpecError("the spec is empty", location=f"{label}:1:1",
                        hint="a spec is a YAML mapping with name, state, modes and invariants")
    _check_expanded(doc, root)
    doc.data = _convert(doc, root, ())
    return doc


def _compose(text: str, label: str) -> Node | None:
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        return loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = _location(label, mark.line, mark.column) if mark else f"{label}:1:1"
        problem = ", ".join(p for p in (e.context, e.problem) if p)
        raise SpecError(problem if isinstance(e, _LimitError) else f"not valid YAML: {problem}",
                        location=where) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position)
        column = e.position - (text.rfind("\n", 0, e.position) + 1)
        raise SpecError(f"not valid YAML: character U+{e.character:04X} is not allowed",
                        location=_location(label, line, column)) from None
    except yaml.YAMLError as e:
        raise SpecError(f"not valid YAML: {e}", location=f"{label}:1:1") from None
    finally:
        if loader is not None:
            loader.dispose()


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expanded(doc: _Document, root: Node) -> None:
    """Refuse a document whose aliases expand past the node or depth limit (a cycle never ends)."""
    stack: list[tuple[Node, int]] = [(root, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise doc.node_error(node, f"the spec has more than {MAX_NODES:,} YAML nodes once aliases are expanded",
                                 hint="an alias that repeats an alias multiplies nodes; write the values out")
        if depth > MAX_DEPTH:
            raise doc.node_error(node, f"the spec nests deeper than {MAX_DEPTH} levels once aliases are expanded")
        stack.extend((child, depth + 1) for child in reversed(_children(node)))


def _convert(doc: _Document, node: Node, path: YamlPath) -> Any:
    """The node as plain data (dict, list, str, int, float, bool, None), recording every node's path."""
    doc.nodes[path] = node
    if isinstance(node, ScalarNode):
        return _scalar(doc, node)
    if isinstance(node, SequenceNode):
        if node.tag != _SEQ:
            raise _tag_error(doc, node)
        return [_convert(doc, item, (*path, i)) for i, item in enumerate(node.value)]
    if node.tag != _MAP:
        raise _tag_error(doc, node)
    out: dict[str, Any] = {}
    explicit: dict[str, Node] = {}
    for key_node, value_node, own in _entries(doc, cast(MappingNode, node)):
        key = _key(doc, key_node)
        if own and key in explicit:
            first = explicit[key].start_mark.line + 1
            raise doc.node_error(key_node, f"{key!r} is given twice in {_dotted(path)} (first on line {first})")
        if own:
            explicit[key] = key_node
        doc.keys[(*path, key)] = key_node
        out[key] = _convert(doc, value_node, (*path, key))
    return out


def _tag_error(doc: _Document, node: Node) -> SpecError:
    tag = str(node.tag)
    shown = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
    return doc.node_error(node, f"the tag {shown} is not allowed in a spec (nothing in a spec is constructed "
                          "from a tag)", hint="the only tags allowed are !!str, !!int, !!float, !!bool, !!null, "
                          "!!seq and !!map")


def _entries(doc: _Document, node: MappingNode) -> list[tuple[Node, Node, bool]]:
    """(key, value, own) of a mapping: merged entries (``<<: *base``, earlier sources winning) first."""
    merged: list[tuple[Node, Node, bool]] = []
    own: list[tuple[Node, Node, bool]] = []
    for key_node, value_node in node.value:
        if not (isinstance(key_node, ScalarNode) and key_node.tag == _MERGE):
            own.append((key_node, value_node, True))
            continue
        sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        for source in reversed(sources):
            if not isinstance(source, MappingNode):
                raise doc.node_error(source, "a merge (<<) takes a mapping or a list of mappings")
            merged += [(k, v, False) for k, v, _ in _entries(doc, source)]
    return merged + own


def _key(doc: _Document, node: Node) -> str:
    if isinstance(node, ScalarNode) and node.tag == _STR:
        return node.value
    message = f"the key {node.value!r} is not a name" if isinstance(node, ScalarNode) else \
        "a list or mapping cannot be a key here"
    raise doc.node_error(node, message, hint="keys are names; quote a key YAML reads as a number, true/false or null")


def _scalar(doc: _Document, node: ScalarNode) -> Any:
    tag, text = node.tag, node.value
    if tag in (_STR, _MERGE):
        return text
    readers = {_NULL: _null, _BOOL: _bool, _INT: _int, _FLOAT: _float}
    if tag not in readers:
        raise _tag_error(doc, node)
    try:
        return readers[tag](text)
    except ValueError:
        raise doc.node_error(node, f"{_short(text)!r} is not a valid {tag.removeprefix(_TAG)}") from None


def _null(text: str) -> None:
    if not _CORE_SCALARS[0][1].fullmatch(text):
        raise ValueError(text)


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


def _int(text: str) -> int:
    if text.startswith(("0x", "0o")):
        return int(text, 16 if text[1] == "x" else 8)
    return int(text, 10)


def _float(text: str) -> float:
    special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    return special[text.lower()] if text.lower() in special else float(text)


# ---- schema ------------------------------------------------------------------------------------

@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(spec_schema())


def _schema_error(doc: _Document) -> SpecError | None:
    """The schema error to report: unknown keys and wrong values before missing keys, then the
    first in the file (fixing from the top is the natural order)."""
    found = []
    for i, error in enumerate(_validator().iter_errors(doc.data)):
        path, key, message = _explain(doc, error)
        found.append(((error.validator == "required", *_position(doc, path, key), i), path, key, message))
    if not found:
        return None
    _, path, key, message = min(found, key=lambda f: f[0])
    return doc.error(path, message, key=key)


def _explain(doc: _Document, error: jsonschema.ValidationError) -> tuple[YamlPath, bool, str]:
    """Where a schema error points (a path, and whether at its key) and what to tell the user."""
    path: YamlPath = tuple(error.absolute_path)
    where = _dotted(path)
    value: Any = error.instance  # the stubs' types include jsonschema's internal "unset" marker
    rule: Any = error.validator_value
    if "propertyNames" in error.schema_path:
        return (*path, value), True, f"{value!r} in {where} is not a name {_NAME_RULE}"
    if error.validator == "additionalProperties":
        allowed = sorted(cast(dict[str, Any], error.schema).get("properties", {}))
        unknown = min((k for k in value if k not in allowed), key=lambda k: _position(doc, (*path, k)))
        close = difflib.get_close_matches(unknown, allowed, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(allowed)})"
        return (*path, unknown), True, f"unknown key {unknown!r} in {where}{guess}"
    if error.validator == "required":
        missing = next(k for k in rule if k not in value)
        return path, False, f"{where} is missing {missing!r}"
    return path, False, _rule_message(str(error.validator), where, value, rule) or f"{where}: {_short(error.message)}"


def _rule_message(rule_name: str, where: str, value: Any, rule: Any) -> str | None:
    """A plain-words message for the schema rules a spec uses (None: jsonschema's own message)."""
    if rule_name == "type":
        expected = [_TYPE_WORDS[t] for t in ([rule] if isinstance(rule, str) else rule)]
        words = expected[0] if len(expected) == 1 else ", ".join(expected[:-1]) + " or " + expected[-1]
        return f"{where} must be {words}, not {_describe(value)}"
    if rule_name == "enum":
        allowed = ", ".join("null" if a is None else str(a) for a in rule)
        return f"{where} is {_describe(value)}; allowed: {allowed}"
    if rule_name in ("minItems", "maxItems"):
        bound = "at least" if rule_name == "minItems" else "at most"
        return f"{where} has {len(value)} item{'s' * (len(value) != 1)}; it takes {bound} {rule}"
    if rule_name == "minProperties":
        return f"{where} is empty; it needs at least {rule} entr{'y' if rule == 1 else 'ies'}"
    if rule_name == "pattern":
        return f"{where} is {value!r}, not a name {_NAME_RULE}"
    if rule_name == "minLength":
        return f"{where} is empty text"
    if rule_name == "maxLength":
        return f"{where} is {len(value):,} characters long; at most {rule:,} are allowed"
    return None


def _position(doc: _Document, path: YamlPath, key: bool = True) -> tuple[int, int]:
    mark = doc.mark(path, key=key)
    return mark.line, mark.column


def _describe(value: Any) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {_short(repr(value))}"
    if isinstance(value, str):
        return f"the text {_short(value)!r}"
    return "a list" if isinstance(value, list) else "a mapping"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _dotted(path: YamlPath) -> str:
    """``modes[0].assume[1]``: the YAML path as a reader would write it."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the spec"


# ---- semantic checks and the Spec -----------------------------------------------------------------

@dataclass(frozen=True)
class _Name:
    """A name entering the expression namespace, with what declares it and where."""

    name: str
    what: str
    path: YamlPath
    key: bool = True


@dataclass(frozen=True)
class _ModeScope:
    """A mode and the names its expressions may read (shared ones, its parameters and definitions)."""

    mode: Mode
    names: frozenset[str]


class _Builder:
    """Builds the Spec from validated data, checking names, ranges and expressions as it goes."""

    def __init__(self, doc: _Document) -> None:
        self.doc = doc
        self.data: dict[str, Any] = doc.data

    def spec(self, source: str, digest: str) -> Spec:
        shared = self._check_names(self._global_names())
        self._unique_modes()
        state = tuple(StateVar(n, *self._range(("state", n, "range")), unit=v.get("unit", ""))
                      for n, v in self.data["state"].items())
        constants = {n: self._constant(n) for n in self.data.get("constants", {})}
        scope = dict.fromkeys([*self.data["state"], *constants], "real")
        define = self._definitions(("define",), self.data.get("define", {}), scope)
        faults = self._faults(scope)
        outputs = self.data.get("model", {}).get("outputs", [])
        modes = [self._mode(i, shared, scope) for i in range(len(self.data["modes"]))]
        invariants = self._invariants(modes, outputs)
        return Spec(name=self.data["name"], state=state, faults=faults, modes=tuple(m.mode for m in modes),
                    invariants=invariants, constants=constants, define=define, model=self._model(),
                    source=source, digest=digest)

    # names

    def _global_names(self) -> list[_Name]:
        sections = (("state", "state variable"), ("constants", "constant"), ("define", "definition"),
                    ("faults", "fault"))
        names = [_Name(n, what, (section, n)) for section, what in sections for n in self.data.get(section, {})]
        outputs = self.data.get("model", {}).get("outputs", [])
        return names + [_Name(n, "model output", ("model", "outputs", i), key=False) for i, n in enumerate(outputs)]

    def _check_names(self, names: list[_Name], shared: Mapping[str, _Name] | None = None) -> dict[str, _Name]:
        """Every name is usable in expressions and declared once across ``names`` and ``shared``
        (a collision is reported at whichever of the two comes later in the file)."""
        seen = dict(shared or {})
        where = lambda e: _position(self.doc, e.path, e.key)
        for entry in sorted(names, key=where):
            if entry.name in _RESERVED:
                raise self.doc.error(entry.path, f"{entry.name!r} ({entry.what}) is a reserved word in expressions",
                                     key=entry.key, hint="choose another name")
            first = seen.setdefault(entry.name, entry)
            if first is not entry:
                first, later = sorted((first, entry), key=where)
                line = self.doc.line(first.path, key=first.key)
                raise self.doc.error(later.path, f"{later.name!r} is both a {first.what} (line {line}) and a "
                                     f"{later.what}", key=later.key, hint="names share one namespace; rename one")
        return seen

    # numbers

    def _range(self, path: YamlPath) -> tuple[float, float]:
        lo, hi = self.doc.get(path)
        for i, value in enumerate((lo, hi)):
            if not _finite(value):
                shown = _short(repr(value))
                raise self.doc.error((*path, i), f"{_dotted((*path, i))} is {shown}; a range takes finite numbers")
        flo, fhi = float(lo), float(hi)
        if not flo < fhi:
            raise self.doc.error(path, f"{_dotted(path)} is [{lo}, {hi}]; a range needs lo < hi")
        return flo, fhi

    def _constant(self, name: str) -> float:
        value = self.data["constants"][name]
        if not _finite(value):
            shown = _short(repr(value))
            raise self.doc.error(("constants", name), f"constant {name!r} is {shown}; constants are finite numbers")
        return float(value)

    # expressions

    def _expr(self, path: YamlPath, scope: Mapping[str, str], expect: str) -> Expr:
        where = _dotted(path)
        try:
            expr = parse_expr(self.doc.get(path), scope, where=self.doc.where(path), expect=expect)
        except ExprError as e:
            raise SpecError(f"{where}: {e.message}", location=self._expr_location(path, e.column),
                            hint=e.hint) from None
        return expr

    def _expr_location(self, path: YamlPath, column: int | None) -> str:
        """The position of ``column`` (1-based, in the stripped expression) in the file, when the
        expression sits on one line verbatim in the YAML source; else the scalar's start."""
        node = self.doc.nodes[path]
        text = str(node.value).strip() if isinstance(node, ScalarNode) else ""
        raw = self.doc.text[node.start_mark.index:node.end_mark.index]
        at = raw.find(text) if text and "\n" not in text else -1
        if column is None or at < 0:
            return self.doc.where(path)
        offset = at + min(column, len(text)) - 1
        before = raw[:offset]
        line = node.start_mark.line + before.count("\n")
        col = offset - before.rfind("\n") - 1 if "\n" in before else node.start_mark.column + offset
        return _location(self.doc.label, line, col)

    def _definitions(self, path: YamlPath, entries: Mapping[str, Any], scope: dict[str, str]) -> dict[str, Expr]:
        """Definitions in order, each added to ``scope`` for the ones after it."""
        out: dict[str, Expr] = {}
        for name in entries:
            out[name] = self._expr((*path, name), scope, "real")
            scope[name] = "real"
        return out

    # faults

    def _faults(self, scope: Mapping[str, str]) -> tuple[Fault, ...]:
        faults = []
        for name, entry in self.data.get("faults", {}).items():
            conditions = {part: self._expr(("faults", name, part), scope, "bool")
                          for part in ("nominal", "active") if part in entry}
            faults.append(Fault(name, entry["kind"], entry.get("description", ""), **conditions))
        self._single_kinds(faults)
        return tuple(faults)

    def _single_kinds(self, faults: list[Fault]) -> None:
        """The guard watches one input box and one output check, so each kind is declared at most once."""
        for kind in ("input-box", "non-finite"):
            named = [f.name for f in faults if f.kind == kind]
            if len(named) > 1:
                first = self.doc.line(("faults", named[0]), key=True)
                raise self.doc.error(("faults", named[1], "kind"), f"faults {named[0]!r} (line {first}) and "
                                     f"{named[1]!r} are both of kind {kind}; a spec has at most one")

    # modes

    def _mode(self, index: int, shared: Mapping[str, _Name], global_scope: Mapping[str, str]) -> _ModeScope:
        path: YamlPath = ("modes", index)
        entry = self.data["modes"][index]
        name = entry["name"]
        label = f"of mode {name!r}"
        local = [_Name(p, f"parameter {label}", (*path, "parameters", p)) for p in entry.get("parameters", {})]
        local += [_Name(d, f"definition {label}", (*path, "define", d)) for d in entry.get("define", {})]
        # a mode may define a model output: it then stands in for the network (the Simplex fallback)
        stand_in = {d for d in entry.get("define", {}) if shared.get(d) and shared[d].what == "model output"}
        self._check_names(local, {k: v for k, v in shared.items() if k not in stand_in})
        fault_scope = dict.fromkeys(self.data.get("faults", {}), "bool")
        requires = self._expr((*path, "requires"), fault_scope, "bool") if "requires" in entry else None
        parameters = tuple(self._parameter((*path, "parameters", p)) for p in entry.get("parameters", {}))
        scope = {**global_scope, **dict.fromkeys([p.name for p in parameters], "real")}
        define = self._definitions((*path, "define"), entry.get("define", {}), scope)
        assume = tuple(self._expr(p, scope, "bool") for p in self._assumptions(path))
        mode = Mode(name, entry.get("description", ""), requires, parameters, assume, define)
        return _ModeScope(mode, frozenset(scope))

    def _unique_modes(self) -> None:
        first: dict[str, int] = {}
        for index, entry in enumerate(self.data["modes"]):
            earlier = first.setdefault(entry["name"], index)
            if earlier != index:
                line = self.doc.line(("modes", earlier, "name"))
                raise self.doc.error(("modes", index, "name"), f"mode {entry['name']!r} is declared twice (first "
                                     f"on line {line})")

    def _parameter(self, path: YamlPath) -> Parameter:
        entry = self.doc.get(path)
        lo, hi = self._range((*path, "range"))
        return Parameter(str(path[-1]), lo, hi, entry.get("objective"), entry.get("unit", ""))

    def _assumptions(self, path: YamlPath) -> list[YamlPath]:
        assume = self.data["modes"][path[1]].get("assume")
        if assume is None:
            return []
        if isinstance(assume, list):
            return [(*path, "assume", i) for i in range(len(assume))]
        return [(*path, "assume")]

    # invariants and model

    def _invariants(self, modes: list[_ModeScope], outputs: list[str]) -> tuple[Invariant, ...]:
        """Invariants read any name some mode provides; each mode must provide every name read."""
        union = dict.fromkeys(set().union(*(m.names for m in modes)) | set(outputs), "real")
        out = []
        for name, entry in self.data["invariants"].items():
            path: YamlPath = ("invariants", name, "expr") if isinstance(entry, dict) else ("invariants", name)
            expr = self._expr(path, union, "bool")
            for scope in modes:
                self._provided(path, expr, scope, outputs)
            description = entry.get("description", "") if isinstance(entry, dict) else ""
            out.append(Invariant(name, expr, description))
        return tuple(out)

    def _provided(self, path: YamlPath, expr: Expr, scope: _ModeScope, outputs: list[str]) -> None:
        missing = expr.names - scope.names - set(outputs)
        if not missing:
            return
        node = min((n for n in ast.walk(expr.tree) if isinstance(n, ast.Name) and n.id in missing),
                   key=lambda n: n.col_offset)
        mode = scope.mode.name
        raise SpecError(f"{_dotted(path)} reads {node.id!r}, which mode {mode!r} does not provide",
                        location=self._expr_location(path, node.col_offset + 1),
                        hint=f"give mode {mode!r} a definition or parameter {node.id!r}, or read only shared names")

    def _model(self) -> DecisionModel | None:
        entry = self.data.get("model")
        if entry is None:
            return None
        seen: dict[str, int] = {}
        for i, name in enumerate(entry["inputs"]):
            if name not in self.data["state"]:
                raise self.doc.error(("model", "inputs", i), f"model input {name!r} is not a state variable "
                                     f"(state: {', '.join(self.data['state'])})")
            if name in seen:
                line = self.doc.line(("model", "inputs", seen[name]))
                raise self.doc.error(("model", "inputs", i), f"model input {name!r} is listed twice (first on "
                                     f"line {line})")
            seen[name] = i
        return DecisionModel(entry["path"], tuple(entry["inputs"]), tuple(entry["outputs"]))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError):
        return False



