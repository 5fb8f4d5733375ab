"""``python -m bench.transformers``: Cuvil against ONNX Runtime on transformers models built from their
configs (random weights, fixed seed, eager attention; nothing is fetched from a model hub).

Each model is built at one size (hidden 256, two layers, four heads, vocabulary 1000, one sequence of 64
tokens), exported once with ``torch.onnx`` (opset 17; the attention mask all ones, made inside the graph)
into ``--cache`` and compiled by Cuvil from that file as a user would (``cuvil.compile(path)``); the two
engines are called in turn, medians and their ratio. The models are the decoder and encoder families users
bring most: GPT-2 and Phi (tanh GELU written with ``x ** 3``), LLaMA, Qwen2 and T5 (RMS norms, ``x ** 2``),
GPT-NeoX, BLOOM, RoBERTa and DistilBERT.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import ort_options

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


MODELS = ("gpt2", "phi", "llama", "qwen2", "t5-encoder", "gpt-neox", "bloom", "roberta", "distilbert")


def export(name: str, cache: Path) -> Path:
    """The model's ONNX file in ``cache``, exported on first use."""
    path = cache / f"{name}-h{HIDDEN}-l{LAYERS}-t{TOKENS}.onnx"
    if path.exists():
        return path
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    model = _configs()[name]()
    model.config._attn_implementation = "eager"
    model.eval()

    class Hidden(torch.nn.Module):
        """The last hidden state of one sequence, the mask all ones (it is what a served call passes)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, ids: Any) -> Any:
            return self.inner(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state

    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(SEED))
    with warnings.catch_warnings():  # the exporter's notes on traced control flow
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(model), (ids,), str(partial), input_names=["input_ids"], output_names=["hidden"],
                          dynamo=False, opset_version=17)
    partial.replace(path)
    return path


def bench_model(name: str, path: Path, *, threads: int, repeat: int, warmup: int) -> dict[str, Any]:
    import onnxruntime as ort

    import cuvil
    from cuvil.errors import CuvilError

    session = ort.InferenceSession(str(path), ort_options(threads), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(SEED).integers(0, VOCAB, (1, TOKENS)).astype(np.int64)
    feeds = {session.get_inputs()[0].name: ids}
    try:
        model = cuvil.compile(str(path), cache=False, threads=threads)
    except CuvilError as e:
        return {"model": name, "error": e.code}
    ours = np.asarray(model(**feeds))
    theirs = session.run(None, feeds)[0]
    for _ in range(warmup):
        model(**feeds)
        session.run(None, feeds)
    times: dict[str, list[float]] = {"cuvil": [], "ort": []}
    calls = (("cuvil", lambda: model(**feeds)), ("ort", lambda: session.run(None, feeds)))
    for k in range(repeat):
        for engine, call in calls[:: 1 if k % 2 else -1]:
            t0 = time.perf_counter()
            call()
            times[engine].append(time.perf_counter() - t0)
    cuvil_ms, ort_ms = (float(np.median(times[n])) * 1e3 for n in ("cuvil", "ort"))
    return {"model": name, "cuvil_ms": cuvil_ms, "ort_ms": ort_ms, "ratio": cuvil_ms / ort_ms,
            "max_diff": float(np.max(np.abs(ours - theirs)))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transformers", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    parser.add_argument("--threads", type=int, default=1, help="threads for both engines (default 1)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per engine (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("CUVIL_BENCH_CACHE", Path.home() / ".cache" / "cuvil-bench")),
                        help="where the exported ONNX files are kept (default ~/.cache/cuvil-bench, or "
                             "$CUVIL_BENCH_CACHE)")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    print(f"{'model':<12} {'cuvil ms':>10} {'ort ms':>10} {'cuvil/ort':>10} {'max |diff|':>11}", flush=True)
    for name in names:
        r = bench_model(name, export(name, args.cache), threads=args.threads, repeat=args.repeat, warmup=args.warmup)
        if "error" in r:
            print(f"{name:<12} {'':>10} {'':>10} {'':>10}  {r['error']}", flush=True)
            continue
        print(f"{name:<12} {r['cuvil_ms']:10.3f} {r['ort_ms']:10.3f} {r['ratio']:10.2f} {r['max_diff']:11.1e}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
