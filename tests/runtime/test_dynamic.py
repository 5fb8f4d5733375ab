"""Symbolic dims at run time: one specialization per shape signature, kept in memory and
in the cache; shapes outside the constraints are errors, not crashes."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_models import scaled_softmax, softmax_module

import cuvil.compiler.job as compile_job
from cuvil.compiler import compile
from cuvil.errors import CodegenError, ConstraintError, InputError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.types import DimConstraint


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The specialized dims of every library built in this process."""
    seen: list[dict] = []
    real = compile_job.build_library

    def counting(fn, constants, out_dir, **kwargs):
        seen.append(dict(kwargs.get("extra_manifest", {}).get("specialized_dims", {})))
        return real(fn, constants, out_dir, **kwargs)

    monkeypatch.setattr(compile_job, "build_library", counting)
    return seen


def _x(rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((rows, 8)).astype(np.float32)


def test_specializes_once_per_shape_signature(builds, rng):
    model = compile(softmax_module("N"))
    assert model.is_dynamic and model.library_path is None and builds == []
    x5, x7 = _x(5, rng), _x(7, rng)
    np.testing.assert_allclose(model(x5), scaled_softmax(x5), rtol=1e-5, atol=1e-7)
    again = _x(5, rng) * 2  # the same signature: no rebuild
    np.testing.assert_allclose(model(again), scaled_softmax(again), rtol=1e-5, atol=1e-7)
    assert builds == [{"N": 5}]
    np.testing.assert_allclose(model(x7), scaled_softmax(x7), rtol=1e-5, atol=1e-7)
    assert builds == [{"N": 5}, {"N": 7}]
    assert set(model.specializations) == {(("N", 5),), (("N", 7),)}
    assert model.manifest["specialized_dims"] == {"N": 7}
    assert model.manifest["inputs"][0]["shape"] == [7, 8]


def test_specializations_are_reused_from_disk(builds, rng):
    first = compile(softmax_module("N"))
    first(_x(3, rng))
    first(_x(6, rng))
    assert len(builds) == 2
    second = compile(softmax_module("N"))
    x6 = _x(6, rng)
    np.testing.assert_allclose(second(x6), scaled_softmax(x6), rtol=1e-5, atol=1e-7)
    second(_x(3, rng))
    assert len(builds) == 2
    assert second.cache_info["cache"] == "hit"


def test_example_inputs_specialize_ahead(builds, rng):
    model = compile(softmax_module("N"), example_inputs=[_x(4, rng)])
    assert builds == [{"N": 4}] and model.library_path is not None
    x2 = _x(2, rng)
    np.testing.assert_allclose(model(x2), scaled_softmax(x2), rtol=1e-5, atol=1e-7)
    assert builds == [{"N": 4}, {"N": 2}]
    model.specialize({"N": 9})
    assert builds[-1] == {"N": 9}


def test_shapes_outside_the_constraints_are_refused(builds, rng):
    m = softmax_module("N", constraints=(DimConstraint("N", lo=2, hi=8, multiple_of=2),))
    model = compile(m)
    x4 = _x(4, rng)
    np.testing.assert_allclose(model(x4), scaled_softmax(x4), rtol=1e-5, atol=1e-7)
    for rows in (3, 10, 1):
        with pytest.raises(ConstraintError, match=f"N={rows}"):
            model(_x(rows, rng))
    with pytest.raises(ConstraintError):
        model.specialize({"N": 5})
    with pytest.raises(ConstraintError):
        compile(m, example_inputs=[_x(7, rng)])
    assert builds == [{"N": 4}]


def test_shapes_that_do_not_fit_the_signature(builds, rng):
    b = Builder()
    x, y = b.param("x", DType.f32, ["N", 4]), b.param("y", DType.f32, ["N", 4])
    model = compile(b.module(b.function("main", [x, y], [b.add(x, y)])))
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(model(a, a), a + a)
    with pytest.raises(InputError, match="symbol N is 3 in one input and 2 in another"):
        model(a, a[:2])
    with pytest.raises(InputError, match="must be 4"):
        model(a, rng.standard_normal((3, 5)).astype(np.float32))
    with pytest.raises(InputError, match="rank"):
        model(a, a[None])
    with pytest.raises(InputError, match="dtype"):
        model(a, a.astype(np.float64))
    with pytest.raises(InputError, match="missing"):
        model.specialize({})
    assert len(builds) == 1


def test_one_artifact_needs_concrete_dims(tmp_path, rng):
    with pytest.raises(CodegenError, match="symbolic"):
        compile(softmax_module("N"), output_dir=tmp_path / "a")
    pinned = compile(softmax_module("N"), output_dir=tmp_path / "b", input_shapes={"x": (3, 8)})
    assert not pinned.is_dynamic and pinned.manifest["specialized_dims"] == {"N": 3}
    assert pinned.library_path.parent == tmp_path / "b"
    with pytest.raises(InputError, match="static shapes"):
        pinned(_x(4, rng))
    per_shape = compile(softmax_module("N"), output_dir=tmp_path / "c", dynamic=True)
    x5 = _x(5, rng)
    np.testing.assert_allclose(per_shape(x5), scaled_softmax(x5), rtol=1e-5, atol=1e-7)
    assert per_shape.library_path.parent == tmp_path / "c" / "N5"
