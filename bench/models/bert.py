"""BERT-style encoder: token + position embeddings, LayerNorm, post-norm layers with multi-head
self-attention and an erf-GELU feed-forward block. Input: int64 token ids."""

from __future__ import annotations

import math
from typing import Any

from bench.models import ZooModel, seeded_generator


def _config(small: bool) -> dict[str, int]:
    if small:
        return {"layers": 2, "d": 64, "heads": 4, "ffn": 128, "vocab": 128, "seq": 16, "max_pos": 32}
    return {"layers": 4, "d": 256, "heads": 4, "ffn": 1024, "vocab": 8192, "seq": 128, "max_pos": 512}


def build_bert(small: bool) -> Any:
    import torch
    import torch.nn as nn

    class EncoderLayer(nn.Module):
        def __init__(self, d: int, heads: int, ffn: int) -> None:
            super().__init__()
            self.heads = heads
            self.q = nn.Linear(d, d)
            self.k = nn.Linear(d, d)
            self.v = nn.Linear(d, d)
            self.out = nn.Linear(d, d)
            self.ln1 = nn.LayerNorm(d, eps=1e-12)
            self.ffn1 = nn.Linear(d, ffn)
            self.ffn2 = nn.Linear(ffn, d)
            self.act = nn.GELU()  # the exact (erf) form
            self.ln2 = nn.LayerNorm(d, eps=1e-12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            h = self.heads
            dh = d // h

            def split(t: torch.Tensor) -> torch.Tensor:
                return t.view(b, s, h, dh).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            ctx = ctx.transpose(1, 2).reshape(b, s, d)
            x = self.ln1(x + self.out(ctx))
            return self.ln2(x + self.ffn2(self.act(self.ffn1(x))))

    class BertEncoder(nn.Module):
        def __init__(self, layers: int, d: int, heads: int, ffn: int, vocab: int, max_pos: int) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_pos, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(EncoderLayer(d, heads, ffn) for _ in range(layers))

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(input_ids.shape[1], dtype=torch.int64)
            x = self.ln(self.tok(input_ids) + self.pos(positions).unsqueeze(0))
            for layer in self.layers:
                x = layer(x)
            return x

    cfg = _config(small)
    model = BertEncoder(cfg["layers"], cfg["d"], cfg["heads"], cfg["ffn"], cfg["vocab"], cfg["max_pos"])
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.75, 1.25)
                m.bias.normal_(0.0, 0.05)
    return model


def bert_inputs(small: bool, batch: int, seq: int | None = None) -> tuple[Any, ...]:
    import torch

    cfg = _config(small)
    return (torch.randint(0, cfg["vocab"], (batch, seq or cfg["seq"]), generator=seeded_generator("bert"),
                          dtype=torch.int64),)


BERT = ZooModel("bert", "BERT-style encoder: 4 layers, d=256, 4 heads, FFN 1024, seq 128", build_bert, bert_inputs,
                ("input_ids",), ("hidden",))
