"""Data parallelism over the ``dp`` mesh dimension, with the ZeRO stage of the layout.

| ZeRO | torch API | what each of the N replicas stores |
|---|---|---|
| 0 | ``DistributedDataParallel(bucket_cap_mb=…)`` | everything; gradients all-reduced bucket by bucket |
| 1 | DDP + ``ZeroRedundancyOptimizer`` | optimizer state of whole parameters assigned greedily by size |
| 2 | FSDP2 ``fully_shard(reshard_after_forward=False)`` | 1/N of parameters, gradients and optimizer state; parameters stay gathered from forward to backward |
| 3 | FSDP2 ``fully_shard(reshard_after_forward=True)`` | the same, parameters gathered again for backward |

ZeRO-2 through FSDP2 therefore also shards the parameters at rest (between steps), unlike the
ZeRO paper's stage 2; the cost model (:mod:`distperf.cost.model_states`) follows FSDP2.
DDP uses ``gradient_as_bucket_view=True``, so the gradients live in the communication buckets and
are not stored twice. A module that already carries tensor-parallel DTensors goes through torch's
``_pre_dp_module_transform`` before DDP (torch's documented TP + DDP composition); FSDP2 composes with
TP natively (2-D mesh).
"""
from __future__ import annotations

import sys
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
from torch.nn.parallel import DistributedDataParallel

from ..config import Config
from ..model import Block
from .common import make_optimizer, optimizer_class


def apply_data_parallel(module: nn.Module, cfg: Config, dp_mesh: DeviceMesh, bucket_mb: float,
                        device: torch.device) -> nn.Module:
    """Wrap ``module`` for data parallelism over ``dp_mesh`` as the layout's ZeRO stage says.
    Without replicas (dp = 1) and ZeRO 0 or 1 the module is returned as it is."""
    zero, dp = cfg.layout.zero, cfg.layout.dp
    if zero >= 2:
        for block in module.modules():
            if isinstance(block, Block):
                fully_shard(block, mesh=dp_mesh, reshard_after_forward=zero == 3)
        return fully_shard(module, mesh=dp_mesh, reshard_after_forward=zero == 3)
    if dp == 1:
        return module
    if any(isinstance(p, DTensor) for p in module.parameters()):
        _pre_dp_module_transform(module)
    return DistributedDataParallel(module, process_group=dp_mesh.get_group(), bucket_cap_mb=bucket_mb,
                                   gradient_as_bucket_view=True,
                                   device_ids=[device.index] if device.type == "cuda" else None)


def data_parallel_optimizer(params, cfg: Config, dp_mesh: DeviceMesh, lr: float) -> torch.optim.Optimizer:
    """ZeRO-1: ``ZeroRedundancyOptimizer`` over the dp group; otherwise the plain optimizer."""
    params = list(params)
    if cfg.layout.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # imports torch._dynamo: a second per rank

        cls, kwargs = optimizer_class(cfg.training)
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=dp_mesh.get_group(), lr=lr,
                                       **kwargs)
    return make_optimizer(params, cfg.training, lr)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The local optimizer state (ZeRO-1 keeps it in its inner optimizer)."""
    zero = sys.modules.get("torch.distributed.optim")  # not imported: no ZeroRedundancyOptimizer exists
    return optimizer.optim.state if zero and isinstance(optimizer, zero.ZeroRedundancyOptimizer) else optimizer.state


def gradient_sync(module: nn.Module, sync: bool):
    """Context for one microbatch's backward: reduce gradients only when ``sync`` (the last one)."""
    if isinstance(module, DistributedDataParallel) and not sync:
        return module.no_sync()
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(sync)
    return nullcontext()
