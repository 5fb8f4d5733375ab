"""A streaming recurrent model over a symbolic sequence length: a two-layer LSTM (64 -> 128 -> 128)
with a linear head, built as ONNX in-process, compiled once by Cuvil (one loop per layer, not
unrolled) and run beside ONNX Runtime at several lengths, interleaved, one thread each. Cuvil runs two
ways: one specialization per length, and one library for the whole shape class (compiled once for
lengths up to the largest, the length read at run time, its O3 pipeline proved by the strict gate).
Reported per length: compile time of that
specialization, median latency of each, the ratios, the shape-class library's time per step (flat
when run time grows linearly), and the largest difference from ONNX Runtime relative to its output
scale.

    python -m bench.streaming [--lengths 16,64,256,1024] [--repeat 30] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.harness import round_order
from cuvil.compiler import compile as compile_model

INPUT, HIDDEN, HEAD = 64, 128, 8


def streaming_lstm(seed: int = 0) -> onnx.ModelProto:
    """x: f32[T, 1, 64] -> LSTM(128) -> LSTM(128) -> MatMul(128 x 8); T is the dim ``T``."""
    rng = np.random.default_rng(seed)

    def weights(prefix: str, inputs: int) -> list[onnx.TensorProto]:
        scale = 1.0 / np.sqrt(HIDDEN)
        return [numpy_helper.from_array((rng.uniform(-scale, scale, shape)).astype(np.float32), f"{prefix}{n}")
                for n, shape in (("W", (1, 4 * HIDDEN, inputs)), ("R", (1, 4 * HIDDEN, HIDDEN)),
                                 ("B", (1, 8 * HIDDEN)))]

    head = numpy_helper.from_array((rng.standard_normal((HIDDEN, HEAD)) / np.sqrt(HIDDEN)).astype(np.float32),
                                   "head")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("LSTM", ["x", "l1W", "l1R", "l1B"], ["y1"], hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["y1", "axes"], ["s1"]),
             helper.make_node("LSTM", ["s1", "l2W", "l2R", "l2B"], ["y2"], hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["y2", "axes"], ["s2"]),
             helper.make_node("MatMul", ["s2", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "streaming", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["T", 1, INPUT])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                              [*weights("l1", INPUT), *weights("l2", HIDDEN), head, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(lengths: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    import onnxruntime as ort

    model = streaming_lstm().SerializeToString()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    compiled = compile_model(model, cache=False, threads=1)
    from verify.gate import make_gate

    start = time.perf_counter()
    whole = compile_model(model, cache=False, threads=1, shape_class=True, dim_max={"T": max(lengths)},
                          gate=make_gate())  # strict: an unproved rewrite would stop the build
    class_compile_s = time.perf_counter() - start
    cert = whole.manifest["verification"] if whole.manifest else {}
    proofs = {"obligations": cert["summary"]["obligations"], "proved": cert["summary"]["proved"],
              "loop_body": sum(o["function"].endswith("loop_body") for a in cert["applications"]
                               for o in a["obligations"] if o["verdict"] == "proved")}
    rng = np.random.default_rng(1)
    rows = []
    for n in lengths:
        x = rng.standard_normal((n, 1, INPUT)).astype(np.float32)
        start = time.perf_counter()
        got = compiled(x)
        compile_s = time.perf_counter() - start
        (want,) = session.run(None, {"x": x})
        scale = np.max(np.abs(want)) + 1e-30
        error = float(max(np.max(np.abs(got - want)), np.max(np.abs(whole(x) - want))) / scale)
        times: dict[str, list[float]] = {"cuvil": [], "class": [], "ort": []}
        calls = [("cuvil", lambda x=x: compiled(x)), ("class", lambda x=x: whole(x)),
                 ("ort", lambda x=x: session.run(None, {"x": x}))]
        for k in range(repeat):
            for name, call in round_order(calls, k):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
        c_ms, w_ms, o_ms = (statistics.median(times[k]) * 1e3 for k in ("cuvil", "class", "ort"))
        rows.append({"length": n, "compile_s": round(compile_s, 3), "class_compile_s": round(class_compile_s, 3),
                     "class_proofs": proofs,
                     "cuvil_ms": round(c_ms, 4), "class_ms": round(w_ms, 4), "ort_ms": round(o_ms, 4),
                     "ratio": round(c_ms / o_ms, 3), "class_ratio": round(w_ms / o_ms, 3),
                     "class_vs_specialized": round(w_ms / c_ms, 3),
                     "class_us_per_step": round(w_ms * 1e3 / n, 2), "rel_error": error})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16,64,256,1024", help="comma-separated sequence lengths")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per engine and length")
    parser.add_argument("--json", help="write the rows as JSON")
    args = parser.parse_args(argv)
    rows = run([int(x) for x in args.lengths.split(",")], args.repeat)
    proofs = rows[0]["class_proofs"]
    print(f"one shape-class library for lengths up to {max(r['length'] for r in rows)}: compiled once in "
          f"{rows[0]['class_compile_s']:.2f} s, O3 gated: {proofs['proved']} of {proofs['obligations']} obligations "
          f"proved ({proofs['loop_body']} of them on loop bodies)")
    print("| length | specialization compile s | specialized ms | shape class ms | ort ms | specialized/ort "
          "| class/ort | class/specialized | class µs/step | rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['length']} | {r['compile_s']:.2f} | {r['cuvil_ms']:.3f} | {r['class_ms']:.3f} | {r['ort_ms']:.3f} "
              f"| {r['ratio']:.2f} | {r['class_ratio']:.2f} | {r['class_vs_specialized']:.2f} "
              f"| {r['class_us_per_step']:.1f} | {r['rel_error']:.1e} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
