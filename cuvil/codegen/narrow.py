"""Conversions between the narrow float storage types (float8, float4) and f32/f64 registers.

A narrow float is one byte per element in memory, exactly as ml_dtypes stores it. Widening
reads a 256-entry table of f32 bit patterns; narrowing is a step function of the source's
bit pattern (round to nearest even, overflow, NaN and signed zero all included), found once
from ml_dtypes' own ``astype`` and emitted as a branch-free binary search over its steps.
Both tables are derived from the interpreter's meaning, so the two agree by construction.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir

from cuvil.ir.dtypes import DType

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


@functools.cache
def widen_table(dt: DType) -> np.ndarray:
    """The f32 bits of each of the 256 byte values read as ``dt`` (uint32[256])."""
    raw = np.arange(256, dtype=np.uint8)
    if dt.bits == 4:  # a float4 occupies the low nibble of its byte
        raw = raw & np.uint8(0x0F)
    return raw.view(dt.np).astype(np.float32).view(np.uint32)


def _codes(dt: DType, bits: np.ndarray, src: type) -> np.ndarray:
    with np.errstate(all="ignore"):
        return bits.view(src).astype(dt.np).view(np.uint8)


@functools.cache
def narrow_steps(dt: DType, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, codes)``: the source bit patterns (f32 for width 32, f64 for 64) where the
    narrowed byte changes, ascending from 0, and the byte from each start on."""
    ubits, src = (np.uint32, np.float32) if width == 32 else (np.uint64, np.float64)
    # a grid fine enough that no narrow value's rounding interval fits between two samples
    # (a narrow float has at most 3 mantissa bits; the grid resolves 8 or more per binade)
    grid_bits = 16 if width == 32 else 20
    step = 1 << (width - grid_bits)
    grid = np.arange(1 << grid_bits, dtype=ubits) * ubits(step)
    lo = grid
    hi = np.append(grid[1:] - ubits(1), np.array([(1 << width) - 1], dtype=ubits))
    starts = [np.array([0], dtype=ubits)]
    clo, chi = _codes(dt, lo, src), _codes(dt, hi, src)
    starts.append(lo[1:][_codes(dt, lo[1:], src) != _codes(dt, hi[:-1], src)])  # change at a grid point
    open_ = clo != chi
    lo, hi, clo = lo[open_], hi[open_], clo[open_]
    while lo.size:  # bisect each interval whose ends differ: [lo, hi] holds at least one change
        mid = lo + (hi - lo) // ubits(2)
        cmid = _codes(dt, mid, src)
        chi = _codes(dt, hi, src)
        done = hi - lo == 1
        starts.append(hi[done])
        nlo = np.concatenate([lo[~done & (cmid != clo)], mid[~done & (cmid != chi)]])
        nhi = np.concatenate([mid[~done & (cmid != clo)], hi[~done & (cmid != chi)]])
        lo, hi = nlo, nhi
        clo = _codes(dt, lo, src)
    s = np.unique(np.concatenate(starts))
    return s, _codes(dt, s, src)


def _global(mod: ir.Module, name: str, ty: ir.Type, values: np.ndarray) -> ir.GlobalVariable:
    found = mod.globals.get(name)
    if isinstance(found, ir.GlobalVariable):
        return found
    arr = ir.ArrayType(ty, len(values))
    g = ir.GlobalVariable(mod, arr, name=name)
    g.initializer = ir.Constant(arr, [ir.Constant(ty, int(v)) for v in values])
    g.global_constant = True
    g.linkage = "private"
    g.unnamed_addr = True
    return g


def emit_widen(b: ir.IRBuilder, byte: ir.Value, dt: DType) -> ir.Value:
    """A stored byte of ``dt`` as an f32 register."""
    table = _global(b.module, f"narrow.{dt.value}.widen", _I32, widen_table(dt))
    p = b.gep(table, [ir.Constant(_I64, 0), b.zext(byte, _I64)], inbounds=True,
              source_etype=table.value_type)
    return b.bitcast(b.load(p, typ=_I32), ir.FloatType())


def emit_narrow(b: ir.IRBuilder, v: ir.Value, dt: DType) -> ir.Value:
    """An f32 or f64 register rounded to ``dt``: the stored byte, as ``astype`` gives it."""
    width = 64 if v.type == ir.DoubleType() else 32
    ity = ir.IntType(width)
    starts, codes = narrow_steps(dt, width)
    n = 1 << max(int(len(starts) - 1).bit_length(), 0)
    pad = n - len(starts)
    starts = np.concatenate([starts, np.full(pad, (1 << width) - 1, dtype=starts.dtype)])
    codes = np.concatenate([codes, np.full(pad, codes[-1], dtype=np.uint8)])
    gs = _global(b.module, f"narrow.{dt.value}.starts{width}", ity, starts)
    gc = _global(b.module, f"narrow.{dt.value}.codes{width}", _I8, codes)
    bits = b.bitcast(v, ity)
    idx: ir.Value = ir.Constant(_I64, 0)
    half = n // 2
    while half >= 1:  # the last start <= bits (starts[0] is 0)
        cand = b.add(idx, ir.Constant(_I64, half))
        s = b.load(b.gep(gs, [ir.Constant(_I64, 0), cand], inbounds=True, source_etype=gs.value_type), typ=ity)
        idx = b.select(b.icmp_unsigned("<=", s, bits), cand, idx)
        half //= 2
    return b.load(b.gep(gc, [ir.Constant(_I64, 0), idx], inbounds=True, source_etype=gc.value_type), typ=_I8)
