"""A ``loop`` lowered to a real loop: one function that runs the body's kernels once per iteration.

The results of one loop (its final states and stacked scan outputs) run as one
:class:`~cuvil.codegen.region_steps.StructuredGroup`. The function is
``i32 name(ptr out_0, ..., ptr out_{R-1}, ptr in_0, ..., ptr work, ptr scratch)`` (and a trailing
``ptr dims`` in a library for a shape class, whose trip count and sizes may be dims): a null ``out``
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
from cuvil.codegen.llvm_types import I8, I32
from cuvil.codegen.loops import const, counted_loop, for_range
from cuvil.codegen.region_steps import (
    RegionSteps,
    StructuredFunction,
    StructuredGroup,
    copier,
    pointer,
    round_up,
    work_pointer,
)
from cuvil.codegen.scalar import Val
from cuvil.codegen.sizing import STATIC, Sizing
from cuvil.errors import CodegenError
from cuvil.ir.ops.control import loop_groups, open_body
from cuvil.ir.symbolic import Dim
from cuvil.ir.values import Value


class LoopKernel:
    """The lowered loop of one group: at static shapes, or in a shape class (trips and sizes from dims)."""

    name = "loop"

    def __init__(self, group: StructuredGroup, constants: Mapping[str, np.ndarray], sizing: Sizing = STATIC) -> None:
        v = group.first
        self.group = group
        self.sizing = sizing
        self.carried = int(v.attr("carried"))
        self.scanned = int(v.attr("scanned"))
        trips = v.attr("trips")[0]
        if not isinstance(trips, int) and sizing.shape_class is None:
            raise CodegenError(f"a loop over {trips} iterations reached the code generator unspecialized",
                               location="loop", hint="compile at concrete shapes (--specialize), or for the shape "
                                                     "class")
        self.trips: Dim = trips
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
            top += round_up(sizing.planned(self.operands[k].type))
        self.next_at: list[int] = []
        for k in range(self.carried):
            self.next_at.append(top)
            top += round_up(sizing.planned(self.operands[k].type))
        self.body = RegionSteps(self.results, constants, top, sizing)
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
        sf = StructuredFunction.create(mod, name, n_out, len(self.operands), self.sizing)
        outs, ins, work, scratch, b = sf.outs, sf.ins, sf.work, sf.scratch, sf.b
        body_fns = self.body.emit_functions(mod, f"{name}.b", constant)
        copy = copier(b)

        def at(off: int) -> ir.Value:
            return work_pointer(b, work, off)

        def offset(base: ir.Value, t: Val, size: Val) -> ir.Value:
            return b.gep(base, [b.mul(t, size)], inbounds=True, source_etype=ir.IntType(8))

        cs, ss, inv = loop_groups(len(self.operands), self.carried, self.scanned)
        # every size and the trip count, at the entry (they dominate the loop and what follows it)
        state_size = {k: sf.size(self.sizing, self.operands[k].type) for k in cs}
        scan_in_size = {k: sf.size(self.sizing, self.params[1 + k].type) for k in ss}
        result_size = [sf.size(self.sizing, r.type) for r in self.results]
        trips = const(self.trips) if isinstance(self.trips, int) else sf.dims.value(self.trips)  # type: ignore[union-attr]
        for k in cs:
            copy(at(self.state_at[k]), ins[k], state_size[k])

        def iteration(i: Val) -> None:
            t = b.sub(b.sub(trips, const(1)), i) if self.reverse else i
            b.store(t, at(0))
            where: dict[Value, ir.Value] = {self.params[0]: at(0)}
            for k in cs:
                where[self.params[1 + k]] = at(self.state_at[k])
            for k in ss:
                where[self.params[1 + k]] = offset(ins[k], t, scan_in_size[k])
            for k in inv:
                where[self.params[1 + k]] = ins[k]
            self.body.emit_run(b, body_fns, where, at, constant, scratch, sf.dims_ptr)
            results = self.results
            for k in cs:
                copy(at(self.next_at[k]), pointer(results[k], where, constant), result_size[k])
            for k in cs:
                copy(at(self.state_at[k]), at(self.next_at[k]), result_size[k])
            for j in range(self.carried, n_out):
                if j in self.group.members:
                    copy(offset(outs[j], t, result_size[j]), pointer(results[j], where, constant), result_size[j])

        if self.stop < 0:
            for_range(b, const(0), trips, "iter", iteration)
        else:  # a while loop: also stops once its stop state is false, checked before each iteration
            def more(i: Val) -> Val:
                go = b.icmp_unsigned("!=", b.load(at(self.state_at[self.stop]), typ=I8), ir.Constant(I8, 0))
                return b.and_(b.icmp_signed("<", i, trips), go)

            def run(i: Val, carried: list[Val]) -> list[Val]:
                iteration(i)
                return carried

            counted_loop(b, "while", const(0), more, 1, run)
        for k in cs:
            if k in self.group.members:
                copy(outs[k], at(self.state_at[k]), state_size[k])
        b.ret(ir.Constant(I32, OK))
        return sf.fn
