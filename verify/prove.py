"""One proof attempt: encode both values at a symbolic index and ask z3 whether they can differ.

Each attempt gets a fresh z3 context and solver with its own time limit:
``index bounds & dim constraints & facts & before(i) != after(i)`` unsat means proved.
A satisfying model is decoded back to concrete leaf tensors where the encoder's sorts allow
(reals, bit-vectors, booleans), so the refuter can replay it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import z3

from cuvil.ir.deep import run_deep
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import DimConstraint
from cuvil.ir.values import Value
from verify.cone_encoder import ConeEncoder, EncodingError, Leaf, inequality, read_index
from verify.z3_terms import boolean, bv_value, constant_value, int_value, real_value


@dataclass
class Attempt:
    status: str  # proved | sat | unknown
    encoder: str
    seconds: float
    reason: str = ""
    axioms: tuple[str, ...] = ()
    has_float: bool = True
    encodings: int = 0
    model_inputs: dict[str, np.ndarray] | None = None
    model_dims: dict[str, int] = field(default_factory=dict)
    model_index: tuple[int, ...] | None = None
    smt2: str = ""
    """A proved attempt's query, as solved: SMT-LIB 2 that a stock solver answers ``unsat``."""


def prove(before: Value, after: Value, leaf_of: Callable[[Value], Leaf | None], encoder: str,
          constraints: Sequence[DimConstraint] = (), *, timeout: float = 10.0,
          decode: Sequence[Leaf] = (), ctx: z3.Context | None = None, rlimit: int | None = None) -> Attempt:
    """``ctx``: a context to reuse (cut-point lemmas share one); by default a fresh one.
    ``rlimit``: a deterministic z3 resource limit besides the time limit (results then do not
    depend on the machine's load)."""
    start = time.perf_counter()
    ctx = ctx if ctx is not None else z3.Context()
    # the time limit covers the encoding: a large cone's reductions can take minutes to write out
    enc = ConeEncoder(encoder, leaf_of, constraints, ctx=ctx, deadline=start + timeout)

    def encode() -> tuple[Any, Any]:
        idx = enc.output_index(after.type)
        at = read_index(idx, after.type.shape, before.type.shape)
        if at is None or (at is not idx and before.dtype != after.dtype):
            raise EncodingError(f"a {before.type} and a {after.type} are not one tensor in two views")
        b = enc.value_at(before, at)
        return b, inequality(enc, b, enc.value_at(after, idx), before.dtype)

    try:
        b, neq = run_deep(encode)  # the encoder recurses once per op along the cone
    except EncodingError as e:
        return Attempt("unknown", encoder, time.perf_counter() - start, reason=f"cannot encode: {e}")
    except RecursionError:
        return Attempt("unknown", encoder, time.perf_counter() - start,
                       reason="cannot encode: the cone is a chain too deep to read")
    axioms = tuple(sorted(enc.sem.axioms))
    if neq is None:
        # the same term on both sides: still stated as a query (trivially unsat) an auditor can re-run
        same = enc.term(b, before.dtype)
        return Attempt("proved", encoder, time.perf_counter() - start, axioms=axioms, has_float=enc.float_seen,
                       encodings=enc.count, reason="both sides encode to the same term",
                       smt2=query_text([*enc.facts(), boolean(same != same)], ctx))
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", max(1, int(timeout * 1000)))
    if rlimit is not None:
        solver.set("rlimit", rlimit)
    solver.add(*enc.facts())
    solver.add(neq)
    res = solver.check()
    seconds = time.perf_counter() - start
    out = Attempt("unknown", encoder, seconds, axioms=axioms, has_float=enc.float_seen, encodings=enc.count)
    if res == z3.unsat:
        out.status = "proved"
        out.smt2 = solver.to_smt2()
        return out
    if res == z3.unknown:
        why = solver.reason_unknown()
        limited = "timeout" in why or "canceled" in why or "resource" in why
        out.reason = "solver timeout" if limited else f"solver gave up: {why}"
        return out
    out.status = "sat"
    out.reason = "the encodings can differ"
    model = solver.model()
    if any(v > SMALL_DIM for v in _model_dims(model).values()):
        # look for a difference at dims small enough to replay (a model of 2^40 elements cannot be)
        dims = [z3.Int(d.name(), ctx) for d in model.decls() if d.name().startswith("__d_")]
        solver.push()
        solver.add(*[d <= SMALL_DIM for d in dims])
        if solver.check() == z3.sat:
            model = solver.model()
        solver.pop()
    _decode(out, model, enc, after, decode)
    return out


def query_text(assertions: Sequence[z3.BoolRef], ctx: z3.Context) -> str:
    """SMT-LIB 2 text of ``assertions`` followed by ``(check-sat)``."""
    solver = z3.Solver(ctx=ctx)
    solver.add(*assertions)
    return solver.to_smt2()


DECODE_LIMIT = 1 << 22
"""Largest number of elements of one decoded counterexample tensor."""

SMALL_DIM = 1 << 16
"""When a model has a dim above this (too large to replay), the search is repeated with every
symbolic dim at most this."""


def _leaf_elements(leaf: Leaf, dims: dict[str, int]) -> int:
    try:
        return int(np.prod([evaluate_dim(d, dims) for d in leaf.type.shape], dtype=np.float64))
    except KeyError:
        return 0


def _model_dims(model: z3.ModelRef) -> dict[str, int]:
    dims: dict[str, int] = {}
    for d in model.decls():
        if d.name().startswith("__d_"):
            val = _model_value(constant_value(model, d))
            if isinstance(val, int):
                dims[d.name()[4:]] = val
    return dims


def _model_value(v: z3.ExprRef | None, signed: bool = True) -> float | int | bool | None:
    if v is None:  # a function interpretation without an else value
        return None
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    real = real_value(v)
    if real is not None:
        return real
    if z3.is_bv_value(v):
        return bv_value(v, signed)
    if z3.is_int_value(v):
        return int_value(v)
    return None


def _decode(out: Attempt, model: z3.ModelRef, enc: ConeEncoder, root: Value, leaves: Sequence[Leaf]) -> None:
    """Concrete tensors for ``leaves`` and the output index from a z3 model, when every leaf's
    sort has concrete values (opaque float sorts do not)."""
    dims = _model_dims(model)
    out.model_dims = dims
    index: list[int] = []
    for k in range(root.type.rank):
        val = model.eval(z3.Int(f"__i{k}", enc.ctx), model_completion=True)
        index.append(int_value(val) if z3.is_int_value(val) else 0)
    out.model_index = tuple(index)
    if not leaves:
        return  # nothing to decode: no model inputs (an empty dict would hide a fallback's model)
    tensors: dict[str, np.ndarray] = {}
    decls = {d.name(): d for d in model.decls()}
    for leaf in leaves:
        if enc.sem.name != "real" and leaf.type.dtype.is_float:
            return
        try:
            shape = tuple(evaluate_dim(d, dims) for d in leaf.type.shape)
        except KeyError:
            return
        if _leaf_elements(leaf, dims) > DECODE_LIMIT:
            return  # too large to replay: no model inputs
        arr = np.zeros(shape, dtype=np.float64)
        decl = decls.get(f"t_{leaf.key}")
        if decl is not None:
            try:
                _fill(arr, model[decl], shape, leaf.type.dtype.is_signed)
            except z3.Z3Exception:
                pass
        tensors[leaf.key] = arr.astype(leaf.type.dtype.np)
    out.model_inputs = tensors


def _fill(arr: np.ndarray, interp: object, shape: tuple[int, ...], signed: bool = True) -> None:
    """Write a model's interpretation of a leaf function into ``arr``."""
    if not isinstance(interp, z3.FuncInterp):
        val = _model_value(interp, signed) if isinstance(interp, z3.ExprRef) else None
        if val is not None:
            arr[...] = val
        return
    els = _model_value(interp.else_value(), signed)
    arr[...] = 0 if els is None else els
    for entry in interp.as_list()[:-1]:
        pos = [_model_value(x) for x in entry[:-1]]
        val = _model_value(entry[-1], signed)
        index = [p for p in pos if isinstance(p, int)]
        if val is None or len(index) < len(pos):
            continue
        if all(0 <= p < s for p, s in zip(index, shape, strict=True)):
            arr[tuple(index)] = val
