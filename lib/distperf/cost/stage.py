"""The costs of one pipeline rank, in named pieces: model states and compute here, the tensor-parallel, pipeline
and data-parallel terms in :mod:`distperf.cost.communication`.

Each piece takes the configuration's frozen parts whole (:class:`~distperf.config.ModelSpec`,
:class:`~distperf.config.Layout`, :class:`~distperf.config.Training`, :class:`~distperf.hardware.Hardware`) and
the :class:`Span` of the model that the rank holds, and returns a small frozen dataclass. :func:`stage_costs`
combines them into the :class:`StageCosts` that :func:`distperf.cost.predict` places in the schedule; it is
cached on what a rank's costs depend on (not the number of microbatches, nor the schedule but for PipeDream's
update per microbatch), so that a sweep over microbatches and schedules reuses it.

Two conventions (``convention``): ``trainer`` (the default) counts what this repository's trainers run under
torch 2.13; ``paper`` counts as the papers do. Where they differ:

| term | trainer | paper |
|---|---|---|
| bytes per parameter, mixed precision | 4 + 4 + moments: bf16 autocast over fp32 weights | 2 + 2 + 12 (ZeRO §3.1) |
| ZeRO-1 | DDP's all-reduce, then ZeroRedundancyOptimizer broadcasts each parameter from its owner | reduce-scatter + all-gather (ZeRO §7) |
| ZeRO-2/3 in a step | FSDP2: see :func:`model_states` | one unit's parameters (ZeRO-3) and gradient unsharded |
| tensor-parallel messages, mixed | forward bf16, backward fp32 (the LayerNorm output's gradient) | 16-bit |
| sequence parallelism | DTensor's all-gathers and reduce-scatters, the LayerNorm gradients' all-reduces | 4 all-reduces' volume per layer |
| pipeline message, mixed | fp32: the residual stream stays fp32 under autocast | 16-bit |

Bytes come two ways (:mod:`distperf.cost.collectives`): *algorithmic*, the ring volumes the papers quote (a
broadcast counted at its root), and *wire*, what gloo's algorithms send (a reduce-scatter is an all-reduce, a
broadcast a binomial tree). Time uses the ``backend``'s algorithms (``nccl``: the ring; ``gloo``: gloo's).

Time of one microbatch on the rank (per tensor- and data-parallel rank):

    t_r = compute + tensor-parallel collectives (not overlapped) + pipeline sends (not overlapped)
        + ZeRO-2/3 gathers not hidden behind the microbatch's compute,

the book's chapter "The analytical framework" derives each term.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from ..config import TWOBW_ENGINE, Layout, ModelSpec, Training
from ..hardware import Hardware
from . import activations as act
from . import flops as fl
from . import kernels as kn
from . import parameters as par
from .collectives import ddp_bucket_count
from .communication import Traffic, data_parallel, data_parallel_traffic, pipeline, tensor_parallel
from .model_states import fsdp_shard_elements, greedy_partition_max, state_bytes, zero_partition_loads


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

    span: Span
    parameters: int  # elements on one tensor-parallel rank, before ZeRO
    owned: int  # elements whose optimizer state (ZeRO ≥ 1), gradient (≥ 2) and weights (3) the rank keeps
    units: tuple  # ZeRO-2/3: (count, elements each rank holds of one unit) of the FSDP units; else ()
    weights: float  # one weight version as kept between steps (sharded with ZeRO-2/3)
    gathered: float  # ZeRO-2/3: parameters unsharded at the parameters' peak in a step
    gradients: float  # at their peak in a step of several microbatches
    gradients_single: float  # at their peak in a step of one microbatch (FSDP2 reduces each layer as it goes)
    optimizer_states: float
    at_rest: tuple  # (parameters, gradients, optimizer states) kept between steps, one weight version
    partition: tuple  # ZeRO-1: elements of each rank's ZeroRedundancyOptimizer partition, by rank; else ()
    tensors: int  # parameter tensors the rank holds

    def peak(self, microbatches: int) -> tuple[float, float, float]:
        """(parameters, gradients, optimizer states) at their peak in a step of ``microbatches``, one weight
        version."""
        grads = self.gradients if microbatches > 1 else self.gradients_single
        return self.weights + self.gathered, grads, self.optimizer_states


@dataclass(frozen=True, slots=True)
class Compute:
    """Seconds of one microbatch's forward and backward (recomputation included) on the rank."""

    forward: float
    backward: float


@dataclass(slots=True, eq=False)
class StageCosts:
    """A pipeline rank's costs apart from its place in the schedule and the number of microbatches. (Not frozen, and
    compared by identity: a sweep builds one at every cache miss, and a frozen dataclass's ``__init__``, which sets
    each of the 15 fields through ``object.__setattr__``, takes about 1.7 µs against 0.45 µs. Nothing changes one once
    built.)"""

    states: ModelStates
    microbatch: float  # t_r: compute + communication on the critical path
    compute: float  # of one microbatch
    exposed: float  # communication on the critical path, one microbatch
    drain: float  # one backward and its send: how much this rank delays the flush behind it
    step_exposed: float  # communication after the last backward (data parallel, tied embeddings)
    optimizer: float  # one optimizer step
    accumulate: float  # adding one microbatch's gradients to the accumulated ones (measured kernels; else 0)
    step_compute: float  # work once per step outside the microbatches and the optimizer (FSDP2's reduction copies)
    segment: float  # compute between two tensor-parallel collectives (0 without tensor parallelism)
    data_parallel: Traffic
    tensor_parallel: Traffic
    pipeline_parallel: Traffic
    step_bytes: tuple  # (algorithmic data, tensor, pipeline parallel, then the same on gloo's wire) per step
    microbatch_bytes: tuple  # the same per microbatch


def model_states(spec: ModelSpec, lay: Layout, tr: Training, span: Span, convention: str = "trainer") -> ModelStates:
    """Bytes per parameter (:func:`state_bytes`) over the rank's parameters (:mod:`distperf.cost.parameters`),
    sharded over the dp replicas as the trainer's ZeRO stage does: ZeroRedundancyOptimizer deals whole tensors
    (:func:`greedy_partition_max`), FSDP2 cuts every tensor along dim 0 (:func:`fsdp_shard_elements`) into
    units, one per layer and a root unit of the rest (the embeddings, the final LayerNorm and the head).

    Inside a step FSDP2 (``fully_shard``, torch 2.13) holds, beyond the shards:

    - parameters: ZeRO-3 the root unit, gathered in its forward around all the layers', and one layer's; ZeRO-2
      every unit (each stays gathered from its forward to its backward). A gathered unit holds n × its padded
      shard, the all-gather's output;
    - gradients: without gradient synchronization (every microbatch but the last) each unit's gradient stays
      unsharded and accumulates, so with m > 1 every unsharded gradient is alive when the last backward starts,
      Ψ·g; with m = 1 each layer's is reduce-scattered after its backward, while the root's, whose backward
      ends with the embedding, stays unsharded: (L − 1) layer shards + one layer + the final LayerNorm's (and
      an untied head's) gradient, or at the end L shards + the whole root, whichever is larger. Under
      ``torch.distributed.pipelining`` the stages reduce-scatter only after the last microbatch
      (``backward_maybe_with_nosync``, ``perform_reduce_grad``) and keep their units gathered after backward:
      every unit's gradient and parameters unsharded. (Measured at one point: the parameters agree; the last
      stage's gradients peak higher by the root unit's shard, whose reduce-scatter output is allocated before the
      head's unsharded gradient is freed; not modelled.) PipeDream-2BW drops each gradient once it is applied:
      :func:`distperf.cost.predict` keeps none at rest.

    ``paper``: one unit's unsharded gradient (and, ZeRO-3, parameters) at a time, the largest."""
    h, t, dp, zero = spec.hidden, lay.tp, lay.dp, lay.zero
    pb, gb, ob = state_bytes(tr, convention)
    p_layer = par.layer_parameters_per_tp_rank(h, spec.ffn, t)
    p_embed = par.embedding_parameters(h, spec.vocab, spec.seq)
    p_head = par.head_parameters(h, spec.vocab, spec.tied, lay.pp)
    p_root = (p_embed if span.first else 0) + (p_head if span.last else 0)
    params = span.layers * p_layer + p_root
    owned, units, partition = params, (), ()
    gathered = 0.0
    peak_grads = params
    tensors = _rank_tensors(spec, t, span, p_head > 2 * h)
    if zero and dp > 1:
        owned = greedy_partition_max(tensors, dp) if zero == 1 else fsdp_shard_elements(tensors, dp)
        if zero == 1:
            partition = zero_partition_loads(tensors, dp)
    if zero >= 2 and dp > 1:
        layer = fsdp_shard_elements(tuple((1, d0, numel) for d0, numel in par.layer_tensors(h, spec.ffn, t)), dp)
        root = owned - span.layers * layer
        units = ((span.layers, layer), (1, root)) if root else ((span.layers, layer),)
        if convention == "paper":
            transient = max(p_layer if span.layers else 0, p_embed if span.first else 0, p_head if span.last else 0)
            gathered = transient * pb if zero == 3 else 0.0
            peak_grads = owned + transient
        elif lay.pp > 1 or zero == 2:
            gathered, peak_grads = dp * owned * pb, params
        else:
            gathered = dp * (root + (layer if span.layers else 0)) * pb
            peak_grads = params
    single_grads = peak_grads
    if zero >= 2 and dp > 1 and convention != "paper" and lay.pp == 1:
        early = (2 * h + (spec.vocab * h if p_head > 2 * h else 0)) if span.last else 0
        single_grads = max((span.layers - 1) * layer + p_layer + early, span.layers * layer + p_root)
    sharded = owned if zero >= 2 and dp > 1 else params  # FSDP2 shards parameters and gradients at rest
    weights = sharded * pb if convention != "paper" else (owned if zero == 3 and dp > 1 else params) * pb
    optimizer_states = (owned if zero >= 1 else params) * ob
    return ModelStates(span=span, parameters=params, owned=owned, units=units, weights=weights, gathered=gathered,
                       gradients=peak_grads * gb, gradients_single=single_grads * gb,
                       optimizer_states=optimizer_states, at_rest=(sharded * pb, sharded * gb, optimizer_states),
                       partition=partition, tensors=sum(count for count, _, _ in tensors))


def compute(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span,
            times: tuple | None = None, vocab_parallel: bool = False) -> Compute:
    """Forward FLOPs over the achieved rate; the backward twice the forward plus what recomputation repeats
    (:mod:`distperf.cost.flops`). The head is replicated, as in this book's trainers: every tensor-parallel rank
    computes it; with ``vocab_parallel`` (the papers' convention) it is split over the t ranks by vocabulary, as
    Megatron-LM's parallel output layer is (Shoeybi et al. 2019, §3), so a rank computes 2bshV/t of it.

    With profiled ``times`` (((f, b) layer, (f, b) embedding, (f, b) head) seconds of one microbatch on one
    device), as profiling-based predictors do: L/t·(f + b + recomputed share·f) + the ends' f + b, the
    recomputed share being the FLOP ratio recompute_forward_flops / layer_forward_flops; with measured kernels in the
    profile, times ``contention_compute`` (a what-if's ``contention_layer`` where set) when ranks share the machine,
    plus the parallel wrappers' (:func:`wrapper_time`) — the profiled times come from one process running a plain
    layer.
    Times a run's ranks measured at once on their own shapes (a longer tuple,
    :func:`distperf.cost.predict.profiled_times`) take neither the 1/t nor the contention factor.

    With the hardware's measured ``kernels`` (and no profiled times): the kernels one microbatch launches on the
    rank, each at its measured time (:func:`kernel_classes`), contended when several ranks share the machine.

    Over FLOPs, a hardware with ``memory_passes`` adds its layers' memory-bound operators: memory_passes ×
    :func:`distperf.cost.activations.layer_traffic_bytes` / memory_bandwidth, forward and backward."""
    b, s, h, ffn, t, rc = lay.micro_batch, spec.seq, spec.hidden, spec.ffn, lay.tp, lay.recompute
    if times is None and hw.kernels is not None:
        classes = kernel_classes(spec, lay, tr, hw.kernels, span)
        return Compute(forward=sum(f for f, _ in classes.values()), backward=sum(b for _, b in classes.values()))
    if times is not None:
        (layer_f, layer_b), (embed_f, embed_b), (head_f, head_b) = times[:3]
        at_once = len(times) > 3  # the rank's own shapes, measured with every rank running (measure.parts)
        share = 1 if at_once else t
        recomputed = fl.recompute_forward_flops(b, s, h, ffn, rc) / fl.layer_forward_flops(b, s, h, ffn)
        forward = span.layers * layer_f / share + (embed_f if span.first else 0.0) + (head_f if span.last else 0.0)
        backward = (span.layers * (layer_b + recomputed * layer_f) / share + (embed_b if span.first else 0.0)
                    + (head_b if span.last else 0.0))
        if hw.kernels is not None:  # add the parallel wrappers, and contention to one process's times
            factor = (hw.kernels.contention_layer or hw.kernels.contention_compute) \
                if lay.world_size > 1 and not at_once else 1.0
            wrapped = wrapper_time(hw.kernels, lay, span)
            forward, backward = forward * factor + wrapped / 3, backward * factor + 2 * wrapped / 3
        return Compute(forward=forward, backward=backward)
    rate = hw.flops(tr.precision)
    forward = span.layers * fl.layer_forward_flops(b, s, h, ffn) / t + \
        (fl.head_forward_flops(b, s, h, spec.vocab) / (t if vocab_parallel else 1) if span.last else 0)
    backward = 2 * forward + span.layers * fl.recompute_forward_flops(b, s, h, ffn, rc) / t
    if not hw.memory_passes or not span.layers:
        return Compute(forward=forward / rate, backward=backward / rate)
    moved = act.layer_traffic_bytes(s, b, h, spec.heads, t, lay.sequence_parallel, spec.dropout > 0,
                                    2 if tr.precision == "mixed" else 4, rc, spec.attention, ffn)
    per_byte = hw.memory_passes * span.layers / hw.memory_bandwidth
    return Compute(forward=forward / rate + moved[0] * per_byte, backward=backward / rate + moved[1] * per_byte)


def kernel_classes(spec: ModelSpec, lay: Layout, tr: Training, costs: kn.KernelCosts, span: Span) -> dict:
    """{class: (forward, backward)} seconds of one microbatch on the rank, from measured kernel times
    (:mod:`distperf.cost.kernels`): its layers, its ends, and one backward pass's start."""
    mixed, dropout = tr.precision == "mixed", spec.dropout > 0
    layer = layer_kernels(spec, lay, tr, costs, lay.recompute)
    ends = kn.ends(costs, lay.micro_batch, spec.seq, spec.hidden, spec.vocab, span.first, span.last, dropout, mixed)
    out = {c: (span.layers * layer[c][0] + ends[c][0], span.layers * layer[c][1] + ends[c][1]) for c in kn.CLASSES}
    if lay.world_size > 1:  # the ranks of the machine compute at once
        for c, factor in layer_contention(costs).items():
            out[c] = (out[c][0] * factor, out[c][1] * factor)
    wrapped = wrapper_time(costs, lay, span)  # split 1 : 2 as the work they wrap
    f, b = out["framework"]
    out["framework"] = (f + wrapped / 3, b + 2 * wrapped / 3 + costs.backward_call_s)
    return out


def layer_contention(costs: kn.KernelCosts) -> dict:
    """{class: factor} of a layer's kernel classes when the machine's ranks compute at once: ``contention_compute``
    for matrix products and attention and ``contention_memory`` for the other operators (the book's chapter "Where
    the time goes", section "The kernel time model"); or the layer probe's ``contention_layer`` for all three where a
    what-if sets it (a profile never does: its rule failed, section "The machine's speed")."""
    if costs.contention_layer:
        return dict.fromkeys(("matrix_products", "attention", "other_operators"), costs.contention_layer)
    return {"matrix_products": costs.contention_compute, "attention": costs.contention_compute,
            "other_operators": costs.contention_memory}


def layer_kernels(spec: ModelSpec, lay: Layout, tr: Training, costs: kn.KernelCosts, recompute: str) -> dict:
    """{class: (forward, backward)} seconds of one layer on a rank of ``lay`` alone, with ``recompute``
    (:func:`distperf.cost.kernels.layer`: no contention, no parallel wrapper)."""
    dropout = spec.dropout > 0
    return kn.layer(costs, lay.micro_batch, spec.seq, spec.hidden, spec.heads, spec.ffn, lay.tp, lay.sequence_parallel,
                    spec.arch == "gpt", spec.attention == "sdpa" and not dropout, dropout, recompute,
                    tr.precision == "mixed")


def wrapper_time(costs: kn.KernelCosts, lay: Layout, span: Span) -> float:
    """Forward + backward seconds the parallel wrappers add to one microbatch on the rank: DTensor's per
    tensor-parallel layer, FSDP2's per unit (a unit per layer and the root), the pipeline engine's per action (a
    forward and a backward on each of the rank's stages: 2·v with v chunks, each chunk a stage of its own in torch's
    ``ScheduleInterleaved1F1B``), and recomputation's checkpoint per recomputed layer or attention core beyond the
    kernels it repeats (:func:`recompute_wrapper`)."""
    wrapped = 0.0
    if lay.pp > 1:
        wrapped += 2 * lay.chunks * (costs.twobw_action_s if lay.schedule in TWOBW_ENGINE else costs.pp_action_s)
    if lay.tp > 1:
        wrapped += span.layers * (costs.tp_sp_layer_s if lay.sequence_parallel else costs.tp_layer_s)
    if lay.recompute != "none":
        wrapped += span.layers * recompute_wrapper(costs, lay)
    if lay.zero >= 2 and lay.dp > 1:
        wrapped += (span.layers + 1) * costs.fsdp_unit_s
    return wrapped


def action_inside(costs: kn.KernelCosts | None, lay: Layout) -> float:
    """Seconds per microbatch of the pipeline engine's action cost (:func:`wrapper_time`) that the rank spends inside
    communication: 2·v·min(wait, action) with the schedule's wait in the table ``action_waits`` (fitted on the tiny
    preset's runs, :mod:`distperf.analysis.pipeline_waits`), else the engine's ``pp_action_wait_s`` or
    ``twobw_action_wait_s``. The
    model prices the whole action as framework (the step's time does not depend on the split); a measured breakdown
    files this part as communication (the engine's sends, receives and waits on them). 0 without a pipeline. The
    book files this part as communication (:data:`distperf.analysis.time_model.PIPELINE_SPLIT`: its rule failed on
    the builds at 70f88ea and de85c17 with the probe's part, and stood on 21e68cf with the fitted table)."""
    if costs is None or lay.pp == 1:
        return 0.0
    twobw = lay.schedule in TWOBW_ENGINE
    action, wait = ((costs.twobw_action_s, costs.twobw_action_wait_s) if twobw
                    else (costs.pp_action_s, costs.pp_action_wait_s))
    wait = dict(costs.action_waits).get(lay.schedule, wait)
    return 2 * lay.chunks * min(max(wait, 0.0), action)


def recompute_wrapper(costs: kn.KernelCosts, lay: Layout) -> float:
    """Seconds ``torch.utils.checkpoint`` adds to one layer's forward + backward beyond the kernels of the forward it
    repeats (the whole layer under full recomputation, the attention core under selective): the hooks that pack and
    unpack each saved tensor, the recomputation's bookkeeping and, for a tensor- or sequence-parallel layer, DTensor's
    dispatch of the repeated forward; measured on a one-rank group (:func:`distperf.measure.kernels.wrapper_times`;
    the chapter "Where the time goes" lists the values)."""
    prefix = ("tp_sp_" if lay.sequence_parallel else "tp_") if lay.tp > 1 else ""
    return getattr(costs, f"{prefix}recompute_{'layer' if lay.recompute == 'full' else 'core'}_s")


def ddp_time(costs: kn.KernelCosts, lay: Layout, tensors: tuple, grad_bytes: int) -> float:
    """What DDP adds to a step (ZeRO 0/1 with data parallelism; else 0), beyond its collectives:
    t = ddp_step_s + ddp_tensor_s · max(T − T_probe, 0) + ddp_byte_s · G, with T the rank's parameter tensors
    (``tensors``: (count, dim 0, elements), :func:`_rank_tensors`), T_probe = ``DDP_PROBE_TENSORS`` (the Block that
    measured ``ddp_step_s``) and G the bytes of its gradients (``grad_bytes`` per element): one autograd hook and one
    copy into its bucket per tensor, and per byte that copy, the division by the group's size and the copy back out
    (:func:`distperf.measure.kernels.ddp_slopes`; chapter "Where the time goes", section "The kernel time model")."""
    if lay.dp == 1 or lay.zero >= 2:
        return 0.0
    count = sum(c for c, _, _ in tensors)
    elements = sum(c * numel for c, _, numel in tensors)
    return (costs.ddp_step_s + costs.ddp_tensor_s * max(count - kn.DDP_PROBE_TENSORS, 0)
            + costs.ddp_byte_s * elements * grad_bytes)


def wrapper_step(costs: kn.KernelCosts, lay: Layout, span: Span, tensors: tuple, grad_bytes: int = 4) -> float:
    """What the parallel wrappers add to a step outside the microbatches: DDP's (ZeRO 0/1, :func:`ddp_time`), and
    Adam's extra per DTensor parameter — every tensor under FSDP2, the linear layers' 8 per layer under tensor
    parallelism (their LayerNorms' 4 too, and the final LayerNorm's 2, with sequence parallelism)."""
    extra = ddp_time(costs, lay, tensors, grad_bytes)
    if lay.zero >= 2 and lay.dp > 1:
        dtensors = sum(count for count, _, _ in tensors)
    elif lay.tp > 1:
        dtensors = span.layers * (12 if lay.sequence_parallel else 8) + (2 if lay.sequence_parallel and span.last
                                                                           else 0)
    else:
        dtensors = 0
    return extra + dtensors * costs.adam_dtensor_tensor_s


def optimizer_time(hw: Hardware, states: ModelStates, state_bytes_per_parameter: tuple[int, int, int],
                   tensors: tuple = (), dp: int = 1, wrappers: float = 0.0, contended: bool = False) -> float:
    """One optimizer step. With measured kernels (:func:`distperf.cost.kernels.adam_step`): Adam's loop over the
    ``tensors`` ((count, dim 0, elements), …) the rank updates — ZeRO-1 a share owned/parameters of them, ZeRO-2/3
    each cut in dp shards — plus the step's fixed Python and the parallel ``wrappers``' per-step cost
    (:func:`wrapper_step`); ``contended``: several ranks share the machine's memory bandwidth. Otherwise
    memory-bound: it reads the gradient and both moments and writes the moments and the parameters of the elements
    it owns, (g + 2·o + 2·p) bytes each, over the memory bandwidth."""
    costs = hw.kernels
    if costs is None:
        pb, gb, ob = state_bytes_per_parameter
        return states.owned * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth
    if costs.adam and tensors:
        if states.units:  # FSDP2: every tensor cut along dim 0 into dp shards
            owned = tuple((count, -(-numel // dp)) for count, _, numel in tensors)
        else:
            share = states.owned / states.parameters if states.parameters else 1.0
            owned = tuple((count * share, numel) for count, _, numel in tensors)
        loop = kn.adam_step(costs, owned)
        if contended:  # the per-element part shares the memory bandwidth; each tensor's fixed cost does not
            fixed = kn.adam_step(costs, tuple((count, 1) for count, _ in owned))
            loop = fixed + (loop - fixed) * costs.contention_memory
        return loop + costs.step_s + wrappers
    pb, gb, ob = state_bytes_per_parameter
    return states.owned * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth + costs.step_s + wrappers


def _combine(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span, bucket_bytes: float,
             times: tuple | None, convention: str, backend: str) -> StageCosts:
    zero, training = _zero(lay), _fields(tr)
    key = (spec, training, lay.dp, lay.tp, lay.pp, zero, span, convention)  # all the model states depend on
    found = _STATES.get(key)
    if found is None:
        if len(_STATES) >= _CACHE_SIZE:
            _STATES.clear()
            _TERMS.clear()
        states = model_states(spec, lay, tr, span, convention)
        found = _STATES[key] = (states, data_parallel_traffic(lay, tr, states, convention))
    states, traffic = found
    # compute reads the micro-batch, tensor parallelism and recomputation and, with measured kernels, whether ranks
    # share the machine and which parallel wrappers run (:func:`wrapper_time`)
    wrappers = (lay.world_size > 1, lay.chunks if lay.pp > 1 else 0, lay.schedule in TWOBW_ENGINE, zero >= 2) \
        if hw.kernels is not None else ()
    key = ("compute", spec, tr.precision, hw, lay.micro_batch, lay.tp, lay.sequence_parallel, lay.recompute, span,
           times, convention == "paper", wrappers)
    work = _TERMS.get(key)
    if work is None:
        work = _TERMS[key] = compute(spec, lay, tr, hw, span, times, vocab_parallel=convention == "paper")
    key = (spec, training, hw, lay.tp, lay.micro_batch, lay.sequence_parallel, lay.recompute, span, convention,
           backend)
    tp = _TERMS.get(key)
    if tp is None:
        tp = _TERMS[key] = tensor_parallel(spec, lay, tr, hw, span, convention, backend)
    key = (spec, training, hw, lay.pp, lay.tp, lay.dp, zero >= 2, lay.chunks, lay.micro_batch, lay.sequence_parallel,
           span.first, span.last, convention, backend)
    pp = _TERMS.get(key)
    if pp is None:
        pp = _TERMS[key] = pipeline(spec, lay, tr, hw, span, convention, backend)
    if convention == "trainer" and lay.dp > 1 and zero < 2:  # DDP packs whole tensors into its buckets
        bucket_bytes = ddp_bucket_bytes(spec, lay.tp, lay.pp, span, state_bytes(tr, convention)[1], bucket_bytes)
    dp = data_parallel(spec, lay, tr, hw, states, work, bucket_bytes, convention, backend, traffic)
    if hw.kernels is None:
        optimizer, accumulate = optimizer_time(hw, states, state_bytes(tr, convention)), 0.0
    else:
        measured = times[3] if times is not None and len(times) > 3 else None
        key = ("optimizer", spec, training, hw, lay.dp, lay.tp, lay.pp, zero, lay.sequence_parallel, span, convention,
               measured)
        found = _TERMS.get(key)
        if found is None:
            found = _TERMS[key] = (_optimizer(spec, lay, tr, hw, span, states, convention, measured),
                                   accumulate_time(spec, lay, hw, span))
        optimizer, accumulate = found
    step_compute = 0.0
    if hw.kernels is not None and hw.kernels.fsdp_units and states.units and convention == "trainer":
        work, step_compute = fsdp_unit_work(hw.kernels, zero, lay.dp, states.units, work)
        if lay.schedule == "pipedream":  # it reduces after every microbatch
            work, step_compute = Compute(work.forward, work.backward + step_compute), 0.0
    compute_ = work.forward + work.backward
    segment = compute_ / tp.calls if tp.calls else 0.0
    waits = tp.calls * kn.sync_wait(hw.kernels, segment, lay.tp) if hw.kernels is not None and hw.kernels.skew \
        else 0.0  # each tensor-parallel collective waits for the slowest rank
    # each message the rank receives (as many as it sends) may wait for its sender's communication thread
    send = pp.send_time + (hw.kernels.p2p_stall_s if hw.kernels is not None else 0.0)
    exposed = tp.time + waits + pp.sends * send + dp.exposed_microbatch
    d, t, p = dp.traffic, tp.traffic, pp.traffic
    return StageCosts(states=states, microbatch=compute_ + exposed, compute=compute_, exposed=exposed,
                      drain=work.backward + tp.backward + (waits * work.backward / compute_ if waits else 0.0)
                      + send,
                      step_exposed=pp.step_exposed + dp.exposed_step + tp.step_exposed,
                      optimizer=optimizer, accumulate=accumulate, step_compute=step_compute, segment=segment,
                      data_parallel=dp.traffic, tensor_parallel=tp.traffic, pipeline_parallel=pp.traffic,
                      step_bytes=(d.step, t.step, p.step, d.wire_step, t.wire_step, p.wire_step),
                      microbatch_bytes=(d.microbatch, t.microbatch, p.microbatch, d.wire_microbatch,
                                        t.wire_microbatch, p.wire_microbatch))


def step_waits(costs: kn.KernelCosts | None, lay: Layout, rank: StageCosts, microbatches: int) -> float:
    """What the rank's step waits for the slowest rank beyond its collectives and its tensor-parallel ones
    (:func:`distperf.cost.kernels.sync_wait`; 0 without the table ``skew``): on ranks that synchronize (dp·tp > 1),
    the step's last stretch (the optimizer step: a run's iteration is its slowest rank's), and under DDP or ZeRO-1
    the gradient reduction after the step's microbatches (with tensor parallelism, after the last of their
    collectives). ZeRO-2/3's waits are in FSDP2's unit table."""
    if costs is None or not costs.skew or lay.dp * lay.tp < 2:
        return 0.0
    wait = kn.sync_wait(costs, rank.optimizer + rank.step_compute, lay.dp * lay.tp)
    if lay.dp > 1 and _zero(lay) < 2:
        burst = rank.segment or microbatches * rank.compute + (microbatches - 1) * rank.accumulate
        wait += kn.sync_wait(costs, burst, lay.dp)
    return wait


def fsdp_unit_work(costs: kn.KernelCosts, zero: int, dp: int, units: tuple, work: Compute) -> tuple[Compute, float]:
    """``work`` with what the rank's FSDP2 units cost by their size (:func:`distperf.cost.kernels.fsdp_unit_extra`,
    the unit unsharded: dp × its shard) added, and the per-step part apart: ZeRO-3 gathers each unit in the forward and
    again in the backward (half each), ZeRO-2 once, in the forward; the gradient reduction runs once per step."""
    microbatch = step = 0.0
    for count, shard in units:
        per_microbatch, per_step = kn.fsdp_unit_extra(costs, zero, dp * shard)
        microbatch, step = microbatch + count * per_microbatch, step + count * per_step
    forward = microbatch / 2 if zero == 3 else microbatch
    return Compute(forward=work.forward + forward, backward=work.backward + microbatch - forward), step


def _optimizer(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, span: Span, states: ModelStates,
               convention: str, measured: tuple | None = None) -> float:
    """The rank's optimizer step: :func:`optimizer_time`, or from the ``measured`` (o_layer, o_first, o_last) of a
    run's ranks (:mod:`distperf.measure.parts`, already sharded under ZeRO-2/3): L_r·o_layer + [first] o_first +
    [last] o_last, times ZeRO-1's owned share, plus the step's fixed Python and the wrappers' per-step cost."""
    if hw.kernels is None:
        return optimizer_time(hw, states, state_bytes(tr, convention))
    tensors = rank_tensors(spec, lay, span)
    wrappers = wrapper_step(hw.kernels, lay, span, tensors, state_bytes(tr, convention)[1])
    if measured is not None:
        o_layer, o_first, o_last = measured
        loop = span.layers * o_layer + (o_first if span.first else 0.0) + (o_last if span.last else 0.0)
        if not states.units and states.parameters:  # ZeRO-1 updates its share of whole tensors
            loop *= states.owned / states.parameters
        return loop + hw.kernels.step_s + wrappers
    return optimizer_time(hw, states, state_bytes(tr, convention), tensors, lay.dp, wrappers, lay.world_size > 1)


def accumulate_time(spec: ModelSpec, lay: Layout, hw: Hardware, span: Span) -> float:
    """With measured kernels: one addition per parameter tensor of the rank (its whole gradient: DDP, FSDP2 without
    gradient synchronization and the pipelines accumulate unsharded), each at the ``add`` kernel's time for its
    size, contended when ranks share the machine; every microbatch after the first pays it. Else 0."""
    costs = hw.kernels
    if costs is None:
        return 0.0
    tensors = rank_tensors(spec, lay, span)
    seconds = sum(count * kn.elementwise(costs, "add", numel)[0] for count, _, numel in tensors)
    return seconds * (costs.contention_memory if lay.world_size > 1 else 1.0)


# The training setting as a cache key: its fields, in order (a sweep builds a new, equal Training for each
# configuration; a tuple of its fields hashes and compares in C, the dataclass in Python).
_fields = attrgetter(*(f.name for f in fields(Training)))

_CACHE: dict = {}  # what the costs depend on but the spans -> {span: StageCosts, spans: (StageCosts, …)}
_STATES: dict = {}  # the model states, which depend on fewer things (not micro-batch, recomputation, hardware)
_TERMS: dict = {}  # the tensor- and pipeline-parallel terms, on what each depends on (tuples of different lengths)
_CACHE_SIZE = 1 << 14


def _zero(lay: Layout) -> int:
    """The ZeRO stage as a rank's costs see it: ZeRO shards over the dp replicas, so with one every stage costs as
    none (each rule of :func:`model_states` and :mod:`distperf.cost.communication` asks for dp > 1)."""
    return lay.zero if lay.dp > 1 else 0


def _engine(lay: Layout, hw: Hardware) -> int:
    """What a rank's costs take from the schedule: PipeDream's data-parallel reduction after every microbatch (1;
    with dp > 1) and, with measured kernels, the 2BW engine's cost per action (2); otherwise nothing (0)."""
    if lay.schedule == "pipedream" and lay.dp > 1:
        return 1
    return 2 if hw.kernels is not None and lay.schedule in TWOBW_ENGINE else 0


def stage_costs(spec: ModelSpec, lay: Layout, tr: Training, hw: Hardware, spans: tuple, bucket_bytes: float,
                times: tuple | None = None, convention: str = "trainer",
                backend: str = "nccl") -> tuple[StageCosts, ...]:
    """The :class:`StageCosts` of the ranks holding ``spans`` (a tuple of :class:`Span`), in their order, cached on
    what they depend on: the model, training and hardware, the layout but for its microbatches and schedule
    (PipeDream's update per microbatch and the 2BW engine's cost per action aside), the bucket size, profiled times,
    the convention and the backend (only as far as the costs read them: :func:`_zero`, :func:`_engine`)."""
    key = (spec, _fields(tr), hw, bucket_bytes, times, lay.dp, lay.tp, lay.pp, lay.chunks, lay.micro_batch,
           lay.sequence_parallel, _zero(lay), lay.recompute, _engine(lay, hw), convention, backend)
    known = _CACHE.get(key)
    if known is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        known = _CACHE[key] = {}
    found = known.get(spans)  # the whole tuple: a sweep asks for the same ranks again and again
    if found is None:
        for span in spans:
            if span not in known:
                known[span] = _combine(spec, lay, tr, hw, span, bucket_bytes, times, convention, backend)
        found = known[spans] = tuple(known[span] for span in spans)
    return found


def clear_cache() -> None:
    """Forget every cached :class:`StageCosts` (for benchmarks that must start cold)."""
    _CACHE.clear()
    _STATES.clear()
    _TERMS.clear()
    _rank_tensors.cache_clear()


@lru_cache(maxsize=4096)
def ddp_buckets(spec: ModelSpec, t: int, p: int, span: Span, grad: int, cap: int) -> tuple[int, int]:
    """(buckets, bytes) of the rank's gradients under DDP with ``bucket_cap_mb`` = ``cap`` bytes: whole tensors packed
    in the order their gradients become ready (:func:`~distperf.cost.collectives.ddp_bucket_count`): the head's (on
    the last rank; its own matrix where :func:`~distperf.cost.parameters.head_parameters` counts one), the layers' from
    the last (each from its output projection back to its first LayerNorm), the positions' and the token embedding's
    (on the first rank; tied, the head's matrix is this one, whose gradient is complete last). ``grad``: bytes per
    gradient element. ``tests/test_parallel_data.py`` counts torch's own buckets."""
    h, vocab = spec.hidden, spec.vocab
    head = ((vocab * h,) if par.head_parameters(h, vocab, spec.tied, p) > 2 * h else ()) + (h, h) if span.last else ()
    ends = (spec.seq * h, vocab * h) if span.first else ()
    head, ends = tuple(grad * x for x in head), tuple(grad * x for x in ends)
    layer = tuple(grad * numel for _, numel in reversed(par.layer_tensors(h, spec.ffn, t)))
    return (ddp_bucket_count(head, layer, span.layers, ends, cap),
            sum(head) + span.layers * sum(layer) + sum(ends))


def ddp_bucket_bytes(spec: ModelSpec, t: int, p: int, span: Span, grad: int, cap: float) -> float:
    """The bucket size that makes the equal buckets of :func:`distperf.cost.collectives.bucketed_exposed_time` as many
    as DDP makes of the rank's gradients (:func:`ddp_buckets`): max(cap, total / count). A cap below the largest
    tensors makes far fewer, larger buckets than total/cap: the `small` model of 32 layers of width 256 has 129 at
    0.1 MiB, where 97 MiB / 0.1 MiB would be 967. The buckets' count is DDP's and their bytes sum to the gradients';
    their sizes, which differ in DDP (a layer's two large matrices apart, its small tensors with the next large one),
    are taken equal."""
    count, total = ddp_buckets(spec, t, p, span, grad, int(cap))
    return max(cap, total / count) if count else cap


def rank_tensors(spec: ModelSpec, lay: Layout, span: Span) -> tuple:
    """:func:`_rank_tensors` of the rank of ``lay`` that holds ``span`` (the head's matrix its own where untied or on
    a pipeline stage of its own)."""
    return _rank_tensors(spec, lay.tp, span, par.head_parameters(spec.hidden, spec.vocab, spec.tied, lay.pp)
                         > 2 * spec.hidden)


@lru_cache(maxsize=4096)
def _rank_tensors(spec: ModelSpec, t: int, span: Span, head_matrix: bool) -> tuple:
    """(count, dim-0 size, elements) of the parameter tensors one rank holds, for ZeRO sharding (cached: the model
    states, the optimizer step and the gradient accumulation each ask)."""
    h, vocab, s = spec.hidden, spec.vocab, spec.seq
    tensors = [(span.layers, d0, numel) for d0, numel in par.layer_tensors(h, spec.ffn, t)]
    if span.first:
        tensors += [(1, vocab, vocab * h), (1, s, s * h)]
    if span.last:
        tensors += [(2, h, h)] + ([(1, vocab, vocab * h)] if head_matrix else [])
    return tuple(tensors)
