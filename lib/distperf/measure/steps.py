"""Measurement steps: memory by category and communication by kind, per rank, reduced to the most
loaded rank.

Both trackers slow a step down (a dispatch mode sees every operator, the profiler records them), so they run on
optimizer steps of their own, after the timed steps: one memory warm-up step (it recognises DDP's bucket-view
gradients), one memory step (:func:`~distperf.measure.memory.measure_step_memory`), one communication step
(:class:`~distperf.measure.comm.CommTracker`) and, on CPU, :data:`BREAKDOWN_STEPS` steps whose time is broken down
by class (:class:`~distperf.measure.breakdown.StepBreakdown`: the profiler alone, no dispatch mode; each step profiled
alone from a barrier of the ranks, the classes' mean over them kept, and each step's communication and window
beside it), each one ``trainer.step`` followed by ``trainer.finish()``. Five breakdown steps, not one, from
6 December 2026: one step's communication share is noisier within a run than between runs (that day,
``scripts/breakdown_steps.py``: eight runs of five steps each of the `small` model on two pipeline stages, GPipe and
1F1B at m = 8; the share's relative standard deviation from step to step within a run was 21 to 35 % by rank, a first
step's from run to run 11 to 28 %, the five steps' share's 7 to 20 %), and the chapter "Where the time goes" judges
the exposed communication on ten runs' medians. A run that measures neither (a sweep's repeats after the first)
still takes the time-breakdown steps (:func:`measure_breakdown`): bytes are the same in every run, times are not.
PipeDream-2BW keeps microbatches in flight from one step to the next (``trainer.flushes`` is False); ``finish()``
drains it, so that everything a measured step holds or sends is created and completed inside the measured region.
Its memory step holds as many microbatches in flight as its steady state does, and sends the bytes of one batch; but
its exposed waiting time then includes the fill and the drain of the pipeline, which its training steps do not have.
(Measuring a steady-state 2BW step, with sends still in flight when the tracker's profiler stops, crashed the ranks
with heap corruption at the next garbage collection in torch 2.13 on gloo.)

Reduction over ranks, as the cost model reports (:func:`distperf.cost.predict`): memory is the
rank with the largest measured total (its categories together, "the most loaded rank"); communication
is the most any rank has per kind. Every rank's numbers are kept (``per_rank``): the categories, and beside
them the allocator's peaks over the memory step (:data:`ALLOCATOR_KEYS`: the resident set on CPU, the caching
allocator on CUDA; :func:`distperf.measure.memory.allocator_peak`).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist

from .breakdown import CLASSES, StepBreakdown
from .comm import KINDS, CommTracker
from .memory import measure_step_memory

MEMORY_KEYS = ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "other", "total")
STATE_KEYS = ("parameters", "gradients", "optimizer_states")
COMM_SECTIONS = ("bytes", "sent_bytes", "wire_bytes", "time_s", "exposed_s", "calls")
ALLOCATOR_KEYS = ("rss_start", "rss_peak", "rss_peak_increase", "rss_reset", "cuda_max_allocated", "cuda_max_reserved")
MEMORY_WARMUP, MEMORY_STEPS, COMM_STEPS, BREAKDOWN_STEPS = 1, 1, 1, 5
STEP_KEYS = ("communication", "window")  # what the breakdown keeps of each of its steps


def measured_steps(flushes: bool = True) -> dict:
    """What the measurement steps were (for the result JSON)."""
    return {"after_timed_steps": True, "memory_warmup": MEMORY_WARMUP, "memory": MEMORY_STEPS,
            "communication": COMM_STEPS, "breakdown": BREAKDOWN_STEPS, "each": "one optimizer step, then finish()",
            "breakdown_each": "profiled alone from a barrier; the classes' mean over the steps",
            "drained": not flushes,  # PipeDream-2BW: fill and drain inside each measured step
            "breakdown_waits": True}  # the breakdown step sees Work.wait and starts at a barrier after its profiler


def measure_rank(trainer, next_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], first_step: int,
                 distributed: bool, timeline: bool = False) -> dict:
    """This rank's memory and communication on the measurement steps; ``next_batch(i)`` gives the
    (inputs, targets) of step ``i`` on the trainer's device; with ``timeline``, the first breakdown step's
    (:func:`_breakdown_step`). Drains the trainer at the end."""
    drained_step = _drained_steps(trainer, next_batch, first_step)
    # the trainer's own record of its parameters: torch's TP + DDP composition re-registers DTensor parameters as
    # plain attributes in forward, so that the model parts' parameters() miss them (and their storages, saved
    # by the linear layers, would pass for activations); 2BW's second weight version besides
    parameters = [p for _, p in trainer.named_parameters()] + trainer.weight_versions()
    memory = measure_step_memory(trainer.model_parts(), trainer.optimizers(), drained_step, warmup=MEMORY_WARMUP,
                                 steps=MEMORY_STEPS, device=trainer.device, extra={"parameters": parameters})
    if distributed:
        with CommTracker(trainer.group_roles()) as tracker:
            for _ in range(COMM_STEPS):
                drained_step()
        comm = tracker.summary(COMM_STEPS)
    else:  # one device: nothing to communicate, and no profiler step needed to say so
        zeros = dict.fromkeys(KINDS, 0)
        comm = {"bytes": dict(zeros), "sent_bytes": dict.fromkeys(KINDS, 0.0), "wire_bytes": dict(zeros),
                "time_s": dict.fromkeys(KINDS, 0.0),
                "calls": dict(zeros), "by_collective": {}, "exposed_s": {**dict.fromkeys(KINDS, 0.0), "total": 0.0},
                "unmatched_events": 0}
    return {"memory": memory, "communication": comm, "breakdown": _breakdown_step(trainer, drained_step, timeline),
            "pipeline_rank": _pipeline_rank(trainer)}


def _drained_steps(trainer, next_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], first_step: int):
    """A function that runs one drained optimizer step (``trainer.step``, then ``trainer.finish()``) on the next
    batch, from step ``first_step`` on."""
    counter = itertools.count(first_step)

    def drained_step():
        x, y = next_batch(next(counter))
        trainer.step(x, y)
        trainer.finish()

    return drained_step


def _breakdown_step(trainer, drained_step, timeline: bool = False) -> dict | None:
    """On CPU, where the time goes (:mod:`distperf.measure.breakdown`) on :data:`BREAKDOWN_STEPS` steps of their own,
    each profiled alone from a barrier of the ranks: each class's and the window's mean over the steps, and
    ``per_step``, each step's communication and window; with ``timeline``, the first step's action by action
    (``timeline``: :func:`distperf.measure.timeline.rank_timeline`); None elsewhere."""
    if trainer.device.type != "cpu":
        return None
    steps, first = [], None
    for k in range(BREAKDOWN_STEPS):
        with StepBreakdown() as tracked:  # starts at a barrier of the ranks
            drained_step()
        steps.append(tracked.summary(1))
        if timeline and k == 0:
            first = tracked.timeline(dist.get_rank() if dist.is_initialized() else 0, _pipeline_rank(trainer))
    return {**mean_breakdown(steps), **({"timeline": first} if first is not None else {})}


def mean_breakdown(steps: list[dict]) -> dict:
    """Each class's and the window's mean over the breakdowns ``steps`` of one rank (one step each, in order), with
    ``per_step``: each one's ``communication`` and ``window`` (a list each, in order)."""
    keys = CLASSES + ("window",)
    mean = {k: sum(step[k] for step in steps) / len(steps) for k in keys}
    return {**mean, "per_step": {k: [step[k] for step in steps] for k in STEP_KEYS}}


def _pipeline_rank(trainer) -> int:
    """This rank's place in the pipeline (0 without one)."""
    mesh = getattr(trainer, "mesh", None)
    return mesh.get_local_rank("pp") if mesh is not None and "pp" in (mesh.mesh_dim_names or ()) else 0


def combine(ranks: list[dict]) -> tuple[dict, dict]:
    """(memory_bytes, communication) of the run from every rank's :func:`measure_rank`."""
    mems = [r["memory"] for r in ranks]
    peak = max(range(len(mems)), key=lambda i: mems[i]["total"])
    memory = {key: mems[peak][key] for key in MEMORY_KEYS}
    memory.update({
        "rank": peak,
        "at_start": {key: mems[peak]["at_start"][key] for key in STATE_KEYS},
        "at_peak": mems[peak]["at_peak"],
        "device": mems[peak]["device"],
        "per_rank": {**{key: [m[key] for m in mems] for key in MEMORY_KEYS},
                     **{f"at_start.{key}": [m["at_start"][key] for m in mems] for key in STATE_KEYS},
                     "pipeline_rank": [r["pipeline_rank"] for r in ranks]},
    })
    for key in ALLOCATOR_KEYS:  # the allocator's peaks beside the tensor bytes (distperf.measure.memory)
        if key in mems[peak]:
            memory[key] = mems[peak][key]
            memory["per_rank"][key] = [m.get(key) for m in mems]

    comms = [r["communication"] for r in ranks]
    communication = {}
    for section in COMM_SECTIONS:
        kinds = sorted({k for c in comms for k in c[section]}, key=lambda k: (k not in KINDS, k == "total", k))
        per_kind = {k: max(c[section].get(k, 0) for c in comms) for k in kinds}
        if section != "exposed_s":  # exposed_s has its own total: the union of the kinds' intervals
            per_kind["total"] = max(sum(c[section].values()) for c in comms)
        communication[section] = per_kind
    communication["unmatched_events"] = max(c.get("unmatched_events", 0) for c in comms)
    communication["per_rank"] = comms
    return memory, communication


def combine_breakdowns(ranks: list[dict]) -> dict | None:
    """The step's time by class (:mod:`distperf.measure.breakdown`, the mean over the breakdown steps) on the rank
    whose step took longest (its ``rank``), with every rank's beside it (``per_rank``: a list per class) and every
    rank's steps one by one (``per_step``: communication and window, a list per rank of a value per step); None where
    it was not measured."""
    found = [r.get("breakdown") for r in ranks]
    if any(b is None for b in found):
        return None
    slowest = max(range(len(found)), key=lambda i: found[i]["window"])
    keys = CLASSES + ("window",)
    return {**{k: found[slowest][k] for k in keys}, "rank": slowest,
            "per_rank": {k: [b[k] for b in found] for k in keys},
            "per_step": {k: [b["per_step"][k] for b in found] for k in STEP_KEYS}}


def _every_rank(mine: dict, distributed: bool) -> list[dict]:
    """Every rank's ``mine``, in rank order (gathered when distributed)."""
    if not distributed:
        return [mine]
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return ranks


def measure_breakdown(trainer, next_batch, first_step: int, distributed: bool, trace: str | None = None) -> dict:
    """Only the time-breakdown step, on CPU, every rank at once: what a run that measures no memory or communication
    (a sweep's repeats after the first) still measures, since the time a step spends per class varies from run to
    run, unlike the bytes. Returns ``{time_breakdown_s, measured_steps}`` (:func:`combine_breakdowns`), the same on
    every rank. With ``trace`` (a path), the first breakdown step's timeline is written there (:func:`write_trace`).
    Drains the trainer at the end."""
    ranks = _every_rank({"breakdown": _breakdown_step(trainer, _drained_steps(trainer, next_batch, first_step),
                                                      trace is not None)}, distributed)
    timeline = write_trace(trace, ranks, trainer)
    steps = {**measured_steps(trainer.flushes or not distributed), "memory_warmup": 0, "memory": 0,
             "communication": 0}
    return {"time_breakdown_s": combine_breakdowns(ranks), "measured_steps": steps, **timeline}


def write_trace(trace: str | None, ranks: list[dict], trainer) -> dict:
    """Every rank's timeline of its first breakdown step (the gathered ``ranks``) as one Chrome trace at ``trace``,
    written by the first rank (:func:`distperf.measure.timeline.write_trace`, with the run's configuration and
    provenance under ``distperf.about``); returns ``{"timeline": …}``, the step in numbers on every rank
    (:func:`distperf.measure.pipeline_replay.summary`), or nothing without a path or where no breakdown step ran
    (not on CPU)."""
    found = [(r.get("breakdown") or {}).get("timeline") for r in ranks]
    if trace is None or any(t is None for t in found):
        return {}
    from .pipeline_replay import align, summary
    from .timeline import write_trace as write

    if not dist.is_initialized() or dist.get_rank() == 0:
        from ..results import provenance

        write(trace, found, {"config": trainer.cfg.to_dict(), "provenance": provenance(trainer.device.type)})
    lay = trainer.cfg.layout
    return {"timeline": summary(align(found), lay.schedule, lay.microbatches, lay.chunks)}


def measure(trainer, next_batch, first_step: int, distributed: bool, trace: str | None = None) -> dict:
    """Run the measurement steps on every rank (collective when distributed); return
    ``{memory_bytes, communication, measured_steps}``, the same on every rank; with ``trace``, as
    :func:`measure_breakdown`."""
    ranks = _every_rank(measure_rank(trainer, next_batch, first_step, distributed, trace is not None), distributed)
    timeline = write_trace(trace, ranks, trainer)
    memory, communication = combine(ranks)
    return {"memory_bytes": memory, "communication": communication, "time_breakdown_s": combine_breakdowns(ranks),
            "measured_steps": measured_steps(trainer.flushes or not distributed), **timeline}
