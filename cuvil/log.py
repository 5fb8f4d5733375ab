"""Stage logging: ``cuvil.set_log_level("DEBUG")`` shows each stage with its time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("cuvil")


def set_log_level(level: str | int) -> None:
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("cuvil %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)


@contextmanager
def stage(name: str) -> Iterator[None]:
    start = time.perf_counter()
    logger.debug("%s ...", name)
    yield
    logger.debug("%s done in %.3f s", name, time.perf_counter() - start)
