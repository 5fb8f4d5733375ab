"""Tiny Hugging Face models, built offline from configs (no hub access), through torch.export -> CIR,
compared with eager PyTorch. Eager attention and fixed seeds; hidden 32, 2 layers, vocab 100."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cuvil  # noqa: E402
from cuvil.ir.parser import parse_module  # noqa: E402
from tests.oracles import assert_agrees  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 100
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "attn_implementation": "eager"}


def _ids(batch: int, seq: int, seed: int = 0) -> Any:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _bert() -> tuple[Any, dict[str, Any]]:
    cfg = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **TINY)
    return transformers.BertModel(cfg), {"input_ids": _ids(2, 8)}


def _gpt2() -> tuple[Any, dict[str, Any]]:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg), {"input_ids": _ids(2, 8)}


def _vit() -> tuple[Any, dict[str, Any]]:
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, **TINY)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return transformers.ViTModel(cfg), {"pixel_values": pixels}


def _t5() -> tuple[Any, dict[str, Any]]:
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                attn_implementation="eager", use_cache=False)
    return transformers.T5Model(cfg), {"input_ids": _ids(2, 8), "decoder_input_ids": _ids(2, 5, seed=1)}


def _llama() -> tuple[Any, dict[str, Any]]:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager", use_cache=False)
    return transformers.LlamaModel(cfg), {"input_ids": _ids(2, 8)}


def _pixels(size: int) -> Any:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def _bart() -> tuple[Any, dict[str, Any]]:
    """Its decoder inputs are the ids shifted right: an in-place slice assignment (``slice_scatter``)."""
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64, attn_implementation="eager",
                                  use_cache=False)
    return transformers.BartModel(cfg), {"input_ids": _ids(2, 8)}


def _swin() -> tuple[Any, dict[str, Any]]:
    """Shifted windows, and a pooled output the export re-strides (``as_strided``)."""
    cfg = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1],
                                  num_heads=[2, 2], window_size=4)
    return transformers.SwinModel(cfg), {"pixel_values": _pixels(32)}


def _convnextv2() -> tuple[Any, dict[str, Any]]:
    """Global response normalization: a vector norm over the spatial axes (``linalg_vector_norm``)."""
    cfg = transformers.ConvNextV2Config(num_channels=3, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    return transformers.ConvNextV2Model(cfg), {"pixel_values": _pixels(32)}


def _wav2vec2() -> tuple[Any, dict[str, Any]]:
    """A convolutional feature encoder, group norm, and a weight-normalized positional convolution."""
    cfg = transformers.Wav2Vec2Config(vocab_size=VOCAB, conv_dim=[8, 8], conv_stride=[5, 2], conv_kernel=[10, 3],
                                      num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, **TINY)
    audio = torch.randn(2, 400, generator=torch.Generator().manual_seed(0))
    return transformers.Wav2Vec2Model(cfg), {"input_values": audio}


def _beit() -> tuple[Any, dict[str, Any]]:
    """A relative position bias: indices into its table computed from aranges, gathered per layer."""
    cfg = transformers.BeitConfig(image_size=16, patch_size=4, use_relative_position_bias=True, **TINY)
    return transformers.BeitModel(cfg), {"pixel_values": _pixels(16)}


def _rwkv() -> tuple[Any, dict[str, Any]]:
    """A recurrence unrolled over the tokens (max-shifted exponentials), its time shift a pad by -1 (a crop),
    and each layer's initial state folded to one constant."""
    cfg = transformers.RwkvConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16,
                                  intermediate_size=32, context_length=16, use_cache=False)
    return transformers.RwkvModel(cfg), {"input_ids": _ids(2, 8)}


def _bit() -> tuple[Any, dict[str, Any]]:
    """Weight-standardized convolutions: a batch norm of the weights over their own statistics."""
    cfg = transformers.BitConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=4)
    return transformers.BitModel(cfg), {"pixel_values": _pixels(32)}


def _timesformer() -> tuple[Any, dict[str, Any]]:
    """Divided space-time attention: every block's tokens go through a reshape round trip between the
    temporal and the spatial layout (canonicalize removes it; its proof pairs the blocks one after another)."""
    cfg = transformers.TimesformerConfig(image_size=16, patch_size=8, num_frames=2, **{
        k: v for k, v in TINY.items() if k != "attn_implementation"})
    video = torch.randn(1, 2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return transformers.TimesformerModel(cfg), {"pixel_values": video}


MODELS: dict[str, Callable[[], tuple[Any, dict[str, Any]]]] = {
    "bert": _bert, "gpt2": _gpt2, "vit": _vit, "t5": _t5, "llama": _llama, "bart": _bart, "swin": _swin,
    "convnextv2": _convnextv2, "wav2vec2": _wav2vec2, "beit": _beit, "rwkv": _rwkv, "bit": _bit,
    "timesformer": _timesformer}


def _build(name: str) -> tuple[Any, dict[str, Any]]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = MODELS[name]()
    return model.eval(), inputs


def _eager(model: Any, inputs: dict[str, Any]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(**inputs)
    return [t.numpy() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_matches_eager(name: str) -> None:
    model, inputs = _build(name)
    module = cuvil.import_model(model, inputs)
    assert [p.name for p in module.main.params] == list(inputs)
    assert "last_hidden_state" in module.main.result_names
    assert parse_module(str(module)) == module
    outs = cuvil.run_reference(module, {k: v.numpy() for k, v in inputs.items()})
    assert_agrees(outs, _eager(model, inputs))


def test_hf_decoder_with_dynamic_sequence_length() -> None:
    """The causal mask is built from the sequence length, so it must follow the symbol."""
    model, inputs = _build("gpt2")
    seq = torch.export.Dim("seq", min=2, max=64)
    module = cuvil.import_model(model, inputs, dynamic_shapes={"input_ids": {1: seq}})
    assert [str(d) for d in module.main.params[0].shape] == ["2", "seq"]
    for s in (3, 13):
        ids = {"input_ids": _ids(2, s, seed=s)}
        outs = cuvil.run_reference(module, {"input_ids": ids["input_ids"].numpy()})
        assert_agrees(outs, _eager(model, ids))


def test_mobilevitv2_folds_and_unfolds_patches() -> None:
    """Its patches are an unfold and a fold, which decompose to gathers and an accumulating index_put; the
    norms get non-trivial affine parameters, so the output is not the zeros a fresh model's can be."""
    cfg = transformers.MobileViTV2Config(image_size=64, width_multiplier=0.25)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.MobileViTV2Model(cfg).eval()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)):
                    m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    inputs = {"pixel_values": _pixels(64)}
    module = cuvil.import_model(model, inputs)
    assert any(v.op == "scatter_nd" for v in module.main.ops())
    expected = _eager(model, inputs)
    assert float(np.max(np.abs(expected[0]))) > 0.1
    assert_agrees(cuvil.run_reference(module, {"pixel_values": inputs["pixel_values"].numpy()}), expected)
