"""The Transformer the trainers run, built from the same :class:`~distperf.config.ModelSpec` as the
cost model.

Shapes follow the cost model (chapter "The analytical framework"): per layer a fused QKV projection
h → 3h, an output projection h → h, an MLP h → ffn → h, and two LayerNorms: 4h² + 2h·ffn weights
plus biases. GPT is causal (pre-LN, as GPT-2); BERT is the same stack without the causal mask.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelSpec


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim, self.causal = spec.head_dim, spec.arch == "gpt"
        self.qkv = nn.Linear(spec.hidden, 3 * spec.hidden)
        self.proj = nn.Linear(spec.hidden, spec.hidden)
        self.dropout = spec.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # Heads from the local width, so that a tensor-parallel shard (fewer columns) keeps head_dim.
        q, k, v = (t.reshape(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.fc = nn.Linear(spec.hidden, spec.ffn)
        self.out = nn.Linear(spec.ffn, spec.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One pre-LN Transformer layer: x + attn(ln1(x)), then + mlp(ln2(·))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(spec.hidden), nn.LayerNorm(spec.hidden)
        self.attn, self.mlp = Attention(spec), MLP(spec)
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def layer_input(spec: ModelSpec, batch: int, device="cpu", dtype=torch.float32, generator=None) -> torch.Tensor:
    """A random activation of shape (b, s, h) as it enters a Transformer layer."""
    return torch.randn(batch, spec.seq, spec.hidden, device=device, dtype=dtype, generator=generator) / math.sqrt(spec.hidden)
