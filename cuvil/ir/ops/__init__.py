"""The op catalogue. Importing this package registers every op family."""

from cuvil.ir.ops import control, elementwise, fused, index, linalg, nn, quant, reduce, shape  # noqa: F401
