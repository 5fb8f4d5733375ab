"""``python -m bench.memory``: peak resident memory of a process running one zoo model, Cuvil's library
against ONNX Runtime's session.

Each engine runs in a fresh process of its own (``--child``): it imports what it needs, notes its
peak resident set (``VmHWM``), loads the model (Cuvil: the compiled library, through the
manifest beside it; ONNX Runtime: an ``InferenceSession`` of the same ONNX file, default graph
optimizations), runs it ``--runs`` times on the example inputs and notes the peak again. The
difference is the model's own memory (weights, working memory, code); the peak is what the process
reached. Cuvil compiles in the parent process first, so the compiler's memory is not counted, just
as ONNX Runtime's session build is counted in its child (it happens at load time there).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENGINES = ("cuvil", "ort")


def _peak_kb() -> int:
    """This process's resident high-water mark (``VmHWM``: unlike ``ru_maxrss``, not carried over from the
    parent across ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def child(engine: str, path: str, inputs: str, runs: int, threads: int) -> dict[str, int]:
    """Load and run one model in this (fresh) process; the peak resident set before and after, in KB."""
    with np.load(inputs) as data:
        xs = [data[k] for k in sorted(data.files, key=lambda k: int(k.removeprefix("arg")))]
    if engine == "cuvil":
        from cuvil.runtime.loader import load

        before = _peak_kb()
        model = load(path)

        def step() -> Any:
            return model(*xs)
    else:
        import onnxruntime as ort

        before = _peak_kb()
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {i.name: x for i, x in zip(session.get_inputs(), xs, strict=True)}

        def step() -> Any:
            return session.run(None, feed)
    for _ in range(runs):
        step()
    return {"before_kb": before, "peak_kb": _peak_kb()}


@dataclass
class MemoryRow:
    model: str
    cuvil_peak_mb: float
    ort_peak_mb: float
    cuvil_model_mb: float
    ort_model_mb: float

    @property
    def ratio(self) -> float:
        return self.cuvil_peak_mb / self.ort_peak_mb


def measure(name: str, *, small: bool = False, runs: int = 5, threads: int = 1) -> MemoryRow:
    """Both engines on zoo model ``name``, each in its own process."""
    import onnx

    import cuvil
    from bench.models import ZOO, ZOO_SMALL

    zm = (ZOO_SMALL if small else ZOO)[name]
    with tempfile.TemporaryDirectory(prefix="cuvil-memory-") as tmp:
        folder = Path(tmp)
        model = zm.to_onnx()
        onnx.save(model, folder / "model.onnx")
        compiled = cuvil.compile(model, threads=threads, output_dir=folder / "lib", dynamic=False)
        assert compiled.library_path is not None
        np.savez(folder / "inputs.npz", **{f"arg{k}": x for k, x in enumerate(zm.example_inputs_numpy())})
        out: dict[str, dict[str, int]] = {}
        for engine, path in (("cuvil", compiled.library_path), ("ort", folder / "model.onnx")):
            run = subprocess.run([sys.executable, "-m", "bench.memory", "--child", engine, str(path),
                                  str(folder / "inputs.npz"), "--runs", str(runs), "--threads", str(threads)],
                                 capture_output=True, text=True, timeout=600, check=False)
            if run.returncode != 0:
                raise RuntimeError(f"{engine} on {name}: {run.stderr.strip()[-400:]}")
            out[engine] = json.loads(run.stdout.strip().splitlines()[-1])
    mb = 1 / 1024
    return MemoryRow(name, out["cuvil"]["peak_kb"] * mb, out["ort"]["peak_kb"] * mb,
                     (out["cuvil"]["peak_kb"] - out["cuvil"]["before_kb"]) * mb,
                     (out["ort"]["peak_kb"] - out["ort"]["before_kb"]) * mb)


def render(rows: Sequence[MemoryRow], console: Any) -> None:
    from rich.table import Table

    t = Table(title="peak resident memory (MB) of a process running the model; ratios < 1 mean Cuvil uses less")
    for col in ("model", "cuvil peak", "ort peak", "cuvil/ort", "cuvil model", "ort model"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        t.add_row(r.model, f"{r.cuvil_peak_mb:.1f}", f"{r.ort_peak_mb:.1f}", f"{r.ratio:.2f}",
                  f"{r.cuvil_model_mb:.1f}", f"{r.ort_model_mb:.1f}")
    console.print(t)
    console.print("[dim]model = peak after loading and running minus peak after the engine's imports[/dim]")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="all", help="comma-separated zoo names, or 'all'")
    p.add_argument("--small", action="store_true", help="the reduced zoo profiles")
    p.add_argument("--runs", type=int, default=5, help="runs after loading (default 5)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "INPUTS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        engine, path, inputs = args.child
        if engine not in ENGINES:
            p.error(f"unknown engine {engine!r}")
        print(json.dumps(child(engine, path, inputs, args.runs, args.threads)))
        return 0
    from rich.console import Console

    from bench.models import ZOO, ZOO_SMALL

    table = ZOO_SMALL if args.small else ZOO
    names = list(table) if args.models == "all" else [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown zoo models {unknown}; known: {', '.join(table)}")
    rows = [measure(n, small=args.small, runs=args.runs, threads=args.threads) for n in names]
    render(rows, Console(width=150))
    if args.json:
        Path(args.json).write_text(json.dumps([{**r.__dict__, "ratio": r.ratio} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
