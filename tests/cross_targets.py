"""What the tests of cross-compiled libraries need: the aarch64 cross C compiler, its sysroot and
qemu-aarch64 (CI installs gcc-aarch64-linux-gnu and qemu-user; without them those tests are skipped
and say why)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

AARCH64 = "aarch64-linux-gnu"
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")


def aarch64_missing() -> str | None:
    """Why aarch64 libraries cannot be built and run here (None when they can)."""
    missing = [what for what, ok in (("aarch64-linux-gnu-gcc", shutil.which("aarch64-linux-gnu-gcc")),
                                     ("qemu-aarch64", shutil.which("qemu-aarch64")),
                                     (str(AARCH64_SYSROOT), AARCH64_SYSROOT.is_dir())) if not ok]
    return ("no " + ", ".join(missing) + " (Debian: gcc-aarch64-linux-gnu, qemu-user)") if missing else None


needs_aarch64 = pytest.mark.skipif(aarch64_missing() is not None, reason=str(aarch64_missing()))


def c_toolchain(target: str | None) -> tuple[str | None, list[str]]:
    """The C compiler for programs of ``target`` (None: the host) and the command prefix that runs them."""
    if target is None:
        return shutil.which("cc"), []
    assert target == AARCH64, target
    return shutil.which("aarch64-linux-gnu-gcc"), [str(shutil.which("qemu-aarch64")), "-L", str(AARCH64_SYSROOT)]


# the C consumer tests run for the host and, where the toolchain is, for aarch64 under qemu
C_TARGETS = [pytest.param(None, id="host"), pytest.param(AARCH64, id="aarch64", marks=needs_aarch64)]
