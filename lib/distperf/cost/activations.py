"""Activation memory: what one microbatch leaves stashed for the backward pass.

The per-layer terms follow Korthikanti et al. 2022 (arXiv 2205.05198, §4.1 and Table 2). With 16-bit
activations and dropout a layer stashes, in bytes,

    sbh·(34 + 5as/h) = 10·sbh   (LayerNorm inputs 4, QKV and fc inputs 2 + 2, two dropout masks 1 + 1)
                     + 24·sbh   (Q and K 4, V 2, proj input 2, GeLU input 8, fc2 input 8)
                     + 5·as²b   (softmax output 2, its dropout mask 1, dropout output 2).

Here each term is kept apart by what it is made of, so that the same count serves fp32 (4-byte values)
and training without dropout (no masks, and no dropout output: the softmax output serves attention × V):

* replicated region: 4·sbh values + 2·sbh mask bytes; tensor parallelism does not shard it, sequence
  parallelism does (÷t);
* tensor-parallel region: 12·sbh values, ÷t;
* attention scores: as²b values (+ as²b mask bytes + as²b values with dropout), ÷t.

Recomputation (Korthikanti et al. 2022, §5): *selective* drops the attention scores and recomputes them
in backward; *full* keeps only each layer's input, sbh values (÷t with sequence parallelism, since the
input is then sharded along the sequence), and recomputes the whole layer in backward. This is
per-layer checkpointing, as Megatron-LM's ``--checkpoint-num-layers 1`` and the PipeDream-2BW runs use.
"""
from __future__ import annotations


def layer_terms(s: int, b: int, h: int, a: int, t: int, sp: bool, dropout: bool, value_bytes: int) -> tuple[float, float, float]:
    """(replicated region, tensor-parallel region, attention scores) bytes of one layer on one rank."""
    sbh = s * b * h
    replicated = (4 * sbh * value_bytes + (2 * sbh if dropout else 0)) / (t if sp else 1)
    parallel = 12 * sbh * value_bytes / t
    scores = a * s * s * b * ((2 * value_bytes + 1) if dropout else value_bytes) / t
    return replicated, parallel, scores


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, dropout: bool = True,
                           value_bytes: int = 2, recompute: str = "none") -> float:
    """Bytes one layer stashes per microbatch on one tensor-parallel rank (Korthikanti et al. 2022, Table 2).

    16-bit with dropout: none → sbh(34 + 5as/h) for t = 1; sbh(10 + 24/t + 5as/(ht)) with tensor
    parallelism; sbh(34 + 5as/h)/t with sequence parallelism; selective → sbh(10 + 24/t), or 34·sbh/t
    with sequence parallelism; full → 2·sbh (÷t with sequence parallelism).
    """
    if recompute == "full":
        return s * b * h * value_bytes / (t if sp else 1)
    replicated, parallel, scores = layer_terms(s, b, h, a, t, sp, dropout, value_bytes)
    if recompute == "selective":
        return replicated + parallel
    return replicated + parallel + scores


def recompute_working_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, dropout: bool, value_bytes: int,
                            recompute: str) -> float:
    """Transient bytes while one recomputed layer runs its backward: the whole layer's activations
    (full) or its attention scores (selective); none without recomputation. Counted once per rank."""
    if recompute == "none":
        return 0.0
    replicated, parallel, scores = layer_terms(s, b, h, a, t, sp, dropout, value_bytes)
    return replicated + parallel + scores if recompute == "full" else scores


def embedding_stash_bytes(s: int, b: int, h: int, dropout: bool) -> int:
    """First stage, per microbatch: the token ids (int64, 8·bs) and the embedding dropout mask (sbh)."""
    return 8 * b * s + (s * b * h if dropout else 0)


def head_stash_bytes(s: int, b: int, h: int, vocab: int, t: int, sp: bool, value_bytes: int) -> float:
    """Last stage, per microbatch: the final LayerNorm input (sbh values, ÷t with sequence parallelism),
    the head input (sbh values), the fp32 log-softmax output of the cross-entropy (4·bsV) and the
    int64 targets (8·bs). The head is not recomputed."""
    sbh = s * b * h
    return sbh * value_bytes / (t if sp else 1) + sbh * value_bytes + 4 * b * s * vocab + 8 * b * s
