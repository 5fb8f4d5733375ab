"""Run ONNX's node conformance cases through ``cuvil.onnx_backend`` and print the tally.

    python -m bench.onnx_conformance [-k SUBSTRING] [--failures] [-j JOBS] [--timeout S]
                                     [--json [FILE]] [--write-expected-failures [FILE]]

Cases run in worker processes, each under a time limit (a case that overruns it is
killed and counted as failed), so no single case can hang the run. The last line
is ``N passed, N failed, N skipped`` so the figure can be tracked.
``--write-expected-failures`` records the failing cases, with a reason category,
in the list the pytest conformance module marks as expected failures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from cuvil.errors import CuvilError

EXPECTED_FAILURES = Path(__file__).resolve().parent.parent / "tests" / "conformance" / "expected_failures.txt"
DEFAULT_TIMEOUT_S = 30.0


@dataclass
class Outcome:
    name: str
    status: str  # passed | failed | skipped
    reason: str = ""
    seconds: float = 0.0

    @property
    def category(self) -> str:
        return reason_category(self.reason) if self.status != "passed" else ""


class CaseTimeout(Exception):
    """A case ran past its time limit."""


def load_cases(substrings: Sequence[str] = ()) -> list[Any]:
    """ONNX's node test cases (built in memory by onnx), optionally filtered by name."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    if substrings:
        cases = [c for c in cases if any(s in c.name for s in substrings)]
    return cases


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after ``seconds`` (a soft limit: it fires between
    Python bytecodes, so the hard limit is the worker process being killed)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(case: Any, timeout: float | None = None) -> Outcome:
    """Prepare the case's model once and check every data set against the expected outputs."""
    from cuvil.onnx_backend import CuvilBackend

    start = time.perf_counter()

    def done(status: str, reason: str = "") -> Outcome:
        return Outcome(case.name, status, reason, time.perf_counter() - start)

    try:
        with time_limit(timeout), np.errstate(all="ignore"):
            sets = [(list(ins), list(outs)) for ins, outs in (case.data_sets or [])]
            if not sets:
                return done("skipped", "no data sets")
            rep = CuvilBackend.prepare(case.model)
            for ins, expected in sets:
                got = rep.run(ins)
                if len(got) != len(expected):
                    return done("failed", f"output count {len(got)} != {len(expected)}")
                for k, (g, e) in enumerate(zip(got, expected, strict=True)):
                    msg = compare(np.asarray(g), _expected_array(e), case.rtol, case.atol)
                    if msg:
                        return done("failed", f"output {k}: {msg}")
    except CaseTimeout as e:
        return done("failed", f"TIMEOUT {e}")
    except CuvilError as e:
        return done("failed", f"{e.code}: {e.message}")
    except MemoryError:
        return done("failed", "CRASH MemoryError")
    except Exception as e:  # a crash is a bug: report it as such
        return done("failed", f"CRASH {type(e).__name__}: {e}")
    return done("passed")


def _expected_array(e: Any) -> np.ndarray:
    if isinstance(e, onnx.TensorProto):
        return numpy_helper.to_array(e)
    return np.asarray(e)


def compare(got: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> str:
    """'' when ``got`` matches ``exp`` (same shape and dtype, values within tolerance)."""
    if got.shape != exp.shape:
        return f"shape {got.shape} != {exp.shape}"
    if exp.dtype == object or got.dtype == object:
        return "object dtype"
    if got.dtype != exp.dtype:
        return f"dtype {got.dtype} != {exp.dtype}"
    if exp.dtype.kind in "biu":
        return "" if np.array_equal(got, exp) else "values differ"
    g, e = got.astype(np.float64), exp.astype(np.float64)
    if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
        with np.errstate(all="ignore"):
            err = np.abs(g - e)
        worst = np.nanmax(err) if err.size and not np.isnan(err).all() else float("nan")
        return f"values differ (max abs err {worst:.3g})"
    return ""


_RANDOM_OPS = {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}


def reason_category(reason: str) -> str:
    """A short, stable grouping of a failure reason (for tallies and the expected-failures list)."""
    if reason.startswith("TIMEOUT"):
        return "timeout"
    if reason.startswith("CRASH"):
        m = re.match(r"CRASH (\w+)", reason)
        return f"crash: {m.group(1) if m else 'unknown'}"
    m = re.match(r"CUVIL-UNSUPPORTED-OP: ONNX op (\S+) is not supported", reason)
    if m:
        op = m.group(1).split("::")[-1]
        if op in _RANDOM_OPS:
            return "non-deterministic op"
        if op.startswith(("Sequence", "Optional")) or op in ("SplitToSequence", "ConcatFromSequence"):
            return "sequence/optional values"
        return f"unsupported op {m.group(1)}"
    if "is not a tensor" in reason:
        return "sequence/optional values"
    if "draws random" in reason:
        return "non-deterministic op"
    m = re.match(r"CUVIL-IR: converting (\S+) failed", reason)
    if m:
        return f"converter error in {m.group(1)}"
    m = re.match(r"CUVIL-IR: (\w+) produced shape", reason)
    if m:
        return f"shape rule mismatch in {m.group(1)}"
    m = re.match(r"CUVIL-UNSUPPORTED-OP: element type (\S+) is not supported", reason)
    if m:
        return "unsupported element type"
    if reason.startswith("CUVIL-DYNAMIC-INPUT"):
        return "dynamic input"
    m = re.match(r"(CUVIL-[A-Z0-9-]+)", reason)
    if m:
        return {"CUVIL-UNSUPPORTED-OP": "unsupported variant", "CUVIL-OPSET": "unsupported opset",
                "CUVIL-SHAPE": "shape error", "CUVIL-IR": "converter error"}.get(m.group(1), m.group(1).lower())
    if re.match(r"output \d+: values differ", reason):
        return "wrong values"
    if re.match(r"output \d+: (shape|dtype)", reason) or reason.startswith("output count"):
        return "wrong shape or dtype"
    if reason == "no data sets":
        return "no data"
    return "other"


# --------------------------------------------------------------------------------------
# running cases in worker processes

_CASES: list[Any] = []


def _worker(conn: Connection, timeout: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            idx = conn.recv()
        except EOFError:
            return
        if idx is None:
            return
        conn.send(run_case(_CASES[idx], timeout))


class _Slot:
    """One worker process and the case it is running."""

    def __init__(self, ctx: Any, timeout: float) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, timeout), daemon=True)
        self.proc.start()
        child.close()
        self.case: int | None = None
        self.started = 0.0

    def give(self, idx: int) -> None:
        self.case, self.started = idx, time.monotonic()
        self.conn.send(idx)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def run_cases(cases: list[Any], jobs: int = 1, timeout: float = DEFAULT_TIMEOUT_S,
              progress: bool = False) -> list[Outcome]:
    """Run every case in ``jobs`` forked workers; a worker that overruns the time limit (plus grace)
    or dies is replaced and its case recorded as failed."""
    global _CASES
    _CASES = cases
    ctx = mp.get_context("fork")
    hard = timeout + max(5.0, timeout * 0.2)
    results: dict[int, Outcome] = {}
    todo = collections.deque(range(len(cases)))
    slots = [_Slot(ctx, timeout) for _ in range(max(1, min(jobs, len(cases))))]
    try:
        for s in slots:
            if todo:
                s.give(todo.popleft())
        while len(results) < len(cases):
            busy = [s for s in slots if s.case is not None]
            ready = wait([s.conn for s in busy], timeout=1.0)
            now = time.monotonic()
            for k, s in enumerate(slots):
                if s.case is None:
                    continue
                outcome = None
                if s.conn in ready:
                    try:
                        outcome = s.conn.recv()
                    except (EOFError, OSError):
                        code = s.proc.exitcode
                        outcome = Outcome(cases[s.case].name, "failed", f"CRASH WorkerDied: exit code {code}",
                                          now - s.started)
                elif now - s.started > hard:
                    outcome = Outcome(cases[s.case].name, "failed", f"TIMEOUT killed after {hard:g} s",
                                      now - s.started)
                if outcome is None:
                    continue
                results[s.case] = outcome
                if progress:
                    print(f"[{len(results)}/{len(cases)}] {outcome.status:7} {outcome.name}", file=sys.stderr)
                if outcome.reason.startswith(("CRASH WorkerDied", "TIMEOUT killed")):
                    s.stop()
                    s = slots[k] = _Slot(ctx, timeout)
                s.case = None
                if todo:
                    s.give(todo.popleft())
    finally:
        for s in slots:
            with contextlib.suppress(Exception):
                if s.proc.is_alive() and s.case is None:
                    s.conn.send(None)
            s.stop()
    return [results[i] for i in range(len(cases))]


# --------------------------------------------------------------------------------------
# the expected-failures list


def read_expected_failures(path: Path = EXPECTED_FAILURES) -> dict[str, str]:
    """``{case name: reason category}`` from the list (``name  # category`` per line)."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        out[name.strip()] = reason.strip()
    return out


def write_expected_failures(outcomes: Sequence[Outcome], path: Path, keep: dict[str, str] | None = None) -> int:
    """Write the failing cases (merged over ``keep``, the entries of cases that were not run)."""
    entries = dict(keep or {})
    for o in outcomes:
        entries.pop(o.name, None)
        if o.status == "failed":
            entries[o.name] = o.category
    width = max((len(n) for n in entries), default=0)
    header = ("# ONNX node conformance cases that are expected to fail, with a reason category.\n"
              "# Generated by `python -m bench.onnx_conformance --write-expected-failures`; do not edit by hand.\n")
    body = "".join(f"{n.ljust(width)}  # {entries[n]}\n" for n in sorted(entries))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + body)
    return len(entries)


# --------------------------------------------------------------------------------------


def summary(outcomes: Sequence[Outcome], seconds: float) -> dict[str, Any]:
    tally = collections.Counter(o.status for o in outcomes)
    cats = collections.Counter(o.category for o in outcomes if o.status == "failed")
    return {"total": len(outcomes), "passed": tally["passed"], "failed": tally["failed"],
            "skipped": tally["skipped"], "seconds": round(seconds, 2),
            "categories": dict(cats.most_common()),
            "cases": [asdict(o) | {"category": o.category, "seconds": round(o.seconds, 4)} for o in outcomes]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="only cases whose name contains this (repeatable)")
    ap.add_argument("--failures", action="store_true", help="list every failing case with its reason")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per-case time limit in seconds (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="write a JSON summary with per-case outcomes to FILE (stdout without FILE)")
    ap.add_argument("--write-expected-failures", nargs="?", const=str(EXPECTED_FAILURES), metavar="FILE",
                    help="record the failing cases in FILE (default: the pytest module's list); with -k, "
                         "only the selected cases' entries change")
    ap.add_argument("--progress", action="store_true", help="print each case as it finishes (stderr)")
    ap.add_argument("--slowest", type=int, default=0, metavar="N", help="print the N slowest cases")
    args = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    start = time.perf_counter()
    cases = load_cases(args.k)
    outcomes = run_cases(cases, jobs=args.jobs, timeout=args.timeout, progress=args.progress)
    seconds = time.perf_counter() - start
    info = summary(outcomes, seconds)
    to_stdout_json = args.json == "-"
    out = sys.stderr if to_stdout_json else sys.stdout

    if args.failures:
        for o in outcomes:
            if o.status != "passed":
                print(f"{o.status.upper():7} {o.name}: {o.reason}", file=out)
    if args.slowest:
        for o in sorted(outcomes, key=lambda o: -o.seconds)[:args.slowest]:
            print(f"  {o.seconds:7.2f} s  {o.name} ({o.status})", file=out)
    print("top failure reasons:", file=out)
    for r, n in list(info["categories"].items())[:20]:
        print(f"  {n:4d}  {r}", file=out)
    if args.write_expected_failures:
        path = Path(args.write_expected_failures)
        keep = read_expected_failures(path) if args.k else {}
        n = write_expected_failures(outcomes, path, keep)
        print(f"wrote {n} expected failures to {path}", file=out)
    if args.json:
        text = json.dumps(info, indent=1)
        if to_stdout_json:
            print(text)
        else:
            Path(args.json).write_text(text)
    print(f"{len(outcomes)} cases in {seconds:.1f} s", file=out)
    print(f"{info['passed']} passed, {info['failed']} failed, {info['skipped']} skipped", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
