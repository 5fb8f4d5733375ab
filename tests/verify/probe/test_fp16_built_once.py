"""The float16 program is built in one place, the FP16 pass (``cuvil.passes.fp16.narrow_function``):
the pass, the overflow prober and an FP16 compile all get it from there, so the module the prober
proves is the module the compiler ships (equal content hashes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuvil
import cuvil.compiler.job
import verify.probe.fp16_policy as policy
from bench.models import ZOO_SMALL
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.hashing import module_hash
from cuvil.ir.module import Module
from cuvil.passes.fp16 import Fp16, narrow_function
from verify.probe.program import DEFAULT_KEEP, reduced_program


def _f(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _mlp() -> Module:
    """Linear layers, a softmax, and a constant beyond float16's range (its user stays float32)."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, [2, 8])
    h = b.relu(b.add(b.matmul(x, b.const(_f(rng, 8, 16, scale=0.3))), b.const(_f(rng, 16))))
    s = b.softmax(b.matmul(h, b.const(_f(rng, 16, 4, scale=0.3))))
    return b.module(b.function("main", [x], [b.exp(b.mul(s, b.const(np.float32(1e6))))]))


def _block() -> Module:
    """A transformer-style block: layer norm, attention scores, GELU feed-forward, residual."""
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.param("x", DType.f32, [4, 8])
    n = b.layer_norm(x, b.const(_f(rng, 8)), b.const(_f(rng, 8)))
    scores = b.softmax(b.matmul(n, n, transpose_b=True))
    ff = b.matmul(b.gelu(b.matmul(b.matmul(scores, n), b.const(_f(rng, 8, 16, scale=0.3)))),
                  b.const(_f(rng, 16, 8, scale=0.3)))
    return b.module(b.function("main", [x], [b.add(x, ff), b.reduce_sum(b.exp(ff), axes=[1])]))


def _wide() -> Module:
    """x @ W with |W| ~ 1e3 over x in [-100, 100]: the prober keeps this layer float32."""
    rng = np.random.default_rng(2)
    b = Builder()
    x = b.param("x", DType.f32, (4, 16))
    h = b.relu(b.add(b.matmul(x, b.const(_f(rng, 16, 8, scale=1e3))), b.const(_f(rng, 8))))
    return b.module(b.function("main", [x], [b.tanh(b.matmul(h, b.const(_f(rng, 8, 3, scale=1e-3))))]))


@functools.cache
def _zoo_mlp() -> Module:
    return cuvil.import_model(ZOO_SMALL["mlp"].to_onnx())


MODELS: dict[str, tuple[Callable[[], Module], float]] = {
    "mlp": (_mlp, 1.0), "block": (_block, 1.0), "wide": (_wide, 100.0), "zoo-mlp": (_zoo_mlp, 1.0)}
"""Model builders and the half-width of the box declared for every input."""


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_pass_builds_the_program_the_prober_analyses(name: str) -> None:
    module = MODELS[name][0]()
    probed = reduced_program(module, "fp16", keep_ops="default").module
    assert module_hash(Fp16().run(module).module) == module_hash(probed)
    custom = Fp16(keep_fp32=("cast", "relu")).run(module).module
    assert module_hash(custom) == module_hash(reduced_program(module, "fp16", keep_ops=("relu",)).module)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_fp16_compile_ships_the_program_the_prober_proved(name: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    build, half = MODELS[name]
    module = build()
    ranges = {p.name: (-half, half) for p in module.main.params}
    probed: list[Module] = []
    shipped: list[Module] = []
    real_analysis, real_pipeline = policy.Analysis, cuvil.compiler.job.run_pipeline

    def analysis(program: Any, *args: Any, **kwargs: Any) -> Any:
        probed.append(program.module)
        return real_analysis(program, *args, **kwargs)

    def pipeline(start: Module, *args: Any, **kwargs: Any) -> Any:
        shipped.append(start)
        return real_pipeline(start, *args, **kwargs)

    monkeypatch.setattr(policy, "Analysis", analysis)
    monkeypatch.setattr(cuvil.compiler.job, "run_pipeline", pipeline)
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model = cuvil.compile(module, fp16=True, ranges=ranges, cache=False)
    assert len(shipped) == 1 and probed
    assert module_hash(shipped[0]) == module_hash(probed[-1])
    # and it is the pass's construction with the ops the prober could not prove kept float32
    kept = policy.plan_fp16(module, ranges).kept
    b = Builder(module.constants)
    built = narrow_function(module.main, b, DType.f16, DEFAULT_KEEP, kept).function
    assert module_hash(shipped[0]) == module_hash(Module((built,), b.constants, module.metadata))
    assert any(v.dtype is DType.f16 for v in shipped[0].main.ops())
    assert model.manifest is not None and model.manifest["precision"]["fp16_ops"] > 0
