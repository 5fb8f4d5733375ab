"""Rule nests run in chunks of their outermost loop on the thread pool (cuvil.codegen.kernels.chunked).

Chunking only changes which thread writes an output element: every op must give the serial nest's bits,
whatever its rule reads (windows, gathers, broadcasts, reductions along any axis), and an index error
raised inside a chunk must reach the caller. A rule whose reduction would run once per chunk instead of
once per call is not cut at all.
"""

from __future__ import annotations

import numpy as np
import pytest
from codegen_catalogue import OpCall, batches, cases_of, ops_module
from llvmlite import ir

import cuvil.codegen.kernels.chunked as chunked
import cuvil.codegen.kernels.gemm as gemm
from cuvil.codegen.lower_rule import RuleKernel
from cuvil.compiler import compile
from cuvil.errors import RuntimeEvalError
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch):
    """Every static rule nest chunked, and every chunked phase on the pool, however small."""
    monkeypatch.setattr(chunked, "MIN_STEPS", 0)
    monkeypatch.setattr(gemm, "PARALLEL_MIN_FLOPS", 0)


def _library(ops: list[OpCall], threads: int):
    return compile(ops_module(ops, "main")[0], cache=False, passes="O0", threads=threads)


def _run(ops: list[OpCall], threads: int) -> list[np.ndarray]:
    return [np.asarray(r) for r in _library(ops, threads).run(ops_module(ops, "main")[1])]


def _serial(ops: list[OpCall], monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    with monkeypatch.context() as m:
        m.setattr(chunked, "MIN_STEPS", 1 << 62)
        return _run(ops, 1)


def _same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Bit for bit, except that any NaN equals any NaN, as CIR's exactness reads: a NaN's sign and payload
    follow the operand order the vectorizer picks (silu of a NaN: 0xfe00 in chunks, 0x7e00 serially)."""
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        g, w = g.reshape(-1).copy(), w.reshape(-1).copy()
        if g.dtype.kind == "f" or g.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            nan = np.isnan(g.astype(np.float32))
            assert np.array_equal(nan, np.isnan(w.astype(np.float32))), k
            g[nan] = w[nan] = 0
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), k


def _ops() -> list[OpCall]:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 17, 19)).astype(np.float32)
    return [
        ("max_pool", [x[:, :, 0]], {"kernel": [3], "strides": [2], "pads": [1, 1]}),  # 1-D: 2-D has a kernel
        ("avg_pool", [x[:, :, 1]], {"kernel": [3], "strides": [1], "pads": [2, 1]}),  # 1-D, as max_pool
        ("transpose", [x], {"perm": [3, 1, 0, 2]}),
        ("reduce_sum", [x], {"axes": [0, 2], "keepdims": True}),  # reductions along an outer axis
        ("reduce_max", [x], {"axes": [3], "keepdims": False}),
        ("argmax", [x], {"axis": 1}),
        ("lrn", [x], {"size": 3}),
        ("add", [x, rng.standard_normal((6, 1, 19)).astype(np.float32)], {}),
        ("gather", [x, rng.integers(-17, 17, (5, 3)).astype(np.int64)], {"axis": 2}),
        ("cumsum", [x], {"axis": 3}),
        ("pad", [x], {"pads": [0, 1, 2, 3, 1, 0, 0, 2], "mode": "reflect"}),
        ("reduce_prod", [rng.standard_normal((1, 1, 37, 5)).astype(np.float32)], {"axes": [2]}),  # one outer step
        ("neg", [rng.standard_normal((517, 3)).astype(np.float32)], {}),  # more outer steps than chunks
    ]


def test_chunked_ops_give_the_serial_bits_on_two_threads(forced, monkeypatch):
    ops = _ops()
    emitted = []
    emit = chunked.ChunkedRuleKernel.emit
    monkeypatch.setattr(chunked.ChunkedRuleKernel, "emit", lambda self, *a: emitted.append(self.op) or emit(self, *a))
    lib = _library(ops, 2)
    assert sorted(emitted) == sorted(name for name, _, _ in ops)
    assert set(lib.manifest["kernels"]) == {"rule"}  # the rule nests: only where they run changes
    _same_bits([np.asarray(r) for r in lib.run(ops_module(ops, "main")[1])], _serial(ops, monkeypatch))


def test_an_index_error_inside_a_chunk_reaches_the_caller(forced):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 40)).astype(np.float32)
    idx = rng.integers(0, 40, (8, 30)).astype(np.int64)
    ops = [("gather_elements", [x, idx], {"axis": 1})]
    np.testing.assert_array_equal(_run(ops, 2)[0], np.take_along_axis(x, idx, axis=1))
    idx[6, 29] = 40  # the last chunk's last element
    with pytest.raises(RuntimeEvalError):
        _run([("gather_elements", [x, idx], {"axis": 1})], 2)


def _axis(rule: R.Expr, shape: list[int]) -> int | None:
    t = TensorType(DType.f32, shape)
    kernel = RuleKernel(ir.Module(), "k", rule, [t], t, "test", chunked=True)
    kernel.emit()
    return kernel.chunk_axis


def test_a_reduction_that_chunks_would_repeat_keeps_the_nest_whole():
    def x(i: R.Ix, j: R.Ix) -> R.Expr:
        return R.Load(DType.f32, 0, (i, j))

    i0, i1 = R.Ix.var("i0"), R.Ix.var("i1")
    whole = R.reduce("sum", [4, 8], x)  # over the whole input: once per call
    rows = R.reduce("sum", [8], lambda b: x(i0, b))
    cols = R.reduce("sum", [4], lambda a: x(a, i1))
    assert _axis(x(i0, i1) / whole, [4, 8]) is None
    assert _axis(x(i0, i1) / rows, [4, 8]) == 0
    assert _axis(x(i0, i1) / cols, [4, 8]) == 1  # its loop goes outermost
    assert _axis(x(i0, i1) / rows, [1, 8]) is None  # the row sum sits outside the only loop of more than one step
    assert _axis(x(i0, i1) * 2.0, [1, 8]) == 1


FLAT_BATCHES = {name: [op for op in ops if not op.structured] for name, ops in batches().items()}
"""The catalogue's batches without loop and cond (their regions are emitted by the structured lowering)."""


@pytest.mark.parametrize("batch", sorted(name for name, ops in FLAT_BATCHES.items() if ops))
def test_every_catalogue_op_in_chunks_gives_the_serial_bits(batch, forced, monkeypatch):
    """Every catalogue example, in batches of one op family, on two threads against one."""
    ops = [(c.op.name, c.arrays, c.attrs) for op in FLAT_BATCHES[batch] for c in cases_of(op) if c.skip is None]
    assert ops
    _same_bits(_run(ops, 2), _serial(ops, monkeypatch))
