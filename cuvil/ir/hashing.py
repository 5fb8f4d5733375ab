"""Content identity of CIR, written once: what a value, a function and a module *are*.

* :func:`structural_hash` of a value: its op, attributes (a fused op's region by the content of
  its body, recursively), result type and the hashes of its operands; parameters by name and
  type; constants by their content key. Equal hashes mean the same computation.
* :func:`function_hash`: the values in order with their wiring, parameter and result names and
  order, and the dim constraints.
* :func:`module_hash`: every function, every constant a function uses by its *bytes* (not only
  the key it is stored under) and the module's metadata.
* :func:`compiled_function_hash`: one function with the bytes of the constants it uses, as a
  compiled library is identified (the manifest's ``function_hash``, the artifact cache's model key).

The pass manager decides whether a pass changed a module by :func:`module_hash` (never by the
pass's own word); the verifier's cone cutting and certificates, and the artifact cache, use the
same hashes. All are independent of the process (no Python ``hash()``).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil.ir.values import Value, attr_key

if TYPE_CHECKING:
    from cuvil.ir.module import Function, Module

_cache: weakref.WeakKeyDictionary[Value, str] = weakref.WeakKeyDictionary()


def attr_digest(a: Any) -> object:
    """A stable, printable key of an attribute value; a region by its content."""
    from cuvil.ir.region import Region

    if isinstance(a, Region):
        return ("region", tuple(structural_hash(p) for p in a.params), *(structural_hash(r) for r in a.results))
    if isinstance(a, tuple):
        return ("t", tuple(attr_digest(x) for x in a))
    return attr_key(a)


def structural_hash(v: Value) -> str:
    stack = [v]
    while stack:
        top = stack[-1]
        if top in _cache:
            stack.pop()
            continue
        pending = [o for o in top.operands if o not in _cache]
        pending += [r for r in _region_roots(top) if r not in _cache]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        h = hashlib.sha256()
        h.update(top.op.encode())
        h.update(repr(tuple((k, attr_digest(a)) for k, a in top.attrs)).encode())
        h.update(str(top.type).encode())
        for o in top.operands:
            h.update(_cache[o].encode())
        _cache[top] = h.hexdigest()[:24]
    return _cache[v]


def _region_roots(v: Value) -> list[Value]:
    """The values a region attribute of ``v`` hashes through (so the walk above is iterative)."""
    from cuvil.ir.region import Region

    out: list[Value] = []
    for _, a in v.attrs:
        if isinstance(a, Region):
            out += [*a.params, *a.results]
    return out


def function_hash(fn: Function) -> str:
    """Values in order with their wiring, names and order of inputs and outputs, constraints."""
    h = hashlib.sha256()
    position: dict[Value, int] = {}
    for k, v in enumerate(fn.values()):
        position[v] = k
        h.update(repr((v.op, str(v.type), tuple((n, attr_digest(a)) for n, a in v.attrs),
                       tuple(position[o] for o in v.operands))).encode())
    h.update(repr(([position[r] for r in fn.results], [position.get(p, -1) for p in fn.params],
                   [str(p.type) for p in fn.params])).encode())
    h.update(repr((fn.name, fn.result_names, [p.name for p in fn.params],
                   [str(c) for c in fn.constraints])).encode())
    return h.hexdigest()


_bytes_cache: dict[int, tuple[weakref.ReferenceType[np.ndarray], str]] = {}


def array_digest(array: np.ndarray) -> str:
    """The content key of an array (``module.content_hash``), cached per (immutable) array object."""
    from cuvil.ir.module import content_hash

    found = _bytes_cache.get(id(array))
    if found is not None and found[0]() is array:
        return found[1]
    key = content_hash(array)
    if not array.flags.writeable:  # only frozen arrays can be trusted to keep their bytes
        ident = id(array)
        _bytes_cache[ident] = (weakref.ref(array, lambda _, i=ident: _bytes_cache.pop(i, None)), key)
    return key


def constant_conflicts(constants: Mapping[str, np.ndarray]) -> list[str]:
    """Keys whose array does not hold the bytes the key names (malformed IR)."""
    return [k for k, arr in constants.items() if array_digest(arr) != k]


def module_hash(module: Module) -> str:
    """The content of a module: functions, the bytes of every constant, metadata."""
    h = hashlib.sha256()
    for fn in module.functions:
        h.update(function_hash(fn).encode())
    for k in sorted(module.constants):
        h.update(f"{k}={array_digest(module.constants[k])};".encode())
    for k in sorted(module.metadata):
        h.update(repr((k, module.metadata[k])).encode())
    return h.hexdigest()


def compiled_function_hash(fn: Function, constants: Mapping[str, np.ndarray]) -> str:
    """``f`` and 32 hex digits: the :func:`module_hash` of ``fn`` alone with the constants it uses."""
    from cuvil.ir.module import Module

    used = {v.const_hash for v in fn.values() if v.is_const}
    return "f" + module_hash(Module((fn,), {k: a for k, a in constants.items() if k in used}))[:32]


def values_hash(values: Sequence[Value]) -> str:
    """Hash of several values in order (results of a function, say)."""
    return hashlib.sha256("".join(structural_hash(v) for v in values).encode()).hexdigest()
