"""The bundled example in a browser: ``python -m bench.web_example [OUT_DIR]``.

Compiles ``bench/examples/tiny_cnn.onnx`` for wasm32-wasi (batch 1) and writes ``tiny_cnn.html``, a
self-contained page that runs the module with WebAssembly and shows its prediction for a fixed input;
open it in any browser (no server needed). Prints the interpreter's prediction to compare with.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import cuvil
from cuvil.runtime.web_page import write_web_page

EXAMPLE = Path(__file__).parent / "examples" / "tiny_cnn.onnx"


def example_input() -> np.ndarray:
    """A fixed input: a bright diagonal on a dark field."""
    x = np.full((1, 1, 16, 16), -0.5, np.float32)
    x[0, 0, np.arange(16), np.arange(16)] = 1.0
    return x


def build(out_dir: Path) -> tuple[Path, np.ndarray]:
    """Compile the example for wasm32-wasi into ``out_dir`` and write its page; the page and the
    interpreter's outputs for the same input."""
    x = example_input()
    model = cuvil.compile(str(EXAMPLE), target="wasm32-wasi", input_shapes=[x.shape], output_dir=out_dir,
                          dynamic=False)
    assert model.library_path is not None and model.manifest is not None
    page = write_web_page(model.library_path, model.manifest, [x], out_dir / "tiny_cnn.html",
                          title="tiny_cnn.onnx in WebAssembly")
    want = cuvil.run_reference(cuvil.import_model(str(EXAMPLE)), [x])[0]
    return page, want


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="cuvil-web-"))
    page, want = build(out)
    print(f"wrote {page} ({page.stat().st_size / 1e3:.0f} kB); open it in a browser")
    print(f"the interpreter predicts class {int(np.argmax(want))} (probs {np.round(want.ravel(), 4).tolist()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
