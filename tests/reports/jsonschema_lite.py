"""A small JSON Schema (draft-07) validator covering the keywords the SARIF 2.1.0 schema and the
report schema use: $ref, type, enum, const, properties, required, additionalProperties, items,
minItems, uniqueItems, minimum, maximum, pattern, format (uri, uri-reference, date-time),
oneOf, anyOf, allOf. Unknown keywords fail loudly, so the validator never silently passes."""

from __future__ import annotations

import json
import re
from typing import Any

ANNOTATIONS = {"$schema", "$id", "id", "title", "description", "default", "definitions", "examples",
               "$comment", "deprecated"}
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$")
URI_REFERENCE = re.compile(r"^[^\s]*$")
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


class ValidationError(AssertionError):
    pass


def _type_ok(value: Any, t: str) -> bool:
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "null":
        return value is None
    raise ValidationError(f"unknown type {t!r} in schema")


class Validator:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema

    def _resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise ValidationError(f"only local $ref is supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def errors(self, value: Any, schema: Any, path: str = "$") -> list[str]:
        if schema is True or schema == {}:
            return []
        if schema is False:
            return [f"{path}: no value is allowed here"]
        errs: list[str] = []
        for key in schema:
            if key in ANNOTATIONS:
                continue
            handler = getattr(self, "_k_" + key.lstrip("$"), None)
            if handler is None:
                raise ValidationError(f"unsupported schema keyword {key!r} at {path}")
            errs += handler(value, schema[key], schema, path)
        return errs

    def _k_ref(self, value: Any, ref: str, schema: dict, path: str) -> list[str]:
        return self.errors(value, self._resolve(ref), path)

    def _k_type(self, value: Any, t: Any, schema: dict, path: str) -> list[str]:
        types = t if isinstance(t, list) else [t]
        return [] if any(_type_ok(value, x) for x in types) else [f"{path}: expected {types}, got {value!r:.60}"]

    def _k_enum(self, value: Any, options: list, schema: dict, path: str) -> list[str]:
        return [] if value in options else [f"{path}: {value!r} not in {options}"]

    def _k_const(self, value: Any, c: Any, schema: dict, path: str) -> list[str]:
        return [] if value == c else [f"{path}: expected {c!r}"]

    def _k_properties(self, value: Any, props: dict, schema: dict, path: str) -> list[str]:
        if not isinstance(value, dict):
            return []
        errs: list[str] = []
        for k, sub in props.items():
            if k in value:
                errs += self.errors(value[k], sub, f"{path}.{k}")
        return errs

    def _k_required(self, value: Any, req: list, schema: dict, path: str) -> list[str]:
        if not isinstance(value, dict):
            return []
        return [f"{path}: missing {k!r}" for k in req if k not in value]

    def _k_additionalProperties(self, value: Any, extra: Any, schema: dict, path: str) -> list[str]:
        if not isinstance(value, dict):
            return []
        known = set(schema.get("properties", {}))
        errs: list[str] = []
        for k, v in value.items():
            if k in known:
                continue
            if extra is False:
                errs.append(f"{path}: unexpected property {k!r}")
            elif isinstance(extra, dict):
                errs += self.errors(v, extra, f"{path}.{k}")
        return errs

    def _k_items(self, value: Any, items: Any, schema: dict, path: str) -> list[str]:
        if not isinstance(value, list):
            return []
        errs: list[str] = []
        for i, v in enumerate(value):
            errs += self.errors(v, items, f"{path}[{i}]")
        return errs

    def _k_minItems(self, value: Any, n: int, schema: dict, path: str) -> list[str]:
        return [f"{path}: fewer than {n} items"] if isinstance(value, list) and len(value) < n else []

    def _k_uniqueItems(self, value: Any, flag: bool, schema: dict, path: str) -> list[str]:
        if not flag or not isinstance(value, list):
            return []
        keys = [json.dumps(v, sort_keys=True) for v in value]
        return [f"{path}: items are not unique"] if len(set(keys)) != len(keys) else []

    def _k_minimum(self, value: Any, m: float, schema: dict, path: str) -> list[str]:
        ok = not _type_ok(value, "number") or value >= m
        return [] if ok else [f"{path}: {value} < minimum {m}"]

    def _k_maximum(self, value: Any, m: float, schema: dict, path: str) -> list[str]:
        ok = not _type_ok(value, "number") or value <= m
        return [] if ok else [f"{path}: {value} > maximum {m}"]

    def _k_pattern(self, value: Any, pattern: str, schema: dict, path: str) -> list[str]:
        ok = not isinstance(value, str) or re.search(pattern, value) is not None
        return [] if ok else [f"{path}: {value!r} does not match {pattern!r}"]

    def _k_format(self, value: Any, fmt: str, schema: dict, path: str) -> list[str]:
        if not isinstance(value, str):
            return []
        regex = {"uri": URI, "uri-reference": URI_REFERENCE, "date-time": DATE_TIME}.get(fmt)
        if regex is None:
            raise ValidationError(f"unsupported format {fmt!r}")
        return [] if regex.match(value) else [f"{path}: {value!r} is not a {fmt}"]

    def _k_oneOf(self, value: Any, options: list, schema: dict, path: str) -> list[str]:
        ok = sum(not self.errors(value, o, path) for o in options)
        return [] if ok == 1 else [f"{path}: matches {ok} of oneOf"]

    def _k_anyOf(self, value: Any, options: list, schema: dict, path: str) -> list[str]:
        return [] if any(not self.errors(value, o, path) for o in options) else [f"{path}: matches no anyOf"]

    def _k_allOf(self, value: Any, options: list, schema: dict, path: str) -> list[str]:
        return [e for o in options for e in self.errors(value, o, path)]


def validate(value: Any, schema: dict[str, Any], entry: str | None = None) -> None:
    """Validate against ``schema`` (or its definition named by ``entry``, e.g. ``"#/definitions/Root"``)."""
    errs = Validator(schema).errors(value, {"$ref": entry} if entry else schema)
    if errs:
        raise ValidationError("; ".join(errs[:10]))
