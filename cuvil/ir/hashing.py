"""Structural hashes of values: equal hashes mean the same computation (op, attributes,
operand hashes; parameters by name and type; constants by content), independent of the
process. The verifier diffs before/after modules with them; CSE orders operands by them."""

from __future__ import annotations

import hashlib
import weakref

from cuvil.ir.values import Value, attr_key

_cache: weakref.WeakKeyDictionary[Value, str] = weakref.WeakKeyDictionary()


def structural_hash(v: Value) -> str:
    stack = [v]
    while stack:
        top = stack[-1]
        if top in _cache:
            stack.pop()
            continue
        pending = [o for o in top.operands if o not in _cache]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        h = hashlib.sha256()
        h.update(top.op.encode())
        h.update(repr(tuple((k, attr_key(a)) for k, a in top.attrs)).encode())
        h.update(str(top.type).encode())
        for o in top.operands:
            h.update(_cache[o].encode())
        _cache[top] = h.hexdigest()[:24]
    return _cache[v]
