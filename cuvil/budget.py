"""Budgets for work a model or a plugin can make unbounded: a wall-clock limit for code Cuvil
cannot bound by counting (a user's pass), raised as a coded error."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from cuvil.errors import BudgetError


@contextlib.contextmanager
def wall_time_limit(seconds: float | None, what: str, hint: str | None = None) -> Iterator[None]:
    """Raise :class:`BudgetError` in the block once ``seconds`` have passed (the main thread only:
    signals are delivered there; elsewhere the block runs unbounded). Nested limits keep the
    outer timer's remaining time."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise BudgetError(f"{what} ran past its time limit of {seconds:g} s", location=what,
                          hint=hint or "it may loop forever; raise the limit if it is only slow")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_remaining, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_remaining:
            signal.setitimer(signal.ITIMER_REAL, old_remaining)
