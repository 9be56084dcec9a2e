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

The pipeline takes :func:`~distperf.cost.schedules.pipeline_time` over the t_r. Rank r finishes its
last backward when the drain has still to cross ranks r − 1 … 0; then its data-parallel reduction's
exposed tail (bucketed overlap with the last backward), the tied-embedding all-reduce and the optimizer
step (memory-bound: bytes touched / memory bandwidth) follow. Iteration = the latest rank's end;
bubble = that rank's idle time inside the pipeline phase.
"""
from __future__ import annotations

from typing import NamedTuple

from ..config import Config, stage_layers, validate
from ..hardware import DEFAULT, PRESETS, Hardware
from . import activations as act
from . import flops as fl
from . import parameters as par
from .collectives import bucketed_exposed_time, collective_time, sent_bytes
from .model_states import bytes_per_parameter, fsdp_shard_elements, greedy_partition_max
from .schedules import FLUSHING, in_flight_per_rank, pipeline_time, weight_versions

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default (25 MiB)

DP_COLLECTIVES = {0: "all-reduce", 1: "reduce-scatter + all-gather", 2: "all-gather + reduce-scatter",
                  3: "all-gather ×2 + reduce-scatter"}


class _Stage(NamedTuple):
    """What a pipeline rank's layers, embedding and head cost, whatever its place in the schedule."""

    parameters: int
    weights: float  # bytes of one weight version (sharded with ZeRO-3)
    gathered: float  # ZeRO-3: one unit's unsharded parameters
    gradients: float
    optimizer_states: float
    per_microbatch: float  # t_r: compute + communication on the critical path
    compute: float  # per microbatch
    exposed: float  # communication per microbatch
    step_exposed: float  # communication after the last backward
    optimizer: float  # optimizer step
    backward: float  # one backward, as it delays the drain
    dp_bytes: float
    tp_bytes: float
    pp_bytes: float


def predict(cfg: Config, hw: Hardware | None = None, bucket_bytes: float = DDP_BUCKET_BYTES,
            check: bool = True) -> dict:
    """Predict one configuration; returns the JSON-ready dictionary of ``python -m distperf predict``.

    Keys: parameters, parameters_per_stage, flops {model, hardware}, memory_bytes {parameters,
    gradients, optimizer_states, activations, total} (most loaded rank), memory_bytes_per_stage
    (totals), memory_bytes_by_stage (the categories of every pipeline rank), peak_stage, fits, communication_bytes {data_parallel, tensor_parallel, pipeline_parallel},
    collectives (same keys), time_s {compute, communication_exposed, bubble, iteration},
    bubble_fraction, hardware.
    """
    if check:
        validate(cfg)
    hw = hw or PRESETS[DEFAULT]
    spec, lay, tr = cfg.model, cfg.layout, cfg.training
    h, ffn, a, s, vocab, tied = spec.hidden, spec.ffn, spec.heads, spec.seq, spec.vocab, spec.tied
    b, m, p, v, t, dp = lay.micro_batch, lay.microbatches, lay.pp, lay.chunks, lay.tp, lay.dp
    zero, sp, rc, sched = lay.zero, lay.sequence_parallel, lay.recompute, lay.schedule
    dropout = spec.dropout > 0
    pb, gb, ob = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)
    vb = pb  # activations are kept in the parameters' precision: 2 bytes mixed, 4 fp32
    layers = stage_layers(spec, lay)
    n_chunks = p * v

    # per layer and per microbatch, on one tensor-parallel rank
    p_layer = par.layer_parameters_per_tp_rank(h, ffn, t)
    stash_layer = act.layer_activation_bytes(s, b, h, a, t, sp, dropout, vb, rc)
    working = act.recompute_working_bytes(s, b, h, a, t, sp, dropout, vb, rc)
    stash_embed = act.embedding_stash_bytes(s, b, h, dropout)
    stash_head = act.head_stash_bytes(s, b, h, vocab, t, sp, vb)
    p_embed = par.embedding_parameters(h, vocab, s)
    p_head = par.head_parameters(h, vocab, tied, p)
    rate = hw.flops(tr.precision)
    f_layer = fl.layer_forward_flops(b, s, h, ffn) / t
    f_recompute = fl.recompute_forward_flops(b, s, h, ffn, rc) / t
    f_head = fl.head_forward_flops(b, s, h, vocab)  # the head is replicated: every tp rank computes it

    message = b * s * h * vb  # one microbatch's activation (or its gradient) at a layer boundary
    tp_bytes_layer = tp_time_layer = 0.0
    if t > 1:  # two all-reduces forward, two backward, two more when full recomputation reruns the forward
        per_layer = 6 if rc == "full" else 4
        tp_bytes_layer = per_layer * sent_bytes("all-reduce", message, t)
        tp_time_layer = per_layer * collective_time("all-reduce", message, t, *hw.link(t))
    send_time = collective_time("send", message, 2, *hw.link(t * dp * p)) if p > 1 else 0.0
    dp_link = hw.link(t * dp)
    tied_copy = tied and p > 1  # first and last stage all-reduce the two embedding copies' gradients
    tied_bytes = tied_time = 0.0
    if tied_copy:
        tied_bytes = sent_bytes("all-reduce", vocab * h * gb, 2)
        tied_time = collective_time("all-reduce", vocab * h * gb, 2, *hw.link(t * dp * p))

    # what a rank's layers, embedding and head cost, whatever its place in the schedule; ranks with the
    # same layers and ends share it
    keys = [(layers[r] if v == 1 else sum(layers[r::p]), r == 0, r == p - 1) for r in range(p)]
    stages: dict[tuple, _Stage] = {}
    for key in keys:
        if key in stages:
            continue
        n_layers, first, last = key
        params = n_layers * p_layer + (p_embed if first else 0) + (p_head if last else 0)

        # model states (ZeRO shards over the dp replicas of this rank)
        owned, transient = params, 0
        if zero and dp > 1:
            tensors = _rank_tensors(h, ffn, t, vocab, s, n_layers, first, last, p_head > 2 * h)
            owned = greedy_partition_max(tensors, dp) if zero == 1 else fsdp_shard_elements(tensors, dp)
            if zero >= 2:  # one FSDP unit's unsharded gradient (and, ZeRO-3, parameters) at a time
                transient = max(p_layer if n_layers else 0, p_embed if first else 0, p_head if last else 0)
        held = (owned if zero == 3 and dp > 1 else params) * pb  # one weight version
        mem_grads = (owned if zero >= 2 else params) * gb + transient * gb
        mem_opt = (owned if zero >= 1 else params) * ob

        # one microbatch's time
        forward = n_layers * f_layer + (f_head if last else 0)
        compute_fwd = forward / rate
        compute_bwd = (2 * forward + n_layers * f_recompute) / rate
        sends = 2 * v - first - last  # every chunk sends forward and backward but the model's ends
        tp_time = n_layers * tp_time_layer

        grads = params * gb
        dp_bytes = mb_exposed = step_exposed = 0.0
        if dp > 1:
            if zero == 0:
                dp_bytes = sent_bytes("all-reduce", grads, dp)
                exposed = bucketed_exposed_time(grads, bucket_bytes, compute_bwd, "all-reduce", dp, *dp_link)
                if sched == "pipedream":  # a weight update, hence a reduction, after every microbatch
                    dp_bytes *= m
                    mb_exposed = exposed
                else:
                    step_exposed = exposed
            elif zero == 1:
                dp_bytes = sent_bytes("reduce-scatter", grads, dp) + sent_bytes("all-gather", params * pb, dp)
                step_exposed = (bucketed_exposed_time(grads, bucket_bytes, compute_bwd, "reduce-scatter", dp, *dp_link)
                                + collective_time("all-gather", params * pb, dp, *dp_link))
            else:  # FSDP2: per microbatch, gather parameters for forward, reduce-scatter gradients in backward
                gathers = 1 if zero == 2 else 2
                dp_bytes = m * (gathers * sent_bytes("all-gather", params * pb, dp)
                                + sent_bytes("reduce-scatter", grads, dp))
                gather = collective_time("all-gather", params * pb, dp, *dp_link)
                mb_exposed = (max(0.0, gather - compute_fwd)
                              + bucketed_exposed_time(grads, p_layer * gb, compute_bwd, "reduce-scatter", dp, *dp_link)
                              + (max(0.0, gather - compute_bwd) if zero == 3 else 0.0))
        optimizer = owned * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth * (m if sched == "pipedream" else 1)
        if tied_copy and (first or last):
            step_exposed += tied_time
        exposed = tp_time + sends * send_time + mb_exposed
        gathered = transient * pb if zero == 3 else 0
        stages[key] = _Stage(params, held, gathered, mem_grads, mem_opt,
                             compute_fwd + compute_bwd + exposed, compute_fwd + compute_bwd, exposed, step_exposed, optimizer,
                             compute_bwd + tp_time / 2, dp_bytes, m * n_layers * tp_bytes_layer,
                             m * sends * message + (tied_bytes if tied_copy and (first or last) else 0.0))
    ranks = [stages[key] for key in keys]

    # memory: weight versions and activations (what each in-flight microbatch stashes, plus one recomputed layer)
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
    weights = [rank.weights + rank.gathered for rank in ranks]
    if sched in ("2bw", "pipedream"):
        weights = [w + (weight_versions(sched, p, r) - 1) * rank.weights for r, (w, rank) in enumerate(zip(weights, ranks))]
    by_stage = [{"parameters": w, "gradients": rank.gradients, "optimizer_states": rank.optimizer_states,
                 "activations": a, "total": w + rank.gradients + rank.optimizer_states + a}
                for w, rank, a in zip(weights, ranks, activations)]
    totals = [stage["total"] for stage in by_stage]
    peak = max(range(p), key=totals.__getitem__)
    top = ranks[peak]

    # time: the pipeline, then each rank's step; the iteration ends with the last rank to finish
    if sched in FLUSHING:
        pipe = pipeline_time(sched, [rank.per_microbatch for rank in ranks], m, v)
        iteration, finish, slowest = -1.0, 0.0, top
        drain = 0.0  # how long the flush still runs after rank r's last backward: ranks r − 1 … 0
        for rank in ranks:
            end = pipe - drain + rank.step_exposed + rank.optimizer
            if end > iteration:
                iteration, finish, slowest = end, pipe - drain, rank
            drain += (rank.backward + send_time) / v
    else:  # no flush: in steady state every rank keeps the pace of the slowest
        slowest = max(stages.values(), key=lambda rank: m * rank.per_microbatch + rank.step_exposed + rank.optimizer)
        finish = m * slowest.per_microbatch
        iteration = finish + slowest.step_exposed + slowest.optimizer
    bubble = finish - m * slowest.per_microbatch

    global_batch = b * m * dp
    return {
        "parameters": par.model_parameters(spec.layers, h, ffn, vocab, s, tied),
        "parameters_per_stage": [rank.parameters for rank in ranks],
        "flops": {"model": fl.model_flops(global_batch, spec.layers, s, h, ffn, vocab),
                  "hardware": fl.hardware_flops(global_batch, spec.layers, s, h, ffn, vocab, rc)},
        "memory_bytes": by_stage[peak],
        "memory_bytes_per_stage": totals,
        "memory_bytes_by_stage": by_stage,
        "peak_stage": peak,
        "fits": totals[peak] <= hw.memory_capacity,
        "communication_bytes": {"data_parallel": max(rank.dp_bytes for rank in stages.values()),
                                "tensor_parallel": max(rank.tp_bytes for rank in stages.values()),
                                "pipeline_parallel": max(rank.pp_bytes for rank in stages.values())},
        "collectives": {"data_parallel": DP_COLLECTIVES[zero] if dp > 1 else "none",
                        "tensor_parallel": ("all-gather + reduce-scatter" if sp else "all-reduce") if t > 1 else "none",
                        "pipeline_parallel": ("send/recv" + (" + all-reduce (tied embeddings)" if tied_copy else ""))
                        if p > 1 else "none"},
        "time_s": {"compute": m * slowest.compute + slowest.optimizer,
                   "communication_exposed": m * slowest.exposed + slowest.step_exposed,
                   "bubble": bubble, "iteration": iteration},
        "bubble_fraction": bubble / iteration if iteration > 0 else 0.0,
        "hardware": hw.name,
    }


def _rank_tensors(h, ffn, t, vocab, s, n_layers, first, last, head_matrix):
    """(count, dim-0 size, elements) of the parameter tensors one rank holds, for ZeRO sharding."""
    tensors = [(n_layers, d0, numel) for d0, numel in par.layer_tensors(h, ffn, t)]
    if first:
        tensors += [(1, vocab, vocab * h), (1, s, s * h)]
    if last:
        tensors += [(2, h, h)] + ([(1, vocab, vocab * h)] if head_matrix else [])
    return tuple(tensors)
