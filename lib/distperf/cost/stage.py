"""The costs of one pipeline rank, in named pieces: model states, compute, tensor-parallel, pipeline and
data-parallel terms.

Each piece takes the configuration's frozen parts whole (:class:`~distperf.config.ModelSpec`,
:class:`~distperf.config.Layout`, :class:`~distperf.config.Training`, :class:`~distperf.hardware.Hardware`) and
the :class:`Span` of the model that the rank holds, and returns a small frozen dataclass. :func:`stage_costs`
combines them into the :class:`StageCosts` that :func:`distperf.cost.predict` places in the schedule; it is
cached on what a rank's costs depend on (not the number of microbatches, nor the schedule but for PipeDream's
update per microbatch), so that a sweep over microbatches and schedules reuses it.

Time of one microbatch on the rank (per tensor- and data-parallel rank):

    t_r = compute + tensor-parallel collectives (not overlapped) + pipeline sends (not overlapped)
        + ZeRO-2/3 collectives not hidden behind the microbatch's compute,

the book's chapter "The analytical framework" derives each term.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..config import Layout, ModelSpec, Training
from ..hardware import Hardware
from . import flops as fl
from . import parameters as par
from .collectives import bucketed_exposed_time, collective_time, sent_bytes
from .model_states import bytes_per_parameter, fsdp_shard_elements, greedy_partition_max


class Span(NamedTuple):
    """The part of the model one pipeline rank holds: its Transformer layers (over all its chunks), and the
    embeddings (``first``) and final LayerNorm and head (``last``). (A named tuple: predictions build one per
    rank, so it must be cheap.)"""

    layers: int
    first: bool
    last: bool


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Parameters, gradients and optimizer states of the rank, bytes unless said otherwise."""

    parameters: int  # elements on one tensor-parallel rank, before ZeRO
    owned: int  # elements whose optimizer state (ZeRO ≥ 1), gradient (≥ 2) and weights (3) the rank keeps
    layer_parameters: int  # elements of one layer on one tensor-parallel rank (an FSDP unit)
    weights: float  # one weight version (sharded with ZeRO-3)
    gathered: float  # ZeRO-3: one unit's parameters, unsharded while it works
    gradients: float
    optimizer_states: float
    at_rest: tuple  # (parameters, gradients, optimizer states) kept between steps, one weight version
    total: float  # weights + gathered + gradients + optimizer states


@dataclass(frozen=True, slots=True)
class Compute:
    """Seconds of one microbatch's forward and backward (recomputation included) on the rank."""

    forward: float
    backward: float


@dataclass(frozen=True, slots=True)
class TensorParallelTerms:
    """The tensor-parallel all-reduces of one microbatch: all of them, and those of the backward pass."""

    time: float
    backward: float
    sent_bytes: float


@dataclass(frozen=True, slots=True)
class PipelineTerms:
    """Activations sent to the neighbouring ranks per microbatch, and the tied embedding's all-reduce per step."""

    sends: int  # per microbatch: forward and backward per chunk, but the model's two ends
    send_time: float  # one send
    sent_bytes_microbatch: float
    sent_bytes_step: float
    step_exposed: float  # the tied embedding's all-reduce, after the last backward


@dataclass(frozen=True, slots=True)
class DataParallelTerms:
    """The data-parallel (ZeRO) collectives: bytes per step and per microbatch, and the time each leaves exposed."""

    sent_bytes_step: float
    sent_bytes_microbatch: float
    exposed_step: float  # after the last backward (DDP and ZeRO-1's reduction, bucketed)
    exposed_microbatch: float  # FSDP2's gathers and reduce-scatter not hidden behind compute


@dataclass(frozen=True, slots=True)
class StageCosts:
    """A pipeline rank's costs apart from its place in the schedule and the number of microbatches."""

    states: ModelStates
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


NO_TENSOR_PARALLEL = TensorParallelTerms(time=0.0, backward=0.0, sent_bytes=0.0)
NO_PIPELINE = PipelineTerms(sends=0, send_time=0.0, sent_bytes_microbatch=0.0, sent_bytes_step=0.0, step_exposed=0.0)
NO_DATA_PARALLEL = DataParallelTerms(sent_bytes_step=0.0, sent_bytes_microbatch=0.0, exposed_step=0.0,
                                     exposed_microbatch=0.0)


def model_states(spec: ModelSpec, lay: Layout, tr: Training, span: Span) -> ModelStates:
    """Bytes per parameter by precision and optimizer (:func:`~distperf.cost.model_states.bytes_per_parameter`),
    over the rank's parameters (:mod:`distperf.cost.parameters`), sharded over the dp replicas as the trainer's
    ZeRO stage does: ZeroRedundancyOptimizer deals whole tensors (:func:`greedy_partition_max`), FSDP2 cuts every
    tensor along dim 0 (:func:`fsdp_shard_elements`) and keeps one unit's gradient (and, ZeRO-3, parameters)
    unsharded while it works."""
    h, t, dp, zero = spec.hidden, lay.tp, lay.dp, lay.zero
    pb, gb, ob = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)
    p_layer = par.layer_parameters_per_tp_rank(h, spec.ffn, t)
    p_embed = par.embedding_parameters(h, spec.vocab, spec.seq)
    p_head = par.head_parameters(h, spec.vocab, spec.tied, lay.pp)
    params = span.layers * p_layer + (p_embed if span.first else 0) + (p_head if span.last else 0)
    owned, transient = params, 0
    if zero and dp > 1:
        tensors = _rank_tensors(spec, t, span, p_head > 2 * h)
        owned = greedy_partition_max(tensors, dp) if zero == 1 else fsdp_shard_elements(tensors, dp)
        if zero >= 2:  # one FSDP unit's unsharded gradient (and, ZeRO-3, parameters) at a time
            transient = max(p_layer if span.layers else 0, p_embed if span.first else 0, p_head if span.last else 0)
    weights = (owned if zero == 3 and dp > 1 else params) * pb
    gathered = transient * pb if zero == 3 else 0
    gradients = (owned if zero >= 2 else params) * gb + transient * gb
    optimizer_states = (owned if zero >= 1 else params) * ob
    sharded = owned if zero >= 2 else params  # FSDP2 shards parameters and gradients at rest for ZeRO-2 as for 3
    return ModelStates(parameters=params, owned=owned, layer_parameters=p_layer, weights=weights, gathered=gathered,
                       gradients=gradients, optimizer_states=optimizer_states,
                       at_rest=(sharded * pb, sharded * gb, optimizer_states),
                       total=weights + gathered + gradients + optimizer_states)


def compute(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span,
            times: tuple | None = None) -> Compute:
    """Forward FLOPs over the achieved rate; the backward twice the forward plus what recomputation repeats
    (:mod:`distperf.cost.flops`). The head is replicated: every tensor-parallel rank computes it.

    With profiled ``times`` (((f, b) layer, (f, b) embedding, (f, b) head) seconds of one microbatch on one
    device), as profiling-based predictors do: L/t·(f + b + recomputed share·f) + the ends' f + b, the
    recomputed share being the FLOP ratio recompute_forward_flops / layer_forward_flops."""
    b, s, h, ffn, t, rc = lay.micro_batch, spec.seq, spec.hidden, spec.ffn, lay.tp, lay.recompute
    if times is not None:
        (layer_f, layer_b), (embed_f, embed_b), (head_f, head_b) = times
        recomputed = fl.recompute_forward_flops(b, s, h, ffn, rc) / fl.layer_forward_flops(b, s, h, ffn)
        return Compute(forward=span.layers * layer_f / t + (embed_f if span.first else 0.0)
                       + (head_f if span.last else 0.0),
                       backward=(span.layers * (layer_b + recomputed * layer_f) / t + (embed_b if span.first else 0.0)
                                 + (head_b if span.last else 0.0)))
    rate = hw.flops(tr.precision)
    forward = span.layers * fl.layer_forward_flops(b, s, h, ffn) / t + \
        (fl.head_forward_flops(b, s, h, spec.vocab) if span.last else 0)
    return Compute(forward=forward / rate,
                   backward=(2 * forward + span.layers * fl.recompute_forward_flops(b, s, h, ffn, rc) / t) / rate)


def activation_message(spec: ModelSpec, lay: Layout, tr: Training) -> float:
    """Bytes of one microbatch's activation (or its gradient) between layers, b·s·h in the parameters' precision."""
    return lay.micro_batch * spec.seq * spec.hidden * bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)[0]


def tensor_parallel(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span) -> TensorParallelTerms:
    """Megatron's two all-reduces per layer forward and two backward (two more when full recomputation reruns
    the forward), of one microbatch's activation, on the tensor-parallel group's links."""
    t = lay.tp
    if t == 1:
        return NO_TENSOR_PARALLEL
    message = activation_message(spec, lay, tr)
    all_reduce = collective_time("all-reduce", message, t, *hw.link(t))
    collectives = span.layers * (6 if lay.recompute == "full" else 4)
    time = collectives * all_reduce
    return TensorParallelTerms(time=time, backward=time - 2 * span.layers * all_reduce,
                               sent_bytes=collectives * sent_bytes("all-reduce", message, t))


def pipeline(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span) -> PipelineTerms:
    """Every chunk sends its activation forward and its gradient backward, but the model's two ends; with tied
    embeddings the first and last rank all-reduce the embedding's gradient (V·h) once per step."""
    p, t, dp = lay.pp, lay.tp, lay.dp
    if p == 1:
        return NO_PIPELINE
    message = activation_message(spec, lay, tr)
    sends = 2 * lay.chunks - span.first - span.last
    send_time = collective_time("send", message, 2, *hw.link(t * dp * p))
    step_bytes = step_exposed = 0.0
    if spec.tied and p > 1 and (span.first or span.last):
        gb = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)[1]
        step_bytes = sent_bytes("all-reduce", spec.vocab * spec.hidden * gb, 2)
        step_exposed = collective_time("all-reduce", spec.vocab * spec.hidden * gb, 2, *hw.link(t * dp * p))
    return PipelineTerms(sends=sends, send_time=send_time, sent_bytes_microbatch=sends * message,
                         sent_bytes_step=step_bytes, step_exposed=step_exposed)


def data_parallel(lay: Layout, tr: Training, hw: Hardware, states: ModelStates, work: Compute,
                  bucket_bytes: float) -> DataParallelTerms:
    """ZeRO 0: one all-reduce of the gradients per step, bucketed behind the last backward (DDP); ZeRO 1:
    reduce-scatter of the gradients and all-gather of the parameters; ZeRO 2/3 (FSDP2): per microbatch an
    all-gather of the parameters for the forward (and, ZeRO-3, again for the backward), and a reduce-scatter of
    the gradients unit by unit. PipeDream updates after every microbatch, so its reduction is per microbatch."""
    dp, zero = lay.dp, lay.zero
    if dp == 1:
        return NO_DATA_PARALLEL
    pb, gb, _ = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)
    params, grads, link = states.parameters, states.parameters * gb, hw.link(lay.tp * dp)
    step = microbatch = exposed_step = exposed_microbatch = 0.0
    if zero == 0:
        step = sent_bytes("all-reduce", grads, dp)
        exposed_step = bucketed_exposed_time(grads, bucket_bytes, work.backward, "all-reduce", dp, *link)
    elif zero == 1:
        step = sent_bytes("reduce-scatter", grads, dp) + sent_bytes("all-gather", params * pb, dp)
        exposed_step = (bucketed_exposed_time(grads, bucket_bytes, work.backward, "reduce-scatter", dp, *link)
                        + collective_time("all-gather", params * pb, dp, *link))
    else:
        gathers = 1 if zero == 2 else 2
        microbatch = gathers * sent_bytes("all-gather", params * pb, dp) + sent_bytes("reduce-scatter", grads, dp)
        gather = collective_time("all-gather", params * pb, dp, *link)
        exposed_microbatch = (max(0.0, gather - work.forward)
                              + bucketed_exposed_time(grads, states.layer_parameters * gb, work.backward,
                                                      "reduce-scatter", dp, *link)
                              + (max(0.0, gather - work.backward) if zero == 3 else 0.0))
    if lay.schedule == "pipedream":
        microbatch, exposed_microbatch, step, exposed_step = microbatch + step, exposed_microbatch + exposed_step, 0.0, 0.0
    return DataParallelTerms(sent_bytes_step=step, sent_bytes_microbatch=microbatch, exposed_step=exposed_step,
                             exposed_microbatch=exposed_microbatch)


def optimizer_time(tr: Training, hw: Hardware, states: ModelStates) -> float:
    """One optimizer step, memory-bound: it reads the gradient and both moments and writes the moments and the
    parameters of the elements it owns, (g + 2·o + 2·p) bytes each, over the memory bandwidth."""
    pb, gb, ob = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)
    return states.owned * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth


def _combine(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span, bucket_bytes: float,
             times: tuple | None) -> StageCosts:
    key = (spec, tr, lay.dp, lay.tp, lay.pp, lay.zero, span)  # all the model states depend on
    states = _STATES.get(key)
    if states is None:
        if len(_STATES) >= _CACHE_SIZE:
            _STATES.clear()
        states = _STATES[key] = model_states(spec, lay, tr, span)
    work = compute(spec, lay, tr, hw, span, times)
    tp = tensor_parallel(spec, lay, tr, hw, span)
    pp = pipeline(spec, lay, tr, hw, span)
    dp = data_parallel(lay, tr, hw, states, work, bucket_bytes)
    exposed = tp.time + pp.sends * pp.send_time + dp.exposed_microbatch
    return StageCosts(states=states, microbatch=work.forward + work.backward + exposed,
                      compute=work.forward + work.backward, exposed=exposed,
                      drain=work.backward + tp.backward + pp.send_time, step_exposed=pp.step_exposed + dp.exposed_step,
                      optimizer=optimizer_time(tr, hw, states), dp_bytes_step=dp.sent_bytes_step,
                      dp_bytes_microbatch=dp.sent_bytes_microbatch, tp_bytes_microbatch=tp.sent_bytes,
                      pp_bytes_microbatch=pp.sent_bytes_microbatch, pp_bytes_step=pp.sent_bytes_step)


_CACHE: dict = {}  # what the costs depend on but the span -> {span: StageCosts}
_STATES: dict = {}  # the model states, which depend on fewer things (not micro-batch, recomputation, hardware)
_CACHE_SIZE = 1 << 14


def stage_costs(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, spans, bucket_bytes: float,
                times: tuple | None = None) -> dict[Span, StageCosts]:
    """{span: :class:`StageCosts`} of the ranks holding ``spans``, cached on what they depend on: the model,
    training and hardware, the layout but for its microbatches and schedule (PipeDream's update per microbatch
    aside), the bucket size and profiled times."""
    key = (spec, tr, hw, bucket_bytes, times, lay.dp, lay.tp, lay.pp, lay.chunks, lay.micro_batch,
           lay.sequence_parallel, lay.zero, lay.recompute, lay.schedule == "pipedream")
    known = _CACHE.get(key)
    if known is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        known = _CACHE[key] = {}
    out = {}
    for span in spans:
        found = known.get(span)
        if found is None:
            found = known[span] = _combine(spec, lay, tr, hw, span, bucket_bytes, times)
        out[span] = found
    return out


def clear_cache() -> None:
    """Forget every cached :class:`StageCosts` (for benchmarks that must start cold)."""
    _CACHE.clear()
    _STATES.clear()


def _rank_tensors(spec: ModelSpec, t: int, span: Span, head_matrix: bool) -> tuple:
    """(count, dim-0 size, elements) of the parameter tensors one rank holds, for ZeRO sharding."""
    h, vocab, s = spec.hidden, spec.vocab, spec.seq
    tensors = [(span.layers, d0, numel) for d0, numel in par.layer_tensors(h, spec.ffn, t)]
    if span.first:
        tensors += [(1, vocab, vocab * h), (1, s, s * h)]
    if span.last:
        tensors += [(2, h, h)] + ([(1, vocab, vocab * h)] if head_matrix else [])
    return tuple(tensors)
