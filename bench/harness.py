"""Cuvil vs ONNX Runtime vs PyTorch eager on the model zoo, plus a GEMM microbenchmark.

Every engine runs the same model on the same inputs in one process, *interleaved*: each
iteration calls every engine once (:func:`round_order`: none twice in a row), so a noisy neighbour on a shared
machine slows all of them alike. The figures of merit are the ratios of medians
(``cuvil/ort``, ``cuvil/torch``), not the absolute times.

Engines use the same thread count (``--threads``): Cuvil's pool size is compiled in
(``cuvil.compile(threads=N)``), ONNX Runtime gets ``intra_op_num_threads=N``, PyTorch
``torch.set_num_threads(N)``. Above one thread, ONNX Runtime's pool does not spin between runs
and PyTorch's OpenMP pool waits passively (``OMP_WAIT_POLICY=PASSIVE``, when torch is not
imported yet), so that an engine's idle threads do not slow the engine that runs next.

The GEMM microbenchmark compiles ``x @ W`` (``W`` constant, so packed at compile time) at
``n x n x n`` and compares it with numpy's matmul on one thread (``threadpoolctl`` when
installed, else a helper process started with ``OPENBLAS_NUM_THREADS=1`` etc., queried
between Cuvil's runs so the two stay interleaved).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np

ENGINES = ("cuvil", "ort", "torch")
_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


@dataclass
class EngineResult:
    median_ms: float | None = None
    times_ms: list[float] = field(default_factory=list)
    setup_s: float | None = None  # compile / session creation
    agreement: float | None = None  # max |diff| / max |reference| against the oracle
    error: str | None = None


@dataclass
class ModelResult:
    model: str
    description: str
    engines: dict[str, EngineResult]
    kernels: dict[str, int] = field(default_factory=dict)  # tuned kernel name -> count ("rule": generic, "view": none)
    compile_breakdown: dict[str, float] = field(default_factory=dict)
    cuvil_memory_bytes: int | None = None  # arena + embedded constants
    steal_share: float | None = None
    """The share of the machine's CPU time the host took from it (steal) while the engines were timed."""

    def ratio(self, engine: str) -> float | None:
        c, o = self.engines.get("cuvil"), self.engines.get(engine)
        if c is None or o is None or c.median_ms is None or o.median_ms is None or o.median_ms <= 0:
            return None
        return c.median_ms / o.median_ms


@dataclass
class GemmResult:
    n: int
    cuvil_gflops: float
    numpy_gflops: float
    ratio: float  # cuvil / numpy GFLOP/s
    numpy_threads: str
    max_rel_error: float


# --------------------------------------------------------------------------------------
# engines


def _median_ms(times: Sequence[float]) -> float:
    return float(np.median(np.asarray(times)) * 1e3)


T = TypeVar("T")


def round_order(items: Sequence[T], k: int) -> list[T]:
    """The order of round ``k`` of an interleaved benchmark: rotated by ``k`` (who goes first changes) where
    there are three or more, so that no engine ever runs twice in a row, across rounds either; two simply
    alternate. Reversing every other round, or rotating two, runs the round's last engine again first: its
    second call finds its own caches, and its pool's workers still spinning (a two-thread batch-1 MLP ran
    half its calls in 0.024 ms and half in 0.045 that way, its median falling between the two)."""
    n = len(items)
    shift = k % n if n >= 3 else 0
    return [*items[shift:], *items[:shift]]


def interleaved_medians(calls: Sequence[tuple[str, Callable[[], object]]], repeat: int) -> dict[str, float]:
    """Each call's median milliseconds over ``repeat`` rounds, the calls made in turn within a round
    (:func:`round_order`), so each finds the caches as the others left them."""
    times: dict[str, list[float]] = {name: [] for name, _ in calls}
    for k in range(repeat):
        for name, call in round_order(calls, k):
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: _median_ms(t) for name, t in times.items()}


def _rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(want64))) if want64.size else 0.0
    diff = float(np.max(np.abs(got64 - want64))) if want64.size else 0.0
    return diff / scale if scale > 0 else diff


def input_ranges(zm: Any) -> dict[str, tuple[float, float]]:
    """Each input's range over the benchmark's own inputs: what ``--precision fp16`` asks the prober to
    prove the float16 program finite over."""
    return {name: (float(np.min(x)), float(np.max(x)))
            for name, x in zip(zm.input_names, zm.example_inputs_numpy(), strict=True)}


def _cuvil_engine(zm: Any, threads: int, frontend: str, onnx_model: Any,
                  precision: str = "fp32") -> tuple[Callable[[], Any], dict[str, Any]]:
    import cuvil

    start = time.perf_counter()
    half = {"fp16": True, "ranges": input_ranges(zm)} if precision == "fp16" else {}
    narrow = {**half, **({"bf16": True} if precision == "bf16" else {})}
    if frontend == "onnx" or not zm.has_torch_reference or half:  # ranges are named as the ONNX inputs are
        model = cuvil.compile(onnx_model, threads=threads, cache=False, **narrow)
    else:
        model = cuvil.compile(zm.build(), example_inputs=zm.example_inputs(), threads=threads, cache=False,
                              **narrow)
    seconds = time.perf_counter() - start
    inputs = zm.example_inputs_numpy()
    info = {"setup_s": seconds, "manifest": model.manifest, "model": model}
    return (lambda: model(*inputs)), info


def ort_options(threads: int) -> Any:
    """ONNX Runtime's session options in every benchmark: ``threads`` intra-op threads, all graph
    optimizations, no spinning on two or more threads (the engines take turns on the same cores)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if threads > 1:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _ort_run(zm: Any, onnx_model: Any, options: Any) -> Callable[[], Any]:
    """A call of an ONNX Runtime session over ``zm``'s example inputs."""
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(sess.get_inputs(), zm.example_inputs_numpy(), strict=True)}
    return lambda: sess.run(None, feed)[0]


def _ort_engine(zm: Any, threads: int, onnx_model: Any) -> tuple[Callable[[], Any], dict[str, Any]]:
    start = time.perf_counter()
    run = _ort_run(zm, onnx_model, ort_options(threads))
    return run, {"setup_s": time.perf_counter() - start}


def _ort_as_written(zm: Any, onnx_model: Any) -> np.ndarray:
    """ONNX Runtime's output for the graph as written (no fusion): the oracle where PyTorch is not run. Its
    fused int8 kernels depend on the CPU (without VNNI their pairs of products saturate in 16 bits), its
    reading of the graph's DequantizeLinear, float op and QuantizeLinear does not."""
    import onnxruntime as ort

    options = ort_options(1)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return np.asarray(_ort_run(zm, onnx_model, options)())


def _torch_engine(zm: Any, threads: int) -> tuple[Callable[[], Any], dict[str, Any]]:
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    module = zm.build()
    inputs = zm.example_inputs()

    def run() -> Any:
        with torch.inference_mode():
            out = module(*inputs)
        return out.numpy()

    return run, {"setup_s": time.perf_counter() - start}


def bench_model(zm: Any, *, engines: Sequence[str], threads: int, repeat: int, warmup: int,
                frontend: str = "torch", log: Callable[[str], None] = print, precision: str = "fp32") -> ModelResult:
    """Set up every engine on ``zm``, check they agree, then time them interleaved. ``precision="fp16"``
    compiles Cuvil's library with float16 wherever the prober proves it finite over the inputs' ranges,
    ``"bf16"`` with its products by constant weights in bfloat16 (the other engines stay float32: the
    agreement column is then the reduced precision's error)."""
    results: dict[str, EngineResult] = {e: EngineResult() for e in engines}
    runners: dict[str, Callable[[], Any]] = {}
    result = ModelResult(zm.name, zm.description, results)
    onnx_model = zm.to_onnx() if ("ort" in engines or frontend == "onnx" or not zm.has_torch_reference
                                  or precision != "fp32") else None
    for engine in engines:
        try:
            if engine == "cuvil":
                run, info = _cuvil_engine(zm, threads, frontend, onnx_model, precision)
                manifest = info["manifest"]
                kernels: dict[str, int] = {}
                for name in manifest.get("kernels", []):
                    kernels[name] = kernels.get(name, 0) + 1
                result.kernels = kernels
                result.compile_breakdown = dict(manifest.get("compile_times", {}))
                result.cuvil_memory_bytes = int(manifest.get("arena_bytes", 0)) + \
                    int(manifest.get("constants_bytes", 0))
            elif engine == "ort":
                run, info = _ort_engine(zm, threads, onnx_model)
            elif engine == "torch":
                if not zm.has_torch_reference:
                    results[engine].error = "no float reference (quantized model)"
                    continue
                run, info = _torch_engine(zm, threads)
            else:
                raise ValueError(f"unknown engine {engine!r}")
            results[engine].setup_s = info["setup_s"]
            runners[engine] = run
        except Exception as e:  # one engine failing must not hide the others' numbers
            results[engine].error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(f"  {zm.name}: {engine} failed: {results[engine].error}")

    oracle = "torch" if "torch" in runners else ("ort" if "ort" in runners else None)
    outputs = {e: np.asarray(run()) for e, run in runners.items()}
    if oracle is not None:
        reference = outputs[oracle] if oracle == "torch" else _ort_as_written(zm, onnx_model)
        for e, out in outputs.items():
            if e != oracle and out.shape == reference.shape:
                results[e].agreement = _rel_diff(out, reference)

    order = list(runners)
    before = cpu_times()
    for it in range(warmup + repeat):
        for engine in round_order(order, it):
            start = time.perf_counter()
            runners[engine]()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                results[engine].times_ms.append(elapsed * 1e3)
    for engine in runners:
        results[engine].median_ms = _median_ms([t / 1e3 for t in results[engine].times_ms])
    result.steal_share = steal_share(before, cpu_times())
    return result


def cpu_times() -> list[int] | None:
    """The machine's CPU time so far, per kind (``/proc/stat``: user, nice, system, idle, iowait, irq,
    softirq, steal, ...), or None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return [int(x) for x in fields[1:]] if fields and fields[0] == "cpu" else None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of the CPU time between two :func:`cpu_times` readings that a hypervisor gave to others
    (steal: a vCPU ready to run but not running), None where it is not reported."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    return (after[7] - before[7]) / total if total > 0 else None


# --------------------------------------------------------------------------------------
# GEMM microbenchmark

_NUMPY_HELPER = r"""
import sys, time
import numpy as np
n = int(sys.argv[1]); rng = np.random.default_rng(0)
a = rng.standard_normal((n, n)).astype(np.float32); b = rng.standard_normal((n, n)).astype(np.float32)
out = np.empty((n, n), np.float32)
np.matmul(a, b, out=out)
for line in sys.stdin:
    k = int(line)
    times = []
    for _ in range(k):
        t = time.perf_counter(); np.matmul(a, b, out=out); times.append(time.perf_counter() - t)
    print(" ".join(repr(t) for t in times), flush=True)
"""


class _NumpyTimer:
    """numpy matmul on one thread: in process under threadpoolctl, else in a helper process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.proc: subprocess.Popen[str] | None = None
        self.limits: Any = None
        try:
            from threadpoolctl import threadpool_limits

            self.limits = threadpool_limits(limits=1)
            rng = np.random.default_rng(0)
            self.a = rng.standard_normal((n, n)).astype(np.float32)
            self.b = rng.standard_normal((n, n)).astype(np.float32)
            self.out = np.empty((n, n), np.float32)
            self.how = "threadpoolctl"
        except ImportError:
            env = dict(os.environ)
            env.update({k: "1" for k in _BLAS_ENV})
            self.proc = subprocess.Popen([sys.executable, "-c", _NUMPY_HELPER, str(n)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=env)
            self.how = "subprocess " + ",".join(f"{k}=1" for k in _BLAS_ENV[:2])

    def times(self, k: int) -> list[float]:
        if self.proc is None:
            out = []
            for _ in range(k):
                start = time.perf_counter()
                np.matmul(self.a, self.b, out=self.out)
                out.append(time.perf_counter() - start)
            return out
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{k}\n")
        self.proc.stdin.flush()
        return [float(t) for t in self.proc.stdout.readline().split()]

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
        if self.limits is not None:
            self.limits.unregister()


def bench_gemm(n: int, *, repeat: int, warmup: int = 2) -> GemmResult:
    """``x @ W`` at n^3 compiled by Cuvil on one thread vs numpy on one thread, interleaved."""
    import cuvil
    from cuvil.ir.builder import Builder
    from cuvil.ir.dtypes import DType

    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, n)).astype(np.float32)
    x = rng.standard_normal((n, n)).astype(np.float32)
    b = Builder()
    p = b.param("x", DType.f32, (n, n))
    module = b.module(b.function("gemm", [p], [b.matmul(p, b.const(w))], ["y"]))
    model = cuvil.compile(module, threads=1, cache=False)
    want = x.astype(np.float64) @ w.astype(np.float64)
    error = _rel_diff(model(x), want)
    timer = _NumpyTimer(n)
    try:
        ct: list[float] = []
        nt: list[float] = []
        for it in range(warmup + repeat):
            start = time.perf_counter()
            model(x)
            elapsed = time.perf_counter() - start
            numpy_times = timer.times(1)
            if it >= warmup:
                ct.append(elapsed)
                nt.extend(numpy_times)
    finally:
        timer.close()
    flops = 2.0 * n ** 3
    c_gf = flops / float(np.median(ct)) / 1e9
    n_gf = flops / float(np.median(nt)) / 1e9
    return GemmResult(n, c_gf, n_gf, c_gf / n_gf, timer.how, error)


# --------------------------------------------------------------------------------------
# report


NOT_RUN = "not run"
"""The error of an engine left out with ``--engines``: shown as "-", not as a failure."""


def _fmt_ms(r: EngineResult) -> str:
    if r.error is not None:
        return "[red]failed[/red]" if "quantized" not in r.error and r.error != NOT_RUN else "-"
    return f"{r.median_ms:.3f}" if r.median_ms is not None else "-"


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    color = "green" if x <= 1.0 else ("yellow" if x <= 1.5 else "red")
    return f"[{color}]{x:.2f}[/{color}]"


def render(models: Sequence[ModelResult], gemm: GemmResult | None, threads: int, console: Any,
           precision: str = "fp32") -> None:
    from rich.table import Table

    title = f"median latency (ms), {threads} thread(s); ratios < 1 mean Cuvil is faster"
    if precision == "fp16":
        title += "; Cuvil in fp16 where proved, the others in fp32"
    elif precision == "bf16":
        title += "; Cuvil's products by constant weights in bf16, the others in fp32"
    table = Table(title=title)
    for col in ("model", "cuvil", "ort", "torch", "cuvil/ort", "cuvil/torch", "compile s", "tuned ops",
                "agree vs oracle"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for m in models:
        c = m.engines.get("cuvil", EngineResult())
        tuned = sum(n for k, n in m.kernels.items() if k not in ("rule", "view"))
        total = sum(n for k, n in m.kernels.items() if k != "view")  # a view runs nothing
        table.add_row(m.model, _fmt_ms(c), _fmt_ms(m.engines.get("ort", EngineResult(error=NOT_RUN))),
                      _fmt_ms(m.engines.get("torch", EngineResult(error=NOT_RUN))),
                      _fmt_ratio(m.ratio("ort")), _fmt_ratio(m.ratio("torch")),
                      f"{c.setup_s:.1f}" if c.setup_s is not None else "-",
                      f"{tuned}/{total}" if total else "-",
                      f"{c.agreement:.1e}" if c.agreement is not None else "-")
    console.print(table)
    steal = [(m.model, m.steal_share) for m in models if m.steal_share]
    if steal:
        console.print("steal (CPU time the host gave to other tenants while timing): " +
                      ", ".join(f"{name} {100 * share:.1f} %" for name, share in steal))
    if gemm is not None:
        console.print(f"GEMM {gemm.n}^3 (W packed at compile time), one thread: cuvil {gemm.cuvil_gflops:.1f} "
                      f"GFLOP/s, numpy {gemm.numpy_gflops:.1f} GFLOP/s ({gemm.numpy_threads}) -> "
                      f"[bold]{100 * gemm.ratio:.0f}%[/bold] of numpy; max rel error {gemm.max_rel_error:.1e}")


# --------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="all", help="comma-separated zoo names, or 'all'")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    p.add_argument("--repeat", type=int, default=20, help="timed iterations per engine (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument("--threads", type=int, default=1, help="threads for every engine (default 1)")
    p.add_argument("--small", action="store_true", help="the reduced (test-size) zoo profiles")
    p.add_argument("--frontend", choices=("torch", "onnx"), default="torch",
                   help="what Cuvil compiles float models from (quantized ones always come from ONNX)")
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="Cuvil's library: fp32; fp16 wherever the prober proves it finite over the benchmark "
                        "inputs' ranges (float16 weights stream half the bytes); bf16: its matmuls by constant "
                        "weights as bfloat16 products summed in float32; the other engines stay fp32")
    p.add_argument("--gemm-size", type=int, default=1024, help="GEMM microbenchmark size n (0 skips it)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.threads < 1 or args.warmup < 0:
        p.error("--repeat and --threads must be >= 1, --warmup >= 0")
    return args


def passive_torch_workers(threads: int) -> None:
    """On more than one thread, PyTorch's OpenMP workers wait passively (set before torch is imported): they
    otherwise spin after every torch call (building or exporting a model is one) on the cores the engine timed
    next needs. Measured on a Zen 4, two threads, MobileNet-v1's library called back to back after building the
    module: 8.3 ms a call with them spinning, 6.1 ms without."""
    if threads > 1 and "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run(args: argparse.Namespace, console: Any = None) -> dict[str, Any]:
    passive_torch_workers(args.threads)
    from rich.console import Console

    from bench.models import ZOO, ZOO_SMALL

    if console is None:
        console = Console()
        if not console.is_terminal:  # a file or a pipe: wide enough for the whole table
            console = Console(width=150)
    table = ZOO_SMALL if args.small else ZOO
    names = list(table) if args.models == "all" else [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown zoo models {unknown}; known: {', '.join(table)}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise SystemExit(f"unknown engines {bad}; known: {', '.join(ENGINES)}")
    models = []
    for name in names:
        console.print(f"[dim]{name}: compiling and checking ...[/dim]")
        models.append(bench_model(table[name], engines=engines, threads=args.threads, repeat=args.repeat,
                                  warmup=args.warmup, frontend=args.frontend, log=console.print,
                                  precision=args.precision))
    gemm = bench_gemm(args.gemm_size, repeat=max(args.repeat // 2, 2)) if args.gemm_size > 0 else None
    render(models, gemm, args.threads, console, args.precision)
    report = {
        "threads": args.threads, "repeat": args.repeat, "small": args.small, "frontend": args.frontend,
        "precision": args.precision,
        "models": [{**asdict(m), "ratio_vs_ort": m.ratio("ort"), "ratio_vs_torch": m.ratio("torch")}
                   for m in models],
        "gemm": asdict(gemm) if gemm is not None else None,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0
