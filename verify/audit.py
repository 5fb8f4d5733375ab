"""Re-checking a certificate without trusting the verifier that wrote it.

``check_certificate`` re-runs every query a proof rests on (each proved obligation's and each
cut-point lemma's) with a stock solver (z3, or cvc5 as an independent second solver), checks the
certificate against its own digest, re-proves the axioms it lists, and, given the model and the
library, re-derives their hashes: the model's content hash, the module before and after every
pass application (by running the pipeline again), and the library's own hash and embedded
provenance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil.errors import InputError

SOLVERS = ("z3", "cvc5")
QUERY_TIME_LIMIT = 120.0


@dataclass
class Audit:
    """What a re-check found: ``problems`` is empty when the certificate holds."""

    solver: str
    queries: int = 0
    unsat: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_query(smt2: str, solver: str, timeout: float = QUERY_TIME_LIMIT) -> str:
    """The answer of ``solver`` to an SMT-LIB 2 query: ``unsat``, ``sat``, ``unknown`` or ``error: ...``."""
    if solver == "z3":
        return _run_z3(smt2, timeout)
    if solver == "cvc5":
        return _run_cvc5(smt2, timeout)
    raise InputError(f"unknown solver {solver!r}", location="--solver", hint="one of " + ", ".join(SOLVERS))


def _run_z3(smt2: str, timeout: float) -> str:
    import z3

    ctx = z3.Context()
    try:
        assertions = z3.parse_smt2_string(smt2, ctx=ctx)
    except z3.Z3Exception as e:
        return f"error: {e}"
    s = z3.Solver(ctx=ctx)
    s.set("timeout", max(1, int(timeout * 1000)))
    s.add(assertions)
    return str(s.check())


def _run_cvc5(smt2: str, timeout: float) -> str:
    try:  # the compiled module itself: the package re-exports it by a star import type checkers cannot read
        import cvc5.cvc5_python_base as cvc5
    except ImportError:
        raise InputError("cvc5 is not installed", location="--solver cvc5",
                         hint="pip install cvc5 (it is among Cuvil's dev dependencies)") from None
    slv = cvc5.Solver()
    slv.setOption("tlimit-per", str(max(1, int(timeout * 1000))))
    symbols = cvc5.SymbolManager(slv)
    parser = cvc5.InputParser(slv, symbols)
    parser.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, "(set-logic ALL)\n" + smt2, "certificate")
    answer = "error: no (check-sat) in the query"
    try:
        while True:
            cmd = parser.nextCommand()
            if cmd.isNull():
                break
            out = cmd.invoke(slv, symbols).strip()
            if out in ("sat", "unsat", "unknown"):
                answer = out
    except RuntimeError as e:
        return f"error: {e}"
    return answer


def _queries(cert: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, query) for every query a proof in the certificate rests on."""
    for k, app in enumerate(cert.get("applications", [])):
        if app.get("rolled_back"):
            continue
        name = f"application {k} ({app.get('pass')})"
        proved = [o for o in app.get("obligations", []) if o.get("verdict") == "proved"]
        if proved:
            for j, lemma in enumerate(app.get("lemmas", [])):
                yield f"{name} lemma {j}", str(lemma.get("smt2", ""))
        for o in proved:
            yield f"{name} @{o.get('function')}:{o.get('output')}", str((o.get("query") or {}).get("smt2", ""))


def check_certificate(cert: Mapping[str, Any], *, solver: str = "z3", timeout: float = QUERY_TIME_LIMIT,
                      model: Any = None, library: Path | None = None, manifest: Mapping[str, Any] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> Audit:
    """Re-check ``cert``: its digest, every query with ``solver``, its axioms, and (when given) the
    model's and the library's hashes."""
    from verify.axioms import axiom_status
    from verify.certificate import CERTIFICATE_FORMAT, certificate_digest, semantics_hash

    audit = Audit(solver)
    start = time.perf_counter()
    if cert.get("format") != CERTIFICATE_FORMAT:
        audit.problems.append(f"format {cert.get('format')!r}, expected {CERTIFICATE_FORMAT!r}")
        return audit
    if cert.get("digest") != certificate_digest(dict(cert)):
        audit.problems.append("the certificate does not match its own digest (it was edited)")
    if cert.get("semantics_hash") != semantics_hash():
        audit.notes.append("written by a Cuvil whose semantics (op rules, encoders) differ from this one: the "
                           "queries are re-checked, the hashes of a re-run pipeline may differ")
    for name, status in (cert.get("axioms") or {}).items():
        now = axiom_status(name)
        if status.get("status") != now["status"]:
            audit.problems.append(f"axiom {name}: the certificate says {status.get('status')}, re-checking gives "
                                  f"{now['status']} ({now['how']})")
    queries = list(_queries(cert))
    for k, (where, smt2) in enumerate(queries):
        if progress is not None:
            progress(k, len(queries))
        audit.queries += 1
        if not smt2.strip():
            audit.problems.append(f"{where}: proved, but the certificate holds no query")
            continue
        answer = run_query(smt2, solver, timeout)
        if answer == "unsat":
            audit.unsat += 1
        else:
            audit.problems.append(f"{where}: {solver} answers {answer}, not unsat")
    _check_summary(cert, audit)
    if model is not None:
        _rederive(cert, model, audit)
    if library is not None:
        from verify.artifact import artifact_problems

        audit.problems += artifact_problems(library, manifest or {})
    audit.seconds = time.perf_counter() - start
    return audit


def _check_summary(cert: Mapping[str, Any], audit: Audit) -> None:
    verdicts = [o.get("verdict") for a in cert.get("applications", []) for o in a.get("obligations", [])]
    summary = cert.get("summary", {})
    for key in ("proved", "refuted", "unknown"):
        if summary.get(key) != verdicts.count(key):
            audit.problems.append(f"the summary says {summary.get(key)} {key}, the obligations give "
                                  f"{verdicts.count(key)}")


def _rederive(cert: Mapping[str, Any], model: Any, audit: Audit) -> None:
    """The model's hash, and the module before and after each application, from the model itself."""
    from cuvil.ir.hashing import module_hash
    from cuvil.passes.manager import PassManager, parse_pipeline

    if module_hash(model) != cert.get("model_hash"):
        audit.problems.append("the model's content hash is not the certificate's model_hash")
        return
    seen: list[tuple[str, str, str]] = []

    def record(pass_: Any, before: Any, after: Any) -> Any:
        seen.append((pass_.name, module_hash(before), module_hash(after)))
        return type("Accept", (), {"accept": True})()

    apps = cert.get("applications", [])
    rolled = {k for k, a in enumerate(apps) if a.get("rolled_back")}
    if rolled:
        audit.notes.append("applications were rolled back: their hashes are compared up to the first rollback")
    try:
        PassManager(parse_pipeline(list(cert.get("pipeline", []))), gate=record).run(model)
    except Exception as e:  # a pipeline this Cuvil cannot run is reported, not raised
        audit.problems.append(f"the pipeline could not be re-run on the model: {e}")
        return
    limit = min(rolled) if rolled else len(apps)
    for k in range(min(limit, len(seen))):
        name, before, after = seen[k]
        a = apps[k]
        if (a.get("pass"), a.get("before_hash"), a.get("after_hash")) != (name, before, after):
            audit.problems.append(f"application {k} ({a.get('pass')}): the certificate's hashes are not those of "
                                  f"the pipeline re-run on the model ({name})")
    if not rolled and len(seen) != len(apps):
        audit.problems.append(f"the pipeline re-run on the model makes {len(seen)} applications, the certificate "
                              f"lists {len(apps)}")


def load_certificate(path: Path) -> tuple[dict[str, Any], Path | None, dict[str, Any] | None]:
    """A certificate from a JSON file, or the one a compiled library's manifest embeds
    (then also the library and its manifest)."""
    import json

    if not path.is_file():
        raise InputError(f"{path} does not exist", location=str(path),
                         hint="give a certificate (cuvil verify MODEL --json cert.json) or a compiled library")
    if path.suffix in (".so", ".wasm", ".ptx"):  # a library of any target
        from cuvil.runtime.loader import read_manifest

        manifest = read_manifest(path)
        cert = manifest.get("verification")
        if not isinstance(cert, dict):
            raise InputError(f"{path}'s manifest holds no certificate", location=str(path),
                             hint="compile with --gate or --verify")
        return cert, path, manifest
    try:
        cert = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} is not a JSON certificate: {e}", location=str(path)) from None
    if not isinstance(cert, dict):
        raise InputError(f"{path} is not a JSON certificate", location=str(path))
    return cert, None, None
