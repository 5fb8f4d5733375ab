"""`make demo`: the main job on the bundled example model.

Import ``bench/examples/tiny_cnn.onnx`` (a small conv-BN-ReLU classifier with a symbolic
batch dim), print its CIR, optimize it at O2, run both versions on the reference
interpreter, and compile it to a native library; ONNX Runtime, when installed, is shown
as an independent oracle.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import cuvil
from cuvil.ir.printer import print_module
from cuvil.passes import run_pipeline

EXAMPLE = Path(__file__).parent / "examples" / "tiny_cnn.onnx"


def main() -> None:
    console = Console()
    console.rule(f"[bold]import {EXAMPLE.name}")
    start = time.perf_counter()
    module = cuvil.import_model(EXAMPLE)
    console.print(f"imported in {time.perf_counter() - start:.3f} s: {len(module.main.ops())} ops, "
                  f"{len(module.constants)} constants")
    console.print(print_module(module, elide_above=16), highlight=False, markup=False, soft_wrap=True)

    console.rule("[bold]optimize (O2)")
    result = run_pipeline(module, "O2")
    table = Table("pass", "changed", "ops before", "ops after", "seconds")
    for name, changed, seconds, before, after in result.summary():
        table.add_row(name, "yes" if changed else "no", str(before), str(after), f"{seconds:.4f}")
    console.print(table)
    console.print(print_module(result.module, elide_above=16), highlight=False, markup=False, soft_wrap=True)

    console.rule("[bold]run on the reference interpreter")
    x = np.random.default_rng(0).standard_normal((4, 1, 16, 16)).astype(np.float32)
    (probs,) = cuvil.run_reference(module, [x])
    (probs_opt,) = cuvil.run_reference(result.module, [x])
    console.print(f"batch of 4 -> predicted classes {probs.argmax(axis=1).tolist()}, "
                  f"row sums {np.round(probs.sum(axis=1), 6).tolist()}")
    console.print(f"optimized vs unoptimized: max abs difference {np.abs(probs - probs_opt).max():.3g}")

    console.rule("[bold]compile to a native library (LLVM, O3)")
    start = time.perf_counter()
    compiled = cuvil.compile(EXAMPLE, example_inputs=[x], cache=False)
    native = compiled(x)
    console.print(f"compiled in {time.perf_counter() - start:.2f} s: {compiled.library_path}")
    console.print(f"native vs interpreter: max abs difference {np.abs(native - probs).max():.3g}")
    try:
        import onnxruntime as ort
    except ImportError:
        console.print("onnxruntime not installed: no oracle comparison")
        return
    sess = ort.InferenceSession(str(EXAMPLE), providers=["CPUExecutionProvider"])
    (oracle,) = sess.run(None, {"x": x})
    console.print(f"ONNX Runtime (oracle) vs Cuvil interpreter: max abs difference {np.abs(probs - oracle).max():.3g}")


if __name__ == "__main__":
    main()
