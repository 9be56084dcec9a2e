"""One prediction: memory, communication, FLOPs and time of a configuration on some hardware.

This module only assembles the terms defined, each with its equation and source, in the sibling
modules. Every pipeline rank is evaluated (its layers, its share of the embedding and head, its
microbatches in flight and weight versions); memory is reported for the most loaded rank and as a
total per pipeline rank, communication as the most any rank sends per kind, and time for the rank
that finishes the iteration last.

Time of one microbatch on pipeline rank r (per tensor- and data-parallel rank):

    t_r = compute (3·forward FLOPs + recomputed FLOPs) / achieved FLOP/s
        + tensor-parallel collectives (not overlapped)
        + pipeline sends (not overlapped)
        + ZeRO-2/3 collectives not hidden behind the microbatch's compute.

With ``layer_times`` (profiled seconds of one layer, the embeddings and the head on one device, for
this micro-batch; :func:`distperf.measure.calibrate.layer_times`) the compute term is taken from them
instead of FLOPs over rate, as profiling-based predictors do (Lu et al. 2024, arXiv 2407.02081,
§"profiled" vs "analytical" compute; DistSim, vTrain):

    compute_r = L_r/t · (f_layer + b_layer + recomputed share of f_layer)
              + [first] (f_embedding + b_embedding) + [last] (f_head + b_head),

the recomputed share being the FLOP ratio recompute_forward_flops / layer_forward_flops (1 for full
recomputation, the attention core's share for selective).

The pipeline takes :func:`~distperf.cost.schedules.pipeline_time` over the t_r. Rank r finishes its
last backward when the drain has still to cross ranks r − 1 … 0; then its data-parallel reduction's
exposed tail (bucketed overlap with the last backward), the tied-embedding all-reduce and the optimizer
step (memory-bound: bytes touched / memory bandwidth) follow. Iteration = the latest rank's end;
bubble = that rank's idle time inside the pipeline phase.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..config import DDP_BUCKET_MB, Config, stage_layers, validate
from ..hardware import DEFAULT, PRESETS, Hardware
from . import activations as act
from . import flops as fl
from . import parameters as par
from .collectives import bucketed_exposed_time, collective_time, sent_bytes
from .model_states import bytes_per_parameter, fsdp_shard_elements, greedy_partition_max
from .schedules import FLUSHING, in_flight_per_rank, pipeline_time, weight_versions

DDP_BUCKET_BYTES = DDP_BUCKET_MB * 2**20

DP_COLLECTIVES = {0: "all-reduce", 1: "reduce-scatter + all-gather", 2: "all-gather + reduce-scatter",
                  3: "all-gather ×2 + reduce-scatter"}


class _Stage(NamedTuple):
    """A pipeline rank's costs apart from its place in the schedule and the number of microbatches:
    its model states, and the time and bytes of one microbatch and of one optimizer step."""

    parameters: int  # elements on one tensor-parallel rank, before ZeRO
    weights: float  # bytes of one weight version (sharded with ZeRO-3)
    gathered: float  # ZeRO-3: one unit's parameters, unsharded while it works
    gradients: float
    optimizer_states: float
    states: float  # weights + gathered + gradients + optimizer states
    microbatch: float  # t_r: compute + communication on the critical path
    compute: float  # of one microbatch
    exposed: float  # communication on the critical path, one microbatch
    drain: float  # one backward and its send: how much this rank delays the flush behind it
    step_exposed: float  # communication after the last backward (data parallel, tied embeddings)
    optimizer: float  # one optimizer step
    dp_bytes_step: float
    dp_bytes_microbatch: float
    tp_bytes_microbatch: float
    pp_bytes_microbatch: float
    pp_bytes_step: float
    at_rest: tuple  # (parameters, gradients, optimizer states) bytes kept between steps, one weight version


def predict(cfg: Config, hw: Hardware | None = None, bucket_bytes: float = DDP_BUCKET_BYTES,
            check: bool = True, layer_times: dict | None = None) -> dict:
    """Predict one configuration; returns the JSON-ready dictionary of ``python -m distperf predict``.

    Keys: parameters, parameters_per_stage, flops {model, hardware}, memory_bytes {parameters,
    gradients, optimizer_states, activations, total} (most loaded rank), memory_bytes_per_stage
    (totals), memory_bytes_by_stage (the categories of every pipeline rank), model_states_at_rest and
    model_states_at_rest_by_stage (parameters, gradients, optimizer states kept between steps: the
    memory_bytes states without a step's transients, i.e. ZeRO-2/3's gathered parameters and unsharded
    gradients), peak_stage, fits, communication_bytes {data_parallel, tensor_parallel,
    pipeline_parallel}, collectives (same keys), time_s {compute, communication_exposed, bubble,
    iteration}, bubble_fraction, hardware, compute_from ("flops" or "layer_times").

    ``layer_times``: {"layer": (forward_s, backward_s), "embedding": (…), "head": (…)} of one
    microbatch on one device; when given, compute time comes from them (see the module docstring).
    """
    if check:
        validate(cfg)
    hw = hw or PRESETS[DEFAULT]
    spec, lay, tr = cfg.model, cfg.layout, cfg.training
    h, a, s, vocab = spec.hidden, spec.heads, spec.seq, spec.vocab
    b, m, p, v, t, dp = lay.micro_batch, lay.microbatches, lay.pp, lay.chunks, lay.tp, lay.dp
    sp, rc, sched = lay.sequence_parallel, lay.recompute, lay.schedule
    layers = stage_layers(spec, lay)
    n_chunks = p * v

    # ranks with the same layers and ends cost the same apart from the schedule
    keys = [(layers[r] if v == 1 else sum(layers[r::p]), r == 0, r == p - 1) for r in range(p)]
    times = None if layer_times is None else tuple(tuple(float(x) for x in layer_times[part])
                                                   for part in ("layer", "embedding", "head"))
    stages: dict[tuple, _Stage] = {}
    for key in keys:
        if key not in stages:
            stages[key] = _stage(*key, h, spec.ffn, s, vocab, spec.tied, b, t, dp, p, v, sp, rc, lay.zero,
                                 tr.precision, tr.optimizer, tr.momentum, sched == "pipedream", hw, bucket_bytes,
                                 times)
    ranks = [stages[key] for key in keys]

    # activations: what each in-flight microbatch stashes, plus one recomputed layer
    stash_layer, stash_embed, stash_head, working = _stashes(s, b, h, a, vocab, t, sp, spec.dropout > 0,
                                                             tr.precision, rc)
    flights = in_flight_per_rank(sched, p, m, v)
    if v == 1:
        activations = [working + n[0] * k * stash_layer for n, k in zip(flights, layers)]
        activations[0] += flights[0][0] * stash_embed
        activations[-1] += flights[-1][0] * stash_head
    else:
        activations = [working] * p
        for r, counts in enumerate(flights):
            for c, count in zip(range(r, n_chunks, p), counts):
                activations[r] += count * (layers[c] * stash_layer + (stash_embed if c == 0 else 0)
                                           + (stash_head if c == n_chunks - 1 else 0))

    # memory by category, with the schedule's weight versions
    by_stage = [{"parameters": rank.weights + rank.gathered, "gradients": rank.gradients,
                 "optimizer_states": rank.optimizer_states, "activations": x, "total": rank.states + x}
                for rank, x in zip(ranks, activations)]
    at_rest = [{"parameters": rank.at_rest[0], "gradients": rank.at_rest[1], "optimizer_states": rank.at_rest[2]}
               for rank in ranks]
    if sched in ("2bw", "pipedream"):
        for r, (stage, rest, rank) in enumerate(zip(by_stage, at_rest, ranks)):
            extra = (weight_versions(sched, p, r) - 1) * rank.weights
            stage["parameters"] += extra
            stage["total"] += extra
            rest["parameters"] += extra
    totals = [stage["total"] for stage in by_stage]
    peak = max(range(p), key=totals.__getitem__)

    # time: the pipeline, then each rank's step; the iteration ends with the last rank to finish
    updates = m if sched == "pipedream" else 1  # PipeDream updates the weights after every microbatch
    if sched in FLUSHING:
        pipe = pipeline_time(sched, [rank.microbatch for rank in ranks], m, v)
        iteration, finish, slowest = -1.0, 0.0, ranks[0]
        drain = 0.0  # how long the flush still runs after rank r's last backward: ranks r − 1 … 0
        for rank in ranks:
            end = pipe - drain + rank.step_exposed + rank.optimizer
            if end > iteration:
                iteration, finish, slowest = end, pipe - drain, rank
            drain += rank.drain / v
    else:  # no flush: in steady state every rank keeps the pace of the slowest
        slowest = max(stages.values(), key=lambda rank: m * rank.microbatch + rank.step_exposed + updates * rank.optimizer)
        finish = m * slowest.microbatch
        iteration = finish + slowest.step_exposed + updates * slowest.optimizer
    bubble = finish - m * slowest.microbatch

    dp_bytes = tp_bytes = pp_bytes = 0.0
    for rank in stages.values():
        dp_bytes = max(dp_bytes, rank.dp_bytes_step + m * rank.dp_bytes_microbatch)
        tp_bytes = max(tp_bytes, m * rank.tp_bytes_microbatch)
        pp_bytes = max(pp_bytes, rank.pp_bytes_step + m * rank.pp_bytes_microbatch)
    parameters, model_flops, hardware_flops = _model_totals(spec.layers, h, spec.ffn, vocab, s, spec.tied, rc)
    global_batch = b * m * dp
    return {
        "parameters": parameters,
        "parameters_per_stage": [rank.parameters for rank in ranks],
        "flops": {"model": global_batch * model_flops, "hardware": global_batch * hardware_flops},
        "memory_bytes": by_stage[peak],
        "memory_bytes_per_stage": totals,
        "memory_bytes_by_stage": by_stage,
        "model_states_at_rest": at_rest[peak],
        "model_states_at_rest_by_stage": at_rest,
        "peak_stage": peak,
        "fits": totals[peak] <= hw.memory_capacity,
        "communication_bytes": {"data_parallel": dp_bytes, "tensor_parallel": tp_bytes, "pipeline_parallel": pp_bytes},
        "collectives": {"data_parallel": DP_COLLECTIVES[lay.zero] if dp > 1 else "none",
                        "tensor_parallel": ("all-gather + reduce-scatter" if sp else "all-reduce") if t > 1 else "none",
                        "pipeline_parallel": ("send/recv" + (" + all-reduce (tied embeddings)" if spec.tied else ""))
                        if p > 1 else "none"},
        "time_s": {"compute": m * slowest.compute + updates * slowest.optimizer,
                   "communication_exposed": m * slowest.exposed + slowest.step_exposed,
                   "bubble": bubble, "iteration": iteration},
        "bubble_fraction": bubble / iteration if iteration > 0 else 0.0,
        "hardware": hw.name,
        "compute_from": "flops" if times is None else "layer_times",
    }


@lru_cache(maxsize=1 << 15)
def _stage(n_layers: int, first: bool, last: bool, h: int, ffn: int, s: int, vocab: int, tied: bool, b: int, t: int,
           dp: int, p: int, v: int, sp: bool, rc: str, zero: int, precision: str, optimizer: str, momentum: bool,
           pipedream: bool, hw: Hardware, bucket_bytes: float, times: tuple | None = None) -> _Stage:
    """The costs of a pipeline rank holding ``n_layers`` layers (and the embedding if ``first``, the head
    if ``last``), per microbatch and per step. Cached: a sweep over microbatches and schedules reuses it.
    ``times``: profiled ((f, b) layer, (f, b) embedding, (f, b) head) seconds, or None for FLOPs / rate."""
    pb, gb, ob = bytes_per_parameter(precision, optimizer, momentum)
    p_layer = par.layer_parameters_per_tp_rank(h, ffn, t)
    p_embed = par.embedding_parameters(h, vocab, s)
    p_head = par.head_parameters(h, vocab, tied, p)
    params = n_layers * p_layer + (p_embed if first else 0) + (p_head if last else 0)

    # model states (ZeRO shards over the dp replicas of this rank)
    owned, transient = params, 0
    if zero and dp > 1:
        tensors = _rank_tensors(h, ffn, t, vocab, s, n_layers, first, last, p_head > 2 * h)
        owned = greedy_partition_max(tensors, dp) if zero == 1 else fsdp_shard_elements(tensors, dp)
        if zero >= 2:  # one FSDP unit's unsharded gradient (and, ZeRO-3, parameters) at a time
            transient = max(p_layer if n_layers else 0, p_embed if first else 0, p_head if last else 0)
    weights = (owned if zero == 3 and dp > 1 else params) * pb  # one weight version
    gradients = (owned if zero >= 2 else params) * gb + transient * gb
    optimizer_states = (owned if zero >= 1 else params) * ob

    # compute of one microbatch (the head is replicated: every tensor-parallel rank computes it)
    rate = hw.flops(precision)
    forward = n_layers * fl.layer_forward_flops(b, s, h, ffn) / t + (fl.head_forward_flops(b, s, h, vocab) if last else 0)
    compute_fwd = forward / rate
    compute_bwd = (2 * forward + n_layers * fl.recompute_forward_flops(b, s, h, ffn, rc) / t) / rate
    if times is not None:
        (layer_f, layer_b), (embed_f, embed_b), (head_f, head_b) = times
        recomputed = fl.recompute_forward_flops(b, s, h, ffn, rc) / fl.layer_forward_flops(b, s, h, ffn)
        compute_fwd = n_layers * layer_f / t + (embed_f if first else 0.0) + (head_f if last else 0.0)
        compute_bwd = (n_layers * (layer_b + recomputed * layer_f) / t + (embed_b if first else 0.0)
                       + (head_b if last else 0.0))

    # tensor parallel: two all-reduces forward, two backward, two more when full recomputation reruns the forward
    message = b * s * h * pb  # one microbatch's activation (or its gradient), in the parameters' precision
    tp_time = tp_bytes = tp_backward = 0.0
    if t > 1:
        all_reduce = collective_time("all-reduce", message, t, *hw.link(t))
        collectives = n_layers * (6 if rc == "full" else 4)
        tp_time, tp_bytes = collectives * all_reduce, collectives * sent_bytes("all-reduce", message, t)
        tp_backward = tp_time - 2 * n_layers * all_reduce

    # pipeline: every chunk sends forward and backward but the model's two ends; the tied head's gradient
    sends = 2 * v - first - last
    send_time = collective_time("send", message, 2, *hw.link(t * dp * p)) if p > 1 else 0.0
    pp_bytes_step = step_exposed = 0.0
    if tied and p > 1 and (first or last):
        pp_bytes_step = sent_bytes("all-reduce", vocab * h * gb, 2)
        step_exposed = collective_time("all-reduce", vocab * h * gb, 2, *hw.link(t * dp * p))

    # data parallel
    grads = params * gb
    dp_link = hw.link(t * dp)
    dp_step = dp_microbatch = dp_exposed = mb_exposed = 0.0
    if dp > 1:
        if zero == 0:
            dp_step = sent_bytes("all-reduce", grads, dp)
            dp_exposed = bucketed_exposed_time(grads, bucket_bytes, compute_bwd, "all-reduce", dp, *dp_link)
        elif zero == 1:
            dp_step = sent_bytes("reduce-scatter", grads, dp) + sent_bytes("all-gather", params * pb, dp)
            dp_exposed = (bucketed_exposed_time(grads, bucket_bytes, compute_bwd, "reduce-scatter", dp, *dp_link)
                          + collective_time("all-gather", params * pb, dp, *dp_link))
        else:  # FSDP2: per microbatch, gather parameters for forward (and ZeRO-3 backward), reduce-scatter gradients
            gathers = 1 if zero == 2 else 2
            dp_microbatch = gathers * sent_bytes("all-gather", params * pb, dp) + sent_bytes("reduce-scatter", grads, dp)
            gather = collective_time("all-gather", params * pb, dp, *dp_link)
            mb_exposed = (max(0.0, gather - compute_fwd)
                          + bucketed_exposed_time(grads, p_layer * gb, compute_bwd, "reduce-scatter", dp, *dp_link)
                          + (max(0.0, gather - compute_bwd) if zero == 3 else 0.0))
        if pipedream:  # a weight update, hence a reduction, after every microbatch
            dp_microbatch, mb_exposed, dp_step, dp_exposed = dp_microbatch + dp_step, mb_exposed + dp_exposed, 0.0, 0.0

    exposed = tp_time + sends * send_time + mb_exposed
    gathered = transient * pb if zero == 3 else 0
    sharded = zero >= 2  # FSDP2 shards parameters and gradients at rest for ZeRO-2 as for ZeRO-3
    at_rest = ((owned if sharded else params) * pb, (owned if sharded else params) * gb, optimizer_states)
    return _Stage(params, weights, gathered, gradients, optimizer_states, weights + gathered + gradients + optimizer_states,
                  compute_fwd + compute_bwd + exposed, compute_fwd + compute_bwd, exposed,
                  compute_bwd + tp_backward + send_time, step_exposed + dp_exposed,
                  owned * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth,
                  dp_step, dp_microbatch, tp_bytes, sends * message, pp_bytes_step, at_rest)


@lru_cache(maxsize=4096)
def _stashes(s: int, b: int, h: int, a: int, vocab: int, t: int, sp: bool, dropout: bool, precision: str,
             rc: str) -> tuple[float, float, float, float]:
    """Activation bytes per microbatch of a layer, the embedding and the head, and the recomputation
    working set; activations are kept in the parameters' precision (2 bytes mixed, 4 fp32)."""
    vb = 2 if precision == "mixed" else 4
    return (act.layer_activation_bytes(s, b, h, a, t, sp, dropout, vb, rc), act.embedding_stash_bytes(s, b, h, dropout),
            act.head_stash_bytes(s, b, h, vocab, t, sp, vb), act.recompute_working_bytes(s, b, h, a, t, sp, dropout, vb, rc))


@lru_cache(maxsize=4096)
def _model_totals(layers: int, h: int, ffn: int, vocab: int, s: int, tied: bool, rc: str) -> tuple[int, int, int]:
    """Parameters, and model and hardware FLOPs per sequence of the batch (both are linear in it)."""
    return (par.model_parameters(layers, h, ffn, vocab, s, tied), fl.model_flops(1, layers, s, h, ffn, vocab),
            fl.hardware_flops(1, layers, s, h, ffn, vocab, rc))


def clear_caches() -> None:
    """Forget cached per-stage costs (for benchmarks that must start cold)."""
    for cached in (_stage, _stashes, _model_totals, greedy_partition_max):
        cached.cache_clear()


def _rank_tensors(h, ffn, t, vocab, s, n_layers, first, last, head_matrix):
    """(count, dim-0 size, elements) of the parameter tensors one rank holds, for ZeRO sharding."""
    tensors = [(n_layers, d0, numel) for d0, numel in par.layer_tensors(h, ffn, t)]
    if first:
        tensors += [(1, vocab, vocab * h), (1, s, s * h)]
    if last:
        tensors += [(2, h, h)] + ([(1, vocab, vocab * h)] if head_matrix else [])
    return tuple(tensors)
