"""The verification report and its certificate: what was proved, with which encoder, in how
long, over which shapes, and the counterexample for anything refuted."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from typing import Any

import z3

from verify.obligations import Application, ObligationRecord

TIERS = {
    "real": "ideal arithmetic: floats may differ by rounding",
    "exact": "opaque float operations: bit-identical results",
    "fast-math": "proved over the reals by reassociation, with a numeric error budget",
}


def _versions() -> dict[str, str]:
    import cuvil

    return {"cuvil": cuvil.__version__, "z3": z3.get_version_string(), "python": platform.python_version()}


@dataclass
class Report:
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

    def certificate(self) -> dict[str, Any]:
        apps = []
        for k, a in enumerate(self.applications):
            entry = a.to_json()
            entry["rolled_back"] = self.rolled_back_at(k)
            apps.append(entry)
        return {
            "format": "cuvil-certificate/1",
            "model_hash": self.module,
            "versions": _versions(),
            "pipeline": list(self.pipeline),
            "policy": self.policy,
            "tiers": TIERS,
            "summary": {"obligations": len(self.obligations), "proved": self.count("proved"),
                        "refuted": self.count("refuted"), "unknown": self.count("unknown"),
                        "vacuous_applications": len(self.vacuous),
                        "rolled_back": list(self.rolled_back), "seconds": round(self.seconds, 3)},
            "rollbacks": [dict(r) for r in self.rollbacks],
            "applications": apps,
        }

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
