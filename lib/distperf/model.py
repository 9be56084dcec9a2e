"""The Transformer the trainers run, built from the same :class:`~distperf.config.ModelSpec` as the
cost model.

Shapes follow the cost model (chapter "The analytical framework"): per layer a fused QKV projection
h → 3h, an output projection h → h, an MLP h → ffn → h, and two LayerNorms: 4h² + 2h·ffn weights
plus biases. GPT is causal (pre-LN, as GPT-2); BERT is the same stack without the causal mask.

The whole model is token embedding (V·h) + learned positions (s·h), the layers, a final LayerNorm and
an output head (tied to the token embedding unless ``spec.tied`` is false). :class:`Transformer`
holds any contiguous slice of it — that is what a pipeline stage is — and names its parameters as
the whole model does (``layers.5.attn.qkv.weight``), so that every strategy's parameters can be
compared with the single-device reference name by name. :func:`init_parameters` draws each
parameter from a generator seeded by (seed, name): a stage is initialised exactly like the same
layers of the whole model, without building the whole model.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .config import RECOMPUTE, ModelSpec


class Dropout(nn.Module):
    """Dropout that keeps a one-byte mask for backward on every device: ``torch.native_dropout`` (a bool mask, as
    CUDA's ``F.dropout`` keeps and Korthikanti et al. 2022 count). torch 2.13's ``F.dropout`` on CPU instead
    multiplies by a noise tensor of the input's dtype (``_dropout_impl``), which backward keeps: 4 bytes an
    element in fp32, so the memory of a CPU run would not be the memory of a GPU run."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


class Attention(nn.Module):
    """Multi-head self-attention with a fused QKV projection.

    The QKV output is laid out head by head, ``[q_0 k_0 v_0 | q_1 k_1 v_1 | …]`` (Megatron-LM's
    layout), so that a column-parallel shard of ``qkv`` holds whole heads; the number of heads is
    read from the local width, so a tensor-parallel shard keeps ``head_dim``.

    The attention core runs as ``spec.attention`` says:

    - ``sdpa``: torch's fused ``F.scaled_dot_product_attention``. On CPU without dropout torch 2.13 runs its
      flash kernel (``_scaled_dot_product_flash_attention_for_cpu``), which keeps q, k, v, its output and the
      log-sum-exp of each row (b·a·s fp32) for backward, never the s×s scores. With dropout on CPU it falls back
      to the unfused math kernel (``_scaled_dot_product_attention_math``);
    - ``math``: the explicit softmax(QKᵀ/√d + causal mask)·V with dropout on the probabilities, the unfused
      form Korthikanti et al. 2022 count: backward keeps q, k, v, the softmax output (a·s² values per
      sequence), the dropout mask (a·s² bytes) and the dropout output (a·s² values). The softmax runs in fp32
      on every device (CUDA's autocast runs softmax in fp32, CPU's in bf16), then is cast back.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim, self.causal = spec.head_dim, spec.arch == "gpt"
        self.qkv = nn.Linear(spec.hidden, 3 * spec.hidden)
        self.proj = nn.Linear(spec.hidden, spec.hidden)
        self.dropout = spec.dropout
        self.implementation = spec.attention
        self.recompute = False  # selective recomputation: keep only the inputs of the attention core

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        if self.implementation == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=p)
        # q @ kᵀ and probabilities @ v keep their inputs; a scale by a number and an additive mask keep nothing
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if self.causal:
            s = scores.shape[-1]
            scores = scores + torch.full((s, s), float("-inf"), device=scores.device, dtype=scores.dtype).triu(1)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # fp32, as CUDA's autocast runs it
        if p > 0.0:
            probs = torch.native_dropout(probs, p, True)[0]
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        b, s, _ = qkv.shape  # with sequence parallelism x holds s/t positions, qkv all s
        q, k, v = qkv.reshape(b, s, -1, 3 * self.head_dim).transpose(1, 2).split(self.head_dim, dim=-1)
        if self.recompute and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
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
        self.drop = Dropout(spec.dropout)
        self.recompute = False  # full recomputation: keep only the layer's input

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Transformer(nn.Module):
    """A contiguous slice of the model: [embeddings] + layers ``layer_ids`` + [final LN + head].

    With the defaults it is the whole model. Input: token ids (b, s) if it holds the embeddings,
    else activations (b, s, h); output: logits (b, s, V) if it holds the head, else activations.
    A last stage without the embeddings but with a tied head gets its own copy of the token
    embedding as head weight (Megatron's convention); the trainer keeps the copies equal by summing
    their gradients.
    """

    def __init__(self, spec: ModelSpec, layer_ids=None, embed: bool = True, head: bool = True):
        super().__init__()
        self.spec = spec
        self.has_embed, self.has_head = embed, head
        layer_ids = range(spec.layers) if layer_ids is None else layer_ids
        if embed:
            self.tok = nn.Embedding(spec.vocab, spec.hidden)
            self.pos = nn.Embedding(spec.seq, spec.hidden)
            self.drop = Dropout(spec.dropout)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in layer_ids})
        if head:
            self.ln_f = nn.LayerNorm(spec.hidden)
            self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)
            if spec.tied and embed:
                self.head.weight = self.tok.weight
        self.autocast_dtype: torch.dtype | None = None  # mixed precision: compute dtype under autocast

    @property
    def layer_ids(self) -> list[int]:
        return [int(k) for k in self.layers]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = (x.device.type if x.device.type in ("cpu", "cuda") else "cpu")
        amp = (torch.autocast(device_type, dtype=self.autocast_dtype) if self.autocast_dtype else nullcontext())
        with amp:
            if self.has_embed:
                positions = torch.arange(x.shape[1], device=x.device)
                x = self.drop(self.tok(x) + self.pos(positions))
            for layer in self.layers.values():
                x = layer(x)
            if self.has_head:
                x = self.head(self.ln_f(x))
        return x


def build_model(spec: ModelSpec, seed: int = 0, layer_ids=None, embed: bool = True, head: bool = True,
                device="cpu") -> Transformer:
    """The whole model (defaults) or one slice of it, initialised from ``seed`` by parameter name."""
    model = Transformer(spec, layer_ids, embed, head)
    init_parameters(model, seed)
    return model.to(device)


def build_stages(spec: ModelSpec, partition, seed: int = 0, device="cpu") -> list[Transformer]:
    """One :class:`Transformer` per pipeline stage for ``partition`` (layers per stage, in order):
    the embeddings on the first stage, final LayerNorm and head on the last."""
    stages, start = [], 0
    for i, n in enumerate(partition):
        stages.append(build_model(spec, seed, range(start, start + n), embed=i == 0, head=i == len(partition) - 1,
                                  device=device))
        start += n
    if start != spec.layers:
        raise ValueError(f"partition {tuple(partition)} covers {start} layers, the model has {spec.layers}")
    return stages


def build_stage(spec: ModelSpec, partition, stage_index: int, seed: int = 0, device="cpu") -> Transformer:
    """Stage ``stage_index`` of ``partition`` alone (what one pipeline rank builds)."""
    start = sum(partition[:stage_index])
    return build_model(spec, seed, range(start, start + partition[stage_index]), embed=stage_index == 0,
                       head=stage_index == len(partition) - 1, device=device)


def set_recompute(model: nn.Module, mode: str) -> None:
    """Activation recomputation: ``none``; ``selective`` (the attention core, softmax(QKᵀ)V, is
    recomputed: Korthikanti et al. 2022); ``full`` (each layer keeps only its input)."""
    if mode not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {mode!r}")
    for m in model.modules():
        if isinstance(m, Block):
            m.recompute = mode == "full"
        elif isinstance(m, Attention):
            m.recompute = mode == "selective"


def _param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def init_parameters(model: Transformer, seed: int, std: float = 0.02) -> None:
    """GPT-2 initialisation, reproducible per parameter name: normal(0, std) for Linear and Embedding
    weights, zero biases, unit LayerNorm. A tied head copy is drawn as ``tok.weight``."""
    for mname, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            name = f"{mname}.weight"
            if mname == "head" and model.spec.tied:
                name = "tok.weight"
            g = torch.Generator().manual_seed(_param_seed(seed, name))
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
            if getattr(m, "bias", None) is not None:
                m.bias.zero_()
        elif isinstance(m, nn.LayerNorm):
            m.reset_parameters()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (next-token prediction for GPT; the same loss for our BERT)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


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
