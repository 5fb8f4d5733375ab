"""``onnx.backend.base.Backend`` over Cuvil, so ONNX's conformance suite runs against it.

Models that feed attribute-like operands (Reshape shapes, Slice bounds, ...) through
graph inputs are specialized on those inputs' values at run time, since CIR needs
them at compile time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from cuvil.frontend.onnx_import import StaticInputRequired, import_onnx
from cuvil.interp import run_reference
from cuvil.ir.module import Module


class CuvilRep(BackendRep):
    """A prepared model: imported once, or once per set of bound input values."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.input_names = [i.name for i in model.graph.input
                            if i.name not in {t.name for t in model.graph.initializer}]
        self._static: set[str] = set()
        self._module: Module | None = None
        self._cache: dict[bytes, Module] = {}
        try:
            self._module = import_onnx(model)
        except StaticInputRequired as e:
            self._static.add(e.param_name)

    def _module_for(self, feeds: dict[str, np.ndarray]) -> Module:
        if self._module is not None:
            return self._module
        while True:
            bound = {n: feeds[n] for n in sorted(self._static)}
            key = b"".join(n.encode() + a.tobytes() + str(a.shape).encode() for n, a in bound.items())
            if key in self._cache:
                return self._cache[key]
            try:
                module = import_onnx(self.model, static_inputs=bound)
            except StaticInputRequired as e:
                if e.param_name in self._static or e.param_name not in feeds:
                    raise
                self._static.add(e.param_name)
                continue
            self._cache[key] = module
            return module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = {n: np.asarray(a) for n, a in zip(self.input_names, arrays, strict=False)}
        module = self._module_for(feeds)
        names = [p.name for p in module.main.params]
        return tuple(run_reference(module, {n: feeds[n] for n in names}))


class CuvilBackend(Backend):
    """Interpreter-backed for now; compiled execution comes with the LLVM backend."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> CuvilRep:
        super().prepare(model, device, **kwargs)
        return CuvilRep(model)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
                  ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        raise NotImplementedError("run_node is not supported; use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = CuvilBackend.prepare
run_model = CuvilBackend.run_model
supports_device = CuvilBackend.supports_device
