"""INT8 models: the zoo MLP and ResNet-18 quantized statically (QDQ, per-tensor) by onnxruntime's quantizer."""

from __future__ import annotations

from bench.models import QuantizedZooModel
from bench.models.mlp import build_mlp, mlp_inputs
from bench.models.resnet import build_resnet, resnet_inputs

MLP_INT8 = QuantizedZooModel("mlp_int8", "MLP 784-512-512-10 quantized to INT8 (QDQ), batch 1", build_mlp,
                             mlp_inputs, ("x",), ("logits",), batch=1)

RESNET18_INT8 = QuantizedZooModel("resnet18_int8", "ResNet-18-style CNN quantized to INT8 (QDQ, per-tensor), "
                                  "1x3x224x224", build_resnet, resnet_inputs, ("image",), ("logits",), batch=1)
