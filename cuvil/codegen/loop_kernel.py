"""A ``loop`` lowered to a real loop: one function that runs the body's kernels once per iteration.

The results of one loop (its final states and stacked scan outputs) run as one
:class:`~cuvil.codegen.region_steps.StructuredGroup`. The function is
``i32 name(ptr out_0, ..., ptr out_{R-1}, ptr in_0, ..., ptr work, ptr scratch)``: a null ``out``
is a result nothing reads. ``work`` holds the iteration index, the state (twice: the body may yield
its state arguments in another order) and the body's own values, planned like a function's arena;
``scratch`` is the tuned kernels' shared scratch area. Per iteration ``t`` (counting down when
``reverse``): the body's ops in order, the new state copied in, each scan output's slice copied to
``out[t]``; a while loop (``stop``) also leaves once its stop state is false, checked before each
iteration. The iteration order and the copies are exactly the reading of
:func:`cuvil.ir.ops.control.iterate_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from llvmlite import ir

from cuvil.codegen.abi import OK
from cuvil.codegen.loops import const, counted_loop, for_range
from cuvil.codegen.plan import nbytes
from cuvil.codegen.region_steps import (
    RegionSteps,
    StructuredGroup,
    copier,
    pointer,
    round_up,
    structured_function,
    work_pointer,
)
from cuvil.codegen.scalar import I8, I32, Builder, Val
from cuvil.errors import CodegenError
from cuvil.ir.ops.control import loop_groups, open_body
from cuvil.ir.values import Value


class LoopKernel:
    """The lowered loop of one group (static shapes: the function was specialized first)."""

    name = "loop"

    def __init__(self, group: StructuredGroup, constants: Mapping[str, np.ndarray]) -> None:
        v = group.first
        self.group = group
        self.carried = int(v.attr("carried"))
        self.scanned = int(v.attr("scanned"))
        trips = v.attr("trips")[0]
        if not isinstance(trips, int):
            raise CodegenError(f"a loop over {trips} iterations reached the code generator unspecialized",
                               location="loop", hint="compile at concrete shapes (--shape)")
        self.trips = trips
        self.reverse = bool(v.attr("reverse"))
        self.stop = int(v.attr("stop"))
        # the body with its constant invariants in place: kernels pack constant weights once, at
        # compile time, instead of packing an argument on every iteration
        params, results, operands = open_body(v)
        self.params, self.results, self.operands = params, results, tuple(operands)
        # work area: the index, the state, the next state, then the body's values
        self.state_at: list[int] = []
        top = round_up(8)
        for k in range(self.carried):
            self.state_at.append(top)
            top += round_up(nbytes(self.operands[k].type))
        self.next_at: list[int] = []
        for k in range(self.carried):
            self.next_at.append(top)
            top += round_up(nbytes(self.operands[k].type))
        self.body = RegionSteps(self.results, constants, top)
        self.work_bytes = self.body.end
        self.scratch_bytes = self.body.scratch_bytes
        self.constant_bytes = self.body.constant_bytes

    @property
    def constants_read(self) -> list[Value]:
        """The constants the body's kernels read as they are (a packed weight is embedded packed)."""
        return self.body.constants_read

    def emit(self, mod: ir.Module, name: str, constant: Callable[[Value], ir.Value]) -> ir.Function:
        """The loop's function; ``constant`` gives the global holding a constant's data."""
        n_out = len(self.results)
        fn, outs, ins, work, scratch = structured_function(mod, name, n_out, len(self.operands))
        body_fns = self.body.emit_functions(mod, f"{name}.b", constant)

        b = Builder(fn.append_basic_block("entry"))
        copy = copier(b)

        def at(off: int) -> ir.Value:
            return work_pointer(b, work, off)

        def offset(base: ir.Value, t: Val, size: int) -> ir.Value:
            return b.gep(base, [b.mul(t, const(size))], inbounds=True, source_etype=ir.IntType(8))

        cs, ss, inv = loop_groups(len(self.operands), self.carried, self.scanned)
        for k in cs:
            copy(at(self.state_at[k]), ins[k], nbytes(self.operands[k].type))

        def iteration(i: Val) -> None:
            t = b.sub(const(self.trips - 1), i) if self.reverse else i
            b.store(t, at(0))
            where: dict[Value, ir.Value] = {self.params[0]: at(0)}
            for k in cs:
                where[self.params[1 + k]] = at(self.state_at[k])
            for k in ss:
                where[self.params[1 + k]] = offset(ins[k], t, nbytes(self.params[1 + k].type))
            for k in inv:
                where[self.params[1 + k]] = ins[k]
            self.body.emit_run(b, body_fns, where, at, constant, scratch)
            results = self.results
            for k in cs:
                copy(at(self.next_at[k]), pointer(results[k], where, constant), nbytes(results[k].type))
            for k in cs:
                copy(at(self.state_at[k]), at(self.next_at[k]), nbytes(results[k].type))
            for j in range(self.carried, n_out):
                if j in self.group.members:
                    size = nbytes(results[j].type)
                    copy(offset(outs[j], t, size), pointer(results[j], where, constant), size)

        if self.stop < 0:
            for_range(b, 0, self.trips, "iter", iteration)
        else:  # a while loop: also stops once its stop state is false, checked before each iteration
            def more(i: Val) -> Val:
                go = b.icmp_unsigned("!=", b.load(at(self.state_at[self.stop]), typ=I8), ir.Constant(I8, 0))
                return b.and_(b.icmp_signed("<", i, const(self.trips)), go)

            def run(i: Val, carried: list[Val]) -> list[Val]:
                iteration(i)
                return carried

            counted_loop(b, "while", const(0), more, 1, run)
        for k in cs:
            if k in self.group.members:
                copy(outs[k], at(self.state_at[k]), nbytes(self.operands[k].type))
        b.ret(ir.Constant(I32, OK))
        return fn
