"""``torch.compile(model, backend="cuvil")``: each graph TorchDynamo captures is compiled by Cuvil.

Dynamo hands a backend an FX graph whose inputs are the model's tensors, its parameters and buffers
(lifted to inputs) and, once a shape varied, the sizes as ints. Cuvil compiles per signature: the
parameters (by identity and version, so an in-place update recompiles) and the sizes are bound into the
graph as constants, which is what lets constant folding and weight packing work, and the graph is
exported with ``torch.export`` and imported by the torch frontend like any model. Compiled artifacts are
cached like every other (a second process, or ``torch._dynamo.reset()``, hits the cache). Graph breaks
stay in eager, as with every backend. ``options`` of ``torch.compile`` go to :func:`cuvil.compile`
(``opt_level``, ``gate``, ``threads``, ``passes``, ``cache``).

The entry point is registered under ``torch_dynamo_backends`` in the package metadata, so the name
``"cuvil"`` works once Cuvil is installed; :func:`cuvil_backend` can also be passed directly."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cuvil.errors import InputError
from cuvil.log import logger

OPTIONS = ("opt_level", "gate", "threads", "passes", "cache", "keep_ir")
"""The :func:`cuvil.compile` options ``torch.compile(..., options=...)`` may set."""

def cuvil_backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The ``torch.compile`` backend: a callable that runs ``gm`` through Cuvil-compiled libraries."""
    options = dict(kwargs.get("options") or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InputError(f"torch.compile(backend='cuvil') got unknown options {unknown}",
                         hint="options: " + ", ".join(OPTIONS))
    return CompiledGraph(gm, options)


class CompiledGraph:
    """One Dynamo graph: a Cuvil library per signature (the shapes and dtypes of its tensor inputs, the
    values of its size inputs, the identity and version of its parameters)."""

    def __init__(self, gm: Any, options: Mapping[str, Any]) -> None:
        self.gm = gm
        self.options = dict(options)
        self.compiled: dict[tuple[Any, ...], Any] = {}
        self.last: Any = None
        self._lock = threading.Lock()
        out = gm.graph.output_node().args[0]
        self._as_tuple = isinstance(out, (tuple, list))

    def __call__(self, *args: Any) -> Any:
        import torch

        bound = {k: a for k, a in enumerate(args) if not isinstance(a, torch.Tensor) or _is_parameter(a)}
        free = [a for k, a in enumerate(args) if k not in bound]
        key = tuple(_signature(a) for a in args)
        model = self.compiled.get(key)
        if model is None:
            with self._lock:
                model = self.compiled.get(key)
                if model is None:
                    model = self.compiled[key] = self._compile(bound, free, len(args))
        self.last = model
        outs = model.run(free)
        return tuple(outs) if self._as_tuple else outs[0]

    def _compile(self, bound: Mapping[int, Any], free: Sequence[Any], count: int) -> Any:
        import cuvil

        logger.debug("torch.compile: compiling a graph of %d inputs (%d bound as constants)", count, len(bound))
        return cuvil.compile(bound_module(self.gm, bound, count), example_inputs=tuple(free), **self.options)


def _is_parameter(t: Any) -> bool:
    """A parameter of the model, bound into the graph as a constant. Buffers Dynamo lifts cannot be told
    from inputs, so they stay inputs (passed on every call: correct, only not folded)."""
    import torch

    return isinstance(t, torch.nn.Parameter)


def _signature(a: Any) -> Any:
    import torch

    if isinstance(a, torch.Tensor):
        if _is_parameter(a):
            return ("param", id(a), a._version, tuple(a.shape), a.dtype)
        return ("tensor", tuple(a.shape), a.dtype)
    return ("value", a)


@functools.cache
def _bound_class() -> type:
    import torch

    class Bound(torch.nn.Module):
        """``gm`` with some inputs fixed: parameters as buffers, sizes as Python values."""

        def __init__(self, gm: Any, bound: Mapping[int, Any], count: int) -> None:
            super().__init__()
            self.gm = gm
            self.count = count
            self.values = {k: v for k, v in bound.items() if not isinstance(v, torch.Tensor)}
            self.tensors = sorted(k for k, v in bound.items() if isinstance(v, torch.Tensor))
            for k in self.tensors:
                self.register_buffer(f"bound_{k}", bound[k].detach(), persistent=False)

        def forward(self, *free: Any) -> Any:
            it = iter(free)
            args = [self.values[k] if k in self.values else
                    getattr(self, f"bound_{k}") if k in self.tensors else next(it) for k in range(self.count)]
            return self.gm(*args)

    return Bound


def bound_module(gm: Any, bound: Mapping[int, Any], count: int) -> Any:
    """``gm`` as a module of its free inputs (the class is made on first use: torch is imported lazily)."""
    return _bound_class()(gm, bound, count)
