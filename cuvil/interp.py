"""The reference interpreter: the semantic ground truth every other layer is tested against.

It runs functions and modules: inputs bound to the signature (dtypes, shapes, dim
constraints), every value evaluated by :func:`cuvil.ir.evaluate.evaluate_op` (an op's compute
rule, vectorized over all output indices with numpy, or its fast path, which the test suite
checks against the rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.arrays import as_array
from cuvil.errors import BudgetError, ConstraintError, InputError, IRError, ShapeError
from cuvil.ir.evaluate import evaluate_op, evaluate_rule
from cuvil.ir.module import Function, Module
from cuvil.ir.numpy_prims import NUMPY_PRIMITIVES
from cuvil.ir.opdef import get_op
from cuvil.ir.region import Region
from cuvil.ir.specialize import bind_attr, shape_rule_type
from cuvil.ir.types import TensorType, bind_symbols, check_tensor_size
from cuvil.ir.values import Value

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
        dims = v.type.concrete(env)
        check_tensor_size(dims, f"the result of {v.op}", v.op)
        out_type = TensorType(v.type.dtype, dims)
        attrs = {k: bind_attr(a, env) for k, a in v.attrs}
        opdef = get_op(v.op)
        if env:
            _check_shape_rule(v, attrs, out_type, env)
        try:
            memo[v] = evaluate_op(opdef, [memo[o] for o in v.operands], attrs, out_type)
        except MemoryError:
            raise BudgetError(f"the reference interpreter ran out of memory evaluating {v.op} -> {out_type}",
                              location=v.op, hint="the interpreter holds every value of the function; "
                                                  "run it on smaller shapes") from None
    return memo


def _check_shape_rule(v: Value, attrs: Mapping[str, Any], out_type: TensorType, env: Mapping[str, int]) -> None:
    """``v``'s op at the dims bound: its shape rule takes the operands and gives ``out_type``, as a library
    specialized to these dims checks. Import fixes some attributes from symbolic dims under assumptions (split
    sizes, slice bounds within the axis); inputs where one fails are refused, not evaluated to other shapes."""
    if any(isinstance(a, Region) for a in attrs.values()):
        return
    got = shape_rule_type(v.op, [TensorType(o.type.dtype, o.type.concrete(env)) for o in v.operands], attrs)
    if got != out_type:
        raise ShapeError(f"{v.op} gives {got} at these input shapes, where the model's types say {out_type}",
                         location=v.op, hint="the model's symbolic shapes do not hold at these input sizes: "
                                             "dims " + ", ".join(f"{k}={n}" for k, n in env.items()))


def run_function(fn: Function, constants: Mapping[str, np.ndarray],
                 inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    memo = evaluate_values(fn, constants, inputs)
    return [np.array(memo[r], copy=True) for r in fn.results]


def run_reference(module: Module, inputs: Sequence[Any] | Mapping[str, Any],
                  function: str | None = None) -> list[np.ndarray]:
    """Run ``module`` (its ``main``, or ``function``) on the reference interpreter."""
    fn = module.function(function) if function else module.main
    return run_function(fn, module.constants, inputs)


__all__ = ["NUMPY_PRIMITIVES", "bind_attr", "bind_inputs", "evaluate_op", "evaluate_rule", "evaluate_values",
           "run_function", "run_reference", "to_numpy"]
