"""A small pthread pool inside the artifact, emitted as LLVM IR (no OpenMP, no C runtime of ours).

``pool_run(task, args, n)`` runs ``task(args, chunk)`` for every chunk in ``0..n``. The caller
takes part, and chunks are claimed one at a time from one atomic word, so a worker that the OS
has not scheduled (an oversubscribed machine) simply gets no chunks: the caller finishes them
itself instead of waiting. Idle workers spin briefly (a few tens of microseconds, enough to
catch the next kernel of the same run) and then sleep on a condition variable.

The claim word packs ``generation:24 | chunk count:20 | next chunk:20``: a worker can only
claim a chunk of the job whose generation it saw, and the caller publishes a new job only after
every chunk of the previous one was both claimed and finished, so a late worker can never run
a chunk of the wrong job.

The pool is per library. Its size is ``$CUVIL_NUM_THREADS`` when set, else the CPUs this
process may run on (``sched_getaffinity``); ``<prefix>_set_num_threads(n)`` overrides it (n <= 0:
detect again). A run that finds the pool busy (another context of the same library is running
in parallel) runs its chunks serially; a process forked from one with a started pool starts a
fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.scalar import I8, I32, I64, PTR

MAX_THREADS = 64
SPIN_PAUSES = 1024  # ~30-150 us depending on the CPU's pause latency: short enough to never matter
MAX_CHUNKS = (1 << 20) - 1
_SYNC_BYTES = 64  # pthread_mutex_t / pthread_cond_t are 40 / 48 bytes on x86-64 glibc, 48 on aarch64
_CHUNK_BITS = 20
_GEN_SHIFT = 2 * _CHUNK_BITS
_MASK20 = (1 << _CHUNK_BITS) - 1
VOID = ir.VoidType()
TASK_TYPE = ir.FunctionType(VOID, [PTR, I64])
"""``void task(void* args, int64_t chunk)``."""

_SEQ = "seq_cst"


@dataclass(frozen=True)
class ThreadPool:
    run: ir.Function  # void pool_run(ptr task, ptr args, i64 nchunks)
    set_threads: ir.Function


def _x86_host() -> bool:
    """Libraries are compiled for the host: spin with ``pause`` there (it yields to a sibling hyperthread)."""
    from cuvil.codegen.link import host_target

    arch = host_target().triple.split("-", 1)[0]
    return arch in ("x86_64", "i386", "i686")


def _decl(mod: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    found = mod.globals.get(name)
    if isinstance(found, ir.Function):
        return found
    return ir.Function(mod, ir.FunctionType(ret, args), name=name)


def _global(mod: ir.Module, name: str, ty: ir.Type, align: int = 8) -> ir.GlobalVariable:
    g = ir.GlobalVariable(mod, ty, name=name)
    g.linkage = "internal"
    g.initializer = ir.Constant(ty, None)
    g.align = align
    return g


def _c_string(mod: ir.Module, name: str, text: str) -> ir.GlobalVariable:
    data = bytearray(text.encode() + b"\0")
    g = ir.GlobalVariable(mod, ir.ArrayType(I8, len(data)), name=name)
    g.linkage = "private"
    g.global_constant = True
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    return g


def set_default_threads(mod: ir.Module, threads: int | None) -> None:
    """The pool size a library starts with (None or 0: detect); a no-op when no kernel uses the pool."""
    want = mod.globals.get("cuvil.pool.want")
    if isinstance(want, ir.GlobalVariable) and threads:
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
        self.state = _global(mod, "cuvil.pool.state", I64, 64)  # gen | nchunks | next
        self.done = _global(mod, "cuvil.pool.done", I64, 64)
        self.task = _global(mod, "cuvil.pool.task", PTR)
        self.args = _global(mod, "cuvil.pool.args", PTR)
        self.busy = _global(mod, "cuvil.pool.busy", I32, 64)
        self.want = _global(mod, "cuvil.pool.want", I32)  # requested size; 0: detect
        self.size = _global(mod, "cuvil.pool.size", I32)  # resolved size (0: not yet)
        self.started = _global(mod, "cuvil.pool.started", I32)  # workers running
        self.shutdown = _global(mod, "cuvil.pool.shutdown", I32)
        self.pid = _global(mod, "cuvil.pool.pid", I32)
        self.threads = _global(mod, "cuvil.pool.threads", ir.ArrayType(I64, MAX_THREADS))
        self.env_name = _c_string(mod, "cuvil.pool.env", "CUVIL_NUM_THREADS")
        self.pause = _decl(mod, "llvm.x86.sse2.pause", VOID, []) if _x86_host() else None
        self.lock = _decl(mod, "pthread_mutex_lock", I32, [PTR])
        self.unlock = _decl(mod, "pthread_mutex_unlock", I32, [PTR])
        self.cwait = _decl(mod, "pthread_cond_wait", I32, [PTR, PTR])
        self.broadcast = _decl(mod, "pthread_cond_broadcast", I32, [PTR])
        self.signal = _decl(mod, "pthread_cond_signal", I32, [PTR])
        self.create = _decl(mod, "pthread_create", I32, [PTR, PTR, PTR, PTR])
        self.join = _decl(mod, "pthread_join", I32, [I64, PTR])
        self.getpid = _decl(mod, "getpid", I32, [])
        self.getenv = _decl(mod, "getenv", PTR, [PTR])
        self.atoi = _decl(mod, "atoi", I32, [PTR])
        self.affinity = _decl(mod, "sched_getaffinity", I32, [I32, I64, PTR])
        self.memset = _decl(mod, "llvm.memset.p0.i64", VOID, [PTR, I8, I64, ir.IntType(1)])
        self.ctpop = _decl(mod, "llvm.ctpop.i64", I64, [I64])

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _func(mod: ir.Module, name: str, ret: ir.Type, args: list[ir.Type], internal: bool = True
              ) -> tuple[ir.Function, ir.IRBuilder]:
        fn = ir.Function(mod, ir.FunctionType(ret, args), name=name)
        if internal:
            fn.linkage = "internal"
        return fn, ir.IRBuilder(fn.append_basic_block("entry"))

    def _spin(self, b: ir.IRBuilder) -> None:
        if self.pause is not None:
            b.call(self.pause, [])

    def _back_off(self, b: ir.IRBuilder, spins: ir.Value, spin: ir.Block, sleep: ir.Block) -> None:
        """One pause, then spin again until SPIN_PAUSES pauses have passed, then go to sleep (so an
        oversubscribed machine is not burnt by waiters)."""
        self._spin(b)
        n = b.add(b.load(spins, typ=I32), ir.Constant(I32, 1))
        b.store(n, spins)
        b.cbranch(b.icmp_signed("<", n, ir.Constant(I32, SPIN_PAUSES)), spin, sleep)

    def _load(self, b: ir.IRBuilder, g: ir.Value, ty: ir.Type) -> ir.Value:
        return b.load_atomic(g, _SEQ, 8 if ty == I64 else 4, typ=ty)

    def _store(self, b: ir.IRBuilder, v: ir.Value, g: ir.Value) -> None:
        b.store_atomic(v, g, _SEQ, 8 if v.type == I64 else 4)

    @staticmethod
    def _gen(b: ir.IRBuilder, s: ir.Value) -> ir.Value:
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
        """i64 claim(i64 gen): the next chunk of job ``gen``, or -1 when it has none left."""
        fn, b = self._func(self.mod, "cuvil.pool.claim", I64, [I64])
        gen = fn.args[0]
        loop = fn.append_basic_block("loop")
        none = fn.append_basic_block("none")
        check = fn.append_basic_block("check")
        cas = fn.append_basic_block("cas")
        got = fn.append_basic_block("got")
        b.branch(loop)
        b.position_at_end(loop)
        s = self._load(b, self.state, I64)
        b.cbranch(b.icmp_unsigned("==", self._gen(b, s), gen), check, none)
        b.position_at_end(check)
        nxt = b.and_(s, ir.Constant(I64, _MASK20))
        count = b.and_(b.lshr(s, ir.Constant(I64, _CHUNK_BITS)), ir.Constant(I64, _MASK20))
        b.cbranch(b.icmp_unsigned("<", nxt, count), cas, none)
        b.position_at_end(cas)
        res = b.cmpxchg(self.state, s, b.add(s, ir.Constant(I64, 1)), _SEQ, _SEQ)
        b.cbranch(b.extract_value(res, 1), got, loop)
        b.position_at_end(got)
        b.ret(nxt)
        b.position_at_end(none)
        b.ret(ir.Constant(I64, -1))
        return fn

    def _emit_work(self) -> ir.Function:
        """void work(i64 state): claim and run chunks of the job ``state`` describes until none are left."""
        fn, b = self._func(self.mod, "cuvil.pool.work", VOID, [I64])
        s = fn.args[0]
        gen = self._gen(b, s)
        count = b.and_(b.lshr(s, ir.Constant(I64, _CHUNK_BITS)), ir.Constant(I64, _MASK20))
        task = b.load(self.task, typ=PTR)
        args = b.load(self.args, typ=PTR)
        loop = fn.append_basic_block("loop")
        body = fn.append_basic_block("body")
        last = fn.append_basic_block("last")
        out = fn.append_basic_block("out")
        b.branch(loop)
        b.position_at_end(loop)
        c = b.call(self.claim, [gen])
        b.cbranch(b.icmp_signed("<", c, ir.Constant(I64, 0)), out, body)
        b.position_at_end(body)
        b.call(_Callee(task), [args, c])
        finished = b.add(b.atomic_rmw("add", self.done, ir.Constant(I64, 1), _SEQ), ir.Constant(I64, 1))
        b.cbranch(b.icmp_unsigned("==", finished, count), last, loop)
        b.position_at_end(last)
        b.call(self.lock, [self.mutex])
        b.call(self.signal, [self.cond_done])
        b.call(self.unlock, [self.mutex])
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
        spin = fn.append_basic_block("spin")
        spin_next = fn.append_basic_block("spin.next")
        sleep = fn.append_basic_block("sleep")
        sleep_check = fn.append_basic_block("sleep.check")
        sleep_wait = fn.append_basic_block("sleep.wait")
        woke = fn.append_basic_block("woke")
        work = fn.append_basic_block("work")
        leave = fn.append_basic_block("leave")
        b.branch(wait)

        b.position_at_end(wait)
        b.store(ir.Constant(I32, 0), spins)
        b.branch(spin)

        b.position_at_end(spin)
        s = self._load(b, self.state, I64)
        changed = b.icmp_unsigned("!=", self._gen(b, s), b.load(seen_slot, typ=I64))
        stop = b.icmp_unsigned("!=", self._load(b, self.shutdown, I32), ir.Constant(I32, 0))
        b.cbranch(b.or_(changed, stop), woke, spin_next)

        b.position_at_end(spin_next)
        self._back_off(b, spins, spin, sleep)

        b.position_at_end(sleep)
        b.call(self.lock, [self.mutex])
        b.branch(sleep_check)
        b.position_at_end(sleep_check)
        s2 = self._load(b, self.state, I64)
        same = b.icmp_unsigned("==", self._gen(b, s2), b.load(seen_slot, typ=I64))
        running = b.icmp_unsigned("==", self._load(b, self.shutdown, I32), ir.Constant(I32, 0))
        b.cbranch(b.and_(same, running), sleep_wait, woke_unlock := fn.append_basic_block("sleep.done"))
        b.position_at_end(sleep_wait)
        b.call(self.cwait, [self.cond_work, self.mutex])
        b.branch(sleep_check)
        b.position_at_end(woke_unlock)
        b.call(self.unlock, [self.mutex])
        b.branch(woke)

        b.position_at_end(woke)
        b.cbranch(b.icmp_unsigned("!=", self._load(b, self.shutdown, I32), ir.Constant(I32, 0)), leave, work)

        b.position_at_end(work)
        s3 = self._load(b, self.state, I64)
        b.store(self._gen(b, s3), seen_slot)
        b.call(self.work, [s3])
        b.branch(wait)

        b.position_at_end(leave)
        b.ret(ir.Constant(PTR, None))
        return fn

    def _emit_stop(self) -> ir.Function:
        """void stop(): ask every worker to leave, join them, and reset the pool to 'not started'."""
        fn, b = self._func(self.mod, "cuvil.pool.stop", VOID, [])
        n = b.load(self.started, typ=I32)
        has = fn.append_basic_block("has")
        done = fn.append_basic_block("done")
        b.cbranch(b.icmp_signed(">", n, ir.Constant(I32, 0)), has, done)
        b.position_at_end(has)
        b.call(self.lock, [self.mutex])
        self._store(b, ir.Constant(I32, 1), self.shutdown)
        b.call(self.broadcast, [self.cond_work])
        b.call(self.unlock, [self.mutex])
        i_slot = b.alloca(I32)
        b.store(ir.Constant(I32, 0), i_slot)
        head = fn.append_basic_block("join.head")
        body = fn.append_basic_block("join.body")
        end = fn.append_basic_block("join.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(i_slot, typ=I32)
        b.cbranch(b.icmp_signed("<", i, n), body, end)
        b.position_at_end(body)
        tid = b.load(b.gep(self.threads, [ir.Constant(I64, 0), b.sext(i, I64)], inbounds=True,
                           source_etype=self.threads.value_type), typ=I64)
        b.call(self.join, [tid, ir.Constant(PTR, None)])
        b.store(b.add(i, ir.Constant(I32, 1)), i_slot)
        b.branch(head)
        b.position_at_end(end)
        b.store(ir.Constant(I32, 0), self.started)
        self._store(b, ir.Constant(I32, 0), self.shutdown)
        b.branch(done)
        b.position_at_end(done)
        b.ret_void()
        return fn

    def _emit_resolve(self) -> ir.Function:
        """i32 resolve(): the pool size: the requested one, else $CUVIL_NUM_THREADS, else the CPUs we may use."""
        fn, b = self._func(self.mod, "cuvil.pool.resolve", I32, [])
        want = b.load(self.want, typ=I32)
        given = fn.append_basic_block("given")
        env = fn.append_basic_block("env")
        env_set = fn.append_basic_block("env.set")
        env_num = fn.append_basic_block("env.num")
        cpus = fn.append_basic_block("cpus")
        finish = fn.append_basic_block("finish")
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
        b.call(self.memset, [mask, ir.Constant(I8, 0), ir.Constant(I64, 8 * words), ir.Constant(ir.IntType(1), 0)])
        rc = b.call(self.affinity, [ir.Constant(I32, 0), ir.Constant(I64, 8 * words), mask])
        count: ir.Value = ir.Constant(I64, 0)
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
        serial = fn.append_basic_block("serial")
        try_pool = fn.append_basic_block("try")
        owned = fn.append_basic_block("owned")
        forked = fn.append_basic_block("forked")
        sized = fn.append_basic_block("sized")
        need_size = fn.append_basic_block("need_size")
        have_size = fn.append_basic_block("have_size")
        start_head = fn.append_basic_block("start.head")
        start_body = fn.append_basic_block("start.body")
        start_fail = fn.append_basic_block("start.fail")
        started = fn.append_basic_block("started")
        publish = fn.append_basic_block("publish")
        release_serial = fn.append_basic_block("release.serial")

        few = b.icmp_signed("<=", nchunks, ir.Constant(I64, 1))
        too_many = b.icmp_signed(">", nchunks, ir.Constant(I64, MAX_CHUNKS))
        b.cbranch(b.or_(few, too_many), serial, try_pool)

        # serial: every chunk on the calling thread
        b.position_at_end(serial)
        self._serial_loop(b, fn, task, args, nchunks)

        # take the pool, or run serially when another run holds it
        b.position_at_end(try_pool)
        res = b.cmpxchg(self.busy, ir.Constant(I32, 0), ir.Constant(I32, 1), _SEQ, _SEQ)
        b.cbranch(b.extract_value(res, 1), owned, serial)

        b.position_at_end(owned)
        pid = b.call(self.getpid, [])
        b.cbranch(b.icmp_signed("!=", pid, b.load(self.pid, typ=I32)), forked, sized)

        b.position_at_end(forked)  # first use, or a forked child: no worker of ours exists here
        for g in (self.mutex, self.cond_work, self.cond_done):
            b.call(self.memset, [g, ir.Constant(I8, 0), ir.Constant(I64, _SYNC_BYTES), ir.Constant(ir.IntType(1), 0)])
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
        slot = b.gep(self.threads, [ir.Constant(I64, 0), b.sext(running, I64)], inbounds=True,
                     source_etype=self.threads.value_type)
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
        gen = b.and_(b.add(self._gen(b, self._load(b, self.state, I64)), ir.Constant(I64, 1)),
                     ir.Constant(I64, (1 << 24) - 1))
        new_state = b.or_(b.shl(gen, ir.Constant(I64, _GEN_SHIFT)), b.shl(nchunks, ir.Constant(I64, _CHUNK_BITS)))
        self._store(b, new_state, self.state)
        b.call(self.broadcast, [self.cond_work])
        b.call(self.unlock, [self.mutex])
        b.call(self.work, [new_state])

        # wait until every chunk has finished: spin briefly, then sleep
        spins = b.alloca(I32)
        b.store(ir.Constant(I32, 0), spins)
        spin = fn.append_basic_block("wait.spin")
        spin_next = fn.append_basic_block("wait.next")
        sleep = fn.append_basic_block("wait.sleep")
        sleep_check = fn.append_basic_block("wait.check")
        sleep_wait = fn.append_basic_block("wait.wait")
        sleep_done = fn.append_basic_block("wait.unlock")
        finished = fn.append_basic_block("finished")
        b.branch(spin)
        b.position_at_end(spin)
        all_done = b.icmp_unsigned("==", self._load(b, self.done, I64), nchunks)
        b.cbranch(all_done, finished, spin_next)
        b.position_at_end(spin_next)
        self._back_off(b, spins, spin, sleep)
        b.position_at_end(sleep)
        b.call(self.lock, [self.mutex])
        b.branch(sleep_check)
        b.position_at_end(sleep_check)
        b.cbranch(b.icmp_unsigned("==", self._load(b, self.done, I64), nchunks), sleep_done, sleep_wait)
        b.position_at_end(sleep_wait)
        b.call(self.cwait, [self.cond_done, self.mutex])
        b.branch(sleep_check)
        b.position_at_end(sleep_done)
        b.call(self.unlock, [self.mutex])
        b.branch(finished)
        b.position_at_end(finished)
        self._store(b, ir.Constant(I32, 0), self.busy)
        b.ret_void()
        return fn

    def _serial_loop(self, b: ir.IRBuilder, fn: ir.Function, task: ir.Value, args: ir.Value,
                     nchunks: ir.Value) -> None:
        pre = b.block
        head = fn.append_basic_block("serial.head")
        body = fn.append_basic_block("serial.body")
        end = fn.append_basic_block("serial.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, nchunks), body, end)
        b.position_at_end(body)
        b.call(_Callee(task), [args, i])
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), body)
        b.branch(head)
        b.position_at_end(end)
        b.ret_void()

    def _emit_set_threads(self) -> ir.Function:
        """Exported ``int32_t <prefix>_set_num_threads(int32_t n)``: the pool size from the next run on."""
        fn, b = self._func(self.mod, f"{self.mod.name}_set_num_threads", I32, [I32], internal=False)
        n = fn.args[0]
        n.name = "n"
        busy = fn.append_basic_block("busy")
        free = fn.append_basic_block("free")
        res = b.cmpxchg(self.busy, ir.Constant(I32, 0), ir.Constant(I32, 1), _SEQ, _SEQ)
        b.cbranch(b.extract_value(res, 1), free, busy)
        b.position_at_end(busy)  # a run is in progress: the caller must not race with it
        b.ret(ir.Constant(I32, 1))
        b.position_at_end(free)
        same_process = b.icmp_signed("==", b.call(self.getpid, []), b.load(self.pid, typ=I32))
        stop_block = fn.append_basic_block("stop")
        after = fn.append_basic_block("after")
        b.cbranch(same_process, stop_block, after)
        b.position_at_end(stop_block)
        b.call(self.stop, [])
        b.branch(after)
        b.position_at_end(after)
        clean = b.select(b.icmp_signed(">", n, ir.Constant(I32, 0)), n, ir.Constant(I32, 0))
        b.store(clean, self.want)
        b.store(ir.Constant(I32, 0), self.size)
        self._store(b, ir.Constant(I32, 0), self.busy)
        b.ret(ir.Constant(I32, 0))
        return fn

    def _emit_destructor(self) -> None:
        """Join the workers when the library is unloaded (dlclose or exit), before its code goes away."""
        fn, b = self._func(self.mod, "cuvil.pool.fini", VOID, [])
        same_process = b.icmp_signed("==", b.call(self.getpid, []), b.load(self.pid, typ=I32))
        stop_block = fn.append_basic_block("stop")
        after = fn.append_basic_block("after")
        b.cbranch(same_process, stop_block, after)
        b.position_at_end(stop_block)
        b.call(self.stop, [])
        b.branch(after)
        b.position_at_end(after)
        b.ret_void()
        entry_ty = ir.LiteralStructType([I32, PTR, PTR])
        dtors = ir.GlobalVariable(self.mod, ir.ArrayType(entry_ty, 1), name="llvm.global_dtors")
        dtors.linkage = "appending"
        dtors.initializer = ir.Constant(ir.ArrayType(entry_ty, 1),
                                        [ir.Constant(entry_ty, [ir.Constant(I32, 65535), fn, ir.Constant(PTR, None)])])


class _Callee(ir.Value):
    """A ``ptr`` called indirectly as a task (``void (ptr, i64)``): llvmlite wants a function type on callees."""

    def __init__(self, ptr: ir.Value) -> None:
        self.ptr = ptr
        self.type = ptr.type
        self.function_type = TASK_TYPE

    def get_reference(self) -> str:
        return self.ptr.get_reference()
