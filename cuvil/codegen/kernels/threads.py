"""A small pthread pool inside the artifact, emitted as LLVM IR (no OpenMP, no C runtime of ours).

``pool_run(task, args, n)`` runs ``task(args, chunk)`` for every chunk in ``0..n``. The caller
takes part, and chunks are claimed one at a time from one atomic word (a kernel phase of many
small chunks makes each of the pool's chunks a group of its own, :func:`.gemm.chunks_per_claim`),
so a worker that the OS has not scheduled (an oversubscribed machine) simply gets no chunks: the
caller finishes them itself instead of waiting. Idle workers spin, then sleep on a condition variable: while a
run of the library is in progress (:func:`in_run`) they spin long enough to catch its next kernel across a step
that runs on the caller alone; between runs only briefly, so that the cores are not held from whatever the
process does next. A library whose run gives the pool little work wakes sleeping workers only when it is called
back to back (:data:`WAKE_MIN_RUN_FLOPS`): otherwise the caller runs its chunks with whichever workers still spin.

The claim word packs ``generation:24 | back:20 | front:20``, the chunks not yet claimed being
``front <= c < back``: the caller claims from the front and the workers from the back
(:data:`TWO_ENDED`). A worker can only claim a chunk of the job whose generation it saw, and the
caller publishes a new job only after every chunk of the previous one was both claimed and
finished, so a late worker can never run a chunk of the wrong job.

The pool is per library. Its size is ``$CUVIL_NUM_THREADS`` when set, else the CPUs this
process may run on (``sched_getaffinity``); ``<prefix>_set_num_threads(n)`` overrides it (n <= 0:
detect again). A run that finds the pool busy (another context of the same library is running
in parallel) runs its chunks serially; a process forked from one with a started pool starts a
fresh one.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.llvm_types import I1, I8, I32, I64, PTR, declare
from cuvil.codegen.loops import for_range, if_then
from cuvil.codegen.scalar import Builder, GlobalVariable, Val

MAX_THREADS = 64
SPIN_PAUSES = 1024  # ~30-150 us depending on the CPU's pause latency: short enough to never matter
RUN_SPIN_PAUSES = 1 << 15  # ~1-5 ms: while a run is in progress, a step on the caller alone rarely outlasts it
MAX_CHUNKS = (1 << 20) - 1
_SYNC_BYTES = 64  # pthread_mutex_t / pthread_cond_t are 40 / 48 bytes on x86-64 glibc, 48 on aarch64
_CHUNK_BITS = 20
_GEN_SHIFT = 2 * _CHUNK_BITS
_MASK20 = (1 << _CHUNK_BITS) - 1
VOID = ir.VoidType()
TASK_TYPE = ir.FunctionType(VOID, [PTR, I64])
"""``void task(void* args, int64_t chunk)``."""

_SEQ = "seq_cst"
TWO_ENDED = True
"""Whether the caller claims a phase's chunks from its front and the workers from its back (else all from the
front). Consecutive phases cut alike (a convolution's bands, a GEMM's row blocks, channels) then run their
first chunks on the calling thread's core and their last on a worker's, each core mostly reading what it wrote
in the phase before, where claims from one end gave any chunk to whichever thread came first; a core the OS
does not schedule still just gets no chunks. Two threads, two profiled builds interleaved with ONNX Runtime
between calls, on a Zen 4, ms a call: BERT 4.948 -> 4.817, 4.856 -> 4.716; MobileNet-v1 6.104 -> 6.062,
6.106 -> 6.057, 6.795 -> 6.757; ResNet-18 17.318 -> 17.307, 17.300 -> 17.263; QDQ ResNet-18 8.798 -> 8.933,
8.569 -> 8.352; the batch-64 MLP 0.458 -> 0.461, 0.448 -> 0.447."""


WAKE_MIN_RUN_FLOPS = 20_000_000
RECENT_TICKS = 50_000
"""A library whose run gives the pool less work than ``WAKE_MIN_RUN_FLOPS`` (the pooled phases' flops, as
:func:`.gemm.product_work` counts them) wakes sleeping workers only when its previous run ended less than
``RECENT_TICKS`` of the CPU's cycle counter ago (calls back to back: 19 µs of a 2.6 GHz time-stamp counter,
within the :data:`SPIN_PAUSES` a worker spins after a run, 26 µs on a Zen 4; on a target without a counter,
always); otherwise it runs its chunks on the calling thread and on the workers still spinning. Waking a
worker is a system call that on a VM sends an interrupt to another virtual CPU: a caller paid 5-13 µs for it
and the worker started 3-11 µs later (Zen 4 VM, a C test of ``pthread_cond_broadcast`` after 200 µs of
sleep), more than a run of a few tens of µs gains. Two threads, the old and the new library called in turn with
ONNX Runtime between them (three runs): the batch-1 MLP (10.6 M) 0.0495 -> 0.0452, 0.0477 -> 0.0447, 0.0476 ->
0.0442 ms a call; back to back 0.024 either way. A worker woken after every such call also spun after it: 0.19 s
of CPU in 0.6 s of calls made every half millisecond, none now (``tests/codegen/test_pool_wake.py``)."""

WAKE = "cuvil.pool.wake"
LAST_END = "cuvil.pool.last_end"
_POOLED_WORK: weakref.WeakKeyDictionary[ir.Module, float] = weakref.WeakKeyDictionary()


def note_pooled_work(mod: ir.Module, flops: float | None) -> None:
    """Count a phase that may run on the pool toward its run's work (None: known only at run time, counted as
    enough to wake the workers)."""
    _POOLED_WORK[mod] = _POOLED_WORK.get(mod, 0.0) + (WAKE_MIN_RUN_FLOPS if flops is None else float(flops))


def settle_wake(mod: ir.Module) -> None:
    """Once every kernel is emitted: whether a run of this library wakes sleeping workers
    (:data:`WAKE_MIN_RUN_FLOPS`); a no-op when no kernel uses the pool."""
    wake = mod.globals.get(WAKE)
    if isinstance(wake, GlobalVariable):
        wake.initializer = ir.Constant(I32, int(_POOLED_WORK.get(mod, 0.0) >= WAKE_MIN_RUN_FLOPS))


@dataclass(frozen=True)
class ThreadPool:
    run: ir.Function  # void pool_run(ptr task, ptr args, i64 nchunks)
    set_threads: ir.Function


def _x86_target() -> bool:
    """Spin with ``pause`` on x86 (it yields to a sibling hyperthread); other targets spin plainly."""
    from cuvil.codegen.target import codegen_target

    return codegen_target().arch in ("x86_64", "i386", "i686")


def _global(mod: ir.Module, name: str, ty: ir.Type, align: int = 8) -> GlobalVariable:
    g = GlobalVariable(mod, ty, name=name)
    g.linkage = "internal"
    g.initializer = ir.Constant(ty, None)
    g.align = align
    return g


def _c_string(mod: ir.Module, name: str, text: str) -> GlobalVariable:
    data = bytearray(text.encode() + b"\0")
    g = GlobalVariable(mod, ir.ArrayType(I8, len(data)), name=name)
    g.linkage = "private"
    g.global_constant = True
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    return g


def _blocks(fn: ir.Function, *names: str) -> list[ir.Block]:
    """New blocks at the end of ``fn``, in order."""
    return [fn.append_basic_block(n) for n in names]


RUNS = "cuvil.pool.runs"


def in_run(mod: ir.Module, b: Builder, call: Callable[[], Val]) -> Val:
    """``call()`` (a run of the library's ops) counted as a run in progress, during which idle workers
    keep spinning between kernels; just ``call()`` when no kernel uses the pool."""
    runs = mod.globals.get(RUNS)
    if not isinstance(runs, GlobalVariable):
        return call()
    b.atomic_rmw("add", runs, ir.Constant(I32, 1), _SEQ)
    rc = call()
    b.atomic_rmw("sub", runs, ir.Constant(I32, 1), _SEQ)
    b.store_atomic(_cycles(mod, b), mod.globals[LAST_END], "monotonic", 8)
    return rc


def _cycles(mod: ir.Module, b: Builder) -> Val:
    """The CPU's cycle counter (``llvm.readcyclecounter``: 0 where the target has none)."""
    return b.call(declare(mod, "llvm.readcyclecounter", I64, []), [])


def default_pool_size() -> int:
    """The size a pool started in this process without a compiled-in size takes: ``$CUVIL_NUM_THREADS`` when
    it is a positive integer, else the CPUs this process may run on (what ``cuvil.pool.resolve`` does)."""
    lead = re.match(r"\s*[+-]?\d+", os.environ.get("CUVIL_NUM_THREADS", ""))  # read as atoi reads it
    if lead is not None and int(lead.group()) > 0:
        return min(int(lead.group()), MAX_THREADS)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def set_default_threads(mod: ir.Module, threads: int | None) -> None:
    """The pool size a library starts with (None or 0: detect); a no-op when no kernel uses the pool."""
    want = mod.globals.get("cuvil.pool.want")
    if isinstance(want, GlobalVariable) and threads:
        want.initializer = ir.Constant(I32, max(1, min(int(threads), MAX_THREADS)))


def thread_pool(mod: ir.Module) -> ThreadPool:
    """The module's pool (emitted on first use); ``mod.name`` is the library's symbol prefix."""
    found = mod.globals.get("cuvil.pool.run")
    if isinstance(found, ir.Function):
        return ThreadPool(found, mod.globals[f"{mod.name}_set_num_threads"])
    return _PoolEmitter(mod).emit()


class _PoolEmitter:
    def __init__(self, mod: ir.Module) -> None:
        self.mod = mod
        sync = ir.ArrayType(I8, _SYNC_BYTES)
        self.mutex = _global(mod, "cuvil.pool.mutex", sync, 64)
        self.cond_work = _global(mod, "cuvil.pool.cond_work", sync, 64)
        self.cond_done = _global(mod, "cuvil.pool.cond_done", sync, 64)
        self.state = _global(mod, "cuvil.pool.state", I64, 64)  # gen | back | front
        self.done = _global(mod, "cuvil.pool.done", I64, 64)
        self.count = _global(mod, "cuvil.pool.count", I64, 64)  # the job's chunks (the state's back moves)
        self.task = _global(mod, "cuvil.pool.task", PTR)
        self.args = _global(mod, "cuvil.pool.args", PTR)
        self.busy = _global(mod, "cuvil.pool.busy", I32, 64)
        self.runs = _global(mod, RUNS, I32, 64)  # runs of the library in progress (see in_run)
        self.want = _global(mod, "cuvil.pool.want", I32)  # requested size; 0: detect
        self.wake = _global(mod, WAKE, I32)  # whether a run wakes sleeping workers (settle_wake)
        self.wake.initializer = ir.Constant(I32, 1)
        self.last_end = _global(mod, LAST_END, I64, 64)  # the cycle counter when the last run ended
        self.size = _global(mod, "cuvil.pool.size", I32)  # resolved size (0: not yet)
        self.started = _global(mod, "cuvil.pool.started", I32)  # workers running
        self.shutdown = _global(mod, "cuvil.pool.shutdown", I32)
        self.pid = _global(mod, "cuvil.pool.pid", I32)
        self.threads = _global(mod, "cuvil.pool.threads", ir.ArrayType(I64, MAX_THREADS))
        self.env_name = _c_string(mod, "cuvil.pool.env", "CUVIL_NUM_THREADS")
        self.pause = declare(mod, "llvm.x86.sse2.pause", VOID, []) if _x86_target() else None
        self.lock = declare(mod, "pthread_mutex_lock", I32, [PTR])
        self.unlock = declare(mod, "pthread_mutex_unlock", I32, [PTR])
        self.cwait = declare(mod, "pthread_cond_wait", I32, [PTR, PTR])
        self.broadcast = declare(mod, "pthread_cond_broadcast", I32, [PTR])
        self.signal = declare(mod, "pthread_cond_signal", I32, [PTR])
        self.create = declare(mod, "pthread_create", I32, [PTR, PTR, PTR, PTR])
        self.join = declare(mod, "pthread_join", I32, [I64, PTR])
        self.getpid = declare(mod, "getpid", I32, [])
        self.getenv = declare(mod, "getenv", PTR, [PTR])
        self.atoi = declare(mod, "atoi", I32, [PTR])
        self.affinity = declare(mod, "sched_getaffinity", I32, [I32, I64, PTR])
        self.memset = declare(mod, "llvm.memset.p0.i64", VOID, [PTR, I8, I64, I1])
        self.ctpop = declare(mod, "llvm.ctpop.i64", I64, [I64])

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _func(mod: ir.Module, name: str, ret: ir.Type, args: list[ir.Type], internal: bool = True
              ) -> tuple[ir.Function, Builder]:
        fn = ir.Function(mod, ir.FunctionType(ret, args), name=name)
        if internal:
            fn.linkage = "internal"
        return fn, Builder(fn.append_basic_block("entry"))

    def _spin(self, b: Builder) -> None:
        if self.pause is not None:
            b.call(self.pause, [])

    def _back_off(self, b: Builder, spins: Val, spin: ir.Block, sleep: ir.Block) -> None:
        """One pause, then spin again until SPIN_PAUSES pauses have passed (RUN_SPIN_PAUSES while a run
        is in progress), then go to sleep (so an oversubscribed machine is not burnt by waiters)."""
        self._spin(b)
        n = b.add(b.load(spins, typ=I32), ir.Constant(I32, 1))
        b.store(n, spins)
        running = b.icmp_signed(">", self._load(b, self.runs, I32), ir.Constant(I32, 0))
        limit = b.select(running, ir.Constant(I32, RUN_SPIN_PAUSES), ir.Constant(I32, SPIN_PAUSES))
        b.cbranch(b.icmp_signed("<", n, limit), spin, sleep)

    def _load(self, b: Builder, g: Val, ty: ir.Type) -> Val:
        return b.load_atomic(g, _SEQ, 8 if ty == I64 else 4, typ=ty)

    def _store(self, b: Builder, v: Val, g: Val) -> None:
        b.store_atomic(v, g, _SEQ, 8 if v.type == I64 else 4)

    @staticmethod
    def _gen(b: Builder, s: Val) -> Val:
        return b.lshr(s, ir.Constant(I64, _GEN_SHIFT))

    # -- emission --------------------------------------------------------------------------
    def emit(self) -> ThreadPool:
        self.claim = self._emit_claim()
        self.work = self._emit_work()
        self.worker = self._emit_worker()
        self.stop = self._emit_stop()
        self.resolve = self._emit_resolve()
        run = self._emit_run()
        set_threads = self._emit_set_threads()
        self._emit_destructor()
        return ThreadPool(run, set_threads)

    def _emit_claim(self) -> ir.Function:
        """i64 claim(i64 gen, i1 back): the next chunk of job ``gen`` from the front (the caller) or the back
        (the workers), or -1 when it has none left. The state is ``gen | back | front``: the chunks not yet
        claimed are ``front <= c < back``."""
        fn, b = self._func(self.mod, "cuvil.pool.claim", I64, [I64, I1])
        gen, from_back = fn.args
        loop, none, check, cas, got = _blocks(fn, "loop", "none", "check", "cas", "got")
        b.branch(loop)
        b.position_at_end(loop)
        s = self._load(b, self.state, I64)
        b.cbranch(b.icmp_unsigned("==", self._gen(b, s), gen), check, none)
        b.position_at_end(check)
        front = b.and_(s, ir.Constant(I64, _MASK20))
        back = b.and_(b.lshr(s, ir.Constant(I64, _CHUNK_BITS)), ir.Constant(I64, _MASK20))
        b.cbranch(b.icmp_unsigned("<", front, back), cas, none)
        b.position_at_end(cas)
        if TWO_ENDED:
            taken = b.select(from_back, b.sub(back, ir.Constant(I64, 1)), front)
            step = b.select(from_back, ir.Constant(I64, -(1 << _CHUNK_BITS)), ir.Constant(I64, 1))
        else:
            taken, step = front, ir.Constant(I64, 1)
        res = b.cmpxchg(self.state, s, b.add(s, step), _SEQ, _SEQ)
        b.cbranch(b.extract_value(res, 1), got, loop)
        b.position_at_end(got)
        b.ret(taken)
        b.position_at_end(none)
        b.ret(ir.Constant(I64, -1))
        return fn

    def _emit_work(self) -> ir.Function:
        """void work(i64 state, i1 back): claim (from the back: a worker) and run chunks of the job ``state``
        describes until none are left."""
        fn, b = self._func(self.mod, "cuvil.pool.work", VOID, [I64, I1])
        s, from_back = fn.args
        gen = self._gen(b, s)
        task = b.load(self.task, typ=PTR)
        args = b.load(self.args, typ=PTR)
        loop, body, last, out = _blocks(fn, "loop", "body", "last", "out")
        b.branch(loop)
        b.position_at_end(loop)
        c = b.call(self.claim, [gen, from_back])
        b.cbranch(b.icmp_signed("<", c, ir.Constant(I64, 0)), out, body)
        b.position_at_end(body)
        count = self._load(b, self.count, I64)  # the job's: it cannot finish while a chunk of it is claimed
        b.call(_Callee(task), [args, c])
        finished = b.add(b.atomic_rmw("add", self.done, ir.Constant(I64, 1), _SEQ), ir.Constant(I64, 1))
        b.cbranch(b.icmp_unsigned("==", finished, count), last, loop)
        b.position_at_end(last)
        b.call(self.lock, [self.mutex])  # a caller about to sleep holds it from its check to its wait
        b.call(self.unlock, [self.mutex])
        b.call(self.signal, [self.cond_done])  # after the unlock, as the publication's wake-up
        b.branch(loop)
        b.position_at_end(out)
        b.ret_void()
        return fn

    def _emit_worker(self) -> ir.Function:
        """ptr worker(ptr): wait for a new generation (spin briefly, then sleep), help with it, repeat."""
        fn, b = self._func(self.mod, "cuvil.pool.worker", PTR, [PTR])
        seen_slot = b.alloca(I64, name="seen")
        spins = b.alloca(I32, name="spins")
        b.store(self._gen(b, self._load(b, self.state, I64)), seen_slot)
        wait = fn.append_basic_block("wait")
        b.branch(wait)

        def woken() -> Val:
            """A new job was published, or the pool is shutting down."""
            changed = b.icmp_unsigned("!=", self._gen(b, self._load(b, self.state, I64)), b.load(seen_slot, typ=I64))
            return b.or_(changed, self._stopping(b))

        b.position_at_end(wait)
        self._wait_until(b, fn, "idle", spins, woken, self.cond_work, "woke")
        work, leave = _blocks(fn, "work", "leave")
        b.cbranch(self._stopping(b), leave, work)

        b.position_at_end(work)
        s = self._load(b, self.state, I64)
        b.store(self._gen(b, s), seen_slot)
        b.call(self.work, [s, ir.Constant(I1, 1)])
        b.branch(wait)

        b.position_at_end(leave)
        b.ret(ir.Constant(PTR, None))
        return fn

    def _stopping(self, b: Builder) -> Val:
        """Whether the pool is shutting down."""
        return b.icmp_unsigned("!=", self._load(b, self.shutdown, I32), ir.Constant(I32, 0))

    def _wait_until(self, b: Builder, fn: ir.Function, name: str, spins: Val, ready: Callable[[], Val], cond: Val,
                    after: str) -> None:
        """Wait until ``ready()`` holds: spin (see :meth:`_back_off`), then sleep on ``cond`` under the
        mutex, checking again at each wake-up. Goes on in a new block named ``after``."""
        b.store(ir.Constant(I32, 0), spins)
        spin, spin_next, sleep, check, wait, unlock, done = _blocks(
            fn, *(f"{name}.{step}" for step in ("spin", "next", "sleep", "check", "wait", "unlock")), after)
        b.branch(spin)
        b.position_at_end(spin)
        b.cbranch(ready(), done, spin_next)
        b.position_at_end(spin_next)
        self._back_off(b, spins, spin, sleep)
        b.position_at_end(sleep)
        b.call(self.lock, [self.mutex])
        b.branch(check)
        b.position_at_end(check)
        b.cbranch(ready(), unlock, wait)
        b.position_at_end(wait)
        b.call(self.cwait, [cond, self.mutex])
        b.branch(check)
        b.position_at_end(unlock)
        b.call(self.unlock, [self.mutex])
        b.branch(done)
        b.position_at_end(done)

    def _emit_stop(self) -> ir.Function:
        """void stop(): ask every worker to leave, join them, and reset the pool to 'not started'."""
        fn, b = self._func(self.mod, "cuvil.pool.stop", VOID, [])
        n = b.load(self.started, typ=I32)

        def join(i: Val) -> None:
            b.call(self.join, [b.load(self._thread_slot(b, i), typ=I64), ir.Constant(PTR, None)])

        def stop_started() -> None:
            b.call(self.lock, [self.mutex])
            self._store(b, ir.Constant(I32, 1), self.shutdown)
            b.call(self.broadcast, [self.cond_work])
            b.call(self.unlock, [self.mutex])
            for_range(b, 0, b.sext(n, I64), "join", join)
            b.store(ir.Constant(I32, 0), self.started)
            self._store(b, ir.Constant(I32, 0), self.shutdown)

        if_then(b, b.icmp_signed(">", n, ir.Constant(I32, 0)), "has", stop_started)
        b.ret_void()
        return fn

    def _thread_slot(self, b: Builder, i: Val) -> Val:
        """Where worker ``i`` (i64) keeps its ``pthread_t``."""
        return b.gep(self.threads, [ir.Constant(I64, 0), i], inbounds=True, source_etype=self.threads.value_type)

    def _take(self, b: Builder) -> Val:
        """Mark the pool busy; true when it was free (no run, and no resize, is in progress)."""
        res = b.cmpxchg(self.busy, ir.Constant(I32, 0), ir.Constant(I32, 1), _SEQ, _SEQ)
        return b.extract_value(res, 1)

    def _stop_own_workers(self, b: Builder) -> None:
        """Stop the workers if this process started them (a forked child inherits none of them)."""
        same_process = b.icmp_signed("==", b.call(self.getpid, []), b.load(self.pid, typ=I32))
        if_then(b, same_process, "stop", lambda: b.call(self.stop, []))

    def _emit_resolve(self) -> ir.Function:
        """i32 resolve(): the pool size: the requested one, else $CUVIL_NUM_THREADS, else the CPUs we may use."""
        fn, b = self._func(self.mod, "cuvil.pool.resolve", I32, [])
        want = b.load(self.want, typ=I32)
        given, env, env_set, env_num, cpus, finish = _blocks(fn, "given", "env", "env.set", "env.num", "cpus",
                                                             "finish")
        b.cbranch(b.icmp_signed(">", want, ir.Constant(I32, 0)), given, env)
        b.position_at_end(given)
        b.branch(finish)
        b.position_at_end(env)
        text = b.call(self.getenv, [self.env_name])
        b.cbranch(b.icmp_unsigned("!=", text, ir.Constant(PTR, None)), env_set, cpus)
        b.position_at_end(env_set)
        from_env = b.call(self.atoi, [text])
        b.cbranch(b.icmp_signed(">", from_env, ir.Constant(I32, 0)), env_num, cpus)
        b.position_at_end(env_num)
        b.branch(finish)
        b.position_at_end(cpus)
        words = 16  # a 1024-CPU mask
        mask = b.alloca(ir.ArrayType(I64, words))
        b.call(self.memset, [mask, ir.Constant(I8, 0), ir.Constant(I64, 8 * words), ir.Constant(I1, 0)])
        rc = b.call(self.affinity, [ir.Constant(I32, 0), ir.Constant(I64, 8 * words), mask])
        count: Val = ir.Constant(I64, 0)
        for w in range(words):
            word = b.load(b.gep(mask, [ir.Constant(I64, 0), ir.Constant(I64, w)], inbounds=True,
                                source_etype=mask.allocated_type), typ=I64)
            count = b.add(count, b.call(self.ctpop, [word]))
        ok = b.and_(b.icmp_signed("==", rc, ir.Constant(I32, 0)), b.icmp_signed(">", count, ir.Constant(I64, 0)))
        detected = b.select(ok, b.trunc(count, I32), ir.Constant(I32, 1))
        b.branch(finish)
        b.position_at_end(finish)
        n = b.phi(I32)
        n.add_incoming(want, given)
        n.add_incoming(from_env, env_num)
        n.add_incoming(detected, cpus)
        capped = b.select(b.icmp_signed(">", n, ir.Constant(I32, MAX_THREADS)), ir.Constant(I32, MAX_THREADS), n)
        b.ret(capped)
        return fn

    def _emit_run(self) -> ir.Function:
        fn, b = self._func(self.mod, "cuvil.pool.run", VOID, [PTR, PTR, I64])
        task, args, nchunks = fn.args
        task.name, args.name, nchunks.name = "task", "args", "nchunks"
        (serial, try_pool, owned, forked, sized, need_size, have_size, start_head, start_body, start_fail, started,
         publish, release_serial) = _blocks(fn, "serial", "try", "owned", "forked", "sized", "need_size",
                                            "have_size", "start.head", "start.body", "start.fail", "started",
                                            "publish", "release.serial")

        few = b.icmp_signed("<=", nchunks, ir.Constant(I64, 1))
        too_many = b.icmp_signed(">", nchunks, ir.Constant(I64, MAX_CHUNKS))
        b.cbranch(b.or_(few, too_many), serial, try_pool)

        # serial: every chunk on the calling thread
        b.position_at_end(serial)
        for_range(b, 0, nchunks, "chunk", lambda i: b.call(_Callee(task), [args, i]))
        b.ret_void()

        # take the pool, or run serially when another run holds it
        b.position_at_end(try_pool)
        b.cbranch(self._take(b), owned, serial)

        b.position_at_end(owned)
        pid = b.call(self.getpid, [])
        b.cbranch(b.icmp_signed("!=", pid, b.load(self.pid, typ=I32)), forked, sized)

        b.position_at_end(forked)  # first use, or a forked child: no worker of ours exists here
        for g in (self.mutex, self.cond_work, self.cond_done):
            b.call(self.memset, [g, ir.Constant(I8, 0), ir.Constant(I64, _SYNC_BYTES), ir.Constant(I1, 0)])
        b.store(ir.Constant(I32, 0), self.started)
        b.store(ir.Constant(I32, 0), self.size)
        self._store(b, ir.Constant(I32, 0), self.shutdown)
        b.store(pid, self.pid)
        b.branch(sized)

        b.position_at_end(sized)
        b.cbranch(b.icmp_signed("==", b.load(self.size, typ=I32), ir.Constant(I32, 0)), need_size, have_size)
        b.position_at_end(need_size)
        b.store(b.call(self.resolve, []), self.size)
        b.branch(have_size)

        b.position_at_end(have_size)
        size = b.load(self.size, typ=I32)
        b.cbranch(b.icmp_signed("<=", size, ir.Constant(I32, 1)), release_serial, start_head)

        # start the missing workers (size - 1 of them)
        b.position_at_end(start_head)
        running = b.load(self.started, typ=I32)
        wanted = b.sub(b.load(self.size, typ=I32), ir.Constant(I32, 1))
        b.cbranch(b.icmp_signed("<", running, wanted), start_body, started)
        b.position_at_end(start_body)
        slot = self._thread_slot(b, b.sext(running, I64))
        rc = b.call(self.create, [slot, ir.Constant(PTR, None), self.worker, ir.Constant(PTR, None)])
        ok_block = fn.append_basic_block("start.ok")
        b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), ok_block, start_fail)
        b.position_at_end(ok_block)
        b.store(b.add(running, ir.Constant(I32, 1)), self.started)
        b.branch(start_head)
        b.position_at_end(start_fail)  # fewer threads than asked: keep what we have
        b.store(b.add(b.load(self.started, typ=I32), ir.Constant(I32, 1)), self.size)
        b.branch(started)

        b.position_at_end(started)
        b.cbranch(b.icmp_signed(">", b.load(self.started, typ=I32), ir.Constant(I32, 0)), publish, release_serial)

        b.position_at_end(release_serial)
        self._store(b, ir.Constant(I32, 0), self.busy)
        b.branch(serial)

        # publish the job under the mutex (sleeping workers re-check the state under it)
        b.position_at_end(publish)
        b.call(self.lock, [self.mutex])
        b.store(task, self.task)
        b.store(args, self.args)
        self._store(b, ir.Constant(I64, 0), self.done)
        self._store(b, nchunks, self.count)
        gen = b.and_(b.add(self._gen(b, self._load(b, self.state, I64)), ir.Constant(I64, 1)),
                     ir.Constant(I64, (1 << 24) - 1))
        new_state = b.or_(b.shl(gen, ir.Constant(I64, _GEN_SHIFT)), b.shl(nchunks, ir.Constant(I64, _CHUNK_BITS)))
        self._store(b, new_state, self.state)
        b.call(self.unlock, [self.mutex])
        # after the unlock: a woken worker does not wait on the mutex for a second wake-up
        since = b.sub(_cycles(self.mod, b), b.load_atomic(self.last_end, "monotonic", 8, typ=I64))
        recent = b.icmp_unsigned("<", since, ir.Constant(I64, RECENT_TICKS))
        wake = b.or_(b.icmp_signed("!=", b.load(self.wake, typ=I32), ir.Constant(I32, 0)), recent)
        if_then(b, wake, "wake", lambda: b.call(self.broadcast, [self.cond_work]))
        b.call(self.work, [new_state, ir.Constant(I1, 0)])

        # wait until every chunk has finished
        spins = b.alloca(I32)
        self._wait_until(b, fn, "wait", spins, lambda: b.icmp_unsigned("==", self._load(b, self.done, I64), nchunks),
                         self.cond_done, "finished")
        self._store(b, ir.Constant(I32, 0), self.busy)
        b.ret_void()
        return fn

    def _emit_set_threads(self) -> ir.Function:
        """Exported ``int32_t <prefix>_set_num_threads(int32_t n)``: the pool size from the next run on."""
        fn, b = self._func(self.mod, f"{self.mod.name}_set_num_threads", I32, [I32], internal=False)
        n = fn.args[0]
        n.name = "n"
        busy, free = _blocks(fn, "busy", "free")
        b.cbranch(self._take(b), free, busy)
        b.position_at_end(busy)  # a run is in progress: the caller must not race with it
        b.ret(ir.Constant(I32, 1))
        b.position_at_end(free)
        self._stop_own_workers(b)
        clean = b.select(b.icmp_signed(">", n, ir.Constant(I32, 0)), n, ir.Constant(I32, 0))
        b.store(clean, self.want)
        b.store(ir.Constant(I32, 0), self.size)
        self._store(b, ir.Constant(I32, 0), self.busy)
        b.ret(ir.Constant(I32, 0))
        return fn

    def _emit_destructor(self) -> None:
        """Join the workers when the library is unloaded (dlclose or exit), before its code goes away."""
        fn, b = self._func(self.mod, "cuvil.pool.fini", VOID, [])
        self._stop_own_workers(b)
        b.ret_void()
        entry_ty = ir.LiteralStructType([I32, PTR, PTR])
        dtors = GlobalVariable(self.mod, ir.ArrayType(entry_ty, 1), name="llvm.global_dtors")
        dtors.linkage = "appending"
        dtors.initializer = ir.Constant(ir.ArrayType(entry_ty, 1),
                                        [ir.Constant(entry_ty, [ir.Constant(I32, 65535), fn, ir.Constant(PTR, None)])])


class _Callee(ir.Value):
    """A ``ptr`` called indirectly as a task (``void (ptr, i64)``): llvmlite wants a function type on callees."""

    def __init__(self, ptr: Val) -> None:
        self.ptr = ptr
        self.type = ptr.type
        self.function_type = TASK_TYPE

    def get_reference(self) -> str:
        return self.ptr.get_reference()
