"""ONNX converters, one module per op family. Importing this package registers them all."""

from cuvil.frontend.onnx_ops import elementwise, index, linalg, misc, nn, quant, reduce, shape  # noqa: F401
