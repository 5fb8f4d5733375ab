"""The witness search tries, after each ascent, the corner of the box its point leans towards: every float
element at the face on its side of the box's middle, integer inputs and middle elements unchanged."""

from __future__ import annotations

import numpy as np

from cuvil.ir import Builder, DType
from verify.probe.bounds import BoundsEngine
from verify.probe.program import reduced_program
from verify.probe.witness import Searcher


def test_a_point_is_pushed_to_the_corner_it_leans_towards() -> None:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    ids = b.param("ids", DType.i64, [2])
    y = b.add(b.reduce_sum(x, axes=(1,)), b.cast(ids, to=DType.f32))
    program = reduced_program(b.module(b.function("main", [x, ids], [y])), "fp16")
    engine = BoundsEngine(program.function, program.module.constants)
    boxes = {"x": (np.array([[-1.0, 0.0, 2.0]]), np.array([[1.0, 4.0, 3.0]])), "ids": (0.0, 9.0)}
    searcher = Searcher(program, engine, boxes)
    point = {"x": np.array([[0.3, 2.0, 2.1], [-0.2, 3.9, 2.5]]), "ids": np.array([3, 7])}
    got = searcher._cornered(point)
    np.testing.assert_array_equal(got["x"], [[1.0, 2.0, 2.0], [-1.0, 4.0, 2.5]])
    np.testing.assert_array_equal(got["ids"], [3, 7])
