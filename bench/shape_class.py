"""One BERT-style library for a whole shape class against one specialization per shape.

The zoo's BERT-style encoder (4 layers, d=256, 4 heads) is exported to ONNX with a dynamic batch and
sequence length and compiled twice by Cuvil: once for the shape class batch <= B, seq <= S (one
library, the dims read at run time), and once per measured shape (a specialization). At each shape
the two libraries and ONNX Runtime run interleaved on the same input, one thread each unless
``--threads``; reported: the median latencies, the shape-class library's time over the
specialization's, both over ONNX Runtime's, and the largest difference from ONNX Runtime relative to
its output scale.

    python -m bench.shape_class [--points 1x16,4x128,8x512] [--max 8x512] [--repeat 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.harness import passive_torch_workers, round_order
from cuvil.compiler import compile as compile_model


def bert_onnx() -> bytes:
    """The zoo's BERT-style encoder as ONNX, batch and sequence length dynamic."""
    import torch

    from bench.models.bert import build_bert

    torch.manual_seed(0)
    model = build_bert(False).eval()
    buf = io.BytesIO()
    axes = {"input_ids": {0: "batch", 1: "seq"}, "hidden": {0: "batch", 1: "seq"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros((2, 32), dtype=torch.int64),), buf, dynamo=False, opset_version=17,
                          input_names=["input_ids"], output_names=["hidden"], dynamic_axes=axes)
    return buf.getvalue()


def _shape(text: str) -> tuple[int, int]:
    b, s = text.lower().split("x")
    return int(b), int(s)


def run(points: Sequence[tuple[int, int]], largest: tuple[int, int], repeat: int, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    model = bert_onnx()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    whole = compile_model(model, cache=False, threads=threads, shape_class=True,
                          dim_max={"batch": largest[0], "seq": largest[1]})
    class_compile_s = time.perf_counter() - start
    kernels = whole.manifest["kernels"] if whole.manifest else []
    rows = []
    rng = np.random.default_rng(0)
    for batch, seq in points:
        ids = rng.integers(0, 8192, (batch, seq)).astype(np.int64)
        start = time.perf_counter()
        special = compile_model(model, cache=False, threads=threads, output_dir=None, dynamic=False,
                                input_shapes={"input_ids": (batch, seq)})
        compile_s = time.perf_counter() - start
        (want,) = session.run(None, {"input_ids": ids})
        scale = float(np.max(np.abs(want))) + 1e-30
        error = max(float(np.max(np.abs(whole(ids) - want))), float(np.max(np.abs(special(ids) - want)))) / scale
        times: dict[str, list[float]] = {"class": [], "specialized": [], "ort": []}
        calls = [("class", lambda ids=ids: whole(ids)), ("specialized", lambda ids=ids, f=special: f(ids)),
                 ("ort", lambda ids=ids: session.run(None, {"input_ids": ids}))]
        for k in range(repeat):
            for name, call in round_order(calls, k):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append({"batch": batch, "seq": seq, "specialization_compile_s": round(compile_s, 2),
                     **{f"{k}_ms": round(v, 3) for k, v in med.items()},
                     "class_vs_specialized": round(med["class"] / med["specialized"], 3),
                     "class_vs_ort": round(med["class"] / med["ort"], 3),
                     "specialized_vs_ort": round(med["specialized"] / med["ort"], 3), "rel_error": error})
        special.close()
    return {"class_compile_s": round(class_compile_s, 2), "largest": list(largest), "threads": threads,
            "class_rule_kernels": sum(k == "rule" for k in kernels), "class_kernels": len(kernels), "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shape_class", description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="1x16,4x128,8x512", help="comma-separated BATCHxSEQ shapes to measure")
    parser.add_argument("--max", default="8x512", help="the shape class's largest BATCHxSEQ")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per engine and shape")
    parser.add_argument("--threads", type=int, default=1, help="threads per engine")
    parser.add_argument("--json", help="write the results as JSON")
    args = parser.parse_args(argv)
    passive_torch_workers(args.threads)
    result = run([_shape(p) for p in args.points.split(",")], _shape(args.max), args.repeat, args.threads)
    print(f"one library for batch <= {result['largest'][0]}, seq <= {result['largest'][1]}: compiled once in "
          f"{result['class_compile_s']:.1f} s; {result['class_rule_kernels']} of {result['class_kernels']} ops on "
          f"the generic rule lowering; {result['threads']} thread(s)")
    print("| batch x seq | specialization compile s | shape class ms | specialized ms | ort ms | class/specialized "
          "| class/ort | specialized/ort | rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in result["rows"]:
        print(f"| {r['batch']}x{r['seq']} | {r['specialization_compile_s']:.1f} | {r['class_ms']:.2f} "
              f"| {r['specialized_ms']:.2f} | {r['ort_ms']:.2f} | {r['class_vs_specialized']:.2f} "
              f"| {r['class_vs_ort']:.2f} | {r['specialized_vs_ort']:.2f} | {r['rel_error']:.1e} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
