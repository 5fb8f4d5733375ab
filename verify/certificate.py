"""The verification report and its certificate: what was proved, with which encoder, in how
long, over which shapes, and the counterexample for anything refuted.

A certificate is what an auditor re-checks without trusting Cuvil: per proved obligation the
SMT-LIB 2 query exactly as solved (and the cut-point lemmas it relies on), the content hashes of
the module before and after each pass application, a hash of the semantics (the op catalogue,
its rules and the encoders), the axioms the encodings used with how each is established, and
a digest over all of it (``seal``), so an edited certificate no longer matches itself and a
library that embeds the digest no longer matches an edited or transplanted one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from verify.axioms import axiom_status
from verify.cone_encoder import DIM_LIMIT
from verify.obligations import Application, ObligationRecord

CERTIFICATE_FORMAT = "cuvil-certificate/2"

TIERS = {
    "exact": "bit-identical reference results for every input and every shape the constraints allow (any NaN equals "
             "any NaN, signed zeros differ, reductions in the order their rules fix); floats are an opaque sort with "
             "only IEEE-valid laws (each one proved, see `axioms`), integers wrapping bit-vectors",
    "real": "equal over the real numbers (floats may differ by rounding); NaN, infinities and overflow are not part "
            "of this proof: a difference in finiteness that the refuter finds refutes the rewrite, its absence is "
            "not proved",
    "bounded": "changes precision (FP16, INT8): not proved here; each such obligation is unknown and left to the "
               "overflow prober (`cuvil probe`)",
}

ASSUMPTIONS = (f"a symbolic dim without an upper constraint is at most 2^{DIM_LIMIT.bit_length() - 1} "
               "(no tensor axis can be longer)",)

_SEMANTICS_SOURCES = ("cuvil/ir", "verify/cone_encoder.py", "verify/scalar_semantics.py", "verify/narrow_bits.py",
                      "verify/poly.py", "verify/z3_terms.py", "verify/axioms.py", "verify/cone.py")


@functools.cache
def semantics_hash() -> str:
    """A hash of the sources that define what a proof means: the op catalogue and its rules, the
    rule primitives, the encoders and the axioms (a certificate is re-derived with the same)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for entry in _SEMANTICS_SOURCES:
        path = root / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def certificate_digest(cert: dict[str, Any]) -> str:
    """sha256 over the certificate's canonical JSON, its own ``digest`` left out."""
    body = {k: v for k, v in cert.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(cert: dict[str, Any]) -> dict[str, Any]:
    """``cert`` with its digest (call again after adding anything)."""
    cert["digest"] = certificate_digest(cert)
    return cert


def _versions() -> dict[str, str]:
    from cuvil.version import __version__

    return {"cuvil": __version__, "z3": z3.get_version_string(), "python": platform.python_version()}


def kept_unproved(cert: dict[str, Any]) -> list[dict[str, Any]]:
    """The obligations of applications the certificate says were kept (not rolled back) whose
    verdict is not proved: what a library compiled with them still relies on unproved."""
    rolled = {r.get("application") for r in cert.get("rollbacks", []) if isinstance(r, dict)}
    out = []
    for k, a in enumerate(cert.get("applications", [])):
        if k in rolled:
            continue
        for o in a.get("obligations", []):
            if o.get("verdict") != "proved":
                out.append({"pass": a.get("pass"), **o})
    return out


@dataclass
class Verification:
    """All pass applications checked for one module (a single pass, or a pipeline)."""

    module: str
    pipeline: list[str]
    applications: list[Application] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    """Per rolled-back application: ``pass``, ``application`` (its index here) and ``reason``."""
    policy: str = "audit"

    @property
    def obligations(self) -> list[ObligationRecord]:
        return [o for a in self.applications for o in a.obligations]

    def count(self, kind: str) -> int:
        return sum(1 for o in self.obligations if o.status == kind)

    @property
    def proved(self) -> bool:
        """Every obligation proved (a report without obligations is trivially proved)."""
        return all(o.status == "proved" for o in self.obligations)

    @property
    def vacuous(self) -> list[Application]:
        """Applications that changed the module but carry no obligation (never counted as proved)."""
        return [a for a in self.applications if a.vacuous]

    @property
    def seconds(self) -> float:
        return sum(a.seconds for a in self.applications)

    def rolled_back_at(self, index: int) -> bool:
        return any(r.get("application") == index for r in self.rollbacks)

    def certificate(self, function_hash: str | None = None, shapes: Mapping[str, Any] | None = None,
                    target: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The sealed certificate; ``function_hash``: the function it vouches for (a compiled
        library embeds it and the digest); ``shapes``: which shapes its proofs cover (a library's
        static shapes, or its whole shape class); ``target``: the target the library was compiled
        for and which tests back its code there."""
        apps = []
        for k, a in enumerate(self.applications):
            entry = a.to_json()
            entry["rolled_back"] = self.rolled_back_at(k)
            apps.append(entry)
        used = sorted({a for o in self.obligations if o.status == "proved" for a in getattr(o.verdict, "axioms", ())}
                      | {a for app in self.applications for a in app.lemma_axioms})
        return seal({
            "format": CERTIFICATE_FORMAT,
            "model_hash": self.module,
            "versions": _versions(),
            "semantics_hash": semantics_hash(),
            "pipeline": list(self.pipeline),
            "policy": self.policy,
            "tiers": TIERS,
            "assumptions": list(ASSUMPTIONS),
            "axioms": {name: axiom_status(name) for name in used},
            "summary": {"obligations": len(self.obligations), "proved": self.count("proved"),
                        "refuted": self.count("refuted"), "unknown": self.count("unknown"),
                        "vacuous_applications": len(self.vacuous),
                        "rolled_back": list(self.rolled_back), "seconds": round(self.seconds, 3)},
            "rollbacks": [dict(r) for r in self.rollbacks],
            "applications": apps,
            **({"function_hash": function_hash} if function_hash else {}),
            **({"shapes": dict(shapes)} if shapes else {}),
            **({"target": dict(target)} if target else {}),
        })

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.certificate(), indent=indent)

    def summary(self) -> str:
        """One line per obligation, aligned."""
        rows = [("pass", "contract", "output", "cone", "encoder", "verdict", "seconds")]
        for o in self.obligations:
            rows.append((o.pass_name, o.contract, f"{o.function}:{o.output}", f"{o.cone[0]}/{o.cone[1]}", o.encoder,
                         o.status if o.status != "unknown" else f"unknown ({o.verdict.reason})",  # type: ignore[union-attr]
                         f"{o.seconds:.3f}"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
        lines.append(f"{len(self.obligations)} obligations: {self.count('proved')} proved, "
                     f"{self.count('refuted')} refuted, {self.count('unknown')} unknown; {self.seconds:.2f} s")
        for a in self.vacuous:
            lines.append(f"{a.pass_name}: no obligation ({a.vacuous})")
        return "\n".join(lines)
