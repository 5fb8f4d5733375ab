"""The guard a fail-safe policy asks a compiled library to carry.

``compile(model, failsafe=POLICY)`` (``cuvil compile --failsafe POLICY.json``) reads the policy with
the policy module's reader (:func:`failsafe.policy.from_json`): every field type-checked, the whole
consistent, the digest matching the content (an edited policy no longer states what was proved). Here
the guard is built from what it read: the boxes of the model's inputs, checked against the model
(:meth:`GuardSpec.check_model`), and the faults the guard reports. The library's manifest keeps the
policy's digest, its spec, its table and the guard's checks (:meth:`GuardSpec.manifest`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.guard import GuardChecks
from cuvil.errors import FileAccessError
from cuvil.runtime.guard import policy_response
from failsafe.policy import FORMAT, Policy, PolicyError

READER_SOURCES = (Path(__file__), Path(__file__).with_name("policy.py"))
"""The modules that decide a manifest's ``failsafe`` entry: this one and the policy reader."""


@dataclass(frozen=True)
class GuardSpec:
    """What a policy asks of a compiled library: the input boxes and fault names of its ``guard``
    section, with the policy's identity (digest, spec) and table for the manifest and for the mode a
    fault calls for."""

    boxes: tuple[tuple[str, float, float], ...]
    input_fault: str | None
    output_fault: str | None
    digest: str
    spec: Mapping[str, str]
    faults: tuple[tuple[str, str], ...]  # (name, kind), as declared
    modes: tuple[str, ...]
    table: tuple[Mapping[str, Any], ...]
    where: str = dataclasses.field(default="policy", compare=False)  # the file it was read from, for messages

    @classmethod
    def from_policy(cls, doc: Policy | str | bytes | Mapping[str, Any], *, where: str = "policy") -> GuardSpec:
        """The guard of a policy: its JSON text, the parsed document or a :class:`Policy` (written out
        first), read by the policy reader with its digest checked (a :class:`PolicyError` names the first
        field at fault). The table's rows are kept as the policy writer writes them."""
        policy = Policy.from_json(doc.to_dict() if isinstance(doc, Policy) else doc, source=where)
        data = policy.to_dict()
        return cls(tuple((name, lo, hi) for name, (lo, hi) in policy.guard.inputs.items()), policy.guard.input_fault,
                   policy.guard.output_fault, policy.digest, data["spec"], policy.faults, policy.modes,
                   tuple(data["table"]), where)

    def cache_key(self) -> dict[str, str]:
        """What a compile cache key needs of the policy: its digest, and the source of the modules that
        read it (which decides the manifest's ``failsafe`` entry)."""
        reader = hashlib.sha256(b"".join(path.read_bytes() for path in READER_SOURCES)).hexdigest()
        return {"policy": self.digest, "reader": reader}

    def checks(self) -> GuardChecks:
        """The guard the code generator emits."""
        return GuardChecks(self.boxes, self.input_fault, self.output_fault)

    def response(self, fault: str) -> tuple[str | None, dict[str, float] | None]:
        """The mode and parameters the policy gives the scenario with exactly ``fault`` active."""
        return policy_response({"table": list(self.table)}, fault)

    def check_model(self, inputs: Sequence[TensorSpec]) -> None:
        """Refuse a box on an input the model does not have (naming it), or one the guard cannot check."""
        names = [s.name for s in inputs]
        for name, _, _ in self.boxes:
            if name not in names:
                raise PolicyError(f"the policy's guard gives a box for input {name!r}, which the model does "
                                  "not have", location=self.where,
                                  hint="the model's inputs: " + (", ".join(map(repr, names)) or "none"))
        self.checks().validate(inputs)

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``failsafe`` entry: the policy's digest, its spec, faults, modes, table and guard."""
        return {"policy_digest": self.digest, "format": FORMAT, "spec": dict(self.spec),
                "faults": [{"name": n, "kind": k} for n, k in self.faults], "modes": list(self.modes),
                "table": [dict(row) for row in self.table],
                "guard": {"inputs": {n: [lo, hi] for n, lo, hi in self.boxes}, "input_fault": self.input_fault,
                          "output_fault": self.output_fault}}


def read_policy(source: str | os.PathLike[str] | Mapping[str, Any] | Policy) -> GuardSpec:
    """The guard of a policy given as a JSON file's path, as the parsed document or as a :class:`Policy`."""
    if isinstance(source, (Mapping, Policy)):
        return GuardSpec.from_policy(source)
    if not isinstance(source, (str, os.PathLike)):
        raise PolicyError(f"a fail-safe policy is a JSON file's path or its parsed document, not a "
                          f"{type(source).__name__}", location="failsafe")
    path = Path(source)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise FileAccessError(f"cannot read the policy {path}: {e}", location=str(path)) from None
    return GuardSpec.from_policy(text, where=str(path))


__all__ = ["GuardSpec", "read_policy"]
