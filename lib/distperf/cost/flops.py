"""Floating-point operations of training, counted as Megatron-LM counts them.

Only matrix products count, at 2 FLOPs per multiply-add; LayerNorm, softmax, GeLU and biases are left
out. A backward pass costs twice its forward pass (gradients with respect to inputs and to weights).
Attention counts the full s×s score matrix, causal or not, as Megatron-LM does.
"""
from __future__ import annotations


def layer_forward_flops(b: int, s: int, h: int, ffn: int) -> int:
    """Forward of one layer on b sequences: 2bs·(3h² + h² + 2h·ffn) for the four projections plus
    2bs²h for QKᵀ and 2bs²h for attention × V; 24bsh² + 4bs²h for ffn = 4h (Narayanan et al. 2021, §5.1)."""
    return 2 * b * s * (4 * h * h + 2 * h * ffn) + 4 * b * s * s * h


def attention_core_forward_flops(b: int, s: int, h: int) -> int:
    """QKᵀ and attention × V: 4bs²h — what selective recomputation recomputes (Korthikanti et al. 2022, §5)."""
    return 4 * b * s * s * h


def head_forward_flops(b: int, s: int, h: int, vocab: int) -> int:
    """The output projection: 2bshV."""
    return 2 * b * s * h * vocab


def recompute_forward_flops(b: int, s: int, h: int, ffn: int, recompute: str) -> int:
    """Extra forward work per layer in backward: none, the attention core (selective), or the whole layer (full)."""
    if recompute == "full":
        return layer_forward_flops(b, s, h, ffn)
    if recompute == "selective":
        return attention_core_forward_flops(b, s, h)
    return 0


def model_flops(batch: int, layers: int, s: int, h: int, ffn: int, vocab: int) -> int:
    """Model FLOPs of one iteration on a global batch B: 3·(L·layer forward + head forward).

    For ffn = 4h this is 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) (Narayanan et al. 2021, §5.1,
    without recomputation).
    """
    return 3 * (layers * layer_forward_flops(batch, s, h, ffn) + head_forward_flops(batch, s, h, vocab))


def hardware_flops(batch: int, layers: int, s: int, h: int, ffn: int, vocab: int, recompute: str) -> int:
    """Model FLOPs plus what recomputation repeats: one more forward of every layer (full) or of every
    attention core (selective); the head is not recomputed.

    For full recomputation and ffn = 4h: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) (Narayanan et al. 2021, §5.1).
    """
    return model_flops(batch, layers, s, h, ffn, vocab) + layers * recompute_forward_flops(batch, s, h, ffn, recompute)


def narayanan_flops(batch: int, layers: int, s: int, h: int, vocab: int, full_recompute: bool) -> float:
    """The closed forms: 72·B·s·L·h²·(1 + s/(6h) + V/(12Lh)), or 96·B·s·L·h²·(1 + s/(6h) + V/(16Lh))
    with full recomputation (Narayanan et al. 2021, §5.1)."""
    if full_recompute:
        return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))
