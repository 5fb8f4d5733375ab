"""How the GEMM engine cuts and stores its register tiles' rows: schedules of the same sums, so each is
checked against the other bit for bit and against the ops' rules.

- A GEMM whose A is read in place (a matmul, a convolution with positions as rows) never leaves a last tile
  row of one or two rows: it gives its last tile rows one row less instead (:meth:`GemmCore.balance_rows`).
- A convolution with positions as rows whose epilogue reads a residual of its output's shape transposes the
  tile first and runs the epilogue down its columns (``IN_PLACE_COLUMNS`` in :mod:`...kernels.gemm`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import cuvil.codegen.kernels.conv as conv
import cuvil.codegen.kernels.gemm as gemm
from cuvil.compiler import compile
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import sym
from tests.codegen.test_kernels import Cases, _f32


def _core(m: Any, mr: int) -> gemm.GemmCore:
    tiling = gemm.Tiling(mr=mr, nv=4, lanes=16, kc=64, mb_tiles=4, nb_tiles=1)
    core = gemm.GemmCore(m, 64, 64, tiling, None, None, None)  # type: ignore[arg-type]
    core.balance_rows()
    return core


@pytest.mark.parametrize("m, mr, short_from", [(49, 6, 4), (50, 6, 5), (128, 6, 18), (49, 4, 10), (49, 8, 0),
                                               (48, 6, None), (52, 6, None), (7, 6, None), (13, 6, None)])
def test_the_last_tile_rows_are_one_row_short_instead_of_a_tile_of_one_or_two(m, mr, short_from):
    """49 positions in tiles of six: four tiles of six and five of five, not eight of six and one of one.
    A last tile of three rows or more stays; so do M that the same number of tiles cannot share out."""
    assert _core(m, mr).short_from == short_from


def test_balanced_rows_cover_every_row_once():
    """For every M up to 200 and tile height 3 to 8: where the rows are shared out, the tiles (``mr`` rows up
    to ``short_from``, ``mr - 1`` after it) cover 0..M in order, as many tiles as before, none of fewer than
    three rows; where they are not, the last tile has more than :data:`gemm.EDGE_ROWS` rows or M fills it."""
    for mr in range(3, 9):
        for m in range(1, 201):
            core = _core(m, mr)
            if core.short_from is None:
                q = (m - core.m_edge) // mr  # whole tiles before the last
                assert core.m_edge > gemm.EDGE_ROWS or core.m_edge == mr or q < mr - 1 - core.m_edge, (m, mr)
                continue
            heights = [mr] * core.short_from + [mr - 1] * (core.mt - core.short_from)
            assert sum(heights) == m and len(heights) == core.mt and min(heights) >= 2, (m, mr)
    assert _core(sym("n"), 6).short_from is None


def test_balanced_rows_give_the_same_bits(monkeypatch):
    """Matmuls (A read in place) of 49, 50, 128 and 7 rows and convolutions with positions as rows on 7x7 and
    13x13 planes (a residual too): with the last tile rows one row short, the same bits as with one short
    tile at the end, and the rules' values; the build did share rows out."""
    monkeypatch.setattr(conv.ConvKernel, "positions_as_rows", True)
    c = Cases()
    for m, k, n in [(49, 40, 48), (50, 33, 64), (128, 64, 80), (7, 16, 32)]:
        x = c.input(_f32(m, k))
        c.add(f"matmul {m}x{k}x{n}", c.b.matmul(x, c.b.const(_f32(k, n))), k)
    for xs, ws, attrs in [((1, 16, 7, 7), (32, 16, 3, 3), {"pads": (1, 1, 1, 1)}),
                          ((1, 8, 26, 26), (32, 8, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)})]:
        x = c.input(_f32(*xs))
        y = c.b.conv(x, c.b.const(_f32(*ws)), **attrs)
        r = c.input(_f32(*y.type.shape))
        c.add(f"conv x{xs} w{ws} {attrs}", c.b.relu(c.b.add(y, r)), ws[1] * math.prod(ws[2:]))
    shared: list[int | None] = []
    balance = gemm.GemmCore.balance_rows

    def recording(self: gemm.GemmCore) -> None:
        balance(self)
        shared.append(self.short_from)

    monkeypatch.setattr(gemm.GemmCore, "balance_rows", recording)
    c.check()
    assert any(s is not None for s in shared), shared
    balanced = compile(c.module(), cache=False).run(c.inputs)
    monkeypatch.setattr(gemm, "BALANCED_EDGE", False)
    for got, want, label in zip(compile(c.module(), cache=False).run(c.inputs), balanced, c.labels, strict=True):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), label


def test_a_residual_epilogue_runs_down_the_transposed_columns(monkeypatch):
    """Convolutions with positions as rows whose epilogue adds a residual of the output's shape (float32, or
    float16 widened; one image or two; stride 1 or 2): the tile is transposed first and the residual read
    where the output is stored. A residual broadcast along the rows is read element by element as before.
    Either way the same bits as element by element, and the rules' values."""
    monkeypatch.setattr(conv.ConvKernel, "positions_as_rows", True)
    c = Cases()

    def conv_case(xs: tuple[int, ...], ws: tuple[int, ...], residual: str, **attrs: Any) -> None:
        x = c.input(_f32(*xs))
        y = c.b.conv(x, c.b.const(_f32(*ws)), **attrs)
        shape = y.type.shape
        if residual == "f16":
            r = c.b.cast(c.input(_f32(*shape).astype(np.float16)), to=DType.f32)
        elif residual == "row":  # one value per output column, the same for every row
            r = c.input(_f32(shape[0], shape[1], 1, shape[3]))
        else:
            r = c.input(_f32(*shape))
        c.add(f"conv x{xs} w{ws} {attrs} {residual}", c.b.relu(c.b.add(y, r)), ws[1] * math.prod(ws[2:]))

    conv_case((1, 8, 7, 7), (32, 8, 3, 3), "f32", pads=(1, 1, 1, 1))
    conv_case((2, 8, 5, 6), (32, 8, 3, 3), "f32", pads=(1, 1, 1, 1))
    conv_case((1, 8, 13, 13), (32, 8, 3, 3), "f32", strides=(2, 2), pads=(1, 1, 1, 1))
    conv_case((1, 16, 9, 9), (32, 16, 1, 1), "f16")
    conv_case((1, 8, 7, 7), (32, 8, 3, 3), "row", pads=(1, 1, 1, 1))
    seen: list[bool] = []
    in_place = gemm.reads_in_place_along

    def recording(*args: Any) -> bool:
        seen.append(in_place(*args))
        return seen[-1]

    monkeypatch.setattr(gemm, "reads_in_place_along", recording)
    manifest = c.check()
    assert all(".t." in k for k in manifest["kernels"] if k.startswith("conv.")), manifest["kernels"]
    assert True in seen and False in seen, seen
    columns = compile(c.module(), cache=False).run(c.inputs)
    monkeypatch.setattr(gemm, "IN_PLACE_COLUMNS", False)
    for got, want, label in zip(compile(c.module(), cache=False).run(c.inputs), columns, c.labels, strict=True):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), label
