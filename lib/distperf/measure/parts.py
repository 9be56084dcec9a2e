"""The profiled mode's compute: each rank's own part of the work, timed with every rank running at once.

A profiling-based predictor (chapter "Where the time goes", section "Two modes") composes measured compute with the
cost model's schedule, communication and overlap. Timing one plain layer in one process misses what the run's ranks
do to each other (two ranks share two cores, the caches and the memory bus) and the shapes a tensor-parallel rank
really multiplies. So, after a run's timed and measurement steps, every rank of the run builds what one rank of the
layout computes, without communication, and times it while all the other ranks do the same:

- ``layer``: a Transformer layer (:class:`distperf.model.Block`) at the rank's tensor-parallel shapes — qkv h → 3h/t,
  proj h/t → h, fc h → ffn/t, out ffn/t → h, so heads/t heads of the full head size; with sequence parallelism its
  LayerNorms, dropouts and residuals on s/t positions, a local concatenation of t copies where the all-gather
  would be and a slice where the reduce-scatter would be (communication removed, the local copies kept);
- ``embedding``: the token and position embeddings; ``head``: the final LayerNorm, the output projection and the
  loss (every tensor-parallel rank computes the whole head, as the trainers do);
- ``optimizer``: one step of the configured optimizer over the parameter tensors of one layer (``layer_s``), of the
  embeddings (``first_s``) and of the final LayerNorm and head (``last_s``) as the rank holds them: at its
  tensor-parallel shapes, each cut in dp shards under ZeRO-2/3 (FSDP2 shards every tensor along dim 0). ZeRO-1's
  share of whole tensors is applied when the prediction composes them. (``zero_grad`` sets the gradients to None:
  nothing to time.)

Each is timed forward alone and forward + backward on a fresh graph (backward = the difference), in fp32, as the
median of the same number of calls on every rank, started together after a barrier; each part's time is the mean of
the ranks' medians (:func:`part_times`). The barriers and the exchange of the results are outside the timed spans.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

MIN_RUN_S = 0.05  # per timed part and rank


class ShardedLayer(nn.Module):
    """What one tensor-parallel rank of a :class:`distperf.model.Block` computes, communication removed."""

    def __init__(self, spec, tp: int, sequence_parallel: bool):
        super().__init__()
        from ..model import Block

        h, ffn = spec.hidden, spec.ffn
        self.block, self.tp, self.sp = Block(spec), tp, sequence_parallel and tp > 1
        if tp > 1:
            attn, mlp = self.block.attn, self.block.mlp
            attn.qkv, attn.proj = nn.Linear(h, 3 * h // tp), nn.Linear(h // tp, h)
            mlp.fc, mlp.out = nn.Linear(h, ffn // tp), nn.Linear(ffn // tp, h)

    def _gather(self, x: torch.Tensor) -> torch.Tensor:  # the all-gather's output, without the gather
        return torch.cat([x] * self.tp, dim=1) if self.sp else x

    def _scatter(self, x: torch.Tensor) -> torch.Tensor:  # the reduce-scatter's output, without the reduction
        return x[:, : x.shape[1] // self.tp] if self.sp else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        x = x + b.drop(self._scatter(b.attn(self._gather(b.ln1(x)))))
        return x + b.drop(self._scatter(b.mlp(self._gather(b.ln2(x)))))


def _median(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _together(fn, device: torch.device, distributed: bool) -> float:
    """Median seconds of ``fn`` on this rank, the same number of calls on every rank, all started together."""
    import torch.distributed as dist

    def call():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()  # warm-up
    start = time.perf_counter()
    call()
    calls = torch.tensor([max(5, min(200, int(MIN_RUN_S / max(time.perf_counter() - start, 1e-6))))])
    if distributed:
        dist.all_reduce(calls, op=dist.ReduceOp.MAX)  # every rank runs as many calls, so that all overlap
        dist.barrier()
    return _median(call, int(calls))


def _optimizer_tensors(spec, tp: int, shards: int, head_matrix: bool) -> dict[str, list[int]]:
    """Element counts of the parameter tensors a rank updates, per group (layer, first, last)."""
    from ..cost.parameters import layer_tensors

    h, vocab, s = spec.hidden, spec.vocab, spec.seq

    def cut(numel: int) -> int:
        return -(-numel // shards)

    return {"layer_s": [cut(numel) for _, numel in layer_tensors(h, spec.ffn, tp)],
            "first_s": [cut(vocab * h), cut(s * h)],
            "last_s": [cut(h), cut(h)] + ([cut(vocab * h)] if head_matrix else [])}


def rank_part_times(cfg, device: torch.device, distributed: bool) -> dict:
    """This rank's part times (see the module docstring): {part: (forward_s, backward_s)} for ``layer``, ``embedding``
    and ``head``, and ``optimizer``: {group: seconds}."""
    from ..cost.parameters import head_parameters
    from ..model import Transformer, layer_input, lm_loss
    from ..parallel.common import make_optimizer

    spec, lay = cfg.model, cfg.layout
    b, t = lay.micro_batch, lay.tp
    sp = lay.sequence_parallel and t > 1
    torch.manual_seed(0)
    layer = ShardedLayer(spec, t, sp).to(device)
    ends = Transformer(spec, layer_ids=[]).to(device)
    positions = spec.seq // t if sp else spec.seq
    x = (layer_input(spec, b, device=device)[:, :positions]).contiguous().requires_grad_(True)
    h_in = layer_input(spec, b, device=device).requires_grad_(True)
    tokens = torch.randint(0, spec.vocab, (b, spec.seq), device=device)
    pos = torch.arange(spec.seq, device=device)
    parts = {"layer": lambda: layer(x),
             "embedding": lambda: ends.tok(tokens) + ends.pos(pos),
             "head": lambda: lm_loss(ends.head(ends.ln_f(h_in)), tokens)}
    out = {}
    for part, forward in parts.items():
        f = _together(forward, device, distributed)  # as in training: the graph is built, then dropped
        fb = _together(lambda: forward().float().sum().backward(), device, distributed)
        out[part] = (f, max(fb - f, 0.0))
    shards = lay.dp if lay.zero >= 2 and lay.dp > 1 else 1
    groups = _optimizer_tensors(spec, t, shards, head_parameters(spec.hidden, spec.vocab, spec.tied, lay.pp)
                                > 2 * spec.hidden)
    out["optimizer"] = {}
    for group, sizes in groups.items():
        params = [nn.Parameter(torch.zeros(n, device=device)) for n in sizes]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        opt = make_optimizer(params, cfg.training, 1e-3)
        out["optimizer"][group] = _together(opt.step, device, distributed)
    return out


def part_times(cfg, device: torch.device, distributed: bool) -> dict:
    """Every rank's :func:`rank_part_times`, reduced to each part's mean over the ranks (collective when distributed):
    ``{layer, embedding, head: {forward_s, backward_s}, optimizer: {layer_s, first_s, last_s}, ranks_at_once,
    per_rank}``.

    Why the mean: the ranks time the same parts at the same moment, and which rank comes out slower is a matter of
    that moment, not of the rank. On the sixteenth build of the book on this machine, the rank slower on the layer was
    the one slower on the head in 52 of 108 runs, and the two ranks' layer times differed by a ratio of 0.86 to 1.23
    (10th to 90th percentile). Until 3 December 2026 each part took its slowest rank's time, forward and backward
    apart, which adds every rank's noise up; the rank whose parts took longest as a step composes them, declared after
    the fifteenth build, did no better on the sixteenth."""
    import torch.distributed as dist

    mine = rank_part_times(cfg, device, distributed)
    ranks = [mine]
    if distributed:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    mean = statistics.fmean
    out = {part: {"forward_s": mean(r[part][0] for r in ranks), "backward_s": mean(r[part][1] for r in ranks)}
           for part in ("layer", "embedding", "head")}
    out["optimizer"] = {g: mean(r["optimizer"][g] for r in ranks) for g in mine["optimizer"]}
    out["ranks_at_once"] = len(ranks)
    out["per_rank"] = ranks
    return out
