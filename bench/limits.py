"""``python -m bench.limits``: the floor a zoo model's latency cannot go below on this machine, and how
close Cuvil and ONNX Runtime come to it (a roofline).

Two limits are measured here, not taken from a data sheet (the machines are shared VMs whose clocks are
not known):

* the float32 multiply-add rate of a core: a loop of independent vector FMAs at the host's widest vectors,
  24 chains (more than the FMA units' latency times their count), on each of ``--threads`` threads;
* the read bandwidth of a core at several working-set sizes (L2, L3, memory): vector loads summed into
  eight accumulators, the same buffer read again and again.

A model's floor is the larger of its products' multiply-adds at the FMA rate and its weights' bytes at
the bandwidth of a working set of their size (every weight is read once per call; on ``N`` threads at
``N`` times one core's bandwidth; activations are left out, so the floor is a lower bound). A target below
the floor cannot be met by a schedule that does every multiply-add of the model's products (a Winograd
or FFT convolution does fewer, with other roundings).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

CHAINS = 24
"""Independent FMA chains in the peak loop: FMA latency (4-5 cycles) times two FMA units, with room."""

READ_ACCUMULATORS = 8
"""Vector loads in flight per step of the bandwidth loop (adds into separate accumulators)."""

WORKING_SETS_KIB = (256, 2 * 1024, 8 * 1024, 24 * 1024, 256 * 1024)
"""The read bandwidth's working sets: within L2, the L3 slices a model's weights fall in, memory."""


@dataclass
class Machine:
    """What one core (``threads`` cores together, for the FMA rate) can do at most."""

    threads: int
    lanes: int
    fma_gflops: float
    read_gbs: dict[int, float]  # working set in KiB -> GB/s of one core

    def bandwidth(self, nbytes: int) -> float:
        """GB/s of one core reading ``nbytes`` again and again: the smallest measured working set that holds
        them (the largest one beyond)."""
        for kib in sorted(self.read_gbs):
            if nbytes <= kib * 1024:
                return self.read_gbs[kib]
        return self.read_gbs[max(self.read_gbs)]


# --------------------------------------------------------------------------------------
# the two loops, compiled for this CPU


class _Jit:
    """The two measuring loops, compiled once for the host with Cuvil's own target description."""

    def __init__(self, lanes: int) -> None:
        from cuvil.codegen.link import target_machine
        from cuvil.codegen.target import host_target

        self.lanes = lanes
        tm = target_machine(host_target(), 3)
        module = llvm.parse_assembly(str(self._module(lanes, tm)))
        module.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=2)
        builder = llvm.create_pass_builder(tm, pto)
        builder.getModulePassManager().run(module, builder)
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        self.fma = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(self.engine.get_function_address("fma_chains"))
        self.read = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
            self.engine.get_function_address("read_sum"))

    @staticmethod
    def _module(lanes: int, tm: Any) -> ir.Module:
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vec = ir.VectorType(f32, lanes)
        mod = ir.Module("limits")
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        fma = ir.Function(mod, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{lanes}f32")
        _fma_chains(mod, vec, i64, fma)
        _read_sum(mod, vec, i64)
        return mod


def _splat(vec: ir.VectorType, x: float) -> ir.Constant:
    return ir.Constant(vec, [ir.Constant(ir.FloatType(), x)] * vec.count)


def _hsum(b: ir.IRBuilder, accs: Sequence[Any], lanes: int) -> Any:
    """The sum of every lane of every accumulator (what the loops return, so that none of them is dead)."""
    total = accs[0]
    for a in accs[1:]:
        total = b.fadd(total, a)
    out = b.extract_element(total, ir.Constant(ir.IntType(32), 0))
    for k in range(1, lanes):
        out = b.fadd(out, b.extract_element(total, ir.Constant(ir.IntType(32), k)))
    return out


def _fma_chains(mod: ir.Module, vec: ir.VectorType, i64: ir.IntType, fma: ir.Function) -> None:
    """``float fma_chains(i64 n)``: ``n`` steps of CHAINS independent ``acc = fma(acc, x, y)`` (bounded:
    ``x < 1``), summed at the end so nothing is dead."""
    fn = ir.Function(mod, ir.FunctionType(ir.FloatType(), [i64]), "fma_chains")
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    accs = [b.phi(vec) for _ in range(CHAINS)]
    x, y = _splat(vec, 0.999), _splat(vec, 1e-3)
    new = [b.call(fma, [a, x, y]) for a in accs]
    nxt = b.add(i, ir.Constant(i64, 1))
    b.cbranch(b.icmp_signed("<", nxt, fn.args[0]), loop, done)
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(nxt, loop)
    for k, (a, n) in enumerate(zip(accs, new, strict=True)):
        a.add_incoming(_splat(vec, 0.01 * k), entry)
        a.add_incoming(n, loop)
    b.position_at_end(done)
    b.ret(_hsum(b, new, vec.count))


def _read_sum(mod: ir.Module, vec: ir.VectorType, i64: ir.IntType) -> None:
    """``float read_sum(float* p, i64 nvec, i64 reps)``: ``reps`` passes summing ``nvec`` vectors (a
    multiple of READ_ACCUMULATORS) into READ_ACCUMULATORS accumulators."""
    ptr = ir.PointerType(vec)
    fn = ir.Function(mod, ir.FunctionType(ir.FloatType(), [ptr, i64, i64]), "read_sum")
    p, nvec, reps = fn.args
    entry, outer, inner, latch, done = (fn.append_basic_block(n) for n in ("entry", "outer", "inner", "latch", "done"))
    b = ir.IRBuilder(entry)
    b.branch(outer)
    b.position_at_end(outer)
    r = b.phi(i64)
    acc_o = [b.phi(vec) for _ in range(READ_ACCUMULATORS)]
    b.branch(inner)
    b.position_at_end(inner)
    j = b.phi(i64)
    acc_i = [b.phi(vec) for _ in range(READ_ACCUMULATORS)]
    new = [b.fadd(a, b.load(b.gep(p, [b.add(j, ir.Constant(i64, k))]), align=4))  # any buffer: no alignment asked
           for k, a in enumerate(acc_i)]
    nj = b.add(j, ir.Constant(i64, READ_ACCUMULATORS))
    b.cbranch(b.icmp_signed("<", nj, nvec), inner, latch)
    b.position_at_end(latch)
    nr = b.add(r, ir.Constant(i64, 1))
    b.cbranch(b.icmp_signed("<", nr, reps), outer, done)
    zero = _splat(vec, 0.0)
    r.add_incoming(ir.Constant(i64, 0), entry)
    r.add_incoming(nr, latch)
    j.add_incoming(ir.Constant(i64, 0), outer)
    j.add_incoming(nj, inner)
    for a_o, a_i, n in zip(acc_o, acc_i, new, strict=True):
        a_o.add_incoming(zero, entry)
        a_o.add_incoming(n, latch)
        a_i.add_incoming(a_o, outer)
        a_i.add_incoming(n, inner)
    b.position_at_end(done)
    b.ret(_hsum(b, new, vec.count))


# --------------------------------------------------------------------------------------
# measuring


def _best_rate(run: Callable[[], None], work: float, repeat: int) -> float:
    """``work`` per second of the fastest of ``repeat`` runs (the machine's best, not its typical)."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return work / best


def _on_threads(fn: Callable[[], None], threads: int) -> Callable[[], None]:
    """``fn`` on ``threads`` threads at once (ctypes lets go of the GIL around each call)."""
    if threads == 1:
        return fn

    def run() -> None:
        ts = [threading.Thread(target=fn) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return run


def measure_machine(threads: int = 1, repeat: int = 7, *, fma_steps: int = 20_000_000,
                    working_sets_kib: Sequence[int] = WORKING_SETS_KIB, read_bytes: int = 512 << 20) -> Machine:
    """The FMA rate of ``threads`` cores together and the read bandwidth of one core, each the best of
    ``repeat`` runs (``fma_steps`` steps of the FMA loop; about ``read_bytes`` read per working set)."""
    from cuvil.codegen.kernels.gemm import host_isa

    lanes = host_isa().lanes
    jit = _Jit(lanes)
    flops = threads * fma_steps * CHAINS * lanes * 2.0
    fma = _best_rate(_on_threads(lambda: jit.fma(fma_steps), threads), flops, repeat)
    read: dict[int, float] = {}
    for kib in working_sets_kib:
        nbytes = kib * 1024
        buf = np.ones(nbytes // 4 + 16, dtype=np.float32)
        addr = buf.ctypes.data + (-buf.ctypes.data % 64)  # a 64-byte aligned start
        nvec = nbytes // (4 * lanes) // READ_ACCUMULATORS * READ_ACCUMULATORS
        reps = max(1, read_bytes // nbytes)
        jit.read(addr, nvec, 1)  # bring it into the caches it fits in

        def run(a: int = addr, n: int = nvec, r: int = reps) -> None:
            jit.read(a, n, r)

        read[kib] = _best_rate(run, reps * nvec * lanes * 4.0, repeat) / 1e9
    return Machine(threads, lanes, fma / 1e9, read)


# --------------------------------------------------------------------------------------
# a model's work, from its CIR


@dataclass
class Work:
    """A model's products' flops (two per multiply-add) and its constants' bytes."""

    flops: float
    weight_bytes: int


def model_work(onnx_model: Any) -> Work:
    """Multiply-adds of every ``matmul`` and ``conv`` of the imported (unoptimized) CIR, and the bytes of its
    constants: what any engine has to do and read per call."""
    from cuvil.frontend.onnx_import import import_onnx

    module = import_onnx(onnx_model)
    flops = 0.0
    for fn in module.functions:
        for v in fn.values():
            if v.op in ("matmul", "conv") and not v.is_param:
                flops += 2.0 * math.prod(int(d) for d in v.shape) * _reduction(v)
    weights = sum(int(np.asarray(c).nbytes) for c in module.constants.values())
    return Work(flops, weights)


def _reduction(v: Any) -> int:
    """The length of one output element's sum of products."""
    a, w = v.operands[0], v.operands[1]
    if v.op == "conv":
        return math.prod(int(d) for d in w.shape[1:])
    return int(a.shape[-2] if v.attr("transpose_a") else a.shape[-1])


# --------------------------------------------------------------------------------------
# the roofline table


@dataclass
class Row:
    model: str
    gflop: float
    weights_mb: float
    compute_floor_ms: float
    bandwidth_floor_ms: float
    times_ms: dict[str, float]

    @property
    def floor_ms(self) -> float:
        return max(self.compute_floor_ms, self.bandwidth_floor_ms)

    @property
    def bound(self) -> str:
        return "FMA" if self.compute_floor_ms >= self.bandwidth_floor_ms else "bandwidth"


def roofline(name: str, machine: Machine, times_ms: dict[str, float], work: Work) -> Row:
    compute = work.flops / (machine.fma_gflops * 1e9) * 1e3
    band = work.weight_bytes / (machine.bandwidth(work.weight_bytes) * machine.threads * 1e9) * 1e3
    return Row(name, work.flops / 1e9, work.weight_bytes / 1e6, compute, band, times_ms)


def render(machine: Machine, rows: Sequence[Row], console: Any) -> None:
    from rich.table import Table

    console.print(f"FMA rate, float32, {machine.threads} thread(s) of {machine.lanes}-lane vectors: "
                  f"{machine.fma_gflops:.1f} GFLOP/s")
    console.print("read bandwidth of one core: " + ", ".join(
        f"{_size(kib)} {gbs:.0f} GB/s" for kib, gbs in sorted(machine.read_gbs.items())))
    engines = sorted({e for r in rows for e in r.times_ms})
    t = Table(title=f"each model against its floor, {machine.threads} thread(s); the floor is the larger of "
                    "its flops at the FMA rate and its weights at the bandwidth")
    for col in ("model", "GFLOP", "weights MB", "floor ms", "bound by",
                *(f"{e} ms" for e in engines), *(f"{e} % of floor" for e in engines),
                *(f"{e} GFLOP/s" for e in engines)):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        ms = [r.times_ms.get(e) for e in engines]
        t.add_row(r.model, f"{r.gflop:.3f}", f"{r.weights_mb:.1f}", f"{r.floor_ms:.3f}", r.bound,
                  *(f"{m:.3f}" if m else "-" for m in ms),
                  *(f"{100 * r.floor_ms / m:.0f}" if m else "-" for m in ms),
                  *(f"{r.gflop / m * 1e3:.0f}" if m else "-" for m in ms))
    console.print(t)


def _size(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--models", default="mlp,mlp_b64,resnet18,mobilenet_v1,bert",
                   help="comma-separated zoo names, or 'none' for the machine's limits alone")
    p.add_argument("--engines", default="cuvil,ort", help="comma-separated subset of cuvil,ort,torch")
    p.add_argument("--threads", type=int, default=1, help="threads for every engine and the FMA loop")
    p.add_argument("--repeat", type=int, default=20, help="timed iterations per engine (default 20)")
    p.add_argument("--small", action="store_true", help="the reduced (test-size) zoo profiles")
    p.add_argument("--quick", action="store_true",
                   help="shorter measuring loops (a rough figure, for a smoke test of the command)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console

    from bench.harness import bench_model, passive_torch_workers
    from bench.models import ZOO, ZOO_SMALL

    args = parse_args(argv)
    passive_torch_workers(args.threads)
    console = Console()
    machine = measure_machine(args.threads, 2, fma_steps=200_000, read_bytes=16 << 20) if args.quick \
        else measure_machine(args.threads)
    zoo = ZOO_SMALL if args.small else ZOO
    rows: list[Row] = []
    names = [] if args.models == "none" else [m.strip() for m in args.models.split(",") if m.strip()]
    for name in names:
        if name not in zoo:
            console.print(f"[red]unknown model {name!r}[/red]; the zoo has: {', '.join(zoo)}")
            return 2
        zm = zoo[name]
        result = bench_model(zm, engines=args.engines.split(","), threads=args.threads, repeat=args.repeat,
                             warmup=3, log=console.print)
        times = {e: r.median_ms for e, r in result.engines.items() if r.median_ms}
        rows.append(roofline(name, machine, times, model_work(zm.to_onnx())))
    render(machine, rows, console)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": asdict(machine), "rows": [{**asdict(r), "floor_ms": r.floor_ms, "bound": r.bound}
                                                          for r in rows]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
