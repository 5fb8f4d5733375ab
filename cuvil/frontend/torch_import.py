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
from cuvil.frontend.registry import ConverterEntry
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.opdef import norm_axis
from cuvil.ir.symbolic import Dim, Sym, sym_max, sym_min
from cuvil.ir.types import DimConstraint
from cuvil.ir.values import Value
from cuvil.log import logger, stage

try:  # torch is an optional dependency: importing this module without it must fail politely
    import torch
    import torch.fx
    import torch.utils._pytree as pytree
except ImportError:  # pragma: no cover - exercised only where torch is absent
    torch = None  # type: ignore[assignment]

INT64_MAX = 2**63 - 1

# --------------------------------------------------------------------------------------
# dtypes


def _torch_dtypes() -> dict[Any, DType]:
    return {
        torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
        torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
        torch.uint8: DType.u8, torch.uint16: DType.u16, torch.uint32: DType.u32, torch.uint64: DType.u64,
        torch.bool: DType.bool,
    }


def cir_dtype(dtype: Any, where: str = "") -> DType:
    """The CIR element type of a torch dtype."""
    found = _torch_dtypes().get(dtype)
    if found is None:
        raise UnsupportedOpError(f"torch dtype {dtype} is not supported", location=where or None,
                                 hint="supported: " + ", ".join(d.value for d in DType))
    return found


def torch_dtype(dtype: DType) -> Any:
    """The torch dtype of a CIR element type."""
    for t, d in _torch_dtypes().items():
        if d is dtype:
            return t
    raise KeyError(dtype)


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A real (not fake) tensor as a numpy array; bf16 keeps its bits via ml_dtypes."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bf16.np)
    return t.numpy()


# --------------------------------------------------------------------------------------
# converter registry

AtenConverter = Callable[["AtenCtx"], Any]

_CONVERTERS: dict[str, ConverterEntry] = {}


def aten_op(*names: str, emits: Sequence[str] = ()) -> Callable[[AtenConverter], AtenConverter]:
    """Register a converter for aten overloads (``"convolution.default"`` or ``"aten.convolution.default"``);
    ``emits`` names the CIR ops it may build (for ``cuvil ops``)."""

    def deco(fn: AtenConverter) -> AtenConverter:
        for n in names:
            key = n if n.startswith("aten.") else f"aten.{n}"
            if key in _CONVERTERS:
                raise RuntimeError(f"aten converter for {key} registered twice")
            _CONVERTERS[key] = ConverterEntry(key, "aten", fn, tuple(emits))
        return fn

    return deco


def aten_converters() -> dict[str, ConverterEntry]:
    """Every aten overload the torch frontend converts, keyed by overload name."""
    return dict(_CONVERTERS)


# nodes that only check facts torch already proved at export time
_DROPPED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
            "aten._assert_async.default", "aten.sym_constrain_range.default",
            "aten.sym_constrain_range_for_size.default", "aten._functional_assert_async.msg",
            "aten._functional_sym_constrain_range.default",
            "aten._functional_sym_constrain_range_for_size.default", "aten._print.default"}


@dataclass(frozen=True)
class _Unavailable:
    """A node whose value Cuvil cannot represent; an error only if something uses it."""

    reason: str


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
        if (e.is_Pow or isinstance(e, F.PowByNatural)) and e.args[1].is_Integer and int(e.args[1]) >= 0:
            out, base = 1, go(e.args[0])
            for _ in range(int(e.args[1])):
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


# --------------------------------------------------------------------------------------
# node context


_MISSING: Any = object()


class AtenCtx:
    """What a converter sees: the node, its arguments by schema name (CIR values, dims,
    python scalars), the node's output metadata, and the builder."""

    def __init__(self, imp: TorchImporter, node: Any, args: dict[str, Any]) -> None:
        self.imp = imp
        self.node = node
        self.args = args
        self.b: Builder = imp.b

    @property
    def location(self) -> str:
        return f"node {self.node.name} ({self.node.target})"

    @property
    def op_name(self) -> str:
        return str(self.node.target)

    def __getitem__(self, name: str) -> Any:
        if name not in self.args:
            raise IRError(f"{self.op_name} has no argument {name!r}", location=self.location)
        return self.args[name]

    def get(self, name: str, default: Any = None) -> Any:
        v = self.args.get(name, default)
        return default if v is None else v

    def arg_names(self) -> list[str]:
        return list(self.args)

    # output metadata ---------------------------------------------------------
    @property
    def meta(self) -> Any:
        return self.node.meta.get("val")

    def _meta_at(self, k: int | None) -> Any:
        m = self.meta
        if k is not None:
            m = m[k]
        if m is None or not hasattr(m, "dtype"):
            raise IRError(f"{self.op_name}: no tensor metadata for output {k}", location=self.location)
        return m

    def out_dtype(self, k: int | None = None) -> DType:
        return cir_dtype(self._meta_at(k).dtype, self.location)

    def out_shape(self, k: int | None = None) -> tuple[Dim, ...]:
        return self.imp.dims(self._meta_at(k).shape, self.location)

    # operands ----------------------------------------------------------------
    def tensor(self, name: str, dtype: DType | None = None) -> Value:
        """Argument ``name`` as a CIR value, converted to ``dtype`` (python scalars become constants)."""
        return self.imp.as_value(self[name], dtype, self.location)

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.dtype is dtype else self.b.cast(v, to=dtype)

    def promote(self, *xs: Any) -> DType:
        """torch's type promotion over tensors (CIR values) and python scalars."""
        return self.imp.promote(xs, self.location)

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.op_name}: {what}", location=self.location)


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
        if isinstance(x, _Unavailable):
            raise UnsupportedOpError(x.reason, location=where)
        if isinstance(x, Value):
            return x if dtype is None or x.dtype is dtype else self.b.cast(x, to=dtype)
        if isinstance(x, Sym):
            v = self.dim_value(x, where)
            return v if dtype is None or dtype is DType.i64 else self.b.cast(v, to=dtype)
        if isinstance(x, (bool, int, float, np.number)):
            if dtype is None:
                dtype = DType.bool if isinstance(x, bool) else DType.i64 if isinstance(x, int) else DType.f32
            return self.b.scalar(x, dtype)
        raise UnsupportedOpError(f"expected a tensor, got {type(x).__name__}", location=where)

    def promote(self, xs: Sequence[Any], where: str) -> DType:
        """torch.result_type over stand-ins: a rank-0 tensor for rank-0 values (they promote like
        scalars within a category), a 1-element tensor otherwise, python numbers as themselves."""
        stand: list[Any] = []
        for x in xs:
            if isinstance(x, _Unavailable):
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
        if not isinstance(t, torch.Tensor):
            raise UnsupportedOpError(f"constant of type {type(t).__name__} is not supported", location=where)
        return self.b.const(tensor_to_numpy(t))

    # graph ------------------------------------------------------------------------
    def run(self) -> Module:
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
                self.env[node] = self.constant(data, where) if isinstance(data, torch.Tensor) else _Unavailable(
                    f"constant {target!r} of type {type(data).__name__} is not supported")
            else:
                self.env[node] = _Unavailable(f"input {node.name} of kind {spec.kind.name} is not supported")
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        user_outs = [a for a, s in zip(out_node.args[0], sig.output_specs, strict=True)
                     if s.kind == OutputKind.USER_OUTPUT]
        live = _live_nodes(user_outs)
        for node in gm.graph.nodes:
            if node.op != "call_function" or node not in live:
                continue
            self.convert_node(node)
        results: list[Value] = []
        for k, a in enumerate(user_outs):
            where = f"output {k}"
            v = self.resolve(a, where)
            if isinstance(v, (int, Sym, float, bool)) and not isinstance(v, Value):
                v = self.as_value(v, None, where)
            if not isinstance(v, Value):
                raise UnsupportedOpError(f"output {k} is a {type(v).__name__}, not a tensor", location=where)
            results.append(v)
        names = _output_names(ep, len(results))
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
        if isinstance(val, torch.SymInt):
            try:
                return self.dim(val, where)
            except UnsupportedOpError as e:
                return _Unavailable(e.message)
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            c = val.node.maybe_as_float() if isinstance(val, torch.SymFloat) and hasattr(
                val.node, "maybe_as_float") else None
            if c is not None:
                return float(c)
            return _Unavailable(f"symbolic scalar {val} cannot be represented")
        return val

    def convert_node(self, node: Any) -> None:
        target = node.target
        name = str(target)
        where = f"node {node.name} ({name})"
        if target is operator.getitem:
            seq = self.resolve(node.args[0], where)
            idx = node.args[1]
            if isinstance(seq, _Unavailable):
                self.env[node] = seq
                return
            item = seq[idx]
            if item is None:
                item = _Unavailable(f"output {idx} of {node.args[0].name} is not supported")
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
        if not isinstance(target, torch._ops.OpOverload):
            raise UnsupportedOpError(f"{name} is not supported", location=where,
                                     hint="control flow and other higher-order operators cannot be imported")
        entry = _CONVERTERS.get(name)
        if entry is None:
            raise UnsupportedOpError(f"aten op {name} is not supported", location=where)
        args = self._bind_args(node, where)
        ctx = AtenCtx(self, node, args)
        try:
            produced = entry.fn(ctx)
        except CuvilError as e:
            if e.location is None:
                e.location = where
            elif where not in e.location:
                e.location = f"{where}: {e.location}"
            raise
        except (ValueError, TypeError, KeyError, IndexError, AssertionError) as e:
            raise IRError(f"converting {name} failed: {type(e).__name__}: {e}", location=where,
                          hint="this is a bug in the converter or an unsupported variant of the op") from e
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
    if example_inputs is None and not example_kwargs:
        raise ModelLoadError("importing an nn.Module needs example inputs",
                             hint="call import_model(model, example_inputs=(x,)) or pass an ExportedProgram")
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


# --------------------------------------------------------------------------------------
# converters: helpers


def _axis(ctx: AtenCtx, d: int, rank: int) -> int:
    return norm_axis(int(d), max(rank, 1), ctx.op_name)


def _reshape(ctx: AtenCtx, x: Value, shape: Sequence[Dim]) -> Value:
    if tuple(x.shape) == tuple(shape):
        return x
    return ctx.b.reshape(x, shape=tuple(shape))


def _slice_axis(b: Builder, x: Value, axis: int, start: Dim, end: Dim, step: int = 1) -> Value:
    starts = [0] * x.type.rank
    ends = list(x.shape)
    steps = [1] * x.type.rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    return b.slice(x, starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


def _clamp_index(i: Any, size: Dim, default: Dim) -> Dim:
    """A python slice bound made concrete against a (possibly symbolic) size, as torch does."""
    if i is None:
        return default
    if isinstance(i, Sym):
        return i
    i = int(i)
    if isinstance(size, int):
        if i < 0:
            i += size
        return max(0, min(i, size))
    if i >= INT64_MAX // 2:
        return size
    return size + i if i < 0 else i


def _binary_operands(ctx: AtenCtx, a: Any, b: Any, dtype: DType) -> tuple[Value, Value]:
    return ctx.imp.as_value(a, dtype, ctx.location), ctx.imp.as_value(b, dtype, ctx.location)


def _first_two(ctx: AtenCtx) -> tuple[Any, Any]:
    names = ctx.arg_names()
    return ctx[names[0]], ctx[names[1]]


# --------------------------------------------------------------------------------------
# converters: elementwise

_UNARY_FLOAT = {  # aten name -> CIR op; the input is converted to the output dtype first
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "neg": "neg", "abs": "abs", "erf": "erf", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "reciprocal": "reciprocal", "floor": "floor", "ceil": "ceil",
    "round": "round", "sign": "sign", "silu": "silu", "mish": "mish", "hardswish": "hardswish",
}


def _unary(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self", ctx.out_dtype())
        return ctx.b.op(cir, x)

    return conv


for _aten, _cir in _UNARY_FLOAT.items():
    aten_op(f"{_aten}.default", emits=(_cir, "cast"))(_unary(_cir))


@aten_op("log1p.default", emits=("log", "add", "cast"))
def _log1p(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.log(ctx.b.add(x, ctx.b.scalar(1, x.dtype)))


@aten_op("expm1.default", emits=("exp", "sub", "cast"))
def _expm1(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.sub(ctx.b.exp(x), ctx.b.scalar(1, x.dtype))


@aten_op("log2.default", "log10.default", emits=("log", "mul", "cast"))
def _log_base(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    base = 2.0 if ctx.op_name.startswith("aten.log2") else 10.0
    return ctx.b.mul(ctx.b.log(x), ctx.b.scalar(1.0 / math.log(base), x.dtype))


@aten_op("exp2.default", emits=("pow", "cast"))
def _exp2(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.pow(ctx.b.scalar(2, x.dtype), x)


@aten_op("trunc.default", emits=("floor", "ceil", "less", "where"))
def _trunc(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    if not x.dtype.is_float:
        return x
    b = ctx.b
    return b.where(b.less(x, b.scalar(0, x.dtype)), b.ceil(x), b.floor(x))


@aten_op("isnan.default", emits=("isnan",))
def _isnan(ctx: AtenCtx) -> Value:
    return ctx.b.isnan(ctx.tensor("self"))


@aten_op("isinf.default", emits=("isinf",))
def _isinf(ctx: AtenCtx) -> Value:
    return ctx.b.isinf(ctx.tensor("self"), detect_positive=True, detect_negative=True)


@aten_op("logical_not.default", emits=("logical_not", "cast"))
def _logical_not(ctx: AtenCtx) -> Value:
    return ctx.b.logical_not(ctx.tensor("self", DType.bool))


@aten_op("bitwise_not.default", emits=("bitwise_not", "logical_not"))
def _bitwise_not(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return ctx.b.logical_not(x) if x.dtype is DType.bool else ctx.b.bitwise_not(x)


@aten_op("hardsigmoid.default", emits=("hardsigmoid", "cast"))
def _hardsigmoid(ctx: AtenCtx) -> Value:
    return ctx.b.hardsigmoid(ctx.tensor("self", ctx.out_dtype()), alpha=1.0 / 6.0, beta=0.5)


@aten_op("gelu.default", emits=("gelu",))
def _gelu(ctx: AtenCtx) -> Value:
    return ctx.b.gelu(ctx.tensor("self"), approximate=str(ctx.get("approximate", "none")))


@aten_op("leaky_relu.default", emits=("leaky_relu",))
def _leaky_relu(ctx: AtenCtx) -> Value:
    return ctx.b.leaky_relu(ctx.tensor("self"), alpha=float(ctx.get("negative_slope", 0.01)))


@aten_op("elu.default", emits=("elu", "mul"))
def _elu(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    scale, input_scale = float(ctx.get("scale", 1.0)), float(ctx.get("input_scale", 1.0))
    if input_scale != 1.0:
        raise ctx.unsupported(f"input_scale={input_scale}")
    y = ctx.b.elu(x, alpha=float(ctx.get("alpha", 1.0)))
    return y if scale == 1.0 else ctx.b.mul(y, ctx.b.scalar(scale, x.dtype))


@aten_op("softplus.default", emits=("softplus", "mul", "div", "greater", "where"))
def _softplus(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    beta, threshold = float(ctx.get("beta", 1.0)), float(ctx.get("threshold", 20.0))
    b = ctx.b
    bx = x if beta == 1.0 else b.mul(x, b.scalar(beta, x.dtype))
    soft = b.softplus(bx)
    if beta != 1.0:
        soft = b.div(soft, b.scalar(beta, x.dtype))
    return b.where(b.greater(bx, b.scalar(threshold, x.dtype)), x, soft)


def _clip(ctx: AtenCtx, x: Value, lo: Any, hi: Any) -> Value:
    b = ctx.b
    if isinstance(lo, Value) or isinstance(hi, Value):
        y = x if lo is None else b.max(x, ctx.imp.as_value(lo, x.dtype, ctx.location))
        return y if hi is None else b.min(y, ctx.imp.as_value(hi, x.dtype, ctx.location))
    if x.dtype.is_float:
        return b.clip(x, min=None if lo is None else float(lo), max=None if hi is None else float(hi))
    y = x if lo is None else b.max(x, b.scalar(lo, x.dtype))
    return y if hi is None else b.min(y, b.scalar(hi, x.dtype))


@aten_op("hardtanh.default", emits=("clip", "max", "min"))
def _hardtanh(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self"), ctx.get("min_val", -1.0), ctx.get("max_val", 1.0))


@aten_op("clamp.default", "clamp.Tensor", emits=("clip", "max", "min", "cast"))
def _clamp(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), ctx.get("min"), ctx.get("max"))


@aten_op("clamp_min.default", "clamp_min.Tensor", emits=("clip", "max", "cast"))
def _clamp_min(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), ctx["min"], None)


@aten_op("clamp_max.default", "clamp_max.Tensor", emits=("clip", "min", "cast"))
def _clamp_max(ctx: AtenCtx) -> Value:
    return _clip(ctx, ctx.tensor("self", ctx.out_dtype()), None, ctx["max"])


_BINARY_ARITH = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
                 "pow": "pow", "remainder": "mod", "fmod": "mod"}


def _binary(aten: str, cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        a, b_ = _first_two(ctx)
        dtype = ctx.out_dtype()
        alpha = ctx.args.get("alpha")
        if alpha is not None and alpha != 1:
            b_ = ctx.b.mul(ctx.imp.as_value(b_, dtype, ctx.location), ctx.b.scalar(alpha, dtype))
        x, y = _binary_operands(ctx, a, b_, dtype)
        if aten == "fmod":
            return ctx.b.mod(x, y, fmod=True)
        if aten == "remainder" and dtype.is_float:
            return ctx.b.mod(x, y, fmod=False)
        return ctx.b.op(cir, x, y)

    return conv


for _aten, _cir in _BINARY_ARITH.items():
    _overloads = {"add": ("Tensor", "Scalar"), "sub": ("Tensor", "Scalar"), "mul": ("Tensor", "Scalar"),
                  "div": ("Tensor", "Scalar"), "maximum": ("default",), "minimum": ("default",),
                  "pow": ("Tensor_Tensor", "Tensor_Scalar", "Scalar"), "remainder": ("Tensor", "Scalar"),
                  "fmod": ("Tensor", "Scalar")}[_aten]
    aten_op(*(f"{_aten}.{o}" for o in _overloads), emits=(_cir, "mul", "cast"))(_binary(_aten, _cir))


@aten_op("rsub.Scalar", "rsub.Tensor", emits=("sub", "mul", "cast"))
def _rsub(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    x = ctx.tensor("self", dtype)
    alpha = ctx.get("alpha", 1)
    if alpha != 1:
        x = ctx.b.mul(x, ctx.b.scalar(alpha, dtype))
    return ctx.b.sub(ctx.tensor("other", dtype), x)


@aten_op("div.Tensor_mode", "div.Scalar_mode", "floor_divide.default", emits=("div", "floor", "ceil", "where",
                                                                               "less", "mod", "sub", "cast"))
def _div_mode(ctx: AtenCtx) -> Value:
    mode = ctx.get("rounding_mode", "floor" if ctx.op_name.startswith("aten.floor_divide") else None)
    dtype = ctx.out_dtype()
    x, y = _binary_operands(ctx, *_first_two(ctx), dtype)
    b = ctx.b
    if mode is None:
        return b.div(x, y)
    if dtype.is_float:
        q = b.div(x, y)
        if mode == "floor":
            return b.floor(q)
        return b.where(b.less(q, b.scalar(0, dtype)), b.ceil(q), b.floor(q))
    if mode == "trunc":
        return b.div(x, y)
    # floored integer division: (x - x mod y) / y is exact, with mod taking the sign of y
    return b.div(b.sub(x, b.mod(x, y, fmod=False)), y)


_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
            "ge": "greater_equal"}


def _compare(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        a, b_ = _first_two(ctx)
        x, y = _binary_operands(ctx, a, b_, ctx.promote(a, b_))
        return ctx.b.op(cir, x, y)

    return conv


for _aten, _cir in _COMPARE.items():
    aten_op(f"{_aten}.Tensor", f"{_aten}.Scalar", emits=(_cir, "cast"))(_compare(_cir))


def _bitwise(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        dtype = ctx.out_dtype()
        x, y = _binary_operands(ctx, *_first_two(ctx), dtype)
        return ctx.b.op(f"logical_{kind}" if dtype is DType.bool else f"bitwise_{kind}", x, y)

    return conv


for _kind in ("and", "or", "xor"):
    aten_op(f"bitwise_{_kind}.Tensor", f"bitwise_{_kind}.Scalar",
            emits=(f"bitwise_{_kind}", f"logical_{_kind}", "cast"))(_bitwise(_kind))


def _logical(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x, y = _binary_operands(ctx, *_first_two(ctx), DType.bool)
        return ctx.b.op(f"logical_{kind}", x, y)

    return conv


for _kind in ("and", "or", "xor"):
    aten_op(f"logical_{_kind}.default", emits=(f"logical_{_kind}", "cast"))(_logical(_kind))


@aten_op("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", emits=("where", "cast"))
def _where(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    cond = ctx.tensor("condition", DType.bool)
    return ctx.b.where(cond, ctx.tensor("self", dtype), ctx.tensor("other", dtype))


@aten_op("masked_fill.Scalar", "masked_fill.Tensor", emits=("where", "cast"))
def _masked_fill(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    return ctx.b.where(ctx.tensor("mask", DType.bool), ctx.tensor("value", dtype), ctx.tensor("self", dtype))


# --------------------------------------------------------------------------------------
# converters: casts, copies and creation


@aten_op("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default",
         "dropout.default", emits=())
def _identity(ctx: AtenCtx) -> Value:
    names = ctx.arg_names()
    return ctx.tensor(names[0])


@aten_op("_to_copy.default", "to.dtype", "_to_dim_order_copy.default", emits=("cast",))
def _to_copy(ctx: AtenCtx) -> Value:
    return ctx.tensor("self", ctx.out_dtype())


@aten_op("copy.default", emits=("expand", "cast"))
def _copy(ctx: AtenCtx) -> Value:
    src = ctx.tensor("src", ctx.out_dtype())
    shape = ctx.out_shape()
    return src if tuple(src.shape) == shape else ctx.b.expand(src, shape=shape)


def _python_scalar(value: Any, dtype: DType) -> bool | int | float:
    if dtype is DType.bool:
        return bool(value)
    return float(value) if dtype.is_float else int(value)


def _fill(ctx: AtenCtx, value: Any) -> Value:
    dtype = ctx.out_dtype()
    shape = ctx.out_shape()
    if isinstance(value, (Value, Sym)):
        v = ctx.imp.as_value(value, dtype, ctx.location)
        return v if tuple(v.shape) == shape else ctx.b.expand(v, shape=shape)
    if not shape:
        return ctx.b.scalar(value, dtype)
    return ctx.b.fill(shape=shape, value=_python_scalar(value, dtype), dtype=dtype)


@aten_op("full.default", emits=("fill", "const", "expand"))
def _full(ctx: AtenCtx) -> Value:
    return _fill(ctx, ctx["fill_value"])


@aten_op("full_like.default", emits=("fill", "const", "expand"))
def _full_like(ctx: AtenCtx) -> Value:
    return _fill(ctx, ctx["fill_value"])


@aten_op("zeros.default", "zeros_like.default", "empty.memory_format", "empty_like.default",
         "new_zeros.default", "new_empty.default", emits=("fill", "const"))
def _zeros(ctx: AtenCtx) -> Value:
    return _fill(ctx, 0)


@aten_op("ones.default", "ones_like.default", "new_ones.default", emits=("fill", "const"))
def _ones(ctx: AtenCtx) -> Value:
    return _fill(ctx, 1)


@aten_op("scalar_tensor.default", emits=("const", "cast", "shape", "slice", "reshape", "mul", "add"))
def _scalar_tensor(ctx: AtenCtx) -> Value:
    return ctx.tensor("s", ctx.out_dtype())


@aten_op("arange.default", "arange.start", "arange.start_step", emits=("const", "iota"))
def _arange(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    start = ctx.get("start", 0)
    step = ctx.get("step", 1)
    end = ctx["end"]
    if any(isinstance(v, (Value, _Unavailable)) for v in (start, step, end)):
        raise ctx.unsupported("tensor bounds")
    (n,) = ctx.out_shape()
    if isinstance(start, Sym) or isinstance(step, Sym):
        raise ctx.unsupported("symbolic start or step")
    if isinstance(n, int):
        data = start + step * np.arange(n, dtype=np.float64 if dtype.is_float else np.int64)
        return ctx.b.const(np.asarray(data, dtype=dtype.np))
    return ctx.b.iota(shape=(n,), start=_python_scalar(start, dtype), step=_python_scalar(step, dtype), dtype=dtype)


# --------------------------------------------------------------------------------------
# converters: layout


@aten_op("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
         "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "flatten.using_ints",
         "unflatten.int", emits=("reshape",))
def _view(ctx: AtenCtx) -> Value:
    return _reshape(ctx, ctx.tensor("self"), ctx.out_shape())


@aten_op("permute.default", "permute_copy.default", emits=("transpose",))
def _permute(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    perm = tuple(_axis(ctx, d, x.type.rank) for d in ctx["dims"])
    return x if perm == tuple(range(x.type.rank)) else ctx.b.transpose(x, perm=perm)


@aten_op("transpose.int", "t.default", emits=("transpose",))
def _transpose(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    r = x.type.rank
    if r < 2:
        return x
    d0, d1 = (_axis(ctx, ctx["dim0"], r), _axis(ctx, ctx["dim1"], r)) if "dim0" in ctx.args else (0, 1)
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x if d0 == d1 else ctx.b.transpose(x, perm=tuple(perm))


@aten_op("expand.default", "expand_copy.default", emits=("expand",))
def _expand(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    shape = ctx.out_shape()
    return x if tuple(x.shape) == shape else ctx.b.expand(x, shape=shape)


@aten_op("repeat.default", emits=("tile", "reshape"))
def _repeat(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    reps = [int(r) for r in ctx["repeats"]]
    if len(reps) > x.type.rank:
        x = _reshape(ctx, x, (1,) * (len(reps) - x.type.rank) + tuple(x.shape))
    return x if all(r == 1 for r in reps) else ctx.b.tile(x, repeats=tuple(reps))


@aten_op("cat.default", emits=("concat", "cast"))
def _cat(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    xs = [ctx.imp.as_value(t, dtype, ctx.location) for t in ctx["tensors"]]
    rank = len(ctx.out_shape())
    axis = _axis(ctx, ctx.get("dim", 0), rank)
    # torch skips legacy empty 1-D tensors; pieces empty along the axis add nothing
    kept = [x for x in xs if x.type.rank == rank and x.shape[axis] != 0] or [x for x in xs if x.type.rank == rank]
    if len(kept) == 1:
        return kept[0]
    return ctx.b.concat(*kept, axis=axis)


@aten_op("stack.default", emits=("concat", "reshape", "cast"))
def _stack(ctx: AtenCtx) -> Value:
    dtype = ctx.out_dtype()
    shape = ctx.out_shape()
    axis = _axis(ctx, ctx.get("dim", 0), len(shape))
    xs = []
    for t in ctx["tensors"]:
        x = ctx.imp.as_value(t, dtype, ctx.location)
        xs.append(_reshape(ctx, x, (*x.shape[:axis], 1, *x.shape[axis:])))
    return xs[0] if len(xs) == 1 else ctx.b.concat(*xs, axis=axis)


@aten_op("slice.Tensor", "slice_copy.Tensor", emits=("slice",))
def _slice(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    axis = _axis(ctx, ctx.get("dim", 0), x.type.rank)
    size = x.shape[axis]
    step = int(ctx.get("step", 1))
    start = _clamp_index(ctx.get("start"), size, 0)
    end = _clamp_index(ctx.get("end"), size, size)
    if isinstance(start, int) and isinstance(end, int):
        end = max(start, end)
    if start == 0 and end == size and step == 1:
        return x
    return _slice_axis(ctx.b, x, axis, start, end, step)


def _select(ctx: AtenCtx, x: Value, axis: int, index: Any) -> Value:
    size = x.shape[axis]
    if isinstance(index, Sym):
        i: Dim = index
    else:
        i = int(index)
        if i < 0:
            i = size + i
    piece = _slice_axis(ctx.b, x, axis, i, i + 1, 1)
    return _reshape(ctx, piece, tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:]))


@aten_op("select.int", "select_copy.int", emits=("slice", "reshape"))
def _select_int(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    return _select(ctx, x, _axis(ctx, ctx["dim"], x.type.rank), ctx["index"])


@aten_op("unbind.int", emits=("slice", "reshape"))
def _unbind(ctx: AtenCtx) -> list[Value]:
    x = ctx.tensor("self")
    axis = _axis(ctx, ctx.get("dim", 0), x.type.rank)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ctx.unsupported("unbind along a symbolic dim")
    return [_select(ctx, x, axis, i) for i in range(n)]


@aten_op("split_with_sizes.default", "split.Tensor", "split_with_sizes_copy.default", "split_copy.Tensor",
         emits=("slice",))
def _split(ctx: AtenCtx) -> list[Value]:
    x = ctx.tensor("self")
    axis = _axis(ctx, ctx.get("dim", 0), x.type.rank)
    out: list[Value] = []
    start: Dim = 0
    for k in range(len(ctx.meta)):
        size = ctx.out_shape(k)[axis]
        end = start + size
        out.append(x if start == 0 and end == x.shape[axis] else _slice_axis(ctx.b, x, axis, start, end, 1))
        start = end
    return out


@aten_op("index_select.default", emits=("gather", "cast"))
def _index_select(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    return ctx.b.gather(x, idx, axis=_axis(ctx, ctx["dim"], x.type.rank))


@aten_op("gather.default", emits=("gather_elements", "cast"))
def _gather(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    return ctx.b.gather_elements(x, idx, axis=_axis(ctx, ctx["dim"], x.type.rank))


_SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


@aten_op("scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two",
         emits=("scatter_elements", "fill", "expand", "cast"))
def _scatter(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    idx = ctx.tensor("index", DType.i64)
    if "src" in ctx.args:
        src = ctx.tensor("src", x.dtype)
    else:
        value = ctx["value"]
        src = ctx.imp.as_value(value, x.dtype, ctx.location) if isinstance(value, (Value, Sym)) else None
        if src is None:
            src = ctx.b.fill(shape=tuple(idx.shape), value=_python_scalar(value, x.dtype), dtype=x.dtype)
        elif tuple(src.shape) != tuple(idx.shape):
            src = ctx.b.expand(src, shape=tuple(idx.shape))
    reduction = "none"
    if ctx.op_name == "aten.scatter_add.default":
        reduction = "add"
    elif ctx.op_name == "aten.scatter_reduce.two":
        kind = str(ctx["reduce"])
        if kind not in _SCATTER_REDUCE or not ctx.get("include_self", True):
            raise ctx.unsupported(f"reduce={kind!r} include_self={ctx.get('include_self', True)}")
        reduction = _SCATTER_REDUCE[kind]
    elif ctx.args.get("reduce") is not None:
        raise ctx.unsupported(f"reduce={ctx['reduce']!r}")
    return ctx.b.scatter_elements(x, idx, src, axis=_axis(ctx, ctx["dim"], x.type.rank), reduction=reduction)


@aten_op("embedding.default", emits=("embedding", "cast"))
def _embedding(ctx: AtenCtx) -> Value:
    ids = ctx.tensor("indices")
    if ids.dtype not in (DType.i64, DType.i32):
        ids = ctx.cast(ids, DType.i64)
    return ctx.b.embedding(ctx.tensor("weight"), ids)


@aten_op("index.Tensor", "_unsafe_index.Tensor", emits=("gather", "gather_nd", "transpose", "reshape", "expand",
                                                          "concat", "cast"))
def _index(ctx: AtenCtx) -> Value:
    """Advanced indexing ``x[i0, i1, ...]``: the indexed axes move to the front, their broadcast
    indices are stacked into one gather_nd, and the result axes go where numpy puts them."""
    x = ctx.tensor("self")
    b = ctx.b
    raw = list(ctx["indices"])
    axes = [k for k, t in enumerate(raw) if t is not None]
    idxs = []
    for k in axes:
        t = ctx.imp.as_value(raw[k], None, ctx.location)
        if t.dtype is DType.bool:
            raise ctx.unsupported("boolean mask indexing (data-dependent shape)")
        idxs.append(ctx.cast(t, DType.i64))
    if len(idxs) == 1:
        out = b.gather(x, idxs[0], axis=axes[0])
        return out
    from cuvil.ir.opdef import broadcast_shapes

    bshape = broadcast_shapes(*(t.shape for t in idxs))
    stacked = []
    for t in idxs:
        t = t if tuple(t.shape) == bshape else b.expand(t, shape=bshape)
        stacked.append(b.reshape(t, shape=(*bshape, 1)))
    index = b.concat(*stacked, axis=len(bshape))
    rest = [k for k in range(x.type.rank) if k not in axes]
    front = axes + rest
    xt = x if front == list(range(x.type.rank)) else b.transpose(x, perm=tuple(front))
    g = b.gather_nd(xt, index, batch_dims=0)
    consecutive = axes == list(range(axes[0], axes[0] + len(axes)))
    if consecutive and axes[0] > 0:
        nb = len(bshape)
        leading = list(range(nb, nb + axes[0]))
        perm = leading + list(range(nb)) + list(range(nb + axes[0], g.type.rank))
        g = b.transpose(g, perm=tuple(perm))
    return g


@aten_op("flip.default", emits=("slice",))
def _flip(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    axes = {_axis(ctx, d, x.type.rank) for d in ctx["dims"]}
    if not axes:
        return x
    starts = [x.shape[k] - 1 if k in axes else 0 for k in range(x.type.rank)]
    ends = [-1 if k in axes else x.shape[k] for k in range(x.type.rank)]
    steps = [-1 if k in axes else 1 for k in range(x.type.rank)]
    return ctx.b.slice(x, starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


@aten_op("topk.default", emits=("topk",))
def _topk(ctx: AtenCtx) -> tuple[Value, Value]:
    x = ctx.tensor("self")
    k = ctx["k"]
    if not isinstance(k, int):
        raise ctx.unsupported("symbolic k")
    axis = _axis(ctx, ctx.get("dim", -1), x.type.rank)
    largest, ordered = bool(ctx.get("largest", True)), bool(ctx.get("sorted", True))
    return tuple(ctx.b.topk(x, k=k, axis=axis, largest=largest, sorted=ordered, output=o)  # type: ignore[return-value]
                 for o in ("values", "indices"))


@aten_op("sort.default", emits=("topk",))
def _sort(ctx: AtenCtx) -> tuple[Value, Value]:
    """A full sort is a top-k with k = the axis length (ties may come out in another order)."""
    x = ctx.tensor("self")
    axis = _axis(ctx, ctx.get("dim", -1), x.type.rank)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ctx.unsupported("sorting along a symbolic dim")
    largest = bool(ctx.get("descending", False))
    return tuple(ctx.b.topk(x, k=n, axis=axis, largest=largest, sorted=True, output=o)  # type: ignore[return-value]
                 for o in ("values", "indices"))


def _resize(ctx: AtenCtx, mode: str, transform: str) -> Value:
    x = ctx.tensor("input")
    out = ctx.out_shape()
    # torch maps coordinates with the given scale factors, except under align_corners (sizes only)
    factors = ctx.args.get("scale_factors") if transform != "align_corners" else None
    n = x.type.rank - 2
    if factors is not None:
        scales = (1.0, 1.0, *(float(f) for f in _spatial_floats(factors, n)))
    else:
        if not all(isinstance(d, int) for d in (*x.shape[2:], *out[2:])):
            raise ctx.unsupported("resizing between symbolic sizes")
        scales = (1.0, 1.0, *(int(o) / int(i) for o, i in zip(out[2:], x.shape[2:], strict=True)))
    return ctx.b.resize(x, sizes=out, scales=scales, mode=mode, coordinate_transformation_mode=transform,
                        nearest_mode="floor")


def _spatial_floats(values: Sequence[float], n: int) -> tuple[float, ...]:
    vals = [float(v) for v in values]
    return tuple(vals * n) if len(vals) == 1 else tuple(vals)


@aten_op("upsample_nearest2d.vec", "upsample_nearest1d.vec", "upsample_nearest3d.vec", emits=("resize",))
def _upsample_nearest(ctx: AtenCtx) -> Value:
    return _resize(ctx, "nearest", "asymmetric")


@aten_op("upsample_bilinear2d.vec", "upsample_linear1d.vec", "upsample_trilinear3d.vec", emits=("resize",))
def _upsample_linear(ctx: AtenCtx) -> Value:
    return _resize(ctx, "linear", "align_corners" if ctx.get("align_corners", False) else "pytorch_half_pixel")


@aten_op("constant_pad_nd.default", emits=("pad",))
def _constant_pad(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    pad = [int(p) for p in ctx["pad"]]
    r = x.type.rank
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):
        axis = r - 1 - k
        begins[axis], ends[axis] = pad[2 * k], pad[2 * k + 1]
    if any(p < 0 for p in pad):
        raise ctx.unsupported("negative padding")
    if not any(pad):
        return x
    return ctx.b.pad(x, pads=tuple(begins + ends), mode="constant", value=float(ctx.get("value", 0.0)))


@aten_op("tril.default", "triu.default", emits=("trilu",))
def _trilu(ctx: AtenCtx) -> Value:
    return ctx.b.trilu(ctx.tensor("self"), upper=ctx.op_name.startswith("aten.triu"),
                       k=int(ctx.get("diagonal", 0)))


@aten_op("cumsum.default", emits=("cumsum", "cast"))
def _cumsum(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.cumsum(x, axis=_axis(ctx, ctx["dim"], x.type.rank), exclusive=False, reverse=False)


# --------------------------------------------------------------------------------------
# converters: reductions


def _reduce_axes(ctx: AtenCtx, x: Value, dims: Any) -> tuple[int, ...]:
    if dims is None:
        return ()
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({_axis(ctx, d, x.type.rank) for d in dims}))


def _reduce(cir: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self", ctx.out_dtype())
        axes = _reduce_axes(ctx, x, ctx.get("dim"))
        if x.type.rank == 0:
            return x
        return ctx.b.op(cir, x, axes=axes, keepdims=bool(ctx.get("keepdim", False)))

    return conv


aten_op("mean.dim", "mean.default", emits=("reduce_mean", "cast"))(_reduce("reduce_mean"))
aten_op("sum.dim_IntList", "sum.default", emits=("reduce_sum", "cast"))(_reduce("reduce_sum"))
aten_op("amax.default", emits=("reduce_max",))(_reduce("reduce_max"))
aten_op("amin.default", emits=("reduce_min",))(_reduce("reduce_min"))
aten_op("prod.dim_int", "prod.default", emits=("reduce_prod", "cast"))(_reduce("reduce_prod"))


def _bool_reduce(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.cast(ctx.tensor("self", DType.bool), DType.u8)
        axes = _reduce_axes(ctx, x, ctx.get("dim"))
        r = ctx.b.op(kind, x, axes=axes, keepdims=bool(ctx.get("keepdim", False))) if x.type.rank else x
        return ctx.cast(r, DType.bool)

    return conv


aten_op("any.default", "any.dim", "any.dims", emits=("reduce_max", "cast"))(_bool_reduce("reduce_max"))
aten_op("all.default", "all.dim", "all.dims", emits=("reduce_min", "cast"))(_bool_reduce("reduce_min"))


def _minmax_dim(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> tuple[Value, Value]:
        x = ctx.tensor("self")
        axis = _axis(ctx, ctx["dim"], x.type.rank)
        keep = bool(ctx.get("keepdim", False))
        values = ctx.b.op(f"reduce_{kind}", x, axes=(axis,), keepdims=keep)
        indices = ctx.b.op(f"arg{kind}", x, axis=axis, keepdims=keep, select_last_index=False)
        return values, indices

    return conv


aten_op("max.dim", emits=("reduce_max", "argmax"))(_minmax_dim("max"))
aten_op("min.dim", emits=("reduce_min", "argmin"))(_minmax_dim("min"))


def _arg(kind: str) -> AtenConverter:
    def conv(ctx: AtenCtx) -> Value:
        x = ctx.tensor("self")
        dim = ctx.get("dim")
        keep = bool(ctx.get("keepdim", False))
        if dim is None:
            flat = ctx.b.reshape(x, shape=(x.type.numel(),))
            out = ctx.b.op(kind, flat, axis=0, keepdims=False, select_last_index=False)
            return _reshape(ctx, out, ctx.out_shape())
        return ctx.b.op(kind, x, axis=_axis(ctx, dim, x.type.rank), keepdims=keep, select_last_index=False)

    return conv


aten_op("argmax.default", emits=("argmax", "reshape"))(_arg("argmax"))
aten_op("argmin.default", emits=("argmin", "reshape"))(_arg("argmin"))


@aten_op("var.correction", "var.dim", "std.correction", "std.dim",
         emits=("reduce_mean", "reduce_sum", "sub", "mul", "div", "sqrt"))
def _var(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    b = ctx.b
    axes = _reduce_axes(ctx, x, ctx.get("dim"))
    keep = bool(ctx.get("keepdim", False))
    if ctx.op_name.endswith(".dim"):
        correction = 1 if ctx.get("unbiased", True) else 0
    else:
        c = ctx.args.get("correction")
        correction = 1 if c is None else c
    mean = b.reduce_mean(x, axes=axes, keepdims=True)
    d = b.sub(x, mean)
    ss = b.reduce_sum(b.mul(d, d), axes=axes, keepdims=keep)
    n: Dim = 1
    for a in (axes or tuple(range(x.type.rank))):
        n = n * x.shape[a]
    var = b.div(ss, ctx.imp.as_value(n - correction, x.dtype, ctx.location))
    return b.sqrt(var) if ctx.op_name.startswith("aten.std") else var


# --------------------------------------------------------------------------------------
# converters: linear algebra and nn


@aten_op("mm.default", "bmm.default", emits=("matmul",))
def _mm(ctx: AtenCtx) -> Value:
    return ctx.b.matmul(ctx.tensor("self"), ctx.tensor("mat2"))


def _scaled(ctx: AtenCtx, v: Value, factor: Any) -> Value:
    if factor is None or factor == 1:
        return v
    return ctx.b.mul(v, ctx.b.scalar(factor, v.dtype))


@aten_op("addmm.default", "baddbmm.default", emits=("matmul", "add", "mul"))
def _addmm(ctx: AtenCtx) -> Value:
    lhs, rhs = ("mat1", "mat2") if "mat1" in ctx.args else ("batch1", "batch2")
    prod = _scaled(ctx, ctx.b.matmul(ctx.tensor(lhs), ctx.tensor(rhs)), ctx.get("alpha", 1))
    beta = ctx.get("beta", 1)
    if beta == 0:
        return prod
    return ctx.b.add(prod, _scaled(ctx, ctx.tensor("self"), beta))


@aten_op("linear.default", emits=("matmul", "add"))
def _linear(ctx: AtenCtx) -> Value:
    y = ctx.b.matmul(ctx.tensor("input"), ctx.tensor("weight"), transpose_b=True)
    bias = ctx.args.get("bias")
    return y if bias is None else ctx.b.add(y, ctx.tensor("bias"))


def _channel_bias(ctx: AtenCtx, y: Value, bias: Value) -> Value:
    return ctx.b.add(y, _reshape(ctx, bias, (bias.shape[0],) + (1,) * (y.type.rank - 2)))


def _spatial(values: Sequence[int], n: int) -> tuple[int, ...]:
    vals = [int(v) for v in values]
    return tuple(vals * n) if len(vals) == 1 else tuple(vals)


@aten_op("convolution.default", emits=("conv", "conv_transpose", "add", "reshape"))
def _convolution(ctx: AtenCtx) -> Value:
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    n = x.type.rank - 2
    strides = _spatial(ctx["stride"], n)
    padding = _spatial(ctx["padding"], n)
    dilations = _spatial(ctx["dilation"], n)
    groups = int(ctx["groups"])
    if ctx["transposed"]:
        y = ctx.b.conv_transpose(x, w, strides=strides, pads=padding + padding, dilations=dilations, groups=groups,
                                 output_padding=_spatial(ctx["output_padding"], n))
    else:
        y = ctx.b.conv(x, w, strides=strides, pads=padding + padding, dilations=dilations, groups=groups)
    bias = ctx.args.get("bias")
    return y if bias is None else _channel_bias(ctx, y, ctx.tensor("bias"))


def _ones_or(ctx: AtenCtx, name: str, n: Dim, fill: float, dtype: DType) -> Value:
    v = ctx.args.get(name)
    if v is not None:
        return ctx.tensor(name)
    if not isinstance(n, int):
        raise ctx.unsupported(f"missing {name} over a symbolic dim")
    return ctx.b.const(np.full((n,), fill, dtype=dtype.np))


def _batch_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    x = ctx.tensor("input")
    c = x.shape[1]
    if ctx.args.get("running_mean") is None or ctx.args.get("running_var") is None:
        raise ctx.unsupported("batch norm without running statistics (training mode)")
    if ctx.args.get("training"):
        raise UnsupportedOpError("batch norm in training mode is not supported", location=ctx.location,
                                 hint="export the model in eval mode (model.eval())")
    scale = _ones_or(ctx, "weight", c, 1.0, x.dtype)
    bias = _ones_or(ctx, "bias", c, 0.0, x.dtype)
    y = ctx.b.batch_norm(x, scale, bias, ctx.tensor("running_mean"), ctx.tensor("running_var"),
                         epsilon=float(ctx["eps"]))
    return y, None, None


aten_op("_native_batch_norm_legit_no_training.default", "native_batch_norm.default",
        emits=("batch_norm", "const"))(_batch_norm)


@aten_op("native_layer_norm.default", emits=("layer_norm", "const"))
def _layer_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    x = ctx.tensor("input")
    k = len(ctx["normalized_shape"])
    norm_shape = tuple(x.shape[-k:])
    scale = ctx.tensor("weight") if ctx.args.get("weight") is not None else None
    bias = ctx.tensor("bias") if ctx.args.get("bias") is not None else None
    if scale is None or bias is None:
        if not all(isinstance(d, int) for d in norm_shape):
            raise ctx.unsupported("layer norm without affine parameters over symbolic dims")
        if scale is None:
            scale = ctx.b.const(np.ones(norm_shape, dtype=x.dtype.np))
        if bias is None:
            bias = ctx.b.const(np.zeros(norm_shape, dtype=x.dtype.np))
    y = ctx.b.layer_norm(x, scale, bias, axis=-k, epsilon=float(ctx["eps"]))
    return y, None, None


@aten_op("native_group_norm.default", emits=("reshape", "layer_norm", "mul", "add", "const"))
def _group_norm(ctx: AtenCtx) -> tuple[Value, None, None]:
    """Group norm as a layer norm over each group's elements, then the per-channel affine map."""
    x = ctx.tensor("input")
    b = ctx.b
    groups = int(ctx["group"])
    n, c = x.shape[0], x.shape[1]
    if not isinstance(c, int):
        raise ctx.unsupported("group norm over a symbolic channel count")
    rest: Dim = 1
    for d in x.shape[2:]:
        rest = rest * d
    grouped = b.reshape(x, shape=(n, groups, (c // groups) * rest))
    one, zero = b.scalar(1, x.dtype), b.scalar(0, x.dtype)
    y = b.reshape(b.layer_norm(grouped, one, zero, axis=-1, epsilon=float(ctx["eps"])), shape=tuple(x.shape))
    per_channel = (c,) + (1,) * (x.type.rank - 2)
    if ctx.args.get("weight") is not None:
        y = b.mul(y, _reshape(ctx, ctx.tensor("weight"), per_channel))
    if ctx.args.get("bias") is not None:
        y = b.add(y, _reshape(ctx, ctx.tensor("bias"), per_channel))
    return y, None, None


@aten_op("_softmax.default", "softmax.int", emits=("softmax", "cast"))
def _softmax(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.softmax(x, axis=_axis(ctx, ctx["dim"], x.type.rank))


@aten_op("_log_softmax.default", "log_softmax.int", emits=("log_softmax", "cast"))
def _log_softmax(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self", ctx.out_dtype())
    return ctx.b.log_softmax(x, axis=_axis(ctx, ctx["dim"], x.type.rank))


def _max_pool(ctx: AtenCtx) -> Value | tuple[Value, None]:
    x = ctx.tensor("self")
    n = len(ctx["kernel_size"]) if len(ctx["kernel_size"]) > 1 else x.type.rank - 2
    kernel = _spatial(ctx["kernel_size"], n)
    strides = _spatial(ctx.get("stride") or kernel, n)
    padding = _spatial(ctx.get("padding", [0]), n)
    dilations = _spatial(ctx.get("dilation", [1]), n)
    y = ctx.b.max_pool(x, kernel=kernel, strides=strides, pads=padding + padding, dilations=dilations,
                       ceil_mode=bool(ctx.get("ceil_mode", False)))
    return (y, None) if "with_indices" in ctx.op_name else y


aten_op("max_pool2d_with_indices.default", "max_pool3d_with_indices.default", "max_pool2d.default",
        emits=("max_pool",))(_max_pool)


@aten_op("avg_pool2d.default", "avg_pool3d.default", "avg_pool1d.default", emits=("avg_pool",))
def _avg_pool(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    n = x.type.rank - 2
    if ctx.args.get("divisor_override") is not None:
        raise ctx.unsupported("divisor_override")
    kernel = _spatial(ctx["kernel_size"], n)
    strides = _spatial(ctx.get("stride") or kernel, n)
    padding = _spatial(ctx.get("padding", [0]), n)
    return ctx.b.avg_pool(x, kernel=kernel, strides=strides, pads=padding + padding,
                          ceil_mode=bool(ctx.get("ceil_mode", False)),
                          count_include_pad=bool(ctx.get("count_include_pad", True)))


@aten_op("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default",
         "adaptive_avg_pool1d.default", emits=("reduce_mean", "avg_pool"))
def _adaptive_avg_pool(ctx: AtenCtx) -> Value:
    x = ctx.tensor("self")
    n = x.type.rank - 2
    out = _spatial(ctx["output_size"], n)
    spatial = tuple(x.shape[2:])
    if all(o == 1 for o in out):
        return ctx.b.reduce_mean(x, axes=tuple(range(2, 2 + n)), keepdims=True)
    if not all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, out, strict=True)):
        raise ctx.unsupported(f"output size {list(out)} does not divide input size {list(spatial)}")
    kernel = tuple(int(s) // o for s, o in zip(spatial, out, strict=True))
    return ctx.b.avg_pool(x, kernel=kernel, strides=kernel, pads=(0,) * (2 * n), ceil_mode=False,
                          count_include_pad=True)


@aten_op("scaled_dot_product_attention.default", "_scaled_dot_product_flash_attention_for_cpu.default",
         emits=("matmul", "mul", "softmax", "add", "where", "trilu", "fill", "cast"))
def _sdpa(ctx: AtenCtx) -> Value | tuple[Value, None]:
    """Attention as its definition: softmax(q k^T * scale + mask) v."""
    b = ctx.b
    q, k, v = ctx.tensor("query"), ctx.tensor("key"), ctx.tensor("value")
    if ctx.get("dropout_p", 0.0):
        raise ctx.unsupported("dropout in attention")
    if ctx.get("enable_gqa", False):
        raise ctx.unsupported("grouped-query attention")
    scale = ctx.get("scale")
    d = q.shape[-1]
    if scale is None:
        if not isinstance(d, int):
            raise ctx.unsupported("default scale over a symbolic head size")
        scale = 1.0 / math.sqrt(d)
    scores = b.mul(b.matmul(q, k, transpose_b=True), b.scalar(float(scale), q.dtype))
    mask = ctx.args.get("attn_mask")
    if mask is not None:
        m = ctx.tensor("attn_mask")
        if m.dtype is DType.bool:
            scores = b.where(m, scores, b.scalar(-math.inf, q.dtype))
        else:
            scores = b.add(scores, ctx.cast(m, q.dtype))
    if ctx.get("is_causal", False):
        lq, lk = q.shape[-2], k.shape[-2]
        ones = b.fill(shape=(lq, lk), value=1, dtype=DType.bool)
        causal = b.trilu(ones, upper=False, k=0)
        scores = b.where(causal, scores, b.scalar(-math.inf, q.dtype))
    out = b.matmul(b.softmax(scores, axis=-1), v)
    return (out, None) if "flash" in ctx.op_name else out
