"""Per-step timing built into a library on request (``compile(..., profile=True)``).

A profiled library reads the monotonic clock around every op of its run and adds the nanoseconds to that
step's counter (an atomic add: contexts may run on several threads at once), and counts the runs that
returned 0. It exports one more function::

    int64_t P_profile(int64_t* ns, int64_t capacity, int32_t reset);

which copies up to ``capacity`` step counters (in run order, the manifest's ``profile.steps``) into ``ns``
and returns the number of runs counted; with ``reset`` non-zero it zeroes the counters after reading them.
A library compiled without ``profile`` has neither the clock reads nor the symbol: profiling costs nothing
unless asked for. The clock is ``clock_gettime(CLOCK_MONOTONIC)`` (Linux), about 20 ns a read.
"""

from __future__ import annotations

from llvmlite import ir

from cuvil.codegen.llvm_types import I32, I64, PTR, declare
from cuvil.codegen.loops import const, for_range, if_then
from cuvil.codegen.manifest import profile_symbol
from cuvil.codegen.scalar import Builder, GlobalVariable, Val
from cuvil.codegen.target import Target
from cuvil.errors import CodegenError

CLOCK_MONOTONIC = 1
"""Linux's clock id (``<time.h>``)."""

TIMESPEC = ir.LiteralStructType([I64, I64])
"""``struct timespec`` on 64-bit Linux: seconds and nanoseconds, both 64-bit."""


def check_profile_target(target: Target) -> None:
    """Profiling reads Linux's monotonic clock: refuse other targets with a clear error."""
    if "linux" not in target.triple or target.pointer_bits != 64:
        raise CodegenError(f"per-step profiling needs a 64-bit Linux target, not {target.triple}",
                           location="profile", hint="compile without profile=True (--profile) for this target")


class StepClock:
    """The counters of one profiled run function and the code that feeds them."""

    def __init__(self, mod: ir.Module, prefix: str, steps: int) -> None:
        self.mod, self.prefix, self.steps = mod, prefix, steps
        self.ns = self._global("cuvil.profile.ns", ir.ArrayType(I64, max(steps, 1)))
        self.runs = self._global("cuvil.profile.runs", I64)
        self.clock = declare(mod, "clock_gettime", I32, [I32, PTR])
        self.spec: Val | None = None

    def _global(self, name: str, ty: ir.Type) -> GlobalVariable:
        g = GlobalVariable(self.mod, ty, name=name)
        g.linkage = "internal"
        g.initializer = ir.Constant(ty, None)
        g.align = 64
        return g

    def now(self, b: Builder) -> Val:
        """Nanoseconds of the monotonic clock (the timespec lives in the function's entry block)."""
        if self.spec is None:
            with b.goto_entry_block():
                self.spec = b.alloca(TIMESPEC, name="now")
        b.call(self.clock, [ir.Constant(I32, CLOCK_MONOTONIC), self.spec])
        sec = b.load(b.gep(self.spec, [const(0), ir.Constant(I32, 0)], inbounds=True, source_etype=TIMESPEC),
                     typ=I64)
        nsec = b.load(b.gep(self.spec, [const(0), ir.Constant(I32, 1)], inbounds=True, source_etype=TIMESPEC),
                      typ=I64)
        return b.add(b.mul(sec, const(1_000_000_000)), nsec)

    def add(self, b: Builder, step: int, start: Val) -> None:
        """Add the time since ``start`` to step ``step``'s counter."""
        slot = b.gep(self.ns, [const(0), const(step)], inbounds=True, source_etype=self.ns.value_type)
        b.atomic_rmw("add", slot, b.sub(self.now(b), start), "monotonic")

    def count_run(self, b: Builder) -> None:
        b.atomic_rmw("add", self.runs, const(1), "monotonic")

    def emit_reader(self) -> ir.Function:
        """``int64_t P_profile(int64_t* ns, int64_t capacity, int32_t reset)`` (see the module's docstring)."""
        fn = ir.Function(self.mod, ir.FunctionType(I64, [PTR, I64, I32]), name=profile_symbol(self.prefix))
        out, capacity, reset = fn.args
        out.name, capacity.name, reset.name = "ns", "capacity", "reset"
        b = Builder(fn.append_basic_block("entry"))
        runs = b.load_atomic(self.runs, "monotonic", 8, typ=I64)
        ty = self.ns.value_type
        zeroing = b.icmp_signed("!=", reset, ir.Constant(I32, 0))
        has_out = b.icmp_unsigned("!=", out, ir.Constant(PTR, None))
        n = b.select(b.icmp_signed("<", capacity, const(self.steps)), capacity, const(self.steps))
        n = b.select(has_out, b.select(b.icmp_signed("<", n, const(0)), const(0), n), const(0))

        def copy(k: Val) -> None:
            slot = b.gep(self.ns, [const(0), k], inbounds=True, source_etype=ty)
            value = b.load_atomic(slot, "monotonic", 8, typ=I64)
            b.store(value, b.gep(out, [k], inbounds=True, source_etype=I64))

        for_range(b, const(0), n, "copy", copy)

        def zero() -> None:
            for_range(b, const(0), const(self.steps), "zero",
                      lambda k: b.atomic_rmw("xchg", b.gep(self.ns, [const(0), k], inbounds=True, source_etype=ty),
                                             const(0), "monotonic"))
            b.atomic_rmw("xchg", self.runs, const(0), "monotonic")

        if_then(b, zeroing, "reset", zero)
        b.ret(runs)
        return fn
