"""Convolution as a schedule of conv's rule
``out[n, o, p] = sum_{c, t} x[n, g(o)*Cg + c, p*s + t*d - pad] * w[o, c, t]`` (NC* layout).

Per image and group it is a GEMM: rows are the group's output channels (the weights, packed at
compile time into row tiles), columns are output positions, the reduction runs over
(channel, kernel tap). Output positions are the vector dimension, so results are stored
contiguously into NCHW and the epilogue vectorizes along a row.

- A 1x1 / stride-1 / unpadded conv reads the input in place (a plain GEMM; on large feature
  maps each B panel is first copied out, since its rows are whole channel planes apart).
- Otherwise the image is first copied into a zero-padded buffer, split into ``s x s`` phases
  (``xp[c, r, q] = x[c, q*s + r - pad]`` per axis): in every phase, the input a tap reads at
  consecutive outputs is consecutive, so strided and dilated convolutions need no gathers.
  Positions are flattened over the padded width; the few columns past the real output width
  are computed and dropped (no im2col: the copy is one pass over the input, not ``k*k``). A row's
  right padding is the next row's left padding where that is as wide, so fewer columns are dropped.
- On small feature maps (late stages) the roles swap (the ``.t`` schedules): output positions
  are the GEMM rows, read in place through the same offset table, and output channels the
  vector dimension (weights packed as column panels), which pads far less work. On several threads
  these run in bands of output rows (:data:`BANDED`): one chunk of the pool copies a band's rows (and the
  rows its taps read past it) into a copy of its own and computes the band from it, so a tile never reads
  rows another core copied.
- Between two ``.t`` convolutions the activation may be channels-last (:mod:`cuvil.codegen.activation_layout`
  decides): the producer stores each tile row, one position's channels, as one run instead of transposing
  it into channel planes, and the reader's padded copy holds each position's channels together (its offset
  table and row addresses say where; the reduction runs in the same order, so every bit is the same). Where
  the reader pads at stride 1 and is the value's only reader, the producer stores straight into the reader's
  padded layout (zeroing its padding each run) and the reader copies nothing.
- Depthwise (one input channel per output) has no channel reduction, so no GEMM. In 2-D the input is
  read in place, a kernel row in the padding reading a row of zeros: where a row is at most half the
  accumulators' vectors wide at a stride across of 1 or 2, per channel in register tiles of whole rows
  (:mod:`.depthwise_tiles`); elsewhere one loop per output row (or per few rows, sharing input rows),
  vectorized by LLVM along the row (a strided conv reads every s-th input there, as an interleaved
  access). In 1-D and 3-D the same loop reads a padded copy.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from llvmlite import ir

from cuvil.codegen.kernels.depthwise_tiles import emit_plane_tiles, tile_shape
from cuvil.codegen.kernels.epilogue import Contraction, packed_rhs_unused
from cuvil.codegen.kernels.gemm import (
    LINE_FLOATS,
    STREAMED_LOCALITY,
    AOperand,
    BOperand,
    Ctx,
    GemmCore,
    Isa,
    KernelFunction,
    Tiling,
    choose_tiling,
    epilogue_emitter,
    even_lanes,
    fgep,
    fma,
    host_isa,
    masked_load_where,
    masked_store,
    pack_panel,
    pool_size,
    splat,
    store_rows,
    streams_from_memory,
    vec_type,
    write_prefetch,
)
from cuvil.codegen.kernels.pack import embed_array, pack_a_tiles, pack_b_panels
from cuvil.codegen.llvm_types import F32, I32, I64, PTR
from cuvil.codegen.loops import (
    MASKED_TAIL,
    NO_UNROLL,
    const,
    for_range,
    if_else,
    if_then,
    imin,
    load_tap,
    plane_row,
    row_major_strides,
    unravel,
)
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.target import codegen_target
from cuvil.ir.ops.nn import window_params
from cuvil.ir.types import TensorType

TILES = True
"""Whether 2-D depthwise convolutions run in register tiles (:mod:`.depthwise_tiles`) where those apply,
else along each row in the loop LLVM vectorizes (tests compare the two bit for bit)."""

DEPTHWISE_WORK = 8
"""What a depthwise convolution's flop weighs against a GEMM's in the pool's threshold: with no reduction
over channels it runs far from the FMA rate (MobileNet-v1's 512-channel 14x14 layers: 1.8 MFLOP in about
85 µs, 21 GFLOP/s), so by flops alone its layers of 7x7 and 14x14 ran on one thread whatever the pool."""

TRANSPOSE_GAIN = 1.05
"""Positions become the GEMM rows when that pads at least this much less work."""

TRANSPOSE_PLANE = 1024
TRANSPOSE_K = 256
"""... or when there are at most ``TRANSPOSE_PLANE`` output positions and a reduction of at least
``TRANSPOSE_K`` steps, whatever the padding. Measured one thread, interleaved: ResNet-18's 64 -> 128
3x3 stride-2 convolution at 56x56 0.71 -> 0.63 ms, MobileNet-v1's 256-channel 1x1 at 28x28 0.551 ->
0.536; with K = 128 (0.26 -> 0.29) or 3,136 positions (64-channel 3x3 at 56x56: even) it does not pay."""

TRANSPOSE_K_1X1 = 64
"""... and a strided 1x1 convolution (ResNet's downsampling) from this many steps on: ResNet-18's 64 -> 128 one
into 28x28 0.146 -> 0.141 ms, and positions as rows its output can stay channels-last for the block it feeds
(:mod:`cuvil.codegen.activation_layout`; the layers after it 0.01-0.03 ms faster each, one thread)."""

TRANSPOSE_PLANE_LOCAL = 4096
"""... up to this many positions in a library for one thread, or for several where the plane splits into bands
(:data:`BANDED`). ResNet-18's 64-channel 3x3 layers at 56x56 (a plane of 3,136, 576 steps), two profiled
builds interleaved with ONNX Runtime between calls, on a Zen 4: one thread 2.12-2.18 -> 2.09-2.14 ms each (the
network 33.81 -> 33.59); two threads without bands 1.15-1.18 -> 1.17-1.23 (the network 18.22 -> 18.58: each
tile of positions read every channel of the padded copy, half of them written by the other core)."""

BANDED = True
BANDS_PER_THREAD = 2
BAND_MIN_POSITIONS = 192
BAND_ONE_EACH_MIN_POSITIONS = 96
BAND_COPY_MAX = 1.5
"""The banded schedule (positions as rows, a library for several threads): the output plane's rows split into
bands of equal rows, a multiple of the threads: at least ``BANDS_PER_THREAD`` a thread, each of at least
``BAND_MIN_POSITIONS`` positions, else one a thread of at least ``BAND_ONE_EACH_MIN_POSITIONS`` (a 14x14
plane in two halves), where the bands copy at most ``BAND_COPY_MAX`` times the rows of the one copy (a band
of one row of a 3x3 convolution copies three; ResNet-18's bands 1.10-1.2 times). One chunk of the pool makes a
band's padded copy (every channel, with the rows past the
band that its taps read) and then computes the band's every output channel from it, on the core whose cache
holds the copy. Split otherwise, the copy (by channels) and the tiles (by positions) fall to the threads
independently, and each tile reads half its rows from the other core's cache. Zen 4, two threads, two
profiled builds interleaved with ONNX Runtime between calls (three runs): ResNet-18 17.67-17.87 -> 17.41-17.65
ms, with its 56x56 layers now positions as rows in four bands (1.37-1.40 -> 1.28-1.32 ms each in a slow
minute) and its 28x28 layers in four; its 14x14 layers then in two halves, 17.46-20.69 -> 17.36-20.20 ms in
three of four runs (the layers 1.12-1.14 -> 1.08-1.12 ms). One thread measured the same with bands (33.55
against 33.53 ms), so it keeps one copy."""

TRANSPOSE_PLANE_1X1 = 256
"""... and a 1x1 convolution only at up to this many output positions: there its input is read in place, each
reduction step a channel plane further on, where the channels-as-rows schedule copies its input panels
first. Measured one thread on a 2-core Xeon (caches evicted between calls, two profiled builds
interleaved): positions as rows 0.94-0.96x at 14x14 and 16x16, but 1.05-1.27x at 20x20 to 32x32 (MobileNet-v1's
256-channel 1x1 at 28x28 0.72 -> 0.63 ms in the network, where the Zen 5 machine measured 0.97x for it); the
3x3 convolutions at 28x28 keep positions as rows (0.90-0.94x)."""

PACK_MIN_ROWS = 32
PACK_MIN_PLANE = 1024
PACK_MIN_USES = 4096
"""A 1x1 conv with at least this many output channels per group, this many positions per channel
plane, and output channels times input channels per group of at least ``PACK_MIN_USES`` copies its
input panels first (measured: +20-30% at 56x56, -5% at 14x14). Below that product a panel is short
and few row tiles use it: MobileNet-v1's 32 -> 64 channels at 112x112 0.505 -> 0.449 ms unpacked, where
32 -> 128 at 56x56 (0.192 against 0.200) and 64 -> 64 at 112x112 (0.820 against 0.833) keep packing."""

LARGE_OUTPUT_BYTES = 1 << 20
"""An image's output of at least this much (half a core's L2 and more) is written in few streams, and ahead of
its stores, where positions are the vector dimension and the input is read in place (or through the padded
copy's table; a 1x1 convolution whose input panels are copied at run time shares each panel among the tile
rows, so it keeps the column tiles outside):

- ``ROWS_OUTER``: each register tile row (``mr`` output channels) sweeps the block's column tiles before the
  next row starts, so the stores run along ``mr`` channel planes at a time, where columns outside rows wrote
  a block's every channel plane at once, one store stream per plane (64 for ResNet-18's stem), more than the
  hardware prefetchers follow. The B tiles (the input) are read again per tile row, from L1/L2.
- ``STORE_AHEAD_PANELS``: each tile first fetches for writing the output lines of the tile that many column
  tiles on in its rows, so a call that finds its output cold (another library ran in between) does not wait on
  memory at every store.

Measured one thread on the Xeon, two profiled builds interleaved (a call each in turn), with both against
neither: ResNet-18's 7x7 stem (3.2 MB out) 2.08-2.10 -> 1.61-1.75 ms and the max pool after it 0.40 -> 0.36,
MobileNet-v1's 32 -> 64 1x1 at 112x112 (3.2 MB) 0.80 -> 0.46-0.49, its stem (1.6 MB) 0.35-0.37 -> 0.30-0.34;
either alone gave a smaller or no gain on ResNet-18's stem. Fetching ahead alone where the input panels are
copied (MobileNet-v1's 1x1 layers at 56x56, 1.6 MB) cost 0.03-0.05 ms; at 0.8 MB (ResNet-18's 56x56 layers)
nothing changes."""

ROWS_OUTER = True
STORE_AHEAD_PANELS = 2
WHOLE_RUNS = True
"""Whether a padded convolution with positions as vectors stores a tile that lies inside one plane row as one
run of the tile's width, a loop of known length that LLVM vectorizes whole (a run of any length leaves it a
scalar remainder). One thread, two profiled builds interleaved with ONNX Runtime between calls, on a Zen 4:
MobileNet-v1's 3x3 stride-2 stem 0.428 -> 0.412 ms, ResNet-18's 7x7 stem 2.347 -> 2.312; the other layers
have no padded plane (1x1) or take positions as rows."""

ROWS_AHEAD_FLOATS = LINE_FLOATS
ROWS_AHEAD_MIN_PLANE = 196
"""Where output positions are the GEMM rows (the ``.t`` schedules) on a plane of at least
``ROWS_AHEAD_MIN_PLANE`` positions, every step of a register tile also fetches its element a line further
along the rows (a tile row or three on): on two threads, the input of a layer was written by both cores (a
depthwise layer or the padded copy, split by channels), and a row read from the other core's cache waited on it
at its first use. Measured two threads on the Xeon (two profiled builds interleaved, ONNX Runtime run between
calls): MobileNet-v1's 512-channel 1x1 layers at 14x14 0.39-0.40 -> 0.32 ms (alone, fed from Python, 0.31),
the network 6-8 % faster; ResNet-18's stride-2 layers 0.02-0.05 ms faster and the network unchanged; one thread
unchanged. At 7x7 (a plane of a few lines) the fetches cost more than they saved (MobileNet-v1's 1024-channel
layer 0.19 -> 0.22 ms), and fetching the next column tile's B rows ahead where positions are the vectors (read
through the padded copy's table) cost 2-4 % on one and two threads."""

CONV_KC_MAX = 128
"""A convolution's reduction (channels x taps) runs in blocks of at most this many steps: a block's B panel
(128 steps of a 64-wide tile, 32 KB) stays in L1 while every row tile of the block reads it, where longer
blocks stream it from L2 for each one. Measured on a 2-core Xeon (48 KB L1, 2 MB L2), in-process A/B
against 1024 steps with ONNX Runtime interleaved (150 calls each, two runs): ResNet-18 1.036 -> 1.000-1.004x
ONNX Runtime on one thread, 1.126 -> 1.060 on two; MobileNet-v1 1.022-1.042 -> 0.964-0.970, two threads
1.021 -> 0.978; outputs bit for bit the same (the partial sums continue in the same order). 96 and 160
steps measured no better than 128; 64 worse (more partial sums to store and reload)."""

STREAMED_WEIGHTS_ONCE = True
"""Where positions are the GEMM rows and the weights stream from memory (:func:`streams_from_memory`), the
fetches of the weight panels to come mark their lines as used once (:data:`STREAMED_LOCALITY`): ResNet-18's
last stage streams 33 MB of weights a call, more than the last-level cache, and fetched into it they pushed
out what the next call reads first. Zen 4, two builds called in turn (six rounds of 30 calls each): ResNet-18
one thread 32.82 -> 32.78 ms (its 7x7 layers 0.01-0.03 ms faster each), two threads 17.98 -> 17.91,
MobileNet-v1 unchanged (11.35); fetched so for every GEMM, the classifier's (a 1 x 512 x 1000 product)
0.076 -> 0.085 ms."""

SHARED_PAD_COLUMNS = True
"""Whether a padded copy's rows share their padding columns: one row's right padding is the next row's left
(:meth:`ConvKernel._row_pitch`). Zen 4, one thread, two profiled builds interleaved: ResNet-18's 56x56 layers
2.16-2.22 -> 2.12-2.17 ms, its stem 2.35 -> 2.31, the network 34.06 -> 33.80 ms; the same bits."""

ONE_BLOCK_SLACK = 1.25
"""A reduction at most this many times :data:`CONV_KC_MAX` runs as one block: split, its two short blocks
store and reload every partial sum for a few dozen steps each (ResNet-18's 7x7 stem, 147 steps as 74 + 73)."""


ONE_BLOCK_PANEL_BYTES = 384 * 1024
ONE_BLOCK_SHARED_PANEL_BYTES = 768 * 1024
ONE_BLOCK_SHARED_ROW_TILES = 16
"""Where a block's B panel fills three quarters of L1 or more (:data:`CONV_KC_MAX` steps of AVX-512's 48- and
64-wide tiles are 24 and 32 KB: on a 32 KB L1 the A tile and the partial sums do not fit beside it; AVX2's
16-wide tiles and 48 KB L1s keep their blocks), a reduction runs as one block where its whole B panel
is at most ``ONE_BLOCK_PANEL_BYTES``, or at most ``ONE_BLOCK_SHARED_PANEL_BYTES`` and read by at least
``ONE_BLOCK_SHARED_ROW_TILES`` row tiles: the panel streams from L2 either way, and blocks only add the partial
sums' stores and reloads (the sums continue in the same order: the same bits). Measured on a Zen 4 (32 KB L1,
1 MB L2; two profiled builds interleaved, ONNX Runtime run between calls), ms with blocks -> as one, one
thread: ResNet-18's 3x3 layers at 56x56 (110 KB panels, 8 row tiles) 2.17-2.24 -> 2.13-2.21, at 28x28
(295 KB, 131 tiles) 2.10-2.16 -> 2.05-2.08, at 14x14 (590 KB, 33 tiles) 2.11-2.15 -> 2.05-2.08; the network
34.73 -> 34.24, MobileNet-v1 11.73 -> 11.56; two threads 18.92 -> 18.65 and 6.75 -> 6.62. The layer into 7x7
(590 KB, 9 tiles) and the 7x7 layers (1.2 MB, streamed from L3) measured within 1 % either way and keep their
blocks. Where L1 is 48 KB the blocks stay (measured faster there, above)."""


def conv_kc_max(k: int, panel_width: int | None = None, row_tiles: int = 0) -> int:
    """The longest K block of a convolution reducing over ``k`` steps, for tiles ``panel_width`` floats wide
    read by ``row_tiles`` register tiles when those are known (:data:`ONE_BLOCK_PANEL_BYTES`)."""
    if k <= CONV_KC_MAX * ONE_BLOCK_SLACK:
        return k
    if panel_width is not None and 4 * 4 * CONV_KC_MAX * panel_width >= 3 * codegen_target().l1_data_bytes:
        panel = 4 * k * panel_width
        if panel <= ONE_BLOCK_PANEL_BYTES or (panel <= ONE_BLOCK_SHARED_PANEL_BYTES
                                              and row_tiles >= ONE_BLOCK_SHARED_ROW_TILES):
            return k
    return CONV_KC_MAX


def conv_tiling(isa: Isa, m: int, n: int, k: int, *, b_streams: bool) -> Tiling:
    """:func:`choose_tiling` for a convolution's GEMM, its K blocks for the register tile it picks."""
    tiling = choose_tiling(isa, m, n, k, kc_max=conv_kc_max(k), b_streams=b_streams)
    one_block = conv_kc_max(k, tiling.nr, -(-m // tiling.mr))
    # the blocks the pool shares out stay those of the split reduction: re-chosen for one long block they
    # were fewer and larger, and two threads ran ResNet-18 3.6 % slower
    return dataclasses.replace(tiling, kc=k) if one_block == k != tiling.kc else tiling


MAX_SCRATCH_BYTES = 256 << 20
"""A conv whose padded copy would need more than this falls back to the generic lowering."""

COPY_WEIGHT = 64.0
"""What copying one element costs in the pool's unit (a GEMM flop): a padded copy moves a few elements per
nanosecond where the micro-kernel does a few hundred flops, so a copy of a 56x56x64 input is worth
spreading over the threads."""


def _static(t: TensorType) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


@dataclass(frozen=True)
class ConvGeometry:
    batch: int
    c_in: int
    c_out: int
    groups: int
    in_sp: tuple[int, ...]
    out_sp: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begins
    dilations: tuple[int, ...]

    @property
    def cg(self) -> int:
        return self.c_in // self.groups

    @property
    def mg(self) -> int:
        return self.c_out // self.groups

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def direct(self) -> bool:
        """1x1, stride 1, unpadded: the input is already the GEMM's B operand."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides) \
            and all(p == 0 for p in self.pads) and self.in_sp == self.out_sp


class ConvKernel:
    positions_as_rows = False
    """Whether output positions are the GEMM rows wherever there are a vector's worth of output channels
    (otherwise only where :data:`TRANSPOSE_GAIN`, :data:`TRANSPOSE_PLANE` and :data:`TRANSPOSE_K` say so)."""

    def __init__(self, op: str, contraction: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                 weights: np.ndarray, geometry: ConvGeometry, isa: Isa) -> None:
        self.op = op
        self.c = contraction
        self.in_types = list(in_types)
        self.out_type = out_type
        self.g = geometry
        self.isa = isa
        g = geometry
        nsp = len(g.out_sp)
        # taps (kernel offsets) -> phase and offset inside the phase plane, per axis. The padded
        # input is split by ``split`` (the strides; 1 keeps it whole), so an output steps by
        # ``step = stride // split`` inside a plane
        split = self.split = self._split()
        self.step = tuple(g.strides[j] // split[j] for j in range(nsp))
        offs = [[t * g.dilations[j] for t in range(g.kernel[j])] for j in range(nsp)]
        used = [sorted({o % split[j] for o in offs[j]}) for j in range(nsp)]
        self.phase_index = {ph: i for i, ph in enumerate(itertools.product(*used))}
        self.phase_of = [[used[j].index(o % split[j]) for o in offs[j]] for j in range(nsp)]
        self.band_rows = 0  # output rows (first axis) per band of the banded schedule; 0: not banded
        self._lay_out(g.out_sp, used)
        k = g.cg * g.taps
        self.tiling = conv_tiling(isa, g.mg, self.positions, k, b_streams=streams_from_memory(k, self.positions))
        # few output positions (a late, small feature map): positions as GEMM rows, channels as
        # vectors, when that computes clearly fewer padded elements than positions as vectors
        out_plane = math.prod(g.out_sp)
        band_rows = self._band_rows()  # if positions become the rows
        across = conv_tiling(isa, out_plane, g.mg, k, b_streams=streams_from_memory(k, g.mg))
        area = -(-g.mg // self.tiling.mr) * self.tiling.mr * -(-self.positions // self.tiling.nr) * self.tiling.nr
        area_across = -(-out_plane // across.mr) * across.mr * -(-g.mg // across.nr) * across.nr
        strided_1x1 = g.taps == 1 and not g.direct
        self.transposed = g.mg >= isa.lanes and (self.positions_as_rows or area_across * TRANSPOSE_GAIN < area or (
            out_plane <= self._transpose_plane(band_rows > 0) and k >= (TRANSPOSE_K_1X1 if strided_1x1 else
                                                                         TRANSPOSE_K)))
        if self.transposed:
            self.tiling = across
            self.band_rows = band_rows
            if band_rows:
                self._lay_out((band_rows, *g.out_sp[1:]), used)
        self.used, self.offs = used, offs
        self.in_last = self.out_last = False  # channels-last input / output (:meth:`channels_last`)
        self.in_padded = False  # the input is already laid out as the padded copy (:meth:`read_padded`)
        self.out_padded: PaddedPlane | None = None  # the output is stored so for its reader (:meth:`store_padded`)
        self._offsets()
        # a 1x1 conv packs its B panels at run time when its channel planes are far apart (rows a
        # page or more apart collide in the cache) and enough output channels reuse each panel
        self.pack_direct = g.direct and g.mg >= PACK_MIN_ROWS and self.plane_size >= PACK_MIN_PLANE and \
            g.mg * g.cg >= PACK_MIN_USES
        self.weights = np.asarray(weights, dtype=np.float32)
        mats = weights.reshape(g.groups, g.mg, g.cg * g.taps).astype(np.float32)
        if self.transposed:  # weights as B panels: [G, NT, K, NR]
            self.packed = pack_b_panels(np.ascontiguousarray(mats.swapaxes(-1, -2)), self.tiling.nr)
        else:  # weights as A tiles: [G, MT, K, MR]
            self.packed = pack_a_tiles(mats, self.tiling.mr)

    def _offsets(self) -> None:
        """The reduction step ``k = (c, tap)`` -> the offset of its input in the padded copy (per group), and the
        floats one image's copy takes. A channels-last copy holds each plane position's channels together."""
        g = self.g
        nsp = len(g.out_sp)
        plane_strides = row_major_strides(list(self.plane))
        koff = []
        for c in range(g.cg):
            for tap in itertools.product(*(range(k) for k in g.kernel)):
                phase = self.phase_index[tuple(self.used[j][self.phase_of[j][tap[j]]] for j in range(nsp))]
                inner = sum((self.offs[j][tap[j]] // self.split[j]) * plane_strides[j] for j in range(nsp))
                koff.append(c + (phase * self.plane_size + inner) * g.c_in if self.in_last else
                            c * self.chan_stride + phase * self.plane_size + inner)
        self.koff = np.asarray(koff, dtype=np.int64)
        slack = self.tiling.nr * -(-self.positions // self.tiling.nr)  # the last tile reads past the data
        if self.in_last:  # a tap past the last row's end reads the slack, a position (every channel) a column
            self.image_floats = len(self.phase_index) * self.plane_size * g.c_in + max(slack, g.c_in * self.plane[-1])
        else:
            self.image_floats = g.c_in * self.chan_stride + slack

    def can_be_channels_last(self) -> bool:
        """Whether :meth:`channels_last` applies: positions as rows, one group, two spatial axes (plain conv), and
        a channels-last copy whose offsets fit the int32 table."""
        g = self.g
        offsets = (len(self.phase_index) * self.plane_size + 1) * g.c_in + self.tiling.nr
        return type(self) is ConvKernel and self.transposed and g.groups == 1 and len(g.out_sp) == 2 and \
            offsets < 2**31

    def channels_last(self, x: bool, out: bool) -> None:
        """Read the input (``x``, through a padded copy; not a 1x1 read in place) and/or write the output
        (``out``) channels-last, ``[N, H, W, C]``: a tile row (a position's output channels) is then one
        contiguous run, stored without a transpose, and the padded copy is row-long runs of every channel.
        The tiles, the reduction's order and so every result stay the same bits."""
        assert self.can_be_channels_last() and not (x and self.g.direct)
        self.in_last, self.out_last = x, out
        self._offsets()

    def padded_plane(self) -> PaddedPlane | None:
        """The layout of the channels-last padded copy, where a producer can store its output so and this kernel
        then read it in place: one copy of the whole plane (not in bands), one phase (stride 1), every input
        position inside the plane."""
        g = self.g
        if not self.in_last or self.band_rows or any(s != 1 for s in self.split):
            return None
        rows, pitch = self.plane
        lo, hi = self._row_span(0, pitch)
        if rows < g.pads[0] + g.in_sp[0] or (lo, hi) != (g.pads[1], g.pads[1] + g.in_sp[1]):
            return None
        return PaddedPlane(rows, pitch, g.pads[0], g.pads[1], g.c_in, self.image_floats)

    def read_padded(self) -> None:
        """Read the input as :meth:`padded_plane` lays it out, written so by its producer: no copy."""
        assert self.padded_plane() is not None
        self.in_padded = True

    def can_store_padded(self, plane: PaddedPlane) -> bool:
        """Whether :meth:`store_padded` applies: a channels-last output of ``plane``'s channels, not computed in
        bands (as a large plane is on two threads: the padded store is made and tested for a whole plane's tiles)."""
        return self.out_last and plane.channels == self.g.c_out and not self.band_rows

    def store_padded(self, plane: PaddedPlane) -> None:
        """Store the (channels-last) output as ``plane`` lays it out, its padding and slack zeroed every run."""
        assert self.can_store_padded(plane)
        self.out_padded = plane

    @property
    def bands(self) -> int:
        return self.g.out_sp[0] // self.band_rows if self.band_rows else 1

    def _plane_extent(self, j: int, outputs: int) -> int:
        """The padded copy's extent along axis ``j`` (in one phase) that ``outputs`` consecutive outputs read."""
        g = self.g
        return (outputs - 1) * self.step[j] + max(t * g.dilations[j] // self.split[j] for t in range(g.kernel[j])) + 1

    def _lay_out(self, out_sp: Sequence[int], used: Sequence[Sequence[int]]) -> None:
        """The padded copy's geometry for ``out_sp`` output positions (the whole plane, or one band's rows)."""
        g = self.g
        if g.direct:
            self.plane = tuple(out_sp)
        else:
            plane = [self._plane_extent(j, n) for j, n in enumerate(out_sp)]
            self.plane = (*plane[:-1], self._row_pitch(plane[-1], used[-1]))
        plane_strides = row_major_strides(list(self.plane))
        self.plane_size = math.prod(self.plane)
        self.chan_stride = self.plane_size * (1 if g.direct else len(self.phase_index))
        if not g.direct:  # an odd number of cache lines per channel: channels spread over the cache sets
            lines = -(-self.chan_stride // 16)
            self.chan_stride = 16 * (lines + 1 - lines % 2)
        # output positions in plane coordinates: the flat index of the last one, plus one
        self.positions = sum((o - 1) * st for o, st in zip(out_sp, plane_strides, strict=True)) + 1

    def _band_rows(self) -> int:
        """Output rows per band where the banded schedule applies (0 elsewhere): positions as rows, a padded
        copy, two spatial axes, a pool of more than one thread, and a first axis that splits into bands as
        :data:`BANDED` says; the most rows a band that fits."""
        g = self.g
        threads = pool_size()
        if not BANDED or g.direct or len(g.out_sp) != 2 or threads == 1:
            return 0
        rows, width = g.out_sp

        def copied(d: int) -> float:  # plane rows the bands copy, against the one copy's
            return (rows // d) * self._plane_extent(0, d) / self._plane_extent(0, rows)

        splits = [d for d in range(1, rows + 1)  # shared evenly, with a bounded halo
                  if rows % d == 0 and rows // d % threads == 0 and copied(d) <= BAND_COPY_MAX]
        fits = [d for d in splits if rows // d >= BANDS_PER_THREAD * threads and d * width >= BAND_MIN_POSITIONS]
        fits = fits or [d for d in splits if rows // d >= threads and d * width >= BAND_ONE_EACH_MIN_POSITIONS]
        return max(fits, default=0)

    def _transpose_plane(self, banded: bool) -> int:
        """The largest output plane that takes positions as rows for its long reduction alone (``banded``: in
        bands, if it does)."""
        if self.g.direct:
            return TRANSPOSE_PLANE_1X1
        return TRANSPOSE_PLANE_LOCAL if pool_size() == 1 or banded else TRANSPOSE_PLANE

    def _row_pitch(self, width: int, phases: Sequence[int]) -> int:
        """The distance between a phase plane's rows: ``width`` (every column a tap reads) less the columns past
        the row's data that the next row's leading zeros can stand for (``SHARED_PAD_COLUMNS``). A read past a
        row's end then lands in the next row's left padding (or the next plane's, the channel gap's or the
        slack's, all zero), and the positions flattened over the rows compute fewer dropped columns: 57 per
        56 outputs instead of 58 for a 3x3 convolution padded by one."""
        if not SHARED_PAD_COLUMNS:
            return width
        spans = [self._row_span(r, width) for r in phases]
        lead, data_end = min(lo for lo, _ in spans), max(hi for _, hi in spans)
        return min(width, max(data_end, width - lead, (self.g.out_sp[-1] - 1) * self.step[-1] + 1))

    def _row_span(self, r: int, width: int) -> tuple[int, int]:
        """The columns ``lo <= q < hi`` of a plane row ``width`` long in phase ``r`` (of the last axis) that hold
        input: those with ``0 <= q * split + r - pad < n``; the others are padding."""
        g = self.g
        s, pad, n = self.split[-1], g.pads[-1], g.in_sp[-1]
        lo = max(0, -(-(pad - r) // s))
        hi = min(width, (n - 1 + pad - r) // s + 1) if n - 1 + pad - r >= 0 else 0
        return lo, max(hi, lo)

    def _split(self) -> tuple[int, ...]:
        """Phase-split the padded input by the strides: a tap then reads consecutive outputs' inputs
        consecutively, which the GEMM's vector loads need."""
        return self.g.strides

    @property
    def name(self) -> str:
        t = self.tiling
        kind = "depthwise" if self.g.cg == 1 and self.g.mg == 1 else ("1x1" if self.g.direct else "direct")
        bands = f".b{self.bands}" if self.band_rows else ""
        layouts = _layout_suffix(self.in_last, self.out_last, "last") + \
            _layout_suffix(self.in_padded, self.out_padded is not None, "pad")
        return f"conv.{kind}{'.t' if self.transposed else ''}.{self.isa.name}.{t.mr}x{t.nr}{bands}{layouts}"

    @property
    def unused_operands(self) -> frozenset[int]:
        return packed_rhs_unused(self.c)

    @property
    def scratch_bytes(self) -> int:
        return 0 if self.g.direct or self.in_padded else 4 * self.g.batch * self.bands * self.image_floats

    @property
    def constant_bytes(self) -> int:
        return int(self.packed.nbytes) + (0 if self.g.direct else 4 * self.koff.size)

    # -- emission ------------------------------------------------------------------------
    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        g = self.g
        t = self.tiling
        kf = KernelFunction(mod, name, len(self.in_types))
        packed = embed_array(mod, f"{name}.packed_w", self.packed)
        table = embed_array(mod, f"{name}.koff", self.koff.astype(np.int32), align=64) if not g.direct else None
        if self.out_padded is not None:
            kf.phase(g.batch * self.out_padded.rows, 0, self._zero_padding)
        if not g.direct and not self.band_rows and not self.in_padded:  # the padded copy
            if self.in_last:
                kf.phase(g.batch * self._plane_rows, COPY_WEIGHT * g.batch * self.image_floats, self._fill_last)
            else:
                kf.phase(g.batch * g.c_in, COPY_WEIGHT * g.batch * g.c_in * self.chan_stride, self._fill)
        k = g.cg * g.taps
        mt_count = -(-g.mg // t.mr)
        in_image = g.c_in * math.prod(g.in_sp)

        def a_at(ctx: Ctx, prob: Any, m0: Val, k0: Val) -> AOperand:
            b = ctx.b
            tile = b.add(b.mul(prob["group"], const(mt_count)), b.udiv(m0, const(t.mr)))
            return AOperand("packed", fgep(b, packed, b.add(b.mul(tile, const(k * t.mr)), b.mul(k0, const(t.mr)))))

        def b_at(ctx: Ctx, prob: Any, n0: Val, k0: Val, cols: int, panel: Val | None) -> BOperand:
            b = ctx.b
            if panel is not None:
                return BOperand("packed", panel)
            if table is None:
                base = fgep(b, ctx.ins[self.c.lhs], b.add(prob["in_off"], b.add(b.mul(k0, const(self.plane_size)),
                                                                                 n0)))
                return BOperand("direct", base, self.plane_size)
            base = fgep(b, ctx.scratch, b.add(prob["in_off"], n0))
            return BOperand("table", base, 0, b.gep(table, [k0], inbounds=True, source_etype=I32))

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            blocks = int(core.blocks)
            image = b.udiv(c, const(g.groups * blocks))
            rest = b.urem(c, const(g.groups * blocks))
            group = b.udiv(rest, const(blocks))
            block = b.urem(rest, const(blocks))
            if g.direct:
                in_off = b.add(b.mul(image, const(in_image)), b.mul(group, const(g.cg * self.plane_size)))
            else:
                in_off = b.add(b.mul(image, const(self.image_floats)), b.mul(group, const(g.cg * self.chan_stride)))
            prob = {"image": image, "group": group, "in_off": in_off,
                    "epi": epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)}
            core.emit_block(ctx, prob, block)

        def b_pack(ctx: Ctx, prob: Any, n0: Val, k0: Val, panel: Val) -> None:
            """A 1x1 conv's B panel, ``panel[kk][j] = x[k0 + kk, n0 + j]`` (0 past the last position):
            its rows are whole channel planes apart, which would thrash L1 if read in place."""
            b = ctx.b
            kn = imin(b, const(t.kc), b.sub(const(k), k0))
            cols = imin(b, const(t.nr), b.sub(const(self.positions), n0))
            src = fgep(b, ctx.ins[self.c.lhs], b.add(prob["in_off"], b.add(b.mul(k0, const(self.plane_size)), n0)))
            pack_panel(b, src, const(self.plane_size), kn, cols, panel, t.nr)

        pack_b = g.direct and self.pack_direct
        if self.transposed:
            core = self._transposed_core(packed, table, k)
        else:
            core = GemmCore(g.mg, self.positions, k, t, a_at, b_at, self._store, b_pack if pack_b else None,
                            b_masked_edge=g.direct and not pack_b)
            if 4 * g.c_out * math.prod(g.out_sp) >= LARGE_OUTPUT_BYTES and not pack_b:
                core.rows_outer = ROWS_OUTER
                if STORE_AHEAD_PANELS:
                    core.store_ahead = self._store_ahead
        flops = 2.0 * g.batch * g.c_out * k * math.prod(g.out_sp)
        if self.band_rows:
            copies = COPY_WEIGHT * g.batch * self.bands * g.c_in * self.chan_stride
            kf.phase(g.batch * self.bands, flops + copies, lambda ctx, c: self._band(ctx, c, core))
        else:
            kf.phase(g.batch * g.groups * int(core.blocks), flops, chunk)
        return kf.finish()

    def _band(self, ctx: Ctx, c: Val, core: GemmCore) -> None:
        """Chunk ``image * bands + band`` of the banded schedule: the band's padded copy (every channel), then
        every group's and block's tiles of the band's positions, all on the thread that made the copy."""
        g = self.g
        b = ctx.b
        image, band = b.udiv(c, const(self.bands)), b.urem(c, const(self.bands))
        if self.in_last:
            for_range(b, 0, self._plane_rows, "bandr", lambda rv: self._fill_last_row(ctx, image, rv, band),
                      hints=NO_UNROLL)
        else:
            for_range(b, 0, g.c_in, "bandc", lambda chan: self._fill(ctx, b.add(b.mul(image, const(g.c_in)), chan),
                                                                   band), hints=NO_UNROLL)
        epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)
        base = b.mul(c, const(self.image_floats))
        pos0 = b.mul(band, const(self.band_rows * math.prod(g.out_sp[1:])))

        def group(grp: Val) -> None:
            prob = {"image": image, "group": grp, "in_off": b.add(base, b.mul(grp, const(g.cg * self.chan_stride))),
                    "pos0": pos0, "epi": epi}
            for_range(b, 0, int(core.blocks), "bandb", lambda block: core.emit_block(ctx, prob, block),
                      hints=NO_UNROLL)

        for_range(b, 0, g.groups, "bandg", group, hints=NO_UNROLL)

    def _transposed_core(self, packed: Val, table: Val | None, k: int) -> GemmCore:
        """Rows are output positions (read in place at their plane offset + the step's table
        offset), columns output channels (the weights, packed as panels)."""
        g = self.g
        t = self.tiling
        out_plane = math.prod(g.out_sp)
        # the positions the GEMM runs over: the plane's, or one band's (from ``prob["pos0"]`` on)
        rows_sp = (self.band_rows, *g.out_sp[1:]) if self.band_rows else g.out_sp
        m = math.prod(rows_sp)
        nt_count = -(-g.mg // t.nr)
        plane_strides = row_major_strides(list(self.plane))

        def a_at(ctx: Ctx, prob: Any, m0: Val, k0: Val) -> AOperand:
            b = ctx.b
            rows = []
            copied = ctx.ins[self.c.lhs] if self.in_padded else ctx.scratch  # the padded copy
            for i in range(t.mr):
                p = imin(b, b.add(m0, const(i)), const(m - 1))
                if table is None:  # 1x1, stride 1: the input itself, channel planes apart
                    rows.append(fgep(b, ctx.ins[self.c.lhs], b.add(prob["in_off"],
                                                                   b.add(p, b.mul(k0, const(self.plane_size))))))
                    continue
                at: Val = const(0)
                for q, st in zip(unravel(b, p, rows_sp), plane_strides, strict=True):
                    at = b.add(at, b.mul(q, const(st)))
                if self.in_last:  # a plane position holds the input's every channel
                    at = b.mul(at, const(g.c_in))
                rows.append(fgep(b, copied, b.add(prob["in_off"], at)))
            if table is None:
                return AOperand("rows", rows, self.plane_size)
            return AOperand("rowtable", rows, 0, b.gep(table, [k0], inbounds=True, source_etype=I32))

        def b_at(ctx: Ctx, prob: Any, n0: Val, k0: Val, cols: int, panel: Val | None) -> BOperand:
            b = ctx.b
            tile = b.add(b.mul(prob["group"], const(nt_count)), b.udiv(n0, const(t.nr)))
            return BOperand("packed", fgep(b, packed, b.add(b.mul(tile, const(k * t.nr)), b.mul(k0, const(t.nr)))))

        def store(ctx: Ctx, prob: Any, m0: Val, n0: Val, rows: Val, cols: Val,
                  tile: Val, stride: int) -> None:
            b = ctx.b
            channel0 = b.add(b.mul(prob["group"], const(g.mg)), n0)
            out_base = b.add(b.mul(prob["image"], const(g.c_out * out_plane)), b.mul(channel0, const(out_plane)))
            p0 = b.add(prob["pos0"], m0) if self.band_rows else m0

            def index_of(i: Val, j: Val) -> list[Val]:
                return [prob["image"], b.add(channel0, j), *unravel(b, b.add(p0, i), g.out_sp)]

            pad = self.out_padded
            if pad is not None:  # a tile row is a run of one position's channels, in the reader's padded plane
                image0 = b.mul(prob["image"], const(pad.image_floats))

                def padded_at(i: Val, j: Val) -> Val:
                    y, x = unravel(b, b.add(p0, i), g.out_sp)
                    at = b.add(b.mul(b.add(y, const(pad.top)), const(pad.pitch)), b.add(x, const(pad.left)))
                    return b.add(image0, b.add(b.mul(at, const(g.c_out)), b.add(channel0, j)))

                store_rows(ctx, prob["epi"], tile, stride, rows, cols, index_of, padded_at)
                return
            if self.out_last:  # a tile row is a run of one position's channels
                row0 = b.add(b.mul(prob["image"], const(g.c_out * out_plane)),
                             b.add(b.mul(p0, const(g.c_out)), channel0))
                store_rows(ctx, prob["epi"], tile, stride, rows, cols, index_of,
                           lambda i, j: b.add(row0, b.add(b.mul(i, const(g.c_out)), j)), flat_reads=True)
                return

            def flat_of(i: Val, j: Val) -> Val:
                return b.add(out_base, b.add(b.mul(j, const(out_plane)), b.add(p0, i)))

            store_rows(ctx, prob["epi"], tile, stride, rows, cols, index_of, flat_of, by_columns=True,
                       max_rows=t.mr, row_axes=frozenset(f"i{d}" for d in range(2, 2 + len(g.out_sp))))

        core = GemmCore(m, g.mg, k, t, a_at, b_at, store)
        core.balance_rows()  # positions are read in place
        if STREAMED_WEIGHTS_ONCE and streams_from_memory(k, g.mg):
            core.ahead_locality = STREAMED_LOCALITY
        core.read_ahead = ROWS_AHEAD_FLOATS if out_plane >= ROWS_AHEAD_MIN_PLANE else 0
        return core

    def _fill(self, ctx: Ctx, c: Val, band: Val | None = None) -> None:
        """Chunk ``image * C + channel``: its zero-padded, phase-split copy (and the slack, once per image); with
        ``band``, the copy of that band's rows (and their neighbours the taps read) into the band's buffer."""
        g = self.g
        b = ctx.b
        image = b.udiv(c, const(g.c_in))
        chan = b.urem(c, const(g.c_in))
        copy_row = self._row_copier(ctx, c)
        copy = image if band is None else b.add(b.mul(image, const(self.bands)), band)  # the buffer it fills
        dst_image = b.mul(copy, const(self.image_floats))
        # the band's first plane row, in the whole plane's rows (first axis)
        origin = const(0) if band is None else b.mul(band, const(self.band_rows * self.step[0]))
        dst = fgep(b, ctx.scratch, b.add(dst_image, b.mul(chan, const(self.chan_stride))))
        for phase, pi in self.phase_index.items():
            plane = fgep(b, dst, pi * self.plane_size)
            outer = self.plane[:-1]
            w = self.plane[-1]
            r_last = phase[-1]
            s_last, p_last = self.split[-1], g.pads[-1]
            lo, hi = self._row_span(r_last, w)

            def row(rv: Val, phase: tuple[int, ...] = phase, plane: Val = plane,
                    outer: tuple[int, ...] = outer, w: int = w, r_last: int = r_last, s_last: int = s_last,
                    p_last: int = p_last, lo: int = lo, hi: int = hi) -> None:
                """Plane row ``rv``: zeros, the input's row read every ``s_last``-th element, zeros."""
                dst_row = fgep(b, plane, b.mul(rv, const(w)))
                inside, src_off = self._source_row(b, unravel(b, rv, outer), phase, origin)

                # a row outside the input is all padding: an empty copy range
                first = b.select(inside, const(lo), const(w))
                last = b.select(inside, const(hi), const(w))
                copy_row(dst_row, b.select(inside, src_off, const(0)), [first, last, const(w), const(s_last),
                                                                        const(r_last - p_last)])

            for_range(b, 0, math.prod(outer), "frow", row, hints=NO_UNROLL)

        gap_at = len(self.phase_index) * self.plane_size  # the channel's alignment padding: read by edge tiles
        if self.chan_stride > gap_at:
            _zeros(b, fgep(b, dst, gap_at), const(0), const(self.chan_stride - gap_at), "fg")
        slack_at = g.c_in * self.chan_stride
        if_then(b, b.icmp_signed("==", chan, const(0)), "slack", lambda: _zeros(
            b, fgep(b, ctx.scratch, dst_image), const(slack_at), const(self.image_floats), "fs"))

    def _source_row(self, b: Builder, qs: Sequence[Val], phase: tuple[int, ...], origin: Val) -> tuple[Val, Val]:
        """Whether the padded copy's row at outer coordinates ``qs`` (in ``phase``; the first one from the band's
        ``origin``) holds input, and which input row it is (its offset in positions of one channel plane)."""
        g = self.g
        in_strides = row_major_strides(list(g.in_sp))
        inside: Val = ir.Constant(ir.IntType(1), 1)
        src_off: Val = const(0)
        for j, q in enumerate(qs):
            q = b.add(q, origin) if j == 0 else q
            pos = b.sub(b.add(b.mul(q, const(self.split[j])), const(phase[j])), const(g.pads[j]))
            inside = b.and_(inside, b.icmp_unsigned("<", pos, const(g.in_sp[j])))
            src_off = b.add(src_off, b.mul(pos, const(in_strides[j])))
        return inside, src_off

    def _zero_padding(self, ctx: Ctx, c: Val) -> None:
        """Chunk ``image * rows + row`` of a padded output (:meth:`store_padded`): the row's positions that hold
        no output (the whole row above or below the data, else the columns beside it) set to zero, and with
        the image's last row the slack after the plane."""
        pad = self.out_padded
        assert pad is not None
        b = ctx.b
        g = self.g
        chans = g.c_out
        image, r = b.udiv(c, const(pad.rows)), b.urem(c, const(pad.rows))
        row_floats = pad.pitch * chans
        row = fgep(b, ctx.out, b.add(b.mul(image, const(pad.image_floats)), b.mul(r, const(row_floats))))

        def beside_data() -> None:
            _zeros(b, row, const(0), const(pad.left * chans), "padl")
            _zeros(b, row, const((pad.left + g.out_sp[1]) * chans), const(row_floats), "padr")

        data_row = b.icmp_unsigned("<", b.sub(r, const(pad.top)), const(g.out_sp[0]))
        if_else(b, data_row, "padrow", beside_data, lambda: _zeros(b, row, const(0), const(row_floats), "pada"))
        last_row = (pad.rows - 1) * row_floats  # where the image's last row starts: the slack follows it
        if_then(b, b.icmp_signed("==", r, const(pad.rows - 1)), "padslack", lambda: _zeros(
            b, row, const(row_floats), const(pad.image_floats - last_row), "pads"))

    @property
    def _plane_rows(self) -> int:
        """Rows of one phase plane of the padded copy (every axis but the last)."""
        return math.prod(self.plane[:-1])

    def _fill_last(self, ctx: Ctx, c: Val) -> None:
        """Chunk ``image * rows + row`` of the channels-last padded copy: that plane row in every phase."""
        b = ctx.b
        self._fill_last_row(ctx, b.udiv(c, const(self._plane_rows)), b.urem(c, const(self._plane_rows)), None)

    def _fill_last_row(self, ctx: Ctx, image: Val, rv: Val, band: Val | None) -> None:
        """Plane row ``rv`` of the channels-last padded copy of ``image`` (or of its ``band``), in every phase,
        and the copy's slack with its first row: a row is the input row's positions, each ``c_in`` floats,
        between positions of zeros (at a stride across, every ``stride``-th position)."""
        g = self.g
        b = ctx.b
        chans = g.c_in
        copy = image if band is None else b.add(b.mul(image, const(self.bands)), band)
        dst_image = b.mul(copy, const(self.image_floats))
        origin = const(0) if band is None else b.mul(band, const(self.band_rows * self.step[0]))
        copy_row = self._copier(ctx, b.mul(image, const(chans * math.prod(g.in_sp))))
        w = self.plane[-1]
        qs = unravel(b, rv, self.plane[:-1])
        for phase, pi in self.phase_index.items():
            dst_row = fgep(b, ctx.scratch, b.add(dst_image, b.mul(b.add(const(pi * self.plane_size),
                                                                           b.mul(rv, const(w))), const(chans))))
            inside, src_off = self._source_row(b, qs, phase, origin)
            row_at = b.select(inside, b.mul(src_off, const(chans)), const(0))
            lo, hi = self._row_span(phase[-1], w)
            stride, shift = self.split[-1], phase[-1] - g.pads[-1]
            if stride == 1:  # the input row's positions are one run
                first = b.select(inside, const(lo * chans), const(w * chans))
                last = b.select(inside, const(hi * chans), const(w * chans))
                copy_row(dst_row, row_at, [first, last, const(w * chans), const(1), const(shift * chans)])
                continue

            def position(q: Val, inside: Val = inside, row_at: Val = row_at, dst_row: Val = dst_row,
                         lo: int = lo, hi: int = hi, stride: int = stride, shift: int = shift) -> None:
                ok = b.and_(inside, b.and_(b.icmp_signed(">=", q, const(lo)), b.icmp_signed("<", q, const(hi))))
                at = b.select(ok, b.mul(b.add(b.mul(q, const(stride)), const(shift)), const(chans)), const(0))
                copy_row(fgep(b, dst_row, b.mul(q, const(chans))), b.add(row_at, at),
                         [const(0), b.select(ok, const(chans), const(0)), const(chans), const(1), const(0)])

            for_range(b, 0, w, "fpos", position, hints=NO_UNROLL)
        slack_at = len(self.phase_index) * self.plane_size * chans
        if_then(b, b.icmp_signed("==", rv, const(0)), "slack", lambda: _zeros(
            b, fgep(b, ctx.scratch, dst_image), const(slack_at), const(self.image_floats), "fs"))

    def _row_copier(self, ctx: Ctx, c: Val) -> Callable[[Val, Val, list[Val]], object]:
        """How chunk ``c`` of :meth:`_fill` copies a plane row: ``copy(dst_row, at, [lo, hi, w, stride, shift])``
        with ``at`` the row's offset in the input channel (:func:`_copy_row_function`)."""
        return self._copier(ctx, ctx.b.mul(c, const(math.prod(self.g.in_sp))))

    def _copier(self, ctx: Ctx, start: Val) -> Callable[[Val, Val, list[Val]], object]:
        """``copy(dst_row, at, [lo, hi, w, stride, shift])`` by :func:`_copy_row_function`, ``at`` an offset from
        the input's float ``start`` (a channel plane's, or a channels-last image's)."""
        b = ctx.b
        src = fgep(b, ctx.ins[self.c.lhs], start)
        fn = _copy_row_function(ctx.fn.module)
        return lambda dst_row, at, rest: b.call(fn, [dst_row, fgep(b, src, at), *rest])

    def _store_ahead(self, ctx: Ctx, prob: Any, m0: Val, n0: Val) -> None:
        """Fetch for writing the output lines that the tile :data:`STORE_AHEAD_PANELS` column tiles on will
        store, in this tile's channels (a hint: past the plane's end it fetches the next channel's lines; see
        :data:`LARGE_OUTPUT_BYTES`)."""
        g = self.g
        b = ctx.b
        t = self.tiling
        out_plane = math.prod(g.out_sp)
        w, ow = self.plane[-1], g.out_sp[-1]
        ahead = b.add(n0, const(STORE_AHEAD_PANELS * t.nr))
        row, col = b.udiv(ahead, const(w)), b.urem(ahead, const(w))  # plane row and column (output: x < ow)
        start = b.add(b.mul(row, const(ow)), imin(b, col, const(ow)))
        start = imin(b, start, const(out_plane - 1))
        channel0 = b.add(b.mul(prob["group"], const(g.mg)), m0)
        base = b.add(b.add(b.mul(prob["image"], const(g.c_out * out_plane)), b.mul(channel0, const(out_plane))),
                     start)
        for i in range(t.mr):  # not an inbounds address: past the last channel it points beyond the output
            for line in range(0, t.nr + LINE_FLOATS, LINE_FLOATS):
                write_prefetch(b, b.gep(ctx.out, [b.add(base, const(i * out_plane + line))], source_etype=F32))

    def _store(self, ctx: Ctx, prob: Any, m0: Val, n0: Val, rows: Val, cols: Val,
               tile: Val, stride: int) -> None:
        """Write the tile's valid positions: one contiguous run per plane row it touches (:data:`WHOLE_RUNS`)."""
        g = self.g
        b = ctx.b
        t = self.tiling
        epi = prob["epi"]
        w = self.plane[-1]
        ow = g.out_sp[-1]
        out_plane = math.prod(g.out_sp)
        out_strides = row_major_strides(list(g.out_sp))
        channel0 = b.add(b.mul(prob["group"], const(g.mg)), m0)
        out_base = b.add(b.mul(prob["image"], const(g.c_out * out_plane)), b.mul(channel0, const(out_plane)))
        if tuple(self.plane) == tuple(g.out_sp):  # no padding columns: the tile's positions are one run
            def position(i: Val, j: Val) -> list[Val]:
                return [prob["image"], b.add(channel0, i), *unravel(b, b.add(n0, j), g.out_sp)]

            def at(i: Val, j: Val) -> Val:
                return b.add(b.add(out_base, b.mul(i, const(out_plane))), b.add(n0, j))

            store_rows(ctx, epi, tile, stride, rows, cols, position, at)
            return
        first_row = b.udiv(n0, const(w))
        end = b.add(n0, cols)
        last_row = b.udiv(b.sub(end, const(1)), const(w))

        def plane_row(rv: Val) -> None:
            outer = unravel(b, rv, self.plane[:-1])
            inside: Val = ir.Constant(ir.IntType(1), 1)
            out_row: Val = const(0)
            for j, q in enumerate(outer):
                inside = b.and_(inside, b.icmp_unsigned("<", q, const(g.out_sp[j])))
                out_row = b.add(out_row, b.mul(q, const(out_strides[j])))
            row_start = b.mul(rv, const(w))
            lo = b.select(b.icmp_signed(">", n0, row_start), n0, row_start)
            hi = imin(b, end, b.add(row_start, const(ow)))
            run = b.and_(inside, b.icmp_signed("<", lo, hi))

            def emit_run() -> None:
                col0 = b.sub(lo, n0)
                x0 = b.sub(lo, row_start)

                def index_of(i: Val, j: Val) -> list[Val]:
                    return [prob["image"], b.add(channel0, i), *outer, b.add(x0, j)]

                def flat_of(i: Val, j: Val) -> Val:
                    return b.add(b.add(out_base, b.mul(i, const(out_plane))), b.add(out_row, b.add(x0, j)))

                def any_run() -> None:
                    store_rows(ctx, epi, tile, stride, rows, b.sub(hi, lo), index_of, flat_of, col0)

                if not WHOLE_RUNS:
                    any_run()
                    return
                # a run as wide as the tile is the whole tile (it starts at n0): a loop of known length,
                # vectorized whole, where a run of any length leaves LLVM a scalar remainder
                if_else(b, b.icmp_signed("==", b.sub(hi, lo), const(t.nr)), "whole",
                        lambda: store_rows(ctx, epi, tile, stride, rows, t.nr, index_of, flat_of), any_run)

            if_then(b, run, "run", emit_run)

        for_range(b, first_row, b.add(last_row, const(1)), "prow", plane_row, hints=NO_UNROLL)


class DepthwiseKernel(ConvKernel):
    """One input channel per output channel (and per group): no reduction over channels, so no
    GEMM. Per (image, channel): the padded copy of the channel, then one loop along each output
    row with the taps unrolled and the epilogue applied in the same loop body; LLVM vectorizes
    that loop over the output width."""

    def _split(self) -> tuple[int, ...]:
        """Keep the padded input whole: the row loop reads every ``stride``-th element, which
        LLVM vectorizes as an interleaved access; the copy stays a plain padded copy."""
        return (1,) * len(self.g.strides)

    @property
    def name(self) -> str:
        return "conv.depthwise.rows"

    @property
    def constant_bytes(self) -> int:
        return int(self.weights.nbytes)

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        g = self.g
        kf = KernelFunction(mod, name, len(self.in_types))
        taps = g.taps
        weights = embed_array(mod, f"{name}.w", self.weights.reshape(g.c_out, taps))
        out_plane = math.prod(g.out_sp)
        plane_strides = row_major_strides(list(self.plane))
        ow = g.out_sp[-1]
        koff = [int(v) for v in self.koff]

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            self._fill(ctx, c)
            image = b.udiv(c, const(g.c_in))
            chan = b.urem(c, const(g.c_in))
            base = fgep(b, ctx.scratch, b.add(b.mul(image, const(self.image_floats)),
                                             b.mul(chan, const(self.chan_stride))))
            w_row = fgep(b, weights, b.mul(chan, const(taps)))
            w = [b.load(fgep(b, w_row, t), typ=F32, align=4) for t in range(taps)]
            epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)
            out_base = b.mul(c, const(out_plane))

            def row(r: Val) -> None:
                outer = unravel(b, r, g.out_sp[:-1])
                at: Val = const(0)
                for q, st, step in zip(outer, plane_strides[:-1], self.step[:-1], strict=True):
                    at = b.add(at, b.mul(q, const(st * step)))
                row_ptr = fgep(b, base, at)
                out_row = b.add(out_base, b.mul(r, const(ow)))

                def column(x: Val) -> None:
                    p = fgep(b, row_ptr, b.mul(x, const(self.step[-1])))
                    acc: Val = ir.Constant(F32, 0.0)
                    for t in range(taps):
                        acc = fma(b, w[t], b.load(fgep(b, p, koff[t]), typ=F32, align=4), acc)
                    value = epi.element([image, chan, *outer, x], acc)
                    epi.store(b.add(out_row, x), value)

                for_range(b, 0, ow, "ow", column)

            for_range(b, 0, out_plane // ow, "oh", row, hints=NO_UNROLL)

        kf.phase(g.batch * g.c_in, DEPTHWISE_WORK * 2.0 * g.batch * g.c_out * taps * out_plane, chunk)
        return kf.finish()


class InPlaceDepthwiseKernel(DepthwiseKernel):
    """A 2-D depthwise convolution read in place (no padded copy, which took as long as the taps on
    MobileNet's layers): in register tiles where :func:`tile_shape` gives their shape, else per output
    row, each kernel row reads its input row, or a row of zeros where it falls in the padding; the
    output columns whose taps all fall inside the row run in a loop LLVM vectorizes (stride 2 as an
    interleaved access), the few edge columns read a zero for a tap in the padding. The products and
    their order are the padded copy's, so the sums are too.

    At stride 1 across, a tap in the padding is a load not taken (``load_tap``), so one loop
    covers the whole row, edge columns included, and vectorizes with masked loads and a masked last
    vector (:data:`MASKED_TAIL`); rows are computed :func:`rows_per_block` at a time, sharing the loads
    of the input rows they have in common. One thread, MobileNet-v1's first depthwise layer went
    0.30 -> 0.13 ms with the masked last vector, its 14x14 layers 0.0645 -> 0.033 ms with whole planes
    in one pass. At a stride across, rows of at most 16 outputs run that stride-1 pass into a row
    buffer and the epilogue takes every stride-th column; wider rows run their interior columns in a
    loop LLVM vectorizes as an interleaved access with a scalar remainder (masked interleaved loads
    measured slower) and their edge columns one at a time."""

    @property
    def scratch_bytes(self) -> int:
        return 0

    @property
    def tiles(self) -> tuple[int, int] | None:
        """The register tiles' shape where the plane runs in them (:func:`tile_shape`), else None."""
        return tile_shape(self.isa, self.g.out_sp, self.g.strides, self.g.taps) if TILES else None

    @property
    def name(self) -> str:
        return "conv.depthwise.tiles" if self.tiles else "conv.depthwise.rows"

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        g = self.g
        kf = KernelFunction(mod, name, len(self.in_types))
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.strides, g.pads, g.dilations
        (h, w_in), (oh, ow) = g.in_sp, g.out_sp
        taps = g.taps
        weights = embed_array(mod, f"{name}.w", self.weights.reshape(g.c_out, taps))
        zero_row = embed_array(mod, f"{name}.zeros", np.zeros(w_in, dtype=np.float32))
        # output columns whose every tap is inside the row: x*sw - pw >= 0 and x*sw + (kw-1)*dw - pw < w_in
        x_lo = min(ow, -(-pw // sw))
        x_hi = max(x_lo, min(ow, (w_in - 1 - (kw - 1) * dw + pw) // sw + 1 if w_in - 1 - (kw - 1) * dw + pw >= 0
                             else 0))
        zero = ir.Constant(F32, 0.0)
        tiles = self.tiles

        def chunk(ctx: Ctx, c: Val) -> None:
            b = ctx.b
            image = b.udiv(c, const(g.c_in))
            chan = b.urem(c, const(g.c_in))
            src = fgep(b, ctx.ins[self.c.lhs], b.mul(c, const(h * w_in)))
            w_row = fgep(b, weights, b.mul(chan, const(taps)))
            wt = [b.load(fgep(b, w_row, t), typ=F32, align=4) for t in range(taps)]
            epi = epilogue_emitter(ctx, self.c, self.in_types, self.out_type, self.op)
            out_base = b.mul(c, const(oh * ow))

            def row(y: Val) -> None:
                rows = [plane_row(b, src, b.sub(b.add(b.mul(y, const(sh)), const(ky * dh)), const(ph)), h, w_in,
                                  zero_row, F32) for ky in range(kh)]
                out_row = b.add(out_base, b.mul(y, const(ow)))

                def column(x: Val, edge: bool) -> None:
                    acc: Val = zero
                    for ky in range(kh):
                        for kx in range(kw):
                            ix = b.sub(b.add(b.mul(x, const(sw)), const(kx * dw)), const(pw))
                            if edge:
                                inside = b.icmp_unsigned("<", ix, const(w_in))
                                v = b.load(fgep(b, rows[ky], b.select(inside, ix, const(0))), typ=F32, align=4)
                                v = b.select(inside, v, zero)
                            else:
                                v = b.load(fgep(b, rows[ky], ix), typ=F32, align=4)
                            acc = fma(b, wt[ky * kw + kx], v, acc)
                    epi.store(b.add(out_row, x), epi.element([image, chan, y, x], acc))

                for_range(b, 0, x_lo, "owl", lambda x: column(x, True), hints=NO_UNROLL)
                for_range(b, x_lo, x_hi, "ow", lambda x: column(x, False))
                for_range(b, x_hi, ow, "owr", lambda x: column(x, True), hints=NO_UNROLL)

            # at a stride across, every input column's sum (the stride-1 row) goes to a buffer first and
            # the epilogue reads every sw-th: twice the taps, but in vectors where an interleaved row of
            # a few outputs ran one column at a time; the same taps in the same order per output
            full = (ow - 1) * sw + 1
            rb_max = rows_per_block(oh, ow, sw)
            buf = ctx.entry_alloca(ir.ArrayType(F32, rb_max * full), "dwrow") if sw > 1 else None

            def block(y0: Val, count: int) -> None:
                """Output rows ``y0 .. y0+count-1`` in one loop along the row: a tap in the padding is a
                load not taken, so the loop vectorizes whole, edges included, with masked loads; the
                rows share their input rows' loads."""
                by_offset: dict[int, Val] = {}
                for r in range(count):
                    for ky in range(kh):
                        o = r * sh + ky * dh - ph
                        if o not in by_offset:
                            by_offset[o] = plane_row(b, src, b.add(b.mul(y0, const(sh)), const(o)), h, w_in, zero_row,
                                                     F32)

                def column(x: Val) -> None:
                    loaded: dict[tuple[int, int], Val] = {}
                    for r in range(count):
                        acc: Val = zero
                        for ky in range(kh):
                            o = r * sh + ky * dh - ph
                            for kx in range(kw):
                                shift = kx * dw - pw
                                if (o, shift) not in loaded:
                                    loaded[o, shift] = load_tap(b, by_offset[o], x, shift, full, w_in, zero)
                                acc = fma(b, wt[ky * kw + kx], loaded[o, shift], acc)
                        if buf is not None:
                            b.store(acc, fgep(b, buf, b.add(x, const(r * full))), align=4)
                            continue
                        y = b.add(y0, const(r))
                        epi.store(b.add(out_base, b.add(b.mul(y, const(ow)), x)),
                                  epi.element([image, chan, y, x], acc))

                for_range(b, 0, full, "ow", column, hints=MASKED_TAIL)
                if buf is None:
                    return
                row_buf: Val = buf
                for r in range(count):
                    y = b.add(y0, const(r))

                    def pick(x: Val, r: int = r, y: Val = y) -> None:
                        at = b.add(b.mul(x, const(sw)), const(r * full))
                        acc = b.load(fgep(b, row_buf, at), typ=F32, align=4)
                        epi.store(b.add(out_base, b.add(b.mul(y, const(ow)), x)),
                                  epi.element([image, chan, y, x], acc))

                    for_range(b, 0, ow, "owp", pick)

            if tiles is not None:
                emit_plane_tiles(ctx, self.isa, tiles, (g.in_sp, g.out_sp, g.kernel, g.strides, g.pads, g.dilations),
                                 src, wt, zero_row, epi, (image, chan), out_base)
                return
            if rb_max:
                blocks = oh // rb_max
                for_range(b, 0, blocks, "ohb", lambda yb: block(b.mul(yb, const(rb_max)), rb_max), hints=NO_UNROLL)
                if oh % rb_max:
                    block(const(blocks * rb_max), oh % rb_max)
            else:
                for_range(b, 0, oh, "oh", row, hints=NO_UNROLL)

        kf.phase(g.batch * g.c_in, DEPTHWISE_WORK * 2.0 * g.batch * g.c_out * taps * oh * ow, chunk)
        return kf.finish()


def rows_per_block(oh: int, ow: int, sw: int = 1) -> int:
    """Output rows a depthwise convolution computes in one pass along the row, sharing the loads of their
    common input rows (``sw``: its stride across; 0 where that pass is not used). Measured on MobileNet-v1's
    3x3 layers, one thread (ms, before -> after): a whole 14x14 plane at once 0.0645 -> 0.033 (512
    channels), 7x7 0.037 -> 0.026 (1024), four rows of 28 0.087 -> 0.063 (256); at 56 and 112 more rows
    per pass were slower (wider bodies, masked). At stride 2, 28x28 -> 14x14 0.070 -> 0.034 (four rows),
    14x14 -> 7x7 0.030 -> 0.020 (the whole plane); 56x56 -> 28x28 was slower than the interleaved loop."""
    if sw > 1:  # 0: wider rows keep the interleaved loop (as fast as the wider stride-1 pass or faster)
        return 0 if ow > 16 else min(oh, 4) if ow > 8 else min(oh, 16)
    if ow <= 16:
        return min(oh, 16)
    return min(oh, 4) if ow <= 32 else 1


def _layout_suffix(x: bool, out: bool, layout: str) -> str:
    """A kernel name's mark of a layout its input (``x``) and/or output take: ``.xlast``, ``.opad``, ..."""
    return f".{'x' if x else ''}{'o' if out else ''}{layout}" if x or out else ""


def _zeros(b: Builder, base: Val, start: Val, end: Val, name: str) -> None:
    """``base[q] = 0`` for ``start <= q < end``."""
    zero = ir.Constant(F32, 0.0)
    for_range(b, start, end, name, lambda q: b.store(zero, fgep(b, base, q), align=4), hints=NO_UNROLL)


@dataclass(frozen=True)
class PaddedPlane:
    """A channels-last image laid out as a convolution's padded copy (stride 1: one phase): ``rows`` plane rows
    ``pitch`` positions apart, each position ``channels`` floats, the data from row ``top`` and column ``left``
    on, zeros around it and in the slack that ends each image's ``image_floats``."""

    rows: int
    pitch: int
    top: int
    left: int
    channels: int
    image_floats: int


def _copy_row_function(mod: ir.Module) -> ir.Function:
    """``copy_row(dst, src, lo, hi, w, stride, shift)``: ``dst[q] = src[q * stride + shift]`` for
    ``lo <= q < hi`` and 0 for the other ``q < w``. One per module, inlined into every conv's padded copy,
    where its stride and row width are constants (a call per row of a few dozen floats cost a quarter of
    the copy: ResNet-18's copies 2.3 -> 1.8 % of its run).

    A row is a few dozen floats, so it is written in whole vectors of the target's width, not with loops
    LLVM turns into calls to ``memset`` and ``memcpy`` (three calls a row cost ResNet-18 more than the
    copying) nor with masked stores (slow on Zen): a row at least a vector wide gets a vector of zeros at
    each end that has padding, then the copy over it, whose last vector overlaps the one before it. Stride
    1 copies vectors; stride 2 takes the even elements of two contiguous vectors while the second one's
    last element is one the row still has (a loop over a stride-2 read vectorizes as a gather), then one
    float at a time; other strides one at a time. A row narrower than a vector is written masked."""
    name = "cuvil.conv.copy_row"
    found = mod.globals.get(name)
    if isinstance(found, ir.Function):
        return found
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64, I64, I64]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    dst, src, lo, hi, w, stride, shift = fn.args
    for a, n in zip(fn.args, ("dst", "src", "lo", "hi", "w", "stride", "shift"), strict=True):
        a.name = n
    dst.add_attribute("noalias")
    src.add_attribute("noalias")
    b = Builder(fn.append_basic_block("entry"))
    lanes = host_isa().lanes
    vt = vec_type(lanes)
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    zeros = ir.Constant(vt, None)
    hi = b.select(b.icmp_signed(">", hi, lo), hi, lo)

    def vectors(start: Val, end: Val, name: str, body: Callable[[Val, Val], object]) -> None:
        """``body(q, mask)`` for ``q = start, start + lanes, ...`` below ``end``, ``mask`` the lanes below it."""
        count = b.sdiv(b.add(b.sub(end, start), const(lanes - 1)), const(lanes))

        def block(j: Val) -> None:
            q = b.add(start, b.mul(j, const(lanes)))
            body(q, b.icmp_signed("<", b.add(splat(b, q, lanes), iota), splat(b, end, lanes)))

        for_range(b, 0, count, name, block, hints=NO_UNROLL)

    def fill(start: Val, end: Val, name: str) -> None:
        vectors(start, end, name, lambda q, mask: masked_store(b, zeros, fgep(b, dst, q), mask))

    def zero(q: Val) -> None:
        b.store(zeros, fgep(b, dst, q), align=4)

    def overlapping(start: Val, end: Val, name: str, write: Callable[[Val], object]) -> None:
        """``write(q)`` (a vector at ``dst + q``) over ``[start, end)`` in whole vectors, the last one
        overlapping the one before it (``end - start >= lanes``)."""
        for_range(b, 0, b.sdiv(b.sub(end, start), const(lanes)), name,
                  lambda j: write(b.add(start, b.mul(j, const(lanes)))), hints=NO_UNROLL)
        write(b.sub(end, const(lanes)))

    def ends() -> None:
        """The padding at both ends of a row at least a vector wide, as whole vectors of zeros: one from the
        row's start or to its end where the padding is narrower than a vector (the copy goes over the rest)."""
        short = const(lanes)
        if_then(b, b.icmp_signed(">", lo, const(0)), "zl", lambda: if_else(
            b, b.icmp_signed("<=", lo, short), "zl1", lambda: zero(const(0)),
            lambda: overlapping(const(0), lo, "zlv", zero)))
        if_then(b, b.icmp_signed("<", hi, w), "zr", lambda: if_else(
            b, b.icmp_signed("<=", b.sub(w, hi), short), "zr1", lambda: zero(b.sub(w, short)),
            lambda: overlapping(hi, w, "zrv", zero)))

    def one_at_a_time(start: Val, step: Val) -> None:
        def element(q: Val) -> None:
            at = b.add(b.mul(q, step), shift)
            b.store(b.load(fgep(b, src, at), typ=F32, align=4), fgep(b, dst, q), align=4)

        for_range(b, start, hi, "cp", element, hints=NO_UNROLL)

    def unit() -> None:
        def masked(q: Val, mask: Val) -> None:
            masked_store(b, masked_load_where(b, fgep(b, src, b.add(q, shift)), mask, zeros), fgep(b, dst, q), mask)

        def move(q: Val) -> None:
            b.store(b.load(fgep(b, src, b.add(q, shift)), typ=vt, align=4), fgep(b, dst, q), align=4)

        if_else(b, b.icmp_signed(">=", b.sub(hi, lo), const(lanes)), "whole",
                lambda: overlapping(lo, hi, "cp1", move),
                lambda: vectors(lo, hi, "cp1m", masked))

    def halving() -> None:
        blocks = b.sdiv(b.sub(b.sub(hi, lo), const(1)), const(lanes))
        blocks = b.select(b.icmp_signed(">", blocks, const(0)), blocks, const(0))

        def block(j: Val) -> None:
            q = b.add(lo, b.mul(j, const(lanes)))
            at = fgep(b, src, b.add(b.mul(q, const(2)), shift))
            pair = [b.load(fgep(b, at, h * lanes), typ=vt, align=4) for h in (0, 1)]
            b.store(even_lanes(b, pair[0], pair[1]), fgep(b, dst, q), align=4)

        for_range(b, 0, blocks, "cp2", block, hints=NO_UNROLL)
        one_at_a_time(b.add(lo, b.mul(blocks, const(lanes))), const(2))

    def narrow() -> None:
        fill(const(0), lo, "zlm")
        fill(hi, w, "zrm")

    if_else(b, b.icmp_signed(">=", w, const(lanes)), "wide", ends, narrow)  # the zeros first: the copy goes over them
    if_else(b, b.icmp_signed("==", stride, const(1)), "unit", unit,
            lambda: if_else(b, b.icmp_signed("==", stride, const(2)), "halving", halving,
                            lambda: one_at_a_time(lo, stride)))
    b.ret_void()
    return fn


def select_conv(op: str, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                weights: np.ndarray | None, isa: Isa) -> ConvKernel | None:
    """A conv kernel when the weights are constant and the geometry is one this schedule covers."""
    if weights is None:
        return None
    x, w, out = _static(c.lhs_type), _static(c.rhs_type), _static(c.out_type)
    nsp = len(x) - 2
    if nsp < 1 or nsp > 3:
        return None
    s, pb, _pe, d = window_params(nsp, c.attrs.get("strides", ()), c.attrs.get("pads", ()),
                                  c.attrs.get("dilations", ()))
    groups = int(c.attrs.get("groups", 1))
    geometry = ConvGeometry(x[0], x[1], w[0], groups, x[2:], out[2:], w[2:], tuple(s), tuple(pb), tuple(d))
    if any(p < 0 for p in pb):
        return None
    depthwise = geometry.cg == 1 and geometry.mg == 1 and not geometry.direct
    kind = ConvKernel if not depthwise else InPlaceDepthwiseKernel if nsp == 2 else DepthwiseKernel
    kernel = kind(op, c, in_types, out_type, np.asarray(weights), geometry, isa)
    if kernel.scratch_bytes > MAX_SCRATCH_BYTES or int(kernel.koff.max(initial=0)) + kernel.tiling.nr >= 2**31:
        return None
    return kernel


__all__ = ["ConvKernel", "DepthwiseKernel", "select_conv"]
