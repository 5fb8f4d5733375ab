"""ONNX converters, one module per op family. Importing this package registers them all."""

from cuvil.frontend.onnx_ops import elementwise, linalg, shape  # noqa: F401
