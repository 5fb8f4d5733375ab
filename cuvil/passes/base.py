"""What a pass is: a pure ``Module -> Module`` function plus a declared contract.

The contract says what "equivalent" means for the verifier: ``exact`` (bit-identical
under IEEE semantics), ``real`` (equal over real arithmetic; floats may differ by
rounding) or ``bounded`` (precision changes with a stated error bound).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module


class Contract(enum.Enum):
    EXACT = "exact"
    REAL = "real"
    BOUNDED = "bounded"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PassResult:
    """The new module and whether the pass thinks it changed anything. The pass manager and the
    verifier decide that by comparing content (``cuvil.ir.hashing.module_hash``), not by this flag."""

    module: Module
    changed: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pass:
    """Base class. Subclasses are frozen dataclasses whose fields are the pass options,
    with a kebab-case ``name`` and a ``contract``. ``run`` must not mutate its input
    (CIR values are immutable, so it cannot)."""

    name: ClassVar[str] = ""
    contract: ClassVar[Contract] = Contract.EXACT
    description: ClassVar[str] = ""
    enters_loops: ClassVar[bool] = True
    """Whether the pass manager also runs the pass inside loop bodies and branches (``cuvil.passes.loop_bodies``).
    Off for passes whose plan spans the whole function (layout, precision, quantization)."""

    def run(self, module: Module) -> PassResult:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FunctionPass(Pass):
    """A pass that rewrites each function independently through ``run_on_function``."""

    def run_on_function(self, fn: Function, b: Builder) -> Function:
        raise NotImplementedError

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        new_fns = tuple(self.run_on_function(fn, b) for fn in module.functions)
        changed = any(a != n for a, n in zip(module.functions, new_fns, strict=True))
        if not changed:
            return PassResult(module, False)
        return PassResult(module.replace(functions=new_fns, constants=b.constants), True)


PASS_REGISTRY: dict[str, type[Pass]] = {}


_PassClass = TypeVar("_PassClass", bound=type[Pass])


def register(cls: _PassClass) -> _PassClass:
    """Make a pass available by name to pipelines (``-p name,name``) and the CLI."""
    if not cls.name or cls.name != cls.name.lower() or " " in cls.name or "_" in cls.name:
        raise ValueError(f"pass name {cls.name!r} must be kebab-case")
    if cls.name in PASS_REGISTRY and PASS_REGISTRY[cls.name] is not cls:
        raise ValueError(f"a pass named {cls.name!r} is already registered")
    PASS_REGISTRY[cls.name] = cls
    return cls


PassFactory = Callable[[], Pass]
