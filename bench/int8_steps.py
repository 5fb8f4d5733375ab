"""``python -m bench.int8_steps``: the zoo's INT8 models quantized with ``reduce_range=True`` (7-bit weights, as
ONNX Runtime advises for CPUs without VNNI), Cuvil's int8 kernels with each AVX2 step kind and ONNX Runtime,
called in turn in one process (:func:`bench.harness.interleaved_medians`), one thread.

On AVX2 a four-product step is two ``vpmaddwd`` on bytes widened to 16 bits (``avx2``), or, where no pair of a
kernel's weights can saturate it, one ``vpmaddubsw`` and one ``vpmaddwd`` (``pairs``): the same sums, so the
two libraries' outputs must be equal bit for bit (the table says so). A VNNI host would run ``vpdpbusd`` in
both: there the AVX2 steps are chosen as they would be without it (ONNX Runtime still uses its VNNI kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

KINDS = ("avx2", "pairs")
MODELS = ("mlp_int8", "resnet18_int8")


def _library(proto: Any, inputs: list[np.ndarray], kind: str) -> Any:
    """Cuvil's library with the AVX2 step kind ``kind`` (``avx2``: the pairs check answers no)."""
    import cuvil
    from cuvil.codegen.kernels import vnni

    check, has_vnni = vnni.pairs_fit, vnni.host_has_vnni
    vnni.pairs_fit = check if kind == "pairs" else (lambda packed: False)
    vnni.host_has_vnni = lambda: False
    try:
        model = cuvil.compile(proto, cache=False, threads=1)
        model.run(inputs)  # built here, under the steps chosen
    finally:
        vnni.pairs_fit, vnni.host_has_vnni = check, has_vnni
    kernels = sorted({k.split(".")[1] for k in model.manifest["kernels"] if k.startswith("int8.")})
    return model, kernels


def measure(name: str, batch: int | None, repeat: int, rounds: int, small: bool) -> dict[str, Any]:
    import onnxruntime as ort

    from bench.harness import interleaved_medians
    from bench.models import ZOO, ZOO_SMALL

    zm = (ZOO_SMALL if small else ZOO)[name]
    zm = dataclasses.replace(zm, quant_options={**zm.quant_options, "reduce_range": True},
                             **({"batch": batch} if batch else {}))
    proto, inputs = zm.to_onnx(), zm.example_inputs_numpy()
    built = {kind: _library(proto, inputs, kind) for kind in KINDS}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs, strict=True))
    outs = {kind: np.asarray(model.run(inputs)[0]) for kind, (model, _) in built.items()}
    ort_out = np.asarray(session.run(None, feeds)[0])
    calls = [*((kind, lambda m=model: m.run(inputs)) for kind, (model, _) in built.items()),
             ("ort", lambda: session.run(None, feeds))]
    rows = [interleaved_medians(calls, repeat) for _ in range(rounds)]
    ms = {name: float(np.median([row[name] for row in rows])) for name, _ in calls}
    return {"model": name, "batch": zm.batch, "kernels": {k: built[k][1] for k in KINDS}, "ms": ms,
            "bit_equal": bool(np.array_equal(outs["avx2"], outs["pairs"])),
            "max_abs_vs_ort": float(np.max(np.abs(outs["pairs"].astype(np.float64) - ort_out)))}


def render(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| model | batch | widened ms | pairs ms | ONNX Runtime ms | widened / ORT | pairs / ORT | bit-equal "
             "| max abs vs ORT |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {r['batch']} | {ms['avx2']:.3f} | {ms['pairs']:.3f} | {ms['ort']:.3f} | "
                     f"{ms['avx2'] / ms['ort']:.2f} | {ms['pairs'] / ms['ort']:.2f} | {r['bit_equal']} | "
                     f"{r['max_abs_vs_ort']:.3g} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch", type=int, default=None, help="the batch size (default: the zoo model's)")
    parser.add_argument("--repeat", type=int, default=30, help="calls of each engine per round, in turn (median)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the median of their medians)")
    parser.add_argument("--small", action="store_true", help="the zoo's reduced (test) sizes")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    if any(n not in MODELS for n in names) or args.repeat < 1 or args.rounds < 1 or (args.batch or 1) < 1:
        parser.error(f"models must be among {', '.join(MODELS)}; --repeat, --rounds and --batch positive")
    from cuvil.codegen.target import codegen_target

    if not codegen_target().has("avx2"):
        print("this host has no AVX2: no int8 steps to compare", file=sys.stderr)
        return 2
    rows = [measure(n, args.batch, args.repeat, args.rounds, args.small) for n in names]
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
