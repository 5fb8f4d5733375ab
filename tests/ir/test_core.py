"""Core CIR invariants: hash-consing, symbolic dims, builder checks, rule vs fast path."""

import numpy as np
import pytest

from cuvil.errors import OpDefinitionError, ShapeError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from cuvil.ir.symbolic import parse_dim


def test_values_are_hash_consed():
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    assert b.relu(x) is b.relu(x)
    assert b.add(x, x) is b.add(x, x)
    assert b.relu(x) is not b.relu(b.add(x, x))


def test_float_attrs_keep_signed_zero_and_bool_distinct():
    from cuvil.ir.values import attr_key

    assert attr_key(0.0) != attr_key(-0.0)
    assert attr_key(1) != attr_key(True)
    assert attr_key(float("nan")) == attr_key(float("nan"))


def test_symbolic_dims_canonicalize():
    n = sym("N")
    assert (n * 3) // n == 3
    assert (2 * n + 2) // 2 == n + 1
    assert n + 1 - 1 == n
    assert parse_dim(str((n - 3) // 2 + 1)) == (n - 3) // 2 + 1
    assert (n * 8) % 8 == 0


def test_builder_rejects_bad_attrs_and_shapes():
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    with pytest.raises(OpDefinitionError):
        b.transpose(x)
    with pytest.raises(OpDefinitionError):
        b.transpose(x, perm=[1, 0], bogus=1)
    with pytest.raises(ShapeError):
        b.matmul(x, x)


def test_symbolic_function_runs_at_several_shapes():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 4])
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = b.relu(b.matmul(x, b.const(w), transpose_b=True))
    m = b.module(b.function("main", [x], [b.reduce_sum(y, axes=[1])]))
    for rows in (1, 5):
        xv = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
        (out,) = run_reference(m, [xv])
        np.testing.assert_allclose(out, np.maximum(xv @ w.T, 0).sum(1), rtol=1e-6)
