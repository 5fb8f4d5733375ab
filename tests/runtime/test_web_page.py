"""The bundled example compiled for wasm32-wasi runs in headless Chromium from a self-contained page:
the prediction and outputs the page shows are the interpreter's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.web_example import EXAMPLE, build, example_input
from cuvil.errors import InputError
from cuvil.runtime.web_page import write_web_page
from tests.browser import HEADLESS, NOT_INSTALLED, chromium
from tests.cross_targets import needs_wasm

pytestmark = needs_wasm

def test_example_page_runs_the_wasm_module_in_headless_chromium(tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip(f"{NOT_INSTALLED}; the page was not opened")
    page, want = build(tmp_path / "web")
    flags = [*HEADLESS, "--virtual-time-budget=10000"]
    cmd = [browser, *flags, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    status = re.search(r'<p id="status"[^>]*>(.*?)</p>', proc.stdout)
    outputs = re.search(r'<pre id="outputs">(.*?)</pre>', proc.stdout)
    assert status and outputs, proc.stderr[-2000:]
    got = np.asarray(json.loads(outputs.group(1))["probs"], np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert status.group(1).startswith(f"prediction: class {int(np.argmax(want))} ")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                    "--window-size=900,700", page.resolve().as_uri()], capture_output=True, timeout=180, check=False)
    assert shot.is_file() and shot.stat().st_size > 1000


def test_page_refuses_a_native_library_and_wrong_inputs(tmp_path: Path) -> None:
    import cuvil

    build(tmp_path / "web")
    lib = next((tmp_path / "web").glob("*.wasm"))
    manifest = json.loads(next((tmp_path / "web").glob("*.json")).read_text())
    with pytest.raises(InputError, match="must be f32"):
        write_web_page(lib, manifest, [example_input()[:, :, :8]], tmp_path / "bad.html")
    with pytest.raises(InputError, match="takes 1 inputs"):
        write_web_page(lib, manifest, [], tmp_path / "bad.html")
    native = cuvil.compile(str(EXAMPLE), input_shapes=[(1, 1, 16, 16)],
                           output_dir=tmp_path / "native", dynamic=False)
    assert native.library_path is not None and native.manifest is not None
    with pytest.raises(InputError, match="not a wasm32 library"):
        write_web_page(native.library_path, native.manifest, [example_input()], tmp_path / "bad.html")
