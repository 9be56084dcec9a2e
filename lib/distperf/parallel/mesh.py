"""Process groups and the DeviceMesh of a layout.

Ranks form a ``pp × dp × tp`` mesh, tp varying fastest, then dp, then pp (torchtitan's and
Megatron-LM's order): the tensor-parallel group, which communicates in every layer, gets the nearest
ranks (one node's fast links); the replicas of a stage (dp) come next, as PipeDream-2BW places them;
the pipeline, which only sends activations between neighbours, spans the farthest.

The parallelisms are applied to a rank's model part in one order, by
:func:`distperf.parallel.parallelize.parallelize`.
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..config import ConfigError, Layout

DIMS = ("pp", "dp", "tp")


def rank_device(kind: str, local_rank: int = 0) -> torch.device:
    """The torch device of this rank: ``kind`` (auto, cpu or cuda) resolved by
    :func:`distperf.results.resolve_device`; on CUDA this process's GPU (LOCAL_RANK), made current."""
    from ..results import resolve_device

    kind = resolve_device(kind)
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device: str = "auto", timeout_s: float = 300.0) -> torch.device:
    """Join the process group described by the launcher's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK — set by torchrun, ``accelerate launch`` or our tests):
    NCCL on CUDA, gloo on CPU. Every collective then fails after ``timeout_s`` instead of hanging."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        raise ConfigError("world_size", "this layout needs torch.distributed but no launcher set RANK and "
                                        "WORLD_SIZE; start it with python -m distperf run, torchrun or "
                                        "accelerate launch --multi_gpu")
    dev = rank_device(device, int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return dev


def build_mesh(layout: Layout, device: torch.device, order: str = "pp,dp,tp") -> DeviceMesh:
    """The ``("pp", "dp", "tp")`` mesh of this layout; its size must be the world size.

    ``order`` says how consecutive global ranks fill it, slowest-varying dimension first: ``pp,dp,tp``
    (the default: rank = (p·dp + d)·tp + t, a stage's replicas on neighbouring ranks) or ``dp,pp,tp``
    (rank = (d·pp + p)·tp + t, a replica's whole pipeline on neighbouring ranks). With an emulated
    cluster (:mod:`distperf.emulation`), neighbouring ranks share a node. Either way the mesh keeps its
    dimensions (pp, dp, tp) by name and position, so the trainers do not see the order."""
    shape = (layout.pp, layout.dp, layout.tp)
    if dist.get_world_size() != layout.world_size:
        raise ConfigError("world_size", f"the layout needs {layout.world_size} ranks (pp·dp·tp), the launcher "
                                        f"started {dist.get_world_size()}")
    if order == "pp,dp,tp":
        return init_device_mesh(device.type, shape, mesh_dim_names=DIMS)
    if order != "dp,pp,tp":
        raise ConfigError("mesh_order", f"must be pp,dp,tp or dp,pp,tp, got {order!r}")
    ranks = torch.arange(layout.world_size).reshape(layout.dp, layout.pp, layout.tp).permute(1, 0, 2)
    return DeviceMesh(device.type, ranks.contiguous(), mesh_dim_names=DIMS)


def coordinates(mesh: DeviceMesh) -> dict[str, int]:
    """This rank's position on each mesh dimension."""
    return {name: mesh.get_local_rank(name) for name in DIMS}


def end_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """For tied embeddings with pp > 1: one group per (dp, tp) position holding the first and the
    last pipeline rank (every rank creates all of them, in the same order); returns this rank's
    group, or None if it holds neither end."""
    ranks = mesh.mesh  # shape (pp, dp, tp), global ranks
    mine = None
    for d in range(ranks.shape[1]):
        for t in range(ranks.shape[2]):
            members = sorted({int(ranks[0, d, t]), int(ranks[-1, d, t])})
            group = dist.new_group(members)
            if dist.get_rank() in members:
                mine = group
    return mine
