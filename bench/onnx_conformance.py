"""Run ONNX's node conformance cases through ``cuvil.onnx_backend`` and print the tally.

    python -m bench.onnx_conformance [--mode compiled|interpreter] [-k SUBSTRING] [--failures]
                                     [-j JOBS] [--timeout S] [--opt-level N] [--passes P] [--target T]
                                     [--cache-dir DIR] [--json [FILE]] [--write-expected-failures [FILE]]

``--mode compiled`` (the default) compiles every case's model with ``cuvil.compile`` and
checks the native library's outputs; it also runs the interpreter on the same module and
counts the cases where compiled and interpreted outputs disagree (floats beyond the
dtype's relative tolerance, integers and bools at all) as *mismatches*, separately from
the pass/fail tally against ONNX's expected outputs. ``--mode interpreter`` runs the
reference interpreter only.

Compiled mode uses CIR pipeline ``O0`` by default (every node is lowered by the code
generator: no pass folds a computation into a constant the interpreter computed, and no
fusion merges nodes) and LLVM ``-O1`` (the scalar optimizations that act on the IR's
no-wrap and fast-math flags run; the vectorizer and unroller, which only change speed and
the order of reassociable sums, stay off: they make the largest cases compile 2-3x slower).
``--passes O3 --opt-level 3`` measures what ``cuvil.compile``'s defaults produce. Compiles go
to a per-run cache folder (``--cache-dir`` keeps one across runs). ``--target aarch64-linux-gnu``
compiles every case for 64-bit ARM and runs it under ``qemu-aarch64``.

Cases run in worker processes, each under a time limit (a case that overruns it is
killed and counted as failed), so no single case can hang the run. The last line
is ``N passed, N failed, N skipped`` so the figure can be tracked.
``--write-expected-failures`` records the failing cases, with a reason category,
in the list the pytest conformance module marks as expected failures (in compiled
mode: the cases that fail or mismatch compiled and are not in the interpreter's list).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from cuvil.errors import CuvilError

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "conformance"
EXPECTED_FAILURES = CONFORMANCE_DIR / "expected_failures.txt"
EXPECTED_COMPILED_FAILURES = CONFORMANCE_DIR / "expected_failures_compiled.txt"
DEFAULT_TIMEOUT_S = 30.0
MODES = ("compiled", "interpreter")
# compiled mode's defaults: no CIR passes, so each node is lowered from its own rule and nothing
# is folded into a constant by the interpreter; LLVM -O1 (see the module docstring)
DEFAULT_COMPILE_OPTIONS: dict[str, Any] = {"opt_level": 1, "passes": "O0"}
# compiled vs interpreter: relative tolerance per float dtype (integers and bools must be equal)
INTERPRETER_RTOL = {"float64": 1e-5, "float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


@dataclass
class Outcome:
    name: str
    status: str  # passed | failed | skipped
    reason: str = ""
    seconds: float = 0.0
    mismatch: str = ""  # compiled mode: how the compiled outputs differ from the interpreter's ("" if they agree)

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


def run_case(case: Any, timeout: float | None = None, mode: str = "interpreter",
             compile_options: dict[str, Any] | None = None) -> Outcome:
    """Prepare the case's model once and check every data set against the expected outputs
    (in compiled mode, also against the interpreter's outputs: ``Outcome.mismatch``)."""
    from cuvil.onnx_backend import CuvilBackend

    start = time.perf_counter()
    mismatch = ""

    def done(status: str, reason: str = "") -> Outcome:
        return Outcome(case.name, status, reason, time.perf_counter() - start, mismatch)

    options = dict(DEFAULT_COMPILE_OPTIONS if compile_options is None else compile_options)
    try:
        with time_limit(timeout), np.errstate(all="ignore"):
            sets = [(list(ins), list(outs)) for ins, outs in (case.data_sets or [])]
            if not sets:
                return done("skipped", "no data sets")
            rep = CuvilBackend.prepare(case.model, mode=mode, **(options if mode == "compiled" else {}))
            for ins, expected in sets:
                got = rep.run(ins)
                if rep.mode == "compiled" and not mismatch:
                    mismatch = interpreter_mismatch(rep, ins, got)
                if len(got) != len(expected):
                    return done("failed", f"output count {len(got)} != {len(expected)}")
                for k, (g, e) in enumerate(zip(got, expected, strict=True)):
                    msg = compare_structured(g, e, lambda a, b: compare(a, _expected_array(b), case.rtol, case.atol))
                    if msg:
                        where = f" [{np.asarray(g).dtype}]" if rep.mode == "compiled" and g is not None else ""
                        return done("failed", f"output {k}: {msg}{where}")
    except CaseTimeout as e:
        return done("failed", f"TIMEOUT {e}")
    except CuvilError as e:
        return done("failed", f"{e.code}: {e.message}")
    except MemoryError:
        return done("failed", "CRASH MemoryError")
    except Exception as e:  # a crash is a bug: report it as such
        return done("failed", f"CRASH {type(e).__name__}: {e}")
    return done("passed")


def interpreter_mismatch(rep: Any, ins: Sequence[Any], got: Sequence[Any]) -> str:
    """'' when the compiled outputs ``got`` agree with the interpreter's on the same module."""
    try:
        want = rep.run_reference(ins)
    except CuvilError as e:
        return f"interpreter raised {e.code}: {e.message}"
    if len(want) != len(got):
        return f"output count {len(got)} != {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        msg = compare_structured(g, w, lambda a, b: compare_exact(a, np.asarray(b)))
        if msg:
            return f"output {k}: {msg}"
    return ""


def compare_structured(got: Any, want: Any, compare_arrays: Callable[[np.ndarray, Any], str]) -> str:
    """'' when ``got`` matches ``want`` where outputs may be sequences (lists, compared element by
    element) or empty optionals (None) as well as tensors."""
    if want is None or got is None:
        return "" if want is None and got is None else f"{'None' if got is None else 'a value'} where " \
                                                       f"{'None' if want is None else 'a value'} is expected"
    if isinstance(want, list) or isinstance(got, list):
        if not (isinstance(want, list) and isinstance(got, list)):
            return "a sequence and a tensor"
        if len(got) != len(want):
            return f"a sequence of {len(got)} tensors, {len(want)} expected"
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            msg = compare_arrays(np.asarray(g), w)
            if msg:
                return f"element {k}: {msg}"
        return ""
    return compare_arrays(np.asarray(got), want)


def compare_exact(got: np.ndarray, want: np.ndarray) -> str:
    """'' when ``got`` equals ``want``: integers and bools exactly; floats within the dtype's relative
    tolerance (``INTERPRETER_RTOL``), with NaN and infinities at the same positions. Sums may be
    reassociated (their order is not part of an op's meaning), so an element whose value cancelled
    is measured against a tenth of the tolerance times the output's largest magnitude."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{got.shape} != interpreter {want.dtype}{want.shape}"
    if want.dtype.kind == "V" and want.dtype.itemsize == 1:  # narrow storage types: bit for bit (NaN too)
        got, want = got.view(np.uint8), want.view(np.uint8)
    if want.dtype.kind not in "fc" and want.dtype.name not in INTERPRETER_RTOL:
        if np.array_equal(got, want):
            return ""
        bad = int(np.count_nonzero(got != want))
        return f"{bad} of {want.size} elements differ from the interpreter"
    rtol = INTERPRETER_RTOL.get(want.dtype.name, 1e-5)
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.abs(w[np.isfinite(w)])
    atol = rtol * 0.1 * float(finite.max()) if finite.size else 0.0
    with np.errstate(all="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= rtol * np.abs(w) + atol)
    if same.all():
        return ""
    with np.errstate(all="ignore"):
        rel = np.abs(g - w) / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
    worst = float(np.nanmax(np.where(same, 0.0, rel)))
    return f"{int(np.count_nonzero(~same))} of {want.size} elements differ from the interpreter " \
           f"(max rel err {worst:.3g})"


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
_CODE_CATEGORIES = {"CUVIL-UNSUPPORTED-OP": "unsupported variant", "CUVIL-OPSET": "unsupported opset",
                    "CUVIL-SHAPE": "shape error", "CUVIL-IR": "converter error"}

# (pattern, category) in order; a category is a string formatted with the match's groups, or a
# function of its first group
_Categories = tuple[tuple[str, str | Callable[[str], str]], ...]


def _unsupported_op_category(op: str) -> str:
    name = op.split("::")[-1]
    if name in _RANDOM_OPS:
        return "non-deterministic op"
    if name.startswith(("Sequence", "Optional")) or name in ("SplitToSequence", "ConcatFromSequence"):
        return "sequence/optional values"
    return f"unsupported op {op}"


_REASON_CATEGORIES: _Categories = (
    (r"\ATIMEOUT", "timeout"),
    (r"\ACRASH (\w+)", "crash: {0}"),
    (r"\ACRASH", "crash: unknown"),
    (r"\ACUVIL-UNSUPPORTED-OP: ONNX op (\S+) is not supported", _unsupported_op_category),
    (r"is not a tensor", "sequence/optional values"),
    (r"draws random", "non-deterministic op"),
    (r"\ACUVIL-IR: converting (\S+) failed", "converter error in {0}"),
    (r"\ACUVIL-IR: (\w+) produced shape", "shape rule mismatch in {0}"),
    (r"\ACUVIL-UNSUPPORTED-OP: element type \S+ is not supported", "unsupported element type"),
    (r"\ACUVIL-DYNAMIC-INPUT", "dynamic input"),
    (r"\ACUVIL-CODEGEN: (.*)", lambda message: "codegen: " + _codegen_category(message)),
    (r"\ACUVIL-EVAL", "run-time error"),
    (r"\A(CUVIL-[A-Z0-9-]+)", lambda code: _CODE_CATEGORIES.get(code, code.lower())),
    (r"\Aoutput \d+: values differ", "wrong values"),
    (r"\Aoutput \d+: (?:shape|dtype)|\Aoutput count", "wrong shape or dtype"),
    (r"\Ano data sets\Z", "no data"),
)
_CODEGEN_CATEGORIES: _Categories = (
    (r"element type \S+|dtype \S+ is not supported|float8\w*|float4\w*|u?int[42]\b", "unsupported element type"),
    (r"symbolic", "symbolic shapes"),
    (r"malformed", "malformed LLVM IR"),
    (r"\Aprimitive '(\w+)' is not defined on (\w+)", "primitive {0} on {1}"),
)


def _classify(text: str, categories: _Categories) -> str | None:
    """The category of the first pattern found in ``text``, None when none is."""
    for pattern, category in categories:
        m = re.search(pattern, text)
        if m:
            return category.format(*m.groups()) if isinstance(category, str) else category(m.group(1))
    return None


def reason_category(reason: str) -> str:
    """A short, stable grouping of a failure reason (for tallies and the expected-failures list)."""
    return _classify(reason, _REASON_CATEGORIES) or "other"


def _codegen_category(message: str) -> str:
    return _classify(message, _CODEGEN_CATEGORIES) or re.sub(r"\d+", "N", message.split(":")[0])[:60]


def mismatch_category(mismatch: str) -> str:
    """A short grouping of a compiled-vs-interpreter mismatch."""
    if mismatch.startswith("interpreter raised"):
        return "interpreter error"
    m = re.search(r"(\d+) of (\d+) elements differ.*max rel err ([0-9.e+-]+)", mismatch)
    if m and m.group(1) == m.group(2) == "1":
        return f"a scalar float result differs by {float(m.group(3)):.1g} relative"
    if "elements differ" in mismatch:
        return "values differ from the interpreter"
    return "shape or dtype differs from the interpreter"


# --------------------------------------------------------------------------------------
# running cases in worker processes

_CASES: list[Any] = []
_RUN: dict[str, Any] = {"mode": "interpreter", "compile_options": None}  # read by the forked workers


def _worker(conn: Connection, timeout: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            idx = conn.recv()
        except EOFError:
            return
        if idx is None:
            return
        conn.send(run_case(_CASES[idx], timeout, **_RUN))


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
              progress: bool = False, mode: str = "interpreter",
              compile_options: dict[str, Any] | None = None) -> list[Outcome]:
    """Run every case in ``jobs`` forked workers; a worker that overruns the time limit (plus grace)
    or dies is replaced and its case recorded as failed."""
    global _CASES
    _CASES = cases
    _RUN.update(mode=mode, compile_options=compile_options)
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


_HALF_CASE = re.compile(r"(bf16|fp16|bfloat16|float16)(_expanded)?$", re.IGNORECASE)


def interpreter_problem(o: Outcome) -> str:
    """Why an interpreter-mode case fails: its category, with the known cause for half-precision
    cases whose reference rounds every step in the half type."""
    if o.category == "wrong values" and _HALF_CASE.search(o.name):
        return ("wrong values: the reference computes in the half type (numpy's pairwise sum); Cuvil's rule "
                "accumulates halves in f32 and rounds once, one half-precision ulp apart")
    return o.category


def compiled_problem(o: Outcome) -> str:
    """Why a compiled-mode outcome is not clean ('' when it passed and agrees with the interpreter)."""
    if o.status == "failed":
        if o.category == "wrong values" and not o.mismatch:
            m = re.search(r"\[(\w+)\]$", o.reason)
            dtype = m.group(1) if m else "float"
            return f"wrong values: {dtype} rounding differs from the interpreter's, within its tolerance"
        return o.category
    if o.mismatch:
        return "mismatch: " + mismatch_category(o.mismatch)
    return ""


def write_expected_failures(outcomes: Sequence[Outcome], path: Path, keep: dict[str, str] | None = None,
                            mode: str = "interpreter", exclude: dict[str, str] | None = None) -> int:
    """Write the failing cases (merged over ``keep``, the entries of cases that were not run). In
    compiled mode the list holds the cases that fail or disagree with the interpreter when compiled,
    less those in ``exclude`` (the interpreter's own expected failures)."""
    entries = dict(keep or {})
    for o in outcomes:
        entries.pop(o.name, None)
        if mode == "compiled":
            problem = compiled_problem(o)
            if problem and o.name not in (exclude or {}):
                entries[o.name] = problem
        elif o.status == "failed":
            entries[o.name] = interpreter_problem(o)
    width = max((len(n) for n in entries), default=0)
    if mode == "compiled":
        header = ("# ONNX node conformance cases that fail (or disagree with the interpreter) only when compiled\n"
                  "# with the LLVM backend, with a reason category; the interpreter's list is expected_failures.txt.\n"
                  "# Generated by `python -m bench.onnx_conformance --mode compiled --write-expected-failures`; "
                  "do not edit by hand.\n")
    else:
        header = ("# ONNX node conformance cases that are expected to fail, with a reason category.\n"
                  "# Generated by `python -m bench.onnx_conformance --mode interpreter --write-expected-failures`; "
                  "do not edit by hand.\n")
    body = "".join(f"{n.ljust(width)}  # {entries[n]}\n" for n in sorted(entries))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + body)
    return len(entries)


# --------------------------------------------------------------------------------------


def summary(outcomes: Sequence[Outcome], seconds: float, mode: str = "interpreter",
            compile_options: dict[str, Any] | None = None) -> dict[str, Any]:
    tally = collections.Counter(o.status for o in outcomes)
    cats = collections.Counter(o.category for o in outcomes if o.status == "failed")
    mism = [o for o in outcomes if o.mismatch]
    info: dict[str, Any] = {"mode": mode, "total": len(outcomes), "passed": tally["passed"],
                            "failed": tally["failed"], "skipped": tally["skipped"], "seconds": round(seconds, 2)}
    if mode == "compiled":
        info["compile_options"] = compile_options
        info["mismatches"] = len(mism)
        info["mismatches_in_passed_cases"] = sum(o.status == "passed" for o in mism)
    info["categories"] = dict(cats.most_common())
    info["cases"] = [asdict(o) | {"category": o.category, "seconds": round(o.seconds, 4)} for o in outcomes]
    return info


def expected_failures_for(mode: str) -> dict[str, str]:
    """What pytest treats as expected in ``mode``: the interpreter's list, plus in compiled mode the
    compiled-only list (``name  # category``)."""
    out = read_expected_failures(EXPECTED_FAILURES)
    if mode == "compiled":
        out.update(read_expected_failures(EXPECTED_COMPILED_FAILURES))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, default="compiled",
                    help="compiled: native code from cuvil.compile, checked against the interpreter too "
                         "(default); interpreter: the reference interpreter only")
    ap.add_argument("-k", action="append", default=[], help="only cases whose name contains this (repeatable)")
    ap.add_argument("--failures", action="store_true",
                    help="list every failing case with its reason (and, compiled, every interpreter mismatch)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per-case time limit in seconds (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--opt-level", type=int, default=DEFAULT_COMPILE_OPTIONS["opt_level"], choices=range(4),
                    help="compiled mode: the LLVM optimization level (default %(default)s)")
    ap.add_argument("--passes", default=DEFAULT_COMPILE_OPTIONS["passes"],
                    help="compiled mode: the CIR pipeline, O0..O3 or pass names (default %(default)s)")
    ap.add_argument("--target", default=None, metavar="TRIPLE",
                    help="compiled mode: the target to compile for (default: this machine; aarch64-linux-gnu "
                         "runs each case under qemu-aarch64)")
    ap.add_argument("--cache-dir", metavar="DIR",
                    help="compiled mode: the artifact cache to use and keep (default: a fresh folder, removed "
                         "after the run)")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="write a JSON summary with per-case outcomes to FILE (stdout without FILE)")
    ap.add_argument("--write-expected-failures", nargs="?", const="", metavar="FILE",
                    help="record the failing cases in FILE (default: the pytest module's list for the mode); "
                         "with -k, only the selected cases' entries change")
    ap.add_argument("--progress", action="store_true", help="print each case as it finishes (stderr)")
    ap.add_argument("--slowest", type=int, default=0, metavar="N", help="print the N slowest cases")
    args = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    options = ({"opt_level": args.opt_level, "passes": args.passes, **({"target": args.target} if args.target else {})}
               if args.mode == "compiled" else None)
    scratch = None
    if args.mode == "compiled":
        if args.cache_dir:
            os.environ["CUVIL_CACHE_DIR"] = str(Path(args.cache_dir).expanduser().resolve())
        else:
            scratch = tempfile.mkdtemp(prefix="cuvil-conformance-")
            os.environ["CUVIL_CACHE_DIR"] = scratch
    start = time.perf_counter()
    try:
        cases = load_cases(args.k)
        outcomes = run_cases(cases, jobs=args.jobs, timeout=args.timeout, progress=args.progress,
                             mode=args.mode, compile_options=options)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - start
    info = summary(outcomes, seconds, args.mode, options)
    to_stdout_json = args.json == "-"
    out = sys.stderr if to_stdout_json else sys.stdout

    if args.failures:
        for o in outcomes:
            if o.status != "passed":
                print(f"{o.status.upper():7} {o.name}: {o.reason}", file=out)
        for o in outcomes:
            if o.mismatch:
                print(f"MISMATCH {o.name} ({o.status}): {o.mismatch}", file=out)
    if args.slowest:
        for o in sorted(outcomes, key=lambda o: -o.seconds)[:args.slowest]:
            print(f"  {o.seconds:7.2f} s  {o.name} ({o.status})", file=out)
    print("top failure reasons:", file=out)
    for r, n in list(info["categories"].items())[:20]:
        print(f"  {n:4d}  {r}", file=out)
    if args.mode == "compiled":
        interp = read_expected_failures(EXPECTED_FAILURES)
        only = collections.Counter(compiled_problem(o) for o in outcomes
                                   if compiled_problem(o) and o.name not in interp)
        print("failing or mismatching only when compiled (not in the interpreter's expected failures):", file=out)
        for r, n in only.most_common():
            print(f"  {n:4d}  {r}", file=out)
    if args.write_expected_failures is not None:
        default = EXPECTED_COMPILED_FAILURES if args.mode == "compiled" else EXPECTED_FAILURES
        path = Path(args.write_expected_failures) if args.write_expected_failures else default
        keep = read_expected_failures(path) if args.k else {}
        n = write_expected_failures(outcomes, path, keep, mode=args.mode,
                                    exclude=read_expected_failures(EXPECTED_FAILURES))
        print(f"wrote {n} expected failures to {path}", file=out)
    if args.json:
        text = json.dumps(info, indent=1)
        if to_stdout_json:
            print(text)
        else:
            Path(args.json).write_text(text)
    where = f"compiled (passes {args.passes}, LLVM -O{args.opt_level})" if args.mode == "compiled" else "interpreter"
    print(f"{len(outcomes)} cases in {seconds:.1f} s, {where}, {args.jobs} worker(s)", file=out)
    if args.mode == "compiled":
        print(f"{info['mismatches']} compiled-vs-interpreter mismatches "
              f"({info['mismatches_in_passed_cases']} in passing cases)", file=out)
    print(f"{info['passed']} passed, {info['failed']} failed, {info['skipped']} skipped", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
