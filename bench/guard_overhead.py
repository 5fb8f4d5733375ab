"""What the fail-safe guard costs per call: a small MLP compiled twice, without and with a policy's
guard (its input in a box, its output finite), then timed in interleaved rounds so drift in clock
speed or load hits both alike. Two paths: the library's ``run_checked`` called through ctypes with
ready descriptors (what a C consumer pays), and ``CompiledModel.__call__`` (what Python pays).
The figure is the median over rounds of the per-call difference; the target is at most 1 µs.

    python -m bench.guard_overhead [--inputs 256] [--rounds 41] [--calls 2000] [--check]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.compiler import compile as compile_model
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.runtime.loader import CompiledModel, CTensor
from failsafe.policy import FORMAT, digest_of

TARGET_NS = 1000.0
BOX = (-4.0, 4.0)


def mlp(inputs: int, hidden: int = 64, outputs: int = 16, seed: int = 0) -> Module:
    """x: f32[1, inputs] -> relu(x W1 + b1) W2 + b2."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, inputs])
    w1 = b.const((rng.standard_normal((inputs, hidden)) / np.sqrt(inputs)).astype(np.float32))
    w2 = b.const((rng.standard_normal((hidden, outputs)) / np.sqrt(hidden)).astype(np.float32))
    h = b.relu(b.add(b.matmul(x, w1), b.const(np.zeros(hidden, np.float32))))
    y = b.add(b.matmul(h, w2), b.const(np.zeros(outputs, np.float32)))
    return b.module(b.function("mlp", [x], [y], ["y"]))


def policy(box: tuple[float, float] = BOX) -> dict[str, Any]:
    """A one-mode policy whose guard boxes the MLP's input and names both guard faults."""
    doc: dict[str, Any] = {
        "format": FORMAT, "spec": {"name": "bench", "digest": "", "source": ""},
        "state": {"x": {"lo": box[0], "hi": box[1], "unit": ""}},
        "faults": [{"name": "input_box", "kind": "input-box"}, {"name": "output_nan", "kind": "non-finite"}],
        "modes": ["nominal"],
        "table": [{"scenario": "none", "faults": [], "mode": "nominal", "parameters": {}, "verdict": "proved"}],
        "unrealizable": [],
        "guard": {"inputs": {"x": list(box)}, "input_fault": "input_box", "output_fault": "output_nan"},
    }
    doc["digest"] = digest_of(doc)
    return doc


class NativeCall:
    """``run_checked`` of a compiled library called through ctypes with descriptors made once."""

    def __init__(self, model: CompiledModel, x: np.ndarray, y: np.ndarray) -> None:
        manifest = model.manifest
        assert manifest is not None and model.library_path is not None
        self.lib = ctypes.CDLL(str(model.library_path))
        prefix = manifest["symbol_prefix"]
        self.fn = getattr(self.lib, f"{prefix}_run_checked")
        self.fn.restype = ctypes.c_int32
        self.fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.c_int64, ctypes.POINTER(CTensor),
                            ctypes.c_int64]
        create = getattr(self.lib, f"{prefix}_create")
        create.restype = ctypes.c_void_p
        self.destroy = getattr(self.lib, f"{prefix}_destroy")
        self.destroy.argtypes = [ctypes.c_void_p]
        self.ctx = create()
        self.x, self.y = x, np.empty_like(y)
        self.shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in (self.x, self.y)]
        code = abi.DTYPE_CODES[DType.f32]
        self.tin, self.tout = ((CTensor * 1)(CTensor(a.ctypes.data, ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)),
                                                     a.ndim, code))
                               for a, s in zip((self.x, self.y), self.shapes, strict=True))

    def __call__(self) -> int:
        return self.fn(self.ctx, self.tin, 1, self.tout, 1)

    def close(self) -> None:
        self.destroy(self.ctx)


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def interleaved(plain: Callable[[], Any], guarded: Callable[[], Any], rounds: int, calls: int) -> dict[str, float]:
    """Median per-call times and the median of the per-round differences, the order alternating by round."""
    diffs, times_plain, times_guarded = [], [], []
    for r in range(rounds):
        if r % 2:
            g, p = per_call_ns(guarded, calls), per_call_ns(plain, calls)
        else:
            p, g = per_call_ns(plain, calls), per_call_ns(guarded, calls)
        times_plain.append(p)
        times_guarded.append(g)
        diffs.append(g - p)
    return {"plain_ns": statistics.median(times_plain), "guarded_ns": statistics.median(times_guarded),
            "overhead_ns": statistics.median(diffs)}


def measure(inputs: int, rounds: int, calls: int, out_dir: Path) -> dict[str, Any]:
    module = mlp(inputs)
    plain = compile_model(module, output_dir=out_dir / "plain", threads=1, cache=False)
    guarded = compile_model(module, output_dir=out_dir / "guarded", threads=1, cache=False, failsafe=policy())
    x = np.random.default_rng(1).uniform(BOX[0], BOX[1], (1, inputs)).astype(np.float32)
    y = plain(x)
    if not np.array_equal(y, guarded(x)):
        raise SystemExit("the guarded library's outputs differ from the plain one's")
    native_plain, native_guarded = NativeCall(plain, x, y), NativeCall(guarded, x, y)
    try:
        if native_plain() != abi.OK or native_guarded() != abi.OK:
            raise SystemExit("a library refused in-box inputs")
        for fn in (native_plain, native_guarded, lambda: plain(x), lambda: guarded(x)):
            per_call_ns(fn, calls)  # warm-up
        native = interleaved(native_plain, native_guarded, rounds, calls)
        python = interleaved(lambda: plain(x), lambda: guarded(x), rounds, max(calls // 10, 1))
    finally:
        native_plain.close()
        native_guarded.close()
    return {"model": f"mlp f32[1, {inputs}] -> 64 -> 16", "input_elements": inputs, "rounds": rounds,
            "calls_per_round": calls, "native": native, "python": python, "target_ns": TARGET_NS,
            "within_target": native["overhead_ns"] <= TARGET_NS}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.guard_overhead",
                                description="What the fail-safe guard costs per call.")
    p.add_argument("--inputs", type=int, default=256, help="input elements of the MLP (default 256)")
    p.add_argument("--rounds", type=int, default=41, help="interleaved rounds (default 41)")
    p.add_argument("--calls", type=int, default=2000, help="native calls per round (Python calls: a tenth)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--check", action="store_true", help="exit 1 when the native overhead is above the target")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cuvil-guard-bench-") as tmp:
        result = measure(args.inputs, args.rounds, args.calls, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['model']}: {args.rounds} interleaved rounds")
        for path in ("native", "python"):
            r = result[path]
            print(f"  {path:<7} plain {r['plain_ns'] / 1e3:8.3f} µs  guarded {r['guarded_ns'] / 1e3:8.3f} µs  "
                  f"overhead {r['overhead_ns']:+8.1f} ns/call")
        print(f"  target  <= {TARGET_NS:.0f} ns/call (native): {'met' if result['within_target'] else 'NOT met'}")
    return 1 if args.check and not result["within_target"] else 0


if __name__ == "__main__":
    sys.exit(main())
