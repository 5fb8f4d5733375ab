"""bitcast in compiled code: the library reads the same bits the interpreter's numpy views do, bit for
bit, over every float class (signed zeros, subnormals, infinities, quiet and signaling NaNs with
payloads) and random words, at several optimization levels. Half-precision values live in f32
registers, where the hardware quiets a signaling NaN; their bits must still come out unchanged."""

from __future__ import annotations

import functools
import tempfile

import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.ops.elementwise import _float_bits

FLOAT_PAIRS = [(DType.f32, DType.i32), (DType.f32, DType.u32), (DType.f64, DType.i64), (DType.f64, DType.u64),
               (DType.f16, DType.i16), (DType.f16, DType.u16), (DType.bf16, DType.i16), (DType.bf16, DType.u16),
               (DType.f16, DType.bf16), (DType.bf16, DType.f16)]


def _word(dt: DType) -> DType:
    return DType.from_numpy(np.dtype(f"u{dt.bits // 8}"))


def _words(dt: DType) -> np.ndarray:
    """Every float class of ``dt`` and random words, as unsigned words of its width, shape (3, 12)."""
    ints = np.dtype(f"u{dt.bits // 8}")
    rand = np.random.default_rng(dt.bits).integers(0, np.iinfo(ints).max, 24, dtype=np.uint64,
                                                   endpoint=True).astype(ints)
    return np.concatenate([_float_bits(dt).view(ints).reshape(-1), rand]).reshape(3, 12)


def _model() -> tuple[Module, list[np.ndarray]]:
    """Each float pair both ways, a round trip inside one function (a float read from its bits and
    read back), a float stored straight from its bits, bools as bytes and ints of the other sign."""
    b = Builder()
    params, inputs, results = [], [], []
    for k, (flt, other) in enumerate(FLOAT_PAIRS):
        words = _words(flt)
        x = b.param(f"x{k}", flt, words.shape)
        w = b.param(f"w{k}", _word(flt), words.shape)
        params += [x, w]
        inputs += [words.view(flt.np), words]
        results += [b.bitcast(x, to=other), b.bitcast(w, to=flt),
                    b.bitcast(b.bitcast(w, to=flt), to=other if not other.is_float else _word(flt))]
    z = b.param("z", DType.bool, (5,))
    s = b.param("s", DType.i8, (2, 5))
    params += [z, s]
    inputs += [np.array([True, False, True, True, False]),
               np.array([[0, 1, -1, 127, -128], [5, -5, 64, -64, 2]], dtype=np.int8)]
    results += [b.bitcast(z, to=DType.u8), b.bitcast(z, to=DType.i8), b.bitcast(s, to=DType.u8)]
    fn = b.function("main", params, results, [f"r{k}" for k in range(len(results))])
    return b.module(fn), inputs


@functools.cache
def _reference() -> list[np.ndarray]:
    module, inputs = _model()
    return run_reference(module, inputs)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


@pytest.mark.parametrize("opt_level", [0, 2])
def test_compiled_bitcast_matches_the_interpreter_bit_for_bit(opt_level: int) -> None:
    module, inputs = _model()
    with tempfile.TemporaryDirectory(prefix="cuvil-bitcast-") as tmp:
        got = compile(module, output_dir=tmp, opt_level=opt_level).run(inputs)
    for k, (g, want) in enumerate(zip(got, _reference(), strict=True)):
        assert g.dtype == want.dtype and g.shape == want.shape, k
        got_bits, want_bits = _bits(g).reshape(-1), _bits(want).reshape(-1)
        bad = np.flatnonzero(got_bits != want_bits)
        assert bad.size == 0, f"result {k}: got {got_bits[bad[:4]]}, want {want_bits[bad[:4]]}"


def test_the_reference_is_numpy_views() -> None:
    """What the comparison above holds the library to: the inputs' bits, unchanged."""
    _, inputs = _model()
    want = _reference()
    for k, (_, other) in enumerate(FLOAT_PAIRS):
        x, w = inputs[2 * k], inputs[2 * k + 1]
        assert np.array_equal(_bits(want[3 * k]), _bits(x.view(other.np)))
        assert np.array_equal(_bits(want[3 * k + 1]), w)
        assert np.array_equal(_bits(want[3 * k + 2]), w)


def test_a_scalar_bitcast_compiles() -> None:
    b = Builder()
    x = b.param("x", DType.f32, ())
    module = b.module(b.function("main", [x], [b.bitcast(x, to=DType.i32)], ["y"]))
    with tempfile.TemporaryDirectory(prefix="cuvil-bitcast-") as tmp:
        (y,) = compile(module, output_dir=tmp).run([np.array(-0.0, np.float32)])
    assert y.dtype == np.int32 and int(y) == np.int32(-(1 << 31))
