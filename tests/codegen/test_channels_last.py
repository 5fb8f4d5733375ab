"""Activations kept channels-last between convolutions (``cuvil.codegen.activation_layout``).

A layout is a choice of where the elements live, never of what they are: a library built with the channels-last
layouts must compute every output bit for bit as the one built without them, and as the rule says. The random
graphs chain convolutions of every geometry the position-row schedule takes (strides, paddings, dilations,
widths that are not a vector's multiple, batches) with residual adds, ReLUs, max pools (which read row-major and
may store channels-last), readers that need the row-major layout (a max pool, a 1x1 convolution read in place),
values read twice and values that are also outputs, on one and two threads, and each library runs twice (the
padding a producer writes must be rewritten on every run, in arena memory other values share). The rule tests
name the layout each kernel takes in the cases that decide it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cuvil.codegen.activation_layout as layout
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from tests.codegen.test_kernels import assert_close
from tests.oracles import rule_reference

CONVS: list[dict[str, Any]] = [
    {"k": 3, "pads": 1}, {"k": 3, "pads": 1}, {"k": 3, "pads": 1, "strides": 2}, {"k": 1, "strides": 2},
    {"k": 5, "pads": 2}, {"k": 3, "pads": 2, "dilations": 2}, {"k": 3, "pads": 0}, {"k": 3, "pads": 1, "bias": 0},
]
"""Convolution geometries the random graphs draw from (the first, most common one twice)."""

POOLS: list[dict[str, Any]] = [
    {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)},
    {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
    {"kernel": (2, 2), "strides": (2, 2), "pads": (0, 0, 0, 0)},
    {"kernel": (3, 2), "strides": (1, 2), "pads": (0, 1, 2, 0)},
]
"""Max pool windows the random graphs draw from (ResNet's stem pool second)."""


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


class Graph:
    def __init__(self, rng: np.random.Generator, shape: tuple[int, ...]) -> None:
        self.rng = rng
        self.b = Builder()
        self.x = self.b.param("x", DType.f32, shape)
        self.results: list[Value] = []

    def conv(self, v: Value, c_out: int, k: int = 3, pads: int = 0, strides: int = 1, dilations: int = 1,
             bias: int = 1, relu: bool = True, residual: Value | None = None) -> Value:
        c_in = int(v.type.shape[1])
        w = self.b.const(_f32(self.rng, c_out, c_in, k, k, scale=(c_in * k * k) ** -0.5))
        y = self.b.conv(v, w, pads=(pads,) * 4, strides=(strides,) * 2, dilations=(dilations,) * 2)
        if bias:
            y = self.b.add(y, self.b.const(_f32(self.rng, c_out, 1, 1, scale=0.1)))
        if residual is not None:
            y = self.b.add(y, residual)
        return self.b.relu(y) if relu else y

    def module(self) -> Module:
        names = [f"r{i}" for i in range(len(self.results))]
        return self.b.module(Function("main", (self.x,), tuple(self.results), tuple(names)))


def _random_graph(seed: int) -> tuple[Module, list[np.ndarray]]:
    """A chain of convolutions (the first two always a same-size pair, often then a max pool) with residual adds
    where shapes allow, now and then a max pool, a 1x1 convolution, a value read twice or an intermediate output."""
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([1, 2]))
    side = int(rng.choice([7, 9, 12, 14]))
    width = int(rng.choice([16, 37, 48, 64]))
    g = Graph(rng, (batch, width, side, side))
    v = g.conv(g.x, width, pads=1)
    v = g.conv(v, width, pads=1, relu=bool(rng.integers(2)))
    live = [g.x, v]
    if rng.random() < 0.6:  # a pool that convolutions and their residuals read (ResNet's stem pool)
        v = g.b.max_pool(v, **POOLS[int(rng.integers(len(POOLS)))])
        live.append(v)
    for _ in range(int(rng.integers(3, 7))):
        roll = rng.random()
        if roll < 0.2 and int(v.type.shape[2]) >= 6:  # reads row-major; may store channels-last
            v = g.b.max_pool(v, **POOLS[int(rng.integers(len(POOLS)))])
        elif roll < 0.3:  # a 1x1 convolution reads its input in place
            v = g.conv(v, int(rng.choice([16, 40])), k=1)
        elif roll < 0.4:
            g.results.append(v)  # an intermediate output
        else:
            geometry = dict(CONVS[int(rng.integers(len(CONVS)))])
            c_out = int(rng.choice([16, 37, 64, 80]))
            if int(v.type.shape[2]) < 5:
                geometry = {"k": 3, "pads": 1}
            y_type_matches = [u for u in live if tuple(u.type.shape) == (batch, c_out, *v.type.shape[2:])]
            residual = None
            if geometry.get("strides", 1) == 1 and geometry["k"] == 2 * geometry.get("pads", 0) // \
                    geometry.get("dilations", 1) + 1 and y_type_matches and rng.random() < 0.6:
                residual = y_type_matches[int(rng.integers(len(y_type_matches)))]
            other = v
            v = g.conv(v, c_out, residual=residual, **geometry)
            if rng.random() < 0.15 and int(other.type.shape[2]) >= 3:  # the same input read by a second conv
                g.results.append(g.conv(other, 16, pads=1))
        live.append(v)
    g.results.append(v)
    return g.module(), [_f32(rng, batch, width, side, side), _f32(rng, batch, width, side, side)]


def _build(module: Module, channels_last: bool, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Any:
    with monkeypatch.context() as m:
        m.setattr(layout, "CHANNELS_LAST", channels_last)
        return compile(module, cache=False, **options)


def _same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(g.shape == w.shape and np.array_equal(g.view(np.uint32), w.view(np.uint32))
               for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_random_conv_graphs_compute_the_same_bits(seed: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    module, inputs = _random_graph(seed)
    last = _build(module, True, monkeypatch, threads=threads)
    rows = _build(module, False, monkeypatch, threads=threads)
    kernels = last.manifest["kernels"]
    assert any("last" in k for k in kernels), kernels  # the first pair at least
    assert not any(_suffix(k) for k in rows.manifest["kernels"])
    for x in inputs:  # two runs: the padding written in the first must not be what the second reads
        got, want = last.run([x]), rows.run([x])
        assert _same_bits(got, want), (seed, kernels)
        for g, w in zip(got, rule_reference(module, [x]), strict=True):
            assert_close(g, w, 64 * 25, f"seed {seed}")


def _kernels(module: Module, monkeypatch: pytest.MonkeyPatch, threads: int = 1) -> list[str]:
    """The tuned kernels' names in run order, after checking the library against the row-major one."""
    x = np.random.default_rng(5).standard_normal(module.functions[0].params[0].type.shape).astype(np.float32)
    last = _build(module, True, monkeypatch, threads=threads)
    rows = _build(module, False, monkeypatch, threads=threads)
    assert _same_bits(last.run([x]), rows.run([x]))
    return [k for k in last.manifest["kernels"] if k.startswith("conv.")]


def _suffix(name: str) -> str:
    """The layout part of a conv kernel's name: '' (row-major), 'olast', 'xlast.xpad', ..."""
    parts = name.split(".")
    return ".".join(p for p in parts if p.endswith(("last", "pad")))


@pytest.mark.parametrize("padded", [True, False])
def test_a_pair_at_stride_one_shares_the_padded_layout(padded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each conv of a chain is its successor's one reader: it stores into the successor's padded layout (or,
    with that off, channels-last, and the successor copies it into its padding)."""
    monkeypatch.setattr(layout, "PADDED_OUTPUTS", padded)
    g = Graph(np.random.default_rng(1), (2, 32, 14, 14))
    g.results.append(g.conv(g.conv(g.conv(g.x, 32, pads=1), 32, pads=1), 32, pads=1))
    want = ["olast.opad", "xolast.xopad", "xlast.xpad"] if padded else ["olast", "xolast", "xlast"]
    assert [_suffix(k) for k in _kernels(g.module(), monkeypatch)] == want


def test_what_stays_row_major(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output, a max pool's or a 1x1 convolution's input, and so the producers of those, are row-major; a
    stride-2 reader or a second reader takes the value channels-last but copies it into its own padding."""
    g = Graph(np.random.default_rng(2), (1, 32, 14, 14))
    a = g.conv(g.x, 32, pads=1)
    g.results.append(a)  # an output: row-major
    b = g.conv(a, 32, pads=1)
    g.results.append(g.b.max_pool(b, kernel=(2, 2), strides=(2, 2)))  # a max pool reads b: row-major
    c = g.conv(b, 32, pads=1)
    g.results.append(g.conv(c, 32, k=1))  # read in place by a 1x1: row-major
    d = g.conv(c, 32, pads=1)
    g.results.append(g.conv(d, 32, pads=1, strides=2))  # a stride-2 reader: channels-last, its own copy
    g.results.append(g.conv(d, 32, pads=1))  # ... and a second reader
    assert [_suffix(k) for k in _kernels(g.module(), monkeypatch)] == ["", "", "", "", "olast", "xlast", "xlast"]


def test_a_residual_takes_the_layout_of_the_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """An epilogue reads a residual at the output element's own place, so a residual and the output it is added
    to share one layout: from a row-major block input both stay row-major; where the residual is channels-last
    the output is too, and a producer whose epilogue reads a residual stores no padded layout."""
    g = Graph(np.random.default_rng(3), (1, 32, 9, 9))
    x0 = g.b.relu(g.x)  # a rule nest's value: row-major
    a = g.conv(g.conv(x0, 32, pads=1), 32, pads=1, residual=x0)  # a row-major residual: a row-major output
    b = g.conv(a, 32, pads=1)
    c = g.conv(g.conv(b, 32, pads=1), 32, pads=1, residual=b)  # a channels-last residual
    g.results.append(g.conv(c, 32, pads=1))
    assert [_suffix(k) for k in _kernels(g.module(), monkeypatch)] == [
        "olast.opad", "xlast.xpad", "olast", "xolast.opad", "xolast.xpad", "xlast"]


def test_two_threads_read_bands_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """On two threads a large plane's convolutions run in bands, each copying its own rows: channels-last
    still, without the shared padded layout."""
    g = Graph(np.random.default_rng(4), (1, 64, 56, 56))
    g.results.append(g.conv(g.conv(g.conv(g.x, 64, pads=1), 64, pads=1), 64, pads=1))
    names = _kernels(g.module(), monkeypatch, threads=2)
    assert all(".b" in k for k in names), names
    assert [_suffix(k) for k in names] == ["olast", "xolast", "xlast"]


def test_a_producer_in_bands_stores_channels_last_for_a_reader_that_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    """On two threads a convolution that runs in bands, read by one that would take the shared padded layout
    (stride 1, one copy of its plane, not in bands itself), stores plain channels-last and its reader copies it:
    the padded store is made for a whole plane's tiles (it was once asked of a producer in bands, and failed)."""
    g = Graph(np.random.default_rng(6), (2, 3, 14, 24))
    w1 = g.b.const(_f32(g.rng, 16, 3, 7, 7, scale=0.1))
    a = g.b.relu(g.b.conv(g.x, w1, pads=(6, 5, 6, 5), strides=(1, 1), dilations=(2, 2)))
    w2 = g.b.const(_f32(g.rng, 48, 16, 5, 5, scale=0.05))
    g.results.append(g.b.conv(a, w2, pads=(1, 3, 1, 3), strides=(1, 1), dilations=(2, 2)))
    names = _kernels(g.module(), monkeypatch, threads=2)
    assert ".b" in names[0] and ".b" not in names[1], names
    assert [_suffix(k) for k in names] == ["olast", "xlast"]


@pytest.mark.parametrize("side, width, batch", [(5, 80, 1), (7, 128, 2), (7, 80, 1), (4, 256, 1)])
def test_taps_past_the_plane_read_zeros(side: int, width: int, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last position's taps read a column past its plane row's end (rows share their padding columns), a
    whole position: on small planes of wide channels more floats than the tiles' slack. The copy's slack holds
    a position of zeros; reading garbage there changed outputs of a 7x7 plane of 128 channels."""
    g = Graph(np.random.default_rng(side * width), (batch, width, side, side))
    g.results.append(g.conv(g.conv(g.conv(g.x, width, pads=1), width, pads=1, relu=False), width, pads=1))
    module = g.module()
    x = _f32(np.random.default_rng(0), batch, width, side, side)
    got = _build(module, True, monkeypatch).run([x])
    assert _same_bits(got, _build(module, False, monkeypatch).run([x]))
    for gv, w in zip(got, rule_reference(module, [x]), strict=True):
        assert_close(gv, w, width * 9, f"{side}x{side}x{width}")


def _layouts(module: Module, monkeypatch: pytest.MonkeyPatch, x: np.ndarray) -> list[str]:
    """Every tuned kernel's name in run order, after checking the library against the row-major one on ``x``."""
    last = _build(module, True, monkeypatch)
    assert _same_bits(last.run([x]), _build(module, False, monkeypatch).run([x]))
    return [k for k in last.manifest["kernels"] if k != "view"]


def _pool_graph(width: int, read_by: str) -> Graph:
    """A stride-2 max pool read by a pair of convolutions (the second adding the pool as its residual, ResNet's
    first block) and, per ``read_by``, by nothing else, by the function's outputs, or by a 1x1 convolution."""
    g = Graph(np.random.default_rng(width), (2, width, 15, 15))
    p = g.b.max_pool(g.x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g.results.append(g.conv(g.conv(g.conv(p, width, pads=1), width, pads=1, residual=p), width, pads=1))
    if read_by == "output":
        g.results.append(p)
    elif read_by == "1x1":
        g.results.append(g.conv(p, 16, k=1))
    return g


@pytest.mark.parametrize("width, read_by, pool", [
    (32, "", "max_pool.rows.olast"), (64, "", "max_pool.rows.olast"), (24, "", "max_pool.rows"),
    (32, "output", "max_pool.rows"), (32, "1x1", "max_pool.rows")])
def test_a_max_pool_stores_channels_last_for_convolutions(width: int, read_by: str, pool: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A max pool reads row-major and stores channels-last, whole groups of 16 channels at a time, where every
    reader is a position-row convolution (its input, or the residual of a channels-last sum), and the block it
    feeds is then channels-last from its start; read otherwise (an output, a 1x1 convolution), or of channels
    that are no whole groups, it stays row-major, and so do the sums that add it."""
    g = _pool_graph(width, read_by)
    names = _layouts(g.module(), monkeypatch, _f32(np.random.default_rng(1), 2, width, 15, 15))
    assert names[0] == pool
    convs = [_suffix(k) for k in names if k.startswith("conv.") and ".t." in k][:3]
    want = ["xolast.opad", "xolast.xpad", "xlast"] if pool.endswith("olast") else ["olast.opad", "xlast.xpad", ""]
    assert convs == want


def test_a_channels_last_pool_keeps_the_first_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The channels-last pool folds each window as the row-major one does: NaNs of distinct payloads in one
    window (the first in the rule's order is kept and reaches the convolutions' sums), ties of signed zeros and
    -inf rows; the library's outputs are those of the row-major build bit for bit."""
    g = _pool_graph(32, "")
    x = np.zeros((2, 32, 15, 15), np.float32)
    x[:, ::2] = -0.0
    x[0, 3] = -np.inf
    bits = x.view(np.uint32)
    for at, payload in (((0, 5, 4, 4), 0x7FC00001), ((0, 5, 4, 5), 0x7FC00002), ((1, 7, 0, 0), 0xFFC00003),
                        ((1, 7, 1, 0), 0x7FC00004)):
        bits[at] = payload
    names = _layouts(g.module(), monkeypatch, x)
    assert names[0] == "max_pool.rows.olast"
