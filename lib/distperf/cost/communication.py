"""Communication of one pipeline rank: the bytes each kind of parallelism sends (algorithmic and on gloo's wire)
and the time the collectives take or leave exposed, term by term.

Each function takes the configuration's frozen parts (:class:`~distperf.config.ModelSpec`,
:class:`~distperf.config.Layout`, :class:`~distperf.config.Training`, :class:`~distperf.hardware.Hardware`) and the
:class:`~distperf.cost.stage.Span` of the model the rank holds; :mod:`distperf.cost.stage` combines them with the
rank's model states and compute. ``convention`` (``trainer``, the default, or ``paper``) and ``backend``
(``nccl`` or ``gloo``) are those of :func:`distperf.cost.predict`; :mod:`distperf.cost.collectives` defines the
algorithmic and the wire bytes of each collective.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from ..config import Layout, ModelSpec, Training
from ..hardware import Hardware
from .collectives import binomial_children, bucketed_exposed_time, collective_time, gloo_sent_bytes, sent_bytes
from .model_states import bytes_per_parameter, state_bytes

if TYPE_CHECKING:
    from .stage import Compute, ModelStates, Span

ADAM_GRADIENT_USES = 3  # torch 2.13's single-tensor Adam reads a gradient three times (lerp_, addcmul_(g, g))


class Traffic(NamedTuple):
    """Bytes a rank sends for one kind of parallelism: algorithmic and on gloo's wire, once per step and per
    microbatch. (This and the terms below are named tuples: a sweep builds them at every cache miss, and a named
    tuple of four fields is built in about 0.4 µs against a frozen dataclass's 0.7 µs.)"""

    step: float = 0.0
    microbatch: float = 0.0
    wire_step: float = 0.0
    wire_microbatch: float = 0.0


NO_TRAFFIC = Traffic()


class TensorParallelTerms(NamedTuple):
    """The tensor-parallel collectives: time of one microbatch's, of those of its backward pass, and after the
    last backward (sequence parallelism's LayerNorm gradients, read by the optimizer)."""

    time: float
    backward: float
    step_exposed: float
    traffic: Traffic
    calls: int = 0  # collectives per microbatch (each one a synchronization of the tensor-parallel ranks)
    outside: float = 0.0  # of ``time``, DTensor's path cost outside its collectives (a breakdown's framework)


class PipelineTerms(NamedTuple):
    """Activations sent to the neighbouring ranks per microbatch, and the tied embedding's all-reduce per step."""

    sends: int  # per microbatch: forward and backward per chunk, but the model's two ends
    send_time: float  # one send
    step_exposed: float  # the tied embedding's all-reduce, after the last backward
    traffic: Traffic


class DataParallelTerms(NamedTuple):
    """The data-parallel (ZeRO) collectives: bytes, and the time each leaves exposed."""

    exposed_step: float  # after the last backward: DDP's bucketed all-reduce, ZeRO-1's broadcasts, FSDP2's reduction
    exposed_microbatch: float  # FSDP2's gathers not hidden behind compute
    traffic: Traffic


NO_TENSOR_PARALLEL = TensorParallelTerms(time=0.0, backward=0.0, step_exposed=0.0, traffic=NO_TRAFFIC)
NO_PIPELINE = PipelineTerms(sends=0, send_time=0.0, step_exposed=0.0, traffic=NO_TRAFFIC)
NO_DATA_PARALLEL = DataParallelTerms(exposed_step=0.0, exposed_microbatch=0.0, traffic=NO_TRAFFIC)


def activation_message(spec: ModelSpec, lay: Layout, tr: Training, convention: str = "trainer") -> float:
    """Bytes one rank sends of one microbatch's activation (or its gradient) between pipeline stages: b·s·h, ÷t
    with sequence parallelism (the residual stream is then cut along the sequence), in fp32 for the trainer (bf16
    autocast leaves the residual stream fp32) or in the parameters' precision for the papers. The papers'
    convention also divides by t without sequence parallelism: Megatron-LM's scatter/gather optimisation
    (Narayanan et al. 2021, §4.1) has each of the t tensor-parallel ranks send its 1/t of the replicated tensor
    over its own link and all-gathers it inside the receiving node (that NVLink all-gather is not counted)."""
    value = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)[0] if convention == "paper" else 4
    split = lay.sequence_parallel or convention == "paper"
    return lay.micro_batch * spec.seq * spec.hidden * value / (lay.tp if split else 1)


@lru_cache(maxsize=4096)
def _link(hw: Hardware, kind: str, group_span: int, backend: str) -> tuple[float, float, str]:
    """(α, β, algorithms) for a collective of ``kind`` over ``group_span`` devices: the calibration's fit for this
    kind where the profile has one (:meth:`distperf.hardware.Hardware.fitted`; fitted on the ring's steps and volume, so
    timed with them), else the link's α-β and the backend's algorithms (cached: a sweep asks for the same few)."""
    fit = hw.fitted(kind, group_span) if hw.collectives else None
    return (*fit, "nccl") if fit is not None else (*hw.link(group_span), backend)


def _volume(kind: str, message: float, n: int, calls: float, element: int) -> tuple[float, float]:
    """(algorithmic, gloo wire) bytes of ``calls`` collectives of ``kind`` on ``message`` bytes over n ranks."""
    return (calls * sent_bytes(kind, message, n),
            calls * gloo_sent_bytes(kind, int(message), n, element_size=element) if calls else 0.0)


def tensor_parallel(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span,
                    convention: str = "trainer", backend: str = "nccl") -> TensorParallelTerms:
    """Megatron's collectives per layer and microbatch (Shoeybi et al. 2019, §3): two all-reduces forward and two
    backward, two more forward when full recomputation reruns the layer; with sequence parallelism (Korthikanti
    et al. 2022, §4.2.2) each all-reduce becomes an all-gather before the column-parallel layer and a
    reduce-scatter after the row-parallel one.

    The trainer's full recomputation (``torch.utils.checkpoint``, non-reentrant, which stops recomputing once the
    last tensor the layer saved is rebuilt) stops at fc2: the row-parallel reduction after it is not rerun
    unless dropout follows it and saves a mask; the one after the attention's projection is.

    The trainer (DTensor, torch 2.13) under bf16 autocast sends the forward in bf16 (the row-parallel output)
    and the backward in fp32 (the gradient of the fp32 LayerNorm output the column-parallel layer received);
    with sequence parallelism the all-gathered forward inputs are the fp32 LayerNorm outputs and the
    reduce-scattered outputs bf16, the backward the other way round; the first stage's backward all-gathers the
    embedding output's gradient and the last stage's forward the head's input (b·s·h fp32 each); and each
    LayerNorm weight and bias keeps a Partial gradient, which the optimizer's reads turn Replicate by an
    all-reduce each (h fp32 values; Adam reads a gradient three times, SGD once) after the last backward. With
    measured kernels each collective of a layer also costs DTensor's ``tp_collective_s`` + ``tp_collective_byte_s`` ·
    its message's bytes (``tp_sp_collective_s``, ``tp_sp_collective_byte_s``), of which ``tp_collective_wait_s``
    (``tp_sp_collective_wait_s``, at most the per-call cost) falls inside the collective: ``outside`` = Σ_calls
    (path + per_byte · message − wait) is the part a measured breakdown files as framework, not communication."""
    t = lay.tp
    if t == 1:
        return NO_TENSOR_PARALLEL
    n, elements = span.layers, lay.micro_batch * spec.seq * spec.hidden
    if convention == "paper":
        value = bytes_per_parameter(tr.precision, tr.optimizer, tr.momentum)[0]
        forward_value = backward_value = gather_value = value
    else:
        forward_value = 2 if tr.precision == "mixed" else 4  # the row-parallel layers' outputs
        backward_value = gather_value = 4  # gradients of, and all-gathers of, the fp32 LayerNorm outputs
    full = lay.recompute == "full"
    if convention == "paper":
        gathers = reductions = 2 * n * (2 if full else 1)
    else:  # the recomputation stops at the last saved tensor: fc2's input, or with dropout its mask
        gathers, reductions = 2 * n * (2 if full else 1), n * (2 + ((2 if spec.dropout > 0 else 1) if full else 0))
    if not lay.sequence_parallel:
        phases = ((("all-reduce", forward_value, reductions),), (("all-reduce", backward_value, 2 * n),))
    elif convention == "paper":
        phases = ((("all-gather", forward_value, gathers), ("reduce-scatter", forward_value, reductions)),
                  (("all-gather", forward_value, 2 * n), ("reduce-scatter", forward_value, 2 * n)))
    else:
        phases = ((("all-gather", gather_value, gathers), ("reduce-scatter", forward_value, reductions),
                   ("all-gather", gather_value, int(span.last))),  # the head's input
                  (("all-gather", forward_value, 2 * n), ("reduce-scatter", backward_value, 2 * n),
                   ("all-gather", gather_value, int(span.first))))  # the embedding output's gradient
    path = per_byte = wait = 0.0  # DTensor's cost per collective of a layer, per byte of its message, and inside it
    if hw.kernels is not None:
        k = hw.kernels
        path, per_byte, wait = ((k.tp_sp_collective_s, k.tp_sp_collective_byte_s, k.tp_sp_collective_wait_s)
                                if lay.sequence_parallel else
                                (k.tp_collective_s, k.tp_collective_byte_s, k.tp_collective_wait_s))
    times, algorithmic, wire, count, message_bytes = [], 0.0, 0.0, 0, 0.0
    for phase in phases:
        seconds = 0.0
        for kind, value, calls in phase:
            if calls:
                count += calls
                message = elements * value
                message_bytes += calls * message
                seconds += calls * (collective_time(kind, message, t, *_link(hw, kind, t, backend)) + path
                                    + per_byte * message)
                a, w = _volume(kind, elements * value, t, calls, value)
                algorithmic, wire = algorithmic + a, wire + w
        times.append(seconds)
    step = wire_step = step_exposed = 0.0
    if lay.sequence_parallel and convention != "paper":
        uses = ADAM_GRADIENT_USES if tr.optimizer == "adam" else 1
        norms = uses * (2 * n + (1 if span.last else 0)) * 2  # weight and bias of each LayerNorm
        step, wire_step = _volume("all-reduce", spec.hidden * 4, t, norms, 4)
        step_exposed = norms * collective_time("all-reduce", spec.hidden * 4, t, *_link(hw, "all-reduce", t, backend))
    return TensorParallelTerms(time=times[0] + times[1], backward=times[1], step_exposed=step_exposed,
                               traffic=Traffic(step=step, microbatch=algorithmic, wire_step=wire_step,
                                               wire_microbatch=wire), calls=count,
                               outside=count * (path - min(max(wait, 0.0), path)) + per_byte * message_bytes)


def pipeline(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span, convention: str = "trainer",
             backend: str = "nccl") -> PipelineTerms:
    """Every chunk sends its activation forward and its gradient backward (:func:`activation_message`), but the
    model's two ends; with tied embeddings the first and last rank all-reduce the embedding's gradient (V·h;
    under FSDP2 the rank's shard, ⌈V/n⌉·h) once per step."""
    p, t, dp = lay.pp, lay.tp, lay.dp
    if p == 1:
        return NO_PIPELINE
    message = activation_message(spec, lay, tr, convention)
    group = t * dp * p
    sends = 2 * lay.chunks - span.first - span.last
    send_time = collective_time("send", message, 2, *_link(hw, "send", group, backend))
    step = wire_step = step_exposed = 0.0
    if spec.tied and (span.first or span.last):
        rows = spec.vocab
        if lay.zero >= 2 and dp > 1 and convention != "paper":  # FSDP2: each rank all-reduces its shard
            rows = -(-rows // dp)
        gradient = rows * spec.hidden * state_bytes(tr, convention)[1]
        step, wire_step = _volume("all-reduce", gradient, 2, 1, 4)
        step_exposed = collective_time("all-reduce", gradient, 2, *_link(hw, "all-reduce", group, backend))
    return PipelineTerms(sends=sends, send_time=send_time, step_exposed=step_exposed,
                         traffic=Traffic(step=step, microbatch=sends * message, wire_step=wire_step,
                                         wire_microbatch=sends * message))


def data_parallel_traffic(lay: Layout, tr: Training, states: ModelStates, convention: str = "trainer") -> Traffic:
    """Bytes of the data-parallel (ZeRO) collectives, algorithmic and on gloo's wire, per step and per microbatch:

    - ZeRO 0: one all-reduce of the gradients per step (DDP);
    - ZeRO 1, as the trainer runs it: DDP's all-reduce, then ZeroRedundancyOptimizer's broadcast of every
      parameter from the rank that owns it (each rank is the root of its partition: algorithmically it sends its
      partition; on gloo's binomial tree ⌈log₂ n⌉ times that, plus what it forwards for the other roots); the
      ZeRO paper's (``paper``): a reduce-scatter of the gradients and an all-gather of the parameters;
    - ZeRO 2/3 (FSDP2), per unit: an all-gather of its parameters, n × its padded shard, for every forward
      (ZeRO-3: and every backward) of every microbatch; one reduce-scatter of its gradient per step, after the
      last microbatch. Under ``torch.distributed.pipelining`` ZeRO-2 units stay gathered from their first
      forward to the step's end: one all-gather per step; ZeRO-3's all-gathers there follow the schedule's
      order of forwards and backwards and are counted as without pipelining (not checked against a run).
      The paper's ZeRO 2/3 reduce-scatter every microbatch.
    """
    dp, zero = lay.dp, lay.zero
    if dp == 1:
        return NO_TRAFFIC
    pb, gb, _ = state_bytes(tr, convention)
    params = states.parameters
    grads = params * gb
    step = microbatch = wire_step = wire_microbatch = 0.0
    if zero == 0 or (zero == 1 and convention != "paper"):
        step, wire_step = _volume("all-reduce", grads, dp, 1, gb)
        if zero == 1:
            step += max(states.partition) * pb
            wire_step += binomial_sends(states.partition) * pb
    elif zero == 1:
        step = sent_bytes("reduce-scatter", grads, dp) + sent_bytes("all-gather", params * pb, dp)
        wire_step = gloo_sent_bytes("reduce-scatter", int(grads), dp, element_size=gb) + \
            gloo_sent_bytes("all-gather", int(params * pb), dp)
    else:
        gathers = 1 if zero == 2 else 2
        gathered, units = dp * states.owned, states.units  # every unit's all-gather output, padding included
        if convention == "paper":  # the papers' Ψ, unpadded
            gathered, units = params, ((1, params / dp),)
        gather_step, gather_wire = _volume("all-gather", gathered * pb, dp, 1, pb)
        reduce = reduce_wire = 0.0
        for count, shard in units:
            a, w = _volume("reduce-scatter", dp * shard * gb, dp, count, gb)
            reduce, reduce_wire = reduce + a, reduce_wire + w
        if convention == "paper":
            microbatch, wire_microbatch = gathers * gather_step + reduce, gathers * gather_wire + reduce_wire
        elif lay.pp > 1 and zero == 2:
            step, wire_step = gather_step + reduce, gather_wire + reduce_wire
        else:
            microbatch, wire_microbatch, step, wire_step = gathers * gather_step, gathers * gather_wire, reduce, \
                reduce_wire
    return Traffic(step=step, microbatch=microbatch, wire_step=wire_step, wire_microbatch=wire_microbatch)


def data_parallel(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, states: ModelStates, work: Compute,
                  bucket_bytes: float, convention: str = "trainer", backend: str = "nccl",
                  traffic: Traffic | None = None) -> DataParallelTerms:
    """The data-parallel collectives' bytes (:func:`data_parallel_traffic`) and the time they leave exposed:
    DDP's all-reduce bucketed behind the last backward (and ZeRO-1's broadcasts after the optimizer step, or the
    paper's all-gather); FSDP2's gathers, unit by unit, where the microbatch's compute does not hide them and its
    reduce-scatters, unit by unit, behind the last backward (the paper's: one gather of the whole model, and the
    reduction behind every backward). PipeDream
    updates after every microbatch, so its reduction is per microbatch. With measured kernels, what compute hides
    is only the profile's ``overlap`` share of what it could hide (:mod:`distperf.cost.kernels`)."""
    dp, zero = lay.dp, lay.zero
    if dp == 1:
        return NO_DATA_PARALLEL
    traffic = data_parallel_traffic(lay, tr, states, convention) if traffic is None else traffic
    pb, gb, _ = state_bytes(tr, convention)
    params, group = states.parameters, lay.tp * dp
    grads = params * gb
    exposed_step = exposed_microbatch = 0.0
    overlap = hw.kernels.overlap if hw.kernels is not None else 1.0
    if zero == 0 or (zero == 1 and convention != "paper"):
        exposed_step = _bucketed(hw, grads, bucket_bytes, work.backward, "all-reduce", dp, group, backend, overlap)
        if zero == 1:
            exposed_step += _broadcasts_time(states, dp, pb, hw.link(group), backend)
    elif zero == 1:
        exposed_step = (_bucketed(hw, grads, bucket_bytes, work.backward, "reduce-scatter", dp, group, backend, overlap)
                        + collective_time("all-gather", params * pb, dp, *_link(hw, "all-gather", group, backend)))
    else:
        gathered = params if convention == "paper" else dp * states.owned
        link = _link(hw, "all-gather", group, backend)
        if convention == "paper":  # one gather of the whole model
            gather = collective_time("all-gather", gathered * pb, dp, *link)
        else:  # FSDP2 gathers unit by unit: each call pays its latency
            gather = unit_gathers(states.units, dp, pb, *link)
        layer = max([shard for count, shard in states.units if count], default=0)
        overlap = hw.kernels.fsdp_overlap if hw.kernels is not None else 1.0  # FSDP2's own path
        reduction = _bucketed(hw, gathered * gb, dp * layer * gb, work.backward, "reduce-scatter", dp, group, backend,
                              overlap)
        exposed_microbatch = shown(gather, min(gather, work.forward), overlap) + (
            shown(gather, min(gather, work.backward), overlap) if zero == 3 else 0)
        if convention == "paper":
            exposed_microbatch += reduction
        else:
            exposed_step = reduction
    if lay.schedule == "pipedream":
        traffic = Traffic(step=0.0, microbatch=traffic.microbatch + traffic.step, wire_step=0.0,
                          wire_microbatch=traffic.wire_microbatch + traffic.wire_step)
        exposed_microbatch, exposed_step = exposed_microbatch + exposed_step, 0.0
    return DataParallelTerms(exposed_step=exposed_step, exposed_microbatch=exposed_microbatch, traffic=traffic)


@lru_cache(maxsize=4096)
def unit_gathers(units: tuple, dp: int, pb: int, latency: float, bandwidth: float, algorithms: str) -> float:
    """FSDP2's all-gathers of one microbatch's forward, unit by unit (each call pays its latency): Σ count ·
    all-gather(dp · shard · pb) over the (count, shard elements) ``units`` (cached: a sweep's micro-batches and
    recomputation modes leave them alike)."""
    return sum(count * collective_time("all-gather", dp * shard * pb, dp, latency, bandwidth, algorithms)
               for count, shard in units if count)


def _bucketed(hw: Hardware, total: float, bucket: float, compute: float, kind: str, dp: int, group: int, backend: str,
              overlap: float) -> float:
    """Exposed time of ``kind`` reduced in buckets behind ``compute`` (:func:`bucketed_exposed_time`), hiding only the
    share ``overlap`` of what perfect overlap hides: serial − overlap · (serial − perfect) (:func:`shown`). With no
    share (overlap ≤ 0) that is serial or serial · (1 − overlap), and perfect overlap is not priced."""
    if not hw.collectives and overlap >= 1.0:
        return bucketed_exposed_time(total, bucket, compute, kind, dp, *hw.link(group), backend=backend)
    *link, algorithms = _link(hw, kind, group, backend)
    if overlap >= 1.0:
        return bucketed_exposed_time(total, bucket, compute, kind, dp, *link, backend=algorithms)
    serial = _serial(total, bucket, kind, dp, *link, algorithms)
    if overlap <= 0:  # serial − 0 · hideable is serial; below 0, shown reads serial alone
        return shown(serial, 0.0, overlap)
    perfect = bucketed_exposed_time(total, bucket, compute, kind, dp, *link, backend=algorithms)
    return shown(serial, serial - perfect, overlap)


@lru_cache(maxsize=4096)
def _serial(total: float, bucket: float, kind: str, dp: int, latency: float, bandwidth: float,
            algorithms: str) -> float:
    """:func:`bucketed_exposed_time` with no compute to hide behind: the buckets one after another (cached: it does not
    depend on the microbatch's compute, which a sweep's micro-batches and recomputation modes change)."""
    return bucketed_exposed_time(total, bucket, 0.0, kind, dp, latency, bandwidth, backend=algorithms)


def clear_cache() -> None:
    """Empty this module's caches of a collective's α-β terms and of the buckets' serial time (a benchmark's cold
    pass: :func:`distperf.cost.predict.clear_caches`)."""
    _link.cache_clear()
    _serial.cache_clear()


def shown(serial: float, hideable: float, overlap: float) -> float:
    """Exposed seconds of communication that takes ``serial`` alone, of which perfect overlap hides ``hideable``:
    serial − overlap · hideable for overlap in [0, 1]; for a negative overlap (a path that costs more than its
    collectives' α-β time, :mod:`distperf.cost.kernels`) serial · (1 − overlap), hiding nothing."""
    return serial - overlap * hideable if overlap >= 0 else serial * (1 - overlap)


def _broadcasts_time(states: ModelStates, dp: int, pb: int, link, backend: str) -> float:
    """ZeroRedundancyOptimizer's broadcasts after the step, one per parameter tensor: their latencies in turn,
    and the bytes of the rank that sends most over the bandwidth."""
    latency, bandwidth = link
    tensors, loads = states.tensors, states.partition
    if backend == "gloo":
        return tensors * (dp - 1).bit_length() * latency + binomial_sends(loads) * pb / bandwidth
    return tensors * (dp - 1) * latency + sum(loads) * pb / bandwidth


@lru_cache(maxsize=4096)
def binomial_sends(loads: tuple[int, ...]) -> int:
    """The most any of n ranks sends when each rank r broadcasts ``loads[r]`` elements over gloo's binomial tree:
    rank r forwards every root's load once per child it has in that root's tree."""
    n = len(loads)
    children = [binomial_children(v, n) for v in range(n)]  # by distance from the root
    return max(sum(load * children[(r - root) % n] for root, load in enumerate(loads)) for r in range(n))


