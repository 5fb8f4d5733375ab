"""``compile``: a model in, a native callable out.

This increment compiles static shapes only. A function with symbolic dims is
*specialized* first: the dims are solved from ``example_inputs`` (or given as
``input_shapes``), checked against the function's constraints, substituted into
every type and attribute, and every op's shape rule is re-run at those shapes.
Without either, compiling a symbolic function raises :class:`CodegenError`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil.codegen.artifact import build_library
from cuvil.errors import CodegenError, ConstraintError, InputError
from cuvil.frontend.dispatch import import_model
from cuvil.interp import to_numpy
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import Sym, evaluate_dim
from cuvil.ir.types import TensorType, bind_symbols
from cuvil.ir.values import Value, param, walk
from cuvil.log import stage
from cuvil.passes import run_pipeline
from cuvil.runtime.loader import CompiledModel

BACKENDS = ("llvm",)


def compile(model: Any, *, backend: str = "llvm", opt_level: int = 3, example_inputs: Any = None,
            input_shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]] | None = None,
            passes: str | Sequence[Any] | None = None, gate: Any = None,
            function: str | None = None, output_dir: str | Path | None = None, name: str | None = None,
            keep_ir: bool = False, **import_options: Any) -> CompiledModel:
    """Compile ``model`` (anything :func:`cuvil.import_model` accepts) to a shared library and load it.

    The optimization pipeline is ``O<opt_level>`` unless ``passes`` names one (``"O2"``,
    ``"fold-batchnorm,fuse-elementwise"`` or a list of Pass objects); ``gate`` is the pass
    manager's gate hook (the verifier's). ``example_inputs`` doubles as the torch export inputs
    and as the source of concrete dims; ``output_dir`` keeps the library, header and manifest
    (default: a fresh temporary folder).
    """
    if backend not in BACKENDS:
        raise CodegenError(f"unknown backend {backend!r}", hint="backends: " + ", ".join(BACKENDS))
    if not 0 <= opt_level <= 3:
        raise CodegenError(f"opt_level must be 0..3, got {opt_level}")
    module = model if isinstance(model, Module) else import_model(model, example_inputs, **import_options)
    fn = module.function(function) if function else module.main
    fn, env = specialize_function(fn, example_inputs=example_inputs, input_shapes=input_shapes)
    pipeline = passes if passes is not None else f"O{opt_level}"
    with stage(f"optimize ({pipeline if isinstance(pipeline, str) else 'custom pipeline'})"):
        optimized = run_pipeline(Module((fn,), module.constants, module.metadata), pipeline, gate=gate).module
    out = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="cuvil-"))
    extra: dict[str, Any] = {"specialized_dims": env} if env else {}
    extra["pipeline"] = pipeline if isinstance(pipeline, str) else [str(p) for p in pipeline]
    with stage("codegen"):
        artifact = build_library(optimized.main, optimized.constants, out, name=name, opt_level=opt_level,
                                 keep_ir=keep_ir, extra_manifest=extra)
    return CompiledModel(artifact.library_path, artifact.manifest)


# --------------------------------------------------------------------------------------
# specialization


def _shapes_from(fn: Function, example_inputs: Any,
                 input_shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]] | None) -> list[tuple[int, ...]]:
    names = [p.name for p in fn.params]
    if input_shapes is not None:
        if isinstance(input_shapes, Mapping):
            missing = [n for n in names if n not in input_shapes]
            if missing:
                raise InputError(f"input_shapes lacks {missing}", hint="give a shape for every input: " +
                                 ", ".join(names))
            return [tuple(int(d) for d in input_shapes[n]) for n in names]
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
    else:
        if isinstance(example_inputs, Mapping):
            values = [example_inputs[n] for n in names if n in example_inputs]
        elif isinstance(example_inputs, (list, tuple)):
            values = list(example_inputs)
        else:
            values = [example_inputs]
        shapes = [tuple(to_numpy(v).shape) for v in values]
    if len(shapes) != len(names):
        raise InputError(f"@{fn.name} takes {len(names)} inputs, got {len(shapes)} shapes to specialize with",
                         hint="inputs: " + ", ".join(f"{p.name}: {p.type}" for p in fn.params))
    return shapes


def specialize_function(fn: Function, *, example_inputs: Any = None,
                        input_shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]] | None = None,
                        ) -> tuple[Function, dict[str, int]]:
    """``fn`` with every symbolic dim replaced by its value; unchanged if it is already static."""
    if all(p.type.is_static for p in fn.params) and all(v.type.is_static for v in fn.values()):
        return fn, {}
    if example_inputs is None and input_shapes is None:
        symbolic = ", ".join(f"{p.name}: {p.type}" for p in fn.params if not p.type.is_static)
        raise CodegenError(f"@{fn.name} has symbolic dims ({symbolic}); native code is compiled for static shapes",
                           location=fn.name,
                           hint="pass example_inputs=... or input_shapes=... to compile() to specialize them")
    shapes = _shapes_from(fn, example_inputs, input_shapes)
    try:
        env = bind_symbols(fn.param_types, shapes)
    except ValueError as e:
        raise InputError(f"shapes do not match @{fn.name}: {e}",
                         hint="expected " + ", ".join(f"{p.name}: {p.type}" for p in fn.params)) from None
    for s, v in env.items():
        c = fn.constraint(s)
        if not c.admits(v):
            raise ConstraintError(f"dim {s}={v} violates the constraint {c}", location=fn.name)
    memo: dict[Value, Value] = {}
    for v in fn.values():
        memo[v] = _specialize_value(v, memo, env)
    return Function(fn.name, tuple(memo[p] for p in fn.params), tuple(memo[r] for r in fn.results),
                    fn.result_names), env


def _specialize_value(v: Value, memo: dict[Value, Value], env: Mapping[str, int]) -> Value:
    if v.is_const:
        return v
    concrete = TensorType(v.dtype, v.type.concrete(env))
    if v.is_param:
        return param(v.name, concrete)
    attrs = {k: _specialize_attr(a, env) for k, a in v.attrs}
    operands = tuple(memo[o] for o in v.operands)
    opdef = get_op(v.op)
    out_type = opdef.infer([o.type for o in operands], opdef.check_attrs(attrs))
    if out_type != concrete:
        raise CodegenError(f"{v.op} gives {out_type} at the specialized shapes, expected {concrete}",
                           location=v.op, hint="the op's shape rule disagrees with the symbolic type")
    return Value(v.op, operands, attrs, out_type)


def _specialize_attr(a: Any, env: Mapping[str, int]) -> Any:
    if isinstance(a, Sym):
        return evaluate_dim(a, env)
    if isinstance(a, tuple):
        return tuple(_specialize_attr(x, env) for x in a)
    try:
        from cuvil.ir.region import Region
    except ImportError:  # a build without fused regions
        return a
    if isinstance(a, Region):
        memo: dict[Value, Value] = {}
        for v in walk([a.result, *a.params]):
            memo[v] = _specialize_value(v, memo, env)
        return Region(tuple(memo[p] for p in a.params), memo[a.result])
    return a
