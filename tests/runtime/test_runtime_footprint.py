"""A process that only loads and runs a compiled library imports the runtime, not the compiler: no LLVM,
no frontends, no verifier. And `python -m bench.memory` measures each engine in a fresh process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import cuvil
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType

COMPILER_MODULES = ("llvmlite", "onnx", "torch", "z3", "cuvil.compiler", "cuvil.codegen.artifact",
                    "cuvil.frontend", "verify")


def test_loading_and_running_a_library_does_not_import_the_compiler(tmp_path) -> None:
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    module = b.module(b.function("main", [x], [b.relu(x)]))
    lib = cuvil.compile(module, output_dir=tmp_path, dynamic=False).library_path
    script = (f"import sys, json, numpy as np\nfrom cuvil.runtime import load\nm = load({str(lib)!r})\n"
              "y = m(np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32))\n"
              f"print(json.dumps([y.tolist(), sorted(k for k in sys.modules if k.split('.')[0] in "
              f"{sorted({c.split('.')[0] for c in COMPILER_MODULES})!r})]))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    result, modules = json.loads(run.stdout)
    assert result == [[0, 2, 0], [4, 0, 6]]
    assert not [m for m in modules if any(m == c or m.startswith(c + ".") for c in COMPILER_MODULES)], modules


def test_memory_bench_measures_both_engines_in_their_own_processes() -> None:
    pytest.importorskip("onnxruntime")
    from bench.memory import measure

    row = measure("mlp", small=True, runs=2)
    assert row.cuvil_peak_mb > 0 and row.ort_peak_mb > 0
    assert 0 <= row.cuvil_model_mb < row.cuvil_peak_mb and 0 <= row.ort_model_mb < row.ort_peak_mb
    assert np.isfinite(row.ratio)
