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
