"""Compute time from the kernels a step launches, each priced by a microbenchmark of its own shape: the analytical
time model of a machine whose small operators do not run at the best matrix-product rate (chapter "Where the time
goes", section "The kernel time model").

FLOPs over one peak rate (:mod:`distperf.cost.flops`) prices a step as if every matrix product ran as fast as the
largest square one and nothing else took time. On a CPU core, and for the small models the book trains, a step
is instead a few hundred kernels, each with a fixed cost, most far from the peak rate. Here one microbatch's forward
and backward on a rank is the sum over the kernels it launches, in four classes (those of
:mod:`distperf.measure.breakdown`):

- **matrix products**: each linear layer (m tokens, k inputs, n outputs) at the time of the square linear layer
  (an input of n_eff tokens of n_eff features) of n_eff = (m·n·k)^(1/3), read from the table ``linear_<dtype>``
  (log-log interpolation; beyond its largest size, time ∝ n_eff³); one ``addmm`` forward, two ``mm`` and the bias's sum backward;
- **attention**: the fused kernel, a call's fixed cost + (batch × heads) × the time per head, both read from the
  table ``attention`` over (causal, s, d) (bilinear in log s, log d; beyond the table, time per head ∝ s²·d); the
  unfused form (``math``, or dropout on the probabilities) as two batched matrix products, a softmax and, with
  dropout, a dropout over a·s² values per sequence;
- **other operators**: LayerNorm, GELU, the residual additions, the copy that gathers the heads, cross-entropy and
  the embedding lookups, each at the time of its kind at its number of elements (table ``elementwise``), in backward
  also the concatenation of the QKV split's gradient and the two sums of the residual stream's gradient, and each
  view (``view``) — memory-bound work and each operator's fixed cost;
- **framework**: Python's cost of each ``nn.Module`` call (``module_call_s``), the autograd engine's start of each
  backward pass (``backward_call_s``) and the trainer's fixed Python per step (``step_s``: the one constant not
  measured by a microbenchmark but fitted, on the ``tiny`` preset alone, which is then left out of every validation),
  and what torch's parallel wrappers add beyond their kernels and collectives: a tensor-parallel layer's DTensor
  dispatch (``tp_layer_s``, ``tp_sp_layer_s``), an FSDP2 unit's hooks and copies (``fsdp_unit_s``) per microbatch,
  DDP's per step (``ddp_step_s``, a Block's) and beyond the Block's tensors per parameter tensor and per byte of
  gradient (``ddp_tensor_s``, ``ddp_byte_s``: its hooks, the copies into and out of its buckets), and Adam's extra
  per DTensor parameter (``adam_dtensor_tensor_s``); what
  recomputation (``torch.utils.checkpoint``) costs beyond the kernels of the forward it repeats, per recomputed layer
  (full) or attention core (selective): its hooks on every saved tensor, its bookkeeping and, under DTensor, the
  repeated forward's dispatch (``recompute_layer_s``, ``recompute_core_s``; ``tp_…`` and ``tp_sp_…`` for tensor- and
  sequence-parallel layers); and, measured on the calibration's ranks, a pipeline action's cost in torch's
  pipelining runtime (``pp_action_s``) and in the 2BW engine (``twobw_action_s``): two actions per microbatch and
  stage (a rank of the interleaved schedule holds v stages, its chunks), of which ``pp_action_wait_s``
  (``twobw_action_wait_s``) is spent inside communication, where a profiler files it, or, where the calibration
  fitted one, the table ``action_waits`` of each schedule's part, fitted on the tiny preset's pipeline runs
  (:mod:`distperf.analysis.pipeline_waits`; :func:`distperf.cost.stage.action_inside`; it moves time between a
  predicted breakdown's classes, not the step's: its rule failed on the builds at 70f88ea and de85c17 with the probe's
  part and stood on 21e68cf with the fitted table, :data:`distperf.analysis.time_model.PIPELINE_SPLIT`).

**Contention.** Ranks on one machine share its memory bandwidth and caches: with more than one rank, matrix
products and attention take ``contention_compute`` times, the memory-bound operators and Adam's per-element work
``contention_memory`` times their time alone (both measured with every rank running the same kernel at once). A
generic Transformer layer's own ratio (``contention_layer``, measured since 6 December 2026) would price a layer's
kernels in place of both; its rule failed on the build at 177e3f8, and it stays a what-if. And
communication that the framework hides behind compute (DDP's buckets, FSDP2's gathers and reduce-scatters) hides
only by the measured ``overlap`` (FSDP2's by ``fsdp_overlap``, measured on its own path): the exposed time is the
whole communication less that share of what perfect overlap would hide. Where FSDP2's path costs more than its
collectives' α-β time (on two CPU ranks it does: copies in and out, waits, gloo's reduce-scatter run as an
all-reduce), ``fsdp_overlap`` is negative and the exposed time is (1 − fsdp_overlap) times the α-β time. A tensor-parallel collective through
DTensor costs ``tp_collective_s`` + ``tp_collective_byte_s`` · its message's bytes beyond its α-β time, a
sequence-parallel layer's ``tp_sp_collective_s`` + ``tp_sp_collective_byte_s`` · bytes (fitted on the
:data:`STEP_FIT_MODEL` preset's tensor-parallel steps on two ranks at micro-batches whose messages span 2 KiB to
512 KiB, :func:`distperf.measure.path_fits.tensor_parallel_paths`; a calibration sets the per-byte terms to 0 since
the rule of 5 December 2026 turned them down, and only the profiles of the two builds before carry them; the
sequence-parallel LayerNorms' small gradient all-reduces after the step get neither). Of that per-call cost, the
rank spends ``tp_collective_wait_s`` (``tp_sp_collective_wait_s``) inside the collective, where a profiler sees
communication, and the rest in DTensor's Python around it, which a measured breakdown files as framework: fitted on
the same steps, profiled (:func:`distperf.measure.path_fits.tensor_parallel_waits`), it splits the step's time between
the two classes (:attr:`distperf.cost.communication.TensorParallelTerms.outside`) and changes no predicted time.

**Waiting for the slowest rank: a what-if, not a term.** Ranks that synchronize leave the collective when the last of
them arrives, and two ranks given the same work do not finish it together: with a table ``skew`` set (by the book's
what-if, from the calibration's sidecar ``conditions.skew``: :mod:`distperf.measure.skew`), a synchronization after d
seconds of compute on each adds ``sync_wait(d)`` (:func:`sync_wait`) to every tensor-parallel collective (d: the
microbatch's compute over its collectives), to DDP's and ZeRO-1's gradient reduction (d: the step's microbatches) and,
since a run's iteration is its slowest rank's, to the step's last stretch on ranks that synchronize (d: the optimizer
step); FSDP2's gathers get none (the unit table ``fsdp_units`` was measured on synchronized ranks). The model priced
these waits from a profile's ``kernels.skew`` on 5 December 2026 only: their rule (the chapter "Where the time goes")
failed on the two builds that measured them, so a profile's ``skew`` is no longer read and a calibration records the
table in its sidecar alone.

**FSDP2's units by their size: a what-if, not a term.** With a table ``fsdp_units`` set (by the book's what-if, from
the calibration's sidecar ``conditions.fsdp_units``: :func:`distperf.measure.path_fits.with_fsdp_units`), every
FSDP2 unit of a rank also costs what its copies into and out of its flat buffers take beyond ``fsdp_unit_s`` and its
collectives as priced, by the unit's size (:func:`fsdp_unit_extra`). The model priced that table from a profile's
``kernels.fsdp_units`` from 5 December 2026 until its rule (the chapter "Where the time goes") had failed on two of
the three archives that measured it; a profile's ``fsdp_units`` is no longer read.

**A receive from a computing sender: a what-if, not a term.** gloo hands a pipeline's activation or gradient over on
the sender's communication thread, which shares its core with the sender's compute; with ``p2p_stall_s`` set (by the
book's what-if, from the calibration's sidecar ``conditions.busy_sender``: :mod:`distperf.measure.busy_sender`), each
message a rank receives in a microbatch costs that much more, on top of its α-β time
(:func:`distperf.cost.stage.stage_costs`). Its rule (the chapter "Where the time goes") was declared on 6 December
2026, before the build that judges it.

The optimizer step is Adam's per-tensor loop: Σ over the tensors the rank updates of the time per tensor at its
size (table ``adam``). Every table comes from :mod:`distperf.measure.kernels` at generic shapes (``python -m distperf
calibrate`` writes them into the hardware profile's ``kernels``); nothing is fitted on a run.

**The machine's speed.** A calibration measures these tables at one moment; a run may happen when the machine runs
faster or slower. :meth:`KernelCosts.at_speed` scales them by a run's speed probe over the calibration's
(:mod:`distperf.measure.speed`): matrix products and attention by the first ratio, element-wise work, views and
Adam's per-tensor kernels by the second, the framework's Python by the third.

Pure Python: prices are cached per (costs, shape), so a sweep pays each once.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

CLASSES = ("matrix_products", "attention", "other_operators", "framework")
# the one preset constants (step_s, the tensor-parallel path) are fitted on; no validation uses it
STEP_FIT_MODEL = "tiny"
STEP_FIT_BATCHES = (1, 2, 4)  # its micro-batches in those fits
FSDP_EXPOSURE_MAX = 100.0  # fsdp_overlap ≥ −100: FSDP2's path at most 101 times its collectives' α-β time
RECOMPUTE_WRAPPERS = ("recompute_layer_s", "recompute_core_s", "tp_recompute_layer_s", "tp_recompute_core_s",
                      "tp_sp_recompute_layer_s", "tp_sp_recompute_core_s")
PATH_COLLECTIVES = ("tp_collective_s", "tp_sp_collective_s", "tp_collective_byte_s", "tp_sp_collective_byte_s",
                    "tp_collective_wait_s", "tp_sp_collective_wait_s")  # collectives as DTensor issues them: per
# call, per byte of the message, and the part of the per-call cost spent inside the collective
WRAPPERS = ("tp_layer_s", "tp_sp_layer_s", "fsdp_unit_s", "ddp_step_s", "ddp_tensor_s", "ddp_byte_s",
            "adam_dtensor_tensor_s", *PATH_COLLECTIVES,
            "pp_action_s", "twobw_action_s", "pp_action_wait_s", "twobw_action_wait_s") + RECOMPUTE_WRAPPERS
DDP_PROBE_TENSORS = 12  # the parameter tensors of the Block that measures ddp_step_s (measure.kernels.PROBE)
MODULES_PER_LAYER = 11  # Block, ln1, attn, qkv, proj, drop, ln2, mlp, fc, out, drop (distperf.model)
PROBE_PARTS = ("gemm_s", "elementwise_s", "python_s")  # measure.speed.PARTS (this module imports no torch)
VIEWS_PER_LAYER = 5  # the QKV reshape, transpose and split; the heads' transpose; reshape before proj is a copy


@dataclass(frozen=True)
class KernelCosts:
    """Measured kernel times of one machine at one thread count (seconds; :mod:`distperf.measure.kernels`)."""

    linear_fp32: tuple  # ((n, forward_s, backward_s), …): F.linear of n×n by n×n with bias, fp32
    linear_bf16: tuple  # the same in bf16 (mixed precision); () where not measured
    attention: tuple  # ((causal, s, d, forward_call_s, forward_per_head_s, backward_call_s, backward_per_head_s), …)
    elementwise: tuple  # ((kind, elements, forward_s, backward_s), …), kinds of measure.kernels.ELEMENTWISE
    view: tuple  # (forward_s, backward_s) of one view
    module_call_s: float  # one nn.Module call's Python
    backward_call_s: float  # a backward pass's start in the autograd engine
    adam: tuple  # ((elements, seconds per tensor), …): one Adam step per tensor
    step_s: float = 0.0  # the trainer's fixed Python per step, fitted on the tiny preset (calibrate), not a kernel
    # what torch's parallel wrappers add, beyond kernels and collectives (measure.kernels.wrapper_times)
    tp_layer_s: float = 0.0  # one tensor-parallel layer's forward + backward (DTensor's dispatch)
    tp_sp_layer_s: float = 0.0  # the same with sequence parallelism
    fsdp_unit_s: float = 0.0  # one FSDP2 unit's forward + backward (hooks, all-gather copy-in/out)
    ddp_step_s: float = 0.0  # DDP's hooks and bucket bookkeeping, per step (a Block's: DDP_PROBE_TENSORS tensors)
    ddp_tensor_s: float = 0.0  # and per parameter tensor beyond the Block's (its hook, its copy into the bucket)
    ddp_byte_s: float = 0.0  # and per byte of gradient (copies into and out of the bucket, the division), s/byte
    adam_dtensor_tensor_s: float = 0.0  # Adam's step on a DTensor parameter beyond a plain one
    tp_collective_s: float = 0.0  # a tensor-parallel collective through DTensor beyond its α-β time (two ranks)
    tp_sp_collective_s: float = 0.0  # the same for a sequence-parallel layer's all-gathers and reduce-scatters
    tp_collective_byte_s: float = 0.0  # and beyond that, per byte of the collective's message (s/byte)
    tp_sp_collective_byte_s: float = 0.0  # the same, sequence parallel
    # of tp_collective_s, the part the rank spends inside the collective (the profiler's communication); the rest is
    # DTensor's Python around it, which a measured breakdown files as framework (the step's time does not change)
    tp_collective_wait_s: float = 0.0
    tp_sp_collective_wait_s: float = 0.0  # the same, sequence parallel
    pp_action_s: float = 0.0  # a pipeline action (one microbatch's forward or backward on a stage) in torch's runtime
    twobw_action_s: float = 0.0  # the same in the 2BW engine (both beyond the stage's layers and its sends)
    # of pp_action_s (twobw_action_s), the part the rank spends inside communication (the profiler's: the engine's
    # sends, receives and waits on them); the model keeps the whole action in framework (the step's time does not
    # change), a measured breakdown files that part as communication
    pp_action_wait_s: float = 0.0
    twobw_action_wait_s: float = 0.0
    # ((schedule, seconds), …): the part inside communication per action of each schedule, fitted on the tiny preset's
    # pipeline runs (distperf.analysis.pipeline_waits); where a schedule has none, pp_ / twobw_action_wait_s
    action_waits: tuple = ()
    # what torch.utils.checkpoint costs per recomputed layer (full) or attention core (selective) beyond the kernels
    # of the forward it repeats: plain, tensor-parallel, sequence-parallel (measure.kernels.wrapper_times)
    recompute_layer_s: float = 0.0
    recompute_core_s: float = 0.0
    tp_recompute_layer_s: float = 0.0
    tp_recompute_core_s: float = 0.0
    tp_sp_recompute_layer_s: float = 0.0
    tp_sp_recompute_core_s: float = 0.0
    # every rank of the machine running at once over one alone (calibrate's training_conditions), ≥ 1
    contention_memory: float = 1.0  # memory-bound kernels (a large copy)
    contention_compute: float = 1.0  # compute-bound kernels (a matrix product)
    # a Transformer layer of a generic shape, forward and backward, all ranks at once over one alone
    # (measure.speed.contention_round; the calibration's sidecar keeps its rounds and their median): in place of the two
    # ratios above on a layer's kernels where set; 0 unless a what-if sets it (never read from a profile: its rule
    # failed on the build at 177e3f8, the chapter "Where the time goes", section "The machine's speed")
    contention_layer: float = 0.0
    overlap: float = 1.0  # share of the shorter of an asynchronous collective and compute that runs at once, [0, 1]
    # share of FSDP2's gathers and reduce-scatters its forward and backward hide, ≤ 1; below 0 its path costs
    # (1 − fsdp_overlap) times its collectives' α-β time and hides none of it
    fsdp_overlap: float = 1.0
    # the calibration's speed probe (measure.speed: gemm_s, elementwise_s, python_s), () where it took none
    probe: tuple = ()
    # what an FSDP2 unit costs by its size beyond fsdp_unit_s and its collectives as the model prices them (copies in
    # and out of its flat buffers, fresh pages above the allocator's mmap threshold): ((elements, zero,
    # microbatch_s, step_s), …), measured on the calibration's ranks (:func:`fsdp_unit_extra`); () unless a what-if
    # sets it (never read from a profile: see the module docstring)
    fsdp_units: tuple = ()
    # the slowest of the calibration's ranks over their typical one after a burst of compute: ((ranks, burst_s,
    # wait_s), …), measured by distperf.measure.skew (:func:`sync_wait`); () unless a what-if sets it (never read
    # from a profile: see the module docstring)
    skew: tuple = ()
    # the expected extra wait of a pipeline's receive whose sender is computing (seconds per receive), measured by
    # distperf.measure.busy_sender; 0 unless a what-if sets it (never read from a profile: see the module docstring)
    p2p_stall_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        """Hashed once: the cost model caches on the hardware, kernels included."""
        return self._hash

    @classmethod
    def from_dict(cls, data: dict) -> KernelCosts:
        """From the JSON of a hardware profile's ``kernels`` (lists become tuples); KeyError/TypeError/ValueError on
        a malformed one (:func:`distperf.hardware.load_profile` turns them into one message). The ``skew`` and
        ``fsdp_units`` tables some profiles of 5 December 2026 carry are left out: the model no longer prices them."""
        out = cls(linear_fp32=_rows(data["linear_fp32"]), linear_bf16=_rows(data.get("linear_bf16", ())),
                  attention=_rows(data["attention"]), elementwise=_rows(data["elementwise"]),
                  view=tuple(float(x) for x in data["view"]), module_call_s=float(data["module_call_s"]),
                  backward_call_s=float(data["backward_call_s"]), adam=_rows(data["adam"]),
                  step_s=float(data.get("step_s", 0.0)),
                  contention_memory=float(data.get("contention", {}).get("memory", 1.0)),
                  contention_compute=float(data.get("contention", {}).get("compute", 1.0)),
                  overlap=float(data.get("contention", {}).get("overlap", 1.0)),
                  fsdp_overlap=float(data.get("contention", {}).get("fsdp", 1.0)),
                  probe=tuple(float(data["probe"][k]) for k in PROBE_PARTS) if data.get("probe") else (),
                  action_waits=tuple(sorted((str(k), float(v)) for k, v in data.get("action_waits", {}).items())),
                  **{k: float(v) for k, v in data.get("wrappers", {}).items() if k in WRAPPERS})
        numbers = [x for table in (out.linear_fp32, out.linear_bf16, out.adam) for row in table for x in row]
        numbers += [x for row in out.attention for x in row[1:]] + [x for row in out.elementwise for x in row[1:]]
        numbers += [*out.view, out.module_call_s, out.backward_call_s, out.step_s, out.contention_memory - 1,
                    out.contention_compute - 1, out.overlap, 1 - out.overlap, out.fsdp_overlap + FSDP_EXPOSURE_MAX,
                    1 - out.fsdp_overlap,
                    *(getattr(out, k) for k in WRAPPERS), *out.probe, *(v for _, v in out.action_waits)]
        if not out.linear_fp32 or not out.attention or not out.adam or len(out.view) != 2 or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0
                for x in numbers):
            raise ValueError("every kernel time must be a finite number ≥ 0, and the linear, attention and adam "
                             "tables must not be empty")
        return out

    def to_dict(self) -> dict:
        """The JSON of a hardware profile's ``kernels`` (the wrapper costs under ``wrappers``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in WRAPPERS and not f.name.startswith("contention_")
               and f.name not in ("overlap", "fsdp_overlap", "probe", "skew", "fsdp_units", "action_waits",
                                  "p2p_stall_s")}
        if self.probe:
            out["probe"] = dict(zip(PROBE_PARTS, self.probe))
        if self.action_waits:
            out["action_waits"] = dict(self.action_waits)
        out["wrappers"] = {k: getattr(self, k) for k in WRAPPERS}
        out["contention"] = {"memory": self.contention_memory, "compute": self.contention_compute,
                             "overlap": self.overlap, "fsdp": self.fsdp_overlap}
        return out

    def without(self, *terms: str) -> KernelCosts:
        """A copy without some terms, for the ablation: ``optimizer`` (Adam back to bytes over bandwidth),
        ``framework`` (module calls, backward starts, the step's Python and the parallel wrappers free),
        ``collectives`` (DTensor's cost per collective free),
        ``contention`` (every rank computes as fast as one alone, communication hides fully behind compute, and no
        rank waits for a slower one)."""
        changes = {}
        if "contention" in terms:
            changes.update(contention_memory=1.0, contention_compute=1.0, contention_layer=0.0, overlap=1.0,
                           fsdp_overlap=1.0, skew=(),
                           p2p_stall_s=0.0)
        if "optimizer" in terms:
            changes["adam"] = ()
        if "framework" in terms:
            changes.update(module_call_s=0.0, backward_call_s=0.0, step_s=0.0, fsdp_units=(),
                           **{k: 0.0 for k in WRAPPERS if k not in PATH_COLLECTIVES})
        if "collectives" in terms:
            changes.update(dict.fromkeys(PATH_COLLECTIVES, 0.0))
        return replace(self, **changes)

    def at_speed(self, ratios: dict) -> KernelCosts:
        """The kernel times of a machine running ``ratios`` ({gemm, elementwise, python}: a run's speed probe over
        the calibration's, :func:`distperf.measure.speed.ratios`) times as long as when it was calibrated: matrix
        products and attention × ``gemm``; element-wise operators, views and Adam's per-tensor steps ×
        ``elementwise``; module calls, the backward's start, the step's Python and the parallel wrappers ×
        ``python``. Contention and overlap are ratios of times and stay, and so do the waits for the slowest rank
        (``skew``: the spread of the machine's speed, not its speed)."""
        g, e, p = ratios["gemm"], ratios["elementwise"], ratios["python"]

        def scaled(table, first, factor):
            """``table`` with each row's times (its columns from ``first`` on) × ``factor``."""
            return tuple(tuple(row[:first]) + tuple(x * factor for x in row[first:]) for row in table)

        return replace(self, linear_fp32=scaled(self.linear_fp32, 1, g), linear_bf16=scaled(self.linear_bf16, 1, g),
                       attention=scaled(self.attention, 3, g), elementwise=scaled(self.elementwise, 2, e),
                       view=tuple(x * e for x in self.view), adam=scaled(self.adam, 1, e),
                       module_call_s=self.module_call_s * p, backward_call_s=self.backward_call_s * p,
                       step_s=self.step_s * p, **{k: getattr(self, k) * p for k in WRAPPERS},
                       fsdp_units=tuple((n, z, mb * e, st * e) for n, z, mb, st in self.fsdp_units))


@lru_cache(maxsize=4096)
def fsdp_unit_extra(costs: KernelCosts, zero: int, elements: int) -> tuple[float, float]:
    """(per microbatch, per step) seconds an FSDP2 unit of ``elements`` parameters (unsharded, padded) costs under
    ZeRO-``zero`` beyond ``fsdp_unit_s`` and its collectives as the cost model prices them: linear in the elements
    between the table's rows (``fsdp_units``) of that stage, proportional to them below the first row and above the
    last; (0, 0) without rows. The microbatch part is the gathers' (every microbatch), the step part the gradient
    reduction's (once per step, after the last backward).

    Why by size: FSDP2 copies each unit's shards into a flat buffer before its all-gather and out of it after,
    concatenates the unsharded gradients before the reduce-scatter (gloo then copies its input once more), and
    allocates those buffers afresh at every call; above glibc's largest mmap threshold (32 MiB) each is a fresh
    mapping whose pages fault in as they are first written (on the 2-core machine about 0.42 ms per MiB, against
    0.08 ms per MiB to copy into memory already touched). So the cost per element jumps between units of 28 and
    38 MiB; a constant fitted on one unit size cannot follow it."""
    rows = sorted((n, mb, st) for n, z, mb, st in costs.fsdp_units if z == zero)
    if not rows or elements <= 0:
        return 0.0, 0.0
    if elements <= rows[0][0] or elements >= rows[-1][0]:
        n, mb, st = rows[0] if elements <= rows[0][0] else rows[-1]
        return mb * elements / n, st * elements / n
    i = bisect.bisect_right([r[0] for r in rows], elements)
    (n0, mb0, st0), (n1, mb1, st1) = rows[i - 1], rows[i]
    w = (elements - n0) / (n1 - n0)
    return mb0 + (mb1 - mb0) * w, st0 + (st1 - st0) * w


def sync_wait(costs: KernelCosts, burst_s: float, ranks: int) -> float:
    """Seconds that ``ranks`` ranks synchronizing after ``burst_s`` seconds of compute each wait, beyond that compute,
    for the slowest of them (:mod:`distperf.measure.skew`): linear in the burst between the rows of the table
    ``skew``, proportional to it below the first row and above the last; for a number of ranks the table lacks, its
    nearest one's times the ratio of the expected largest of that many standard normal draws to the expected largest
    of the measured number (Blom's approximation Φ⁻¹((n − 0.375)/(n + 0.25)), Blom 1958). 0 without a table, for
    one rank or no compute."""
    if not costs.skew or ranks < 2 or burst_s <= 0:
        return 0.0
    measured, rows = _skew_rows(costs, ranks)
    if not rows:
        return 0.0
    if burst_s <= rows[0][0] or burst_s >= rows[-1][0]:
        d, w = rows[0] if burst_s <= rows[0][0] else rows[-1]
        wait = w * burst_s / d
    else:
        i = bisect.bisect_right([r[0] for r in rows], burst_s)
        (d0, w0), (d1, w1) = rows[i - 1], rows[i]
        wait = w0 + (w1 - w0) * (burst_s - d0) / (d1 - d0)
    return wait if measured == ranks else wait * _largest_normal(ranks) / _largest_normal(measured)


@lru_cache(maxsize=256)
def _skew_rows(costs: KernelCosts, ranks: int) -> tuple[int, tuple]:
    """(the table's number of ranks nearest ``ranks``, its rows ((burst_s, wait_s), …) by burst)."""
    counts = sorted({n for n, _, _ in costs.skew})
    nearest = min(counts, key=lambda n: (abs(n - ranks), n))
    return nearest, tuple(sorted((d, w) for n, d, w in costs.skew if n == nearest and d > 0))


@lru_cache(maxsize=256)
def _largest_normal(n: int) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _rows(value) -> tuple:
    return tuple(tuple(row) for row in value)


def loglog(table: tuple, x: float, power: float = 1.0) -> float:
    """y at x from ((x, y), …) sorted by x: log-log interpolation; below the table its first y (the fixed cost
    dominates), above it the last y × (x / last x)^power."""
    xs = [row[0] for row in table]
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1] * (x / xs[-1]) ** power
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    if y0 <= 0 or y1 <= 0:
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) * (1 - w) + math.log(y1) * w)


@lru_cache(maxsize=1 << 14)
def linear(costs: KernelCosts, m: int, n: int, k: int, mixed: bool) -> tuple[float, float]:
    """(forward, backward) seconds of a linear layer of m tokens, k inputs, n outputs."""
    table = costs.linear_bf16 if mixed and costs.linear_bf16 else costs.linear_fp32
    size = (m * n * k) ** (1 / 3)
    return (loglog(tuple((r[0], r[1]) for r in table), size, 3.0),
            loglog(tuple((r[0], r[2]) for r in table), size, 3.0))


@lru_cache(maxsize=1 << 14)
def elementwise(costs: KernelCosts, kind: str, elements: float) -> tuple[float, float]:
    """(forward, backward) seconds of one operator of ``kind`` over ``elements`` values."""
    rows = [r for r in costs.elementwise if r[0] == kind]
    return (loglog(tuple((r[1], r[2]) for r in rows), elements),
            loglog(tuple((r[1], r[3]) for r in rows), elements))


@lru_cache(maxsize=1 << 12)
def attention(costs: KernelCosts, causal: bool, heads: int, s: int, d: int) -> tuple[float, float]:
    """(forward, backward) seconds of one fused attention call over ``heads`` (batch × heads) of s positions and
    head size d: call + heads × per head, each bilinear in (log s, log d) over the table's grid."""
    rows = [r for r in costs.attention if bool(r[0]) == causal] or list(costs.attention)
    out = []
    for call_i, head_i in ((3, 4), (5, 6)):
        by_s = {}
        for r in rows:
            by_s.setdefault(r[1], []).append((r[2], r[head_i], r[call_i]))
        s_table_head, s_table_call = [], []
        for s_i in sorted(by_s):
            cells = sorted(by_s[s_i])
            s_table_head.append((s_i, loglog(tuple((c[0], c[1]) for c in cells), d)))
            s_table_call.append((s_i, loglog(tuple((c[0], c[2]) for c in cells), d)))
        out.append(loglog(tuple(s_table_call), s, 0.0) + heads * loglog(tuple(s_table_head), s, 2.0))
    return out[0], out[1]


def _add(total: dict, cls: str, pair: tuple[float, float], count: float = 1.0) -> None:
    f, b = total[cls]
    total[cls] = (f + count * pair[0], b + count * pair[1])


@lru_cache(maxsize=1 << 12)
def layer(costs: KernelCosts, b: int, s: int, h: int, a: int, ffn: int, t: int, sp: bool, causal: bool,
          fused: bool, dropout: bool, recompute: str, mixed: bool) -> dict:
    """{class: (forward, backward)} seconds of one Transformer layer (:class:`distperf.model.Block`) on one
    tensor-parallel rank for one microbatch of b sequences; recomputation adds to backward the forward it repeats
    (the whole layer, or the attention core)."""
    m, d, heads = b * s, h // a, b * (a // t)
    out = dict.fromkeys(CLASSES, (0.0, 0.0))
    for n, k in ((3 * h // t, h), (h, h // t), (ffn // t, h), (h, ffn // t)):
        _add(out, "matrix_products", linear(costs, m, n, k, mixed))
    if fused:
        core = attention(costs, causal, heads, s, d)
        _add(out, "attention", core)
    else:  # QKᵀ and probabilities × V as batched products, the softmax, [the dropout on the probabilities]
        scores = heads * s * s
        product = linear(costs, heads * s, s, d, mixed)
        _add(out, "matrix_products", product, 2)
        core = (2 * product[0], 2 * product[1])
        for kind in ("layer_norm", "add") + (("add",) if dropout else ()):  # softmax ≈ a row norm; scale, mask
            pair = elementwise(costs, kind, scores)
            _add(out, "other_operators", pair)
            core = (core[0] + pair[0], core[1] + pair[1])
    width = m * h / (t if sp else 1)  # the residual stream on this rank
    for kind, elements, count in (("layer_norm", width, 2), ("add", width, 2), ("gelu", m * ffn / t, 1),
                                  ("copy", m * h / t, 1)) + ((("add", width, 2),) if dropout else ()):
        _add(out, "other_operators", elementwise(costs, kind, elements), count)
    # backward only: the QKV split's gradient is concatenated (a copy of the QKV output), and the residual stream's
    # gradient, which reaches each block twice, is summed twice
    _add(out, "other_operators", (0.0, elementwise(costs, "copy", 3 * m * h / t)[0]))
    _add(out, "other_operators", (0.0, elementwise(costs, "add", width)[0]), 2)
    _add(out, "other_operators", tuple(costs.view), VIEWS_PER_LAYER)
    _add(out, "framework", (costs.module_call_s, 0.0), MODULES_PER_LAYER)
    if recompute == "full":
        for cls in CLASSES:
            f, bwd = out[cls]
            out[cls] = (f, bwd + f)
    elif recompute == "selective":
        _add(out, "attention" if fused else "matrix_products", (0.0, core[0]))
    return out


@lru_cache(maxsize=1 << 12)
def ends(costs: KernelCosts, b: int, s: int, h: int, vocab: int, first: bool, last: bool, dropout: bool,
         mixed: bool) -> dict:
    """{class: (forward, backward)} of the embeddings (``first``: token and position lookups, their sum, the
    dropout) and of the final LayerNorm, head and loss (``last``); the head is replicated over tensor-parallel
    ranks, so every one computes it."""
    m = b * s
    out = dict.fromkeys(CLASSES, (0.0, 0.0))
    if first:
        _add(out, "other_operators", elementwise(costs, "embedding", m * h), 2)
        _add(out, "other_operators", elementwise(costs, "add", m * h), 2 if dropout else 1)
        _add(out, "framework", (costs.module_call_s, 0.0), 3)
    if last:
        _add(out, "matrix_products", linear(costs, m, vocab, h, mixed))
        _add(out, "other_operators", elementwise(costs, "layer_norm", m * h))
        _add(out, "other_operators", elementwise(costs, "cross_entropy", m * vocab))
        _add(out, "other_operators", tuple(costs.view), 2)
        _add(out, "framework", (costs.module_call_s, 0.0), 2)
    return out


@lru_cache(maxsize=1 << 14)
def adam_tensor(costs: KernelCosts, elements: int) -> float:
    """Seconds of Adam's step on one tensor of ``elements`` (table ``adam``)."""
    return loglog(costs.adam, elements)


def adam_step(costs: KernelCosts, tensors) -> float:
    """Seconds of one Adam step over ``tensors`` ((count, elements), …): the per-tensor loop."""
    return sum(count * adam_tensor(costs, elements) for count, elements in tensors)
