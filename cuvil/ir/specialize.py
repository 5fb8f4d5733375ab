"""Specialization: a function with symbolic dims at concrete ones.

The dims are solved from input shapes, checked against the function's constraints and
substituted into every type and attribute, and every op's shape rule is re-run at those shapes
(a rule that disagrees with the symbolic type is an error, not a silent retype). Every tensor of
the result is checked against :data:`cuvil.ir.types.MAX_TENSOR_ELEMENTS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cuvil.arrays import as_array
from cuvil.errors import CodegenError, ConstraintError, InputError
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.region import Region
from cuvil.ir.symbolic import Dim, Sym, evaluate_dim
from cuvil.ir.types import TensorType, bind_symbols, check_tensor_size
from cuvil.ir.values import Value, param, walk

Shapes = Sequence[Sequence[int]] | Mapping[str, Sequence[int]]
"""Input shapes in parameter order, or by input name."""


def _describe(inputs: Sequence[tuple[str, Sequence[Dim]]]) -> str:
    return ", ".join(f"{n}: [{', '.join(map(str, shape))}]" for n, shape in inputs)


def requested_shapes(function: str, inputs: Sequence[tuple[str, Sequence[Dim]]], example_inputs: Any,
                     input_shapes: Shapes | None) -> list[tuple[int, ...]] | None:
    """The shapes of ``inputs`` (name, declared shape) to specialize at, from ``input_shapes``
    or ``example_inputs`` (None: neither)."""
    names = [n for n, _ in inputs]
    if input_shapes is not None:
        if isinstance(input_shapes, Mapping):
            unknown = sorted(set(input_shapes) - set(names))
            missing = [n for n, shape in inputs if n not in input_shapes
                       and not all(isinstance(d, int) for d in shape)]
            if unknown or missing:
                raise InputError(f"input_shapes does not match the inputs: missing {missing}, unknown {unknown}",
                                 hint="give a shape for every input with symbolic dims: " + _describe(inputs))
            shapes = [tuple(int(d) for d in input_shapes[n]) if n in input_shapes
                      else tuple(int(d) for d in shape) for n, shape in inputs]
        else:
            shapes = [tuple(int(d) for d in s) for s in input_shapes]
    elif example_inputs is not None:
        if isinstance(example_inputs, Mapping):
            values = [example_inputs[n] for n in names if n in example_inputs]
        elif isinstance(example_inputs, (list, tuple)):
            values = list(example_inputs)
        else:
            values = [example_inputs]
        shapes = [tuple(as_array(v, contiguous=False).shape) for v in values]
    else:
        return None
    if len(shapes) != len(names):
        raise InputError(f"@{function} takes {len(names)} inputs, got {len(shapes)} shapes to specialize with",
                         hint="inputs: " + _describe(inputs))
    return shapes


def specialize_function(fn: Function, *, example_inputs: Any = None, input_shapes: Shapes | None = None,
                        ) -> tuple[Function, dict[str, int]]:
    """``fn`` with every symbolic dim replaced by its value; unchanged if it is already static."""
    if all(p.type.is_static for p in fn.params) and all(v.type.is_static for v in fn.values()):
        return fn, {}
    shapes = requested_shapes(fn.name, [(p.name, p.type.shape) for p in fn.params], example_inputs, input_shapes)
    if shapes is None:
        symbolic = ", ".join(f"{p.name}: {p.type}" for p in fn.params if not p.type.is_static)
        raise CodegenError(f"@{fn.name} has symbolic dims ({symbolic}); native code is compiled for static shapes",
                           location=fn.name,
                           hint="pass example_inputs=... or input_shapes=... to compile() to specialize them")
    try:
        env = bind_symbols(fn.param_types, shapes)
    except ValueError as e:
        raise InputError(f"shapes do not match @{fn.name}: {e}",
                         hint="expected " + ", ".join(f"{p.name}: {p.type}" for p in fn.params)) from None
    return specialize_dims(fn, env), env


def specialize_dims(fn: Function, env: Mapping[str, int]) -> Function:
    """``fn`` at the given symbol values (checked against its constraints)."""
    for s, v in env.items():
        c = fn.constraint(s)
        if not c.admits(v):
            raise ConstraintError(f"dim {s}={v} violates the constraint {c}", location=fn.name)
    memo: dict[Value, Value] = {}
    for v in [*fn.params, *(v for v in fn.values() if not v.is_param)]:  # a param no result reads is kept too
        memo[v] = _specialize_value(v, memo, env)
        if not v.is_const:
            where = f"input {v.name!r}" if v.is_param else v.op
            check_tensor_size(memo[v].type.concrete(env), f"the tensor of {where}", where)
    return Function(fn.name, tuple(memo[p] for p in fn.params), tuple(memo[r] for r in fn.results),
                    fn.result_names)


def _specialize_value(v: Value, memo: dict[Value, Value], env: Mapping[str, int]) -> Value:
    if v.is_const:
        return v
    concrete = TensorType(v.dtype, v.type.concrete(env))
    if v.is_param:
        return param(v.name, concrete)
    attrs = {k: _specialize_attr(a, env) for k, a in v.attrs}
    operands = tuple(memo[o] for o in v.operands)
    out_type = shape_rule_type(v.op, [o.type for o in operands], attrs)
    if out_type != concrete:
        raise CodegenError(f"{v.op} gives {out_type} at the specialized shapes, expected {concrete}",
                           location=v.op, hint="the op's shape rule disagrees with the symbolic type")
    return Value(v.op, operands, attrs, out_type)


def shape_rule_type(op: str, operand_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """What ``op``'s shape rule gives for operands of these (concrete) types and these bound attributes: a
    specialization, and the interpreter at bound dims, compare it with the type the function says."""
    opdef = get_op(op)
    return opdef.infer(list(operand_types), opdef.check_attrs(attrs))


def bind_attr(a: Any, env: Mapping[str, int]) -> Any:
    """An attribute with its symbolic dims evaluated, so rules and fast paths see plain ints
    (slice bounds or split sizes derived from a symbolic shape); a region is left as it is."""
    if isinstance(a, Sym):
        return evaluate_dim(a, env)
    if isinstance(a, tuple):
        return tuple(bind_attr(x, env) for x in a)
    return a


def _specialize_attr(a: Any, env: Mapping[str, int]) -> Any:
    if not isinstance(a, Region):
        return bind_attr(a, env)
    memo: dict[Value, Value] = {}
    for v in walk([*a.results, *a.params]):
        memo[v] = _specialize_value(v, memo, env)
    return Region(tuple(memo[p] for p in a.params), memo[a.result], tuple(memo[r] for r in a.more))
