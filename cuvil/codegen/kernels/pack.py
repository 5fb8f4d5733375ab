"""Compile-time packing of constant operands into the blocked panel layouts the micro-kernel reads,
and embedding of the packed arrays in the LLVM module.

A packed panel holds, for one tile of ``w`` rows (A) or columns (B), every reduction step
``k`` as ``w`` consecutive floats, zero padded to a whole tile: the micro-kernel then reads
one contiguous, aligned stream per tile and never needs an edge mask.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from cuvil.codegen.llvm_types import I8
from cuvil.codegen.scalar import GlobalVariable


def pack_b_panels(b: np.ndarray, nr: int, dtype: type = np.float32) -> np.ndarray:
    """``b[..., K, N]`` -> ``[..., ceil(N/nr), K, nr]`` (column panels of ``dtype``, zero padded)."""
    *batch, k, n = b.shape
    tiles = -(-n // nr)
    padded = np.zeros((*batch, k, tiles * nr), dtype=dtype)
    padded[..., :n] = b
    return np.ascontiguousarray(padded.reshape(*batch, k, tiles, nr).swapaxes(-3, -2))


def pack_a_tiles(a: np.ndarray, mr: int) -> np.ndarray:
    """``a[..., M, K]`` -> ``[..., ceil(M/mr), K, mr]`` (row tiles, zero padded)."""
    *batch, m, k = a.shape
    tiles = -(-m // mr)
    padded = np.zeros((*batch, tiles * mr, k), dtype=np.float32)
    padded[..., :m, :] = a
    return np.ascontiguousarray(padded.reshape(*batch, tiles, mr, k).swapaxes(-2, -1))


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _escaped(data: bytes) -> str:
    """``data`` as the body of an LLVM ``c"..."`` string, every byte as ``\\xx`` (vectorized: weights are MBs)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    out = np.empty((raw.size, 3), dtype=np.uint8)
    out[:, 0] = ord("\\")
    out[:, 1] = _HEX[raw >> 4]
    out[:, 2] = _HEX[raw & 15]
    return out.tobytes().decode("ascii")


def embed_array(mod: ir.Module, name: str, array: np.ndarray, align: int = 64) -> GlobalVariable:
    """A private constant global holding ``array``'s bytes (reused when the name exists)."""
    found = mod.globals.get(name)
    if isinstance(found, GlobalVariable):
        return found
    data = np.ascontiguousarray(array).tobytes() or b"\0"
    ty = ir.ArrayType(I8, len(data))
    g = GlobalVariable(mod, ty, name=name)
    if any(data):
        g.initializer = ir.FormattedConstant(ty, f'c"{_escaped(data)}"')
    else:
        g.initializer = ir.Constant(ty, None)
    g.global_constant = True
    g.linkage = "private"
    g.unnamed_addr = True
    g.align = align
    return g
