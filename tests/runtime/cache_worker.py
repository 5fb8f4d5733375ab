"""Compile the shared test model in a fresh process and print what happened as JSON.

usage: python cache_worker.py SYNC_DIR ROLE [N]
  solo      compile once
  leader    compile; inside the build, wait until the follower has started compiling too
  follower  start compiling once the leader is building (so it must wait for the leader's lock)
  racer     wait until N racers are ready, then all compile at once
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def main() -> None:
    sync, role = Path(sys.argv[1]), sys.argv[2]
    start = time.perf_counter()
    import numpy as np
    from runtime_models import scaled_softmax, softmax_module

    import cuvil.compiler as compiler
    import cuvil.compiler.job as compile_job

    import_s = time.perf_counter() - start
    builds: list[float] = []
    real_build = compile_job.build_library

    def counting_build(*args, **kwargs):
        builds.append(time.perf_counter())
        if role == "leader":
            (sync / "building").touch()
            wait_for((sync / "follower-started").exists, "the follower")
            time.sleep(0.5)  # the follower is now blocked on the lock
        return real_build(*args, **kwargs)

    compile_job.build_library = counting_build
    if role == "follower":
        wait_for((sync / "building").exists, "the leader")
        (sync / "follower-started").touch()
    elif role == "racer":
        (sync / f"ready-{sys.argv[4] if len(sys.argv) > 4 else id(sync)}").touch()
        wait_for(lambda: len(list(sync.glob("ready-*"))) >= int(sys.argv[3]), "the other racers")

    module = softmax_module()
    t0 = time.perf_counter()
    model = compiler.compile(module)
    compile_s = time.perf_counter() - t0
    x = np.linspace(-2.0, 2.0, 32, dtype=np.float32).reshape(4, 8)
    ok = bool(np.allclose(model(x), scaled_softmax(x), rtol=1e-5, atol=1e-7))
    print(json.dumps({"role": role, "built": len(builds), "cache": model.cache_info["cache"],
                      "waited_s": model.cache_info.get("waited_s", 0.0), "compile_s": compile_s,
                      "import_s": import_s, "ok": ok, "library": str(model.library_path),
                      "sources": compiler.toolchain_fingerprint()["sources"]}))


if __name__ == "__main__":
    main()
