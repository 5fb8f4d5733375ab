"""Elementwise rules run over merged axes (cuvil.codegen.coalesce): which axes merge, that rules reading
anything but the output's own index are left alone, and that a merged rule computes the unmerged one's bits
on broadcasts of every arrangement (on the serial nest and in chunks)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import cuvil.codegen.kernels.chunked as chunked
import cuvil.codegen.lower_rule as lower_rule
from cuvil.codegen.coalesce import coalesce
from cuvil.codegen.lower_rule import op_rule
from cuvil.compiler import compile
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value

Make = Callable[[Builder, list[Value]], Value]
BROADCASTS: dict[str, tuple[list[tuple[int, ...]], Make, list[int] | None, list[list[int]] | None]] = {
    # name: operand shapes, the op, the merged output shape and operand shapes (None: nothing merges); the
    # outermost axis of more than one element is never merged (the pool splits it)
    "per channel": ([(1, 24, 7, 7), (1, 24, 1, 1)], lambda b, v: b.mul(v[0], v[1]), [24, 49], [[24, 49], [24]]),
    "same shape": ([(2, 3, 4, 5), (2, 3, 4, 5)], lambda b, v: b.add(v[0], v[1]), [2, 60], [[2, 60], [2, 60]]),
    "row vector": ([(6, 5, 3, 8), (3, 8)], lambda b, v: b.sub(v[0], v[1]), [6, 5, 24], [[6, 5, 24], [24]]),
    "scalar": ([(3, 4, 5), ()], lambda b, v: b.div(v[0], v[1]), [3, 20], [[3, 20], [1]]),
    "column": ([(4, 6, 9), (4, 6, 1)], lambda b, v: b.max(v[0], v[1]), None, None),
    "outer": ([(5, 1, 7), (1, 6, 1)], lambda b, v: b.mul(v[0], v[1]), None, None),
    "one-element dims": ([(4, 1, 5, 6), (4, 1, 5, 6)], lambda b, v: b.add(v[0], v[1]), [4, 30], [[4, 30], [4, 30]]),
    "three operands": ([(2, 8, 3, 3), (1, 8, 1, 1), (2, 8, 3, 3)],
                       lambda b, v: b.where(b.greater(v[0], v[1]), v[0], v[2]), [2, 72], [[2, 72], [2, 72], [2, 72]]),
    "unary chain": ([(3, 1, 4, 4)], lambda b, v: b.tanh(b.exp(b.neg(v[0]))), [3, 16], [[3, 16]]),
}


def _case(name: str) -> tuple[Builder, list[Value], Value]:
    shapes, make, _, _ = BROADCASTS[name]
    b = Builder()
    params = [b.param(f"x{k}", DType.f32, list(s)) for k, s in enumerate(shapes)]
    return b, params, make(b, params)


def _merged(v: Value):
    return coalesce(op_rule(v), [o.type for o in v.operands], v.type)


@pytest.mark.parametrize("name", BROADCASTS)
def test_axes_merge_where_every_operand_reads_them_together(name: str) -> None:
    *_, out_shape, in_shapes = BROADCASTS[name]
    _, _, y = _case(name)
    merged = _merged(y)
    if out_shape is None:
        assert merged is None
        return
    assert merged is not None
    _, types, out = merged
    assert list(out.shape) == out_shape
    assert [list(t.shape) for t in types] == in_shapes


def _run(name: str, merge: bool, chunks: bool, monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    shapes = BROADCASTS[name][0]
    with monkeypatch.context() as m:
        m.setattr(chunked, "MIN_STEPS", 0 if chunks else 1 << 62)
        if not merge:
            m.setattr(lower_rule, "coalesce", lambda *a: None)
            m.setattr(chunked, "coalesce", lambda *a: None)
        b, params, y = _case(name)
        lib = compile(b.module(b.function("main", params, [y])), cache=False, passes="O0", threads=2)
    rng = np.random.default_rng(len(name))
    args = [(rng.standard_normal(s) * 3).astype(np.float32) for s in shapes]
    for a in args:
        if a.size > 2:
            a.reshape(-1)[:3] = [np.nan, -0.0, np.inf]
    return [np.asarray(lib(*args))]


@pytest.mark.parametrize("chunks", [False, True], ids=["serial", "chunked"])
@pytest.mark.parametrize("name", BROADCASTS)
def test_a_merged_rule_gives_the_unmerged_bits(name: str, chunks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    merged = _run(name, True, chunks, monkeypatch)[0]
    plain = _run(name, False, chunks, monkeypatch)[0]
    nan = np.isnan(plain)
    assert np.array_equal(np.isnan(merged), nan)
    assert np.array_equal(merged[~nan].view(np.uint32), plain[~nan].view(np.uint32))


@pytest.mark.parametrize("make", [
    lambda b, x: b.transpose(x, perm=[0, 2, 1]),
    lambda b, x: b.reduce_sum(x, axes=[2], keepdims=True),
    lambda b, x: b.pad(x, pads=[0, 0, 1, 0, 0, 1]),
    lambda b, x: b.slice(x, starts=[0, 1, 0], ends=[2, 3, 4], steps=[1, 1, 1]),
    lambda b, x: b.softmax(x, axis=2),
], ids=["transpose", "reduce", "pad", "slice", "softmax"])
def test_rules_that_read_other_indices_are_left_alone(make: Make) -> None:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3, 4])
    assert _merged(make(b, x)) is None
