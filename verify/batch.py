"""Checking many pass applications at once, optionally in worker processes.

The pipeline itself is cheap: it runs once, recording every application that changed the
module (``collect``). The obligations are the expensive part and independent of each other,
so ``check_all`` can spread the applications over forked workers; each application is
checked with the same seed either way, so the verdicts do not depend on the worker count.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from cuvil.ir.module import Module
from cuvil.passes.base import Pass
from verify.obligations import DEFAULT_TIMEOUT, Application, check_application


@dataclass(frozen=True)
class Pending:
    """One pass application still to be checked."""

    pass_: Pass
    before: Module
    after: Module


@dataclass(frozen=True)
class _Accept:
    accept: bool = True


def collect(module: Module, passes: Sequence[Pass]) -> tuple[list[Pending], Module]:
    """Run ``passes`` on ``module`` keeping every application; returns them and the final module."""
    from cuvil.passes.manager import PassManager

    pending: list[Pending] = []

    def record(pass_: Pass, before: Module, after: Module) -> _Accept:
        pending.append(Pending(pass_, before, after))
        return _Accept()

    result = PassManager(list(passes), gate=record).run(module)
    return pending, result.module


# what forked workers read: set just before the pool starts, inherited by every worker
_WORK: list[Pending] = []


def _check_one(k: int, timeout: float, seed: int) -> Application:
    item = _WORK[k]
    return check_application(item.pass_, item.before, item.after, timeout=timeout, seed=seed)


def _fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def check_all(pending: Sequence[Pending], *, timeout: float = DEFAULT_TIMEOUT, seed: int = 0, jobs: int = 1,
              progress: Callable[[int, Application], None] | None = None,
              started: Callable[[], None] | None = None) -> list[Application]:
    """Check every application, in order; ``jobs > 1`` uses that many worker processes.

    ``started`` is called once the workers exist (start any display thread after it, so no
    thread is running when the workers fork); ``progress(k, app)`` after each application."""
    jobs = max(1, min(jobs, len(pending)))
    if jobs == 1 or not _fork_available():
        if started is not None:
            started()
        out = []
        for k, item in enumerate(pending):
            app = check_application(item.pass_, item.before, item.after, timeout=timeout, seed=seed)
            out.append(app)
            if progress is not None:
                progress(k, app)
        return out
    global _WORK
    _WORK = list(pending)
    results: list[Application | None] = [None] * len(pending)
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_check_one, k, timeout, seed): k for k in range(len(pending))}
            if started is not None:
                started()
            for f in as_completed(futures):
                k = futures[f]
                results[k] = f.result()
                if progress is not None:
                    progress(k, results[k])  # type: ignore[arg-type]
    finally:
        _WORK = []
    return [r for r in results if r is not None]
