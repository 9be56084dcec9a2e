"""The training loop every rank runs, and the measurements it returns.

``run_training`` draws the global batch of each step from the data source (the same on every rank),
times each optimizer step (the slowest rank's time: ranks meet in collectives anyway), and at the end
combines the ranks' losses into the global mean loss of each step. Before every step the ranks meet at a
barrier (:func:`step_barrier`, on a gloo group of its own, so that it never mixes with the trainers'
collectives): each timed step then starts on every rank at the same moment, and no rank's time holds
another's lateness from the step before. Not under PipeDream-2BW (``trainer.flushes`` False): its ranks'
steps overlap by design — with a tied embedding the last stage's update in step t waits for the first
stage's, which that stage runs in its step t + 1 (``distperf.parallel.twobw_schedule``) — so a barrier
between steps would deadlock; its steps are timed without one (``barrier_before_each_step`` says which).
The first ``opts.warmup`` steps are left out of the statistics.

Several configurations may run one after another in one process group (:mod:`distperf.train`'s ``--batch``):
each builds its own mesh and trainer, and the CUDA peak-memory counter is reset at the start of each.

``model_state_bytes_at_rest`` (one entry per rank) is what each rank stores for parameters, gradients
and optimizer moments after the last step, between steps: FSDP2 (ZeRO-2 and 3) then holds only its
shards, and PipeDream-2BW, drained, no gradient. Peaks inside a step (gathered FSDP units, 2BW's
gradient) are for :mod:`distperf.measure.memory`: with ``opts.measure`` the run ends with the
measurement steps of :mod:`distperf.measure.steps` (memory by category, communication by kind),
after the timed steps and after the trained parameters are read; without it, with ``opts.breakdown`` on CPU, with
the step whose time is broken down by class alone.
"""
from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from .. import atomic
from ..config import Config, RunOptions, needs_distributed
from ..measure import wait_clock
from ..measure.speed import allreduce_probe, probe_alone, probed
from ..tokens import make_source
from .common import Trainer
from .mesh import build_mesh, init_distributed, rank_device
from .rules import parse_fault


def build_trainer(cfg: Config, opts: RunOptions, device: torch.device) -> Trainer:
    """The trainer for this configuration (inside an initialised process group unless single-device)."""
    if not needs_distributed(cfg):
        from .single import SingleDeviceTrainer
        return SingleDeviceTrainer(cfg, opts, device)
    mesh = build_mesh(cfg.layout, device, opts.mesh_order)
    if cfg.layout.pp > 1:
        from .pipeline import PipelineTrainer
        return PipelineTrainer(cfg, opts, mesh, device)
    from .spmd import SPMDTrainer
    return SPMDTrainer(cfg, opts, mesh, device)


def _allreduce_reading(cfg: Config, trainer: Trainer, opts: RunOptions, distributed: bool) -> dict:
    """A data-parallel run's all-reduce probe under DDP (ZeRO 0/1, every rank a replica):
    :func:`distperf.measure.speed.allreduce_probe` of its gradient's bytes up to DDP's bucket cap, with the bytes and
    the ranks; {} for any other run (collective on the ranks that take it: all of them or none)."""
    lay = cfg.layout
    if not distributed or lay.zero >= 2 or lay.dp < 2 or lay.dp != lay.world_size:
        return {}
    gradients = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    nbytes = int(min(gradients, opts.bucket_mb * 2**20))
    return {"allreduce_s": allreduce_probe(nbytes), "allreduce_bytes": nbytes, "allreduce_ranks": lay.dp}


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _fault(step: int) -> None:
    """Test hook: ``DISTPERF_FAULT=kind:rank:step`` makes that rank raise, exit(3), hang, or
    die by SIGKILL (what the kernel's out-of-memory killer does) at that step."""
    fault = parse_fault(os.environ.get("DISTPERF_FAULT"))  # checked before launch (rules.check_run)
    if fault is None:
        return
    kind, rank, at = fault
    if rank != (dist.get_rank() if dist.is_initialized() else 0) or at != step:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    if kind == "exit":
        sys.stdout.flush()
        os._exit(3)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a hang that even ignores a polite stop
        while True:
            time.sleep(1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_BARRIER: list = [None, None]  # (the default process group it belongs to, the barrier's group)


def step_barrier() -> None:
    """Every rank waits here until all have arrived (after the previous step's device work is done). On a gloo
    group of all ranks created once per process group: a barrier on the trainers' own groups could mix with
    their messages (PipeDream-2BW keeps activations in flight between steps; ``distperf.parallel.twobw``)."""
    if _BARRIER[0] is not dist.group.WORLD:
        _BARRIER[:] = [dist.group.WORLD, dist.new_group(backend="gloo")]
    dist.barrier(group=_BARRIER[1])


def save_parameters(parameters: dict[str, torch.Tensor], path: str) -> None:
    """Write the trained parameters of every rank (each rank's whole tensors, :meth:`Trainer.full_parameters`) to
    ``path`` as one ``torch.save`` file on rank 0, by name, on the CPU (a tensor two ranks hold, a data-parallel
    replica's, is taken from the lower rank); through a temporary file and a rename. Collective when distributed."""
    mine = {name: t.detach().cpu() for name, t in parameters.items()}
    if dist.is_initialized():
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if dist.get_rank() != 0:
            return
    else:
        gathered = [mine]
    merged: dict[str, torch.Tensor] = {}
    for held in gathered:
        for name, tensor in held.items():
            merged.setdefault(name, tensor)
    with atomic.replacing(path) as tmp:
        torch.save(dict(sorted(merged.items())), tmp)


def run_training(cfg: Config, opts: RunOptions, parameters: bool = False) -> dict:
    """Train ``opts.steps`` steps; return the result on every rank (collective when distributed).

    Joins the process group from the launcher's environment if the layout needs one. With
    ``parameters`` the result also holds this rank's trained parameters, whole, by name (tests).
    """
    distributed = needs_distributed(cfg)
    if distributed:
        device = init_distributed(opts.device, opts.timeout_s)
    else:
        device = rank_device(opts.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # an earlier configuration of this process left its peak
    torch.manual_seed(opts.seed)
    source = make_source(opts.data, cfg.model.vocab, cfg.model.seq, opts.seed)
    trainer = build_trainer(cfg, opts, device)
    batch = cfg.layout.global_batch
    barrier = distributed and trainer.flushes
    losses, times, waits, calls = [], [], [], []
    before = probe_alone(distributed) if device.type == "cpu" else None  # the machine's speed around the steps
    if before is not None:
        before.update(_allreduce_reading(cfg, trainer, opts, distributed))
    backend = dist.get_backend() if distributed else None
    clock = wait_clock.WaitClock() if wait_clock.clocked(distributed, backend, cfg.layout.pp) else None
    with clock or contextlib.nullcontext():
        for step in range(opts.steps):
            _fault(step)
            x, y = source.batch(step, batch)
            x, y = x.to(device), y.to(device)
            _sync(device)
            if barrier:
                step_barrier()
            waited, called = (clock.seconds, dict(clock.by_call)) if clock else (0.0, {})
            t0 = time.perf_counter()
            loss = trainer.step(x, y)
            _sync(device)
            times.append(time.perf_counter() - t0)
            if clock:
                waits.append(clock.seconds - waited)
                calls.append({name: clock.by_call[name] - called[name] for name in called})
            losses.append(loss)
    trainer.finish()
    speed = probed(before, {**probe_alone(distributed), **_allreduce_reading(cfg, trainer, opts, distributed)}) \
        if device.type == "cpu" else None
    held_out = None
    if opts.eval_batches:  # before the measurement steps, which train on
        from .held_out import held_out_loss

        held_out = held_out_loss(cfg.model, trainer, source, opts.eval_batches, batch, distributed)

    # Global mean loss of each step: the mean over the ranks that computed one (each holds the mean
    # of an equal share of the batch). Slowest rank's time per step.
    held = torch.tensor([[0.0 if v is None else v, 0.0 if v is None else 1.0] for v in losses], dtype=torch.float64)
    step_times = torch.tensor(times, dtype=torch.float64)
    state_bytes = [trainer.model_state_bytes()]
    peak = [torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None]
    if distributed:
        held, step_times = held.to(device), step_times.to(device)
        dist.all_reduce(held)
        dist.all_reduce(step_times, op=dist.ReduceOp.MAX)
        held, step_times = held.cpu(), step_times.cpu()
        state_bytes = [None] * dist.get_world_size()
        dist.all_gather_object(state_bytes, trainer.model_state_bytes())
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, peak[0])
        peak = peaks
        if clock:
            clocks = [None] * dist.get_world_size()
            dist.all_gather_object(clocks, wait_clock.summary(waits, opts.warmup, calls))
    global_losses = (held[:, 0] / held[:, 1]).tolist() if bool((held[:, 1] > 0).all()) else \
        [a / c if c else None for a, c in held.tolist()]
    timed = step_times.tolist()[opts.warmup:] or step_times.tolist()
    median = statistics.median(timed)
    result = {
        "config": cfg.to_dict(),
        "options": {**asdict(opts), "device": device.type},
        "data": source.describe(),
        "world_size": cfg.layout.world_size,
        "backend": backend,
        "torch": torch.__version__,
        "losses": global_losses,
        "held_out_loss": held_out,
        "iteration_time_s": {"median": median, "p10": _percentile(timed, 0.1), "p90": _percentile(timed, 0.9),
                             "steps": step_times.tolist(), "warmup_steps_excluded": len(step_times) - len(timed),
                             "barrier_before_each_step": barrier},
        "tokens_per_s": batch * cfg.model.seq / median,
        "model_state_bytes_at_rest": state_bytes,
        "peak_memory_bytes": peak,
        "threads_per_rank": torch.get_num_threads() if device.type == "cpu" else None,
        "speed_probe": speed,
    }
    if clock:  # a pipeline's sends, receives and waits on its timed steps, per rank (distperf.measure.wait_clock)
        result["wait_clock_s"] = {"per_rank": [c["median"] for c in clocks], "steps": [c["steps"] for c in clocks],
                                  "by_call": [c.get("by_call") for c in clocks],
                                  "warmup_steps_excluded": len(step_times) - len(timed)}
    if parameters:
        result["parameters"] = trainer.full_parameters()
    if opts.measure or (opts.breakdown and device.type == "cpu"):
        from ..measure.steps import measure, measure_breakdown

        def next_batch(step: int):
            x, y = source.batch(step, batch)
            return x.to(device), y.to(device)

        result.update((measure if opts.measure else measure_breakdown)(trainer, next_batch, opts.steps, distributed,
                                                                       opts.trace))
    if cfg.training.precision == "fp32":  # the profiled mode's compute, every rank at once (measure.parts)
        from ..measure.parts import part_times

        # in every run, measuring or not: each repeat of a sweep pairs its time with parts timed in its own processes
        result["part_times"] = part_times(cfg, device, distributed)
    return result
