"""Keeping numpy's BLAS to one thread while the merge screen runs its own threads.

The screen's products are thin (rank ``r`` by a few hundred rows) and run on several threads at once:
OpenBLAS splitting each one over its own spinning threads as well oversubscribes the cores, and on a
busy machine makes a product tens of times slower. OpenBLAS reads its thread count from the
environment once, so it is set through the library itself (found among the loaded shared objects;
any other BLAS is left alone)."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# (set, get) thread-count functions, as the OpenBLAS builds numpy ships or links name them
_THREAD_FUNCTIONS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                     ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
                     ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
                     ("openblas_set_num_threads", "openblas_get_num_threads"))


@dataclass(frozen=True)
class _ThreadCount:
    """The thread-count functions of one loaded OpenBLAS."""

    get: Callable[[], int]
    set: Callable[[int], object]


def _loaded_libraries() -> list[str]:
    """Paths of the OpenBLAS shared objects mapped into this process (none where /proc is absent)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    paths = {line.split(None, 5)[-1].strip() for line in maps.read_text().splitlines() if "openblas" in line.lower()}
    return sorted(p for p in paths if p.startswith("/") and os.path.exists(p))


def _thread_counts() -> list[_ThreadCount]:
    found = []
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1))
        except OSError:
            continue
        names = next(((s, g) for s, g in _THREAD_FUNCTIONS if hasattr(lib, s) and hasattr(lib, g)), None)
        if names is not None:
            setter, getter = getattr(lib, names[0]), getattr(lib, names[1])
            setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
            found.append(_ThreadCount(getter, setter))
    return found


_lock = threading.Lock()
_users = 0
_saved: list[tuple[_ThreadCount, int]] = []


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS on one thread inside the block, for the whole process (nested and concurrent blocks share
    one setting; the last to leave restores the previous count)."""
    global _users
    with _lock:
        if _users == 0:
            _saved[:] = [(count, count.get()) for count in _thread_counts()]
            for count, _ in _saved:
                count.set(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for count, threads in _saved:
                    count.set(threads)
                _saved.clear()

