"""The LLVM optimizer's result is verified before code generation: a module it broke is optimized again with
fewer vectorizers (LLVM's code generator would abort the process on it), and one that stays broken is a
``CodegenError``. LLVM's verifier is made to reject the optimized module here, so that the path is taken on
every machine; ``tests/codegen/test_depthwise_tiles.py``'s AVX2 case meets the real optimizer bug on AVX-512
CPUs."""

from __future__ import annotations

import logging
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.errors import CodegenError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType


def _module() -> Any:
    """A loop LLVM vectorizes: an elementwise product and sum over 1,000 elements."""
    b = Builder()
    x = b.param("x", DType.f32, (1000,))
    y = b.param("y", DType.f32, (1000,))
    return b.module(b.function("main", [x, y], [b.add(b.mul(x, y), x)]))


def _rejecting(monkeypatch: pytest.MonkeyPatch, bad: set[int]) -> list[tuple[bool, bool]]:
    """Make LLVM's verifier reject the module at its ``bad`` calls (0: the one before optimizing); returns the
    (loop, SLP) vectorizer settings of each optimizer run."""
    calls = [0]
    runs: list[tuple[bool, bool]] = []
    verify, builder = llvm.ModuleRef.verify, llvm.create_pass_builder

    def checked(self: Any) -> None:
        n = calls[0]
        calls[0] += 1
        if n in bad:
            raise RuntimeError("Instruction does not dominate all uses! (made up by the test)")
        verify(self)

    def noting(tm: Any, pto: Any) -> Any:
        runs.append((pto.loop_vectorization, pto.slp_vectorization))
        return builder(tm, pto)

    monkeypatch.setattr(llvm.ModuleRef, "verify", checked)
    monkeypatch.setattr(llvm, "create_pass_builder", noting)
    return runs


def test_a_broken_optimized_module_is_optimized_again_without_the_loop_vectorizer(monkeypatch, caplog):
    runs = _rejecting(monkeypatch, {1})
    module = _module()
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        model = compile(module, cache=False)
    assert runs == [(True, True), (False, True)]
    assert any("optimized again with the loop vectorizer off" in r.getMessage() for r in caplog.records)
    (got,), (want,) = model.run([x, y]), run_reference(module, [x, y])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_module_that_stays_broken_is_a_codegen_error(monkeypatch):
    runs = _rejecting(monkeypatch, {1, 2, 3})
    with pytest.raises(CodegenError, match="invalid module, with and without its vectorizers") as info:
        compile(_module(), cache=False)
    assert runs == [(True, True), (False, True), (False, False)]
    assert info.value.code == "CUVIL-CODEGEN" and "Instruction does not dominate" in str(info.value)
