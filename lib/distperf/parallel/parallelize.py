"""Apply a layout's parallelisms to one model part, in one order, for every trainer (as torchtitan's
``parallelize_llama`` does for its models).

A trainer builds its part of the model — the whole model, or its pipeline stage(s)
(:func:`distperf.model.build_stage`) — and hands it to :func:`parallelize`, which applies:

1. tensor (and sequence) parallelism over the ``tp`` mesh dimension (:mod:`distperf.parallel.tensor`): it
   replaces the parameters by DTensor shards, so it comes first;
2. activation recomputation (:func:`distperf.model.set_recompute`): checkpoints wrap the sharded layers;
3. precision: with ``mixed`` the part's forward runs under ``torch.autocast`` to bf16 (the parameters stay fp32
   and are the master weights);
4. data parallelism or ZeRO over the ``dp`` mesh dimension (:mod:`distperf.parallel.data_parallel`): DDP and FSDP2
   wrap the finished part, so that they see its final parameters and modules.

The trainers then differ only in their schedule: the single-device reference and the SPMD trainer run one part
with gradient accumulation, the pipeline trainer runs its stages under torch's pipelining schedules or
PipeDream-2BW (which averages gradients over its replicas itself, at its delayed update, and so takes its parts
without a data-parallel wrapper).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from ..config import DDP_BUCKET_MB, Config
from ..model import Transformer, set_recompute
from .data_parallel import apply_data_parallel
from .tensor import apply_tensor_parallel


def parallelize(part: Transformer, cfg: Config, mesh: DeviceMesh | None, device: torch.device,
                bucket_mb: float = DDP_BUCKET_MB, data_parallel: bool = True) -> nn.Module:
    """``part`` with the layout's parallelisms applied in the order of the module docstring; returns what to
    train (a DDP or FSDP2 wrapper when data-parallel, else the part itself). Without a mesh (one device) only
    recomputation and precision apply; ``data_parallel=False`` leaves out step 4."""
    lay = cfg.layout
    if mesh is not None and lay.tp > 1:
        apply_tensor_parallel(part, mesh["tp"], lay.sequence_parallel)
    set_recompute(part, lay.recompute)
    if cfg.training.precision == "mixed":
        part.autocast_dtype = torch.bfloat16
    if mesh is not None and data_parallel:
        return apply_data_parallel(part, cfg, mesh["dp"], bucket_mb, device)
    return part
