"""Pipeline partition policies: how many Transformer layers each stage gets.

The embeddings always sit on the first stage and the final LayerNorm and head on the last
(:func:`distperf.model.build_stages`); a policy only chooses the layer counts, each stage at least
one layer, contiguous, in order.

- ``uniform``: equal layer counts, the remainder on the earliest stages (:func:`distperf.config.uniform_partition`);
- ``params``: balance the parameters per stage (embeddings and head included): the stage memory that
  does not depend on the batch;
- ``time``: balance measured forward + backward time per stage (embedding, one layer, head + loss
  timed on the run's device at the run's microbatch size), the quantity that sets a pipeline's
  throughput (its slowest stage);
- ``flops``: balance the forward FLOPs per stage as the cost model counts them, the head's logit
  product 2bshV included (:mod:`distperf.cost.flops`; the embedding is a lookup, no FLOPs): the
  embedding- and head-aware analytical partition, which needs no measurement;
- an explicit list (``--partition 3,1``), checked by :func:`distperf.config.validate`.

``params``, ``time`` and ``flops`` minimise the largest stage cost (min–max contiguous partition by dynamic
programming, Bokhari 1988; PipeDream's partitioner solves the same problem for per-layer costs).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..config import Config, ModelSpec, uniform_partition, validate

POLICIES = ("uniform", "params", "time", "flops")


def balanced(layer_cost: list[float], first_extra: float, last_extra: float, stages: int) -> tuple[int, ...]:
    """Layer counts of a contiguous partition minimising the largest stage cost, where stage cost =
    the sum of its layers' costs (+ ``first_extra`` on stage 0, + ``last_extra`` on the last stage).
    Among partitions with the same largest cost it minimises the second largest, and so on (the
    stage costs sorted in decreasing order are compared lexicographically); remaining ties go to the
    partition with fewer layers on earlier stages."""
    n = len(layer_cost)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} layers into {stages} non-empty stages")
    prefix = [0.0]
    for c in layer_cost:
        prefix.append(prefix[-1] + c)

    def cost(stage: int, a: int, b: int) -> float:  # layers a..b-1 on stage `stage`
        return (prefix[b] - prefix[a] + (first_extra if stage == 0 else 0.0)
                + (last_extra if stage == stages - 1 else 0.0))

    @lru_cache(maxsize=None)
    def best(stage: int, a: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Best split of layers a..n-1 over stages stage..stages-1: (costs sorted decreasing, counts)."""
        if stage == stages - 1:
            return (cost(stage, a, n),), (n - a,)
        options = []
        for b in range(a + 1, n - (stages - stage - 1) + 1):
            rest, counts = best(stage + 1, b)
            costs = tuple(sorted((cost(stage, a, b), *rest), reverse=True))
            options.append((costs, (b - a, *counts)))
        return min(options)

    return best(0, 0)[1]


def parameter_costs(spec: ModelSpec, pp: int) -> tuple[list[float], float, float]:
    """Parameters of each layer, of the first stage's embeddings and of the last stage's final
    LayerNorm + head (its own copy of the token embedding when tied and pp > 1), as the cost model
    counts them (:mod:`distperf.cost.parameters`)."""
    from ..cost import parameters as par

    layer = par.layer_parameters(spec.hidden, spec.ffn)
    embed = par.embedding_parameters(spec.hidden, spec.vocab, spec.seq)
    head = par.head_parameters(spec.hidden, spec.vocab, spec.tied, pp)
    return [float(layer)] * spec.layers, float(embed), float(head)


def flop_costs(spec: ModelSpec, micro_batch: int) -> tuple[list[float], float, float]:
    """Forward FLOPs of each layer (matrix products and attention scores,
    :func:`distperf.cost.flops.layer_forward_flops`), of the embeddings (none: a lookup) and of the head's logits
    (:func:`distperf.cost.flops.head_forward_flops`)."""
    from ..cost import flops

    b, s, h = micro_batch, spec.seq, spec.hidden
    return ([float(flops.layer_forward_flops(b, s, h, spec.ffn))] * spec.layers, 0.0,
            float(flops.head_forward_flops(b, s, h, spec.vocab)))


def time_costs(spec: ModelSpec, micro_batch: int, device="cpu", repeats: int = 5) -> tuple[list[float], float, float]:
    """Measured forward + backward seconds of one layer, the embeddings, and final LN + head + loss."""
    import time

    import torch

    from ..model import Transformer, build_model, lm_loss

    torch.manual_seed(0)
    ids = torch.randint(spec.vocab, (micro_batch, spec.seq), device=device)

    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    def timed(part: Transformer, make_input, loss) -> float:
        samples = []
        for i in range(repeats + 2):
            x = make_input()
            sync()
            t0 = time.perf_counter()
            loss(part(x)).backward()
            sync()
            if i >= 2:  # the first calls warm up allocator and kernels
                samples.append(time.perf_counter() - t0)
        return sorted(samples)[len(samples) // 2]

    def activation():
        return torch.randn(micro_batch, spec.seq, spec.hidden, device=device, requires_grad=True)

    embed = build_model(spec, 0, [], embed=True, head=False, device=device)
    layer = build_model(spec, 0, [0], embed=False, head=False, device=device)
    head = build_model(spec, 0, [], embed=False, head=True, device=device)
    targets = torch.randint(spec.vocab, (micro_batch, spec.seq), device=device)
    t_embed = timed(embed, lambda: ids, lambda y: y.sum())
    t_layer = timed(layer, activation, lambda y: y.sum())
    t_head = timed(head, activation, lambda y: lm_loss(y, targets))
    return [t_layer] * spec.layers, t_embed, t_head


def resolve(cfg: Config, policy: str, device="cpu") -> Config:
    """``cfg`` with its layout's partition set by ``policy`` (validated)."""
    lay, spec = cfg.layout, cfg.model
    if policy == "uniform":
        parts = uniform_partition(spec.layers, lay.stages)
    elif policy == "params":
        parts = balanced(*parameter_costs(spec, lay.pp), lay.stages)
    elif policy == "time":
        parts = balanced(*time_costs(spec, lay.micro_batch, device), lay.stages)
    elif policy == "flops":
        parts = balanced(*flop_costs(spec, lay.micro_batch), lay.stages)
    else:
        raise ValueError(f"partition policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return validate(replace(cfg, layout=replace(lay, partition=tuple(parts))))
