"""One prediction: memory, communication, FLOPs and time of a configuration on some hardware.

This module only assembles the terms defined, each with its equation and source, in the sibling
modules: a pipeline rank's costs come in named pieces from :mod:`distperf.cost.stage`; here they are placed in
the schedule. Every pipeline rank is evaluated (its layers, its share of the embedding and head, its
microbatches in flight and weight versions); memory is reported for the most loaded rank and as a
total per pipeline rank, communication as the most any rank sends per kind, and time for the rank
that finishes the iteration last.

Memory of pipeline rank r: its model states (:func:`distperf.cost.stage.model_states`, with the schedule's weight
versions), and its activations: each microbatch in flight (:func:`distperf.cost.schedules.in_flight`) keeps its
layers' stash (:mod:`distperf.cost.activations`) and the ends' (embedding, head). Counting what the trainer keeps,
the step's token ids are one batch whose views every microbatch uses, counted once; and a rank that receives its
input from a neighbour (torch's pipeline schedules; not 2BW, which receives into fresh tensors) keeps every
microbatch's receive buffer, which its first layer saves, for the whole step: m of them, however few microbatches
are in flight. What a recomputed layer rebuilds during its backward is reported apart (``recompute_working``).

Time of one microbatch on pipeline rank r (per tensor- and data-parallel rank):

    t_r = compute (3·forward FLOPs + recomputed FLOPs) / achieved FLOP/s
        + tensor-parallel collectives (not overlapped)
        + pipeline sends (not overlapped)
        + ZeRO-2/3 collectives not hidden behind the microbatch's compute.

With the hardware's measured ``kernels`` (:mod:`distperf.cost.kernels`), compute is the sum of the kernels one
microbatch launches on the rank, each at the time measured for its shape, and the optimizer Adam's loop over the
rank's tensors (:func:`distperf.cost.stage.kernel_classes`, :func:`~distperf.cost.stage.optimizer_time`).

With ``layer_times`` (profiled seconds of one layer, the embeddings and the head on one device, for
this micro-batch; :func:`distperf.measure.calibrate.layer_times`) the compute term is taken from them
instead of FLOPs over rate, as profiling-based predictors such as DistSim and vTrain do:

    compute_r = L_r/t · (f_layer + b_layer + recomputed share of f_layer)
              + [first] (f_embedding + b_embedding) + [last] (f_head + b_head),

the recomputed share being the FLOP ratio recompute_forward_flops / layer_forward_flops (1 for full
recomputation, the attention core's share for selective). Part times a run measured on its own ranks, all at once
(:mod:`distperf.measure.parts`: ``layer_times`` with ``ranks_at_once``) are already the rank's tensor-parallel share
and already contended: the same sum without the 1/t and without the contention factor; their ``optimizer`` times
(one layer's tensors, the embeddings', the head's, as the rank holds them) give the optimizer step
L_r·o_layer + [first] o_first + [last] o_last (times ZeRO-1's owned share).

``convention="trainer"`` (the default) counts what the trainers run under torch 2.13, ``"paper"`` what the
papers count (:mod:`distperf.cost.stage` lists where they differ; :mod:`distperf.cost.activations` the two
activation counts). ``backend`` (``nccl``, the default, or ``gloo``) chooses the collective algorithms whose
time is counted; the bytes come both ways whatever the backend: ``communication_bytes``, the algorithmic ring
volumes, and ``communication_wire_bytes``, what gloo sends (:mod:`distperf.cost.collectives`).

The pipeline takes :func:`~distperf.cost.schedules.pipeline_time` over the t_r; in the trainer's PipeDream-2BW with
a tied embedding, the last rank also waits each step for the first rank's update (:func:`tied_update_wait`). Rank r
finishes its last backward when the drain has still to cross ranks r − 1 … 0; then its data-parallel reduction's
exposed tail (bucketed overlap with the last backward), the tied-embedding all-reduce and the optimizer
step (memory-bound: bytes touched / memory bandwidth) follow, and, with measured kernels, the m − 1 additions of a
microbatch's gradients to the accumulated ones and, where a what-if prices FSDP2's units by their size
(``kernels.fsdp_units``, which no profile sets: :mod:`distperf.cost.kernels`), their
per-step part (``StageCosts.step_compute``: :func:`distperf.cost.stage.fsdp_unit_work`; their per-microbatch part is
in t_r). Iteration = the latest rank's end, plus, where a what-if sets how long synchronized ranks wait for the
slowest (``kernels.skew``, which no profile sets: :mod:`distperf.cost.kernels`), that rank's waits
(:func:`distperf.cost.stage.step_waits`, counted as exposed communication; those of each tensor-parallel collective
are in t_r); bubble = that rank's idle time inside the pipeline phase.
"""
from __future__ import annotations

from functools import lru_cache
from operator import itemgetter
from typing import Callable

from ..config import DDP_BUCKET_MB, TWOBW_ENGINE, Config, ConfigError, uniform_partition, validate
from ..hardware import DEFAULT, PRESETS, Hardware
from . import activations as act
from . import flops as fl
from . import parameters as par
from .collectives import BACKENDS, ddp_bucket_count, gloo_sent_bytes
from .model_states import greedy_partition_max, zero_partition_loads
from .schedules import FLUSHING, in_flight_per_rank, pipeline_time, weight_versions
from .communication import binomial_sends, clear_cache as clear_communication_cache, unit_gathers
from .stage import Span, StageCosts, clear_cache, ddp_buckets, stage_costs, step_waits

DDP_BUCKET_BYTES = DDP_BUCKET_MB * 2**20
KINDS = ("data_parallel", "tensor_parallel", "pipeline_parallel")

DP_COLLECTIVES = {0: "all-reduce", 1: "all-reduce + broadcast of each parameter from its owner",
                  2: "all-gather per microbatch + reduce-scatter", 3: "all-gather ×2 per microbatch + reduce-scatter"}
DP_COLLECTIVES_PAPER = {**DP_COLLECTIVES, 1: "reduce-scatter + all-gather",
                        2: "all-gather + reduce-scatter per microbatch",
                        3: "all-gather ×2 + reduce-scatter per microbatch"}


def predict(cfg: Config, hw: Hardware | None = None, bucket_bytes: float = DDP_BUCKET_BYTES,
            check: bool = True, layer_times: dict | None = None, convention: str = "trainer",
            backend: str = "nccl") -> dict:
    """Predict one configuration; returns the JSON-ready dictionary of ``python -m distperf predict``.

    Keys: parameters, parameters_per_stage, flops {model, hardware}, memory_bytes {parameters,
    gradients, optimizer_states, activations, recompute_working, total} (most loaded rank; activations are
    the saved tensors, recompute_working what a recomputed layer rebuilds during its backward),
    memory_bytes_per_stage (totals), memory_bytes_by_stage (the categories of every pipeline rank),
    model_states_at_rest and model_states_at_rest_by_stage (parameters, gradients, optimizer states kept
    between steps: the memory_bytes states without a step's transients, i.e. ZeRO-2/3's gathered parameters
    and unsharded gradients), peak_stage, slowest_stage (the pipeline rank that ends the iteration: the one whose
    time_s describes compute, exposed communication and bubble), fits, communication_bytes {data_parallel,
    tensor_parallel, pipeline_parallel} (algorithmic: ring volumes), communication_wire_bytes (same keys: what gloo
    sends), collectives (same keys), time_s {compute, communication_exposed, bubble, iteration}, bubble_fraction,
    hardware, compute_from ("flops", "kernels": the hardware's measured kernel times, or "layer_times"), convention,
    backend.

    ``layer_times``: {"layer": (forward_s, backward_s), "embedding": (…), "head": (…)} of one
    microbatch on one device, or of one rank with ``ranks_at_once`` (a number) and ``optimizer`` ({"layer_s",
    "first_s", "last_s"}: :func:`distperf.measure.parts.part_times`); when given, compute time comes from them (see
    the module docstring).
    """
    if check:
        validate(cfg)
        if convention not in act.CONVENTIONS:
            raise ConfigError("convention", f"must be one of {', '.join(act.CONVENTIONS)}, got {convention!r}")
        if backend not in BACKENDS:
            raise ConfigError("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    hw = hw or PRESETS[DEFAULT]
    spec, lay, tr = cfg.model, cfg.layout, cfg.training
    h, s, vocab = spec.hidden, spec.seq, spec.vocab
    b, m, p, v, t, dp = lay.micro_batch, lay.microbatches, lay.pp, lay.chunks, lay.tp, lay.dp
    sp, rc, sched = lay.sequence_parallel, lay.recompute, lay.schedule
    layers = lay.partition or _uniform(spec.layers, p * v)
    n_chunks = p * v

    # ranks with the same layers and ends cost the same apart from the schedule
    spans, unique, which, every = _spans(layers, p, v)
    times = None if layer_times is None else profiled_times(layer_times)
    distinct = stage_costs(spec, lay, tr, hw, unique, bucket_bytes, times, convention, backend)  # in unique's order
    ranks = every(distinct)

    # activations: what each in-flight microbatch stashes, and the step's token ids (trainer)
    stash_layer, stash_embed, stash_head, working = _stashes(spec, b, t, sp, tr.precision, rc, convention)
    trainer = convention == "trainer"
    tokens = 8 * b * m * dp * (s + 1) if trainer else 0  # act.trainer_token_bytes: the step's token ids
    # torch's pipelining receives each microbatch's input into a buffer of its own, which the stage's first layer
    # keeps for backward and the stage keeps for the run: every received input stays (m of them per chunk);
    # the input is stage.activation_message, fp32
    received = b * s * h * 4 / (t if sp else 1) if p > 1 and trainer and sched in FLUSHING else 0.0
    if v == 1:
        counts, kept_inputs = _one_chunk_flights(sched, p, m)
        activations = [n * k * stash_layer + received * g for n, k, g in zip(counts, layers, kept_inputs)]
        activations[0] += counts[0] * stash_embed + tokens
        activations[-1] += counts[-1] * stash_head + (tokens if b == 1 and p > 1 else 0)
    else:
        flights = in_flight_per_rank(sched, p, m, v)
        activations = [0.0] * p
        activations[0] += tokens
        activations[(n_chunks - 1) % p] += tokens if b == 1 and p > 1 else 0
        for r, counts in enumerate(flights):
            for c, count in zip(range(r, n_chunks, p), counts):
                activations[r] += count * (layers[c] * stash_layer + (stash_embed if c == 0 else 0)
                                           + (stash_head if c == n_chunks - 1 else 0)) + (received * (m - count)
                                                                                          if c else 0.0)

    # memory by category, with the schedule's weight versions: each version beyond the first is one more copy of
    # the weights (2BW, PipeDream); our 2BW engine, with a flush or without, drops each gradient once applied
    versions = sched in ("2bw", "pipedream")
    gradients_at_rest = not (sched in TWOBW_ENGINE and convention == "trainer")
    by_stage, at_rest, totals = [], [], []
    if versions:
        for rank, x, more in zip(ranks, activations, _more_versions(sched, p)):
            st = rank.states
            weights, grads, states = st.weights + st.gathered, st.gradients if m > 1 else st.gradients_single, \
                st.optimizer_states
            total = weights + grads + states + x + working
            kept_weights, kept_grads, kept_states = st.at_rest
            extra = more * st.weights
            weights, total, kept_weights = weights + extra, total + extra, kept_weights + extra
            by_stage.append({"parameters": weights, "gradients": grads, "optimizer_states": states, "activations": x,
                             "recompute_working": working, "total": total})
            at_rest.append({"parameters": kept_weights, "gradients": kept_grads if gradients_at_rest else 0,
                            "optimizer_states": kept_states})
            totals.append(total)
    else:  # ranks alike but for their activations share their model states (and their read-only at-rest entry)
        alike = []
        for rank in distinct:
            st = rank.states
            weights, grads = st.weights + st.gathered, st.gradients if m > 1 else st.gradients_single
            kept_weights, kept_grads, kept_states = st.at_rest
            alike.append((weights, grads, st.optimizer_states, weights + grads + st.optimizer_states,
                          {"parameters": kept_weights, "gradients": kept_grads if gradients_at_rest else 0,
                           "optimizer_states": kept_states}))
        for (weights, grads, states, held, kept), x in zip(every(alike), activations):
            total = held + x + working
            by_stage.append({"parameters": weights, "gradients": grads, "optimizer_states": states, "activations": x,
                             "recompute_working": working, "total": total})
            at_rest.append(kept)
            totals.append(total)
    peak = totals.index(max(totals))

    # time: the pipeline, then each rank's step; the iteration ends with the last rank to finish
    updates = m if sched == "pipedream" else 1  # PipeDream updates the weights after every microbatch
    if sched in FLUSHING:
        pipe = pipeline_time(sched, [rank.microbatch for rank in ranks], m, v)
        iteration, finish, slowest, last = -1.0, 0.0, ranks[0], 0
        drain = 0.0  # how long the flush still runs after rank r's last backward: ranks r − 1 … 0
        for r, rank in enumerate(ranks):
            end = pipe - drain + rank.step_exposed + rank.optimizer + (m - 1) * rank.accumulate + rank.step_compute
            if end > iteration:
                iteration, finish, slowest, last = end, pipe - drain, rank, r
            drain += rank.drain / v
    else:  # no flush: in steady state every rank keeps the pace of the slowest
        def busy(rank):
            """The rank's step without waits: m microbatches, its step's exposed tail, updates, accumulation."""
            return (m * rank.microbatch + rank.step_exposed + updates * rank.optimizer + (m - 1) * rank.accumulate
                    + rank.step_compute)

        busy_times = [busy(rank) for rank in distinct]
        slowest_distinct = busy_times.index(max(busy_times))
        slowest = distinct[slowest_distinct]
        finish = m * slowest.microbatch
        last = which.index(slowest_distinct)  # by index: ranks.index would compare StageCosts field by field
        if sched == "2bw" and spec.tied and p > 1 and trainer:  # the last rank waits for the first one's update
            wait = tied_update_wait(ranks)
            if busy(ranks[-1]) + wait > busy(slowest):
                slowest, last, finish = ranks[-1], p - 1, m * ranks[-1].microbatch + wait
        iteration = (finish + slowest.step_exposed + updates * slowest.optimizer + (m - 1) * slowest.accumulate
                     + slowest.step_compute)
    bubble = finish - m * slowest.microbatch
    waits = step_waits(hw.kernels, lay, slowest, m) if hw.kernels is not None and hw.kernels.skew else 0.0
    iteration += waits

    rows = []  # what each distinct rank sends in a step, per kind: algorithmic, then on gloo's wire
    for rank in distinct:
        x, y = rank.step_bytes, rank.microbatch_bytes
        rows.append((x[0] + m * y[0], x[1] + m * y[1], x[2] + m * y[2], x[3] + m * y[3], x[4] + m * y[4],
                     x[5] + m * y[5]))
    sent = tuple(map(max, *rows)) if len(rows) > 1 else rows[0]  # the most any rank sends
    dp_names = DP_COLLECTIVES_PAPER if convention == "paper" else DP_COLLECTIVES
    parameters, model_flops, hardware_flops = _model_totals(spec.layers, h, spec.ffn, vocab, s, spec.tied, rc)
    global_batch = b * m * dp
    return {
        "parameters": parameters,
        "parameters_per_stage": list(every([rank.states.parameters for rank in distinct])),
        "flops": {"model": global_batch * model_flops, "hardware": global_batch * hardware_flops},
        "memory_bytes": by_stage[peak],
        "memory_bytes_per_stage": totals,
        "memory_bytes_by_stage": by_stage,
        "model_states_at_rest": at_rest[peak],
        "model_states_at_rest_by_stage": at_rest,
        "peak_stage": peak,
        "slowest_stage": last,
        "fits": totals[peak] <= hw.memory_capacity,
        "communication_bytes": {"data_parallel": sent[0], "tensor_parallel": sent[1], "pipeline_parallel": sent[2]},
        "communication_wire_bytes": {"data_parallel": sent[3], "tensor_parallel": sent[4],
                                     "pipeline_parallel": sent[5]},
        "collectives": {"data_parallel": dp_names[lay.zero] if dp > 1 else "none",
                        "tensor_parallel": ("all-gather + reduce-scatter" if sp else "all-reduce") if t > 1 else "none",
                        "pipeline_parallel": ("send/recv" + (" + all-reduce (tied embeddings)" if spec.tied else ""))
                        if p > 1 else "none"},
        "time_s": {"compute": m * slowest.compute + updates * slowest.optimizer + (m - 1) * slowest.accumulate
                              + slowest.step_compute,
                   "communication_exposed": m * slowest.exposed + slowest.step_exposed + waits,
                   "bubble": bubble, "iteration": iteration},
        "bubble_fraction": bubble / iteration if iteration > 0 else 0.0,
        "hardware": hw.name,
        "compute_from": "layer_times" if times is not None else "flops" if hw.kernels is None else "kernels",
        "convention": convention,
        "backend": backend,
    }



def tied_update_wait(ranks: list[StageCosts]) -> float:
    """What a tied embedding costs PipeDream-2BW's last rank per step in the trainer, beyond its all-reduce:
    Σ_{r < p−1} drain_r (the papers count no such wait: ``convention="paper"`` leaves it out).

    The trainer all-reduces the tied embedding's gradient between the first and the last rank when each applies
    update t. The last rank reaches update t right after its backward of batch t's last microbatch; the first rank
    only after that microbatch's gradient has crossed ranks p − 2 … 0, each a backward and a send (``drain``). The
    last rank waits that long at every step, and in steady state every rank keeps its pace. The schedule's timeline
    with that dependency (:func:`distperf.parallel.twobw_schedule.timeline` with ``tied``) gives the same, (d − 1)·b
    per batch for equal stages; traced on the 2-core development machine, the trainer stepped the `small` model at
    pp 2, micro-batch 2, m 2 in 53–56 ms with its embedding tied and 31–38 ms untied."""
    return sum(rank.drain for rank in ranks[:-1])


@lru_cache(maxsize=4096)
def _stashes(spec, b: int, t: int, sp: bool, precision: str, rc: str, convention: str) -> tuple[float, ...]:
    """Activation bytes per microbatch of a layer, the first stage's ends and the last's, and the recomputation
    working set (:mod:`distperf.cost.activations`): as the trainer keeps them, or as the papers count (values in
    the parameters' precision, 2 bytes mixed and 4 fp32)."""
    s, h, a, ffn, vocab, dropout, attention = (spec.seq, spec.hidden, spec.heads, spec.ffn, spec.vocab,
                                               spec.dropout > 0, spec.attention)
    mixed = precision == "mixed"
    if convention == "trainer":
        args = (s, b, h, a, ffn, t, sp, dropout, attention, mixed, rc)
        return (act.trainer_layer_bytes(*args), act.trainer_first_stage_bytes(s, b, h, dropout),
                act.trainer_last_stage_bytes(s, b, h, vocab, t, sp, mixed), act.trainer_working_bytes(*args))
    vb = 2 if mixed else 4
    return (act.layer_activation_bytes(s, b, h, a, t, sp, dropout, vb, rc, attention, ffn),
            act.embedding_stash_bytes(s, b, h, dropout), act.head_stash_bytes(s, b, h, vocab, t, sp, vb),
            act.recompute_working_bytes(s, b, h, a, t, sp, dropout, vb, rc, attention, ffn))


def rank_spans(cfg: Config) -> tuple[Span, ...]:
    """The :class:`~distperf.cost.stage.Span` of each pipeline rank of ``cfg`` (its partition, else the uniform
    one)."""
    lay = cfg.layout
    return _spans(lay.partition or _uniform(cfg.model.layers, lay.pp * lay.chunks), lay.pp, lay.chunks)[0]


@lru_cache(maxsize=4096)
def _spans(layers: tuple[int, ...], p: int, v: int) -> tuple[tuple[Span, ...], tuple[Span, ...], tuple[int, ...],
                                                              Callable]:
    """The :class:`Span` of each pipeline rank, the distinct ones, which of those each rank holds (its index), and a
    function from the distinct ranks' values (a tuple or list in their order) to every rank's."""
    spans = tuple(Span(layers[r] if v == 1 else sum(layers[r::p]), r == 0, r == p - 1) for r in range(p))
    unique = tuple(dict.fromkeys(spans))
    which = tuple(map(unique.index, spans))
    return spans, unique, which, (itemgetter(*which) if len(unique) > 1 else lambda values: values * p)


@lru_cache(maxsize=4096)
def _one_chunk_flights(schedule: str, p: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """With one chunk per rank: the microbatches each rank holds in flight (:func:`in_flight_per_rank`), and how many
    received inputs it keeps beyond them (m − in flight; none on the first rank, which receives nothing)."""
    counts = tuple(n for n, in in_flight_per_rank(schedule, p, m, 1))
    return counts, (0,) + tuple(m - n for n in counts[1:])


@lru_cache(maxsize=4096)
def _more_versions(schedule: str, p: int) -> tuple[int, ...]:
    """The weight versions each rank holds beyond the first (:func:`~distperf.cost.schedules.weight_versions`)."""
    return tuple(weight_versions(schedule, p, r) - 1 for r in range(p))


@lru_cache(maxsize=4096)
def _uniform(layers: int, stages: int) -> tuple[int, ...]:
    """:func:`distperf.config.uniform_partition`, cached."""
    return uniform_partition(layers, stages)


@lru_cache(maxsize=4096)
def _model_totals(layers: int, h: int, ffn: int, vocab: int, s: int, tied: bool, rc: str) -> tuple[int, int, int]:
    """Parameters, and model and hardware FLOPs per sequence of the batch (both are linear in it)."""
    return (par.model_parameters(layers, h, ffn, vocab, s, tied), fl.model_flops(1, layers, s, h, ffn, vocab),
            fl.hardware_flops(1, layers, s, h, ffn, vocab, rc))


def clear_caches() -> None:
    """Forget cached per-stage costs (for benchmarks that must start cold)."""
    clear_cache()
    clear_communication_cache()
    for cached in (_stashes, _spans, _uniform, _more_versions, _one_chunk_flights, in_flight_per_rank, _model_totals,
                   greedy_partition_max, zero_partition_loads, gloo_sent_bytes, binomial_sends, unit_gathers,
                   ddp_buckets, ddp_bucket_count):
        cached.cache_clear()


def profiled_times(layer_times: dict) -> tuple:
    """``layer_times`` as :func:`distperf.cost.stage.compute` takes them: ((f, b) layer, (f, b) embedding, (f, b) head)
    of one device, or with (o_layer, o_first, o_last) and True added when a run's ranks measured them all at once."""
    parts = tuple(tuple(float(x) for x in layer_times[part]) for part in ("layer", "embedding", "head"))
    if not layer_times.get("ranks_at_once"):
        return parts
    optimizer = layer_times["optimizer"]
    return parts + (tuple(float(optimizer[g]) for g in ("layer_s", "first_s", "last_s")), True)
