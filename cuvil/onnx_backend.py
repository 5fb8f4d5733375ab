"""``onnx.backend.base.Backend`` over Cuvil, so ONNX's conformance suite runs against it.

Two modes: ``"interpreter"`` (alias ``"reference"``, the default) evaluates the imported
module with the reference interpreter; ``"compiled"`` compiles it with :func:`cuvil.compile`
(the LLVM backend) and runs the native library, so results come from generated code.
``prepare(model, mode="compiled", opt_level=..., passes=..., cache=...)`` passes the
compile options through.

Models that feed attribute-like operands (Reshape shapes, Slice bounds, an If
condition, ...) through graph inputs are specialized on those inputs' values at
run time, since CIR needs them at compile time; each specialization is imported
once and cached by the bound values. Sequence and optional inputs are fed as lists of
arrays and ``None``; the model is imported for each form they come in (a sequence's
length and element shapes, whether an optional is present), and sequence or optional
outputs come back as lists and ``None`` (see :mod:`cuvil.frontend.onnx_structure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from cuvil.errors import InputError, ModelLoadError
from cuvil.frontend.onnx_import import StaticInputRequired, import_onnx, load_onnx
from cuvil.frontend.onnx_structure import InputForm, input_kind, regroup
from cuvil.interp import run_reference, to_numpy
from cuvil.ir.module import Module

MODES = ("interpreter", "compiled")
_MODE_ALIASES = {"interpreter": "interpreter", "reference": "interpreter", "interp": "interpreter",
                 "compiled": "compiled", "compile": "compiled", "llvm": "compiled"}
# what cuvil.compile accepts besides the model (the backend passes these through in compiled mode)
COMPILE_OPTIONS = ("opt_level", "passes", "cache", "threads", "gate", "name", "keep_ir", "target")

# a model whose every import asks for one more bound input cannot need more than it has inputs;
# this only guards against a converter that keeps asking for the same one
_MAX_SPECIALIZATIONS = 64


def _array(x: Any) -> np.ndarray:
    """numpy arrays, torch tensors, python data, or ONNX TensorProtos (as the node test data holds)."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    return to_numpy(x)


def _key(bound: Mapping[str, np.ndarray]) -> bytes:
    parts = []
    for name in sorted(bound):
        a = np.ascontiguousarray(bound[name])
        parts.append(f"{name}:{a.dtype.str}:{a.shape}:".encode() + a.tobytes())
    return b"\0".join(parts)


def resolve_mode(mode: str) -> str:
    """The canonical name of an execution mode (``"interpreter"`` or ``"compiled"``)."""
    found = _MODE_ALIASES.get(str(mode).lower())
    if found is None:
        raise InputError(f"unknown backend mode {mode!r}", location="mode",
                         hint="modes: compiled, interpreter (or its alias reference)")
    return found


class CuvilRep(BackendRep):
    """A prepared model: imported once, or once per set of values of its attribute-like inputs;
    in compiled mode each imported module is compiled once (cuvil.compile caches the library)."""

    def __init__(self, model: onnx.ModelProto, mode: str = "interpreter",
                 compile_options: Mapping[str, Any] | None = None) -> None:
        self.mode = resolve_mode(mode)
        unknown = sorted(set(compile_options or {}) - set(COMPILE_OPTIONS))
        if unknown:
            raise InputError(f"unknown compile options {unknown}", location="prepare",
                             hint="compile options: " + ", ".join(COMPILE_OPTIONS))
        self.compile_options = dict(compile_options or {})
        self._compiled: dict[int, tuple[Module, Any]] = {}
        self.model = model
        initializers = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self._kinds = {i.name: input_kind(i.type) for i in model.graph.input if i.name not in initializers}
        self.output_names = [o.name for o in model.graph.output]
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        self.static_names: set[str] = set()
        self._module: Module | None = None
        self._cache: dict[bytes, Module] = {}
        if any(k != "tensor" for k in self._kinds.values()):
            return  # imported per form of the sequence and optional inputs
        try:
            self._module = import_onnx(model)
        except StaticInputRequired as e:
            self._require_static(e)

    @property
    def module(self) -> Module | None:
        """The imported module, or None while it depends on input values."""
        return self._module

    def _require_static(self, e: StaticInputRequired) -> None:
        if e.param_name in self.static_names or e.param_name not in self.input_names:
            raise e
        self.static_names.add(e.param_name)

    def _module_for(self, feeds: Mapping[str, Any]) -> Module:
        if self._module is not None:
            return self._module
        forms = {n: InputForm.of(feeds.get(n), kind) for n, kind in self._kinds.items() if kind != "tensor"}
        for _ in range(_MAX_SPECIALIZATIONS):
            missing = sorted(self.static_names - set(feeds))
            if missing:
                raise InputError(f"inputs {missing} are needed to specialize the model but were not given",
                                 hint="inputs: " + ", ".join(self.input_names))
            bound = {n: feeds[n] for n in self.static_names}
            key = _key(bound) + repr(sorted(forms.items())).encode()
            found = self._cache.get(key)
            if found is not None:
                return found
            try:
                module = import_onnx(self.model, static_inputs=bound, input_forms=forms)
            except StaticInputRequired as e:
                self._require_static(e)
                continue
            self._cache[key] = module
            return module
        raise InputError("the model needs too many inputs bound at compile time")

    def feeds(self, inputs: Any) -> dict[str, Any]:
        """Name the inputs: a dict by name, a list/tuple in graph-input order, or one array (a
        sequence input takes a list of arrays, an optional one ``None`` when empty)."""
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            if unknown:
                raise InputError(f"unknown inputs {unknown}", hint="inputs: " + ", ".join(self.input_names))
            return {str(k): self._fed(str(k), v) for k, v in inputs.items()}
        single = isinstance(inputs, (np.ndarray, onnx.TensorProto)) or not isinstance(inputs, Sequence)
        arrays = [inputs] if single else list(cast(Sequence[Any], inputs))
        if len(arrays) > len(self.input_names):
            raise InputError(f"the model takes {len(self.input_names)} inputs, got {len(arrays)}",
                             hint="inputs: " + ", ".join(self.input_names))
        return {n: self._fed(n, a) for n, a in zip(self.input_names, arrays, strict=False)}

    def _fed(self, name: str, value: Any) -> Any:
        """An input as arrays: a list of them for a sequence, None for an empty optional."""
        if self._kinds.get(name, "tensor") == "tensor":
            return _array(value)
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [_array(v) for v in value]
        return _array(value)

    def _bind(self, inputs: Any) -> tuple[Module, dict[str, np.ndarray]]:
        feeds = self.feeds(inputs)
        module = self._module_for(feeds)
        flat: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            if isinstance(value, list):
                flat.update({f"{name}.{k}": v for k, v in enumerate(value)})
            elif value is not None:
                flat[name] = value
        params = [p.name for p in module.main.params]
        missing = [n for n in params if n not in flat]
        if missing:
            raise InputError(f"missing inputs {missing}", hint="inputs: " + ", ".join(self.input_names))
        return module, {n: flat[n] for n in params}

    def _outputs(self, module: Module, flat: Sequence[Any]) -> tuple[Any, ...]:
        return self._outputs_type(*regroup(module.metadata, self.output_names, flat))

    def compiled(self, module: Module) -> Any:
        """The :class:`cuvil.runtime.loader.CompiledModel` of ``module`` (compiled on first use)."""
        found = self._compiled.get(id(module))
        if found is not None:
            return found[1]
        from cuvil.compiler import compile as cuvil_compile

        model = cuvil_compile(module, **self.compile_options)
        self._compiled[id(module)] = (module, model)  # the module is kept so its id stays unique
        return model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        module, feeds = self._bind(inputs)
        if self.mode == "compiled":
            outs = self.compiled(module).run(feeds)
        else:
            outs = run_reference(module, feeds)
        return self._outputs(module, outs)

    def run_reference(self, inputs: Any) -> tuple[np.ndarray, ...]:
        """The interpreter's outputs for ``inputs`` (whatever the mode): the oracle compiled runs are
        compared with."""
        module, feeds = self._bind(inputs)
        return self._outputs(module, run_reference(module, feeds))


class CuvilBackend(Backend):
    """Runs models on the reference interpreter (``mode="interpreter"``, the default) or as
    native code compiled by the LLVM backend (``mode="compiled"``)."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", mode: str = "interpreter", **kwargs: Any) -> CuvilRep:
        """Import the model once (a ModelProto, serialized bytes or a path); in compiled mode,
        ``kwargs`` may hold :func:`cuvil.compile` options (``opt_level``, ``passes``, ``cache``, ...)."""
        if not cls.supports_device(device):
            raise ModelLoadError(f"device {device!r} is not supported", hint="use device='CPU'")
        options = {k: v for k, v in kwargs.items() if k in COMPILE_OPTIONS}
        proto, _ = load_onnx(model)
        return CuvilRep(proto, mode, options)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node by wrapping it in a model whose inputs have the given arrays' types."""
        arrays = [_array(a) for a in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [n for n in node.input if n]
        if len(arrays) != len(names):
            raise InputError(f"node {node.op_type} has {len(names)} inputs, got {len(arrays)} arrays")
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                           list(a.shape))
                        for n, a in zip(names, arrays, strict=True)]
        graph_outputs = [onnx.ValueInfoProto(name=n) for n in node.output if n]
        graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        opset = int(kwargs.get("opset_version", onnx.defs.onnx_opset_version()))
        domains = {"": opset} if not node.domain or node.domain == "ai.onnx" else {"": opset, node.domain: 1}
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v)
                                                             for d, v in domains.items()])
        options = {k: v for k, v in kwargs.items() if k == "mode" or k in COMPILE_OPTIONS}
        return cls.prepare(model, device, **options).run(dict(zip(names, arrays, strict=True)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = CuvilBackend.prepare
run_model = CuvilBackend.run_model
run_node = CuvilBackend.run_node
supports_device = CuvilBackend.supports_device
