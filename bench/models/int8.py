"""INT8 MLP: the zoo MLP quantized statically (QDQ, per-tensor) by onnxruntime's quantizer."""

from __future__ import annotations

from bench.models import QuantizedZooModel
from bench.models.mlp import build_mlp, mlp_inputs

MLP_INT8 = QuantizedZooModel("mlp_int8", "MLP 784-512-512-10 quantized to INT8 (QDQ), batch 1", build_mlp,
                             mlp_inputs, ("x",), ("logits",), batch=1)
