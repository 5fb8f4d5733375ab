"""The aten converter families; importing the package registers them with the torch frontend."""

from cuvil.frontend.torch_ops import creation, elementwise, layout, nn, reduce  # noqa: F401
