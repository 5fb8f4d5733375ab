"""Well-formedness of CIR modules: the invariants every pass may rely on.

The Builder checks each value as it is made; this checker re-establishes the same facts
for modules that arrive from elsewhere (parsed text, a pass that built values directly)
and adds the whole-function ones: operands defined, names unique, constraints meaningful.
A failure is a bug in whatever produced the module, reported as an :class:`IRError`
naming the value the way the printer does (``@main: %3 = matmul``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from cuvil.errors import CuvilError, IRError
from cuvil.ir.dtypes import DType
from cuvil.ir.hashing import constant_conflicts
from cuvil.ir.module import Function, Module, content_hash
from cuvil.ir.opdef import OpDef, get_op
from cuvil.ir.printer import value_names
from cuvil.ir.region import Region
from cuvil.ir.symbolic import Sym
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value, attr_key, normalize_attr, walk

BUILDER_HINT = "build values with cuvil.ir.Builder, which checks each op against its definition"


class _Checker:
    """Checks the values of one scope: a function, or a region body (whose parameters are its
    block arguments and which may not refer to constants)."""

    def __init__(self, module: Module, owner: Function | Region, context: str,
                 locations: Mapping[Value, str]) -> None:
        self.module = module
        self.owner = owner
        self.fn = owner if isinstance(owner, Function) else None
        self.locations = locations
        self.names = value_names(owner) if _walkable(owner) else {}
        self.context = context
        self.params: tuple[Value, ...] = owner.params

    def where(self, v: Value | None = None) -> str:
        if v is not None and v in self.locations:
            return self.locations[v]
        if v is None:
            return self.context
        name = self.names.get(v, repr(v))
        return f"{self.context}: {name}" + ("" if v.is_param or v.is_const else f" = {v.op}")

    def fail(self, message: str, v: Value | None = None, hint: str = BUILDER_HINT) -> IRError:
        return IRError(message, location=self.where(v), hint=hint)

    # ---------------------------------------------------------------------------------
    def check(self) -> None:
        fn = self.fn
        assert fn is not None
        if not isinstance(fn.name, str) or not fn.name:
            raise self.fail("function has no name")
        for r in fn.results:
            if not isinstance(r, Value):
                raise self.fail(f"result {r!r} is a {type(r).__name__}, not a CIR value")
        for p in fn.params:
            if not isinstance(p, Value):
                raise self.fail(f"parameter {p!r} is a {type(p).__name__}, not a CIR value")
        self.check_params()
        self.check_results()
        bound = set(fn.symbols())
        for v in fn.values():
            self.check_value(v, bound)
        self.check_constraints(bound)

    def check_params(self) -> None:
        seen: set[str] = set()
        for p in self.params:
            if not isinstance(p, Value) or not p.is_param or p.operands or [k for k, _ in p.attrs] != ["name"] \
                    or not isinstance(p.attr("name"), str) or not p.name:
                raise self.fail(f"{p!r} in the parameter list is not a named parameter", p)
            if p.name in seen:
                raise self.fail(f"two parameters are named %{p.name}", p,
                                hint="parameter names must be unique within a function")
            seen.add(p.name)

    def check_results(self) -> None:
        fn = self.fn
        assert fn is not None
        if len(fn.result_names) != len(fn.results):
            raise self.fail(f"{len(fn.results)} results but {len(fn.result_names)} result names")
        seen: set[str] = set()
        for n in fn.result_names:
            if not isinstance(n, str) or not n:
                raise self.fail(f"result name {n!r} is not a non-empty string")
            if n in seen:
                raise self.fail(f"two results are named %{n}", hint="result names must be unique within a function")
            seen.add(n)

    def check_constraints(self, bound: set[str]) -> None:
        assert self.fn is not None
        seen: set[str] = set()
        for c in self.fn.constraints:
            if not isinstance(c, DimConstraint):
                raise self.fail(f"constraint {c!r} is not a DimConstraint")
            if c.symbol not in bound:
                raise self.fail(f"constraint {c} refers to symbol {c.symbol}, which no parameter's shape uses",
                                hint="symbols used by parameters: " + (", ".join(sorted(bound)) or "none"))
            if c.symbol in seen:
                raise self.fail(f"symbol {c.symbol} is constrained twice", hint="merge the bounds into one constraint")
            seen.add(c.symbol)
            if c.lo < 0:
                raise self.fail(f"constraint {c} admits negative sizes", hint="dims are >= 0")
            if c.multiple_of < 1:
                raise self.fail(f"constraint {c} has a non-positive modulus")
            if c.hi is not None and not any(c.admits(n) for n in range(c.lo, min(c.hi, c.lo + c.multiple_of) + 1)):
                raise self.fail(f"constraint {c} admits no value", hint="check the bounds and the modulus")

    def check_type(self, v: Value, bound: set[str]) -> None:
        t = v.type
        if not isinstance(t, TensorType) or not isinstance(t.dtype, DType):
            raise self.fail(f"value has type {t!r}, not a TensorType", v)
        for d in t.shape:
            if isinstance(d, int) and d < 0:
                raise self.fail(f"type {t} has a negative dim", v)
            if isinstance(d, Sym):
                free = d.symbols() - bound
                if free:
                    raise self.fail(f"type {t} uses symbol(s) {', '.join(sorted(free))} that no parameter's "
                                    "shape binds", v, hint="every symbolic dim must be solvable from the inputs")

    def check_value(self, v: Value, bound: set[str]) -> None:
        for o in v.operands:
            if not isinstance(o, Value):
                raise self.fail(f"operand {o!r} is a {type(o).__name__}, not a CIR value", v)
        self.check_type(v, bound)
        if v.is_param:
            if not any(v is p for p in self.params):
                raise self.fail(f"%{v.name} is used but is not a parameter of {self.context}", v,
                                hint="parameters: " + (", ".join(f"%{p.name}" for p in self.params) or "none"))
            return
        if v.is_const:
            if self.fn is None:
                raise self.fail(f"a region body refers to constant @{v.const_hash}", v,
                                hint="constants enter a region as operands of the op that holds it")
            self.check_const(v)
            return
        try:
            opdef = get_op(v.op)
        except CuvilError:
            raise self.fail(f"unknown op {v.op!r}", v, hint="run `cuvil ops` for the op catalogue") from None
        self.check_op(v, opdef)

    def check_const(self, v: Value) -> None:
        if v.operands or [k for k, _ in v.attrs] != ["hash"]:
            raise self.fail("a const value takes no operands and exactly one attribute, `hash`", v)
        key = v.attr("hash")
        data = self.module.constants.get(key) if isinstance(key, str) else None
        if data is None:
            raise self.fail(f"constant @{key} is not in the module", v,
                            hint="create constants with Builder.const so their data is collected")
        expect = TensorType(DType.from_numpy(np.asarray(data).dtype), tuple(np.shape(data)))
        if v.type != expect:
            raise self.fail(f"const value has type {v.type}, its data is {expect}", v)

    def check_op(self, v: Value, opdef: OpDef) -> None:
        try:
            opdef.check_arity(len(v.operands))
            full = opdef.check_attrs(v.attr_dict)
        except CuvilError as e:
            raise self.fail(e.message, v, hint=e.hint or BUILDER_HINT) from None
        for name, want in full.items():
            stored = v.attr(name, _ABSENT)
            if stored is _ABSENT:
                raise self.fail(f"attribute {name!r} is missing (its default is {want!r})", v)
            if attr_key(stored) != attr_key(normalize_attr(want)):
                spec = next(a for a in opdef.attrs if a.name == name)
                raise self.fail(f"attribute {name!r} is stored as {stored!r} ({type(stored).__name__}); "
                                f"its definition wants {spec.kind}", v)
        for a in _regions(full.values()):
            self.check_region(a, v)
        try:
            inferred = opdef.infer([o.type for o in v.operands], full)
        except CuvilError as e:
            raise self.fail(f"the shape rule rejects the operands: {e.message}", v) from None
        if inferred != v.type:
            raise self.fail(f"recorded type {v.type} differs from {inferred}, the type the shape rule gives", v)


    def check_region(self, region: Region, holder: Value) -> None:
        """A region body is checked like a function whose parameters are the block arguments."""
        if not all(isinstance(r, Value) for r in region.results) or \
                not all(isinstance(p, Value) for p in region.params):
            raise self.fail("region holds something that is not a CIR value", holder)
        inner = _Checker(self.module, region, f"{self.where(holder)} (region)", self.locations)
        inner.check_params()
        bound = set().union(*(p.type.symbols() for p in region.params)) if region.params else set()
        for v in walk(region.results):
            inner.check_value(v, bound)


_ABSENT = object()


def _regions(values: Iterable[object]) -> Iterator[Region]:
    for v in values:
        if isinstance(v, Region):
            yield v
        elif isinstance(v, tuple):
            yield from _regions(v)


def _walkable(owner: Function | Region) -> bool:
    """Naming needs a walkable body; a broken one is reported without names."""
    try:
        list(walk(list(owner.results)))
    except Exception:
        return False
    return True


def check_function(module: Module, fn: Function, *, locations: Mapping[Value, str] | None = None) -> None:
    _Checker(module, fn, f"@{fn.name}", locations or {}).check()


def check_module(module: Module, *, locations: Mapping[Value, str] | None = None) -> None:
    """Raise :class:`IRError` at the first broken invariant; ``locations`` maps values to
    source positions (the parser passes them, so errors point into the .cir file)."""
    if not isinstance(module, Module):
        raise IRError(f"expected a Module, got {type(module).__name__}")
    names: set[str] = set()
    for fn in module.functions:
        if not isinstance(fn, Function):
            raise IRError(f"module holds a {type(fn).__name__}, not a Function")
        if fn.name in names:
            raise IRError(f"two functions are named @{fn.name}", location=f"@{fn.name}",
                          hint="function names must be unique within a module")
        names.add(fn.name)
        check_function(module, fn, locations=locations)
    for key in constant_conflicts(module.constants):
        raise IRError(f"constant @{key} holds data whose content hash is {content_hash(module.constants[key])}",
                      location=f"@{key}", hint="a constant is stored under the hash of its dtype, shape and bytes; "
                      "new data needs its own key (Builder.const computes it)")


__all__ = ["check_function", "check_module"]
