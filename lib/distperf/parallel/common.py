"""What every trainer shares: the interface, the run options, the optimizer, and the helpers that
read a trainer's parameters and model-state bytes whatever the wrapping (DDP, FSDP2, DTensor).

A trainer takes the **global** batch of a step on every rank and keeps its own part; it returns the
mean loss over the part of the batch whose loss this rank computes (None if it computes none, as
the inner pipeline stages), so the loop can form the global mean loss exactly.
"""
from __future__ import annotations

import abc
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ..config import Config, Training
from ..model import lm_loss


def optimizer_class(training: Training):
    """(class, keyword arguments) of the configured optimizer: Adam (torch defaults) or SGD with
    momentum 0.9 (or none)."""
    if training.optimizer == "adam":
        return torch.optim.Adam, {}
    return torch.optim.SGD, {"momentum": 0.9 if training.momentum else 0.0}


def make_optimizer(params, training: Training, lr: float) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_class(training)
    return cls(params, lr=lr, **kwargs)


def unwrap(module: nn.Module) -> nn.Module:
    """The model part inside a DDP wrapper (FSDP2 and DTensor keep the module itself)."""
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """This rank's storage of a parameter or gradient (a DTensor's local shard)."""
    return p.to_local() if isinstance(p, DTensor) else p


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter on CPU; collective for sharded ones (call on every rank of its mesh)."""
    spec = getattr(p, "_st_info", None)  # a DTensor localised for DDP (tensor.parallel.ddp)
    if spec is not None:
        p = DTensor.from_local(p.detach(), spec.mesh, spec.placements, run_check=False, shape=spec.shape,
                               stride=spec.stride)
    if isinstance(p, DTensor):
        p = p.full_tensor()
    return p.detach().float().cpu().clone()


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor's local shard; views counted once)."""
    seen, total = set(), 0
    for t in tensors:
        t = local_tensor(t)
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class Trainer(abc.ABC):
    """One optimizer step per :meth:`step`, the same for every strategy."""

    cfg: Config
    device: torch.device
    flushes: bool = True  # False: microbatches stay in flight from one step to the next (PipeDream-2BW)

    @abc.abstractmethod
    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """One optimizer step on the global batch (inputs, targets: (B, s) token ids)."""

    @abc.abstractmethod
    def model_parts(self) -> list[nn.Module]:
        """This rank's model parts as built (wrappers included)."""

    @abc.abstractmethod
    def optimizer_states(self) -> list[dict]:
        """The state dicts (param → {name: tensor}) of this rank's optimizer(s)."""

    def finish(self) -> None:
        """Drain whatever is in flight (PipeDream-2BW); nothing to do for flushing strategies."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """This rank's optimizer objects (ZeRO-1: the wrapper and the local optimizer inside it)."""
        inner = getattr(self.optimizer, "optim", None)
        return [self.optimizer] + ([inner] if isinstance(inner, torch.optim.Optimizer) else [])

    def weight_versions(self) -> list[torch.Tensor]:
        """Parameter tensors this rank keeps beyond its model parts' own (PipeDream-2BW's second
        weight version), for memory accounting."""
        return []

    def group_roles(self) -> dict[str, str]:
        """{process group name: data_parallel | tensor_parallel | pipeline_parallel} of the groups this
        rank communicates over, for communication accounting."""
        from ..measure.comm import roles_from_mesh

        mesh = getattr(self, "mesh", None)
        roles = roles_from_mesh(mesh) if mesh is not None else {}
        end = getattr(self, "end_group", None)  # tied embeddings: first and last pipeline stage
        if end is not None:
            roles[end.group_name] = "pipeline_parallel"
        return roles

    def remember_parameters(self) -> None:
        """Record the (name, parameter) pairs the optimizer steps, once the model parts are wrapped.
        (torch's TP + DDP composition re-registers DTensor parameters as plain attributes during
        forward, so a module's named_parameters() cannot be asked later.)"""
        self._named = [(name, p) for part in self.model_parts() for name, p in unwrap(part).named_parameters()]

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        return self._named

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: whole parameter} of the parameters this rank holds, named as in the whole model.
        Collective: every rank must call it."""
        return {name: full_tensor(p) for name, p in self.named_parameters()}

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes this rank stores for parameters, gradients and optimizer moments (storage sizes,
        so FSDP padding and DDP gradient buckets count as allocated; Adam's scalar step counters
        are left out)."""
        params = [p for _, p in self.named_parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        moments = [t for state in self.optimizer_states() for s in state.values() for t in s.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0]
        return {"parameters": storage_bytes(params), "gradients": storage_bytes(grads),
                "optimizer_states": storage_bytes(moments)}


def split_rows(x: torch.Tensor, index: int, parts: int) -> torch.Tensor:
    """Rows of ``x`` that replica ``index`` of ``parts`` trains on (contiguous, equal)."""
    n = x.shape[0] // parts
    return x[index * n:(index + 1) * n]


def accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                     targets: torch.Tensor, microbatches: int, sync=lambda last: nullcontext()) -> float:
    """One optimizer step over ``microbatches`` equal microbatches, each loss divided by m (the same
    update as one pass over the whole batch); ``sync(last)`` wraps each backward, so that a data-parallel
    wrapper reduces gradients only after the last. Returns the mean loss."""
    optimizer.zero_grad()
    total = torch.zeros((), device=inputs.device)
    for i, (x, y) in enumerate(zip(inputs.chunk(microbatches), targets.chunk(microbatches))):
        with sync(i == microbatches - 1):
            loss = lm_loss(model(x), y) / microbatches
            loss.backward()
        total += loss.detach()
    optimizer.step()
    return total.item()
