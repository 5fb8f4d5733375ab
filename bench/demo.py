"""`make demo`: the main job on the bundled example model, as a regulated deployment runs it.

1. ``cuvil verify``: prove every pass application of the O3 pipeline on ``tiny_cnn.onnx`` (a small
   conv-BN-ReLU classifier with a symbolic batch dim) and print the per-pass proof table.
2. ``cuvil compile --gate``: compile it to a native library only because every application was
   proved; the certificate is embedded in the manifest and bound to the library.
3. ``cuvil verify --check-certificate``: an auditor re-checks that certificate with cvc5, a second,
   independent solver, and re-derives the model's hashes.
4. A user's wrong pass (``bench/examples/wrong_pass.py``): the gated compile refuses it and shows the
   counterexample, replayed on the reference interpreter.
5. The library runs, and agrees with the reference interpreter (and ONNX Runtime, an oracle).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console

import cuvil
from cuvil.cli import main as cuvil_main
from cuvil.runtime.loader import load

EXAMPLE = Path(__file__).parent / "examples" / "tiny_cnn.onnx"
WRONG_PASS = "bench.examples.wrong_pass:PushReluBelowPooling"


def run(console: Console, *argv: str) -> int:
    """``cuvil ARGV``, echoed as a shell line, its output shown and its exit code returned."""
    console.print(f"[bold cyan]$ cuvil {' '.join(argv)}")
    try:
        code = cuvil_main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    console.print(f"[dim](exit {code})")
    return code


def main() -> int:
    console = Console()
    out = Path(tempfile.mkdtemp(prefix="cuvil-demo-"))
    library = out / "libtiny_cnn.so"
    cert = out / "tiny_cnn.cert.json"

    console.rule("[bold]1. prove every pass application (O3)")
    if run(console, "verify", str(EXAMPLE), "-O3", "-q", "--json", str(cert)) != 0:
        return 1
    console.rule("[bold]2. gated compile: a library only if every application is proved")
    if run(console, "compile", str(EXAMPLE), "--gate", "--no-cache", "--shape", "x=4x1x16x16", "-o",
           str(library)) != 0:
        return 1
    console.rule("[bold]3. an auditor re-checks the embedded certificate with cvc5")
    if run(console, "verify", str(EXAMPLE), "--shape", "x=4x1x16x16", "--check-certificate", str(library),
           "--solver", "cvc5", "-q") != 0:
        return 1
    console.rule("[bold]4. a user's wrong pass is refused, with its replayed counterexample")
    wrong = run(console, "compile", str(EXAMPLE), "--gate", "--no-cache", "--shape", "x=4x1x16x16", "--passes",
                "push-relu-below-pooling,O3", "--pass-plugin", WRONG_PASS, "-o", str(out / "libwrong.so"))
    if wrong == 0 or (out / "libwrong.so").exists():
        console.print("[bold red]the wrong pass was not refused")
        return 1
    console.print("no library was written for the wrong pipeline")

    console.rule("[bold]5. run the library")
    x = np.random.default_rng(0).standard_normal((4, 1, 16, 16)).astype(np.float32)
    (reference,) = cuvil.run_reference(cuvil.import_model(EXAMPLE), [x])
    native = load(library)(x)  # the gated library, its hash checked before it is loaded
    console.print(f"batch of 4 -> classes {native.argmax(axis=1).tolist()}; native vs interpreter: "
                  f"max abs difference {np.abs(native - reference).max():.3g}")
    try:
        import onnxruntime as ort
    except ImportError:
        console.print("onnxruntime not installed: no oracle comparison")
    else:
        sess = ort.InferenceSession(str(EXAMPLE), providers=["CPUExecutionProvider"])
        (oracle,) = sess.run(None, {"x": x})
        console.print(f"ONNX Runtime (oracle) vs Cuvil interpreter: max abs difference "
                      f"{np.abs(reference - oracle).max():.3g}")
    console.print(f"files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
