"""Constant operands of one repeated value are read as immediates by the rule lowering
(cuvil.codegen.lower_rule.scalar_operands).

An immediate lets LLVM fold what depends on it (a ``pow``'s exponent picks its path at compile time). It must
change nothing else: each op gives the bits it gives when the same data arrives as a run-time input, on the
serial nest and in chunks; only constants whose elements are bit for bit one value count (not 0.0 beside
-0.0, not NaNs of two payloads); a read that may fall outside the operand still checks its index.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import cuvil.codegen.kernels.chunked as chunked
import cuvil.codegen.kernels.gemm as gemm
from cuvil.codegen.lower_rule import SCALAR_OPERAND_LIMIT, scalar_operands
from cuvil.compiler import compile
from cuvil.errors import RuntimeEvalError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

RNG = np.random.default_rng(31)
X = (RNG.standard_normal((6, 50)) * 3).astype(np.float32)
X[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]

Op = Callable[[Builder, Value, Value], Value]
CASES: dict[str, tuple[np.ndarray, Op]] = {
    "add 0.5": (np.full((1,), 0.5, np.float32), lambda b, x, c: b.add(x, c)),
    "mul -0.0 row": (np.full((50,), -0.0, np.float32), lambda b, x, c: b.mul(x, c)),
    "pow 3": (np.full((1, 1), 3.0, np.float32), lambda b, x, c: b.pow(x, c)),
    "pow -0.5": (np.full((1,), -0.5, np.float32), lambda b, x, c: b.pow(x, c)),
    "pow 1.7": (np.full((1,), 1.7, np.float32), lambda b, x, c: b.pow(x, c)),
    "div full shape": (np.full((6, 50), 1.0, np.float32), lambda b, x, c: b.div(c, x)),
    "max NaN": (np.full((1,), np.nan, np.float32), lambda b, x, c: b.max(x, c)),
    "where true": (np.full((1,), True), lambda b, x, c: b.where(c, x, b.neg(x))),
    "int add": (np.full((1,), 7, np.int32), lambda b, x, c: b.add(b.cast(x, to=DType.i32), c)),
    "f16 add": (np.full((1,), 0.1, np.float16), lambda b, x, c: b.add(b.cast(x, to=DType.f16), c)),
}


def _module(case: str, as_constant: bool):
    data, op = CASES[case]
    b = Builder()
    x = b.param("x", DType.f32, list(X.shape))
    params = [x]
    if as_constant:
        c = b.const(data)
    else:
        c = b.param("c", DType.from_numpy(data.dtype), list(data.shape))
        params.append(c)
    return b.module(b.function("main", params, [op(b, x, c)])), b, c


def _bits(a: np.ndarray) -> np.ndarray:
    """Bits, with every NaN one NaN (CIR's exactness reads any NaN as any NaN)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.array(np.nan, a.dtype), a)
    return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("chunks", [False, True], ids=["serial", "chunked"])
@pytest.mark.parametrize("case", CASES)
def test_an_immediate_gives_the_bits_of_a_loaded_operand(case: str, chunks: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunked, "MIN_STEPS", 0 if chunks else 1 << 62)
    monkeypatch.setattr(gemm, "PARALLEL_MIN_FLOPS", 0)
    module, b, c = _module(case, True)
    user = module.main.results[0]
    found = scalar_operands(user, b.constants)
    assert list(found) == [list(user.operands).index(c)]
    data = CASES[case][0]
    assert _bits(np.array(list(found.values()), data.dtype)) == _bits(data.reshape(-1)[:1])
    folded = compile(module, cache=False, passes="O0", threads=2)(X)
    loaded = compile(_module(case, False)[0], cache=False, passes="O0", threads=2)(X, CASES[case][0])
    assert np.array_equal(_bits(folded), _bits(loaded))


def _operands_of(data: np.ndarray) -> dict[int, float | int | bool]:
    b = Builder()
    x = b.param("x", DType.from_numpy(data.dtype), list(data.shape))
    return scalar_operands(b.add(x, b.const(data)), b.constants)


def test_only_constants_of_one_bit_pattern_are_immediates() -> None:
    quiet, payload = np.array([0x7FC00000, 0x7FC00001], dtype=np.uint32).view(np.float32)
    assert _operands_of(np.array([2.5, 2.5, 2.5], np.float32)) == {1: 2.5}
    assert _operands_of(np.array([0.0, -0.0], np.float32)) == {}
    assert _operands_of(np.array([-0.0, -0.0], np.float32)) == {1: -0.0}
    assert np.isnan(_operands_of(np.array([quiet, quiet], np.float32))[1])
    assert _operands_of(np.array([quiet, payload], np.float32)) == {}
    assert _operands_of(np.array([1.0, 1.0, 2.0], np.float32)) == {}
    assert _operands_of(np.full(SCALAR_OPERAND_LIMIT, 4, np.int64)) == {1: 4}
    assert _operands_of(np.full(SCALAR_OPERAND_LIMIT + 1, 4, np.int64)) == {}


def test_a_read_that_may_fall_outside_still_checks_its_index() -> None:
    b = Builder()
    idx = b.param("idx", DType.i64, [4, 5])
    out = b.gather_elements(b.const(np.full((4, 8), 1.5, np.float32)), idx, axis=1)
    assert scalar_operands(out, b.constants) == {0: 1.5}
    lib = compile(b.module(b.function("main", [idx], [out])), cache=False, passes="O0")
    good = RNG.integers(0, 8, (4, 5)).astype(np.int64)
    assert np.array_equal(np.asarray(lib(good)), np.full((4, 5), 1.5, np.float32))
    good[3, 4] = 8
    with pytest.raises(RuntimeEvalError):
        lib(good)
