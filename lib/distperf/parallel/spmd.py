"""The trainer for layouts without pipelining: dp × tp ranks, any ZeRO stage, recomputation.

Every rank builds the whole model, shards it over tp (DTensor), wraps it for dp (DDP / ZeRO), and
accumulates the gradients of its m microbatches, reducing them over dp only after the last one.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from ..config import Config, RunOptions
from ..model import build_model
from .common import Trainer, accumulated_step, split_rows
from .data_parallel import data_parallel_optimizer, gradient_sync, optimizer_state
from .parallelize import parallelize


class SPMDTrainer(Trainer):
    def __init__(self, cfg: Config, opts: RunOptions, mesh: DeviceMesh, device: torch.device):
        self.cfg, self.device, self.mesh = cfg, device, mesh
        self.dp_rank = mesh.get_local_rank("dp")
        self.model = parallelize(build_model(cfg.model, opts.seed, device=device), cfg, mesh, device, opts.bucket_mb)
        self.optimizer = data_parallel_optimizer(self.model.parameters(), cfg, mesh["dp"], opts.lr)
        self.remember_parameters()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        lay = self.cfg.layout
        x, y = split_rows(inputs, self.dp_rank, lay.dp), split_rows(targets, self.dp_rank, lay.dp)
        return accumulated_step(self.model, self.optimizer, x, y, lay.microbatches,
                                sync=lambda last: gradient_sync(self.model, last))

    def model_parts(self):
        return [self.model]

    def optimizer_states(self):
        return [optimizer_state(self.optimizer)]
