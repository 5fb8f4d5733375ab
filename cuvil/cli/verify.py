"""``cuvil verify``: prove every pass application of a pipeline on a model, prove the rewrite
rules (``--rules``), or check a compiled artifact against its certificate (``--artifact``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil.cli.common import EXIT_CODES as COMMON_EXIT_CODES
from cuvil.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNDECIDED,
    add_plugin_arguments,
    check_output,
    check_seconds,
    import_model_file,
    plugins_from_args,
    specialize_shapes,
)
from cuvil.errors import InputError
from verify.artifact import artifact_problems
from verify.obligations import DEFAULT_TIMEOUT, Application

EXIT_PROVED = EXIT_OK
EXIT_REFUTED = EXIT_FAILED
EXIT_UNKNOWN = EXIT_UNDECIDED

EXIT_CODES = COMMON_EXIT_CODES + """
verify --artifact fails (1) when the library, manifest or certificate do not
match or a kept rewrite is not proved; --check-certificate fails (1) on a query
not unsat, an edited certificate or a hash that does not re-derive
"""



def exit_code(statuses: Sequence[str]) -> int:
    """Refuted beats unknown beats proved."""
    if "refuted" in statuses:
        return EXIT_REFUTED
    if "unknown" in statuses:
        return EXIT_UNKNOWN
    return EXIT_PROVED


# --------------------------------------------------------------------------------------
# progress


class _Bar:
    """A rich progress bar on stderr over pass applications, started only once workers exist."""

    def __init__(self, total: int, what: str, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[obligations]} obligations"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True, disable=not enabled)
        self.task = self.progress.add_task(what, total=total, obligations=0)
        self.obligations = 0
        self.running = False

    def start(self) -> None:
        self.progress.start()
        self.running = True

    def advance(self, k: int, app: Application) -> None:
        self.obligations += len(app.obligations)
        self.progress.update(self.task, advance=1, obligations=self.obligations,
                             description=f"checked {app.pass_name}")

    def stop(self) -> None:
        if self.running:
            self.progress.stop()
            self.running = False


def _check(pending: Sequence[Any], args: argparse.Namespace, what: str,
           run: Callable[..., Any]) -> Any:
    bar = _Bar(len(pending), what, enabled=not args.quiet)
    try:
        return run(timeout=args.timeout, seed=args.seed, jobs=args.jobs, progress=bar.advance, started=bar.start)
    finally:
        bar.stop()


# --------------------------------------------------------------------------------------
# cuvil verify MODEL


def _per_pass_rows(report: Any) -> list[tuple[str, ...]]:
    """One row per pass name (a pass that runs twice in the pipeline sums over both runs)."""
    rows: dict[str, list[Any]] = {}
    for name in report.pipeline:
        rows.setdefault(name, [name, "", 0, 0, 0, 0, 0, 0, 0, 0.0])
    for app in report.applications:
        r = rows.setdefault(app.pass_name, [app.pass_name, "", 0, 0, 0, 0, 0, 0, 0, 0.0])
        r[1] = app.contract
        r[2] += 1
        r[3] += len(app.obligations)
        r[4] += app.count("proved")
        r[5] += app.count("refuted")
        r[6] += app.count("unknown")
        r[7] += 1 if app.vacuous else 0
        r[8] += app.identical_outputs
        r[9] += app.seconds
    return [(r[0], r[1] or "-", *(str(x) for x in r[2:9]), f"{r[9]:.2f}") for r in rows.values()]


def _console(out: Any) -> Any:
    """A console wide enough for the tables even when the output is a file or a pipe."""
    from rich.console import Console

    return Console(file=out, highlight=False, width=max(120, Console(file=out).width))


def print_summary(report: Any, out: Any = None) -> None:
    """The per-pass table, then every refuted obligation with its counterexample and every unknown
    one with its reason."""
    from rich.table import Table

    from verify.verdict import Refuted

    out = out or sys.stdout
    console = _console(out)
    out.write(f"pipeline: {', '.join(report.pipeline) or '(empty)'}\n")
    t = Table()
    for col in ("pass", "contract", "applied", "obligations", "proved", "refuted", "unknown", "vacuous", "unchanged",
                "seconds"):
        t.add_column(col, justify="left" if col in ("pass", "contract") else "right", no_wrap=True)
    for row in _per_pass_rows(report):
        style = "bold red" if row[5] != "0" else ("yellow" if row[6] != "0" else None)  # refuted / unknown
        t.add_row(*row, style=style)
    console.print(t)
    for k, app in enumerate(report.applications):
        rolled = " (rolled back)" if report.rolled_back_at(k) else ""
        for o in app.obligations:
            if isinstance(o.verdict, Refuted):
                out.write(f"\nREFUTED  pass {o.pass_name} ({o.contract}), application {k}{rolled}, "
                          f"result @{o.function}:{o.output}\n{o.verdict.counterexample.table()}\n")
            elif o.status == "unknown":
                out.write(f"\nUNKNOWN  pass {o.pass_name} ({o.contract}), application {k}{rolled}, "
                          f"result @{o.function}:{o.output}: {o.verdict.reason}\n")  # type: ignore[union-attr]
    for a in report.vacuous:
        out.write(f"\nNO OBLIGATION  pass {a.pass_name}: {a.vacuous} (not counted as proved)\n")
    n = len(report.obligations)
    out.write(f"\n{n} obligations in {len(report.applications)} pass applications: {report.count('proved')} "
              f"proved, {report.count('refuted')} refuted, {report.count('unknown')} unknown, "
              f"{len(report.vacuous)} applications without obligations ({report.seconds:.2f} s of proof time)\n")


def _write_outputs(report: Any, args: argparse.Namespace, model: str, timings: Mapping[str, float]) -> None:
    if args.json:
        Path(args.json).write_text(report.to_json() + "\n")
        sys.stderr.write(f"wrote certificate {args.json}\n")
    if not (args.sarif or args.html):
        return
    import cuvil
    from reports import write_html, write_sarif
    from verify.report_model import to_report

    settings = {"pipeline": ", ".join(report.pipeline), "timeout_s": args.timeout, "seed": args.seed,
                "jobs": args.jobs}
    rep = to_report(report, model=model, settings=settings, version=cuvil.__version__, timings=timings)
    if args.sarif:
        write_sarif(rep, args.sarif)
        sys.stderr.write(f"wrote {args.sarif}\n")
    if args.html:
        write_html(rep, args.html)
        sys.stderr.write(f"wrote {args.html}\n")


def verify_model(args: argparse.Namespace) -> int:
    from cuvil.ir.hashing import module_hash
    from cuvil.passes.plugins import resolve_pipeline
    from verify.batch import check_all, collect
    from verify.certificate import Verification

    if args.opt_level is not None and args.passes:
        raise InputError("give either -O<level> or -p PIPELINE, not both", location="-p")
    plugins = plugins_from_args(args)
    passes = resolve_pipeline(args.passes, plugins, default=f"O{args.opt_level or 3}")
    start = time.perf_counter()
    module = import_model_file(args.model, args.static_input, shape_specs=args.shape)
    if args.shape:
        module = specialize_shapes(module, args.shape)
    imported = time.perf_counter()
    pending, _ = collect(module, passes)
    optimized = time.perf_counter()
    apps = _check(pending, args, "proving pass applications",
                  lambda **kw: check_all(pending, **kw))
    checked = time.perf_counter()
    report = Verification(module_hash(module), [p.name for p in passes], apps, policy="audit")
    timings = {"import": imported - start, "pipeline": optimized - imported, "proofs": checked - optimized}
    print_summary(report)
    _write_outputs(report, args, args.model, timings)
    return exit_code([o.status for o in report.obligations])


# --------------------------------------------------------------------------------------
# cuvil verify --rules


def verify_rules(args: argparse.Namespace) -> int:
    from rich.table import Table

    from verify.rules_check import cases, check_rules
    from verify.verdict import Refuted

    all_cases = cases()
    runnable = [c for c in all_cases if c.after is not None]
    outcomes = _check(runnable, args, "proving rewrite rules", lambda **kw: check_rules(all_cases, **kw))
    by_rule: dict[str, list[Any]] = {}
    for o in outcomes:
        by_rule.setdefault(o.case.rule, []).append(o)
    t = Table(title="canonicalization rules")
    for col in ("rule", "instances", "shapes", "proved", "verdict", "seconds"):
        t.add_column(col, no_wrap=col != "instances")
    for rule, outs in by_rule.items():
        statuses = [o.status for o in outs]
        verdict = "refuted" if "refuted" in statuses else ("unknown" if "unknown" in statuses else "proved")
        seconds = sum(o.application.seconds for o in outs if o.application is not None)
        t.add_row(rule, ", ".join(dict.fromkeys(o.case.instance for o in outs)),
                  ", ".join(dict.fromkeys("x".join(map(str, o.case.shape)) for o in outs)),
                  f"{statuses.count('proved')}/{len(outs)}", verdict, f"{seconds:.2f}",
                  style=None if verdict == "proved" else ("bold red" if verdict == "refuted" else "yellow"))
    _console(sys.stdout).print(t)
    for o in outcomes:
        if o.status == "proved":
            continue
        sys.stdout.write(f"\n{o.status.upper()}  {o.case.label}: {o.reason}\n")
        if o.application is not None:
            for ob in o.application.obligations:
                if isinstance(ob.verdict, Refuted):
                    sys.stdout.write(ob.verdict.counterexample.table() + "\n")
    proved = sum(1 for o in outcomes if o.status == "proved")
    sys.stdout.write(f"\n{len(by_rule)} rules, {len(outcomes)} rule proofs: {proved} proved\n")
    if args.json:
        data = {"format": "cuvil-rule-proofs/1",
                "proofs": [{"rule": o.case.rule, "instance": o.case.instance, "shape": list(o.case.shape),
                            "verdict": o.status, "reason": o.reason,
                            "application": o.application.to_json() if o.application is not None else None}
                           for o in outcomes]}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return exit_code([o.status for o in outcomes])


# --------------------------------------------------------------------------------------
# cuvil verify --artifact


def verify_artifact(args: argparse.Namespace) -> int:
    from cuvil.runtime.loader import read_manifest

    library = Path(args.artifact)
    if not library.is_file():
        raise InputError(f"library {library} does not exist", location=str(library),
                         hint="compile one with `cuvil compile MODEL --gate -o libmodel.so`")
    manifest = read_manifest(library)
    problems = artifact_problems(library, manifest)
    if problems:
        sys.stdout.write(f"FAIL  {library}\n" + "".join(f"  - {p}\n" for p in problems))
        return EXIT_REFUTED
    cert = manifest["verification"]
    s = cert["summary"]
    rolled = ", ".join(r.get("pass", "?") for r in cert.get("rollbacks", [])) or "none"
    sys.stdout.write(f"OK  {library}: library hash matches its manifest; certificate ({cert.get('policy', '?')}) "
                     f"covers function {manifest.get('function_hash')} compiled with "
                     f"{', '.join(cert['pipeline'])}\n  {s['obligations']} obligations: {s['proved']} proved, "
                     f"{s['refuted']} refuted, {s['unknown']} unknown; rolled back: {rolled}\n")
    return EXIT_PROVED


# --------------------------------------------------------------------------------------
# cuvil verify --check-certificate


def verify_certificate(args: argparse.Namespace) -> int:
    from verify.audit import check_certificate, load_certificate

    cert, library, manifest = load_certificate(Path(args.check_certificate))
    model = None
    if args.model:
        model = import_model_file(args.model, args.static_input, shape_specs=args.shape)
        if args.shape:
            model = specialize_shapes(model, args.shape)
    bar = _QueryBar(enabled=not args.quiet, solver=args.solver)
    try:
        audit = check_certificate(cert, solver=args.solver, timeout=args.timeout, model=model, library=library,
                                  manifest=manifest, progress=bar.advance)
    finally:
        bar.stop()
    head = "OK  " if audit.ok else "FAIL"
    sys.stdout.write(f"{head}  {args.check_certificate}: {audit.unsat} of {audit.queries} queries answered unsat by "
                     f"{audit.solver} ({audit.seconds:.1f} s); digest, axioms"
                     f"{', model hashes' if model is not None else ''}{', library binding' if library else ''} "
                     f"{'checked' if audit.ok else 'checked with problems'}\n")
    for note in audit.notes:
        sys.stdout.write(f"  note: {note}\n")
    for problem in audit.problems:
        sys.stdout.write(f"  - {problem}\n")
    return EXIT_PROVED if audit.ok else EXIT_REFUTED


class _QueryBar:
    """Progress over the queries of a certificate, on stderr."""

    def __init__(self, enabled: bool, solver: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(f"re-checking queries with {solver}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                                 disable=not enabled)
        self.task: Any = None

    def advance(self, k: int, total: int) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("queries", total=total)
        self.progress.update(self.task, completed=k + 1)

    def stop(self) -> None:
        if self.task is not None:
            self.progress.stop()


# --------------------------------------------------------------------------------------
# registration


def cmd_verify(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {args.jobs}", location="--jobs")
    check_seconds(args.timeout, "--timeout")
    for flag, value in (("--json", args.json), ("--sarif", args.sarif), ("--html", args.html)):
        check_output(value, flag)
    args.jobs = args.jobs or os.cpu_count() or 1
    if args.check_certificate:
        if args.rules or args.artifact:
            raise InputError("--check-certificate takes a certificate (and optionally the MODEL it covers), not "
                             "--rules or --artifact", location="--check-certificate")
        return verify_certificate(args)
    chosen = [name for name, on in (("MODEL", args.model), ("--rules", args.rules), ("--artifact", args.artifact))
              if on]
    if len(chosen) != 1:
        raise InputError("give exactly one of MODEL, --rules or --artifact LIB.so" +
                         (f" (got {', '.join(chosen)})" if chosen else ""), location="cuvil verify",
                         hint="cuvil verify model.onnx -O3 | cuvil verify --rules | cuvil verify --artifact libm.so")
    if args.rules:
        return verify_rules(args)
    if args.artifact:
        return verify_artifact(args)
    return verify_model(args)


def register(sub: Any) -> None:
    """Add ``verify`` to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("verify", help="prove every pass application on a model (or the rewrite rules, or an "
                                      "artifact's certificate)", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="a model: .onnx, .pt2 or .cir")
    p.add_argument("-O", dest="opt_level", choices=("0", "1", "2", "3"), default=None, metavar="LEVEL",
                   help="the opt level's pipeline: -O0 .. -O3 (default -O3)")
    p.add_argument("-p", "--passes", metavar="PIPELINE", help="a pipeline instead (e.g. 'canonicalize,O2,my-pass')")
    add_plugin_arguments(p)
    p.add_argument("--json", metavar="FILE", help="write the certificate as JSON")
    p.add_argument("--sarif", metavar="FILE", help="write the obligations as SARIF 2.1.0")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds per proof attempt (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes for the obligations (default: the CPU count; 1: in this process)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=2x3",
                   help="verify at these input shapes instead of the symbolic ones; repeatable")
    p.add_argument("--seed", type=int, default=0, help="seed of the counterexample search")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="bind a graph input to a compile-time value; repeatable")
    p.add_argument("--rules", action="store_true", help="prove every canonicalization rule at several shapes")
    p.add_argument("--check-certificate", metavar="CERT", default=None,
                   help="re-check a certificate (a JSON file, or a library whose manifest embeds one): its digest, "
                        "every query with --solver, its axioms; with MODEL also the model's hashes")
    p.add_argument("--solver", choices=("z3", "cvc5"), default="z3",
                   help="the solver --check-certificate re-runs the queries with (default z3)")
    p.add_argument("--artifact", metavar="LIB.so",
                   help="check a compiled library against its manifest and embedded certificate")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=cmd_verify)
