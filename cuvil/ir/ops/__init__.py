"""The op catalogue. Importing this package registers every op family."""

from cuvil.ir.ops import elementwise, linalg, reduce, shape  # noqa: F401
