"""An ONNX model as the base of an adapter: its adaptable modules are the 2-D initializers named
``<module>.weight`` that a ``MatMul``/``Gemm`` (linear) or an axis-0 ``Gather`` (embedding) reads, in
PyTorch's layout (``[out, in]``; a ``MatMul`` reads ``[in, out]``, so its weight is the transpose).
Exporters that rename weights they transpose (``onnx::MatMul_12``) lose the module names: give the
model the adapter was trained on to name them, its weights matched by content.

A merge is written back as an ONNX file whose replaced initializers hold, bit for bit, the weights
of the proved merged CIR."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from cuvil.frontend.onnx_import import OnnxImporter, load_onnx
from cuvil.ir.module import content_hash
from lora.base import BaseModel, BaseModelError, BaseModule
from lora.errors import AdapterError
from lora.merge import SiteWeight

_LINEAR_READERS = {("MatMul", 1), ("Gemm", 1)}


@dataclass(frozen=True)
class Initializer:
    name: str
    array: np.ndarray
    readers: tuple[tuple[str, int, bool], ...]  # (op_type, input index, reads it transposed)


def initializers(model: onnx.ModelProto, base_dir: Path | None) -> dict[str, Initializer]:
    """Every initializer of the main graph with the nodes reading it (external data checked as on import)."""
    importer = OnnxImporter(model, base_dir)
    readers: dict[str, list[tuple[str, int, bool]]] = {}
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for k, name in enumerate(node.input):
            transposed = node.op_type == "Gemm" and k == 1 and bool(attrs.get("transB", 0))
            if node.op_type == "Gather" and attrs.get("axis", 0) != 0:
                transposed = True  # a lookup along another axis is no embedding
            readers.setdefault(name, []).append((node.op_type, k, transposed))
    return {t.name: Initializer(t.name, importer.tensor_to_numpy(t, f"initializer {t.name}"),
                                tuple(readers.get(t.name, ())))
            for t in model.graph.initializer}


def _module(init: Initializer) -> BaseModule | None:
    """The module an initializer is the weight of: an embedding when a lookup reads it (a tied output
    layer may read it too), a linear when only matrix products read it, in one layout, a convolution when
    only Conv nodes read it as their weight."""
    if not init.name.endswith(".weight") or not init.readers:
        return None
    name = init.name.removesuffix(".weight")
    if init.array.ndim >= 3 and {(op, k) for op, k, _ in init.readers} == {("Conv", 1)}:
        return BaseModule(name, "conv", init.array)
    if init.array.ndim != 2:
        return None
    if ("Gather", 0, False) in init.readers:
        return BaseModule(name, "embedding", init.array)
    if {(op, k) for op, k, _ in init.readers} <= _LINEAR_READERS:
        layouts = {t for _, _, t in init.readers}
        if len(layouts) != 1:
            return None
        weight = init.array if layouts == {True} else init.array.T  # stored as PyTorch's [out, in]
        return BaseModule(name, "linear", weight)
    return None


def base_from_onnx(path: str | Path) -> BaseModel:
    """The adaptable modules of an ONNX model, named by its initializers."""
    model, base_dir = load_onnx(path)
    modules = {m.name: m for m in (_module(i) for i in initializers(model, base_dir).values()) if m is not None}
    if not modules:
        raise BaseModelError(f"{path} has no initializer named <module>.weight read by MatMul, Gemm, Gather or Conv",
                             location=str(path), hint="the exporter renamed the weights: pass the model the "
                                                      "adapter was trained on to name them (--names)")
    return BaseModel(modules, str(path))


def write_merged(source: str | Path, weights: list[SiteWeight], output: str | Path) -> list[str]:
    """``source`` with each merged weight in place of the initializer its op reads (all weights
    written inline); the names of the initializers replaced.

    Refuses an initializer that an op left unadapted also reads (a tied weight): replacing it would
    change that op."""
    model, base_dir = load_onnx(source)
    inits = initializers(model, base_dir)
    by_hash = {content_hash(init.array): init for init in inits.values()}
    replaced: dict[str, np.ndarray] = {}
    readers: dict[str, int] = {}
    for sw in weights:
        const = sw.op.operands[1 if sw.op.op in ("matmul", "conv") else 0]
        transposed = const.op == "transpose"
        stored = const.operands[0] if transposed else const
        init = by_hash.get(stored.const_hash) if stored.is_const else None
        if init is None:
            raise AdapterError(f"the weight of {sw.module!r} is no initializer of {source}", location=sw.module)
        new = np.ascontiguousarray(sw.weight.T if transposed else sw.weight)
        if new.shape != init.array.shape or new.dtype != init.array.dtype:
            raise RuntimeError(f"the merged weight of {sw.module!r} is {new.dtype}{list(new.shape)}, its initializer "
                               f"{init.name!r} {init.array.dtype}{list(init.array.shape)}")
        if init.name in replaced and not np.array_equal(replaced[init.name], new):
            raise AdapterError(f"initializer {init.name!r} would get two different merged weights",
                               location=init.name, hint="keep the adapter unmerged (cuvil.compile(..., merge=False))")
        replaced[init.name] = new
        readers[init.name] = readers.get(init.name, 0) + 1
    for name, count in readers.items():
        if len(inits[name].readers) != count:
            raise AdapterError(f"initializer {name!r} is read by {len(inits[name].readers)} ops, {count} of them "
                               "adapted: merging would change the others", location=name,
                               hint="keep the adapter unmerged (cuvil.compile(..., merge=False))")
    for t in model.graph.initializer:
        array = replaced.get(t.name)
        if array is None and t.data_location == onnx.TensorProto.EXTERNAL:
            array = inits[t.name].array
        if array is not None:
            t.CopyFrom(numpy_helper.from_array(array, t.name))
    onnx.save(model, str(output))
    return sorted(replaced)
