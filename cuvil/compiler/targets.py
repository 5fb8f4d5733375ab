"""What a target name means: the host, a cross target (64-bit ARM Linux, WebAssembly + WASI) or CUDA."""

from __future__ import annotations

from cuvil.codegen.target import CROSS_TARGETS, Target, host_target, normalize_arch
from cuvil.errors import CodegenError

HOST_TARGET_NAMES = ("host", "native")
TARGET_NAMES = ("host", "x86_64-linux-gnu", "aarch64-linux-gnu", "wasm32-wasi", "cuda")
CUDA_NAMES = ("cuda", "nvptx64", "nvptx64-nvidia-cuda")


def resolve_target(target: str | None) -> Target:
    """The target ``target`` names: None, ``host`` or the host's own triple give the host (tuned for
    its CPU); ``aarch64-linux-gnu`` (or ``arm64``, ``aarch64``) gives ARMv8-A with NEON; ``wasm32-wasi``
    (or ``wasm32``) gives WebAssembly with SIMD128; ``cuda`` gives PTX for NVIDIA GPUs (sm_75 and newer)."""
    host = host_target()
    if target is None or target.lower() in HOST_TARGET_NAMES:
        return host
    wanted = target.lower()
    if wanted in CUDA_NAMES:
        from cuvil.codegen.gpu.ptx import cuda_target

        return cuda_target()
    parts = wanted.split("-")
    bare = normalize_arch(wanted) in (host.arch, *CROSS_TARGETS)  # an architecture alone: x86-64, arm64
    arch = normalize_arch(wanted if bare else parts[0])
    os_ok = bare or ("wasi" in parts if arch == "wasm32" else "linux" in parts)
    if os_ok and arch == host.arch:
        return host
    if os_ok and arch in CROSS_TARGETS:
        return CROSS_TARGETS[arch]
    raise CodegenError(f"target {target!r} is not supported: this build compiles for the host "
                       f"({host.triple}, CPU {host.cpu}), aarch64 Linux, wasm32-wasi and CUDA", location="target",
                       hint="pass one of " + ", ".join(TARGET_NAMES))
