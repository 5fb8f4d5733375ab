"""Compare the packages installed in this environment with constraints.txt.

`make test-latest` runs it before the tests, so a failure there comes with the list of packages
whose newest versions differ from the lock.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def locked(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    lock = locked(Path(argv[1] if len(argv) > 1 else "constraints.txt"))
    installed = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    changed = sorted((name, old, installed[name]) for name, old in lock.items()
                     if name in installed and installed[name].split("+")[0] != old.split("+")[0])
    added = sorted(set(installed) - set(lock) - {"cuvil", "pip", "setuptools", "wheel"})
    if not changed and not added:
        print("newest versions: identical to constraints.txt")
        return 0
    print("newest versions that differ from constraints.txt:")
    for name, old, new in changed:
        print(f"  {name:24} {old:>14} -> {new}")
    for name in added:
        print(f"  {name:24} {'(not locked)':>14} -> {installed[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
