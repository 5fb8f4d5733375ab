"""torch.export -> CIR.

The model is exported with ``torch.export.export`` and lowered to core ATen
(``run_decompositions``), so converters only meet the small, stable core op set.
User inputs become parameters; parameters, buffers and lifted constants become
CIR constants; dynamic dims (``torch.export.Dim``) become CIR symbols carrying
the range torch proved for them. Each aten op is handed to the converter
registered for its overload name (``aten_converters()``), which builds CIR
through a Builder, so every value is checked against its op definition.
"""

from __future__ import annotations

import math
import operator
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, IRError, ModelLoadError, UnsupportedOpError
from cuvil.frontend import torch_ops  # noqa: F401  (registers the converter families)
from cuvil.frontend.aten_node import (
    CONVERTERS,
    INT64_MAX,
    AtenCtx,
    Unavailable,
    cir_dtype,
    tensor_to_numpy,
    torch_dtype,
)
from cuvil.frontend.registry import CONVERTER_BUGS, ConverterEntry
from cuvil.frontend.torch_cond import import_cond
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.symbolic import Dim, Sym, sym_max, sym_min
from cuvil.ir.types import DimConstraint
from cuvil.ir.values import Value
from cuvil.log import logger, stage

try:  # torch is an optional dependency: importing this module without it must fail politely
    import torch
    import torch.fx
    import torch.utils._pytree as pytree
except ImportError:  # pragma: no cover - exercised only where torch is absent
    torch = None
# The entry points (import_torch, import_pt2) refuse to start without torch, so everything they
# reach asserts `torch is not None` instead of checking again.

# nodes that only check facts torch already proved at export time
_DROPPED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
            "aten._assert_async.default", "aten.sym_constrain_range.default",
            "aten.sym_constrain_range_for_size.default", "aten._functional_assert_async.msg",
            "aten._functional_sym_constrain_range.default",
            "aten._functional_sym_constrain_range_for_size.default", "aten._print.default"}


# --------------------------------------------------------------------------------------
# sympy -> CIR dims


def sympy_to_dim(expr: Any, names: Mapping[Any, str], where: str = "") -> Dim:
    """Translate a torch shape expression (sympy) into a CIR dim over the named symbols."""
    import sympy
    from torch.utils._sympy import functions as F

    def fold(a: Dim, b: Dim, op: Callable[[Any, Any], Dim]) -> Dim:
        return op(a, b) if isinstance(a, int) and isinstance(b, int) else op(Sym.lift(a), b)

    def go(e: Any) -> Dim:
        if isinstance(e, (int, np.integer)) or e.is_Integer:
            return int(e)
        if e.is_Symbol:
            if e not in names:
                raise UnsupportedOpError(f"shape symbol {e} is data-dependent or unknown", location=where or None,
                                         hint="only sizes of model inputs may be dynamic")
            return Sym.symbol(names[e])
        args = [go(a) for a in e.args] if not (e.is_Add or e.is_Mul or e.is_Pow) else None
        if e.is_Add:
            out: Dim = 0
            for a in e.args:
                out = out + go(a)
            return out
        if e.is_Mul:
            out = 1
            for a in e.args:
                if a.is_Rational and not a.is_Integer:
                    raise UnsupportedOpError(f"shape expression {e} is not integral", location=where or None)
                out = out * go(a)
            return out
        count = _natural(e.args[1]) if e.is_Pow or isinstance(e, F.PowByNatural) else None
        if count is not None:
            out, base = 1, go(e.args[0])
            for _ in range(count):
                out = out * base
            return out
        assert args is not None
        if isinstance(e, F.FloorDiv):
            return fold(args[0], args[1], operator.floordiv)
        if isinstance(e, F.CeilDiv):
            return -fold(-args[0], args[1], operator.floordiv)
        if isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
            return fold(args[0], args[1], operator.mod)
        if isinstance(e, (F.Max, F.Min, sympy.Max, sympy.Min)):
            pick = sym_max if isinstance(e, (F.Max, sympy.Max)) else sym_min
            out = args[0]
            for a in args[1:]:
                out = pick(out, a)
            return out
        raise UnsupportedOpError(f"shape expression {e} ({type(e).__name__}) is not supported",
                                 location=where or None)

    return go(expr)


def _natural(x: Any) -> int | None:
    """A sympy integer's value when it is >= 0 (sympy's ``Basic`` does not declare ``__int__``)."""
    return int(x) if x.is_Integer and int(x) >= 0 else None


# --------------------------------------------------------------------------------------
# the importer


@dataclass
class TorchImporter:
    ep: Any  # torch.export.ExportedProgram, already lowered to core ATen
    dim_names: Mapping[str, str] = field(default_factory=dict)  # torch symbol name -> CIR symbol name
    b: Builder = field(default_factory=Builder)
    env: dict[Any, Any] = field(default_factory=dict)
    names: dict[Any, str] = field(default_factory=dict)  # sympy symbol -> CIR symbol name
    sym_sources: dict[str, tuple[Value, int]] = field(default_factory=dict)
    _dim_values: dict[Any, Value] = field(default_factory=dict)

    # dims -------------------------------------------------------------------------
    def dims(self, shape: Sequence[Any], where: str) -> tuple[Dim, ...]:
        return tuple(self.dim(d, where) for d in shape)

    def dim(self, d: Any, where: str) -> Dim:
        assert torch is not None
        if isinstance(d, (int, np.integer)):
            return int(d)
        if isinstance(d, torch.SymInt):
            c = d.node.maybe_as_int() if hasattr(d.node, "maybe_as_int") else None
            if c is not None:
                return int(c)
            return sympy_to_dim(d.node.expr, self.names, where)
        if isinstance(d, (int, Sym)):
            return d
        raise UnsupportedOpError(f"size {d!r} is not an integer", location=where)

    def dim_value(self, d: Dim, where: str) -> Value:
        """A dim as an i64 scalar tensor: constants directly, symbols read off the input that defines them."""
        if isinstance(d, int):
            return self.b.scalar(d, DType.i64)
        found = self._dim_values.get(d)
        if found is not None:
            return found
        total: Value | None = None
        for mono, coef in d.terms:
            term: Value | None = None if coef == 1 else self.b.scalar(coef, DType.i64)
            for f in mono:
                fv = self._factor_value(f, where)
                term = fv if term is None else self.b.mul(term, fv)
            if term is None:
                term = self.b.scalar(coef, DType.i64)
            total = term if total is None else self.b.add(total, term)
        assert total is not None
        self._dim_values[d] = total
        return total

    def _factor_value(self, f: Any, where: str) -> Value:
        if isinstance(f, str):
            src = self.sym_sources.get(f)
            if src is None:
                raise UnsupportedOpError(f"size {f} is used as a value but no input has it as a dim",
                                         location=where)
            p, axis = src
            shp = self.b.shape(p)
            one = self.b.slice(shp, starts=(axis,), ends=(axis + 1,), steps=(1,))
            return self.b.reshape(one, shape=())
        args = [self.dim_value(a, where) for a in f.args]
        if f.kind == "floordiv":
            return self.b.div(args[0], args[1])  # sizes are non-negative: truncation is floor
        if f.kind == "mod":
            return self.b.mod(args[0], args[1])
        return self.b.max(args[0], args[1]) if f.kind == "max" else self.b.min(args[0], args[1])

    # values -----------------------------------------------------------------------
    def as_value(self, x: Any, dtype: DType | None, where: str) -> Value:
        if isinstance(x, Unavailable):
            raise UnsupportedOpError(x.reason, location=where)
        if isinstance(x, Value):
            return x if dtype is None or x.dtype is dtype else self.b.cast(x, to=dtype)
        if isinstance(x, Sym):
            v = self.dim_value(x, where)
            return v if dtype is None or dtype is DType.i64 else self.b.cast(v, to=dtype)
        if isinstance(x, (bool, int, float, np.number)):
            if dtype is None:
                dtype = DType.bool if isinstance(x, bool) else DType.i64 if isinstance(x, int) else DType.f32
            if dtype.is_int and isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                try:  # torch casts a python int to an integer tensor's type with wraparound: -1 is 255 in uint8
                    return self.b.const(np.array(int(x), dtype=np.int64).astype(dtype.np))
                except OverflowError:
                    raise UnsupportedOpError(f"the number {x} does not fit {dtype}", location=where) from None
            return self.b.scalar(x, dtype)
        raise UnsupportedOpError(f"expected a tensor, got {type(x).__name__}", location=where)

    def promote(self, xs: Sequence[Any], where: str) -> DType:
        """torch.result_type over stand-ins: a rank-0 tensor for rank-0 values (they promote like
        scalars within a category), a 1-element tensor otherwise, python numbers as themselves."""
        assert torch is not None
        stand: list[Any] = []
        for x in xs:
            if isinstance(x, Unavailable):
                raise UnsupportedOpError(x.reason, location=where)
            if isinstance(x, Value):
                stand.append(torch.empty(() if x.type.rank == 0 else (1,), dtype=torch_dtype(x.dtype)))
            elif isinstance(x, Sym):
                stand.append(1)
            elif isinstance(x, (bool, int, float)):
                stand.append(x)
            else:
                raise UnsupportedOpError(f"cannot type a {type(x).__name__} operand", location=where)
        if not isinstance(stand[0], torch.Tensor):
            stand[0] = torch.tensor(stand[0])
        dt = stand[0].dtype
        acc = stand[0]
        for s in stand[1:]:
            dt = torch.result_type(acc, s)
            dim = max(acc.dim(), s.dim() if isinstance(s, torch.Tensor) else 0)
            acc = torch.empty((1,) * dim, dtype=dt)
        return cir_dtype(dt, where)

    def constant(self, t: Any, where: str) -> Value:
        assert torch is not None
        if not isinstance(t, torch.Tensor):
            raise UnsupportedOpError(f"constant of type {type(t).__name__} is not supported", location=where)
        return self.b.const(tensor_to_numpy(t))

    # graph ------------------------------------------------------------------------
    def run(self) -> Module:
        assert torch is not None
        from torch.export.graph_signature import InputKind, OutputKind

        ep = self.ep
        gm = ep.graph_module
        sig = ep.graph_signature
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._name_symbols(placeholders)
        params: list[Value] = []
        state = ep.state_dict
        consts = ep.constants
        for spec, node in zip(sig.input_specs, placeholders, strict=True):
            where = f"input {node.name}"
            if spec.kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    self.env[node] = self._scalar_from_meta(val, where)
                    continue
                p = self.b.param(_ident(node.name), cir_dtype(val.dtype, where), self.dims(val.shape, where))
                for axis, d in enumerate(p.shape):
                    if isinstance(d, Sym) and len(d.symbols()) == 1 and str(d) in d.symbols():
                        self.sym_sources.setdefault(str(d), (p, axis))
                params.append(p)
                self.env[node] = p
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                target = spec.target
                data = state[target] if target in state else consts.get(target)
                if data is None:
                    raise ModelLoadError(f"the exported program has no data for {target!r}", location=where)
                self.env[node] = self.constant(data, where) if isinstance(data, torch.Tensor) else Unavailable(
                    f"constant {target!r} of type {type(data).__name__} is not supported")
            else:
                self.env[node] = Unavailable(f"input {node.name} of kind {spec.kind.name} is not supported")
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        user_outs = [a for a, s in zip(out_node.args[0], sig.output_specs, strict=True)
                     if s.kind == OutputKind.USER_OUTPUT]
        live = _live_nodes(user_outs)
        for node in gm.graph.nodes:
            if node.op != "call_function" or node not in live:
                continue
            self.convert_node(node)
        results: list[Value] = []
        kept: list[int] = []
        for k, a in enumerate(user_outs):
            where = f"output {k}"
            v = self.resolve(a, where)
            if v is None:  # no data (MultiheadAttention's weights with need_weights=False): no result
                continue
            if isinstance(v, Unavailable):
                raise UnsupportedOpError(f"output {k}: {v.reason}", location=where)
            if isinstance(v, (int, Sym, float, bool)) and not isinstance(v, Value):
                v = self.as_value(v, None, where)
            if not isinstance(v, Value):
                raise UnsupportedOpError(f"output {k} is a {type(v).__name__}, not a tensor", location=where)
            results.append(v)
            kept.append(k)
        names = [_output_names(ep, len(user_outs))[k] for k in kept]
        symbols: list[str] = []
        for p in params:
            for s in sorted(p.type.symbols()):
                if s not in symbols:
                    symbols.append(s)
        fn = self.b.function("main", params, results, names, [self._constraint(s) for s in symbols])
        meta = {"source": "torch.export", "torch": str(torch.__version__)}
        return self.b.module(fn, metadata=meta)

    def _name_symbols(self, placeholders: list[Any]) -> None:
        """Give each dynamic dim a CIR name: the torch.export.Dim's name when the shape
        environment kept it, else the sympy symbol's own (sanitized) name."""
        assert torch is not None
        used: set[str] = set()
        for node in placeholders:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            senv = getattr(getattr(val, "fake_mode", None), "shape_env", None)
            for d in val.shape:
                if not isinstance(d, torch.SymInt):
                    continue
                for s in sorted(d.node.expr.free_symbols, key=str):
                    if s in self.names:
                        continue
                    name = self.dim_names.get(str(s)) or _debug_name(senv, s) or str(s)
                    name = _ident(name)
                    base, k = name, 1
                    while name in used:
                        k += 1
                        name = f"{base}_{k}"
                    used.add(name)
                    self.names[s] = name

    def _constraint(self, name: str) -> DimConstraint:
        for s, n in self.names.items():
            if n != name:
                continue
            vr = self.ep.range_constraints.get(s)
            if vr is None:
                break
            lo = _finite_int(vr.lower)
            hi = _finite_int(vr.upper)
            return DimConstraint(name, lo if lo is not None else 0, hi)
        return DimConstraint(name)

    def resolve(self, a: Any, where: str) -> Any:
        """An fx argument with nodes replaced by their converted values."""
        assert torch is not None
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise IRError(f"node {a.name} is used before it is converted", location=where)
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.resolve(x, where) for x in a)
        if isinstance(a, dict):
            return {k: self.resolve(v, where) for k, v in a.items()}
        return a

    def _scalar_from_meta(self, val: Any, where: str) -> Any:
        assert torch is not None
        if isinstance(val, torch.SymInt):
            try:
                return self.dim(val, where)
            except UnsupportedOpError as e:
                return Unavailable(e.message)
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            c = val.node.maybe_as_float() if isinstance(val, torch.SymFloat) and hasattr(
                val.node, "maybe_as_float") else None
            if c is not None:
                return float(c)
            return Unavailable(f"symbolic scalar {val} cannot be represented")
        return val

    def convert_node(self, node: Any) -> None:
        assert torch is not None
        target = node.target
        name = str(target)
        where = f"node {node.name} ({name})"
        if target is operator.getitem:
            seq = self.resolve(node.args[0], where)
            idx = node.args[1]
            if isinstance(seq, Unavailable):
                self.env[node] = seq
                return
            item = seq[idx]
            if item is None:
                item = Unavailable(f"output {idx} of {node.args[0].name} is not supported")
            self.env[node] = item
            return
        if name in _DROPPED:
            self.env[node] = None
            return
        val = node.meta.get("val")
        if isinstance(val, _SCALARS):
            # symbolic size arithmetic (sym_size.int, operator.mul, ...): its value is in the metadata
            self.env[node] = self._scalar_from_meta(val, where)
            return
        if target is torch.ops.higher_order.cond:
            self.env[node] = import_cond(self, node, where)
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise UnsupportedOpError(f"{name} is not supported", location=where,
                                     hint="higher-order operators other than torch.cond cannot be imported")
        entry = CONVERTERS.get(name)
        if entry is None:
            raise UnsupportedOpError(f"aten op {name} is not supported", location=where)
        args = self._bind_args(node, where)
        produced = entry.run(AtenCtx(self, node, args), (*CONVERTER_BUGS, AssertionError))
        self._check(produced, val, where)
        self.env[node] = produced

    def _bind_args(self, node: Any, where: str) -> dict[str, Any]:
        schema = node.target._schema
        out: dict[str, Any] = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                raw = node.args[i]
            elif a.name in node.kwargs:
                raw = node.kwargs[a.name]
            elif a.has_default_value():
                raw = a.default_value
            else:
                raw = None
            out[a.name] = self.resolve(raw, where)
        return out

    def _check(self, produced: Any, val: Any, where: str) -> None:
        """Compare what a converter built with torch's own metadata: dtype and static dims."""
        assert torch is not None
        if isinstance(produced, Value) and isinstance(val, torch.Tensor):
            pairs = [(produced, val)]
        elif isinstance(produced, (list, tuple)) and isinstance(val, (list, tuple)):
            pairs = [(p, v) for p, v in zip(produced, val, strict=False)
                     if isinstance(p, Value) and isinstance(v, torch.Tensor)]
        else:
            return
        for p, v in pairs:
            want_dt = cir_dtype(v.dtype, where)
            want = self.dims(v.shape, where)
            ok = p.dtype is want_dt and len(want) == p.type.rank and all(
                not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(want, p.shape, strict=True))
            if not ok:
                raise IRError(f"converter built {p.type}, torch expects {want_dt}[{', '.join(map(str, want))}]",
                              location=where, hint="this is a bug in the converter")


def _scalar_types() -> tuple[type, ...]:
    if torch is None:  # pragma: no cover
        return (int, float, bool)
    return (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


_SCALARS = _scalar_types()


def _finite_int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f) or abs(f) >= INT64_MAX:
        return None
    return int(v)


def _debug_name(senv: Any, s: Any) -> str | None:
    if senv is None:
        return None
    debug = getattr(senv, "source_name_to_debug_name", {}) or {}
    for src in getattr(senv, "var_to_sources", {}).get(s, []):
        name = src.name() if callable(getattr(src, "name", None)) else getattr(src, "name", None)
        if name in debug:
            return str(debug[name])
    return None


def _ident(name: str) -> str:
    out = re.sub(r"\W", "_", name)
    if not re.match(r"[A-Za-z_]", out):
        out = "d_" + out
    return out


def _live_nodes(outputs: Sequence[Any]) -> set[Any]:
    assert torch is not None
    live: set[Any] = set()
    stack = [a for a in pytree.tree_leaves(list(outputs)) if isinstance(a, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        for a in n.all_input_nodes:
            stack.append(a)
    return live


def _output_names(ep: Any, count: int) -> list[str]:
    """Names for the outputs from the model's output structure (``last_hidden_state``), else ``out<k>``."""
    fallback = ["output"] if count == 1 else [f"out{k}" for k in range(count)]
    try:
        spec = ep.call_spec.out_spec
        tree = pytree.tree_unflatten(list(range(count)), spec)
        flat, _ = pytree.tree_flatten_with_path(tree)
    except Exception:
        return fallback
    if len(flat) != count:
        return fallback
    names: list[str] = []
    for path, _ in flat:
        text = pytree.keystr(path)
        parts = [p for p in re.split(r"[\[\]'\".]+", text) if p]
        if not parts or all(p.isdigit() for p in parts):
            name = fallback[len(names)]
        else:
            name = _ident("_".join(parts))
        while name in names:
            name += "_"
        names.append(name)
    return names


# --------------------------------------------------------------------------------------
# entry points


@contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence torch's own deprecation chatter about its pytree internals (not the user's code)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        yield


_OPTIONS = ("dynamic_shapes", "strict", "example_kwargs", "decompose", "dim_names")


def export_program(model: Any, example_inputs: Any = None, *, dynamic_shapes: Any = None, strict: bool = False,
                   example_kwargs: Mapping[str, Any] | None = None) -> Any:
    """``torch.export.export`` in eval mode (restoring the module's mode), failures as CuvilErrors."""
    assert torch is not None
    if example_inputs is None and not example_kwargs:
        raise ModelLoadError("an nn.Module is traced by torch.export, which needs example inputs of the shapes "
                             "it will run at",
                             hint="pass example_inputs=(x,) to cuvil.compile / cuvil.import_model (a tensor, a "
                                  "tuple of them, or a dict of keyword inputs), use torch.compile(model, "
                                  "backend='cuvil'), or pass an ExportedProgram")
    if isinstance(example_inputs, Mapping):
        example_kwargs = {**dict(example_inputs), **dict(example_kwargs or {})}
        args: tuple = ()
    elif isinstance(example_inputs, torch.Tensor):
        args = (example_inputs,)
    elif example_inputs is None:
        args = ()
    else:
        args = tuple(example_inputs)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with stage("torch.export"), _quiet_torch():
            return torch.export.export(model, args, kwargs=dict(example_kwargs or {}), dynamic_shapes=dynamic_shapes,
                                       strict=strict)
    except CuvilError:
        raise
    except Exception as e:
        lines = [ln.rstrip() for ln in str(e).strip().splitlines() if ln.strip()]
        detail = "\n".join(lines[:8])[:1200]  # torch puts the suggested fix after the first line
        raise ModelLoadError(f"torch.export failed: {type(e).__name__}: {detail}",
                             location=type(model).__name__,
                             hint="the model must be exportable with torch.export (no data-dependent control "
                                  "flow); check dynamic_shapes against the example inputs") from e
    finally:
        for m, training in modes:
            m.training = training


def import_exported(ep: Any, *, decompose: bool = True, dim_names: Mapping[str, str] | None = None) -> Module:
    """Convert an ExportedProgram (lowered to core ATen first unless ``decompose=False``)."""
    if decompose:
        with stage("torch.export decompositions"), _quiet_torch():
            try:
                ep = ep.run_decompositions()
            except Exception as e:
                raise ModelLoadError(f"lowering to core ATen failed: {type(e).__name__}: {e}",
                                     location="run_decompositions") from e
    with stage("torch -> CIR"):
        imp = TorchImporter(ep, dict(dim_names or {}))
        module = imp.run()
    logger.debug("torch frontend: %d ops", len(module.main.ops()))
    return module


def import_torch(obj: Any, example_inputs: Any = None, **options: Any) -> Module:
    """Import an ``nn.Module`` (exported with ``example_inputs``) or an ``ExportedProgram`` into CIR.

    Options: ``dynamic_shapes`` (as for torch.export; ``torch.export.Dim`` names become CIR symbol
    names), ``strict`` (torch.export strict tracing, default False), ``example_kwargs``,
    ``decompose`` (lower to core ATen, default True), ``dim_names`` (torch symbol -> CIR name)."""
    if torch is None:  # pragma: no cover
        raise ModelLoadError("importing a torch model needs PyTorch", hint="pip install cuvil[torch]")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ModelLoadError(f"unknown torch import option(s) {unknown}", hint="options: " + ", ".join(_OPTIONS))
    if isinstance(obj, torch.export.ExportedProgram):
        ep = obj
    elif isinstance(obj, torch.nn.Module):
        ep = export_program(obj, example_inputs, dynamic_shapes=options.get("dynamic_shapes"),
                            strict=bool(options.get("strict", False)), example_kwargs=options.get("example_kwargs"))
    else:
        raise ModelLoadError(f"cannot import a {type(obj).__name__} with the torch frontend",
                             hint="pass an nn.Module with example_inputs, or an ExportedProgram")
    return import_exported(ep, decompose=bool(options.get("decompose", True)), dim_names=options.get("dim_names"))


def import_pt2(path: str | os.PathLike, **options: Any) -> Module:
    """Import a program saved with ``torch.export.save``."""
    if torch is None:  # pragma: no cover
        raise ModelLoadError("importing a .pt2 file needs PyTorch", hint="pip install cuvil[torch]")
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"file {path} does not exist", location=str(path))
    unknown = sorted(set(options) - {"decompose", "dim_names"})
    if unknown:
        raise ModelLoadError(f"unknown .pt2 import option(s) {unknown}", hint="options: decompose, dim_names")
    try:
        ep = torch.export.load(str(path))
    except Exception as e:
        raise ModelLoadError(f"cannot load {path.name}: {type(e).__name__}: {e}", location=str(path),
                             hint="the file must be written by torch.export.save") from None
    return import_exported(ep, decompose=bool(options.get("decompose", True)), dim_names=options.get("dim_names"))


def aten_converters() -> dict[str, ConverterEntry]:
    """Every aten overload the torch frontend converts, keyed by overload name."""
    return dict(CONVERTERS)
