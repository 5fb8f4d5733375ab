"""The shipped braking example's network builder (``failsafe/examples/make_braking_network.py``), loaded
once for the tests that build variants of it (a wider dip, a planted bug)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "failsafe" / "examples" / "make_braking_network.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_braking_network", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


maker = _load()
