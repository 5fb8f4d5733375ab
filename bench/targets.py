"""Cuvil's wasm32-wasi build of each zoo model against its native build: ``python -m bench.targets``.

Both libraries come from the same optimized CIR; the native one is tuned for this CPU and runs on one
thread, the wasm one runs in wasmtime (Cranelift) in this process, with SIMD128 and no threads. Calls
are interleaved (native, wasm, native, ...) and the figure of merit is the ratio of medians,
``wasm/native``. The first wasm call (which includes nothing but the run: the module is compiled when
it is loaded) is reported apart. aarch64 libraries run under qemu here, so their time says nothing
about an ARM CPU and is not measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import cuvil
from bench.models import ZOO


def measure(name: str, repeat: int) -> dict[str, float | str]:
    zm = ZOO[name]
    proto = zm.to_onnx()
    inputs = zm.example_inputs_numpy()
    native = cuvil.compile(proto, cache=False, threads=1)
    start = time.perf_counter()
    wasm = cuvil.compile(proto, target="wasm32-wasi", cache=False)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    first = wasm.run(inputs)
    first_ms = (time.perf_counter() - start) * 1e3
    err = max(float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
              for a, b in zip(first, native.run(inputs), strict=True))
    times: dict[str, list[float]] = {"native": [], "wasm": []}
    for _ in range(repeat):
        for engine, model in (("native", native), ("wasm", wasm)):
            start = time.perf_counter()
            model.run(inputs)
            times[engine].append((time.perf_counter() - start) * 1e3)
    n, w = (float(np.median(times[k])) for k in ("native", "wasm"))
    return {"model": name, "native_ms": round(n, 3), "wasm_ms": round(w, 3), "wasm/native": round(w / n, 2),
            "wasm_first_ms": round(first_ms, 2), "wasm_compile_and_load_s": round(load_s, 2),
            "max_abs_diff": err}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names (default: all)")
    ap.add_argument("--repeat", type=int, default=10, help="interleaved calls per engine (default 10)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<16}{'native ms':>11}{'wasm ms':>11}{'wasm/native':>13}{'first ms':>11}{'max |diff|':>12}")
    for name in args.models.split(","):
        r = measure(name, args.repeat)
        rows.append(r)
        print(f"{name:<16}{r['native_ms']:>11.3f}{r['wasm_ms']:>11.3f}{r['wasm/native']:>13.2f}"
              f"{r['wasm_first_ms']:>11.2f}{r['max_abs_diff']:>12.3g}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
