"""Parameter counts: per layer, per pipeline stage, per tensor-parallel rank, and the whole model.

Shapes are those of :mod:`distperf.model` (a pre-LN Transformer layer with a fused QKV projection) and
the conventions of the book: token and learned position embeddings on the first pipeline stage, final
LayerNorm and head on the last; tensor parallelism as in Megatron-LM (Shoeybi et al. 2019, §3): QKV and
fc column-parallel (weights and biases sharded), proj and out row-parallel (weights sharded, biases
replicated), LayerNorms, embeddings and head replicated (no vocabulary parallelism).
"""
from __future__ import annotations

from functools import lru_cache


def layer_parameters(h: int, ffn: int) -> int:
    """One Transformer layer: attention 4h² + 4h, MLP 2h·ffn + ffn + h, two LayerNorms 4h.

    Total 4h² + 2h·ffn + 9h + ffn, which is 12h² + 13h for ffn = 4h (Narayanan et al. 2021, §5.1).
    """
    return 4 * h * h + 2 * h * ffn + 9 * h + ffn


def layer_parameters_per_tp_rank(h: int, ffn: int, tp: int) -> int:
    """One layer on one of t tensor-parallel ranks: (4h² + 2h·ffn + 3h + ffn)/t sharded + 6h replicated.

    Sharded: QKV weight and bias, proj weight, fc weight and bias, out weight. Replicated: the proj and
    out biases (2h) and the two LayerNorms (4h). With t = 1 this is :func:`layer_parameters`.
    """
    return (4 * h * h + 2 * h * ffn + 3 * h + ffn) // tp + 6 * h


@lru_cache(maxsize=4096)
def layer_tensors(h: int, ffn: int, tp: int) -> tuple[tuple[int, int], ...]:
    """The layer's parameter tensors on one tensor-parallel rank, as (dim-0 size, elements) pairs.

    nn.Linear stores its weight as (out, in), so a column-parallel weight is sharded on dim 0 and a
    row-parallel one on dim 1. FSDP shards along dim 0 and ZeroRedundancyOptimizer assigns whole
    tensors, so both need the tensors, not just their sum.
    """
    return (
        (h, h), (h, h),  # ln1 weight, bias
        (3 * h // tp, 3 * h // tp * h), (3 * h // tp, 3 * h // tp),  # qkv weight, bias (column)
        (h, h * h // tp), (h, h),  # proj weight (row), bias (replicated)
        (h, h), (h, h),  # ln2 weight, bias
        (ffn // tp, ffn // tp * h), (ffn // tp, ffn // tp),  # fc weight, bias (column)
        (h, h * ffn // tp), (h, h),  # out weight (row), bias (replicated)
    )


def embedding_parameters(h: int, vocab: int, seq: int) -> int:
    """Token embedding V·h plus learned positions s·h, on the first pipeline stage."""
    return (vocab + seq) * h


def head_parameters(h: int, vocab: int, tied: bool, pp: int) -> int:
    """Final LayerNorm (2h) plus the output projection on the last stage.

    The projection adds V·h when it is untied, or when it is tied but the pipeline has more than one
    stage: the last stage then keeps its own copy of the token embedding (Megatron-LM's convention)
    and the two copies' gradients are all-reduced each step.
    """
    return 2 * h + (vocab * h if (not tied or pp > 1) else 0)


def model_parameters(layers: int, h: int, ffn: int, vocab: int, seq: int, tied: bool) -> int:
    """Unique parameters of the model: L·layer + embeddings + final LayerNorm + untied head."""
    return layers * layer_parameters(h, ffn) + embedding_parameters(h, vocab, seq) + 2 * h + (0 if tied else vocab * h)


def narayanan_parameters(layers: int, h: int, vocab: int, seq: int) -> float:
    """P = 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h)) (Narayanan et al. 2021, §5.1, GPT with tied
    embeddings and learned positions; it leaves out the final LayerNorm's 2h)."""
    return 12 * layers * h * h * (1 + 13 / (12 * h) + (vocab + seq) / (12 * layers * h))
