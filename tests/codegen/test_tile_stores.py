"""A GEMM's or convolution's tile is stored along its rows, in whole vectors, whatever its epilogue.

The store is a loop over the tile's rows around a loop along a row. LLVM unrolls the inner loop whole where its
length is known and may then vectorize the outer one instead: every element a gather from the tile and a
scatter to the output, rows apart. It did so for tiles of seven and eight rows on AVX-512 CPUs (a 1x1
convolution with a bias ran 1.8 times slower, with the same bits: values cannot tell). This reads the
optimized LLVM IR of libraries built for fixed CPUs (not the host's, so it reads the same on every machine).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.codegen.artifact import build_library
from cuvil.codegen.target import Target
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import run_pipeline

AVX2 = "+avx,+avx2,+fma,+f16c"
AVX512 = AVX2 + ",+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512vnni,+avx512bf16"
CPUS = [pytest.param(cpu, features, id=cpu) for cpu, features in (
    ("znver4", AVX512), ("sapphirerapids", AVX512), ("skylake-avx512", AVX512), ("haswell", AVX2))]
RNG = np.random.default_rng(23)

Epilogue = Callable[[Builder, Value, Value], Value]
EPILOGUES: dict[str, Epilogue] = {
    "bias": lambda b, y, bias: b.add(y, bias),
    "bias-relu": lambda b, y, bias: b.relu(b.add(y, bias)),
    "bias-residual": lambda b, y, bias: b.add(b.add(y, bias), y),
    "none": lambda b, y, bias: y,
}


def _f(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def _products(epilogue: Epilogue) -> Module:
    """Products whose register tiles have seven or eight rows (a vector's worth of rows for LLVM to take
    across): a 1x1 convolution with positions as the vectors (8 x 48), matmuls with a narrow output (8 x 16,
    7 x 16), and a 1x1 convolution with output channels as the vectors (a 7x7 plane, a long reduction), each
    with ``epilogue``."""
    b = Builder()
    x1 = b.param("x1", DType.f32, [1, 64, 28, 28])
    x2 = b.param("x2", DType.f32, [1, 256, 7, 7])
    x3 = b.param("x3", DType.f32, [64, 256])
    x4 = b.param("x4", DType.f32, [7, 64])
    y1 = epilogue(b, b.conv(x1, b.const(_f(128, 64, 1, 1))), b.const(_f(128, 1, 1)))
    y2 = epilogue(b, b.conv(x2, b.const(_f(64, 256, 1, 1))), b.const(_f(64, 1, 1)))
    y3 = epilogue(b, b.matmul(x3, b.const(_f(256, 10))), b.const(_f(10)))
    y4 = epilogue(b, b.matmul(x4, b.const(_f(64, 5))), b.const(_f(5)))
    return b.module(b.function("main", [x1, x2, x3, x4], [y1, y2, y3, y4], ["y1", "y2", "y3", "y4"]))


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=str)
@pytest.mark.parametrize("cpu, features", CPUS)
def test_tiles_are_stored_without_gathers_or_scatters(cpu: str, features: str, epilogue: str, tmp_path) -> None:
    module = run_pipeline(_products(EPILOGUES[epilogue]), "O3").module
    art = build_library(module.main, module.constants, tmp_path, name="tiles", keep_ir=True, threads=1,
                        target=Target("x86_64-unknown-linux-gnu", cpu, features))
    kernels = art.manifest["kernels"]
    assert sum(k.startswith(("conv", "gemm")) for k in kernels) == 4, kernels  # all four on tuned kernels
    ir_text = next(tmp_path.glob("*.ll")).read_text()
    found = sorted({w for w in ("llvm.masked.scatter", "llvm.masked.gather") if w in ir_text})
    assert not found, f"{cpu} {epilogue}: the tile stores use {found}"
