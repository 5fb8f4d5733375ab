"""The register-tile schedule of 2-D depthwise convolutions (cuvil.codegen.kernels.depthwise_tiles): where
it applies, and that it computes every output bit for bit as the row loop does (each output's taps are the
same fused steps in the same order), on geometries that reach each of its edges (masked and all-padding
loads, stride 2's even and odd elements, rows read by several output rows, a last block of fewer rows, a row's
last vector running into the next row) and on values where the order and the padding show (NaNs,
infinities, signed zeros)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.codegen.kernels import conv, force_isa
from cuvil.codegen.kernels.depthwise_tiles import tile_shape
from cuvil.codegen.kernels.gemm import ISAS, host_isa
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from tests.oracles import rule_reference, same_float32_bits

RNG = np.random.default_rng(23)

# (input shape, kernel, strides, dilations, pads (begins + ends))
GEOMETRIES = [
    ((1, 3, 112, 112), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # MobileNet's first: 7 vectors, 2 rows a block
    ((1, 2, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # stride 2 into rows of 56
    ((1, 4, 14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # the whole plane in one block, rows of < 1 vector
    ((1, 3, 14, 14), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # 7x7 out of 14x14
    ((2, 3, 9, 32), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # rows of exactly two vectors, a last short block
    ((1, 2, 6, 17), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # a last vector of one lane
    ((1, 2, 7, 33), (3, 3), (2, 2), (1, 1), (0, 1, 2, 0)),  # asymmetric pads, an odd width at stride 2
    ((1, 3, 11, 40), (5, 5), (1, 1), (2, 2), (4, 4, 4, 4)),  # dilated 5x5: kernel rows wholly in the padding
    ((1, 2, 9, 20), (5, 3), (2, 2), (1, 2), (2, 2, 2, 2)),  # a taller kernel, dilated columns, stride 2
    ((1, 2, 5, 5), (3, 3), (1, 1), (1, 1), (4, 4, 4, 4)),  # pads past the kernel: all-padding rows and lanes
    ((1, 2, 8, 24), (1, 7), (1, 1), (1, 1), (0, 3, 0, 3)),  # one kernel row
    ((1, 2, 30, 8), (7, 1), (1, 1), (1, 1), (3, 0, 3, 0)),  # one kernel column, many rows per block
    ((1, 2, 10, 19), (3, 3), (3, 2), (1, 1), (0, 0, 0, 0)),  # stride 3 down, no padding
    ((1, 3, 14, 14), (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),  # ConvNeXt's 7x7: the weights past the registers
    ((1, 2, 23, 40), (7, 7), (2, 2), (1, 1), (3, 2, 1, 3)),  # 7x7 at stride 2, uneven pads
    # stride 2 across, a column dilation of 33: a tap's odd elements are the ones the next vector's
    # first tap loaded (its lanes past the row's end 0)
    ((1, 2, 4, 110), (1, 2), (1, 2), (1, 33), (0, 0, 0, 0)),
    # rows wider than half of AVX-512's accumulators: segments, the last one's last vector a few lanes
    ((1, 2, 9, 150), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((1, 2, 7, 301), (3, 3), (2, 1), (1, 1), (0, 1, 2, 0)),
]


def _values(shape: tuple[int, ...], hostile: bool) -> np.ndarray:
    x = RNG.standard_normal(shape).astype(np.float32)
    if hostile:  # a sprinkle of specials in the numbers, so sums of both kinds appear
        specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf], np.float32)
        where = RNG.random(shape) < 0.02
        x[where] = RNG.choice(specials, size=int(where.sum()))
    return x


def _module(geometries, hostile: bool):
    b = Builder()
    params, results, inputs = [], [], []
    for k, (xs, ks, st, dl, pads) in enumerate(geometries):
        x = b.param(f"x{k}", DType.f32, list(xs))
        w = b.const(_values((xs[1], 1, *ks), hostile=False))
        y = b.conv(x, w, groups=xs[1], strides=st, dilations=dl, pads=pads)
        bias = b.const(_values((1, xs[1], 1, 1), hostile=False))
        params.append(x)
        results.append(b.clip(b.add(y, bias), min=0.0, max=6.0) if k % 2 else b.add(y, bias))
        inputs.append(_values(xs, hostile))
    names = tuple(f"r{k}" for k in range(len(results)))
    return b.module(Function("main", tuple(params), tuple(results), names)), inputs


def _tiles_against_rows(monkeypatch, hostile: bool) -> list[str]:
    module, inputs = _module(GEOMETRIES, hostile)
    tiled = compile(module, cache=False)
    monkeypatch.setattr(conv, "TILES", False)
    rows = compile(module, cache=False)
    for k, (got, want) in enumerate(zip(tiled.run(inputs), rows.run(inputs), strict=True)):
        assert same_float32_bits(got, want), f"geometry {GEOMETRIES[k]}: the tiles and the row loop differ"
    if not hostile:
        for k, (got, want) in enumerate(zip(tiled.run(inputs), rule_reference(module, inputs), strict=True)):
            ks = GEOMETRIES[k][1]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * math.prod(ks), err_msg=str(GEOMETRIES[k]))
    assert tiled.manifest is not None and rows.manifest is not None
    assert all(n.startswith("conv.depthwise.rows") for n in rows.manifest["kernels"])
    return list(tiled.manifest["kernels"])


@pytest.mark.parametrize("hostile", [False, True], ids=["numbers", "specials"])
def test_tiles_are_the_row_loop_bit_for_bit(monkeypatch, hostile: bool) -> None:
    kernels = _tiles_against_rows(monkeypatch, hostile)
    isa = host_isa()
    assert kernels == ["conv.depthwise.rows" if tile_shape(isa, _out(g), g[2], math.prod(g[1])) is None
                       else "conv.depthwise.tiles" for g in GEOMETRIES]
    assert kernels.count("conv.depthwise.tiles") >= len(GEOMETRIES) - 2  # AVX2 keeps the row loop for two


def test_tiles_at_the_avx2_width(monkeypatch) -> None:
    """Eight lanes and eight accumulators: other vectors per row, rows per block and edge masks."""
    from cuvil.codegen.link import host_target

    if "+avx2" not in host_target().features.split(","):
        pytest.skip("the host has no AVX2")
    force_isa("avx2")
    try:
        kernels = _tiles_against_rows(monkeypatch, hostile=True)
    finally:
        force_isa(None)
    # rows of 56 (7 vectors of 8) are wider than half of AVX2's accumulators: at a stride across of 1 those run
    # in segments, at 2 they keep the row loop
    shapes = [(tile_shape(ISAS["avx2"], _out(g), g[2], math.prod(g[1])), -(-_out(g)[1] // 8)) for g in GEOMETRIES]
    segmented = [k for k, (shape, vectors) in enumerate(shapes) if shape is not None and shape[1] < vectors]
    wide = {k for k, (shape, _) in enumerate(shapes) if shape is None}
    assert segmented and wide and len(segmented) + len(wide) < len(GEOMETRIES)
    assert [n.startswith("conv.depthwise.rows") for n in kernels] == [k in wide for k in range(len(GEOMETRIES))]


def _out(g) -> tuple[int, int]:
    xs, ks, st, dl, pads = g
    return tuple((xs[2 + a] + pads[a] + pads[2 + a] - dl[a] * (ks[a] - 1) - 1) // st[a] + 1 for a in range(2))


def test_tile_shape() -> None:
    avx512 = ISAS["avx512"]
    # MobileNet-v1's planes: as many rows as fill 16 accumulators, at most the plane
    assert tile_shape(avx512, (112, 112), (1, 1), 9) == (2, 7)
    assert tile_shape(avx512, (56, 56), (2, 2), 9) == (4, 4)
    assert tile_shape(avx512, (28, 28), (1, 1), 9) == (8, 2)
    assert tile_shape(avx512, (14, 14), (1, 1), 9) == (14, 1)
    assert tile_shape(avx512, (7, 7), (2, 2), 9) == (7, 1)
    assert tile_shape(avx512, (3, 128), (1, 1), 9) == (2, 8)
    assert tile_shape(avx512, (3, 129), (1, 1), 9) == (3, 4)  # nine vectors: segments of four
    assert tile_shape(avx512, (150, 150), (1, 1), 9) == (4, 4)
    assert tile_shape(avx512, (14, 14), (1, 3), 9) is None  # a stride of 3 across
    assert tile_shape(avx512, (14, 14), (1, 1), 49) == (14, 1)  # 7x7 taps
    assert tile_shape(avx512, (14, 14), (1, 1), 81) is None  # 9x9
    assert tile_shape(ISAS["avx2"], (28, 28), (1, 1), 9) == (2, 4)
    assert tile_shape(ISAS["avx2"], (112, 112), (1, 1), 9) == (4, 2)  # 14 vectors in segments of two
    assert tile_shape(ISAS["avx2"], (56, 56), (2, 1), 9) == (4, 2)  # a stride down
    assert tile_shape(ISAS["avx2"], (56, 56), (2, 2), 9) is None  # across: the row loop
