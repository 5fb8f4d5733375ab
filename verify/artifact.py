"""How a compiled library, its manifest and the certificate embedded in it can disagree: what
``cuvil verify --artifact`` and the certificate audit check before trusting a library's proofs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _pipeline_names(spec: Any) -> list[str] | None:
    """The pass names a manifest's pipeline spec expands to (None when it cannot be read)."""
    import cuvil.passes.catalogue  # noqa: F401  (registers the built-in pipelines)
    from cuvil.passes.manager import PIPELINES

    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    elif isinstance(spec, list) and all(isinstance(s, str) for s in spec):
        items = list(spec)
    else:
        return None
    out: list[str] = []
    for it in items:
        if it.upper() in PIPELINES:
            out.extend(_pipeline_names(list(PIPELINES[it.upper()])) or [])
        else:
            out.append(it)
    return out


def artifact_problems(library: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Every way the library, its manifest and the embedded certificate disagree."""
    from cuvil.codegen.artifact import manifest_problems, read_provenance
    from verify.certificate import CERTIFICATE_FORMAT, certificate_digest, kept_unproved

    problems = manifest_problems(library, manifest)
    cert = manifest.get("verification")
    if not isinstance(cert, dict):
        return [*problems, "the manifest holds no verification certificate (compile with --gate or --verify)"]
    if cert.get("format") != CERTIFICATE_FORMAT:
        problems.append(f"the certificate's format is {cert.get('format')!r}, expected {CERTIFICATE_FORMAT!r}")
    if cert.get("digest") != certificate_digest(cert):
        problems.append("the certificate does not match its own digest (it was edited)")
    embedded = read_provenance(library) or {}
    if embedded.get("certificate") != cert.get("digest"):
        problems.append(f"{library.name} embeds certificate {embedded.get('certificate')}, the manifest carries "
                        f"{cert.get('digest')} (a certificate of another library)")
    if embedded.get("function") != cert.get("function_hash") or embedded.get("function") != manifest.get(
            "function_hash"):
        problems.append(f"{library.name} was compiled from function {embedded.get('function')}; the certificate "
                        f"covers {cert.get('function_hash')}, the manifest names {manifest.get('function_hash')}")
    expected = _pipeline_names(manifest.get("pipeline"))
    if expected is not None and cert.get("pipeline") != expected:
        problems.append(f"the certificate's pipeline {cert.get('pipeline')} is not the manifest's {expected}")
    apps = cert.get("applications")
    if not isinstance(apps, list):
        return [*problems, "the certificate lists no pass applications"]
    verdicts = [o.get("verdict") for a in apps for o in a.get("obligations", [])]
    summary = cert.get("summary", {})
    counted = {"obligations": len(verdicts), "proved": verdicts.count("proved"),
               "refuted": verdicts.count("refuted"), "unknown": verdicts.count("unknown")}
    for k, v in counted.items():
        if summary.get(k) != v:
            problems.append(f"the certificate's summary says {summary.get(k)} {k}, its obligations give {v}")
    rollbacks = cert.get("rollbacks", [])
    rolled = {r.get("application") for r in rollbacks if isinstance(r, dict)}
    for k, a in enumerate(apps):
        if bool(a.get("rolled_back")) != (k in rolled):
            problems.append(f"application {k} ({a.get('pass')}): its rollback flag disagrees with the rollback list")
    for o in kept_unproved(cert):
        problems.append(f"pass {o.get('pass')} was kept with a {o.get('verdict')} obligation at "
                        f"@{o.get('function')}:{o.get('output')}")
    return problems
