"""A ``loop`` lowered to a real loop: one function that runs the body's kernels once per iteration.

The results of one loop (its final states and stacked scan outputs) are separate CIR values that
share operands and body; the code generator runs them as one :class:`LoopGroup`. The function is
``i32 name(ptr out_0, ..., ptr out_{R-1}, ptr in_0, ..., ptr work, ptr scratch)``: a null ``out``
is a result nothing reads. ``work`` holds the iteration index, the state (twice: the body may yield
its state arguments in another order) and the body's own values, planned like a function's arena;
``scratch`` is the tuned kernels' shared scratch area. Per iteration ``t`` (counting down when
``reverse``): the body's ops in order, the new state copied in, each scan output's slice copied to
``out[t]``. The iteration order and the copies are exactly the reading of
:func:`cuvil.ir.ops.control.iterate_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen.abi import OK
from cuvil.codegen.kernels import Kernel, select_kernel
from cuvil.codegen.loops import const, for_range
from cuvil.codegen.lower_rule import emit_rule_kernel
from cuvil.codegen.plan import nbytes, plan_steps
from cuvil.codegen.scalar import I1, I32, I64, PTR, Builder, Val, declare
from cuvil.errors import CodegenError
from cuvil.ir.opdef import get_op
from cuvil.ir.ops.control import loop_groups, open_body
from cuvil.ir.values import Value, walk

WORK_ALIGN = 64


@dataclass
class LoopGroup:
    """The results of one loop present in a function, by output index."""

    members: dict[int, Value]

    @property
    def first(self) -> Value:
        return next(iter(self.members.values()))


def _round(n: int) -> int:
    return -(-n // WORK_ALIGN) * WORK_ALIGN


class LoopKernel:
    """The lowered loop of one group (static shapes: the function was specialized first)."""

    name = "loop"

    def __init__(self, group: LoopGroup, constants: Mapping[str, np.ndarray]) -> None:
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
        # the body with its constant invariants in place: kernels pack constant weights once, at
        # compile time, instead of packing an argument on every iteration
        params, results, operands = open_body(v)
        self.params, self.results, self.operands = params, results, tuple(operands)
        self.steps = [u for u in walk(self.results) if not (u.is_param or u.is_const)]
        self.kernels: list[Kernel | None] = [select_kernel(u, constants) for u in self.steps]
        # work area: the index, the state, the next state, then the body's values
        self.state_at: list[int] = []
        top = _round(8)
        for k in range(self.carried):
            self.state_at.append(top)
            top += _round(nbytes(self.operands[k].type))
        self.next_at: list[int] = []
        for k in range(self.carried):
            self.next_at.append(top)
            top += _round(nbytes(self.operands[k].type))
        offsets, size = plan_steps(self.steps, keep=[r for r in self.results if not r.is_const])
        self.value_at = {u: top + off for u, off in offsets.items()}
        self.work_bytes = top + size
        self.scratch_bytes = max((kn.scratch_bytes for kn in self.kernels if kn is not None), default=0)
        self.constant_bytes = sum(kn.constant_bytes for kn in self.kernels if kn is not None)

    @property
    def constants_read(self) -> list[Value]:
        """The constants the body's kernels read as they are (a packed weight is embedded packed)."""
        out: list[Value] = []
        for u, kn in zip(self.steps, self.kernels, strict=True):
            unused = kn.unused_operands if kn is not None else frozenset()
            out += [o for j, o in enumerate(u.operands) if o.is_const and j not in unused]
        return out + [r for r in self.results if r.is_const]

    def emit(self, mod: ir.Module, name: str, constant: Callable[[Value], ir.Value]) -> ir.Function:
        """The loop's function; ``constant`` gives the global holding a constant's data."""
        n_out = len(self.results)
        fn = ir.Function(mod, ir.FunctionType(I32, [PTR] * (n_out + len(self.operands) + 2)), name=name)
        fn.linkage = "internal"
        outs, ins = fn.args[:n_out], fn.args[n_out:n_out + len(self.operands)]
        work, scratch = fn.args[-2], fn.args[-1]
        body_fns = []
        for k, (u, kn) in enumerate(zip(self.steps, self.kernels, strict=True)):
            if kn is not None:
                body_fns.append(kn.emit(mod, f"{name}.b{k}.{u.op}"))
                continue
            in_types = [o.type for o in u.operands]
            rule = get_op(u.op).make_rule(in_types, u.attr_dict, u.type)
            body_fns.append(emit_rule_kernel(mod, f"{name}.b{k}.{u.op}", rule, in_types, u.type, u.op))

        b = Builder(fn.append_basic_block("entry"))
        memcpy = declare(mod, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])

        def at(off: int) -> ir.Value:
            return b.gep(work, [const(off)], inbounds=True, source_etype=ir.IntType(8))

        def copy(dst: ir.Value, src: ir.Value, size: int) -> None:
            if size:
                b.call(memcpy, [dst, src, const(size), ir.Constant(I1, 0)])

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

            def ptr(o: Value) -> ir.Value:
                return constant(o) if o.is_const else where[o]

            for u, kn, kfn in zip(self.steps, self.kernels, body_fns, strict=True):
                where[u] = at(self.value_at[u])
                unused = kn.unused_operands if kn is not None else frozenset()
                args = [where[u]] + [ir.Constant(PTR, None) if j in unused else ptr(o)
                                     for j, o in enumerate(u.operands)]
                if kn is not None:
                    args.append(scratch)
                rc = b.call(kfn, args)
                _return_unless_ok(b, rc)
            results = self.results
            for k in cs:
                copy(at(self.next_at[k]), ptr(results[k]), nbytes(results[k].type))
            for k in cs:
                copy(at(self.state_at[k]), at(self.next_at[k]), nbytes(results[k].type))
            for j in range(self.carried, n_out):
                if j in self.group.members:
                    size = nbytes(results[j].type)
                    copy(offset(outs[j], t, size), ptr(results[j]), size)

        for_range(b, 0, self.trips, "iter", iteration)
        for k in cs:
            if k in self.group.members:
                copy(outs[k], at(self.state_at[k]), nbytes(self.operands[k].type))
        b.ret(ir.Constant(I32, OK))
        return fn


def _return_unless_ok(b: Builder, rc: ir.Value) -> None:
    fail = b.function.append_basic_block("fail")
    cont = b.function.append_basic_block("ok")
    b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, OK)), cont, fail)
    b.position_at_end(fail)
    b.ret(rc)
    b.position_at_end(cont)
