"""ONNX -> CIR.

The driver loads and checks the model (opset, external data kept inside the
model directory), runs ONNX shape inference, turns initializers and Constant
nodes into constants, and hands each node to the converter registered for its
op type (``cuvil/frontend/onnx_ops``). Converters build CIR through a Builder, so
every value is checked against its op definition as it is made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from cuvil.errors import (
    BudgetError,
    CuvilError,
    ExternalDataError,
    InputError,
    IRError,
    MissingInitializerError,
    ModelLoadError,
    UnsupportedOpError,
    UnsupportedOpsetError,
)
from cuvil.frontend import onnx_ops  # noqa: F401  (registers the converter families)
from cuvil.frontend.onnx_node import (
    Entity,
    NodeCtx,
    OptValue,
    SeqValue,
    StaticInputRequired,
    converters,
    onnx_dtype,
)
from cuvil.frontend.onnx_ops.fold import fold_symbolic
from cuvil.frontend.onnx_structure import InputForm, bind_input, encode_forms, flatten_outputs, input_kind
from cuvil.frontend.registry import ConverterEntry
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.evaluate import evaluate_op
from cuvil.ir.module import Module
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import Dim, Sym, declared_ranges, evaluate_dim
from cuvil.ir.types import MAX_TENSOR_ELEMENTS, DimConstraint, TensorType
from cuvil.ir.values import Value, walk

MIN_OPSET = 7
MAX_UNROLL_TOTAL = 65536  # unrolled Loop/Scan/recurrence iterations in one model, nested ones multiplied
LAYOUT_DOMAIN_HINT = ("ONNX Runtime writes its com.microsoft.nchwc layout ops into a model it saves at its "
                      "ORT_ENABLE_ALL level, for its own kernels; compile the model as exported, or as saved at "
                      "ORT_ENABLE_EXTENDED or below")

# --------------------------------------------------------------------------------------
# the importer


@dataclass
class OnnxImporter:
    model: onnx.ModelProto
    base_dir: Path | None = None
    static_inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    """Symbolic input dims imported at these sizes (by symbol name): a model whose import needs a
    dim's value (a branch chosen by a shape) is imported once per shape with them."""
    input_forms: Mapping[str, InputForm] = field(default_factory=dict)
    """The run-time form of each sequence or optional graph input (see :mod:`.onnx_structure`)."""
    b: Builder = field(default_factory=Builder)
    env: dict[str, Entity] = field(default_factory=dict)
    _static: dict[Value, np.ndarray] = field(default_factory=dict)
    _dim_names: set[str] = field(default_factory=set)
    _dim_limits: dict[str, int] = field(default_factory=dict)
    dim_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    _unrolled: int = 0
    opsets: dict[str, int] = field(default_factory=dict)

    def opset_for(self, domain: str) -> int:
        return self.opsets.get("" if domain == "ai.onnx" else domain, 1)

    def _constraint(self, symbol: str) -> DimConstraint:
        """A symbol's constraint: its declared range (if any) met with the limits the import relied on."""
        lo, hi = self.dim_ranges.get(symbol, (1, None))
        limit = self._dim_limits.get(symbol)
        if limit is not None:
            hi = limit if hi is None else min(hi, limit)
        return DimConstraint(symbol, lo=lo, hi=hi)

    def limit_dim(self, symbol: str, hi: int) -> None:
        """Constrain a symbol to at most ``hi`` (the function's dim constraints say so, and a run with a
        larger dim is refused), where the import relied on it."""
        self._dim_limits[symbol] = min(hi, self._dim_limits.get(symbol, hi))

    def charge_unroll(self, steps: int, location: str) -> None:
        """Count ``steps`` more unrolled iterations (Loop, Scan, recurrences; nested ones multiply)
        against the whole model's budget, so nesting cannot turn import into a hang."""
        self._unrolled += steps
        self.expect_unroll(0, location)

    def expect_unroll(self, steps: int, location: str) -> None:
        """Refuse now, before any of them is imported, ``steps`` iterations that the model is sure to unroll
        where they would take the budget past its end (nested constant loops: one iteration at a time,
        a refusal took 65,536 imported iterations, 15 s)."""
        if self._unrolled + steps > MAX_UNROLL_TOTAL:
            raise BudgetError(f"the model unrolls more than {MAX_UNROLL_TOTAL} loop iterations in all "
                              "(nested loops multiply)", location=location,
                              hint="Cuvil unrolls control flow at import; export the model with fewer "
                                   "or shorter loops, or with the loop folded into tensor ops")

    # tensors --------------------------------------------------------------------
    def tensor_to_numpy(self, t: onnx.TensorProto, where: str) -> np.ndarray:
        onnx_dtype(t.data_type, where)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            self._load_external(t, where)
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:  # malformed raw_data sizes and the like
            raise ModelLoadError(f"tensor {t.name!r} is malformed: {e}", location=where) from None
        if arr.dtype == np.dtype("O"):
            raise UnsupportedOpError(f"tensor {t.name!r} has an unsupported element type", location=where)
        return arr

    def _load_external(self, t: onnx.TensorProto, where: str) -> None:
        info = {e.key: e.value for e in t.external_data}
        rel = info.get("location", "")
        if self.base_dir is None:
            raise ExternalDataError(f"tensor {t.name!r} refers to external data {rel!r}, but the model "
                                    "was not loaded from a file", location=where)
        base = self.base_dir.resolve()
        target = (base / rel).resolve()
        if os.path.isabs(rel) or not target.is_relative_to(base):
            raise ExternalDataError(f"external data path {rel!r} of tensor {t.name!r} escapes the model "
                                    f"directory {base}", location=where)
        if not target.is_file():
            raise ExternalDataError(f"external data file {rel!r} of tensor {t.name!r} does not exist",
                                    location=where)
        from onnx.external_data_helper import load_external_data_for_tensor

        try:
            load_external_data_for_tensor(t, str(base))
        except Exception as e:
            raise ExternalDataError(f"cannot read external data of {t.name!r}: {e}", location=where) from None

    # dims -----------------------------------------------------------------------
    def _dim(self, d: onnx.TensorShapeProto.Dimension, owner: str, axis: int) -> Dim:
        """A declared dim. ``dim_value: -1`` (what some exporters write for "dynamic", and what ONNX
        Runtime accepts any size for), a dim with neither value nor name, and every dim of a shape
        that is absent become a fresh symbol ``<input>_dim<axis>``; so does a ``dim_param`` with no
        letter or digit (Paddle2ONNX writes ``"?"`` for every unknown dim: read as one name it would
        force them all equal, which ONNX Runtime does not). ``dim_value: 0`` stays a literal
        zero-size dim, as the ONNX IR defines it and ONNX Runtime enforces it."""
        if d.HasField("dim_value") and d.dim_value != -1:
            return int(d.dim_value)
        if d.HasField("dim_param") and _named(d.dim_param):
            return Sym.symbol(symbol_name(d.dim_param))
        return self._fresh_dim(owner, axis)

    def _fresh_dim(self, owner: str, axis: int) -> Sym:
        """A new symbol named after the input and axis, unlike every declared or earlier one."""
        base = name = f"{symbol_name(owner)}_dim{axis}"
        k = 1
        while name in self._dim_names:
            name, k = f"{base}_{k}", k + 1
        self._dim_names.add(name)
        return Sym.symbol(name)

    def value_type(self, vi: onnx.ValueInfoProto, graph: onnx.GraphProto | None = None) -> TensorType:
        where = f"input {vi.name!r}"
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"input {vi.name!r} is not a tensor (sequences/maps are unsupported)",
                                     location=where)
        tt = vi.type.tensor_type
        dtype = onnx_dtype(tt.elem_type, where)
        if tt.HasField("shape"):
            shape = tuple(self._dim(d, vi.name, k) for k, d in enumerate(tt.shape.dim))
        else:
            rank = inferred_rank(graph, vi.name) if graph is not None else None
            if rank is None:
                raise UnsupportedOpError(f"input {vi.name!r} has no shape (unknown rank), and no use of it fixes "
                                         "its rank", location=where,
                                         hint="give graph inputs a shape; dims may be symbolic or -1")
            shape = tuple(self._fresh_dim(vi.name, k) for k in range(rank))
        t = TensorType(dtype, shape)
        if any(isinstance(d, int) and d < 0 for d in t.shape) or \
                (t.is_static and int(np.prod([int(d) for d in t.shape], dtype=object)) > MAX_TENSOR_ELEMENTS):
            raise ModelLoadError(f"input {vi.name!r} declares the shape {list(t.shape)}, which no tensor can "
                                 "have (negative, or more than 2**40 elements)", location=where,
                                 hint="use a symbolic dim (dim_param) for sizes only known at run time")
        return t

    # static evaluation ---------------------------------------------------------------
    def static_value(self, v: Value, where: str) -> np.ndarray:
        found = self._static.get(v)
        if found is not None:
            return found
        if v.is_const:
            return self.b.constants[v.const_hash]
        if v.is_param:
            raise StaticInputRequired(v.name, where)
        if v.op == "shape":
            x = v.operands[0].type.shape
            arr = np.array(list(x), dtype=np.int64) if all(isinstance(d, int) for d in x) \
                else np.array(list(x), dtype=object)
            self._static[v] = arr
            return arr
        ins = [self.static_value(o, where) for o in v.operands]
        if any(a.dtype == object for a in ins):
            out = fold_symbolic(v.op, ins, [o.dtype for o in v.operands], v.type, v.attr_dict, where)
        else:
            if not v.type.is_static:
                raise UnsupportedOpError(f"value of {v.op} with symbolic shape {v.type} is not static",
                                         location=where)
            out = evaluate_op(get_op(v.op), ins, v.attr_dict, v.type)
        self._static[v] = out
        return out

    # graph ------------------------------------------------------------------------
    def name_input_dims(self, graph: onnx.GraphProto) -> None:
        """Reserve the symbol names the graph's inputs declare (fresh dims get other names)."""
        self._dim_names |= {symbol_name(d.dim_param) for vi in graph.input
                            for d in vi.type.tensor_type.shape.dim if _named(d.dim_param)}

    def import_graph(self, graph: onnx.GraphProto) -> Module:
        initializer_names = {t.name for t in graph.initializer}
        for t in graph.initializer:
            self.env[t.name] = self.b.const(self.tensor_to_numpy(t, f"initializer {t.name!r}"))
        params: list[Value] = []
        self.name_input_dims(graph)
        for vi in graph.input:
            if vi.name in initializer_names:
                continue
            if vi.name in self.static_inputs:
                self.env[vi.name] = self.b.const(np.asarray(self.static_inputs[vi.name]))
                continue
            if input_kind(vi.type) != "tensor":
                entity = bind_input(vi, self.input_forms.get(vi.name),
                                    lambda tp, name, shape: self._element_param(tp, name, shape, params))
                if entity is not None:
                    self.env[vi.name] = entity
                continue
            dtype, shape = _unpack(self.value_type(vi, graph))
            p = self.b.param(vi.name, dtype, [_pinned(d, self.dims) for d in shape])
            params.append(p)
            self.env[vi.name] = p
        self.convert_nodes(graph.node)
        produced: list[Entity] = []
        for out in graph.output:
            if out.name not in self.env:
                raise MissingInitializerError(f"graph output {out.name!r} is never produced",
                                              location=f"output {out.name!r}")
            produced.append(self.env[out.name])
        results, names, forms = flatten_outputs([o.name for o in graph.output], produced)
        symbols = sorted({s for p in params for s in p.type.symbols()})
        unknown = sorted(set(self.dim_ranges) - set(symbols))
        if unknown:
            raise InputError(f"dim_ranges names {unknown}, which are not symbolic dims of the graph's inputs",
                             location="dim_ranges", hint="its symbolic dims: " + (", ".join(symbols) or "none"))
        fn = self.b.function("main", params, results, names, [self._constraint(s) for s in symbols])
        meta = {"source": "onnx", "producer": self.model.producer_name or "",
                "opset": str(self.opset_for("")), "graph": graph.name or "", **encode_forms(forms)}
        return self.b.module(fn, metadata=meta)

    def _element_param(self, tp: onnx.TypeProto, name: str, shape: tuple[int, ...] | None,
                       params: list[Value]) -> Value:
        """One parameter of a sequence or optional input: an element of the fed ``shape``, or (an
        optional's tensor) of its declared type."""
        if shape is None:
            t = self.value_type(onnx.helper.make_value_info(name, tp))
        else:
            dtype = onnx_dtype(tp.tensor_type.elem_type, f"input {name!r}")
            declared = tp.tensor_type.shape.dim if tp.tensor_type.HasField("shape") else None
            if declared is not None and (len(declared) != len(shape) or any(
                    d.HasField("dim_value") and d.dim_value not in (-1, n) for d, n in zip(declared, shape,
                                                                                     strict=False))):
                raise InputError(f"sequence element {name!r} has shape {list(shape)}, which its declared type "
                                 "does not allow", location=f"input {name!r}")
            t = TensorType(dtype, shape)
        p = self.b.param(name, t.dtype, [_pinned(d, self.dims) for d in t.shape])
        params.append(p)
        return p

    def import_subgraph(self, graph: onnx.GraphProto, inputs: Sequence[Entity] = ()) -> list[Entity]:
        """Convert a control-flow body (If branch, Loop/Scan body) inline: it sees every name of the
        enclosing scopes, its formal inputs are bound to ``inputs``, and the names it defines stay local."""
        if len(inputs) != len(graph.input):
            raise IRError(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, got {len(inputs)}")
        outer = self.env
        self.env = dict(outer)
        try:
            for t in graph.initializer:
                self.env[t.name] = self.b.const(self.tensor_to_numpy(t, f"initializer {t.name!r}"))
            for vi, v in zip(graph.input, inputs, strict=True):
                self.env[vi.name] = v
            self.convert_nodes(graph.node)
            missing = [o.name for o in graph.output if o.name not in self.env]
            if missing:
                raise MissingInitializerError(f"subgraph outputs {missing} are never produced",
                                              location=f"subgraph {graph.name!r}")
            return [self.env[o.name] for o in graph.output]
        finally:
            self.env = outer

    def scope_values(self) -> set[Value]:
        """Every value the names in scope denote or are computed from (what a branch reads from outside)."""
        roots: list[Value] = []
        for e in self.env.values():
            content = e.content if isinstance(e, OptValue) else e
            roots += content.elems if isinstance(content, SeqValue) else [content] if content is not None else []
        return set(walk(roots))

    def convert_nodes(self, nodes: Sequence[onnx.NodeProto]) -> None:
        table = converters()
        outer = getattr(self, "_producers", {})
        self._producers = {**outer, **{o: f"node {n.name or '<unnamed>'} ({n.op_type})"
                                       for n in nodes for o in n.output if o}}
        try:
            for node in nodes:
                self.convert_node(node, table)
        finally:
            self._producers = outer

    def convert_node(self, node: onnx.NodeProto, table: Mapping[tuple[str, str], ConverterEntry]) -> None:
        where = f"node {node.name or '<unnamed>'} ({node.op_type})"
        domain = "" if node.domain == "ai.onnx" else node.domain
        entry = table.get((domain, node.op_type))
        if entry is None:
            dom = f"{domain}::" if domain else ""
            hint = LAYOUT_DOMAIN_HINT if domain == "com.microsoft.nchwc" else None
            raise UnsupportedOpError(f"ONNX op {dom}{node.op_type} is not supported", location=where, hint=hint)
        inputs: list[Entity | None] = []
        for name in node.input:
            if not name:
                inputs.append(None)
                continue
            if name not in self.env and name in getattr(self, "_producers", {}):
                raise ModelLoadError(f"input {name!r} is produced by {self._producers[name]}, which does not "
                                     "come before this node: the graph has a cycle or is not topologically "
                                     "sorted", location=where, hint="ONNX requires nodes in topological order")
            if name not in self.env:
                raise MissingInitializerError(f"input {name!r} is not defined by any node, graph input "
                                              "or initializer", location=where)
            inputs.append(self.env[name])
        produced = entry.run(NodeCtx(self, node, inputs))
        outs = [produced] if isinstance(produced, (Value, SeqValue, OptValue)) else list(produced)
        for name, v in zip(node.output, outs, strict=False):
            if name and v is not None:
                self.env[name] = v
        missing = [n for n, v in zip(node.output, outs + [None] * len(node.output), strict=False)
                   if n and (v is None)]
        if missing:
            raise UnsupportedOpError(f"{node.op_type}: outputs {missing} are not supported", location=where)


def _named(dim_param: str) -> bool:
    """Whether a dim_param is a name (ties its dims together) rather than a mark such as ``"?"``."""
    return re.search(r"[A-Za-z0-9]", dim_param) is not None


def symbol_name(text: str) -> str:
    """A dim name or input name as a symbol: other characters become ``_``, a leading digit gets ``d_``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if re.match(r"[A-Za-z_]", name) else "d_" + name


_FIXED_RANK = {"Gemm": 2, "LSTM": 3, "GRU": 3, "RNN": 3}  # the rank these ops take as their first input
_WEIGHT_RANK = ("Conv", "ConvTranspose", "ConvInteger")  # first input as many dims as the weight
_KERNEL_RANK = ("MaxPool", "AveragePool", "LpPool")  # first input: batch, channels, one dim per kernel axis


def inferred_rank(graph: onnx.GraphProto, name: str) -> int | None:
    """The rank of a value declared without a shape: from a shape the graph declares for it
    elsewhere (value_info, outputs), else from a use that fixes it (a Conv's weight, a pool's
    kernel, Gemm, a recurrence)."""
    for vi in (*graph.value_info, *graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    weights = {t.name: len(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.input[:1] != [name]:
            continue
        if node.op_type in _FIXED_RANK:
            return _FIXED_RANK[node.op_type]
        if node.op_type in _WEIGHT_RANK and len(node.input) > 1 and node.input[1] in weights:
            return weights[node.input[1]]
        kernel = [a for a in node.attribute if a.name == "kernel_shape"]
        if node.op_type in _KERNEL_RANK and kernel:
            return len(kernel[0].ints) + 2
    return None


def _pinned(d: Dim, dims: Mapping[str, int]) -> Dim:
    """``d`` evaluated where ``dims`` gives every symbol it reads."""
    if isinstance(d, Sym) and d.symbols() <= set(dims):
        return evaluate_dim(d, dims)
    return d


def _unpack(t: TensorType) -> tuple[DType, tuple[Dim, ...]]:
    return t.dtype, t.shape


def load_onnx(source: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """Parse a model without touching external data yet (that is checked per tensor)."""
    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, bytes):
        data, base = source, None
        where = "<bytes>"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise ModelLoadError(f"model file {path} does not exist", location=where)
        data, base = path.read_bytes(), path.parent
    if not data:
        raise ModelLoadError("model file is empty", location=where)
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:
        raise ModelLoadError(f"not a valid ONNX protobuf: {type(e).__name__}: {e}", location=where) from None
    if not model.HasField("graph"):
        raise ModelLoadError("ONNX model has no graph", location=where)
    return model, base


def _names(graph: onnx.GraphProto) -> Iterator[tuple[str, object]]:
    """(where, text) of every name-like string field of a graph and its subgraphs."""
    for v in (*graph.input, *graph.output, *graph.value_info):
        yield "graph value", v.name
        for d in v.type.tensor_type.shape.dim:
            yield f"dim of {v.name!r}", d.dim_param
    for t in graph.initializer:
        yield "initializer", t.name
    for n in graph.node:
        for text in (n.name, n.op_type, n.domain, *n.input, *n.output):
            yield f"node {n.name or n.op_type!r}", text
        for a in n.attribute:
            yield f"attribute of {n.name or n.op_type!r}", a.name
            if a.HasField("g"):
                yield from _names(a.g)
            for g in a.graphs:
                yield from _names(g)


def check_structure(model: onnx.ModelProto) -> None:
    """What the ONNX specification requires and the conversion relies on: text fields that are
    text, each value produced once (SSA), graph inputs that are not also initializers from IR
    version 4 on (there, an initializer of an input's name is a default the caller may override,
    which a compiled function cannot offer)."""
    for where, text in _names(model.graph):
        if not isinstance(text, str):
            raise ModelLoadError(f"a name in the model is not valid UTF-8 text ({where})", location=where,
                                 hint="the file is corrupt or was not written by an ONNX exporter")
    seen: set[str] = {v.name for v in model.graph.input}
    for n in model.graph.node:
        for out in n.output:
            if out and out in seen:
                raise ModelLoadError(f"value {out!r} is produced twice (by node {n.name or n.op_type!r} and an "
                                     f"earlier node or graph input)", location=n.name or n.op_type,
                                     hint="ONNX graphs are in SSA form; the ONNX checker rejects this model too")
            seen.add(out)
    if model.ir_version >= 4:
        defaults = sorted({t.name for t in model.graph.initializer} & {v.name for v in model.graph.input})
        if defaults:
            raise ModelLoadError(f"graph input(s) {', '.join(map(repr, defaults))} also have an initializer: a "
                                 "default the caller may override, which a compiled function cannot offer",
                                 location="graph.input",
                                 hint="to compile them as constants, remove them from the graph's inputs "
                                      "(to keep them inputs, remove the initializers)")


def _check_old_opset(graph: onnx.GraphProto, opset: int) -> None:
    """A model of an opset before :data:`MIN_OPSET` is imported as one of MIN_OPSET when every ai.onnx
    op it uses has, at its opset, the very definition (same ``since_version``) in force at MIN_OPSET;
    an op whose definition changed in between (Add's ``broadcast`` attribute, BatchNormalization's
    ``consumed_inputs``...) is refused, naming it."""
    changed: set[str] = set()
    for node in _nodes(graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            then = onnx.defs.get_schema(node.op_type, opset, "").since_version
            now = onnx.defs.get_schema(node.op_type, MIN_OPSET, "").since_version
        except Exception:
            changed.add(node.op_type)
            continue
        if then != now:
            changed.add(node.op_type)
    if changed:
        raise UnsupportedOpsetError(f"ONNX opset {opset} is not supported for {', '.join(sorted(changed))}: their "
                                    f"definitions changed before opset {MIN_OPSET}", location="opset_import",
                                    hint="convert the model to a newer opset (onnx.version_converter)")


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph and of its subgraphs."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.HasField("g"):
                yield from _nodes(a.g)
            for g in a.graphs:
                yield from _nodes(g)


def import_onnx(source: str | os.PathLike | bytes | onnx.ModelProto, *,
                static_inputs: Mapping[str, np.ndarray] | None = None, dims: Mapping[str, int] | None = None,
                input_forms: Mapping[str, InputForm] | None = None,
                dim_ranges: Mapping[str, tuple[int, int]] | None = None) -> Module:
    """Import an ONNX model (path, bytes or ModelProto) into a CIR module.

    ``static_inputs`` binds graph inputs to compile-time values (for models that feed shapes
    or other attribute-like operands through inputs); ``dims`` imports symbolic input dims at the
    given sizes, by symbol name (what a model needs whose import decides on a dim's value);
    ``dim_ranges`` declares ``(lo, hi)`` for symbolic dims instead: the import decides what those
    ranges decide (a branch on a dim that is 1 for every length in them), and the function's
    constraints hold the ranges; ``input_forms`` gives the form of each sequence or optional input
    (:mod:`.onnx_structure`)."""
    model, base = load_onnx(source)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    newest = onnx.defs.onnx_opset_version()
    main = opsets.get("")
    if main is None:  # only other domains (ai.onnx.ml, training) are imported: no ai.onnx op to version
        main = newest
        opsets[""] = main
    if main > newest:
        raise UnsupportedOpsetError(f"ONNX opset {main} is not supported (supported: {MIN_OPSET}..{newest})",
                                    location="opset_import")
    if main < MIN_OPSET:
        _check_old_opset(model.graph, main)
        opsets[""] = MIN_OPSET  # every op it uses means at opset MIN_OPSET what it means at ``main``
    check_structure(model)
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:
        pass
    ranges = _check_ranges(dim_ranges)
    imp = OnnxImporter(model, base, dict(static_inputs or {}), dict(dims or {}), dict(input_forms or {}),
                       opsets=opsets, dim_ranges=ranges)
    with declared_ranges(ranges):
        return imp.import_graph(model.graph)


def _check_ranges(ranges: Mapping[str, tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for name, r in (ranges or {}).items():
        try:
            lo, hi = (int(x) for x in r)
        except (TypeError, ValueError):
            raise InputError(f"dim range {name}={r!r} is not (lo, hi)", location="dim_ranges",
                             hint="give whole numbers, e.g. dim_ranges={'seq': (16, 512)}") from None
        if not 0 <= lo <= hi:
            raise InputError(f"dim range {name}={r!r} is empty or negative", location="dim_ranges",
                             hint="give 0 <= lo <= hi")
        out[str(name)] = (lo, hi)
    return out


def declared_types(source: str | os.PathLike | bytes | onnx.ModelProto, *,
                   static_inputs: Mapping[str, np.ndarray] | None = None
                   ) -> tuple[list[tuple[str, TensorType]], list[tuple[str, TensorType]]]:
    """The graph's inputs (those not bound by ``static_inputs``) and outputs as declared, symbolic
    dims named as an import names them, without converting a node: the signature of a model that is
    imported once per shape. An output declared without a shape gets one fresh dim per inferred axis."""
    model, base = load_onnx(source)
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:
        pass
    imp = OnnxImporter(model, base, dict(static_inputs or {}))
    graph = model.graph
    imp.name_input_dims(graph)
    bound = {t.name for t in graph.initializer} | set(imp.static_inputs)
    inputs = [(vi.name, imp.value_type(vi, graph)) for vi in graph.input if vi.name not in bound]
    outputs = []
    for vi in graph.output:
        try:
            outputs.append((vi.name, imp.value_type(vi, graph)))
        except CuvilError:
            outputs.append((vi.name, TensorType(onnx_dtype(vi.type.tensor_type.elem_type, vi.name),
                                                (imp._fresh_dim(vi.name, 0),))))
    return inputs, outputs
