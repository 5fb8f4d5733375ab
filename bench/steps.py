"""``python -m bench.steps``: where each engine spends a zoo model's time, op by op.

Cuvil runs a library compiled with per-step profiling (``compile(..., profile=True)``: the monotonic clock
around each op, counted inside the library); ONNX Runtime runs the same ONNX model with its own profiler on
(each node's kernel time). The two run interleaved, a call each in turn, as in ``python -m bench``, so each
finds its caches as the other left them. Printed in run order, side by side: each engine's steps that took
time, with the milliseconds a run; rows pair by position only (the engines fuse differently: Cuvil's
steps are its fused ops, ONNX Runtime's its graph's nodes after its own fusions), so read them as two lists.
The totals are each engine's time in its ops, without the call's overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.harness import ort_options, passive_torch_workers, round_order
from bench.models import ZOO


def _ort_session(onnx_model: Any, threads: int, prefix: str) -> Any:
    import onnxruntime as ort

    so = ort_options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = prefix
    return ort.InferenceSession(onnx_model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort_nodes(session: Any, skip: int) -> list[tuple[str, float]]:
    """Each node's mean kernel time (ms) over the profiled runs after the first ``skip``, in run order."""
    path = session.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    times: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            times.setdefault(e["name"].removesuffix("_kernel_time"), []).append(e["dur"] / 1e3)
    return [(name, float(np.mean(ts[skip:] or ts))) for name, ts in times.items()]


def measure(name: str, threads: int, repeat: int, warmup: int = 10, frontend: str = "torch") -> dict[str, Any]:
    """``frontend``: what Cuvil compiles, the PyTorch module (as ``python -m bench`` does by default) or the
    ONNX export ONNX Runtime runs (whose decomposed activations may fuse differently)."""
    import cuvil

    zm = ZOO[name]
    proto = zm.to_onnx()
    inputs = zm.example_inputs_numpy()
    if frontend == "torch" and zm.has_torch_reference:
        model = cuvil.compile(zm.build(), example_inputs=zm.example_inputs(), threads=threads, cache=False,
                              profile=True)
    else:
        model = cuvil.compile(proto, threads=threads, cache=False, profile=True)
    with tempfile.TemporaryDirectory(prefix="cuvil-steps-") as tmp:
        session = _ort_session(proto, threads, os.path.join(tmp, "ort"))
        feed = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
        for _ in range(warmup):
            model(*inputs)
            session.run(None, feed)
        model.profile(reset=True)
        for k in range(repeat):
            for engine in round_order(((model, None), (None, session)), k):
                if engine[0] is not None:
                    model(*inputs)
                else:
                    session.run(None, feed)
        nodes = _ort_nodes(session, warmup)
    profile = model.profile()
    steps = [(f"{s.kernel} {s.type}", profile.per_run_ms(s)) for s in profile.steps if s.total_ns > 0]
    return {"model": name, "threads": threads, "frontend": frontend, "runs": profile.runs, "cuvil": steps, "ort": nodes,
            "cuvil_ms": sum(ms for _, ms in steps), "ort_ms": sum(ms for _, ms in nodes)}


def render(result: dict[str, Any]) -> str:
    cv, ox = result["cuvil"], result["ort"]
    lines = [f"{result['model']} (Cuvil from {result['frontend']}), {result['threads']} thread(s), "
             f"{result['runs']} interleaved runs: Cuvil "
             f"{result['cuvil_ms']:.3f} ms in its ops, ONNX Runtime {result['ort_ms']:.3f} ms in its nodes "
             f"({result['cuvil_ms'] / max(result['ort_ms'], 1e-9):.2f}x)",
             f"{'cuvil step':<52}{'ms':>8}   {'onnxruntime node':<52}{'ms':>8}"]
    for k in range(max(len(cv), len(ox))):
        left = cv[k] if k < len(cv) else ("", None)
        right = ox[k] if k < len(ox) else ("", None)
        lms = f"{left[1]:8.3f}" if left[1] is not None else " " * 8
        rms = f"{right[1]:8.3f}" if right[1] is not None else " " * 8
        lines.append(f"{left[0][:51]:<52}{lms}   {right[0][-51:]:<52}{rms}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18,mobilenet_v1", help="comma-separated zoo names")
    ap.add_argument("--threads", type=int, default=1, help="threads of both engines (default 1)")
    ap.add_argument("--repeat", type=int, default=60, help="interleaved runs of each engine (default 60)")
    ap.add_argument("--frontend", choices=("torch", "onnx"), default="torch",
                    help="what Cuvil compiles: the PyTorch module, as python -m bench does (default), or the "
                         "ONNX export that ONNX Runtime runs")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repeat < 1:
        ap.error("--threads and --repeat must be at least 1")
    passive_torch_workers(args.threads)
    unknown = [m for m in args.models.split(",") if m not in ZOO]
    if unknown:
        ap.error(f"unknown models {unknown}; the zoo has {', '.join(ZOO)}")
    results = []
    for name in args.models.split(","):
        result = measure(name, args.threads, args.repeat, frontend=args.frontend)
        results.append(result)
        print(render(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
