"""Pipeline parallelism: torch.distributed.pipelining schedules, and PipeDream-2BW.

| schedule | runtime | weight versions | semantics |
|---|---|---|---|
| ``gpipe`` | ``ScheduleGPipe`` | 1 | all forwards, all backwards, flush (Huang et al. 2019) |
| ``1f1b`` | ``Schedule1F1B`` | 1 | PipeDream-Flush: 1F1B order, flush (Narayanan et al. 2021a) |
| ``interleaved`` | ``ScheduleInterleaved1F1B`` | 1 | ``chunks`` stages per rank, stage i on rank i mod pp (Narayanan et al. 2021b) |
| ``2bw`` | :class:`~distperf.parallel.twobw.TwoBWPipeline` | 2 | no flush, W(t+1) = W(t) − ν∇f(W(t−1)) (arXiv 2006.09503) |

Each rank builds only its stage(s) (embedding on the first, final LayerNorm and head on the last),
shards them over tp, wraps them for dp/ZeRO (torch's stages know DDP and FSDP2: they reduce
gradients only after the last microbatch) and runs the schedule over its pp group. Gradients are
averaged over the m microbatches (``scale_grads``), so one step equals the single-device step on the
same global batch. With tied embeddings the last stage holds its own copy of the token embedding as
head; after the backward passes the two copies' gradients are summed over a group of the first and
the last stage (Megatron's embedding group), so both copies take the same update.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.nn.parallel import DistributedDataParallel

from ..config import TWOBW_ENGINE, Config, RunOptions, stage_layers
from ..measure.timeline import action_span
from ..model import build_stage, lm_loss
from .common import Trainer, full_tensor, local_tensor, make_optimizer, split_rows, storage_bytes, unwrap
from .data_parallel import data_parallel_optimizer, optimizer_state
from .mesh import end_group
from .rules import check_pipeline
from .parallelize import parallelize

TORCH_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}



class _Stage(PipelineStage):
    """``PipelineStage`` whose shape inference runs a DDP-wrapped stage under ``no_sync``.

    torch 2.13 infers the stage's input/output metadata on the first step by calling the module
    with gradients enabled, outside the ``no_sync`` its schedules use for every other microbatch; a
    DDP stage then arms its gradient hooks twice and fails when it rebuilds its buckets
    ("rebuilt parameter indices size is not same as original model parameters size")."""

    def _compute_outputs(self, *args, module, **kwargs):
        if isinstance(module, DistributedDataParallel):
            with module.no_sync():
                return module(*args, **kwargs)
        return module(*args, **kwargs)

    # each action's compute in a span of its own, for the breakdown step's timeline (distperf.measure.timeline):
    # torch's Schedule1F1B marks none, ScheduleGPipe its forward and backward with their receives inside
    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        with action_span("F", self.stage_index, fwd_chunk_id):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        with action_span("B", self.stage_index, bwd_chunk_id):
            return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)


class PipelineTrainer(Trainer):
    def __init__(self, cfg: Config, opts: RunOptions, mesh: DeviceMesh, device: torch.device):
        check_pipeline(cfg)
        lay, spec = cfg.layout, cfg.model
        self.cfg, self.device, self.mesh = cfg, device, mesh
        self.partition = stage_layers(spec, lay)
        pp_rank, self.dp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
        self.stage_ids = list(range(pp_rank, lay.stages, lay.pp))
        self.is_first, self.is_last = 0 in self.stage_ids, lay.stages - 1 in self.stage_ids
        # the 2BW engine averages gradients over its replicas itself, at its (delayed) update: no DDP wrapper
        self.parts = [parallelize(build_stage(spec, self.partition, s, opts.seed, device), cfg, mesh, device,
                                  opts.bucket_mb, data_parallel=lay.schedule not in TWOBW_ENGINE)
                      for s in self.stage_ids]
        self.end_group = end_group(mesh) if spec.tied else None
        pp_group = mesh.get_group("pp")
        self.twobw = None
        self.flushes = lay.schedule != "2bw"
        if lay.schedule in TWOBW_ENGINE:
            from .twobw import TwoBWPipeline

            self.twobw = TwoBWPipeline(
                self.parts[0], pp_rank, lay.pp, pp_group, lay.microbatches, lm_loss,
                lambda params: make_optimizer(params, cfg.training, opts.lr),
                dp_group=mesh.get_group("dp") if lay.dp > 1 else None,
                before_update=self._sum_tied_gradients, timeout=timedelta(seconds=opts.timeout_s),
                flush=lay.schedule == "2bw-flush")
            self.remember_parameters()
            return
        stages = [_Stage(p, s, lay.stages, device, group=pp_group) for p, s in zip(self.parts, self.stage_ids)]
        cls = TORCH_SCHEDULES[lay.schedule]
        # Gradients are averaged over the microbatches here, not by the schedule (scale_grads): torch
        # scales submod.parameters(), which misses tensor-parallel parameters under DDP (torch's TP + DDP
        # composition re-registers them as plain attributes).
        self.schedule = cls(stages if lay.schedule == "interleaved" else stages[0], lay.microbatches, loss_fn=lm_loss,
                            scale_grads=False)
        self.optimizer = data_parallel_optimizer([p for part in self.parts for p in part.parameters()], cfg,
                                                 mesh["dp"], opts.lr)
        self.remember_parameters()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        dp = self.cfg.layout.dp
        x, y = split_rows(inputs, self.dp_rank, dp), split_rows(targets, self.dp_rank, dp)
        if self.twobw is not None:
            return self.twobw.step(x if self.is_first else None, y if self.is_last else None)
        self.optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if self.is_first:
            self.schedule.step(x)
        elif self.is_last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        self._sum_tied_gradients({})
        for _, p in self.named_parameters():
            if p.grad is not None:
                p.grad.div_(self.cfg.layout.microbatches)
        self.optimizer.step()
        return torch.stack(losses).mean().item() if self.is_last else None

    def _tied_gradients(self, params: dict) -> list[torch.Tensor]:
        grads = []
        if self.is_first:
            grads.append(params.get("tok.weight", unwrap(self.parts[0]).tok.weight).grad)
        if self.is_last:
            grads.append(params.get("head.weight", unwrap(self.parts[-1]).head.weight).grad)
        return grads

    def _sum_tied_gradients(self, params: dict) -> None:
        if self.end_group is None:
            return
        for g in self._tied_gradients(params):
            dist.all_reduce(local_tensor(g), group=self.end_group)

    def finish(self) -> None:
        if self.twobw is not None:
            self.twobw.flush()

    def model_parts(self):
        return self.parts

    def optimizers(self):
        return [self.twobw.optimizer] if self.twobw is not None else super().optimizers()

    def weight_versions(self):
        if self.twobw is None:
            return []
        return [p for buffer in self.twobw.weight_buffers() for p in buffer.values()]

    def optimizer_states(self):
        return [self.twobw.optimizer.state if self.twobw else optimizer_state(self.optimizer)]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        if self.twobw is None:
            return super().full_parameters()
        return {name: full_tensor(p) for name, p in self.twobw.newest_parameters().items()}

    def model_state_bytes(self) -> dict[str, int]:
        out = super().model_state_bytes()
        if self.twobw is not None:  # both weight versions
            versions = [p for buffer in self.twobw.weight_buffers() for p in buffer.values()]
            out["parameters"] = storage_bytes(versions)
            out["gradients"] = storage_bytes([p.grad for p in versions if p.grad is not None])
        return out
