"""``python -m bench.transformers``: Cuvil against ONNX Runtime on transformers models built from their
configs (random weights, fixed seed, eager attention; nothing is fetched from a model hub).

Text models (``--models text``, the default set's first half) are built at one size (hidden 256, two layers,
four heads, vocabulary 1000, one sequence of 64 tokens, the attention mask all ones, made inside the graph):
GPT-2 and Phi (tanh GELU written with ``x ** 3``), LLaMA, Qwen2 and T5 (RMS norms, ``x ** 2``), GPT-NeoX,
BLOOM, RoBERTa and DistilBERT. Vision and audio models (``--models vision``) take one 224 x 224 image (or a
second of audio) at their usual sizes or cut to a few layers, with He-scaled weights (see
:func:`_realistic_weights`). Each is exported once with ``torch.onnx`` (opset 17) into ``--cache`` and
compiled by Cuvil from that file as a user would (``cuvil.compile(path)``); the two engines are called in
turn, medians, their ratio and the largest difference of the outputs.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import interleaved_medians, ort_options, passive_torch_workers

HIDDEN, LAYERS, HEADS, VOCAB, TOKENS = 256, 2, 4, 1000, 64
SEED = 0


def _configs() -> dict[str, Callable[[], Any]]:
    """Each model's constructor at the bench size (imported late: torch and transformers are test extras)."""
    import transformers as T

    common: dict[str, Any] = {"vocab_size": VOCAB}
    decoder: dict[str, Any] = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                               "max_position_embeddings": 128, **common}
    return {
        "gpt2": lambda: T.GPT2Model(T.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=128,
                                                 bos_token_id=0, eos_token_id=0, **common)),
        "phi": lambda: T.PhiModel(T.PhiConfig(intermediate_size=4 * HIDDEN, **decoder)),
        "llama": lambda: T.LlamaModel(T.LlamaConfig(intermediate_size=688, num_key_value_heads=HEADS, **decoder)),
        "qwen2": lambda: T.Qwen2Model(T.Qwen2Config(intermediate_size=688, num_key_value_heads=2, **decoder)),
        "t5-encoder": lambda: T.T5EncoderModel(T.T5Config(d_model=HIDDEN, d_ff=4 * HIDDEN, num_layers=LAYERS,
                                                          num_heads=HEADS, d_kv=HIDDEN // HEADS, **common)),
        "gpt-neox": lambda: T.GPTNeoXModel(T.GPTNeoXConfig(intermediate_size=4 * HIDDEN, **decoder)),
        "bloom": lambda: T.BloomModel(T.BloomConfig(hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, **common)),
        "roberta": lambda: T.RobertaModel(T.RobertaConfig(intermediate_size=4 * HIDDEN, **{
            **decoder, "max_position_embeddings": 130})),
        "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(dim=HIDDEN, hidden_dim=4 * HIDDEN, n_layers=LAYERS,
                                                                   n_heads=HEADS, **common)),
    }


def _vision() -> dict[str, Callable[[], Any]]:
    """Image and audio models at their usual sizes (EfficientNet-B0, PoolFormer-S12, MobileViT-S, RegNet,
    ResNet-50, ConvNeXt V2-Atto) or cut to a few layers (Swin-T with two blocks a stage, DeiT-S with four,
    wav2vec 2.0 with two)."""
    import transformers as T

    return {
        "efficientnet-b0": lambda: T.EfficientNetModel(T.EfficientNetConfig(
            width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280)),
        "poolformer-s12": lambda: T.PoolFormerModel(T.PoolFormerConfig()),
        "mobilevit-s": lambda: T.MobileViTModel(T.MobileViTConfig()),
        "regnet": lambda: T.RegNetModel(T.RegNetConfig()),
        "resnet-50": lambda: T.ResNetModel(T.ResNetConfig()),
        "convnextv2-atto": lambda: T.ConvNextV2Model(T.ConvNextV2Config(hidden_sizes=[40, 80, 160, 320],
                                                                        depths=[2, 2, 6, 2])),
        "swin": lambda: T.SwinModel(T.SwinConfig(depths=[2, 2, 2, 2], embed_dim=64, num_heads=[2, 4, 8, 16])),
        "deit-s4": lambda: T.DeiTModel(T.DeiTConfig(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                                                    intermediate_size=1536)),
        "wav2vec2": lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                                             num_attention_heads=HEADS, intermediate_size=4 * HIDDEN)),
    }


TEXT = ("gpt2", "phi", "llama", "qwen2", "t5-encoder", "gpt-neox", "bloom", "roberta", "distilbert")
VISION = ("efficientnet-b0", "poolformer-s12", "mobilevit-s", "regnet", "resnet-50", "convnextv2-atto", "swin",
          "deit-s4", "wav2vec2")
MODELS = TEXT + VISION
PIXELS = 224
"""Images are 3 x PIXELS x PIXELS (MobileViT's 256 x 256 at the default)."""
AUDIO = 16000
"""Audio is one clip of this many samples (a second at 16 kHz)."""


def _input_shape(name: str) -> tuple[int, ...]:
    if name == "wav2vec2":
        return (1, AUDIO)
    side = 256 if name == "mobilevit-s" and PIXELS == 224 else PIXELS
    return (1, 3, side, side)


def _realistic_weights(model: Any) -> None:
    """Convolution and linear weights at He scale, batch norms with spread statistics: the configs' own
    initialization (normal, 0.02) shrinks a deep CNN's activations into float32's subnormals, where both
    engines would be timed on a path no trained model takes."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="linear")
                if m.bias is not None:
                    m.bias.normal_(0.0, 0.02)
            elif isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.0)
                m.bias.normal_(0.0, 0.1)


def export(name: str, cache: Path) -> Path:
    """The model's ONNX file in ``cache``, exported on first use."""
    size = f"h{HIDDEN}-l{LAYERS}-t{TOKENS}" if name in TEXT else str(_input_shape(name)[-1])
    path = cache / f"{name}-{size}.onnx"
    if path.exists():
        return path
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    text = name in TEXT
    model = (_configs() if text else _vision())[name]()
    model.config._attn_implementation = "eager"
    model.eval()
    if not text:
        _realistic_weights(model)

    class Hidden(torch.nn.Module):
        """The last hidden state: of one sequence with the mask all ones (what a served call passes), or of
        one image or clip."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            if text:
                return self.inner(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            return self.inner(x).last_hidden_state

    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randint(0, VOCAB, (1, TOKENS), generator=generator) if text else \
        torch.randn(*_input_shape(name), generator=generator)
    with warnings.catch_warnings():  # the exporter's notes on traced control flow
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(model), (x,), str(partial), input_names=["input"], output_names=["hidden"],
                          dynamo=False, opset_version=17)
    partial.replace(path)
    return path


def bench_model(name: str, path: Path, *, threads: int, repeat: int, warmup: int) -> dict[str, Any]:
    import onnxruntime as ort

    import cuvil
    from cuvil.errors import CuvilError

    session = ort.InferenceSession(str(path), ort_options(threads), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(SEED)
    x = rng.integers(0, VOCAB, (1, TOKENS)).astype(np.int64) if name in TEXT else \
        rng.standard_normal(_input_shape(name)).astype(np.float32)
    feeds = {session.get_inputs()[0].name: x}
    try:
        model = cuvil.compile(str(path), cache=False, threads=threads)
    except CuvilError as e:
        return {"model": name, "error": e.code}
    ours = np.asarray(model(**feeds))
    theirs = session.run(None, feeds)[0]
    for _ in range(warmup):
        model(**feeds)
        session.run(None, feeds)
    ms = interleaved_medians((("cuvil", lambda: model(**feeds)), ("ort", lambda: session.run(None, feeds))), repeat)
    cuvil_ms, ort_ms = ms["cuvil"], ms["ort"]
    return {"model": name, "cuvil_ms": cuvil_ms, "ort_ms": ort_ms, "ratio": cuvil_ms / ort_ms,
            "max_diff": float(np.max(np.abs(ours - theirs)))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transformers", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated names, or text / vision (default: every one)")
    parser.add_argument("--threads", type=int, default=1, help="threads for both engines (default 1)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per engine (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("CUVIL_BENCH_CACHE", Path.home() / ".cache" / "cuvil-bench")),
                        help="where the exported ONNX files are kept (default ~/.cache/cuvil-bench, or "
                             "$CUVIL_BENCH_CACHE)")
    args = parser.parse_args(argv)
    passive_torch_workers(args.threads)
    groups = {"text": TEXT, "vision": VISION}
    names = [n for m in args.models.split(",") if m for n in groups.get(m, (m,))]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    print(f"{'model':<16} {'cuvil ms':>10} {'ort ms':>10} {'cuvil/ort':>10} {'max |diff|':>11}", flush=True)
    for name in names:
        r = bench_model(name, export(name, args.cache), threads=args.threads, repeat=args.repeat, warmup=args.warmup)
        if "error" in r:
            print(f"{name:<16} {'':>10} {'':>10} {'':>10}  {r['error']}", flush=True)
            continue
        print(f"{name:<16} {r['cuvil_ms']:10.3f} {r['ort_ms']:10.3f} {r['ratio']:10.2f} {r['max_diff']:11.1e}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
