"""A self-contained HTML page that runs a wasm32-wasi library in a browser.

The page embeds the module (base64), the loader (``cuvil_wasm.js``), the signature from the manifest
and the inputs, so it opens from a file with no server. It runs the model once and shows each output
(and, for a single output, the index of its largest value: the predicted class); the outputs are also
in ``<pre id="outputs">`` as JSON, which is how tests read them back.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec
from cuvil.errors import InputError

LOADER = Path(__file__).with_name("cuvil_wasm.js")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 16px system-ui, sans-serif; margin: 2em; color: #1d2433; }}
h1 {{ font-size: 1.3em; }} #status {{ font-size: 1.6em; font-weight: 600; color: #0b6e4f; }}
pre {{ background: #f3f5f8; padding: 1em; white-space: pre-wrap; }} .error {{ color: #b3261e; }}
</style></head>
<body><h1>{title}</h1>
<p>Compiled by Cuvil for wasm32-wasi ({symbol}), running in this page with WebAssembly.</p>
<p id="status">running...</p>
<pre id="outputs"></pre>
<script>{loader}</script>
<script>
(async () => {{
  const status = document.getElementById("status");
  try {{
    const b64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
    const spec = {spec};
    const inputs = {inputs}.map((s, k) => new CuvilWasm.ARRAYS[spec.inputs[k].dtype](b64(s).buffer));
    const model = await CuvilWasm.load(b64("{module}"), spec);
    const outputs = model.run(inputs);
    const plain = outputs.map((a) => Array.from(a, (v) => typeof v === "bigint" ? Number(v) : v));
    document.getElementById("outputs").textContent = JSON.stringify(
      Object.fromEntries(spec.outputs.map((t, k) => [t.name, plain[k]])));
    if (plain.length === 1) {{
      const v = plain[0];
      const best = v.indexOf(Math.max(...v));
      status.textContent = `prediction: class ${{best}} (${{spec.outputs[0].name}} ${{v[best].toFixed(4)}})`;
    }} else {{
      status.textContent = "done";
    }}
    model.close();
  }} catch (e) {{
    status.textContent = "error: " + e.message;
    status.className = "error";
  }}
}})();
</script></body></html>
"""


def page_spec(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What the loader needs from a manifest: the entry symbols and each tensor's dtype, code and shape."""
    def tensor(entry: Mapping[str, Any]) -> dict[str, Any]:
        spec = TensorSpec.from_json(entry)
        if not all(isinstance(d, int) for d in spec.shape):
            raise InputError(f"{spec.name} has symbolic dims; the page runs a library compiled for static shapes",
                             location=spec.name, hint="compile with --shape NAME=1x3x224x224")
        return {"name": spec.name, "dtype": spec.dtype.value, "code": abi.DTYPE_CODES[spec.dtype],
                "shape": list(spec.shape)}

    return {"symbols": dict(manifest["symbols"]), "inputs": [tensor(e) for e in manifest["inputs"]],
            "outputs": [tensor(e) for e in manifest["outputs"]]}


def write_web_page(library: Path, manifest: Mapping[str, Any], inputs: Sequence[np.ndarray], out: Path,
                   title: str = "Cuvil model") -> Path:
    """Write the page that runs ``library`` (a ``.wasm`` compiled by Cuvil) on ``inputs``."""
    if not str(manifest.get("target", {}).get("triple", "")).startswith("wasm32"):
        raise InputError(f"{library.name} is not a wasm32 library", location=str(library),
                         hint="compile it with --target wasm32-wasi")
    spec = page_spec(manifest)
    if len(inputs) != len(spec["inputs"]):
        raise InputError(f"the model takes {len(spec['inputs'])} inputs, {len(inputs)} were given", location=str(out))
    encoded = []
    for a, entry in zip(inputs, manifest["inputs"], strict=True):
        want = TensorSpec.from_json(entry)
        a = np.ascontiguousarray(a)
        if a.shape != tuple(want.shape) or a.dtype != want.dtype.np:
            raise InputError(f"input {want.name} must be {want.dtype.value}{list(want.shape)}, got "
                             f"{a.dtype}{list(a.shape)}", location=want.name)
        encoded.append(base64.b64encode(a.tobytes()).decode())
    text = _PAGE.format(title=html.escape(title), symbol=html.escape(manifest["symbol_prefix"]),
                        loader=LOADER.read_text(), spec=json.dumps(spec), inputs=json.dumps(encoded),
                        module=base64.b64encode(Path(library).read_bytes()).decode())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
