"""What a target name means: the host (cross-compiling is not available yet)."""

from __future__ import annotations

from cuvil.codegen.link import HostTarget, host_target
from cuvil.errors import CodegenError

HOST_TARGET_NAMES = ("host", "native")
X86_64_NAMES = ("x86-64", "x86_64", "amd64")


def resolve_target(target: str | None) -> HostTarget:
    """The host target, when ``target`` names it; anything else is refused (no cross-compiling yet)."""
    host = host_target()
    if target is None or target.lower() in HOST_TARGET_NAMES:
        return host
    host_arch, _, rest = host.triple.partition("-")
    wanted = target.lower()
    arch = wanted.split("-")[0] if wanted not in X86_64_NAMES else "x86_64"
    arch = "x86_64" if arch in ("amd64", "x86_64") else arch
    same_os = wanted in X86_64_NAMES or ("linux" in wanted and "linux" in rest)
    if arch == host_arch and same_os:
        return host
    raise CodegenError(f"target {target!r} is not supported yet: this build compiles for the host "
                       f"({host.triple}, CPU {host.cpu})", location="target",
                       hint="omit the target, or pass 'host' / 'x86_64-linux-gnu'; cross-compiling "
                            "(aarch64, wasm32, nvptx64) is not available in this version")
