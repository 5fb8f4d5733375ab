"""``cuvil lora check`` at the size of a 7B model: a Llama-7B-shaped base directory (config.json and
a bf16 safetensors file, written sparse: every weight reads as zero) and a rank-16 adapter on all
seven projections of its 32 layers (real values, PEFT's file format), then the check's wall time
and peak memory.

    python -m bench.lora_scale [--dir DIR] [--rank 16] [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lora.safetensors_file import write_safetensors

HIDDEN, INTERMEDIATE, VOCAB = 4096, 11008, 32000
PROJECTIONS = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
               "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
               "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
               "mlp.down_proj": (HIDDEN, INTERMEDIATE)}


def _sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> int:
    """A bf16 safetensors file whose data is a hole: the header is real, every value reads as 0."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    return offset


def build(root: Path, rank: int, layers: int) -> tuple[Path, Path]:
    base, adapter = root / "base", root / "adapter"
    base.mkdir(parents=True, exist_ok=True)
    adapter.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False}))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN),
                                          "lm_head.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for layer in range(layers):
        for proj, shape in PROJECTIONS.items():
            shapes[f"model.layers.{layer}.{proj}.weight"] = shape
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[f"model.layers.{layer}.{norm}.weight"] = (HIDDEN,)
    _sparse_safetensors(base / "model.safetensors", shapes)
    rng = np.random.default_rng(0)
    tensors = {}
    for layer in range(layers):
        for proj, (out, inp) in PROJECTIONS.items():
            key = f"base_model.model.model.layers.{layer}.{proj}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, inp), np.float32) * 0.01)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out, rank), np.float32) * 0.01)
    write_safetensors(adapter / "adapter_model.safetensors", tensors)
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": [p.split(".")[1] for p in PROJECTIONS],
        "base_model_name_or_path": "base"}))
    return base, adapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to write the base and adapter (default: a temporary folder)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="cuvil-lora-scale-"))
    start = time.perf_counter()
    base, adapter = build(root, args.rank, args.layers)
    print(f"built in {time.perf_counter() - start:.1f} s: adapter "
          f"{(adapter / 'adapter_model.safetensors').stat().st_size / 2**20:.0f} MiB, base (sparse) "
          f"{(base / 'model.safetensors').stat().st_size / 2**30:.1f} GiB")
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "cuvil", "lora", "check", "--base", str(base), "--adapter",
                          str(adapter), "--dtype", args.dtype, "--json", str(root / "report.json"), "-q"])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    report = json.loads((root / "report.json").read_text()) if (root / "report.json").exists() else {}
    modules = sum(1 for r in report.get("results", []) if r.get("rule") == "lora-module-measured")
    print(f"cuvil lora check: exit {run.returncode}, {modules} modules measured, {seconds:.1f} s wall, "
          f"peak RSS {peak:.2f} GiB")
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
