"""The reference model zoo: small, self-contained PyTorch models with fixed seeds.

Each entry builds its ``nn.Module`` in-process (no downloads), gives example
inputs, and exports itself to ONNX in-process, so the torch and ONNX frontends,
the benchmarks and the tests all start from the same weights. Every model has a
full-size profile (the benchmark shapes) and a reduced one (``small=True``) for
fast default tests.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

SEED = 0


def _torch() -> Any:
    import torch

    return torch


@dataclass(frozen=True)
class ZooModel:
    """One zoo model at one size profile.

    ``factory(small)`` builds the module (under a fixed seed), ``inputs(small, batch)`` makes
    the example inputs, ``batch`` is the leading dim of the example inputs."""

    name: str
    description: str
    factory: Callable[[bool], Any]
    inputs: Callable[[bool, int], tuple[Any, ...]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    small: bool = False
    batch: int = 1
    seed: int = SEED

    def build(self) -> Any:
        """The ``nn.Module`` in eval mode, with the same weights on every call."""
        torch = _torch()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = self.factory(self.small)
        return model.eval()

    def example_inputs(self, batch: int | None = None) -> tuple[Any, ...]:
        """Inputs drawn from a generator seeded per model, so they do not depend on call order."""
        return self.inputs(self.small, self.batch if batch is None else batch)

    def example_inputs_numpy(self, batch: int | None = None) -> list[np.ndarray]:
        return [t.detach().numpy() for t in self.example_inputs(batch)]

    def to_onnx(self, *, dynamic_batch: bool = False) -> Any:
        """The model exported to ONNX in-process (a ``ModelProto``)."""
        return export_onnx(self.build(), self.example_inputs(), self.input_names, self.output_names,
                           dynamic_batch=dynamic_batch)

    def reduced(self) -> ZooModel:
        """The same model at the reduced (test) size."""
        return replace(self, small=True)

    @property
    def has_torch_reference(self) -> bool:
        """Whether PyTorch eager on ``build()`` is the oracle (false for post-training-quantized models)."""
        return True


@dataclass(frozen=True)
class QuantizedZooModel(ZooModel):
    """A zoo model quantized to INT8 with onnxruntime's static quantizer (QDQ format).

    ``build()`` gives the float module it was quantized from; ONNX Runtime on ``to_onnx()`` is the oracle."""

    calibration_batches: int = 16
    quant_options: Mapping[str, Any] = field(default_factory=dict)

    def to_onnx(self, *, dynamic_batch: bool = False) -> Any:
        float_model = super().to_onnx(dynamic_batch=dynamic_batch)
        names = self.input_names
        shapes = [tuple(t.shape) for t in self.example_inputs()]
        rng = np.random.default_rng(self.seed + 1)
        batches = [{n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes, strict=True)}
                   for _ in range(self.calibration_batches)]
        return quantize_qdq(float_model, batches, **dict(self.quant_options))

    @property
    def has_torch_reference(self) -> bool:
        return False


def export_onnx(model: Any, args: Sequence[Any], input_names: Sequence[str], output_names: Sequence[str], *,
                dynamic_batch: bool = False, opset: int = 17) -> Any:
    """torch -> ONNX in memory: the TorchScript exporter at ``opset`` (fast, offline); the
    torch.export-based exporter when that one is unavailable."""
    import onnx

    torch = _torch()
    axes = {n: {0: "batch"} for n in (*input_names, *output_names)} if dynamic_batch else None
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, tuple(args), buf, dynamo=False, opset_version=opset,
                              input_names=list(input_names), output_names=list(output_names), dynamic_axes=axes)
        return onnx.load_model_from_string(buf.getvalue())
    except Exception:  # the second exporter is the fallback for any failure of the first
        logging.getLogger("cuvil").debug("TorchScript ONNX export failed; using the torch.export-based exporter")
    dyn = None
    if dynamic_batch:
        batch = torch.export.Dim("batch")
        dyn = tuple({0: batch} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, tuple(args), dynamo=True, opset_version=max(opset, 18),
                                 input_names=list(input_names), output_names=list(output_names),
                                 dynamic_shapes=dyn, verbose=False)
    return prog.model_proto


def quantize_qdq(model: Any, calibration: Sequence[Mapping[str, np.ndarray]], **options: Any) -> Any:
    """Post-training static INT8 quantization (QDQ format) with onnxruntime, in a temporary directory."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(calibration)

        def get_next(self) -> Mapping[str, np.ndarray] | None:
            return next(self._it, None)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice about pre-processing on every call
    try:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "model.int8.onnx")
            quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, **options)
            return onnx.load(out)
    finally:
        root.setLevel(level)


def randomize_batchnorm(module: Any, seed: int) -> None:
    """Give every BatchNorm non-trivial statistics and affine parameters, so BN is not the identity."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)


def seeded_generator(name: str, seed: int = SEED) -> Any:
    torch = _torch()
    return torch.Generator().manual_seed(seed * 1000 + sum(name.encode()))


def image_batch(name: str, size: int, batch: int) -> tuple[Any, ...]:
    """The example input of an image model: ``batch`` RGB images of ``size`` x ``size``, drawn from
    the model's own seeded generator."""
    torch = _torch()
    return (torch.randn(batch, 3, size, size, generator=seeded_generator(name)),)


@dataclass(frozen=True)
class Agreement:
    """How closely an output matches its reference: the largest difference relative to the
    reference's largest magnitude, and the cosine similarity of the flattened tensors."""

    max_abs: float
    relative: float
    cosine: float
    exact: bool

    def within(self, rtol: float = 1e-4, min_cosine: float = 0.99999) -> bool:
        return self.exact or (self.relative <= rtol and self.cosine >= min_cosine)


def agreement(actual: np.ndarray, expected: np.ndarray) -> Agreement:
    """Compare two outputs of the same shape (float tolerance metrics; integers must be equal)."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {e.shape}")
    exact = bool(np.array_equal(a, e))
    if e.dtype.kind not in "fc":
        return Agreement(0.0 if exact else float("inf"), 0.0 if exact else float("inf"), 1.0 if exact else 0.0,
                         exact)
    a64, e64 = a.astype(np.float64).ravel(), e.astype(np.float64).ravel()
    max_abs = float(np.max(np.abs(a64 - e64))) if a64.size else 0.0
    scale = float(np.max(np.abs(e64))) if e64.size else 0.0
    relative = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    na, ne = float(np.linalg.norm(a64)), float(np.linalg.norm(e64))
    cosine = float(a64 @ e64 / (na * ne)) if na > 0 and ne > 0 else (1.0 if na == ne else 0.0)
    return Agreement(max_abs, relative, cosine, exact)


def _registry() -> dict[str, ZooModel]:
    from bench.models import bert, int8, mlp, mobilenet, resnet

    entries = [mlp.MLP, mlp.MLP_B64, resnet.RESNET18, mobilenet.MOBILENET_V1, bert.BERT, int8.MLP_INT8,
               int8.RESNET18_INT8]
    return {m.name: m for m in entries}


ZOO: dict[str, ZooModel] = _registry()
"""Full-size models by name."""

ZOO_SMALL: dict[str, ZooModel] = {name: m.reduced() for name, m in ZOO.items()}
"""The same models at reduced sizes (fast tests)."""


def get(name: str, *, small: bool = False) -> ZooModel:
    table = ZOO_SMALL if small else ZOO
    if name not in table:
        raise KeyError(f"no zoo model {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


__all__ = ["ZOO", "ZOO_SMALL", "Agreement", "QuantizedZooModel", "ZooModel", "agreement", "export_onnx", "get",
           "quantize_qdq", "randomize_batchnorm", "seeded_generator"]
