"""How much of a one-device training step keeps the GPU busy: the step's wall time beside the union of the
intervals in which the device ran a kernel, a copy or a fill, from torch's profiler (CPU and CUDA activities).

    python -m distperf.measure.device_busy --model gpt2 --micro-batch 1 --precision mixed   # one configuration

A step whose device is busy for a fraction of its wall time waits the rest on the host: Python, the framework's
dispatch and the launches of the kernels (CUDA runs them asynchronously, so a kernel shorter than its launch
leaves the device idle). The cost model prices a GPU step by its FLOPs and bytes, i.e. by the busy part only
(chapter "Against published step times", section "One H200, measured"). ``scripts/gpu_reference.py`` runs it on a
lent GPU (its step ``gpu_step_profile``). CUDA only: on a CPU there is no device time apart from the host's.
"""
from __future__ import annotations

import argparse
import sys
import time

from .intervals import length, union

PROFILED_STEPS = 5


def busy_intervals(events) -> list[tuple[float, float]]:
    """The disjoint intervals (µs) in which the device ran something: the union of the profiler's device events
    (``device_type`` CUDA), kernels, copies and fills alike."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    return union((e.time_range.start, e.time_range.end) for e in events if e.device_type == cuda)


def device_events(events) -> int:
    """How many device events (kernels, copies, fills) the profiler saw."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    return sum(1 for e in events if e.device_type == cuda)


def step_profile(cfg, steps: int = PROFILED_STEPS, warmup: int = 3, seed: int = 0, device: str = "cuda") -> dict:
    """Train ``cfg`` (one device) for ``warmup`` steps, then ``steps`` more under the profiler; return the wall
    seconds per step (the profiled steps, synchronised), the device's busy seconds per step, their ratio, and the
    device events per step. The profiler adds host time to each step, so ``wall_s`` reads a little above an
    unprofiled step's: the busy fraction is a lower bound. ``device`` "cpu" runs the same code with no device to be
    busy (what the tests exercise here)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..config import RunOptions, needs_distributed, validate
    from ..parallel.single import SingleDeviceTrainer
    from ..tokens import make_source

    validate(cfg)
    if needs_distributed(cfg):
        raise ValueError("layout: the device-busy profile trains on one device (dp = tp = pp = 1)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: the device-busy profile needs a CUDA device; torch sees none")
    on = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    torch.manual_seed(seed)
    source = make_source("synthetic", cfg.model.vocab, cfg.model.seq, seed)
    trainer = SingleDeviceTrainer(cfg, RunOptions(device=device, seed=seed), on)
    batches = [tuple(t.to(on) for t in source.batch(i, cfg.layout.global_batch)) for i in range(warmup + steps)]
    for x, y in batches[:warmup]:
        trainer.step(x, y)
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for x, y in batches[warmup:]:
            trainer.step(x, y)
        sync()
        wall = (time.perf_counter() - start) / steps
    events = prof.events()
    busy = length(busy_intervals(events)) * 1e-6 / steps
    return {"wall_s": wall, "busy_s": busy, "busy_fraction": busy / wall,
            "device_events": device_events(events) / steps, "steps": steps}


def main(argv=None) -> int:
    from ..config import Config, ConfigError, Layout, Training
    from ..presets import model as model_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "mixed"])
    parser.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    parser.add_argument("--steps", type=int, default=PROFILED_STEPS)
    args = parser.parse_args(argv)
    try:
        cfg = Config(model=model_preset(args.model), layout=Layout(micro_batch=args.micro_batch, microbatches=1,
                                                                    recompute=args.recompute),
                     training=Training(precision=args.precision))
        print(step_profile(cfg, args.steps))
    except (ConfigError, ValueError) as err:
        print(f"device_busy: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
