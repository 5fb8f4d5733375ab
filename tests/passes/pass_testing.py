"""Shared checks for pass tests: random inputs for a function's signature, the op sequence of
a module, a pass that must not fire, and the before/after comparison on the reference interpreter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.interp import run_reference
from cuvil.ir import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.symbolic import evaluate_dim
from cuvil.passes import Pass


def random_inputs(fn: Function, rng: np.random.Generator, env: Mapping[str, int] | None = None,
                  scale: float = 1.0) -> list[np.ndarray]:
    """Standard-normal floats, small integers, random bools, for every parameter of ``fn``."""
    out: list[np.ndarray] = []
    for p in fn.params:
        shape = tuple(evaluate_dim(d, env or {}) for d in p.type.shape)
        dt = p.type.dtype
        if dt.is_float:
            out.append((rng.standard_normal(shape) * scale).astype(dt.np))
        elif dt is DType.bool:
            out.append(rng.standard_normal(shape) > 0)
        else:
            info = np.iinfo(dt.np)
            out.append(rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dt.np))
    return out


def assert_unchanged(pass_: Pass, before: Module) -> Module:
    """``pass_`` leaves ``before`` alone: it reports no change and hands back the very same module."""
    res = pass_.run(before)
    assert not res.changed
    assert res.module is before
    return res.module


def ops(m: Module) -> list[str]:
    """The ops of ``main`` in topological order."""
    return [v.op for v in m.main.ops()]


def assert_same_results(before: Module, after: Module, inputs: Sequence[np.ndarray] | None = None, *,
                        exact: bool = True, rtol: float = 1e-5, atol: float | None = None, seed: int = 0,
                        trials: int = 2) -> None:
    """Run both modules on the interpreter: bit-identical (``exact``, signed zeros included) or
    within ``rtol`` (relative to the largest reference magnitude unless ``atol`` is given)."""
    rng = np.random.default_rng(seed)
    cases = [list(inputs)] if inputs is not None else [random_inputs(before.main, rng) for _ in range(trials)]
    for xs in cases:
        ref = run_reference(before, xs)
        got = run_reference(after, xs)
        assert len(ref) == len(got)
        for r, g in zip(ref, got, strict=True):
            assert r.dtype == g.dtype and r.shape == g.shape
            if exact:
                np.testing.assert_array_equal(g, r)
                if r.dtype.kind == "f":
                    assert np.array_equal(np.signbit(g), np.signbit(r))
                continue
            r64, g64 = r.astype(np.float64), g.astype(np.float64)
            tol = atol if atol is not None else rtol * max(float(np.max(np.abs(r64), initial=0.0)), 1.0)
            np.testing.assert_allclose(g64, r64, rtol=rtol, atol=tol)
