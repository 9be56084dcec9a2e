"""Activation memory: what one microbatch leaves stashed for the backward pass, under two conventions.

**The papers' count** (``convention="paper"``): Korthikanti et al. 2022 (arXiv 2205.05198, §4.1 and Table 2).
With 16-bit activations and dropout a layer of the unfused attention stashes, in bytes,

    sbh·(34 + 5as/h) = 10·sbh   (LayerNorm inputs 4, QKV and fc inputs 2 + 2, two dropout masks 1 + 1)
                     + 24·sbh   (Q and K 4, V 2, proj input 2, GeLU input 8, fc2 input 8)
                     + 5·as²b   (softmax output 2, its dropout mask 1, dropout output 2).

Each term is kept apart by what it is made of (:func:`layer_terms`), so that the same count serves fp32
(4-byte values) and training without dropout (no masks, and no dropout output: the softmax output serves
attention × V): a replicated region, 4·sbh values + 2·sbh mask bytes, which tensor parallelism does not shard
and sequence parallelism does (÷t); a tensor-parallel region, (4h + 2·ffn)·sb values (12·sbh for ffn = 4h), ÷t;
the attention scores, as²b values (+ as²b mask bytes + as²b values with dropout), ÷t. A fused attention
(``sdpa``) keeps no scores: its count is Korthikanti's selective-recomputation row.

**What the trainer keeps** (``convention="trainer"``, the default of :func:`distperf.cost.predict`): the
saved tensors of :class:`distperf.model.Transformer` under torch 2.13, read off ``saved_tensors_hooks`` (one
storage counted once however many views share it). Per layer and microbatch on one tensor-parallel rank, with
S = s·b, value bytes v (4 in fp32; under bf16 autocast, ``mixed``, the linear layers' inputs and outputs are
bf16 copies, v = 2, while the residual stream and the LayerNorms stay fp32):

- the two LayerNorm inputs, fp32 (2·sbh·4), with each LayerNorm's mean and 1/σ (2·S·4); their dropout masks
  (1 byte, :class:`distperf.model.Dropout`); ÷t with sequence parallelism;
- the inputs of QKV and fc, 2·sbh·v: not sharded by sequence parallelism, whose DTensor all-gather hands the
  whole sequence to the linear layer, which keeps it (Megatron-LM keeps the shard and gathers again in backward);
- the QKV output 3·sbh·v (q, k and v are views of it), the GeLU input and output 2·ffn·S·v, ÷t;
- the attention core: ``sdpa`` (torch's flash kernel for CPU, ``_scaled_dot_product_flash_attention_for_cpu``,
  as FlashAttention on CUDA) keeps its output (sbh·v, which the output projection keeps as its input) and the
  log-sum-exp of every row, a·S fp32; ``math`` keeps the output projection's input (sbh·v) and the scores:
  the softmax output in fp32 (:class:`distperf.model.Attention` computes softmax in fp32, as CUDA's autocast
  does), under autocast also its bf16 copy, and with dropout the mask (1 byte) and the dropout output (v);
- under autocast, the bf16 copy of each weight that a linear layer keeps for its backward, (4h² + 2h·ffn)·2/t
  bytes: autocast caches one cast per weight and forward, so every microbatch in flight holds its own.

Recomputation (Korthikanti et al. 2022, §5): *selective* recomputes the attention core (drops the scores, or
sdpa's log-sum-exp); *full* keeps only each layer's input, sbh values (fp32 for the trainer; ÷t with sequence
parallelism, since the input is then sharded along the sequence), and recomputes the whole layer in backward.
This is per-layer checkpointing, as Megatron-LM's ``--checkpoint-num-layers 1`` and the PipeDream-2BW runs use.
What a recomputed layer rebuilds while its backward runs (:func:`working_bytes`) is not a saved tensor in
torch (checkpoint keeps it in its own holder): the measurement files it under temporaries.
"""
from __future__ import annotations

CONVENTIONS = ("trainer", "paper")


# The papers' count (Korthikanti et al. 2022) --------------------------------------------------------------

def layer_terms(s: int, b: int, h: int, a: int, t: int, sp: bool, dropout: bool, value_bytes: int,
                ffn: int | None = None) -> tuple[float, float, float]:
    """(replicated region, tensor-parallel region, attention scores) bytes of one layer on one rank, as
    Korthikanti et al. count them (``ffn`` defaults to 4h, their 24·sbh/t)."""
    sbh = s * b * h
    ffn = 4 * h if ffn is None else ffn
    replicated = (4 * sbh * value_bytes + (2 * sbh if dropout else 0)) / (t if sp else 1)
    parallel = (4 * h + 2 * ffn) * s * b * value_bytes / t
    scores = a * s * s * b * ((2 * value_bytes + 1) if dropout else value_bytes) / t
    return replicated, parallel, scores


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, dropout: bool = True,
                           value_bytes: int = 2, recompute: str = "none", attention: str = "math",
                           ffn: int | None = None) -> float:
    """Bytes one layer stashes per microbatch on one tensor-parallel rank (Korthikanti et al. 2022, Table 2).

    16-bit with dropout: none → sbh(34 + 5as/h) for t = 1; sbh(10 + 24/t + 5as/(ht)) with tensor
    parallelism; sbh(34 + 5as/h)/t with sequence parallelism; selective → sbh(10 + 24/t), or 34·sbh/t
    with sequence parallelism; full → 2·sbh (÷t with sequence parallelism). A fused attention
    (``attention="sdpa"``) keeps what selective recomputation keeps.
    """
    if recompute == "full":
        return s * b * h * value_bytes / (t if sp else 1)
    replicated, parallel, scores = layer_terms(s, b, h, a, t, sp, dropout, value_bytes, ffn)
    if recompute == "selective" or attention == "sdpa":
        return replicated + parallel
    return replicated + parallel + scores


def layer_traffic_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, dropout: bool, value_bytes: int,
                        recompute: str, attention: str, ffn: int | None = None) -> tuple[float, float]:
    """(forward, backward) bytes that one layer's memory-bound operators move per microbatch on one rank, in units
    of what the layer stashes without recomputation (:func:`layer_terms`): LayerNorms, dropouts, GeLU, residual
    additions and the softmax each read and write tensors of the sizes Korthikanti et al. count, so their traffic
    is that count times a number of passes (``Hardware.memory_passes``, fitted: fused kernels make fewer passes).

        forward  = R + P + S        (R replicated region, P tensor-parallel region, S the s×s scores; S = 0 for a
                                     fused attention, which never writes the scores to memory)
        backward = 2·forward + recomputed,  recomputed = forward (full), S (selective), 0 (none)

    the backward reading the saved tensors and the incoming gradient and writing the outgoing one. The time is
    memory_passes · bytes / memory_bandwidth (:func:`distperf.cost.stage.compute`; the chapter "Against
    published step times" fits memory_passes)."""
    replicated, parallel, scores = layer_terms(s, b, h, a, t, sp, dropout, value_bytes, ffn)
    scores = 0.0 if attention == "sdpa" else scores
    forward = replicated + parallel + scores
    recomputed = forward if recompute == "full" else scores if recompute == "selective" else 0.0
    return forward, 2 * forward + recomputed


def recompute_working_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, dropout: bool, value_bytes: int,
                            recompute: str, attention: str = "math", ffn: int | None = None) -> float:
    """Transient bytes while one recomputed layer runs its backward, as the papers count: the whole layer's
    activations (full) or its attention scores (selective, unfused attention); none without recomputation."""
    if recompute == "none":
        return 0.0
    replicated, parallel, scores = layer_terms(s, b, h, a, t, sp, dropout, value_bytes, ffn)
    scores = 0.0 if attention == "sdpa" else scores
    return replicated + parallel + scores if recompute == "full" else scores


def embedding_stash_bytes(s: int, b: int, h: int, dropout: bool) -> int:
    """First stage, per microbatch, as the papers count: the token ids (int64, 8·bs) and the embedding dropout
    mask (sbh)."""
    return 8 * b * s + (s * b * h if dropout else 0)


def head_stash_bytes(s: int, b: int, h: int, vocab: int, t: int, sp: bool, value_bytes: int) -> float:
    """Last stage, per microbatch, as the papers count: the final LayerNorm input (sbh values, ÷t with sequence
    parallelism), the head input (sbh values), the fp32 log-softmax output of the cross-entropy (4·bsV) and the
    int64 targets (8·bs). The head is not recomputed."""
    sbh = s * b * h
    return sbh * value_bytes / (t if sp else 1) + sbh * value_bytes + 4 * b * s * vocab + 8 * b * s


# What the trainer keeps (torch 2.13) ----------------------------------------------------------------------

def trainer_layer_terms(s: int, b: int, h: int, a: int, ffn: int, t: int, sp: bool, dropout: bool,
                        attention: str, mixed: bool) -> tuple[float, float, float, float, float]:
    """(sequence-sharded region, linear inputs, tensor-parallel region, attention core, weight copies) bytes one
    layer of :class:`distperf.model.Block` keeps per microbatch on one tensor-parallel rank (module docstring).
    The attention core is what selective recomputation drops: sdpa's log-sum-exp, or the unfused scores."""
    S = s * b
    sbh = S * h
    v = 2 if mixed else 4
    sharded = (2 * sbh * 4 + 2 * 2 * S * 4 + (2 * sbh if dropout else 0)) / (t if sp else 1)
    linear_inputs = 2 * sbh * v
    parallel = ((3 * h + 2 * ffn) * S * v + sbh * v) / t  # QKV output, GeLU in and out, output projection input
    if attention == "sdpa":
        core = a * S * 4 / t  # the log-sum-exp; sdpa's output is the projection's input, counted above
    else:
        probs = 4 + (2 if mixed and not dropout else 0) + ((1 + v) if dropout else 0)
        core = a * s * S * probs / t
    weights = (4 * h * h + 2 * h * ffn) * 2 / t if mixed else 0.0
    return sharded, linear_inputs, parallel, core, weights


def trainer_layer_bytes(s: int, b: int, h: int, a: int, ffn: int, t: int, sp: bool, dropout: bool, attention: str,
                        mixed: bool, recompute: str) -> float:
    """Bytes one layer keeps per microbatch: all its terms; selective recomputation leaves out the attention
    core; full recomputation keeps the layer input alone, sbh fp32 (÷t with sequence parallelism)."""
    if recompute == "full":
        return s * b * h * 4 / (t if sp else 1)
    sharded, linear_inputs, parallel, core, weights = trainer_layer_terms(s, b, h, a, ffn, t, sp, dropout,
                                                                          attention, mixed)
    return sharded + linear_inputs + parallel + weights + (0.0 if recompute == "selective" else core)


def trainer_working_bytes(s: int, b: int, h: int, a: int, ffn: int, t: int, sp: bool, dropout: bool, attention: str,
                          mixed: bool, recompute: str) -> float:
    """What one recomputed layer rebuilds while its backward runs: the whole layer (full) or its attention core
    (selective); none without recomputation."""
    if recompute == "none":
        return 0.0
    terms = trainer_layer_terms(s, b, h, a, ffn, t, sp, dropout, attention, mixed)
    return sum(terms) if recompute == "full" else terms[3]


def trainer_first_stage_bytes(s: int, b: int, h: int, dropout: bool) -> float:
    """First stage, per microbatch: the positions the embedding looked up (int64, 8·s) and its dropout mask
    (sbh bytes, before sequence parallelism cuts the sequence). The token ids are views of the step's whole
    batch of tokens (:func:`trainer_token_bytes`)."""
    return 8 * s + (s * b * h if dropout else 0)


def trainer_last_stage_bytes(s: int, b: int, h: int, vocab: int, t: int, sp: bool, mixed: bool) -> float:
    """Last stage, per microbatch: the final LayerNorm's input (fp32) with its mean and 1/σ, ÷t with sequence
    parallelism; the head's input (whole, gathered with sequence parallelism; bf16 under autocast, with the
    head weight's bf16 copy V·h·2); the fp32 log-softmax of the cross-entropy (4·bsV) and its scalar weight
    (4); the targets, a copy (8·bs) when b > 1 (``reshape`` of a strided view), else a view of the batch."""
    S = s * b
    v = 2 if mixed else 4
    return ((S * h * 4 + 2 * S * 4) / (t if sp else 1) + S * h * v + (vocab * h * 2 if mixed else 0)
            + 4 * S * vocab + 4 + (8 * S if b > 1 else 0))


def trainer_token_bytes(s: int, batch: int) -> int:
    """The step's token ids, int64 (batch, s + 1): every microbatch's inputs (and, for b = 1, targets) are views
    of this one storage (:mod:`distperf.tokens`), which the embedding (and the loss) keep for backward."""
    return 8 * batch * (s + 1)
