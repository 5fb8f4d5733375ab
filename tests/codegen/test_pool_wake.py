"""When a run wakes the pool's sleeping workers: a library whose run gives the pool little work
(:data:`cuvil.codegen.kernels.threads.WAKE_MIN_RUN_FLOPS`) wakes them only when it is called back to back,
so that a call made now and then does not pay the system call that wakes a thread for a share of a few µs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import pytest
from llvmlite import ir

import cuvil.codegen.kernels.gemm as gemm
import cuvil.codegen.kernels.threads as threads
from cuvil.compiler import compile
from cuvil.ir.module import Module
from cuvil.runtime.loader import CompiledModel
from tests.codegen.test_kernels import Cases, _matmul_case, _thread_cpu_seconds


def _wake_flag(work: list[float | None]) -> int:
    """The wake flag a module gets after phases of ``work`` (None: known at run time) were noted."""
    mod = ir.Module(name="m")
    threads.thread_pool(mod)
    for w in work:
        threads.note_pooled_work(mod, w)
    threads.settle_wake(mod)
    flag = mod.globals[threads.WAKE]
    assert isinstance(flag, ir.GlobalVariable)
    return int(flag.initializer.constant)


def test_the_wake_flag_follows_the_pooled_work() -> None:
    floor = threads.WAKE_MIN_RUN_FLOPS
    assert _wake_flag([]) == 0
    assert _wake_flag([floor / 2]) == 0
    assert _wake_flag([floor / 2, floor / 2 - 1]) == 0
    assert _wake_flag([floor / 2, floor / 2]) == 1  # the run's phases together
    assert _wake_flag([floor * 10]) == 1
    assert _wake_flag([1.0, None]) == 1  # a phase whose work is known only at run time counts as enough


def test_settling_a_module_without_a_pool_adds_nothing() -> None:
    mod = ir.Module(name="serial")
    threads.settle_wake(mod)
    assert threads.WAKE not in mod.globals


def test_the_libraries_phases_are_counted(monkeypatch) -> None:
    """The code generator notes each pooled phase's work and settles the flag: a batch-1 product streaming
    1.6 MB of weights (6.4 M) stays under the floor, a 192x512x512 product (101 M) over it."""
    noted: list[float | None] = []
    note = threads.note_pooled_work

    def spy(mod: ir.Module, flops: float | None) -> None:
        noted.append(flops)
        note(mod, flops)

    monkeypatch.setattr(gemm, "note_pooled_work", spy)
    compile(_small_module()[0], cache=False, threads=2)
    assert len(noted) == 1 and noted[0] is not None and noted[0] < threads.WAKE_MIN_RUN_FLOPS
    noted.clear()
    compile(_large_module()[0], cache=False, threads=2)
    assert noted and sum(w or 0.0 for w in noted) >= threads.WAKE_MIN_RUN_FLOPS


def _small_module() -> tuple[Module, list[np.ndarray]]:
    c = Cases()
    _matmul_case(c, 1, 512, 784, const_b=True)
    return c.module(), c.inputs


def _large_module() -> tuple[Module, list[np.ndarray]]:
    c = Cases()
    _matmul_case(c, 192, 512, 512, const_b=True)  # about 1 ms a call on one core
    return c.module(), c.inputs


def _started_worker(module: Module, inputs: list[np.ndarray]) -> tuple[CompiledModel, Callable[[], float]]:
    """A two-thread library of ``module`` run once (which starts its worker) and checked against one thread's
    bits, and a reading of its worker's CPU seconds; the worker asleep (past its spin)."""
    want = compile(module, cache=False, threads=1).run(inputs)
    before = set(_thread_cpu_seconds())
    two = compile(module, cache=False, threads=2)
    for got, w in zip(two.run(inputs), want, strict=True):
        np.testing.assert_array_equal(got, w)
    workers = set(_thread_cpu_seconds()) - before
    assert workers, "the pooled run started no worker thread"
    time.sleep(0.05)

    def worker_cpu() -> float:
        now = _thread_cpu_seconds()
        return sum(now.get(t, 0.0) for t in workers)

    return two, worker_cpu


def _calls(model: CompiledModel, inputs: list[np.ndarray], seconds: float, pause: float) -> float:
    """Call ``model`` for ``seconds``, sleeping ``pause`` before each call; the wall time taken."""
    t0 = time.perf_counter()
    while (wall := time.perf_counter() - t0) < seconds:
        if pause:
            time.sleep(pause)
        model.run(inputs)
    return wall


NO_PROC = not os.path.isdir("/proc/self/task")
PROC_REASON = "reads thread CPU times from Linux's /proc"


@pytest.mark.skipif(NO_PROC, reason=PROC_REASON)
def test_a_small_run_wakes_its_worker_only_when_called_back_to_back() -> None:
    """Called every half millisecond, the small library's worker (asleep after its spin) is never woken and
    uses no CPU; called back to back, it is woken once and then helps (it spins between the calls), using a
    good share of the loop's time. The results stay the one thread's."""
    module, inputs = _small_module()
    two, worker_cpu = _started_worker(module, inputs)
    start = worker_cpu()
    _calls(two, inputs, 0.6, 0.0005)
    spaced = worker_cpu() - start
    assert spaced <= 0.02, f"spaced calls woke the worker: {spaced:.3f} s of its CPU"
    start = worker_cpu()
    wall = _calls(two, inputs, 0.6, 0.0)
    back_to_back = worker_cpu() - start
    # awake, it spins through the loop (about all of it); left asleep, it takes none. A loaded machine (the test
    # suite's other process, its threads) gave it 0.12 s of 0.6 at the least seen
    assert back_to_back >= 0.05 * wall, f"calls back to back left the worker asleep ({back_to_back:.3f} s of CPU)"
    _started_worker(module, inputs)  # the bits once more, after all those runs


@pytest.mark.skipif(NO_PROC, reason=PROC_REASON)
def test_a_large_run_wakes_its_worker_however_it_is_called() -> None:
    """A library over the floor wakes its worker at every call, however far apart the calls are."""
    module, inputs = _large_module()
    two, worker_cpu = _started_worker(module, inputs)
    start = worker_cpu()
    _calls(two, inputs, 0.6, 0.002)  # woken at each call, it computes about half of it (0.1 s or so in all)
    assert worker_cpu() - start >= 0.03, "spaced calls of a large run left its worker asleep"
