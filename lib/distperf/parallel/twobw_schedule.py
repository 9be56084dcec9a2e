"""The PipeDream-2BW schedule as data: which forward, backward and weight update each stage runs, in
which order, with which weight version. Pure Python (no torch), so the cost model and the book can
draw and count it; :class:`~distperf.parallel.twobw.TwoBWPipeline` executes exactly these lists.

Source: Narayanan et al., *Memory-Efficient Pipeline-Parallel DNN Training*, arXiv 2006.09503, §3.1
and Fig. 2; the stage loop of ``forward_backward_pipelining_no_flushes`` in msr-fiddle/pipedream
(branch ``pipedream_2bw``).

- 1F1B order: stage r (0-indexed, d stages) first runs ``W_r = min(d − r − 1, m)`` warm-up forwards,
  then alternates one forward and one backward (of the oldest microbatch in flight).
- Gradients are coalesced over the m microbatches of a batch; a stage applies update t ("U t") right
  after the backward of the last microbatch of batch t. The pipeline is never flushed between batches.
- Batch t (microbatches t·m … t·m + m − 1) uses weight version ``max(t − 1, 0)`` in forward and
  backward on every stage; update t produces version t + 1, so that
  W(t+1) = W(t) − ν·∇f(W(t−1)) (paper, §3.1).

One :func:`step_actions` list is one ``TwoBWPipeline.step()`` call: the m forwards of batch t and the
backwards interleaved with them. On the last stage it ends with update t; on earlier stages update
t − 1 falls inside call t and the last update is applied by :func:`flush_actions`.
"""
from __future__ import annotations

from typing import NamedTuple

from ..config import ConfigError


class Action(NamedTuple):
    """One unit of work on a stage.

    kind: "F" forward, "B" backward, "U" optimizer update.
    index: the global microbatch (F, B), or the batch whose gradient the update applies (U).
    version: the weight version used (F, B), or the version the update produces (U).
    """

    kind: str
    index: int
    version: int


def check(num_stages: int, microbatches: int) -> None:
    """2BW coalesces gradients over m ≥ d microbatches (paper §3.1); anything else is refused."""
    for name, value in (("pp", num_stages), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
    if microbatches < num_stages:
        raise ConfigError("microbatches", f"PipeDream-2BW needs microbatches >= pipeline stages "
                                          f"(m={microbatches} < d={num_stages})")


def warmup(stage: int, num_stages: int, microbatches: int) -> int:
    """W_r = min(d − r − 1, m): forwards a stage runs before its first backward."""
    return min(num_stages - stage - 1, microbatches)


def version_of_batch(batch: int) -> int:
    """The weight version every microbatch of batch t uses: max(t − 1, 0)."""
    return max(batch - 1, 0)


def _backward(k: int, microbatches: int) -> list[Action]:
    """B k, followed by the update when k is the last microbatch of its batch."""
    t = k // microbatches
    actions = [Action("B", k, version_of_batch(t))]
    if k % microbatches == microbatches - 1:
        actions.append(Action("U", t, t + 1))
    return actions


def step_actions(stage: int, num_stages: int, microbatches: int, batch: int, pipeline_empty: bool) -> list[Action]:
    """Actions of one step() call on ``stage``: the m forwards of ``batch`` and the backwards between them.

    ``pipeline_empty`` is true for the first call (and the first after a flush): the stage then runs
    its warm-up forwards; otherwise the W_r microbatches it left in flight are the first backwards.
    """
    check(num_stages, microbatches)
    m, w = microbatches, warmup(stage, num_stages, microbatches)
    first = batch * m
    actions: list[Action] = []
    for k in range(first, first + m):
        actions.append(Action("F", k, version_of_batch(batch)))
        oldest = k - w
        if oldest >= first or (oldest >= 0 and not pipeline_empty):
            actions += _backward(oldest, m)
    return actions


def flush_actions(stage: int, num_stages: int, microbatches: int, next_batch: int) -> list[Action]:
    """Drain a stage after ``next_batch`` batches were admitted: the backwards still in flight and
    the last update. Empty when nothing was admitted."""
    check(num_stages, microbatches)
    if next_batch == 0:
        return []
    end = next_batch * microbatches
    w = warmup(stage, num_stages, microbatches)
    return [a for k in range(end - w, end) for a in _backward(k, microbatches)]


def schedule(num_stages: int, microbatches: int, batches: int) -> list[list[Action]]:
    """Every stage's actions for ``batches`` step() calls followed by one flush()."""
    per_stage = []
    for r in range(num_stages):
        actions = [a for t in range(batches) for a in step_actions(r, num_stages, microbatches, t, t == 0)]
        per_stage.append(actions + flush_actions(r, num_stages, microbatches, batches))
    return per_stage


def flush_schedule(num_stages: int, microbatches: int, batches: int) -> list[list[Action]]:
    """PipeDream-Flush on the same engine (``TwoBWPipeline(flush=True)``): every step() call is batch t's 1F1B
    order from an empty pipeline followed by its drain and update; batch t runs on version t (one version)."""
    per_stage = []
    for r in range(num_stages):
        actions = []
        for t in range(batches):
            for a in (step_actions(r, num_stages, microbatches, t, True)
                      + flush_actions(r, num_stages, microbatches, t + 1)):
                actions.append(a._replace(version=t + (a.kind == "U")))
        per_stage.append(actions)
    return per_stage


def batch_time(per_stage: list[list[Action]], forward=1.0, backward=2.0, update: float = 0.0,
               tied: bool = False) -> float:
    """Steady-state time per batch of a schedule's lists (:func:`timeline`): from the end of the first batch's
    last update (on any stage) to the end of the last but one batch's, over the batches between (at least three
    batches: the last one's drain, which only a final flush pays, is left out)."""
    ends: dict[int, float] = {}
    for stage in timeline(per_stage, forward, backward, update, tied):
        for a, _, end in stage:
            if a.kind == "U":
                ends[a.index] = max(ends.get(a.index, 0.0), end)
    last = max(ends) - 1
    if last < 1:
        raise ValueError("batch_time needs at least three batches")
    return (ends[last] - ends[0]) / last


def timeline(per_stage: list[list[Action]], forward=1.0, backward=2.0, update: float = 0.0,
             tied: bool = False) -> list[list[tuple[Action, float, float]]]:
    """Start and end time of every action, each stage running its list in order as soon as its inputs
    exist (F k after F k on the stage before; B k after B k on the stage after); communication is free.
    ``forward`` and ``backward``: one microbatch's time, the same on every stage or one per stage. ``tied``: the
    first and the last stage share a tied embedding, whose gradient they all-reduce when they apply an update, so
    that update t starts on both only once both have reached it (the trainer's ``before_update``).

    Raises RuntimeError if the lists deadlock (no stage can proceed). Used for schedule diagrams and
    to check that a schedule is executable.
    """
    d = len(per_stage)
    per = [forward if isinstance(forward, (list, tuple)) else [forward] * d,
           backward if isinstance(backward, (list, tuple)) else [backward] * d]
    cost = [{"F": per[0][r], "B": per[1][r], "U": update} for r in range(d)]
    done: dict[tuple[int, str, int], float] = {}
    out: list[list[tuple[Action, float, float]]] = [[] for _ in range(d)]
    pos, free = [0] * d, [0.0] * d
    reached: dict[tuple[int, int], float] = {}  # (stage, update) → when the stage reached it (``tied``)
    remaining = sum(len(a) for a in per_stage)
    while remaining:
        progressed = False
        for r in range(d):
            while pos[r] < len(per_stage[r]):
                a = per_stage[r][pos[r]]
                dep = None
                if a.kind == "F" and r > 0:
                    dep = (r - 1, "F", a.index)
                elif a.kind == "B" and r < d - 1:
                    dep = (r + 1, "B", a.index)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done.get(dep, 0.0))
                if a.kind == "U" and tied and d > 1 and r in (0, d - 1):  # the tied embedding's all-reduce
                    reached[(r, a.index)] = reached.get((r, a.index), start)
                    other = reached.get((d - 1 - r, a.index))
                    if other is None:
                        break
                    start = max(start, other)
                end = start + cost[r][a.kind]
                done[(r, a.kind, a.index)] = end
                out[r].append((a, start, end))
                free[r], pos[r], remaining, progressed = end, pos[r] + 1, remaining - 1, True
        if not progressed:
            raise RuntimeError(f"2BW schedule deadlocks at positions {pos}")
    return out
