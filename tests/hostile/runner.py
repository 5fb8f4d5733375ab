"""Runs ``cuvil`` command lines each in its own process with a time limit, and classifies what
happened: the exit code, a signal, a hang, a traceback, files written outside the case folder.

Processes are forked from a server that has imported Cuvil once (``forkserver`` with preloaded
modules), so a case costs its own work, not an interpreter start."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PRELOAD = ["numpy", "onnx", "z3", "llvmlite.binding", "cuvil.cli", "cuvil.cli.verify", "cuvil.cli.probe",
           "cuvil.compiler", "cuvil.frontend.onnx_import"]

_CONTEXT: multiprocessing.context.BaseContext | None = None


def _context() -> multiprocessing.context.BaseContext:
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CONTEXT = ctx
    return _CONTEXT


def _child(argv: list[str], cwd: str, env: dict[str, str], close_stdout: bool) -> None:
    """In the forked process: run ``cuvil argv`` with stdout/stderr in the case folder (which is
    on the import path, as ``PYTHONPATH=.`` puts it for a user's pass plugins)."""
    os.chdir(cwd)
    os.environ.update(env)
    sys.path.insert(0, cwd)
    out = os.open(os.path.join(cwd, ".stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(os.path.join(cwd, ".stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(err, 2)
    if close_stdout:
        os.close(1)
    else:
        os.dup2(out, 1)
    code = 99
    try:
        from cuvil.cli import main

        code = int(main(argv))
    except SystemExit as e:  # argparse's own usage errors
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:  # escaped main(): an uncaught error
        import traceback

        traceback.print_exc()
        code = 98
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


@dataclass
class Outcome:
    """What one command line did."""

    code: int | None
    signal: int | None = None
    hung: bool = False
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    stray_files: list[str] = field(default_factory=list)

    @property
    def category(self) -> str:
        if self.hung:
            return "hang"
        if self.signal is not None:
            return f"signal {self.signal}"
        if "Traceback (most recent call last)" in self.stderr or self.code in (70, 98, 99):
            return "uncoded error"
        return {0: "ok", 1: "check failed", 2: "coded error", 3: "undecided"}.get(self.code, f"exit {self.code}")


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_case(argv: list[str], cwd: Path, *, limit: float = 60.0, close_stdout: bool = False,
             watch: Path | None = None, allowed: tuple[str, ...] = ("out",)) -> Outcome:
    """``cuvil argv`` in ``cwd``; ``watch``: a folder in which nothing may appear outside ``cwd/allowed``
    (and outside the case folder itself)."""
    env = {"CUVIL_CACHE_DIR": str(cwd / "cache"), "HOME": str(cwd), "TMPDIR": str(cwd / "tmp")}
    (cwd / "tmp").mkdir(exist_ok=True)
    before = _listing(watch) if watch is not None else set()
    start = time.perf_counter()
    proc = _context().Process(target=_child, args=(list(argv), str(cwd), env, close_stdout))
    proc.start()
    proc.join(limit)
    hung = proc.is_alive()
    if hung:
        proc.kill()
        proc.join()
    code = proc.exitcode
    outcome = Outcome(code=None if hung or (code is not None and code < 0) else code,
                      signal=-code if code is not None and code < 0 and not hung else None, hung=hung,
                      seconds=time.perf_counter() - start)
    for name, attr in ((".stdout", "stdout"), (".stderr", "stderr")):
        f = cwd / name
        if f.exists():
            setattr(outcome, attr, f.read_text(errors="replace"))
    if watch is not None:
        new = _listing(watch) - before
        case = str(cwd.relative_to(watch)) if cwd.is_relative_to(watch) else None
        outcome.stray_files = sorted(p for p in new if case is None or not p.startswith(case))
    return outcome
