"""Deep recursion: rule readers and encoders recurse once per op along a chain of values, so a model a
few hundred layers deep outgrows Python's default limit and C stack. Such work runs on a thread with a
large stack and a raised recursion limit; a chain deeper still raises RecursionError, which callers
turn into their own verdict (the verifier: unknown)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

STACK_BYTES = 1 << 30
"""Stack of the worker thread (address space reserved, touched only as deep as the recursion goes)."""

RECURSION_LIMIT = 250_000

_local = threading.local()
_lock = threading.Lock()
_active = [0, 0]  # deep runs in progress, the recursion limit before the first of them


def run_deep(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread whose stack fits deep recursion (directly when already on one)."""
    if getattr(_local, "deep", False):
        return fn()
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        _local.deep = True
        try:
            result.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            error.append(e)

    with _lock:  # the stack size applies to threads created while it is set
        if _active[0] == 0:
            _active[1] = sys.getrecursionlimit()
            sys.setrecursionlimit(max(RECURSION_LIMIT, _active[1]))  # interpreter-wide: restored after
        _active[0] += 1
        previous = threading.stack_size(STACK_BYTES)
        try:
            worker = threading.Thread(target=body, name="cuvil-deep", daemon=True)
            worker.start()
        finally:
            threading.stack_size(previous)
    try:
        worker.join()
    finally:
        with _lock:
            _active[0] -= 1
            if _active[0] == 0:
                sys.setrecursionlimit(_active[1])
    if error:
        raise error[0]
    return result[0]
