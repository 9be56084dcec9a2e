"""The rules the trainers impose beyond :func:`distperf.config.validate`, checked before any process starts.

Pure Python (torch only to ask whether CUDA devices exist), so that ``run`` and the sweep runner can refuse
a configuration with one line naming the field and the rule before they launch anything.
"""
from __future__ import annotations

import os

from ..config import TWOBW_ENGINE, Config, ConfigError, RunOptions


def check_pipeline(cfg: Config, trainer: bool = True) -> None:
    """The rules torch's schedules and our 2BW impose (``trainer=False``: those of the schedules alone, for a
    prediction: a PipeDream schedule, which has no trainer, is then allowed)."""
    lay = cfg.layout
    m, pp = lay.microbatches, lay.pp
    if lay.schedule == "pipedream" and trainer:
        raise ConfigError("schedule", "pipedream (one weight version per in-flight microbatch) has no trainer; "
                                      "use gpipe, 1f1b, interleaved or 2bw")
    if lay.schedule == "1f1b" and pp > 1 and m < pp:
        raise ConfigError("microbatches", f"1f1b needs microbatches >= pp (m={m} < pp={pp}; torch Schedule1F1B)")
    if lay.schedule == "interleaved" and m % max(1, m // pp):
        raise ConfigError("microbatches", f"interleaved needs m divisible by max(1, m // pp) = {max(1, m // pp)} "
                                          f"(m={m}, pp={pp}; torch ScheduleInterleaved1F1B)")
    if lay.schedule in TWOBW_ENGINE and lay.zero:
        raise ConfigError("zero", f"{lay.schedule} runs on the 2BW engine, which keeps its own weight versions per "
                                  "stage; it needs zero 0")


FAULTS = ("raise", "exit", "hang", "kill")


def parse_fault(spec: str | None) -> tuple[str, int, int] | None:
    """The test hook ``DISTPERF_FAULT=KIND:RANK:STEP`` (:func:`distperf.parallel.loop._fault`) as (kind, rank,
    step); None when unset or empty; ConfigError naming the variable when malformed."""
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in FAULTS or not all(p.isdigit() for p in parts[1:]):
        raise ConfigError("DISTPERF_FAULT", f"must be KIND:RANK:STEP with KIND one of {', '.join(FAULTS)} and RANK, "
                                            f"STEP non-negative integers, got {spec!r}")
    return parts[0], int(parts[1]), int(parts[2])


def check_run(cfg: Config, opts: RunOptions) -> None:
    """Every rule of a run: the pipeline's, the data's (the byte-level text needs a vocabulary of 256), the
    device's (CUDA present, one GPU per rank of this node) and the fault hook's."""
    check_pipeline(cfg)
    parse_fault(os.environ.get("DISTPERF_FAULT"))
    if opts.data == "text" and cfg.model.vocab < 256:
        raise ConfigError("data", f"the byte-level text needs vocab >= 256, the model has {cfg.model.vocab}")
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but torch sees no CUDA device")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.layout.world_size))
        if torch.cuda.device_count() < local:
            raise ConfigError("device", f"{local} ranks on this node need as many GPUs, "
                                        f"torch sees {torch.cuda.device_count()}")
