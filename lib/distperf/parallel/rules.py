"""The rules the trainers impose beyond :func:`distperf.config.validate`, checked before any process starts.

Pure Python (torch only to ask whether CUDA devices exist), so that ``run`` and the sweep runner can refuse
a configuration with one line naming the field and the rule before they launch anything.
"""
from __future__ import annotations

import os

from ..config import TWOBW_ENGINE, Config, ConfigError, RunOptions


def check_pipeline(cfg: Config) -> None:
    """The rules torch's schedules and our 2BW impose."""
    lay = cfg.layout
    m, pp = lay.microbatches, lay.pp
    if lay.schedule == "pipedream":
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


def check_run(cfg: Config, opts: RunOptions) -> None:
    """Every rule of a run: the pipeline's, the data's (the byte-level text needs a vocabulary of 256) and
    the device's (CUDA present, one GPU per rank of this node)."""
    check_pipeline(cfg)
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
