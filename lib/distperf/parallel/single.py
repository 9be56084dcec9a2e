"""The single-device reference: the whole model, one optimizer, no torch.distributed.

With ``microbatches`` m > 1 it accumulates the gradient of m equal microbatches (each loss divided
by m), which is the same update as one pass over the whole batch. Every other trainer must match
this one's losses and parameters (tests/test_parallel_*.py).
"""
from __future__ import annotations

import torch

from ..config import Config, RunOptions
from ..model import build_model
from .common import Trainer, accumulated_step, make_optimizer
from .parallelize import parallelize


class SingleDeviceTrainer(Trainer):
    def __init__(self, cfg: Config, opts: RunOptions, device: torch.device):
        self.cfg, self.device = cfg, device
        self.model = parallelize(build_model(cfg.model, opts.seed, device=device), cfg, None, device)
        self.optimizer = make_optimizer(self.model.parameters(), cfg.training, opts.lr)
        self.remember_parameters()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        return accumulated_step(self.model, self.optimizer, inputs, targets, self.cfg.layout.microbatches)

    def model_parts(self):
        return [self.model]

    def optimizer_states(self):
        return [self.optimizer.state]
