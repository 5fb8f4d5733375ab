"""Conversions between the narrow float storage types (float8, float4) and f32/f64 registers.

A narrow float is one byte per element in memory. Widening reads a 256-entry table of f32 bit
patterns; narrowing is a branch-free binary search over the conversion's step table. Both tables
are the rule's own (``cuvil.ir.narrow``), which the interpreter and the z3 encoder read too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
from llvmlite import ir

from cuvil.ir.dtypes import DType
from cuvil.ir.narrow import steps, widen_table

if TYPE_CHECKING:  # scalar.py imports this module, so importing scalar back is for annotations only
    from cuvil.codegen.scalar import Builder, GlobalVariable, Val

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _global(mod: ir.Module, name: str, ty: ir.Type, values: np.ndarray) -> ir.GlobalVariable:
    found = mod.globals.get(name)
    if isinstance(found, ir.GlobalVariable):
        return found
    arr = ir.ArrayType(ty, len(values))
    g = cast("GlobalVariable", ir.GlobalVariable(mod, arr, name=name))
    g.initializer = ir.Constant(arr, [ir.Constant(ty, int(v)) for v in values])
    g.global_constant = True
    g.linkage = "private"
    g.unnamed_addr = True
    return g


def emit_widen(b: Builder, byte: Val, dt: DType) -> Val:
    """A stored byte of ``dt`` as an f32 register."""
    table = _global(b.module, f"narrow.{dt.value}.widen", _I32, widen_table(dt))
    p = b.gep(table, [ir.Constant(_I64, 0), b.zext(byte, _I64)], inbounds=True,
              source_etype=table.value_type)
    return b.bitcast(b.load(p, typ=_I32), ir.FloatType())


def emit_narrow(b: Builder, v: Val, dt: DType) -> Val:
    """An f32 or f64 register rounded to ``dt``: the stored byte, as ``astype`` gives it."""
    width = 64 if v.type == ir.DoubleType() else 32
    ity = ir.IntType(width)
    starts, codes = steps(dt, width)
    n = 1 << max(int(len(starts) - 1).bit_length(), 0)
    pad = n - len(starts)
    starts = np.concatenate([starts, np.full(pad, (1 << width) - 1, dtype=starts.dtype)])
    codes = np.concatenate([codes, np.full(pad, codes[-1], dtype=np.uint8)])
    gs = _global(b.module, f"narrow.{dt.value}.starts{width}", ity, starts)
    gc = _global(b.module, f"narrow.{dt.value}.codes{width}", _I8, codes)
    bits = b.bitcast(v, ity)
    idx: Val = ir.Constant(_I64, 0)
    half = n // 2
    while half >= 1:  # the last start <= bits (starts[0] is 0)
        cand = b.add(idx, ir.Constant(_I64, half))
        s = b.load(b.gep(gs, [ir.Constant(_I64, 0), cand], inbounds=True, source_etype=gs.value_type), typ=ity)
        idx = b.select(b.icmp_unsigned("<=", s, bits), cand, idx)
        half //= 2
    return b.load(b.gep(gc, [ir.Constant(_I64, 0), idx], inbounds=True, source_etype=gc.value_type), typ=_I8)
