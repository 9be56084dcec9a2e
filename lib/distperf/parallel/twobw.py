"""PipeDream-2BW (arXiv 2006.09503): 1F1B pipelining without flushes, with two weight versions per stage.

Hand-written on point-to-point operations because torch.distributed.pipelining has no such schedule:
its schedules (GPipe, 1F1B, interleaved, zero-bubble) all flush the pipeline and keep one weight
version per stage. The order of work comes from :mod:`distperf.parallel.twobw_schedule`; this module
executes it. Communication follows picotron's helpers (isend/irecv between neighbouring stages).

Weight versions (paper §3.1; the released code's ``pipedream_2bw`` branch): each stage keeps two buffers
of its parameters. Batch t runs, forward and backward, on buffer t mod 2, which then holds version
max(t − 1, 0). Update t (after the stage's last backward of batch t) copies the other buffer —
version t, still used by the in-flight microbatches of batch t + 1 — into buffer t mod 2 and lets the
optimizer step it with batch t's gradient, giving version t + 1 = W(t) − ν·∇f(W(t−1)); Adam and
momentum see the same 1-stale gradient. The optimizer's parameters are moved to the buffer it steps
(its state keyed by the new tensors), so a stage holds exactly two copies of its weights, one
gradient and one optimizer state.

Stage modules run through ``torch.func.functional_call`` with the buffer's tensors; module buffers
(not parameters) are shared by both versions; the backward runs with the module's weights pointed at
the same version, so that activation recomputation reruns the forward the microbatch saw. The first stage receives token ids and sends its
output; later stages receive a float activation (shape and dtype announced once, by the first
message on each link) and the last stage returns the loss. Every wait is bounded by the process
group's timeout (or ``timeout``), so a dead or hanging peer raises instead of blocking.

Between step() calls, activations of the next batch are already in flight (that is the point of
2BW). Do not run collectives on the pipeline group between calls; use another group.

``flush=True`` makes the same engine PipeDream-Flush (paper §3.2): every step() ends by draining the pipeline
and applying the update, so a stage keeps one weight version and batch t runs on version t, the ordinary
update W(t+1) = W(t) − ν·∇f(W(t)). Everything else — the 1F1B order, the point-to-point code, the optimizer
and the gradient hooks — is the code 2BW runs, so that comparing the two measures the flush and the second
version, not two engines.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.func import functional_call
from torch.nn.utils.stateless import _reparametrize_module

from ..config import ConfigError
from ..measure.timeline import action_span
from . import twobw_schedule as sched
from .twobw_schedule import Action

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_MAX_DIMS = 8


class TwoBWPipeline:
    """One stage of a PipeDream-2BW pipeline.

    stage: this stage's module, taking one tensor and returning one tensor (token ids → activation on
        the first stage, activation → activation, activation → output fed to ``loss_fn`` on the last).
    group: the pipeline process group; stage i is the group's rank i.
    microbatches: m, the microbatches whose gradients form one update (m ≥ number of stages).
    loss_fn(output, target) -> scalar mean loss of one microbatch (used on the last stage).
    make_optimizer(parameters) -> torch optimizer, called once with this stage's parameters.
    dp_group: optional data-parallel group of this stage's replicas; gradients are averaged over it
        before each update (2BW's width w).
    before_update(named_parameters): optional hook run after the data-parallel average and before the
        optimizer step, with the parameters being updated (their ``.grad`` holds the stale gradient);
        e.g. to all-reduce a tied embedding's gradient between first and last stage.
    timeout: bound for each wait; None uses the process group's timeout.
    flush: run PipeDream-Flush instead (module docstring): one weight version, a flush at the end of every step.
    """

    def __init__(self, stage: nn.Module, stage_index: int, num_stages: int, group: dist.ProcessGroup | None,
                 microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer], *,
                 dp_group: dist.ProcessGroup | None = None,
                 before_update: Callable[[dict[str, torch.Tensor]], None] | None = None,
                 timeout: timedelta | None = None, flush: bool = False):
        sched.check(num_stages, microbatches)
        size = dist.get_world_size(group)
        if size != num_stages:
            raise ConfigError("pp", f"the pipeline group has {size} ranks but num_stages is {num_stages}")
        if not 0 <= stage_index < num_stages:
            raise ConfigError("stage_index", f"must lie in [0, {num_stages}), got {stage_index}")
        if dist.get_rank(group) != stage_index:
            raise ConfigError("stage_index", f"stage {stage_index} must be rank {stage_index} of the pipeline group, "
                                             f"this process is rank {dist.get_rank(group)}")
        self.stage, self.stage_index, self.num_stages = stage, stage_index, num_stages
        self.group, self.dp_group, self.microbatches = group, dp_group, microbatches
        self.loss_fn, self.before_update, self.timeout, self.flushes = loss_fn, before_update, timeout, flush
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1

        own = dict(stage.named_parameters())
        if flush:
            self._buffers: tuple[dict[str, torch.Tensor], ...] = (own,)
        else:
            copy = {n: nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad) for n, p in own.items()}
            self._buffers = (own, copy)
        self._buffer_version = [0] * len(self._buffers)
        self.optimizer = make_optimizer(list(own.values()))
        self._optimizer_buffer = 0

        self._next_batch = 0
        self._pipeline_empty = True
        self._stash: deque = deque()  # (microbatch, buffer, version, stage input, output or scaled loss)
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._recv_meta: tuple[tuple[int, ...], torch.dtype] | None = None  # activation from the previous stage
        self._send_meta: tuple[tuple[int, ...], torch.dtype] | None = None  # activation to the next stage
        self._inputs: dict[int, torch.Tensor] = {}
        self._targets: dict[int, torch.Tensor] = {}
        self._losses: list[torch.Tensor] = []

        self.log: list[Action] = []  # every action run, with the weight version actually used / produced
        self.max_in_flight = 0
        self.max_versions_alive = 1

    # ------------------------------------------------------------------ public API
    def step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> float | None:
        """Admit one batch (m microbatches) and run this stage's share of the schedule.

        The first stage passes ``inputs`` and the last stage ``targets`` (the per-pipeline batch, split
        into m microbatches along dim 0). Returns, on the last stage, the mean loss of the m
        microbatches of this batch, and None elsewhere. The last stage applies this batch's update
        before returning; earlier stages apply the previous batch's update during this call (and the
        last one in :meth:`flush`).
        """
        t, m = self._next_batch, self.microbatches
        if self.is_first:
            self._inputs = self._split("inputs", inputs, t)
        if self.is_last:
            self._targets = self._split("targets", targets, t)
        self._losses = []
        self._run(sched.step_actions(self.stage_index, self.num_stages, m, t, self._pipeline_empty))
        self._pipeline_empty, self._next_batch = False, t + 1
        if self.flushes:
            self.flush()
        return torch.stack(self._losses).mean().item() if self.is_last else None

    def flush(self) -> None:
        """Drain the microbatches still in flight, apply the last update and wait for all sends.

        Afterwards every stage has applied one update per step() call. Training may continue with
        step(): the pipeline refills and the version rule (batch t uses max(t − 1, 0)) carries on.
        """
        if not self._pipeline_empty:
            self._run(sched.flush_actions(self.stage_index, self.num_stages, self.microbatches, self._next_batch))
            self._pipeline_empty = True
        for work, _ in self._sends:
            self._wait(work, "sending")
        self._sends = []

    def newest_parameters(self) -> dict[str, torch.Tensor]:
        """The newest weight version of this stage, by parameter name (live tensors; detach to keep).

        Read the weights here, not from ``stage.parameters()``: the module's own parameters are one
        of the two buffers and hold the older version after every odd-numbered update.
        """
        return self._buffers[self._newest_buffer()]

    def weight_buffers(self) -> tuple[dict[str, torch.Tensor], ...]:
        """The weight buffers (2BW's two versions, in no fixed order; Flush's one), e.g. for memory accounting."""
        return self._buffers

    @property
    def newest_version(self) -> int:
        return max(self._buffer_version)

    def versions_alive(self) -> set[int]:
        """Weight versions this stage needs now: the newest and those of microbatches in flight."""
        return {self.newest_version} | {version for _, _, version, _, _ in self._stash}

    # ------------------------------------------------------------------ schedule execution
    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if action.kind == "F":
                self._forward(action.index)
            elif action.kind == "B":
                self._backward(action.index)
            else:
                self._update(action.index)
            self.max_in_flight = max(self.max_in_flight, len(self._stash))
            self.max_versions_alive = max(self.max_versions_alive, len(self.versions_alive()))
            self._prune_sends()

    def _buffer_of(self, batch: int) -> int:
        """The buffer batch t runs on: t mod 2 under 2BW, the only one under Flush."""
        return batch % len(self._buffers)

    def _forward(self, k: int) -> None:
        buffer = self._buffer_of(k // self.microbatches)
        version = self._buffer_version[buffer]
        if self.is_first:
            x = self._inputs.pop(k)
        else:
            x = self._recv_activation(k).requires_grad_()
        with action_span("F", self.stage_index, k):
            out = functional_call(self.stage, self._buffers[buffer], (x,))
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"2BW stage {self.stage_index}: the stage module must return one tensor, "
                                f"got {type(out).__name__}")
            if self.is_last:
                loss = self.loss_fn(out, self._targets.pop(k))
                self._losses.append(loss.detach())
                out = loss / self.microbatches
        if not self.is_last:
            self._send_activation(out.detach())
        self._stash.append((k, buffer, version, x, out))
        self.log.append(Action("F", k, version))

    def _backward(self, k: int) -> None:
        mb, buffer, version, x, out = self._stash.popleft()
        if mb != k:
            raise RuntimeError(f"2BW stage {self.stage_index}: backward of microbatch {k} "
                               f"but {mb} is the oldest in flight")
        grad = None
        if not self.is_last:
            grad = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            self._complete(f"receiving the gradient of microbatch {k} from stage {self.stage_index + 1}",
                           dist.irecv, grad, group=self.group, group_src=self.stage_index + 1)
        # Activation checkpointing reruns a layer's forward inside this backward and reads the weights
        # from the module's attributes: point them at the version the forward used (what functional_call
        # did during the forward; torch has no public context manager for it).
        with _reparametrize_module(self.stage, self._buffers[buffer]), action_span("B", self.stage_index, k):
            out.backward(grad)
        if not self.is_first:
            self._isend(x.grad.contiguous(), self.stage_index - 1)
        self.log.append(Action("B", k, version))

    def _update(self, t: int) -> None:
        """Update t: buffer t mod 2 (version max(t − 1, 0), holding batch t's gradient) becomes version t + 1 (under
        Flush the one buffer, version t, steps in place)."""
        target = self._buffer_of(t)
        params = self._buffers[target]
        if self.dp_group is not None:
            self._average_over_replicas([p.grad for p in params.values() if p.grad is not None])
        if self.before_update is not None:
            self.before_update(params)
        if not self.flushes:  # 2BW: version t, still used by batch t + 1's microbatches, is the one stepped
            with torch.no_grad():
                for p, newer in zip(params.values(), self._buffers[1 - target].values()):
                    p.copy_(newer)
        self._point_optimizer_at(target)
        self.optimizer.step()
        for p in params.values():
            p.grad = None
        self._buffer_version[target] = t + 1
        self.log.append(Action("U", t, t + 1))

    def _average_over_replicas(self, grads: list[torch.Tensor]) -> None:
        """Mean of each gradient over the data-parallel group, as one flat all-reduce (local shards of
        DTensors: replicas of a tensor-parallel stage hold the same shard layout)."""
        if not grads:
            return
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        flat = torch.cat([g.reshape(-1) for g in local])
        self._complete("averaging gradients over the data-parallel group",
                       dist.all_reduce, flat, group=self.dp_group, async_op=True)
        flat /= dist.get_world_size(self.dp_group)
        offset = 0
        for g in local:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _point_optimizer_at(self, buffer: int) -> None:
        """Make the optimizer step ``buffer``'s tensors, carrying its per-parameter state over."""
        if buffer == self._optimizer_buffer:
            return
        moved = dict(zip(self._buffers[self._optimizer_buffer].values(), self._buffers[buffer].values()))
        for group in self.optimizer.param_groups:
            group["params"] = [moved[p] for p in group["params"]]
        for old, new in moved.items():
            if old in self.optimizer.state:
                self.optimizer.state[new] = self.optimizer.state.pop(old)
        self._optimizer_buffer = buffer

    def _newest_buffer(self) -> int:
        return max(range(len(self._buffers)), key=self._buffer_version.__getitem__)

    # ------------------------------------------------------------------ inputs and communication
    def _split(self, name: str, batch: torch.Tensor | None, t: int) -> dict[int, torch.Tensor]:
        role = "first" if name == "inputs" else "last"
        if batch is None:
            raise ValueError(f"{name}: the {role} pipeline stage must pass {name} to step()")
        if batch.shape[0] % self.microbatches:
            raise ConfigError("microbatches", f"must divide the batch size of {name} "
                                              f"({batch.shape[0]} rows, m={self.microbatches})")
        first = t * self.microbatches
        return {first + j: part for j, part in enumerate(batch.chunk(self.microbatches))}

    def _send_activation(self, y: torch.Tensor) -> None:
        meta = (tuple(y.shape), y.dtype)
        if self._send_meta is None:
            if y.dtype not in _DTYPES or y.dim() > _MAX_DIMS:
                raise TypeError(f"2BW stage {self.stage_index}: cannot send a {y.dtype} activation "
                                f"with {y.dim()} dimensions")
            header = [y.dim(), *y.shape, *[0] * (_MAX_DIMS - y.dim()), _DTYPES.index(y.dtype)]
            self._isend(torch.tensor(header, dtype=torch.int64, device=y.device), self.stage_index + 1)
            self._send_meta = meta
        elif meta != self._send_meta:
            raise ValueError(f"2BW stage {self.stage_index}: activation {meta} differs from the first one "
                             f"{self._send_meta}; every microbatch must have the same shape")
        self._isend(y.contiguous(), self.stage_index + 1)

    def _recv_activation(self, k: int) -> torch.Tensor:
        source = self.stage_index - 1
        device = self._device()
        if self._recv_meta is None:
            header = torch.empty(_MAX_DIMS + 2, dtype=torch.int64, device=device)
            self._complete(f"receiving the activation shape from stage {source}",
                           dist.irecv, header, group=self.group, group_src=source)
            values = header.tolist()
            self._recv_meta = (tuple(values[1:1 + values[0]]), _DTYPES[values[-1]])
        shape, dtype = self._recv_meta
        x = torch.empty(shape, dtype=dtype, device=device)
        self._complete(f"receiving the activation of microbatch {k} from stage {source}",
                       dist.irecv, x, group=self.group, group_src=source)
        return x

    def _isend(self, tensor: torch.Tensor, stage: int) -> None:
        # The tensor is kept alive until the send completes; sends are waited for lazily (in _run and
        # flush) because a send completes only once the peer posts the matching receive.
        self._sends.append((self._post(f"sending to stage {stage}", dist.isend, tensor, group=self.group,
                                       group_dst=stage), tensor))

    def _prune_sends(self) -> None:
        pending = []
        for work, tensor in self._sends:
            if work.is_completed():
                self._wait(work, "sending")  # raises if the send failed
            else:
                pending.append((work, tensor))
        self._sends = pending

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(self.timeout) if self.timeout is not None else work.wait()
        except Exception as e:
            raise self._failure(what, e) from e

    def _complete(self, what: str, post: Callable[..., dist.Work], *args, **kwargs) -> None:
        """Post ``post(*args, **kwargs)`` and wait for it: a peer already gone fails the posting, one that leaves or
        hangs fails the wait; either error comes with the pipeline context."""
        self._wait(self._post(what, post, *args, **kwargs), what)

    def _post(self, what: str, post: Callable[..., dist.Work], *args, **kwargs) -> dist.Work:
        """``post(*args, **kwargs)``, the operation posted: a peer already gone fails the posting, not only the wait;
        the error comes with the pipeline context."""
        try:
            return post(*args, **kwargs)
        except Exception as e:
            raise self._failure(what, e) from e

    def _failure(self, what: str, e: Exception) -> RuntimeError:
        """The backend's error (peer gone, timeout) with the pipeline context added."""
        return RuntimeError(f"2BW stage {self.stage_index}: failed while {what}: {e}")

    def _device(self) -> torch.device:
        p = next(iter(self._buffers[0].values()), None)
        return p.device if p is not None else torch.device("cpu")
