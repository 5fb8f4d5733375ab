"""One ONNX node as a test case: the model that wraps it (the constant inputs as initializers,
output shapes left to ONNX's inference), shared by the converter tests that compare with ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass
class NodeCase:
    op: str
    feeds: dict[str, np.ndarray]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    inputs: list[str] | None = None  # node inputs in order ("" for an omitted optional one)
    outputs: int = 1
    symbolic: dict[str, list[Any]] | None = None  # declared input shapes with dim_param names
    out: int = TensorProto.UNDEFINED  # output element type where shape inference cannot tell

    def model(self) -> onnx.ModelProto:
        names = self.inputs if self.inputs is not None else [*self.feeds, *self.consts]
        outs = [f"y{k}" for k in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, **self.attrs)
        graph = helper.make_graph(
            [node], "g",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                           (self.symbolic or {}).get(n, a.shape)) for n, a in self.feeds.items()],
            [helper.make_tensor_value_info(o, self.out, None) for o in outs],
            [numpy_helper.from_array(a, n) for n, a in self.consts.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        return onnx.shape_inference.infer_shapes(model)


CONTRIB_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
"""The opsets of a model holding one of ONNX Runtime's contrib ops."""

_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
               np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64,
               np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
               np.dtype(np.bool_): TensorProto.BOOL}


def contrib_model(op: str, feeds: dict[str, np.ndarray | None], outputs: list[str], domain: str = "com.microsoft",
                  **attrs: Any) -> onnx.ModelProto:
    """One node reading ``feeds`` in order (a None feed: the optional input left out) as graph inputs."""
    node = helper.make_node(op, [n if a is not None else "" for n, a in feeds.items()], outputs, domain=domain,
                            **attrs)
    inputs = [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], list(a.shape))
              for n, a in feeds.items() if a is not None]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs if o]
    graph = helper.make_graph([node], op, inputs, outs)
    return helper.make_model(graph, opset_imports=CONTRIB_OPSETS, ir_version=8)


def ort_agrees(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None], tol: float = 2e-6,
               equal_share: float = 0.99) -> list[np.ndarray]:
    """The interpreter's results against ONNX Runtime's, output by output (floats within ``tol``; integers,
    quantized values, within one step, and equal for ``equal_share`` of the elements); returns them."""
    import onnxruntime as ort

    from cuvil.frontend.onnx_import import import_onnx
    from cuvil.interp import run_reference

    given = {n: a for n, a in feeds.items() if a is not None}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    got = run_reference(import_onnx(model), list(given.values()))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if np.issubdtype(w.dtype, np.integer):
            steps = np.abs(g.astype(np.int64) - w.astype(np.int64))
            equal = float(np.mean(steps == 0))
            assert steps.max(initial=0) <= 1 and equal >= equal_share, (steps.max(initial=0), equal)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
    return got
