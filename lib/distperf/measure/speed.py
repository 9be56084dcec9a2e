"""How fast this machine runs at this moment: a speed probe of three fixed microbenchmarks, taken by the calibration
(before each of its kernel tables and after the last) and by every CPU run (before and after its timed steps), so
that a run can be priced at the speed the machine had when it ran. The analytical mode does so since 5 December 2026,
by a rule declared before the build that judged it (the chapter "Where the time goes", section "The machine's
speed", which also reports the mode at the calibration's speed); a prediction made before any run has no probe and
keeps the calibration's speed.

On a shared machine the same kernels do not take the same time an hour apart: in the reference build, the second
calibration's fp32 matrix products took 0.61-0.74 of the first's, 71 minutes later, with nothing else running (a
virtual machine's host lends its cores unevenly). A calibration measured at one moment then prices a run measured at
another too slow or too fast, whatever the terms of the model. The probe is a microbenchmark, not a run of the
configuration: the same three kernels at the same shapes, whatever the configuration, each a median over blocks of
calls (:func:`distperf.measure.kernels.median_time`), one process alone (a run's ranks in turn, each while the
others wait; the geometric mean of the ranks' times per part: :func:`probe_alone` says why), under ``torch.no_grad``
except the module calls:

- ``gemm_s``: ``F.linear`` of a 1×256×256 input by a 256×256 weight with bias (fp32): matrix products and the
  fused attention scale with it;
- ``elementwise_s``: ``F.gelu`` over 2^16 values: memory-bound operators, views and Adam's per-tensor kernels;
- ``python_s``: a chain of 16 calls of an ``nn.Module`` that returns its input: Python's speed, which prices the
  framework's terms (module calls, the backward's start, the step's Python, the parallel wrappers).

:func:`ratios` compares a run's probe with the calibration's (run / calibration: above 1, the machine ran slower
than when it was calibrated); :meth:`distperf.cost.kernels.KernelCosts.at_speed` scales each class of kernel time
by its ratio.

A run of several ranks also measures their contention (:func:`contention_round`, the calibration's own probe in
shorter blocks): a 192×192 matrix product and a copy of 8 Mi values, each timed on rank 0 alone and on every rank
at once, ``contention_compute`` and ``contention_memory`` the ratios together / alone, which the calibration
measures once for the whole profile (``KernelCosts.contention_*``; the calibration also times a layer, kept in its
sidecar only, since that ratio's rule failed). :func:`at_contention` prices a run with its own: a second variant the
same section evaluates.

A data-parallel run under DDP also times its own all-reduce (:func:`allreduce_probe`: its gradient's bytes up to the
bucket cap), before and after its steps; :func:`at_allreduce` prices the run's all-reduce through it, a what-if that
a rule judges (the chapter's section "Held-out validation").
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..cost.kernels import PROBE_PARTS as PARTS

MIN_RUN_TIME_S = 0.02  # per part: about 0.07 s per probe with its warm-up calls
CONTENTION = ("contention_memory", "contention_compute")
ALLREDUCE = ("allreduce_s", "allreduce_bytes", "allreduce_ranks")  # a DDP run's all-reduce probe (allreduce_probe)
CONTENTION_BLOCK_S = 0.03  # per kind, alone and together: about 0.15 s per reading in a run
GEMM_N = 256
ELEMENTS = 2**16


def probe(min_run_time: float = MIN_RUN_TIME_S) -> dict:
    """{gemm_s, elementwise_s, python_s}: seconds per call of the three microbenchmarks (the module's docstring)."""
    import torch
    import torch.nn.functional as F

    from .kernels import median_time, module_call_time

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, GEMM_N, GEMM_N, generator=generator)
    w, b = torch.randn(GEMM_N, GEMM_N, generator=generator), torch.randn(GEMM_N, generator=generator)
    values = torch.randn(ELEMENTS, generator=generator)
    with torch.no_grad():
        gemm = median_time(lambda: F.linear(x, w, b), min_run_time)
        elementwise = median_time(lambda: F.gelu(values), min_run_time)
    return {"gemm_s": gemm, "elementwise_s": elementwise, "python_s": module_call_time(min_run_time)}


def probe_alone(distributed: bool) -> dict:
    """:func:`probe` on every rank in turn, each alone while the others wait at a barrier (collective when
    ``distributed``), and per part the geometric mean of the ranks' times (each rank's readings in ``ranks``: one
    list per part, by rank); when distributed, also the ranks' :func:`contention_round` (``contention_memory``,
    ``contention_compute``).

    Why not the slowest rank's time, as until 7 December 2026: each reading is a median over blocks of calls and
    still moves from one reading to the next, and the larger of two such readings is larger than either rank's
    typical one, while the calibration's probe is one process's. In development (two spawned ranks, pinned,
    sixteen readings each, against sixteen of one process just before), the slowest rank's reading was a median 1.19,
    1.25 and 1.53 times the single process's (matrix product, GELU, module calls), each rank's own 1.07 to 1.11; on
    the ten-repeat build at 8f43884 the runs of several ranks read 1.16-1.20, 1.31-1.43 and 1.46-1.78 times the
    calibration, the one-device runs 1.03, 1.17 and 1.27, and the analytical mode at the runs' speed over-predicted
    every strategy of several ranks (median signed error +6 % to +38 %; at the calibration's speed −15 % to +2 %).
    On the next build, at a222e8a, the first with the mean, the mode's median |error| was 3.9 % (18.6 % at the
    calibration's speed). What a synchronous step loses to its slower rank is another question, which the waits for
    the slowest rank answer by their own rule (:mod:`distperf.analysis.time_model`)."""
    if not distributed:
        return probe()
    import torch.distributed as dist

    mine = None
    for rank in range(dist.get_world_size()):
        if rank == dist.get_rank():
            mine = probe()
        dist.barrier()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    found = {k: math.prod(p[k] for p in every) ** (1 / len(every)) for k in PARTS}
    found["ranks"] = {k: [p[k] for p in every] for k in PARTS}
    shared = [contention_round(CONTENTION_BLOCK_S)]
    dist.broadcast_object_list(shared, src=0)
    return {**found, **{f"contention_{k}": v for k, v in shared[0].items()}}


ALLREDUCE_CALLS = 16  # per reading, before and after a run's timed steps


def allreduce_probe(nbytes: int, calls: int = ALLREDUCE_CALLS) -> float:
    """Seconds of an all-reduce of ``nbytes`` over the world (gloo), the median of ``calls``, each timed alone after a
    barrier; the slowest rank's (collective). A data-parallel run under DDP takes one before and one after its timed
    steps at its gradient's bytes up to DDP's bucket cap (``allreduce_s``, ``allreduce_bytes`` in its
    ``speed_probe``): in the archived run of ``scripts/allreduce_context.py`` DDP's all-reduce took 7 % (`medium`'s
    bucket) and 15 % (`small`'s) longer inside a step than issued alone, while from one call to the next it moved by
    a factor of four and the calibration's fit priced it at about half (:func:`at_allreduce`)."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    message = torch.ones(max(1, nbytes // 4))
    times = []
    for _ in range(calls + 1):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(message)
        times.append(time.perf_counter() - start)
    return slowest(statistics.median(times[1:]))


def at_allreduce(hw, run: dict | None):
    """``hw`` with its all-reduce's fit through the run's own probe (``run``: its ``allreduce_s`` of
    ``allreduce_bytes`` over ``allreduce_ranks``): the same α, and β such that the fit's time of that message equals
    the probe, t = 2(n − 1)·α + 2(n − 1)/n·M/β; ``hw`` itself where the run has no probe, ``hw`` no all-reduce fit, or
    the probe is not above the fit's latency. A what-if (the chapter "Where the time goes", section "Held-out
    validation"), not the model."""
    if not run or not all(_positive(run.get(k)) for k in ("allreduce_s", "allreduce_bytes", "allreduce_ranks")):
        return hw
    fits = {kind: (alpha, beta) for kind, alpha, beta in (getattr(hw, "collectives", None) or ())}
    if "all-reduce" not in fits:
        return hw
    n, (alpha, _) = int(run["allreduce_ranks"]), fits["all-reduce"]
    spare = run["allreduce_s"] - 2 * (n - 1) * alpha
    if n < 2 or spare <= 0:
        return hw
    fits["all-reduce"] = (alpha, 2 * (n - 1) / n * run["allreduce_bytes"] / spare)
    return replace(hw, collectives=tuple((kind, *fits[kind]) for kind in sorted(fits)))


def slowest(seconds: float | None, device=None) -> float:
    """The largest of every rank's ``seconds`` (None counts as 0); a collective over the world."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds or 0.0], dtype=torch.float64, device=device or torch.device("cpu"))
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


LAYER_PROBE = dict(name="contention-probe", layers=1, hidden=192, heads=4, vocab=16, seq=64)  # no preset's shape
LAYER_PROBE_BATCH = 4  # 256 tokens, between the `small` preset's layers at micro-batch 2 and the `medium` one's


def contention_round(block_s: float, device=None, layer: bool = False) -> dict | None:
    """{memory, compute[, layer]} on rank 0 (None on the others; collective): a copy of 8 Mi fp32 values, a 192×192
    matrix product and, with ``layer`` (the calibration's rounds), a Transformer layer's forward and backward
    (:class:`distperf.model.Block` of :data:`LAYER_PROBE`, :data:`LAYER_PROBE_BATCH` sequences: every kind of kernel a
    layer launches, at its working set), each timed for ``block_s`` seconds (median per call) on rank 0 alone while
    the others wait at a barrier, then on every rank at once (the slowest rank's), and the ratio together / alone, at
    least 1."""
    import torch
    import torch.distributed as dist

    from ..config import ModelSpec
    from ..model import Block, layer_input
    from .kernels import median_time

    device = device or torch.device("cpu")
    rank = dist.get_rank()
    a = torch.randn(192, 192, device=device)
    src, dst = torch.ones(8 << 20, device=device), torch.empty(8 << 20, device=device)
    probes = [("memory", lambda: dst.copy_(src)), ("compute", lambda: torch.mm(a, a))]
    if layer:
        spec = ModelSpec(**LAYER_PROBE)
        torch.manual_seed(0)
        block = Block(spec).to(device)
        x = layer_input(spec, LAYER_PROBE_BATCH, device=device).requires_grad_(True)
        probes.append(("layer", lambda: block(x).sum().backward()))
    ratio = {}
    for name, fn in probes:
        dist.barrier()
        alone = median_time(fn, block_s) if rank == 0 else None  # the other ranks wait in the barrier below
        dist.barrier()
        together = slowest(median_time(fn, block_s), device)  # every rank at once
        if rank == 0:
            ratio[name] = max(together / alone, 1.0)
    return ratio if rank == 0 else None


def combine(first: dict, second: dict) -> dict:
    """The geometric mean per part of two probes (a run's, before and after its timed steps), and the lesser of their
    contention ratios where both hold them (the calibration's rule for its rounds,
    :func:`distperf.measure.rounds.least_contention`)."""
    speed = {k: math.sqrt(first[k] * second[k]) for k in PARTS if k in first and k in second}
    return {**speed, **{k: min(first[k], second[k]) for k in CONTENTION if k in first and k in second}}


def median(probes: list[dict]) -> dict:
    """Per part the median of ``probes`` (the calibration's, one before each kernel table and one after the last:
    the speed of a machine that moves within seconds, over the minute its tables take)."""
    import statistics

    return {k: statistics.median(p[k] for p in probes) for k in PARTS}


def probed(before: dict, after: dict) -> dict:
    """A run's ``speed_probe``: the :func:`combine` of the probes before and after its timed steps, with both (and the
    geometric mean of their all-reduce probes, where both took one)."""
    out = {**combine(before, after), "before": before, "after": after}
    if "allreduce_s" in before and "allreduce_s" in after:
        out.update(allreduce_s=math.sqrt(before["allreduce_s"] * after["allreduce_s"]),
                   allreduce_bytes=before["allreduce_bytes"], allreduce_ranks=before["allreduce_ranks"])
    return out


def ratios(run: dict | None, reference: dict | None) -> dict | None:
    """{gemm, elementwise, python}: ``run``'s time per part over ``reference``'s; None unless both hold every part
    as a positive finite number (a run or a calibration from before the probe, or a failed reading)."""
    def usable(p):
        return p is not None and all(_positive(p.get(k)) for k in PARTS)

    if not usable(run) or not usable(reference):
        return None
    return {k.removesuffix("_s"): run[k] / reference[k] for k in PARTS}


def at_speed(hw, run: dict | None, elasticity: float = 1.0):
    """``hw`` with its kernel times scaled to the speed of the run whose probe is ``run``
    (:meth:`~distperf.cost.kernels.KernelCosts.at_speed`), each part's ratio r taken as r ** ``elasticity`` (1: the
    probe's ratio itself; 0: the calibration's speed; ½: the geometric middle of the two); ``hw`` itself where either
    has no probe."""
    kernels = getattr(hw, "kernels", None)
    found = ratios(run, dict(zip(PARTS, kernels.probe))) if kernels is not None and kernels.probe else None
    if found is None:
        return hw
    return replace(hw, kernels=kernels.at_speed({k: v ** elasticity for k, v in found.items()}))


def at_contention(hw, run: dict | None):
    """``hw`` with the contention ratios of the run whose probe is ``run`` in place of the calibration's
    (``KernelCosts.contention_compute`` and ``contention_memory``); ``hw`` itself where the run measured none or
    ``hw`` has no measured kernels."""
    kernels = getattr(hw, "kernels", None)
    if kernels is None or run is None or not all(_positive(run.get(k)) for k in CONTENTION):
        return hw
    return replace(hw, kernels=replace(kernels, contention_memory=run["contention_memory"],
                                       contention_compute=run["contention_compute"]))


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def of_row(row) -> dict | None:
    """The speed probe a sweep row holds (``speed_probe.<part>`` columns), or None."""
    try:
        found = {k: float(row[f"{COLUMN}{k}"]) for k in PARTS}
    except (KeyError, TypeError, ValueError):
        return None
    for k in CONTENTION + ALLREDUCE:  # runs of several ranks (the all-reduce: DDP's, from 6 December 2026)
        try:
            found[k] = float(row[f"{COLUMN}{k}"])
        except (KeyError, TypeError, ValueError):
            pass
    return found


COLUMN = "speed_probe."
