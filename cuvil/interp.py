"""The reference interpreter: the semantic ground truth every other layer is tested against.

It reads each op's compute rule (vectorized over all output indices with numpy);
ops may carry a numpy fast path, which the test suite checks against the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.arrays import as_array
from cuvil.errors import BudgetError, ConstraintError, InputError, IRError, RuntimeEvalError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES, cast, literal, sequential_reduce
from cuvil.ir.opdef import OpDef, get_op
from cuvil.ir.rules import Call, Expr, IndexValue, Ix, Lit, Load, Reduce
from cuvil.ir.symbolic import Sym, evaluate_dim
from cuvil.ir.types import TensorType, bind_symbols, check_tensor_size
from cuvil.ir.values import Value

# --------------------------------------------------------------------------------------
# rule evaluation


class _RuleEvaluator:
    """Evaluates a rule for every output index at once. Index variables are int arrays laid
    out on their own axis; arrays are left-aligned and lifted with trailing unit axes."""

    def __init__(self, arrays: Sequence[np.ndarray], out_shape: tuple[int, ...], op: str) -> None:
        self.arrays = arrays
        self.op = op
        self.depth = len(out_shape)
        self.env: dict[str, np.ndarray] = {}
        for k, n in enumerate(out_shape):
            self.env[f"i{k}"] = self._axis(n, k)

    def _axis(self, n: int, pos: int) -> np.ndarray:
        shape = [1] * self.depth
        shape[pos] = n
        return np.arange(n, dtype=np.int64).reshape(shape)

    def lift(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim == self.depth:
            return a
        return a.reshape(a.shape + (1,) * (self.depth - a.ndim))

    def ix(self, e: Ix) -> np.ndarray:
        k = e.kind
        if k == "var":
            return self.lift(self.env[e.args[0]])
        if k == "lit":
            return self.lift(np.array(int(e.args[0]), dtype=np.int64))
        if k == "dyn":
            return self.lift(self.expr(e.args[0]).astype(np.int64))
        a, b = (self.ix(x) for x in e.args)
        if k == "add":
            return a + b
        if k == "sub":
            return a - b
        if k == "mul":
            return a * b
        if k == "floordiv":
            return np.floor_divide(a, b)
        if k == "mod":
            return np.mod(a, b)
        if k == "min":
            return np.minimum(a, b)
        if k == "max":
            return np.maximum(a, b)
        raise IRError(f"unknown index expression kind {k!r}", location=self.op)

    def expr(self, e: Expr) -> np.ndarray:
        if isinstance(e, Load):
            return self._load(e)
        if isinstance(e, Lit):
            return self.lift(literal(e.value, e.dtype))
        if isinstance(e, IndexValue):
            return self.ix(e.ix)
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args]
            if e.fn == "cast":
                return cast(args[0], dict(e.attrs)["to"])
            out = NUMPY_PRIMITIVES[e.fn](*args)
            return self.lift(np.asarray(out).astype(e.dtype.np, copy=False))
        if isinstance(e, Reduce):
            return self._reduce(e)
        raise IRError(f"unknown rule node {type(e).__name__}", location=self.op)

    def _load(self, e: Load) -> np.ndarray:
        arr = self.arrays[e.operand]
        idx = [self.ix(i) for i in e.index]
        if not idx:
            return self.lift(arr)
        inb = np.ones((1,) * self.depth, dtype=bool)
        for k, i in enumerate(idx):
            inb = inb & (i >= 0) & (i < arr.shape[k])
        if e.oob is None and not inb.all():
            raise RuntimeEvalError(f"{self.op}: index out of range for operand {e.operand} "
                                   f"of shape {arr.shape}", hint="check gather/index inputs")
        if e.oob is None:
            return self.lift(arr[tuple(idx)])
        if arr.size == 0:
            return self.lift(np.full(np.broadcast_shapes(*(i.shape for i in idx)), e.oob, dtype=arr.dtype))
        clipped = tuple(np.clip(i, 0, max(arr.shape[k] - 1, 0)) for k, i in enumerate(idx))
        vals = arr[clipped]
        return self.lift(np.where(inb, vals, np.array(e.oob, dtype=arr.dtype)))

    def _reduce(self, e: Reduce) -> np.ndarray:
        base = self.depth
        extents = [int(evaluate_dim(n, {})) for _, n in e.axes]
        saved = dict(self.env)
        self.depth = base + len(extents)
        for k, (name, n) in enumerate(zip((a for a, _ in e.axes), extents, strict=True)):
            self.env[name] = self._axis(n, base + k)
        body = self.lift(self.expr(e.body))
        full = np.broadcast_to(body, body.shape[:base] + tuple(extents))
        self.env = saved
        self.depth = base
        return self.lift(sequential_reduce(e.kind, full, base))


def evaluate_rule(opdef: OpDef, arrays: Sequence[np.ndarray], attrs: Mapping[str, Any],
                  out_type: TensorType) -> np.ndarray:
    """Evaluate ``opdef``'s compute rule on concrete arrays (the slow, literal reading)."""
    in_types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    rule = opdef.make_rule(in_types, attrs, out_type)
    shape = tuple(int(d) for d in out_type.shape)
    ev = _RuleEvaluator(arrays, shape, opdef.name)
    with np.errstate(all="ignore"):
        out = ev.expr(rule)
    return np.ascontiguousarray(np.broadcast_to(out, shape)).reshape(shape).astype(out_type.dtype.np, copy=False)


def evaluate_op(opdef: OpDef, arrays: Sequence[np.ndarray], attrs: Mapping[str, Any],
                out_type: TensorType, *, use_fast_path: bool = True) -> np.ndarray:
    """One op on concrete arrays: the numpy fast path when there is one, else the rule."""
    if use_fast_path and opdef.numpy is not None:
        with np.errstate(all="ignore"):
            out = np.asarray(opdef.numpy(list(arrays), out_type, **attrs))
        if out.dtype != out_type.dtype.np:
            out = out.astype(out_type.dtype.np)
    else:
        out = evaluate_rule(opdef, arrays, attrs, out_type)
    if tuple(out.shape) != tuple(out_type.shape):
        raise IRError(f"{opdef.name} produced shape {out.shape}, its shape rule says {out_type}",
                      location=opdef.name, hint="this is a bug in the op's definition")
    return out


# --------------------------------------------------------------------------------------
# functions and modules


def to_numpy(x: Any, name: str = "input") -> np.ndarray:
    """Accept numpy arrays, torch tensors and python scalars/lists (``cuvil.arrays``)."""
    return as_array(x, name, contiguous=False)


def bind_inputs(fn: Function, inputs: Sequence[Any] | Mapping[str, Any]) -> tuple[list[np.ndarray], dict[str, int]]:
    """Check inputs against the function signature; return arrays and the symbol values."""
    if isinstance(inputs, Mapping):
        missing = [p.name for p in fn.params if p.name not in inputs]
        extra = sorted(set(inputs) - {p.name for p in fn.params})
        if missing or extra:
            raise InputError(f"inputs do not match @{fn.name}: missing {missing}, unexpected {extra}",
                             hint="inputs: " + ", ".join(p.name for p in fn.params))
        values = [inputs[p.name] for p in fn.params]
    else:
        values = list(inputs)
        if len(values) != len(fn.params):
            raise InputError(f"@{fn.name} takes {len(fn.params)} inputs, got {len(values)}",
                             hint="inputs: " + ", ".join(f"{p.name}: {p.type}" for p in fn.params))
    arrays = [to_numpy(v, p.name) for v, p in zip(values, fn.params, strict=True)]
    for p, a in zip(fn.params, arrays, strict=True):
        if a.dtype != p.type.dtype.np:
            raise InputError(f"input {p.name!r} has dtype {a.dtype}, expected {p.type.dtype}",
                             location=p.name, hint=f"convert with .astype({p.type.dtype.np.name!r})")
    try:
        env = bind_symbols([p.type for p in fn.params], [a.shape for a in arrays])
    except ValueError as e:
        raise InputError(f"input shapes do not match @{fn.name}: {e}",
                         hint="expected " + ", ".join(f"{p.name}: {p.type}" for p in fn.params)) from None
    for s, v in env.items():
        c = fn.constraint(s)
        if not c.admits(v):
            raise ConstraintError(f"dim {s}={v} violates the constraint {c}", location=fn.name)
    return arrays, env


def evaluate_values(fn: Function, constants: Mapping[str, np.ndarray],
                    inputs: Sequence[Any] | Mapping[str, Any]) -> dict[Value, np.ndarray]:
    """Every value of ``fn`` on ``inputs`` (for replaying counterexamples and debugging)."""
    arrays, env = bind_inputs(fn, inputs)
    memo: dict[Value, np.ndarray] = dict(zip(fn.params, arrays, strict=True))
    for v in fn.values():
        if v in memo:
            continue
        if v.is_const:
            memo[v] = constants[v.const_hash]
            continue
        if v.is_param:
            raise IRError(f"parameter %{v.name} is not a parameter of @{fn.name}", location=fn.name)
        out_type = TensorType(v.type.dtype, v.type.concrete(env))
        check_tensor_size(out_type.shape, f"the result of {v.op}", v.op)
        attrs = {k: bind_attr(a, env) for k, a in v.attrs}
        try:
            memo[v] = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], attrs, out_type)
        except MemoryError:
            raise BudgetError(f"the reference interpreter ran out of memory evaluating {v.op} -> {out_type}",
                              location=v.op, hint="the interpreter holds every value of the function; "
                                                  "run it on smaller shapes") from None
    return memo


def bind_attr(a: Any, env: Mapping[str, int]) -> Any:
    """An attribute with its symbolic dims evaluated, so rules and fast paths see plain ints
    (slice bounds or split sizes derived from a symbolic shape)."""
    if isinstance(a, Sym):
        return evaluate_dim(a, env)
    if isinstance(a, tuple):
        return tuple(bind_attr(x, env) for x in a)
    return a


def run_function(fn: Function, constants: Mapping[str, np.ndarray],
                 inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    memo = evaluate_values(fn, constants, inputs)
    return [np.array(memo[r], copy=True) for r in fn.results]


def run_reference(module: Module, inputs: Sequence[Any] | Mapping[str, Any],
                  function: str | None = None) -> list[np.ndarray]:
    """Run ``module`` (its ``main``, or ``function``) on the reference interpreter."""
    fn = module.function(function) if function else module.main
    return run_function(fn, module.constants, inputs)
